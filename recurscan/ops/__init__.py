"""Public ops, one module per family; each is validate (problem) -> plan -> backend."""
from .decode import (fold_householder, fused_recurrent_gated_delta_product_update, fused_recurrent_gated_delta_rule,
                     fused_recurrent_gated_delta_rule_update, unfold_householder)
from .delta_rule import chunk_gated_delta_product, chunk_gated_delta_product_varlen, chunk_gated_delta_rule
from .diagonal import diagonal_scan
from .gla import chunk_gla, chunk_simple_gla
from .mamba_decode import selective_state_update
from .schedules import record_schedules
from .ssd import mamba_chunk_scan_combined

__all__ = [
    "chunk_gated_delta_rule",
    "chunk_gated_delta_product",
    "chunk_gated_delta_product_varlen",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_update",
    "fused_recurrent_gated_delta_product_update",
    "fold_householder",
    "unfold_householder",
    "selective_state_update",
    "mamba_chunk_scan_combined",
    "chunk_gla",
    "chunk_simple_gla",
    "diagonal_scan",
    "record_schedules",
]
