"""Mamba2 SSD (state space duality) in mamba_ssm's parameterisation: the CPU oracle.

Per head h, with a state ``h_t`` of shape ``[P, N]`` (P head dim rows, N = dstate columns, the
layout of mamba_ssm's state caches)::

    dt_t = dt_t + dt_bias;  dt_t = softplus(dt_t) if dt_softplus;  clamp to dt_limit (see below)
    h_t  = exp(dt_t * A) h_{t-1} + dt_t x_t B_t^T     (x_t: [P], B_t: [N]; one scalar decay per head)
    y_t  = h_t C_t + D * x_t                          (C_t: [N])
    y_t  = y_t * silu(z_t)                            (if z is given)

Head h reads B/C group ``h // (H // G)``. This is gated linear attention with ``q = C``,
``k = B``, ``v = dt * x``, log decay ``A * dt``, scale 1 (see :mod:`recurscan.algebra`); the chunk
page below is written on its own in mamba's ssd_minimal style so it can be checked against the
SSD paper directly.

dt semantics follow mamba_ssm's ``mamba_chunk_scan_combined`` reference path and
``selective_state_update``: bias, then softplus (torch's, linear above 20 like mamba's kernels),
then the clamp to ``dt_limit`` ONLY when ``dt_limit != (0.0, inf)``. Raw (not softplus'd) negative
dt is therefore kept as is by default. (mamba_ssm's Triton chunked kernel always clamps to
``[dt_limit[0], dt_limit[1]]`` = ``[0, inf)`` by default, which differs from its own references and
its decode step for negative raw dt; we follow the references.)
"""
from __future__ import annotations

import math
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

__all__ = ["ssd_naive", "ssd_chunked", "ssd_chunk", "discretize_dt", "skip_and_gate"]

DEFAULT_DT_LIMIT = (0.0, math.inf)


def discretize_dt(
    dt: torch.Tensor,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = DEFAULT_DT_LIMIT,
) -> torch.Tensor:
    """mamba_ssm's step sizes: ``dt + dt_bias``, softplus if asked, clamp if a limit is set.

    Args:
        dt: ``[..., H]`` raw step sizes.
        dt_bias: ``[H]`` or None.
        dt_softplus: apply ``softplus`` (torch's: linear above 20, as mamba's kernels).
        dt_limit: ``(min, max)``; the clamp is applied only when it differs from ``(0.0, inf)``.

    Returns:
        ``[..., H]`` in the dtype of ``dt`` (cast it first).

    Example:
        >>> import torch
        >>> from recurscan.reference.ssd import discretize_dt
        >>> discretize_dt(torch.tensor([-1.0, 0.0, 30.0]), dt_softplus=True)
        tensor([ 0.3133,  0.6931, 30.0000])
        >>> discretize_dt(torch.tensor([-1.0, 2.0]))  # raw dt, default limit: not clamped
        tensor([-1.,  2.])
    """
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt)
    if tuple(dt_limit) != DEFAULT_DT_LIMIT:
        dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])
    return dt


def skip_and_gate(
    y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None
) -> torch.Tensor:
    """The parts of a Mamba2 output outside the recurrence: ``y + D * x``, then ``* silu(z)``.

    Args:
        y: ``[..., H, P]`` the recurrence's read ``h_t C_t``.
        x: ``[..., H, P]`` the input.
        D: ``[H]`` or ``[H, P]`` skip weights, or None.
        z: ``[..., H, P]`` gate, or None.

    Example:
        >>> import torch
        >>> from recurscan.reference.ssd import skip_and_gate
        >>> skip_and_gate(torch.ones(1, 2, 3), torch.ones(1, 2, 3), torch.tensor([1.0, 2.0]), None)[0, :, 0]
        tensor([2., 3.])
    """
    if D is not None:
        y = y + (D.unsqueeze(-1) if D.dim() == 1 else D) * x
    if z is not None:
        y = y * F.silu(z)
    return y


# ---------------------------------------------------------------------------------------------
# One chunk window, mamba's ssd_minimal style, continuing from the incoming state
# ---------------------------------------------------------------------------------------------


def ssd_chunk(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk window of the SSD recurrence (no D, no z), continuing from ``state``.

    Args:
        x: ``[Ns, L, H, P]`` inputs of the window (L tokens, Ns sequences side by side).
        dt: ``[Ns, L, H]`` step sizes, already discretized (:func:`discretize_dt`).
        A: ``[H]`` rates (negative; ``-inf`` resets).
        B: ``[Ns, L, H, N]`` write vectors, already repeated from groups to heads.
        C: ``[Ns, L, H, N]`` read vectors, likewise.
        state: ``[Ns, H, P, N]`` the state entering the window.

    Returns:
        ``y`` ``[Ns, L, H, P]`` (the read ``h_t C_t``) and the state leaving the window
        ``[Ns, H, P, N]``.

    Example:
        >>> import torch
        >>> from recurscan.reference.ssd import ssd_chunk
        >>> x, dt = torch.randn(1, 8, 2, 4), torch.rand(1, 8, 2)
        >>> B, C = torch.randn(1, 8, 2, 3), torch.randn(1, 8, 2, 3)
        >>> y, s = ssd_chunk(x, dt, -torch.rand(2), B, C, torch.zeros(1, 2, 4, 3))
        >>> y.shape, s.shape
        (torch.Size([1, 8, 2, 4]), torch.Size([1, 2, 4, 3]))
    """
    L = x.shape[1]
    xdt = x * dt.unsqueeze(-1)  # [Ns, L, H, P]  the value written at each token, dt_t x_t

    # 1. Decays. Log decay per token dA_t = A * dt_t; one segsum over the window with a zero log
    #    prepended (index 0 = the incoming state): ss[..., i, j] = dA_{j+1} + ... + dA_i.
    dA = (dt * A).transpose(1, 2)  # [Ns, H, L]
    ss = segsum(F.pad(dA, (1, 0)))  # [Ns, H, L+1, L+1]
    decay = ss[..., 1:, 1:].exp()  # [Ns, H, L, L]  write j -> read i (1 on the diagonal)
    from_start = ss[..., 1:, 0].exp()  # [Ns, H, L]  incoming state -> read i (includes dA_1)
    to_end = ss[..., L, 1:].exp()  # [Ns, H, L]  write j -> window end (excludes dA_j)
    whole = ss[..., L, 0].exp()  # [Ns, H]  incoming state -> window end

    # 2. Diagonal block (outputs from writes inside the window): masked C B^T "attention". The
    #    mask is a selection (0 * NaN = NaN would carry a non-finite token t into the rows before
    #    it), and the product over tokens is taken causally (causal_matmul): a non-finite write
    #    dt_t x_t reaches rows >= t only.
    lower = torch.tril(torch.ones(L, L, dtype=torch.bool, device=x.device))
    scores = torch.where(lower, torch.einsum("nihs,njhs->nhij", C, B) * decay, 0)  # [Ns, H, L, L]
    y_diag = causal_matmul(scores, xdt.transpose(1, 2)).transpose(1, 2)  # [Ns, L, H, P]

    # 3. Off-diagonal block (outputs from everything before the window): read the incoming state.
    y_off = torch.einsum("nihs,nhps,nhi->nihp", C, state, from_start)  # [Ns, L, H, P]

    # 4. State passing: the incoming state decays through the window; each write is decayed to
    #    the window end and added.
    written = torch.einsum("njhs,nhj,njhp->nhps", B, to_end, xdt)  # [Ns, H, P, N]
    state = whole[..., None, None] * state + written

    return y_diag + y_off, state


# ---------------------------------------------------------------------------------------------
# Public forms
# ---------------------------------------------------------------------------------------------


class _Prepared(NamedTuple):
    """Validated inputs, still the caller's tensors (views, no copies): each window or token is
    cast, discretized and repeated to heads on its own by :func:`_inputs_at`."""

    x: torch.Tensor  # [Bt, T, H, P]
    dt: torch.Tensor  # [Bt, T, H] raw
    A: torch.Tensor  # [H] compute dtype
    B: torch.Tensor  # [Bt, T, G, N]
    C: torch.Tensor  # [Bt, T, G, N]
    D: torch.Tensor | None  # [H] or [H, P], compute dtype
    z: torch.Tensor | None  # [Bt, T, H, P]
    dt_bias: torch.Tensor | None  # [H], compute dtype
    dt_softplus: bool
    dt_limit: tuple[float, float]
    dtype: torch.dtype
    state: torch.Tensor  # [N_seq, H, P, N] initial states in the compute dtype, a fresh tensor
    blocks: list[SequenceBlock]
    offsets: list[int]


def _prepare(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_state, cu_seqlens, chunk_size):
    if x.dim() != 4:
        raise ValueError(f"x must be [Bt, T, H, P]; got {tuple(x.shape)}")
    Bt, T, H, P = x.shape
    if dt.shape != (Bt, T, H):
        raise ValueError(f"dt must be [Bt, T, H] = {(Bt, T, H)}; got {tuple(dt.shape)}")
    if A.shape != (H,):
        raise ValueError(f"A must be [H] = {(H,)}; got {tuple(A.shape)}")
    if B.dim() != 4 or B.shape[:2] != (Bt, T) or C.shape != B.shape:
        raise ValueError(f"B and C must both be [Bt, T, G, N]; got {tuple(B.shape)} and {tuple(C.shape)}")
    G, N = B.shape[2], B.shape[3]
    if H % G != 0:
        raise ValueError(f"heads H={H} must be a multiple of groups G={G}")
    if D is not None and D.shape not in ((H,), (H, P)):
        raise ValueError(f"D must be [H] or [H, P] = {(H, P)}; got {tuple(D.shape)}")
    if z is not None and z.shape != x.shape:
        raise ValueError(f"z must be shaped like x {tuple(x.shape)}; got {tuple(z.shape)}")
    if dt_bias is not None and dt_bias.shape != (H,):
        raise ValueError(f"dt_bias must be [H] = {(H,)}; got {tuple(dt_bias.shape)}")
    if cu_seqlens is not None and Bt != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 (sequences packed along T); got {Bt}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive; got {chunk_size}")

    dtype = compute_dtype(x, dt, A, B, C, D, z, dt_bias, initial_state)
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    segments = sequences(Bt, T, cu_seqlens)
    Nseq = len(segments)
    if initial_state is None:
        state = x.new_zeros(Nseq, H, P, N, dtype=dtype)
    elif initial_state.shape != (Nseq, H, P, N):
        raise ValueError(
            f"initial_state must be [N_seq, H, P, N] = {(Nseq, H, P, N)}; got {tuple(initial_state.shape)}"
        )
    else:
        state = initial_state.to(dtype).clone()
    return _Prepared(
        x=x,
        dt=dt,
        A=cast(A),
        B=B,
        C=C,
        D=cast(D),
        z=z,
        dt_bias=cast(dt_bias),
        dt_softplus=dt_softplus,
        dt_limit=dt_limit,
        dtype=dtype,
        state=state,
        blocks=sequence_blocks(Bt, T, cu_seqlens),
        offsets=chunk_offsets(segments, chunk_size),
    )


def _inputs_at(p: _Prepared, rows: slice, span: slice):
    """Tokens ``span`` of batch rows ``rows``, ready for the recurrence: compute dtype, dt
    discretized, B and C repeated from groups to heads. x, B, C, z ``[n, L, H, .]``, dt ``[n, L, H]``."""
    x, dt, B, C = (u[rows, span].to(p.dtype) for u in (p.x, p.dt, p.B, p.C))
    z = None if p.z is None else p.z[rows, span].to(p.dtype)
    H = x.shape[2]
    dt = discretize_dt(dt, p.dt_bias, p.dt_softplus, p.dt_limit)
    return x, dt, repeat_heads(B, H, dim=2), repeat_heads(C, H, dim=2), z


def ssd_naive(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = DEFAULT_DT_LIMIT,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
    return_chunk_states: bool = False,
):
    """Mamba2 SSD, one token at a time (mamba_ssm's selective_state_update per step): the ground truth.

    ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = h_t C_t + D x_t``, ``y_t *= silu(z_t)``,
    with dt discretized as in :func:`discretize_dt`.

    Args:
        x: ``[Bt, T, H, P]`` inputs.
        dt: ``[Bt, T, H]`` raw step sizes.
        A: ``[H]`` rates (negative; the decay is ``exp(dt * A)``; ``-inf`` resets).
        B: ``[Bt, T, G, N]`` write vectors, ``H % G == 0``; head h uses group ``h // (H // G)``.
        C: ``[Bt, T, G, N]`` read vectors.
        D: ``[H]`` or ``[H, P]`` skip weights (default None: no skip).
        z: ``[Bt, T, H, P]`` gate, ``y * silu(z)`` (default None: no gate).
        dt_bias: ``[H]`` added to dt first (default None).
        dt_softplus: apply softplus to ``dt + dt_bias`` (default False).
        dt_limit: ``(min, max)`` clamp, applied only when not the default ``(0.0, inf)``.
        initial_state: ``[N_seq, H, P, N]`` (None: zeros); N_seq = Bt, or ``len(cu_seqlens) - 1``.
        cu_seqlens: ``[N_seq + 1]`` int tensor of sequence boundaries along T (needs ``Bt == 1``).
        chunk_size: chunk window length (default 64); also where chunk states are taken.
        return_chunk_states: also return the state entering every chunk.

    Returns:
        ``(y, final_state)`` or ``(y, final_state, chunk_states)``: ``y`` ``[Bt, T, H, P]``,
        ``final_state`` ``[N_seq, H, P, N]``, ``chunk_states`` ``[NT, H, P, N]`` with
        ``NT = sum_i ceil(L_i / chunk_size)``; row ``chunk_offsets[i] + c`` is sequence i's state
        after its first ``chunk_size * c`` tokens (``c = 0``: its initial state). All in the
        compute dtype (float32, or float64 if any input is float64).

    Example:
        >>> import torch
        >>> from recurscan.reference.ssd import ssd_naive
        >>> Bt, T, H, P, G, N = 2, 10, 4, 6, 2, 5
        >>> x, dt = torch.randn(Bt, T, H, P), torch.randn(Bt, T, H)
        >>> A, B, C = -torch.rand(H), torch.randn(Bt, T, G, N), torch.randn(Bt, T, G, N)
        >>> y, state = ssd_naive(x, dt, A, B, C, D=torch.ones(H), dt_softplus=True)
        >>> y.shape, state.shape
        (torch.Size([2, 10, 4, 6]), torch.Size([2, 4, 6, 5]))
    """
    p = _prepare(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_state, cu_seqlens, chunk_size)
    y = p.state.new_empty(*x.shape)  # [Bt, T, H, P]
    final = p.state.clone()
    chunk_states = p.state.new_empty(p.offsets[-1], *p.state.shape[1:]) if return_chunk_states else None

    for blk in p.blocks:
        h = p.state[blk.seqs]  # [n, H, P, N]
        for t in range(blk.end - blk.start):
            if chunk_states is not None and t % chunk_size == 0:
                chunk_states[[p.offsets[n] + t // chunk_size for n in blk.sequence_numbers]] = h
            tok = blk.start + t
            x_t, dt_t, B_t, C_t, z_t = _inputs_at(p, blk.rows, slice(tok, tok + 1))  # [n, 1, H, .]
            x_t, dt_t, B_t, C_t = x_t[:, 0], dt_t[:, 0], B_t[:, 0], C_t[:, 0]  # [n, H, .]
            dA_t = torch.exp(dt_t * p.A)  # [n, H]
            h = dA_t[..., None, None] * h + (dt_t.unsqueeze(-1) * x_t).unsqueeze(-1) * B_t.unsqueeze(-2)
            y_t = torch.einsum("nhps,nhs->nhp", h, C_t)
            y[blk.rows, tok] = skip_and_gate(y_t, x_t, p.D, None if z_t is None else z_t[:, 0])
        final[blk.seqs] = h
    return (y, final, chunk_states) if return_chunk_states else (y, final)


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = DEFAULT_DT_LIMIT,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
    return_chunk_states: bool = False,
):
    """Mamba2 SSD, chunk window by chunk window (the chunked SSD algorithm, streamed).

    Same arguments, results and conventions as :func:`ssd_naive`; each window of ``chunk_size``
    tokens (the last may be short) is one call of :func:`ssd_chunk`, continuing from the previous
    window's state, so memory is one window plus one state at any length. ``D`` and ``z`` are
    applied afterwards (:func:`skip_and_gate`). Agrees with :func:`ssd_naive` up to reassociation.

    Shapes: x, z ``[Bt, T, H, P]``; dt ``[Bt, T, H]``; A, dt_bias ``[H]``; B, C ``[Bt, T, G, N]``;
    D ``[H]`` or ``[H, P]``; initial_state, final_state ``[N_seq, H, P, N]``; chunk_states
    ``[NT, H, P, N]``; y ``[Bt, T, H, P]``. Defaults as :func:`ssd_naive` (chunk_size 64).

    Example:
        >>> import torch
        >>> from recurscan.reference.ssd import ssd_chunked
        >>> x, dt = torch.randn(1, 100, 4, 6), torch.randn(1, 100, 4)
        >>> A, B, C = -torch.rand(4), torch.randn(1, 100, 1, 5), torch.randn(1, 100, 1, 5)
        >>> y, final, chunks = ssd_chunked(x, dt, A, B, C, dt_softplus=True, chunk_size=32,
        ...     cu_seqlens=torch.tensor([0, 1, 70, 100]), return_chunk_states=True)
        >>> y.shape, final.shape, chunks.shape  # NT = 1 + 3 + 1
        (torch.Size([1, 100, 4, 6]), torch.Size([3, 4, 6, 5]), torch.Size([5, 4, 6, 5]))
    """
    p = _prepare(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_state, cu_seqlens, chunk_size)
    y = p.state.new_empty(*x.shape)  # [Bt, T, H, P]
    final = p.state.clone()
    chunk_states = p.state.new_empty(p.offsets[-1], *p.state.shape[1:]) if return_chunk_states else None

    for blk in p.blocks:
        h = p.state[blk.seqs]  # [n, H, P, N]
        for c, (s, e) in enumerate(windows(blk.end - blk.start, chunk_size)):
            if chunk_states is not None:
                chunk_states[[p.offsets[n] + c for n in blk.sequence_numbers]] = h
            span = slice(blk.start + s, blk.start + e)
            x_c, dt_c, B_c, C_c, z_c = _inputs_at(p, blk.rows, span)  # [n, C, H, .]
            y_c, h = ssd_chunk(x_c, dt_c, p.A, B_c, C_c, h)
            y[blk.rows, span] = skip_and_gate(y_c, x_c, p.D, z_c)
        final[blk.seqs] = h
    return (y, final, chunk_states) if return_chunk_states else (y, final)
