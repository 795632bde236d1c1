"""Public op of the diagonal recurrence h_t = a_t * h_{t-1} + b_t."""
from __future__ import annotations

from ..plan import plan
from ..problem import contiguous_indices, diagonal_problem
from ..reference import diagonal as ref


def diagonal_scan(a, b, initial_state=None, output_final_state=False, cu_seqlens=None):
    """The diagonal linear recurrence ``h_t = a_t * h_{t-1} + b_t``, every channel independent.

    Args:
        a: ``[B, T, D]`` decays (raw values, not logs: 0, 1 and negative are fine).
        b: ``[B, T, D]`` inputs.
        initial_state: ``[N, D]`` or None (zeros); N = B, or the number of sequences.
        output_final_state: also return ``h_T`` per sequence.
        cu_seqlens: ``[N + 1]`` boundaries (B = 1) or None.

    Returns:
        ``(h [B, T, D] in b's dtype, final_state [N, D] float32 or None)``.

    Example:
        >>> import torch, recurscan
        >>> h, last = recurscan.diagonal_scan(torch.full((1, 3, 1), 0.5), torch.ones(1, 3, 1),
        ...                                   output_final_state=True)
        >>> h.flatten().tolist(), last.flatten().tolist()
        ([1.0, 1.5, 1.75], [1.75])
    """
    cu_seqlens, = contiguous_indices(cu_seqlens)
    problem = diagonal_problem(a, b, initial_state=initial_state, cu_seqlens=cu_seqlens)
    schedule = plan("diagonal", problem, b.device)
    h, final = ref.diagonal_chunked(a, b, initial_state=initial_state, cu_seqlens=cu_seqlens,
                                    chunk_size=schedule.chunk_size)
    return h.to(b.dtype), final if output_final_state else None
