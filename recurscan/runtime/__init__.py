"""What runs a planned call: the signature caches (:mod:`.cache`) and the launcher seam
(:mod:`.launcher`: Triton's launcher, or the direct driver launch where it applies)."""
from .cache import SignatureCache, cache_stats, clear_caches, launch_key

__all__ = ["SignatureCache", "cache_stats", "clear_caches", "launch_key"]
