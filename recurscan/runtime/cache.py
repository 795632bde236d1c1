"""The signature cache: what was validated and planned for a call signature, kept for the next
call of that signature. One class for every op's cache, one eviction policy, and one place to
clear them all or read their sizes."""
from __future__ import annotations


def launch_key(tensors) -> tuple:
    """Everything Triton specializes a launch on, per tensor: shape, strides, dtype, device and
    16-byte alignment. Calls with equal keys can share validation, launch arguments and compiled
    kernel. Imports no Triton, so the ops key their caches without it."""
    # a list comprehension, then one tuple: cheaper than a generator (this runs on every call)
    return tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15 == 0)
                  for t in tensors])


_CACHES: list["SignatureCache"] = []


class SignatureCache(dict):
    """A dict from call signature to what a call of it needs (read with ``get``, a plain dict
    lookup on the hot path); :meth:`put` stores, and starts over past ``limit`` entries (many
    distinct prompt lengths) rather than grow."""

    def __init__(self, name: str, limit: int = 4096):
        super().__init__()
        self.name, self.limit, self.stored, self.cleared = name, limit, 0, 0
        _CACHES.append(self)

    def put(self, key, value):
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        self.stored += 1
        return value

    def clear(self) -> None:
        super().clear()
        self.cleared += 1

    def stats(self) -> dict:
        return {"entries": len(self), "stored": self.stored, "cleared": self.cleared}


def clear_caches() -> None:
    """Forget every planned signature (the next call of each validates and plans again)."""
    for cache in _CACHES:
        cache.clear()


def cache_stats() -> dict:
    """``{cache name: {"entries", "stored", "cleared"}}`` for every op's signature cache."""
    return {cache.name: cache.stats() for cache in _CACHES}
