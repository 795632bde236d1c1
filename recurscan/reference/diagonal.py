"""Diagonal linear recurrence: the CPU oracle.

    h_t = a_t * h_{t-1} + b_t        (elementwise over D channels; a_t raw, may be 0, 1, negative)

``diagonal_naive`` runs it token by token: the ground truth. ``diagonal_chunked`` takes one chunk
window at a time, continuing from the previous window's state: it folds the incoming state into
the window's first step (``b_1 + a_1 h_0``) and runs a parallel scan of the affine maps
``(a_t, b_t)`` over the window (``algebra.hillis_steele_scan``). Products of decays are built by
multiplication only (no division, no logs), so ``a = 0`` and negative ``a`` are exact.

Both forms compute in float32, or float64 if any input is float64, and return that dtype.
Layout: ``a, b: [B, T, D]``; varlen is ``B == 1`` plus ``cu_seqlens``; states ``[N, D]``.
"""
from __future__ import annotations

import torch

from recurscan.algebra import hillis_steele_scan
from recurscan.reference.common import CHUNK_SIZE, chunk_offsets, compute_dtype, sequence_blocks, sequences, windows

__all__ = ["diagonal_naive", "diagonal_chunked", "diagonal_chunk"]


def diagonal_chunk(a: torch.Tensor, b: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk window of the diagonal recurrence, continuing from ``state``.

    Args:
        a: ``[N, L, D]`` decays of the window.
        b: ``[N, L, D]`` inputs of the window.
        state: ``[N, D]`` the state entering the window.

    Returns:
        ``h`` ``[N, L, D]`` and the state leaving the window ``[N, D]``.

    Example:
        >>> import torch
        >>> from recurscan.reference.diagonal import diagonal_chunk
        >>> h, s = diagonal_chunk(torch.full((1, 3, 1), 0.5), torch.ones(1, 3, 1), torch.full((1, 1), 8.0))
        >>> h.flatten(), s.flatten()
        (tensor([5.0000, 3.5000, 2.7500]), tensor([2.7500]))
    """
    # 1. Fold the incoming state into the first step: b_1 <- b_1 + a_1 h_0 (then h_0 acts as 0).
    b = torch.cat([b[:, :1] + a[:, :1] * state.unsqueeze(1), b[:, 1:]], dim=1)
    # 2. Parallel scan of the affine maps (a_t, b_t) over the window (time on dim 0 for the scan):
    #    position t gets the composition of steps 1..t, whose input part is h_t. Hillis-Steele
    #    builds every round with torch.cat, so autograd flows through it (algebra's Blelloch
    #    scan writes slices in place, which autograd refuses).
    _, h = hillis_steele_scan(a.transpose(0, 1), b.transpose(0, 1))
    h = h.transpose(0, 1)  # [N, L, D]
    # 3. The state leaving the window is the last position's.
    return h, h[:, -1]


def _prepare(a, b, initial_state, cu_seqlens, chunk_size):
    if a.dim() != 3 or b.shape != a.shape:
        raise ValueError(f"a and b must both be [B, T, D]; got {tuple(a.shape)} and {tuple(b.shape)}")
    Bsz, T, D = a.shape
    if cu_seqlens is not None and Bsz != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 (sequences packed along T); got B={Bsz}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive; got {chunk_size}")
    dtype = compute_dtype(a, b, initial_state)
    segments = sequences(Bsz, T, cu_seqlens)
    N = len(segments)
    if initial_state is None:
        state = a.new_zeros(N, D, dtype=dtype)
    elif initial_state.shape != (N, D):
        raise ValueError(f"initial_state must be [N, D] = {(N, D)}; got {tuple(initial_state.shape)}")
    else:
        state = initial_state.to(dtype).clone()
    blocks = sequence_blocks(Bsz, T, cu_seqlens)
    # a and b stay the caller's tensors (views, no copies); each window is cast on its own.
    return dtype, state, blocks, chunk_offsets(segments, chunk_size)


def diagonal_naive(
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
    return_chunk_states: bool = False,
):
    """The diagonal recurrence ``h_t = a_t * h_{t-1} + b_t``, one token at a time: the ground truth.

    Args:
        a: ``[B, T, D]`` decays (raw, not logs; 0, 1 and negative values are fine).
        b: ``[B, T, D]`` inputs.
        initial_state: ``[N, D]`` (None: zeros). N = B, or ``len(cu_seqlens) - 1``.
        cu_seqlens: ``[N + 1]`` int tensor of sequence boundaries along T (needs ``B == 1``);
            each segment is an independent sequence. None: every batch row is one sequence.
        chunk_size: where the chunk-state snapshots are taken (default 64).
        return_chunk_states: also return the state entering every chunk.

    Returns:
        ``(h, final_state)`` or ``(h, final_state, chunk_states)``: ``h`` ``[B, T, D]`` (every
        state), ``final_state`` ``[N, D]``, ``chunk_states`` ``[NT, D]`` with
        ``NT = sum_i ceil(L_i / chunk_size)``; row ``chunk_offsets[i] + c`` is sequence i's state
        after its first ``chunk_size * c`` tokens (``c = 0``: its initial state). All in the
        compute dtype (float32, or float64 if any input is float64).

    Example:
        >>> import torch
        >>> from recurscan.reference.diagonal import diagonal_naive
        >>> h, final = diagonal_naive(torch.full((1, 3, 2), 0.5), torch.ones(1, 3, 2))
        >>> h[0, :, 0], final.shape
        (tensor([1.0000, 1.5000, 1.7500]), torch.Size([1, 2]))
    """
    dtype, state, blocks, offsets = _prepare(a, b, initial_state, cu_seqlens, chunk_size)
    h_all = state.new_empty(*b.shape)  # [B, T, D]
    final = state.clone()
    chunk_states = state.new_empty(offsets[-1], state.shape[1]) if return_chunk_states else None

    for blk in blocks:
        h = state[blk.seqs]  # [n, D]
        for t in range(blk.end - blk.start):
            if chunk_states is not None and t % chunk_size == 0:
                chunk_states[[offsets[n] + t // chunk_size for n in blk.sequence_numbers]] = h
            tok = blk.start + t
            h = a[blk.rows, tok].to(dtype) * h + b[blk.rows, tok].to(dtype)
            h_all[blk.rows, tok] = h
        final[blk.seqs] = h
    return (h_all, final, chunk_states) if return_chunk_states else (h_all, final)


def diagonal_chunked(
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
    return_chunk_states: bool = False,
):
    """The diagonal recurrence, chunk window by chunk window, a parallel scan inside each window.

    Same arguments, results and conventions as :func:`diagonal_naive`: a, b, h ``[B, T, D]``;
    initial_state, final_state ``[N, D]``; chunk_states ``[NT, D]``; chunk_size default 64.
    Each window is one call of :func:`diagonal_chunk`, continuing from the previous window's
    state. Agrees with :func:`diagonal_naive` up to reassociation.

    Example:
        >>> import torch
        >>> from recurscan.reference.diagonal import diagonal_chunked
        >>> a, b = torch.rand(1, 100, 3), torch.randn(1, 100, 3)
        >>> h, final, chunks = diagonal_chunked(a, b, cu_seqlens=torch.tensor([0, 1, 70, 100]),
        ...                                     chunk_size=32, return_chunk_states=True)
        >>> h.shape, final.shape, chunks.shape  # NT = 1 + 3 + 1
        (torch.Size([1, 100, 3]), torch.Size([3, 3]), torch.Size([5, 3]))
    """
    dtype, state, blocks, offsets = _prepare(a, b, initial_state, cu_seqlens, chunk_size)
    h_all = state.new_empty(*b.shape)  # [B, T, D]
    final = state.clone()
    chunk_states = state.new_empty(offsets[-1], state.shape[1]) if return_chunk_states else None

    for blk in blocks:
        h = state[blk.seqs]  # [n, D]
        for c, (s, e) in enumerate(windows(blk.end - blk.start, chunk_size)):
            if chunk_states is not None:
                chunk_states[[offsets[n] + c for n in blk.sequence_numbers]] = h
            span = slice(blk.start + s, blk.start + e)
            a_c, b_c = a[blk.rows, span].to(dtype), b[blk.rows, span].to(dtype)  # [n, C, D]
            h_all[blk.rows, span], h = diagonal_chunk(a_c, b_c, h)
        final[blk.seqs] = h
    return (h_all, final, chunk_states) if return_chunk_states else (h_all, final)
