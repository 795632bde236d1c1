"""recurscan: linear recurrences fast (Gated DeltaNet, Gated Delta Product, Mamba2 SSD, gated
linear attention, diagonal scans), with a CPU oracle anyone can read.

Public ops (PyTorch tensors in and out; CPU tensors run the PyTorch oracle's chunked form):

- :func:`chunk_gated_delta_rule`, :func:`chunk_gated_delta_product_varlen` (prefill, training)
- :func:`fused_recurrent_gated_delta_rule_update`, :func:`fused_recurrent_gated_delta_rule` (decode)
"""
from .ops.delta_rule import (
    chunk_gated_delta_product_varlen,
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_update,
)

__version__ = "0.1.0"

__all__ = [
    "chunk_gated_delta_rule",
    "chunk_gated_delta_product_varlen",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_update",
]
