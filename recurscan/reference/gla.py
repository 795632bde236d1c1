"""Gated linear attention (GLA): the CPU oracle.

The recurrence, per value head, with a key-by-value state ``S`` (rows: keys, columns: values)::

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T        (per-key decay, g_t: [K])
    S_t = exp(g_t) S_{t-1} + k_t v_t^T              (scalar decay per head, g_t: a number)
    o_t = scale * S_t^T q_t                         (the state is updated first, then read)

``gla_naive`` runs it token by token: the ground truth. ``gla_chunked`` is the chunkwise
algorithm (:func:`recurscan.algebra.chunked_gla` for a scalar decay), one chunk window at a time,
each window continuing from the previous window's state: a small masked attention inside the
window plus one read of and one update to the carried state. Every decay inside a window comes
from ``segsum`` (additions of the window's own log decays, never a difference of long cumulative
sums), so ``g = 0`` (decay 1) and ``g = -inf`` (a reset, decay 0) are exact and never produce NaN.

Both forms compute in float32, or float64 if any input is float64, and return results in that
dtype. Layout: inputs ``[B, T, H, D]`` (tokens before heads); varlen is ``B == 1`` plus
``cu_seqlens``; states ``[N, HV, K, V]``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from recurscan.algebra import segsum
from recurscan.reference.common import (
    CHUNK_SIZE,
    causal_matmul,
    chunk_offsets,
    compute_dtype,
    SequenceBlock,
    repeat_heads,
    sequence_blocks,
    sequences,
    windows,
)

__all__ = ["gla_naive", "gla_chunked", "gla_chunk"]




# ---------------------------------------------------------------------------------------------
# One chunk window: the page to check against the mathematics
# ---------------------------------------------------------------------------------------------


def gla_chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk window of gated linear attention, continuing from ``state``.

    Args:
        q: ``[N, C, HV, K]`` queries, already multiplied by ``scale`` and repeated to HV heads.
        k: ``[N, C, HV, K]`` keys, repeated to HV heads.
        v: ``[N, C, HV, V]`` values.
        g: ``[N, C, HV, Kg]`` log decays; ``Kg = 1`` (one per head) or ``Kg = K`` (one per key).
        state: ``[N, HV, K, V]`` the state entering the window.

    Returns:
        ``o`` ``[N, C, HV, V]`` and the state leaving the window ``[N, HV, K, V]``.

    Example:
        >>> import torch
        >>> from recurscan.reference.gla import gla_chunk
        >>> q, k, v = torch.randn(1, 8, 2, 3), torch.randn(1, 8, 2, 3), torch.randn(1, 8, 2, 5)
        >>> o, s = gla_chunk(q, k, v, -torch.rand(1, 8, 2, 1), torch.zeros(1, 2, 3, 5))
        >>> o.shape, s.shape
        (torch.Size([1, 8, 2, 5]), torch.Size([1, 2, 3, 5]))
    """
    # Time and features as the last two dims, so the products below are matrix products.
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [N, HV, C, K], [N, HV, C, V]
    g = g.permute(0, 2, 3, 1)  # [N, HV, Kg, C]
    C = q.shape[-2]

    # 1. Every decay of the window from ONE segsum. A zero log is prepended, so index 0 stands for
    #    the state entering the window and ss[..., i, j] = g_{j+1} + ... + g_i (0 <= j <= i <= C),
    #    each entry summed from its own terms (no subtraction: a reset gives -inf, never NaN).
    ss = segsum(F.pad(g, (1, 0)))  # [N, HV, Kg, C+1, C+1]
    mask = ss[..., 1:, 1:].exp()  # [N, HV, Kg, C, C]  a_{i:j}, write j -> read i; diagonal 1:
    #                                                    a token reads its own write undecayed
    from_start = ss[..., 1:, 0].exp()  # [N, HV, Kg, C]  a_{i:0}, includes token 1's own decay
    to_end = ss[..., C, 1:].exp()  # [N, HV, Kg, C]  a_{C:j}, excludes token j's decay; last is 1
    whole = ss[..., C, 0].exp()  # [N, HV, Kg]  a_{C:0}, the whole window's decay

    # 2. Intra-chunk: a small causal attention, each score decayed from its write to its read.
    #    The causal mask is a selection (0 * NaN = NaN would carry a non-finite token t into the
    #    rows before it), and the product over tokens is taken causally (causal_matmul): a
    #    non-finite v_t reaches rows >= t only.
    if mask.shape[2] == 1:  # one decay per head: the mask factors out of the key sum
        scores = (q @ k.transpose(-1, -2)) * mask[:, :, 0]  # [N, HV, C, C]
    else:  # one decay per key dimension: it stays inside the key sum
        scores = torch.einsum("nhik,nhjk,nhkij->nhij", q, k, mask)  # [N, HV, C, C]
    lower = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    o = causal_matmul(torch.where(lower, scores, 0), v)  # [N, HV, C, V]

    # 3. Inter-chunk: each query reads the incoming state, decayed from the window start to it.
    o = o + (q * from_start.transpose(-1, -2)) @ state  # [N, HV, C, K] @ [N, HV, K, V]

    # 4. State update: the incoming state decays through the whole window; each write is decayed
    #    from its own token to the window end.
    k_to_end = k * to_end.transpose(-1, -2)  # [N, HV, C, K]
    state = whole.unsqueeze(-1) * state + k_to_end.transpose(-1, -2) @ v  # [N, HV, K, V]

    return o.transpose(1, 2), state


# ---------------------------------------------------------------------------------------------
# Public forms
# ---------------------------------------------------------------------------------------------


class _Prepared(NamedTuple):
    """Validated inputs, still the caller's tensors (views, no copies): each window or token is
    cast, scaled and repeated to HV heads on its own by :func:`_inputs_at`."""

    q: torch.Tensor  # [B, T, H, K]
    k: torch.Tensor  # [B, T, H, K]
    v: torch.Tensor  # [B, T, HV, V]
    g: torch.Tensor  # [B, T, HV, Kg], Kg in {1, K} (a view of [B, T, HV] for scalar decay)
    scale: float
    dtype: torch.dtype  # the compute dtype
    state: torch.Tensor  # [N, HV, K, V] initial states in the compute dtype, a fresh tensor
    blocks: list[SequenceBlock]
    offsets: list[int]  # chunk_offsets: row of chunk c of sequence n is offsets[n] + c


def _prepare(q, k, v, g, scale, initial_state, cu_seqlens, chunk_size) -> _Prepared:
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [B, T, H, K]; got {tuple(q.shape)} and {tuple(k.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or v.shape[:2] != (B, T):
        raise ValueError(f"v must be [B, T, HV, V] with B, T = {B}, {T}; got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if HV % H != 0:
        raise ValueError(f"value heads HV={HV} must be a multiple of query/key heads H={H}")
    if g.shape == (B, T, HV):
        g = g.unsqueeze(-1)  # one decay per head, broadcast over the key dimension
    elif g.shape != (B, T, HV, K):
        raise ValueError(f"g must be [B, T, HV] or [B, T, HV, K] = {(B, T, HV, K)}; got {tuple(g.shape)}")
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 (sequences packed along T); got B={B}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive; got {chunk_size}")

    dtype = compute_dtype(q, k, v, g, initial_state)
    segments = sequences(B, T, cu_seqlens)
    N = len(segments)
    if initial_state is None:
        state = q.new_zeros(N, HV, K, V, dtype=dtype)
    elif initial_state.shape != (N, HV, K, V):
        raise ValueError(f"initial_state must be [N, HV, K, V] = {(N, HV, K, V)}; got {tuple(initial_state.shape)}")
    else:
        state = initial_state.to(dtype).clone()
    return _Prepared(
        q=q,
        k=k,
        v=v,
        g=g,
        scale=K**-0.5 if scale is None else scale,
        dtype=dtype,
        state=state,
        blocks=sequence_blocks(B, T, cu_seqlens),
        offsets=chunk_offsets(segments, chunk_size),
    )


def _inputs_at(p: _Prepared, rows: slice, span: slice):
    """Tokens ``span`` of batch rows ``rows``, ready for the recurrence: compute dtype, q scaled,
    q and k repeated to HV heads. Each ``[n, L, HV, .]``."""
    q, k, v, g = (x[rows, span].to(p.dtype) for x in (p.q, p.k, p.v, p.g))
    HV = v.shape[2]
    return repeat_heads(q, HV, dim=2) * p.scale, repeat_heads(k, HV, dim=2), v, g


def _finish(o, state, chunk_states, return_chunk_states):
    return (o, state, chunk_states) if return_chunk_states else (o, state)


def gla_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
    return_chunk_states: bool = False,
):
    """Gated linear attention, one token at a time: the ground truth.

    ``S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T`` (scalar ``g_t``: ``exp(g_t) S_{t-1} + ...``),
    ``o_t = scale * S_t^T q_t``.

    Args:
        q: ``[B, T, H, K]`` queries.
        k: ``[B, T, H, K]`` keys.
        v: ``[B, T, HV, V]`` values, ``HV % H == 0``; value head ``hv`` reads q/k head
            ``hv // (HV // H)`` (grouped value attention).
        g: ``[B, T, HV]`` (one log decay per head) or ``[B, T, HV, K]`` (one per key dimension),
            natural log; ``0`` keeps the state, ``-inf`` resets it.
        scale: multiplies the read; default ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` (None: zeros). N = B, or ``len(cu_seqlens) - 1``.
        cu_seqlens: ``[N + 1]`` int tensor of sequence boundaries along T (needs ``B == 1``);
            each segment is an independent sequence. None: every batch row is one sequence.
        chunk_size: where the chunk-state snapshots are taken (default 64).
        return_chunk_states: also return the state entering every chunk.

    Returns:
        ``(o, final_state)`` or ``(o, final_state, chunk_states)``: ``o`` ``[B, T, HV, V]``,
        ``final_state`` ``[N, HV, K, V]``, ``chunk_states`` ``[NT, HV, K, V]`` with
        ``NT = sum_i ceil(L_i / chunk_size)``; row ``chunk_offsets[i] + c`` is sequence i's state
        after its first ``chunk_size * c`` tokens (row ``c = 0``: its initial state). All in the
        compute dtype (float32, or float64 if any input is float64).

    Example:
        >>> import torch
        >>> from recurscan.reference.gla import gla_naive
        >>> B, T, H, HV, K, V = 1, 10, 2, 4, 8, 6
        >>> q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
        >>> v, g = torch.randn(B, T, HV, V), -torch.rand(B, T, HV)
        >>> o, state = gla_naive(q, k, v, g)
        >>> o.shape, state.shape
        (torch.Size([1, 10, 4, 6]), torch.Size([1, 4, 8, 6]))
    """
    p = _prepare(q, k, v, g, scale, initial_state, cu_seqlens, chunk_size)
    o = p.state.new_empty(*v.shape)  # [B, T, HV, V]
    final = p.state.clone()
    chunk_states = p.state.new_empty(p.offsets[-1], *p.state.shape[1:]) if return_chunk_states else None

    for blk in p.blocks:
        S = p.state[blk.seqs]  # [n, HV, K, V]
        for t in range(blk.end - blk.start):
            if chunk_states is not None and t % chunk_size == 0:
                chunk_states[[p.offsets[n] + t // chunk_size for n in blk.sequence_numbers]] = S
            tok = blk.start + t
            q_t, k_t, v_t, g_t = (x[:, 0] for x in _inputs_at(p, blk.rows, slice(tok, tok + 1)))  # [n, HV, .]
            S = g_t.exp().unsqueeze(-1) * S + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
            o[blk.rows, tok] = torch.einsum("nhk,nhkv->nhv", q_t, S)
        final[blk.seqs] = S
    return _finish(o, final, chunk_states, return_chunk_states)


def gla_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
    return_chunk_states: bool = False,
):
    """Gated linear attention, chunk window by chunk window (the chunkwise algorithm).

    Same arguments, results and conventions as :func:`gla_naive`; each window of
    ``chunk_size`` tokens (the last may be short) is one call of :func:`gla_chunk`, continuing
    from the previous window's state, so memory is one window plus one state at any length.
    Agrees with :func:`gla_naive` up to reassociation.

    Shapes: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g ``[B, T, HV]`` or ``[B, T, HV, K]``;
    initial_state, final_state ``[N, HV, K, V]``; chunk_states ``[NT, HV, K, V]``; o
    ``[B, T, HV, V]``. Defaults: scale ``K ** -0.5``, zero initial state, chunk_size 64.

    Example:
        >>> import torch
        >>> from recurscan.reference.gla import gla_chunked
        >>> q, k = torch.randn(1, 100, 2, 8), torch.randn(1, 100, 2, 8)
        >>> v, g = torch.randn(1, 100, 2, 6), -torch.rand(1, 100, 2, 8)
        >>> cu = torch.tensor([0, 1, 70, 100])
        >>> o, final, chunks = gla_chunked(q, k, v, g, cu_seqlens=cu, chunk_size=32,
        ...                                return_chunk_states=True)
        >>> o.shape, final.shape, chunks.shape  # NT = 1 + 3 + 1
        (torch.Size([1, 100, 2, 6]), torch.Size([3, 2, 8, 6]), torch.Size([5, 2, 8, 6]))
    """
    p = _prepare(q, k, v, g, scale, initial_state, cu_seqlens, chunk_size)
    o = p.state.new_empty(*v.shape)  # [B, T, HV, V]
    final = p.state.clone()
    chunk_states = p.state.new_empty(p.offsets[-1], *p.state.shape[1:]) if return_chunk_states else None

    for blk in p.blocks:
        S = p.state[blk.seqs]  # [n, HV, K, V]
        for c, (s, e) in enumerate(windows(blk.end - blk.start, chunk_size)):
            if chunk_states is not None:
                chunk_states[[p.offsets[n] + c for n in blk.sequence_numbers]] = S
            span = slice(blk.start + s, blk.start + e)
            o[blk.rows, span], S = gla_chunk(*_inputs_at(p, blk.rows, span), S)  # window: [n, C, HV, .]
        final[blk.seqs] = S
    return _finish(o, final, chunk_states, return_chunk_states)
