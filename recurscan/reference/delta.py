"""Oracle for the delta-rule family: Gated DeltaNet (GDN) and Gated Delta Product (GDP).

The recurrence of one value head, per token t (state S is [K, V], rows keys, columns values):

    S  <- exp(g_t) * S                         decay (g is a natural log; -inf is a reset)
    u   = beta_t * (v_t - S^T k_t)              delta: what the state gets wrong about v_t
    S  <- S + k_t u^T                           write the correction under key k_t
    o_t = scale * S^T q_t                       read after the write

beta is per head ([.., HV]) or per value column ([.., HV, V]); q, k may be L2-normalised first
(fla's use_qk_l2norm_in_kernel); q/k have H heads and value head hv reads q/k head hv // (HV/H).

GDP applies M such writes per token (M Householder copies of k, v, beta, laid out on an expanded
stream of T*M rows), with the token's decay before the first copy and its read after the last.
The chunked GDP *is* the chunked GDN run on the expanded stream, so GDP's chunk
windows are windows of the expanded stream: ceil(L*M/64) of them, not M*ceil(L/64).
"""
from __future__ import annotations

import torch

from ..algebra import segsum
from .common import (CHUNK_SIZE, causal_matmul, chunk_offsets, compute_dtype, l2norm, repeat_heads, sequence_blocks,
                     sequences, windows)

# ----------------------------------------------------------------------------------------------
# One window of the chunkwise algorithm (the page to check against the maths)
# ----------------------------------------------------------------------------------------------


def gdn_chunk(S, q, k, v, g, beta, scale):
    """One chunk window of Gated DeltaNet, continuing from state ``S``.

    Shapes (N sequences, H value heads, C tokens in the window):
        S [N, H, K, V]; q, k [N, H, C, K]; v [N, H, C, V]; g [N, H, C];
        beta [N, H, C] (per head) or [N, H, C, V] (per value column).
    Returns (o [N, H, C, V], S_next [N, H, K, V]).

    Causal under non-finite input: a NaN or inf at token t leaves the outputs before t exactly as
    a clean window computes them (masks are selections, and the product over tokens is
    :func:`~recurscan.reference.common.causal_matmul`); the outputs from t on are non-finite where
    the token loop's are. Under growth (g > 0) the outputs are right until the true values leave
    the dtype's range, and non-finite from there.
    """
    C = q.shape[2]
    # 1. Decays, from each segment's own terms (seed 001): Gam[i, j] = a_i ... a_{j+1} (i >= j),
    #    lam[i] = a_1 ... a_i (from the window start, includes token 1's own decay),
    #    gam[j] = a_{j+1} ... a_C (to the window end, excludes the writer's own decay).
    Gam = segsum(g).exp()  # [N, H, C, C], zero above the diagonal
    lam = torch.cumsum(g, dim=-1).exp()  # [N, H, C]; a sum of at most C logs, never subtracted
    gam = Gam[..., -1, :]  # [N, H, C]
    lower = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    strict = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device), diagonal=-1)
    # Masks below are selections (torch.where), never products: 0 * NaN = NaN would carry a
    # non-finite token t into the rows before it.

    # 2. Token i's write is u_i = beta_i (v_i - S'_i^T k_i), where S'_i (decayed, before i's write)
    #    = lam_i S + sum_{j<i} Gam[i, j] k_j u_j^T. Collecting the u_j gives the unit lower
    #    triangular system (I + diag(beta) A) U = diag(beta) (V - diag(lam) K S),
    #    A = Gam o strictly_lower(K K^T): the WY form of the chunk's Householder products.
    A = torch.where(strict, (k @ k.transpose(-1, -2)) * Gam, 0)  # [N, H, C, C]
    rhs = v - lam.unsqueeze(-1) * (k @ S)  # [N, H, C, V]
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    if beta.dim() == 3:  # one beta per head: one system for every value column
        system = torch.where(strict, beta.unsqueeze(-1) * A, eye)  # I + diag(beta) A
        U = torch.linalg.solve_triangular(system, beta.unsqueeze(-1) * rhs, upper=False, unitriangular=True)
    else:  # a beta per value column: one system per column
        b = beta.transpose(-1, -2).unsqueeze(-1)  # [N, H, V, C, 1]
        system = torch.where(strict, b * A.unsqueeze(2), eye)  # [N, H, V, C, C]
        col = (b * rhs.transpose(-1, -2).unsqueeze(-1))  # [N, H, V, C, 1]
        U = torch.linalg.solve_triangular(system, col, upper=False, unitriangular=True)
        U = U.squeeze(-1).transpose(-1, -2)  # [N, H, C, V]

    # 3. Outputs read S_i = lam_i S + sum_{j<=i} Gam[i, j] k_j u_j^T: the state entering the
    #    window, plus the window's own writes through a masked attention matrix. Its product
    #    with U runs over tokens, so it is taken causally: a non-finite u_t (a bad input at t, or
    #    growth past the dtype's range) reaches rows >= t only, not through the zeros of rows < t.
    scores = torch.where(lower, (q @ k.transpose(-1, -2)) * Gam, 0)  # [N, H, C, C]
    o = scale * (lam.unsqueeze(-1) * (q @ S) + causal_matmul(scores, U))

    # 4. The state leaving the window.
    S_next = lam[..., -1, None, None] * S + k.transpose(-1, -2) @ (gam.unsqueeze(-1) * U)
    return o, S_next


def delta_write(S, k, v, beta):
    """One delta-rule write: S [N, H, K, V]; k [N, H, K]; v [N, H, V]; beta [N, H] or [N, H, V]."""
    beta = beta.unsqueeze(-1) if beta.dim() == 2 else beta
    u = beta * (v - torch.einsum("nhk,nhkv->nhv", k, S))
    return S + k.unsqueeze(-1) * u.unsqueeze(-2)


def gdn_step(S, q, k, v, g, beta, scale):
    """One token of Gated DeltaNet: decay, write, read. S [N, H, K, V]; q, k [N, H, K];
    v [N, H, V]; g [N, H] (a log decay per head) or [N, H, K] (per key row: fla's ``gk``);
    beta [N, H] or [N, H, V]. Returns (o [N, H, V], S)."""
    decay = g.exp()[..., None, None] if g.dim() == 2 else g.exp()[..., None]
    S = delta_write(decay * S, k, v, beta)
    return scale * torch.einsum("nhk,nhkv->nhv", q, S), S


# ----------------------------------------------------------------------------------------------
# Whole sequences
# ----------------------------------------------------------------------------------------------


def _prepare(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, cu_seqlens):
    """Cast to the compute dtype, normalise q/k, expand q/k to the value heads, fill defaults."""
    dtype = compute_dtype(q, k, v, g, beta, initial_state)
    B, T, HV, V = v.shape
    K = q.shape[-1]
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q, k = repeat_heads(q, HV, dim=2), repeat_heads(k, HV, dim=2)
    g = torch.zeros(B, T, HV, dtype=dtype, device=v.device) if g is None else g.to(dtype)
    beta = torch.ones(B, T, HV, dtype=dtype, device=v.device) if beta is None else beta.to(dtype)
    scale = K**-0.5 if scale is None else scale
    segs = sequences(B, T, cu_seqlens)
    if initial_state is None:
        S0 = torch.zeros(len(segs), HV, K, V, dtype=dtype, device=v.device)
    else:
        S0 = initial_state.to(dtype)
    return q, k, v, g, beta, scale, S0, segs, dtype


def _run(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, cu_seqlens, chunk_size,
         return_chunk_states, chunked, emit_every=1):
    """Drive either form over every sequence. ``emit_every``: the output of token t is kept only
    where (t + 1) % emit_every == 0 (GDP's read after the last Householder copy)."""
    q, k, v, g, beta, scale, S0, segs, dtype = _prepare(
        q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, cu_seqlens)
    B, T, HV, V = v.shape
    o = torch.zeros(B, T, HV, V, dtype=dtype, device=v.device)
    finals, chunk_rows = [], []
    # Fixed-length batches run their B sequences side by side; varlen runs one sequence at a time.
    for block in sequence_blocks(B, T, cu_seqlens):
        # Views, not copies: the oracle's memory is the inputs, the output and one window.
        sl = (block.rows, slice(block.start, block.end))
        # [N, L, H, D] -> [N, H, L, D]: heads lead, time is the matrix dimension.
        qs, ks, vs, bs, gs, out = (x[sl].transpose(1, 2) for x in (q, k, v, beta, g, o))
        S = S0[block.seqs]
        snapshots = []
        L = block.end - block.start
        if chunked:
            for a, b in windows(L, chunk_size):
                if return_chunk_states:
                    snapshots.append(S)
                out[:, :, a:b], S = gdn_chunk(S, qs[:, :, a:b], ks[:, :, a:b], vs[:, :, a:b], gs[:, :, a:b],
                                              bs[:, :, a:b], scale)
        else:
            for t in range(L):
                if return_chunk_states and t % chunk_size == 0:
                    snapshots.append(S)
                out[:, :, t], S = gdn_step(S, qs[:, :, t], ks[:, :, t], vs[:, :, t], gs[:, :, t], bs[:, :, t],
                                           scale)
        finals.append(S)
        if snapshots:
            chunk_rows.append(torch.stack(snapshots, dim=1))  # [N, chunks, H, K, V]
    final = torch.cat(finals)
    if emit_every > 1:
        o = o[:, emit_every - 1 :: emit_every]
    results = (o, final)
    if return_chunk_states:
        # Sequence-major rows: row chunk_offsets[n] + c is sequence n's state entering chunk c.
        flat = [r for block in chunk_rows for r in block.unbind(0)]
        states = torch.cat(flat) if flat else torch.zeros(0, HV, q.shape[-1], V, dtype=dtype, device=v.device)
        results += (states,)
    return results


def gated_delta_rule_naive(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_size=CHUNK_SIZE,
                           return_chunk_states=False):
    """Gated DeltaNet by the token loop: the ground truth.

    Args:
        q, k: ``[B, T, H, K]``.  v: ``[B, T, HV, V]`` (HV a multiple of H).
        g: ``[B, T, HV]`` natural-log decays, or ``[B, T, HV, K]`` (a decay per key row, fla's
            ``gk``; the token loop only), or None (no decay).
        beta: ``[B, T, HV]`` or ``[B, T, HV, V]``, or None (ones).
        scale: defaults to ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` or None (zeros); N = B, or the number of sequences.
        use_qk_l2norm_in_kernel: L2-normalise q and k (eps 1e-6) first.
        cu_seqlens: ``[N + 1]`` sequence boundaries with B = 1, or None.
        chunk_size: spacing of the chunk states (64).
        return_chunk_states: also return ``[NT, HV, K, V]``; row ``offsets[n] + c`` is sequence n's
            state entering its chunk c (``reference.common.chunk_offsets``).

    Returns:
        ``(o [B, T, HV, V], final_state [N, HV, K, V])`` (+ chunk states), in float32 (float64 if
        any input is float64).

    Example:
        >>> import torch
        >>> from recurscan.reference.delta import gated_delta_rule_naive
        >>> q, k = torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8)
        >>> v, g, beta = torch.randn(1, 5, 4, 6), -torch.rand(1, 5, 4), torch.rand(1, 5, 4)
        >>> o, S = gated_delta_rule_naive(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        >>> o.shape, S.shape
        (torch.Size([1, 5, 4, 6]), torch.Size([1, 4, 8, 6]))
    """
    return _run(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, cu_seqlens, chunk_size,
                return_chunk_states, chunked=False)


def gated_delta_rule_chunked(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                             use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_size=CHUNK_SIZE,
                             return_chunk_states=False):
    """Gated DeltaNet by the chunkwise algorithm, one window at a time (:func:`gdn_chunk`).

    Same arguments and results as :func:`gated_delta_rule_naive`.

    Example:
        >>> import torch
        >>> from recurscan.reference.delta import gated_delta_rule_chunked, gated_delta_rule_naive
        >>> q, k, v = torch.randn(1, 100, 2, 8), torch.randn(1, 100, 2, 8), torch.randn(1, 100, 2, 8)
        >>> g, beta = -torch.rand(1, 100, 2), torch.rand(1, 100, 2)
        >>> o, S = gated_delta_rule_chunked(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        >>> o2, S2 = gated_delta_rule_naive(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        >>> bool(torch.allclose(o, o2, atol=1e-5))
        True
    """
    if g is not None and g.dim() == 4:
        raise ValueError("g: a decay per key [B, T, HV, K] has a token-loop reference only "
                         "(gated_delta_rule_naive); the chunked form takes [B, T, HV]")
    return _run(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, cu_seqlens, chunk_size,
                return_chunk_states, chunked=True)


# ----------------------------------------------------------------------------------------------
# Gated Delta Product
# ----------------------------------------------------------------------------------------------


def expand_householder(q, g, num_householder):
    """Lay q and g out on the expanded stream: the decay on each token's first copy, the query on
    its last (zeros elsewhere). q ``[B, T, H, K]`` -> ``[B, T*M, H, K]``; g ``[B, T, HV]`` ->
    ``[B, T*M, HV]``."""
    M = num_householder
    B, T = q.shape[:2]
    q_exp = q.new_zeros(B, T * M, *q.shape[2:])
    q_exp[:, M - 1 :: M] = q
    g_exp = None
    if g is not None:
        g_exp = g.new_zeros(B, T * M, *g.shape[2:])
        g_exp[:, ::M] = g
    return q_exp, g_exp


def gated_delta_product_naive(q, k, v, g, beta, num_householder, scale=None, initial_state=None,
                              use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_size=CHUNK_SIZE,
                              return_chunk_states=False):
    """Gated Delta Product by the token loop: per token, decay, then M Householder writes, then read.

    Args:
        q: ``[B, T, H, K]``; k: ``[B, T*M, H, K]``; v: ``[B, T*M, HV, V]``; g: ``[B, T, HV]`` or None;
        beta: ``[B, T*M, HV]`` or ``[B, T*M, HV, V]`` or None; num_householder: M >= 1.
        cu_seqlens: ``[N + 1]`` boundaries on the token stream (B = 1), or None.
        Other arguments as :func:`gated_delta_rule_naive`. Chunk states are taken every
        ``chunk_size`` tokens of the token stream (row ``offsets[n] + c``: entering token chunk c).

    Returns:
        ``(o [B, T, HV, V], final_state [N, HV, K, V])`` (+ chunk states).

    Example:
        >>> import torch
        >>> from recurscan.reference.delta import gated_delta_product_naive
        >>> q, g = torch.randn(1, 4, 2, 8), -torch.rand(1, 4, 2)
        >>> k, v, beta = torch.randn(1, 8, 2, 8), torch.randn(1, 8, 2, 8), torch.rand(1, 8, 2)
        >>> o, S = gated_delta_product_naive(q, k, v, g, beta, num_householder=2)
        >>> o.shape
        torch.Size([1, 4, 2, 8])
    """
    M = num_householder
    q, k, v, g, beta, scale, S0, _, dtype = _prepare(
        q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, None)
    B, TM, HV, V = v.shape
    T = TM // M
    g = g if g.shape[1] == T else torch.zeros(B, T, HV, dtype=dtype, device=v.device)  # _prepare's default is on T*M rows
    segs = sequences(B, T, cu_seqlens)
    if initial_state is None:
        S0 = torch.zeros(len(segs), HV, q.shape[-1], V, dtype=dtype, device=v.device)
    o = torch.zeros(B, T, HV, V, dtype=dtype, device=v.device)
    finals, snapshots = [], []
    for seg in segs:
        S = S0[seg.index : seg.index + 1]
        for t in range(seg.start, seg.end):
            if return_chunk_states and (t - seg.start) % chunk_size == 0:
                snapshots.append(S)
            S = g[seg.b, t].exp()[None, :, None, None] * S
            for e in range(t * M, (t + 1) * M):  # the Householder copies of token t
                S = delta_write(S, k[seg.b, e][None], v[seg.b, e][None], beta[seg.b, e][None])
            o[seg.b, t] = scale * torch.einsum("hk,hkv->hv", q[seg.b, t], S[0])
        finals.append(S)
    results = (o, torch.cat(finals))
    if return_chunk_states:
        states = torch.cat(snapshots) if snapshots else torch.zeros(0, HV, q.shape[-1], V, dtype=dtype, device=v.device)
        results += (states,)
    return results


def gated_delta_product_chunked(q, k, v, g, beta, num_householder, scale=None, initial_state=None,
                                use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_size=CHUNK_SIZE,
                                return_chunk_states=False):
    """Gated Delta Product by the chunkwise algorithm: GDN's windows on the expanded stream.

    Same arguments and results as :func:`gated_delta_product_naive`.
    """
    M = num_householder
    if use_qk_l2norm_in_kernel:  # normalise before the zero rows are interleaved
        q, k = l2norm(q.to(compute_dtype(q))), l2norm(k.to(compute_dtype(k)))
    q_exp, g_exp = expand_householder(q, g, M)
    cu_exp = None if cu_seqlens is None else cu_seqlens * M
    out = _run(q_exp, k, v, g_exp, beta, scale if scale is not None else q.shape[-1] ** -0.5, initial_state,
               False, cu_exp, chunk_size, return_chunk_states, chunked=True, emit_every=M)
    if not return_chunk_states:
        return out
    o, final, expanded_states = out
    # A token-stream chunk c starts at expanded row 64*c*M, the start of expanded window c*M.
    B, T = q.shape[:2]
    segs = sequences(B, T, cu_seqlens)
    exp_offsets = chunk_offsets([s._replace(start=s.start * M, end=s.end * M) for s in segs], chunk_size)
    tok_offsets = chunk_offsets(segs, chunk_size)
    rows = [exp_offsets[n] + c * M for n in range(len(segs)) for c in range(tok_offsets[n + 1] - tok_offsets[n])]
    return o, final, expanded_states[rows]
