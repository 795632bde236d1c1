"""recurscan: linear recurrences fast (Gated DeltaNet, Gated Delta Product, Mamba2 SSD, gated
linear attention, diagonal scans), with a CPU oracle anyone can read.

PyTorch tensors in and out; CPU tensors run the PyTorch oracle's chunked form. The scan algebra
(affine maps, scans, the chunkwise algorithm) is :mod:`recurscan.algebra`; the oracle is
:mod:`recurscan.reference`.
"""
from .ops import *  # noqa: F401,F403  (the public ops, listed in ops.__all__)
from .ops import __all__ as _ops
from .descriptors import build_chunk_descriptors

__all__ = [*_ops, "build_chunk_descriptors"]

__version__ = "0.1.0"
