"""Chunked delta-rule kernels: prep, sweep, fixup (and their shared device helpers)."""
