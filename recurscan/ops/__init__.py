"""Public ops, one module per family; each is validate (problem) -> plan -> backend."""
from .decode import fused_recurrent_gated_delta_rule, fused_recurrent_gated_delta_rule_update
from .delta_rule import chunk_gated_delta_product_varlen, chunk_gated_delta_rule
from .diagonal import diagonal_scan
from .gla import chunk_gla, chunk_simple_gla
from .ssd import mamba_chunk_scan_combined

__all__ = [
    "chunk_gated_delta_rule",
    "chunk_gated_delta_product_varlen",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_update",
    "mamba_chunk_scan_combined",
    "chunk_gla",
    "chunk_simple_gla",
    "diagonal_scan",
]
