"""The backward of the chunked delta rule (GDN, M = 1): a reverse sweep over chunks that carries
dS, then a stage parallel over chunks for dq, dk, dg and dbeta. The algebra is
``reference/delta_backward.py``'s, the identities and the plan are docs/kernels-delta-backward.md.

They read what the forward's prep writes, with STORE_INV (``winv = G o Tinv``, ``aqk``, ``coef``),
and what the recompute's sweep writes: the states entering each chunk, and each chunk's U and
lam o (K S).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import _chunk_gates, _chunk_head, _chunk_rows, _chunk_slot, _chunk_tiles, _sequence


@triton.jit
def _bwd_sweep_chunk(c, b_dS, q, k, beta, do, winv, aqk, coef, dstates, dy_out, dv, bos, L, i_n, i_h, i_hv, cs0,
                     n_cs_rows, o_t, o_k, o_v, m_k, m_v, m_kv, o_kv, H: tl.constexpr, HV: tl.constexpr,
                     K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, DOT_PRECISION: tl.constexpr,
                     DT: tl.constexpr, M: tl.constexpr, FULL: tl.constexpr):
    """Chunk c of :func:`chunk_delta_bwd_sweep_kernel` (its docstring has the algebra): writes dS
    leaving the chunk, the chunk's dY and dv, and returns dS^T entering it. FULL: the chunk's BT
    rows all lie in the sequence, so no tile is masked by row.

    Every address is a 64-bit scalar base (the chunk's first row) plus 32-bit offsets in the tile:
    per-lane 64-bit row arithmetic was a third of the chunk loop's instructions (sm_90 SASS)."""
    r0 = bos + c * BT  # the chunk's first row of the expanded stream
    tok0 = r0 // M  # q and dO live on the token stream, on each token's last copy
    o_tok = (r0 % M + o_t) // M  # a row's token, from tok0
    if FULL:
        m_r = tl.full([BT], True, tl.int1)
    else:
        m_r = c * BT + o_t < L
    if M == 1:
        m_q = m_r
    else:
        m_q = m_r & ((r0 % M + o_t) % M == M - 1)
    # The rows' decays times their norm factors, one [BT, 4] tile (lam rk, lam rq, gam rk, lam_C);
    # lam_C as a scalar load of the chunk's first row, always a row of the sequence.
    o_4 = tl.arange(0, 4)
    p_coef = coef + (_chunk_slot(bos, c, i_n, BT) * HV + i_hv) * BT * 4
    b_coef = tl.load(p_coef + o_t[:, None] * 4 + o_4[None, :], mask=m_r[:, None], other=0.0)
    lam_rk = tl.sum(tl.where(o_4[None, :] == 0, b_coef, 0.0), axis=1)
    lam_rq = tl.sum(tl.where((o_4[None, :] == 1) & m_q[:, None], b_coef, 0.0), axis=1)
    gam_rk = tl.sum(tl.where(o_4[None, :] == 2, b_coef, 0.0), axis=1)
    lam_last = tl.load(p_coef + 3)
    b_beta = tl.load(beta + r0 * HV + i_hv + o_t * HV, mask=m_r, other=0.0).to(tl.float32)

    cs = cs0 + c
    tl.store(dstates + (cs * HV + i_hv) * K * V + o_kv, b_dS.to(dstates.dtype.element_ty),
             mask=m_kv & (cs >= 0) & (cs < n_cs_rows))  # no chunk_offsets reaches past the rows
    b_k = tl.load(k + (r0 * H + i_h) * K + o_t[:, None] * (H * K) + o_k[None, :], mask=m_r[:, None] & m_k[None, :],
                  other=0.0).to(DT)
    b_q = tl.load(q + (tok0 * H + i_h) * K + o_tok[:, None] * (H * K) + o_k[None, :],
                  mask=m_q[:, None] & m_k[None, :], other=0.0).to(DT)
    b_dot = tl.load(do + (tok0 * HV + i_hv) * V + o_tok[None, :] * (HV * V) + o_v[:, None],
                    mask=m_v[:, None] & m_q[None, :], other=0.0).to(DT)  # dO^T [BV, BT]
    o_tt = (r0 * HV + i_hv) * BT + o_t[:, None] * (HV * BT) + o_t[None, :]
    b_W = tl.load(winv + o_tt, mask=m_r[:, None], other=0.0).to(DT)  # [BT, BT] G o Tinv
    b_Aqk = tl.load(aqk + o_tt, mask=m_q[:, None], other=0.0).to(DT)  # written on the query rows
    # dU^T = dO^T aqk + (gam rk) o (dS^T K^T); dY^T = dU^T winv; dv^T = beta o dY^T
    b_dUt = tl.dot(b_dot, b_Aqk, input_precision=DOT_PRECISION) + \
        gam_rk[None, :] * tl.dot(b_dS.to(DT), tl.trans(b_k), input_precision=DOT_PRECISION)
    b_dYt = tl.dot(b_dUt.to(DT), b_W, input_precision=DOT_PRECISION)
    b_dvt = b_beta[None, :] * b_dYt
    o_vr = (r0 * HV + i_hv) * V + o_t[None, :] * (HV * V) + o_v[:, None]  # [BV, BT] tiles of [rows, V] tensors
    m_vr = m_v[:, None] & m_r[None, :]
    tl.store(dy_out + o_vr, b_dYt.to(dy_out.dtype.element_ty), mask=m_vr)
    tl.store(dv + o_vr, b_dvt.to(dv.dtype.element_ty), mask=m_vr)
    # dS^T <- lam_C dS^T + (lam rq o dO)^T Q - (lam rk o dv)^T K, accumulated in the products
    b_dS = tl.dot((lam_rq[None, :] * b_dot.to(tl.float32)).to(DT), b_q, lam_last * b_dS,
                  input_precision=DOT_PRECISION)
    return tl.dot((-lam_rk[None, :] * b_dvt).to(DT), b_k, b_dS, input_precision=DOT_PRECISION)


@triton.jit(do_not_specialize=["T", "n_cs_rows"])
def chunk_delta_bwd_sweep_kernel(
    q, k, beta, do, winv, aqk, coef, dstates, dht, dh0, dy_out, dv,
    cu_seqlens, chunk_offsets, T, n_cs_rows,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DT: tl.constexpr, M: tl.constexpr = 1, NUM_STAGES: tl.constexpr = 3,
):
    """Grid (N * HV * ceil(V / BV),): one program per (sequence, value head, value block) holds
    dS (the gradient of the state leaving the chunk) and walks the chunks last to first. Per chunk,
    from raw q, k:

        dU = aqk^T dO + (gam rk) o (K dS)
        dY = winv^T dU;              dv = beta o dY
        dS <- (lam rq)^T-weighted Q^T dO + lam_C dS - K^T ((lam rk) o dv)

    and writes dY and dv (the parallel stage's inputs) and dS leaving the chunk (``dstates``, the
    chunk-state rows); dh0 is dS entering the first chunk. The chain from dS to dS is three
    products (K dS, winv^T dU, K^T dv); the state itself is not read here.

    The program computes these sums transposed, holding dS^T [BV, K] as the forward sweep holds
    S^T: the held gradient and the chain's products are then the left operands, which wgmma takes
    from registers, and only loaded tiles go through shared memory (measured against dS [K, BV]:
    docs/perf-history.md). A sequence's last chunk, when partial, runs first and masked; the full
    chunks before it run unmasked, their loads pipelined NUM_STAGES deep."""
    pid = tl.program_id(0).to(tl.int64)
    NV: tl.constexpr = (V + BV - 1) // BV
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_n = pid // (NV * HV)
    i_h = i_hv // (HV // H)
    bos, eos = _sequence(cu_seqlens, i_n, T, IS_VARLEN)
    bos, eos = bos * M, eos * M  # rows of the expanded stream (GDP: M copies of each token)
    L = eos - bos
    if IS_VARLEN:
        cs0 = tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        cs0 = i_n * ((T * M + BT - 1) // BT)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_v[:, None] & m_k[None, :]  # [BV, BK]
    o_kv = o_k[None, :] * V + o_v[:, None]  # S[k, v] of a [K, V] state, as a [BV, BK] tile
    p_h = (i_n * HV + i_hv) * K * V
    if HAS_DHT:
        b_dS = tl.load(dht + p_h + o_kv, mask=m_kv, other=0.0).to(tl.float32)
    else:
        b_dS = tl.zeros([BV, BK], dtype=tl.float32)
    c_full = L // BT
    if c_full * BT < L:  # the partial last chunk
        b_dS = _bwd_sweep_chunk(c_full, b_dS, q, k, beta, do, winv, aqk, coef, dstates, dy_out, dv, bos, L, i_n,
                                i_h, i_hv, cs0, n_cs_rows, o_t, o_k, o_v, m_k, m_v, m_kv, o_kv, H, HV, K, V, BT,
                                DOT_PRECISION, DT, M, False)
    for cc in tl.range(0, c_full, num_stages=NUM_STAGES):
        b_dS = _bwd_sweep_chunk(c_full - 1 - cc, b_dS, q, k, beta, do, winv, aqk, coef, dstates, dy_out, dv, bos, L,
                                i_n, i_h, i_hv, cs0, n_cs_rows, o_t, o_k, o_v, m_k, m_v, m_kv, o_kv, H, HV, K, V,
                                BT, DOT_PRECISION, DT, M, True)
    if STORE_DH0:
        tl.store(dh0 + p_h + o_kv, b_dS, mask=m_kv)


@triton.jit(do_not_specialize=["T", "n_seq"])
def chunk_delta_bwd_scores_kernel(
    q, k, v, g, beta, do, dy, u, ks, dg, dbeta, bdyks, scratch,
    cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_G: tl.constexpr, USE_L2NORM: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DT: tl.constexpr, M: tl.constexpr = 1,
):
    """The parallel stage, first half: the [BT, BT] side. Grid (chunks x HV,): per (chunk, value
    head), from dY (the reverse sweep's), and U and lam o (K S) (the recompute's, ``u`` and ``ks``),
    the steps 2-5 of ``reference.delta_backward.gdn_chunk_backward`` on the normalised q, k that
    need no state:

        dscores = lower(scale dO U^T);  dsys = -strict(dY U^T);  dA = beta o dsys
        dbeta = rowsum(dsys o A) + dY . V - dY . (lam o K S)
        dg    = the [BT, BT] tile's part (dscores o QK^T + dA o KK^T, through G) - the reverse
                cumulative sum of beta o dY . (lam o K S)

    dbeta comes out in full; dg's state terms (dO . (Q S), (K dS) . U, S . dS) are added by
    :func:`chunk_delta_bwd_dqdk_kernel`, which also takes ``bdyks = beta o dY . (lam o K S)``
    (float32, per row) and (dscores o G), (dA o G) from ``scratch [chunks * HV, 2, BT, BT]`` (DT).

    Its loop over value blocks of BV columns reads four [BT, BV] tiles and makes two products
    (dO U^T, dY U^T); nothing of the state or the key dimension is touched there.

    fla's issue 640 reports ``tl.dot(tl.trans(x), ...)``, x a product's result, miscompiled on
    Hopper by Triton 3.4 to 3.7.0 in a kernel of this kind. Here no product result is a transposed
    operand: U^T is a loaded tile, and the second half reads (dscores o G)^T and (dA o G)^T back
    transposed through the scratch, as fla's fix does."""
    i_c, i_hv, i_h = _chunk_head(H, HV)
    valid, bos, eos, r0, cs = _chunk_rows(cu_seqlens, chunk_indices, chunk_offsets, i_c, T, n_seq, BT, IS_VARLEN, M)
    if not valid:
        return
    o_t, o_k, m_k, rows, m_r, m_rk = _chunk_tiles(r0, eos, BT, BK, K)
    causal = o_t[:, None] >= o_t[None, :]
    strict = o_t[:, None] > o_t[None, :]
    tok = rows // M  # a row's token: q, dO and g live on the token stream
    m_q = m_r & (rows % M == M - 1)  # the query sits on each token's last copy
    b_beta = tl.load(beta + rows * HV + i_hv, mask=m_r, other=0.0).to(tl.float32)
    gc, seg, bad = _chunk_gates(g, tok, rows % M, m_r, i_hv, HV, M, BT, HAS_G)

    b_dOU = tl.zeros([BT, BT], dtype=tl.float32)  # dO U^T
    b_dYU = tl.zeros([BT, BT], dtype=tl.float32)  # dY U^T
    dyv = tl.zeros([BT], dtype=tl.float32)  # dY . V
    dyks = tl.zeros([BT], dtype=tl.float32)  # dY . (lam o K S)
    for i_v in range(0, (V + BV - 1) // BV):
        o_v = i_v * BV + tl.arange(0, BV)
        m_rv = m_r[:, None] & (o_v < V)[None, :]
        p_rv = (rows * HV + i_hv)[:, None] * V + o_v[None, :]
        b_do = tl.load(do + (tok * HV + i_hv)[:, None] * V + o_v[None, :], mask=m_q[:, None] & (o_v < V)[None, :],
                       other=0.0).to(DT)
        b_dY = tl.load(dy + p_rv, mask=m_rv, other=0.0)
        b_Ut = tl.trans(tl.load(u + p_rv, mask=m_rv, other=0.0).to(DT))
        b_dOU = tl.dot(b_do, b_Ut, b_dOU, input_precision=DOT_PRECISION)
        b_dYU = tl.dot(b_dY.to(DT), b_Ut, b_dYU, input_precision=DOT_PRECISION)
        b_dY = b_dY.to(tl.float32)
        dyv += tl.sum(b_dY * tl.load(v + p_rv, mask=m_rv, other=0.0).to(tl.float32), axis=1)
        dyks += tl.sum(b_dY * tl.load(ks + p_rv, mask=m_rv, other=0.0).to(tl.float32), axis=1)

    b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
    b_q = tl.load(q + (tok * H + i_h)[:, None] * K + o_k[None, :], mask=m_q[:, None] & m_k[None, :],
                  other=0.0).to(tl.float32)
    if USE_L2NORM:
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=1) + 1e-6)[:, None]
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, axis=1) + 1e-6)[:, None]
    b_kd = b_k.to(DT)
    b_kt = tl.trans(b_kd)
    b_QK = tl.dot(b_q.to(DT), b_kt, input_precision=DOT_PRECISION)
    b_KK = tl.dot(b_kd, b_kt, input_precision=DOT_PRECISION)
    b_G = tl.where(causal & (seg[:, None] == seg[None, :]), tl.exp2(gc[:, None] - gc[None, :]), 0.0)
    b_dscores = tl.where(causal, scale * b_dOU, 0.0)
    b_A = tl.where(strict, b_KK * b_G, 0.0)
    b_dsys = tl.where(strict, -b_dYU, 0.0)
    d_beta = tl.sum(b_dsys * b_A, axis=1) + dyv - dyks
    b_dA = b_beta[:, None] * b_dsys
    b_dSeg = tl.where(causal, (b_dscores * b_QK + b_dA * b_KK) * b_G, 0.0)
    below = tl.cumsum(b_dSeg, axis=0, reverse=True)  # row m: the rows i >= m, summed
    b_bdyks = b_beta * dyks
    d_g = tl.sum(tl.where(strict, below, 0.0), axis=1) - tl.cumsum(b_bdyks, axis=0, reverse=True)
    p_scr = scratch + (i_c * HV + i_hv) * 2 * BT * BT + o_t[:, None] * BT + o_t[None, :]
    tl.store(p_scr, (b_dscores * b_G).to(scratch.dtype.element_ty))
    tl.store(p_scr + BT * BT, (b_dA * b_G).to(scratch.dtype.element_ty))
    tl.store(dbeta + rows * HV + i_hv, d_beta, mask=m_r)
    tl.store(bdyks + rows * HV + i_hv, b_bdyks, mask=m_r)
    if HAS_G:  # g sits on each token's first copy
        tl.store(dg + tok * HV + i_hv, d_g, mask=m_r & (rows % M == 0))


@triton.jit
def _sds_term(lam, sds, o_t, BT: tl.constexpr):
    """S . dS enters dlam at the chunk's last row, so every row's dg through lam's reverse
    cumulative sum: lam[BT - 1] (S . dS) on every row."""
    return tl.sum(tl.where(o_t == BT - 1, lam, 0.0), axis=0) * tl.sum(sds, axis=0)


#: What a launch of :func:`chunk_delta_bwd_dqdk_kernel` computes (its PART): dk, dq, or dk then dq.
DQDK_DK, DQDK_DQ, DQDK_BOTH = 1, 2, 3


@triton.jit
def _dqdk_pass(q, k, g, beta, do, u, dy, states, dstates, dq, dk, dg, bdyks, scratch, scale, i_c, i_g, i_h, cs,
               cs_ok, o_t, o_k, m_k, rows, m_r, m_rk, tok, m_q, m_qk, H: tl.constexpr, HV: tl.constexpr,
               K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
               HAS_G: tl.constexpr, USE_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, DT: tl.constexpr,
               M: tl.constexpr, GROUP: tl.constexpr, DO_DQ: tl.constexpr, DO_DK: tl.constexpr):
    """One gradient of :func:`chunk_delta_bwd_dqdk_kernel` (dq or dk, its docstring has the algebra)
    over the program's value heads, its dg terms added to ``dg``, written. Each pass loads q and k
    itself: nothing of one pass stays live through the other's."""
    # q and k raw (16-bit), their normalised float32 rows formed where used: the [BT, K]
    # accumulators take half the registers.
    b_kr = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0)
    b_qr = tl.load(q + (tok * H + i_h)[:, None] * K + o_k[None, :], mask=m_qk, other=0.0)
    if USE_L2NORM:
        rk = tl.rsqrt(tl.sum(b_kr.to(tl.float32) * b_kr.to(tl.float32), axis=1) + 1e-6)
        rq = tl.rsqrt(tl.sum(b_qr.to(tl.float32) * b_qr.to(tl.float32), axis=1) + 1e-6)
    else:
        rk = tl.full([BT], 1.0, tl.float32)
        rq = tl.full([BT], 1.0, tl.float32)
    b_kd = (b_kr.to(tl.float32) * rk[:, None]).to(DT)
    b_qd = (b_qr.to(tl.float32) * rq[:, None]).to(DT)

    b_dq = tl.zeros([BT, BK], dtype=tl.float32)  # GROUP 1: dO S^T, then dq; else the group's dq so far
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)  # dk's state sum, then dk (the group's so far)
    proj_q = tl.zeros([BT], dtype=tl.float32)  # rowsum(Q o b_dq) after the heads before (GROUP > 1)
    proj_k = tl.zeros([BT], dtype=tl.float32)  # rowsum(K o b_dk) after the heads before
    for j in range(0, GROUP):
        i_hv = i_g * GROUP + j
        p_s = states + (cs * HV + i_hv) * K * V
        p_ds = dstates + (cs * HV + i_hv) * K * V
        b_beta = tl.load(beta + rows * HV + i_hv, mask=m_r, other=0.0).to(tl.float32)
        gc, seg, bad = _chunk_gates(g, tok, rows % M, m_r, i_hv, HV, M, BT, HAS_G)
        seg_last = tl.sum(tl.where(o_t == BT - 1, seg, 0), axis=0)
        gc_last = tl.sum(tl.where(o_t == BT - 1, gc, 0.0), axis=0)
        lam = tl.where(seg == 0, tl.exp2(gc), 0.0)
        gam = tl.where(seg == seg_last, tl.exp2(tl.where(seg == seg_last, gc_last - gc, 0.0)), 0.0)
        sds = tl.zeros([BK], dtype=tl.float32)  # S . dS, by key row
        for i_v in range(0, (V + BV - 1) // BV):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < V
            m_rv = m_r[:, None] & m_v[None, :]
            m_kv = m_k[:, None] & m_v[None, :] & cs_ok
            p_rv = (rows * HV + i_hv)[:, None] * V + o_v[None, :]
            o_kv = o_k[:, None] * V + o_v[None, :]
            b_S = tl.load(p_s + o_kv, mask=m_kv, other=0.0)
            b_St = tl.trans(b_S.to(DT))
            if DO_DQ:
                b_do = tl.load(do + (tok * HV + i_hv)[:, None] * V + o_v[None, :],
                               mask=m_q[:, None] & m_v[None, :], other=0.0)
                if GROUP == 1:
                    b_dq = tl.dot(b_do.to(DT), b_St, b_dq, input_precision=DOT_PRECISION)
                else:
                    b_dq = tl.dot(((scale * lam)[:, None] * b_do.to(tl.float32)).to(DT), b_St, b_dq,
                                  input_precision=DOT_PRECISION)
            if DO_DK:
                b_U = tl.load(u + p_rv, mask=m_rv, other=0.0).to(tl.float32)
                b_dY = tl.load(dy + p_rv, mask=m_rv, other=0.0).to(tl.float32)
                b_dS = tl.load(p_ds + o_kv, mask=m_kv, other=0.0)
                # S . dS from loads of their own (another cache modifier, so no pass merges them with
                # the products' loads): a load that fed a product's operand and this sum as well made
                # Triton 3.6's software-pipelined loop race on the H200 (the next stage's copy
                # overwrote the operand's shared memory under the product; dk and dg changed from
                # run to run, by up to 1.2e-2 at 32 columns a step).
                sds += tl.sum(tl.load(p_s + o_kv, mask=m_kv, other=0.0, cache_modifier=".cg").to(tl.float32) *
                              tl.load(p_ds + o_kv, mask=m_kv, other=0.0, cache_modifier=".cg").to(tl.float32), axis=1)
                b_dk = tl.dot((gam[:, None] * b_U).to(DT), tl.trans(b_dS.to(DT)), b_dk, input_precision=DOT_PRECISION)
                b_dk = tl.dot((-(lam * b_beta)[:, None] * b_dY).to(DT), b_St, b_dk, input_precision=DOT_PRECISION)
        if HAS_G:
            d_g = tl.zeros([BT], dtype=tl.float32)
            if DO_DK:
                gkdsu = tl.sum(b_kr.to(tl.float32) * rk[:, None] * b_dk, axis=1) - proj_k + \
                    tl.load(bdyks + rows * HV + i_hv, mask=m_r, other=0.0)
                d_g += (tl.cumsum(gkdsu, axis=0) - gkdsu) + _sds_term(lam, sds, o_t, BT)
            if DO_DQ:
                doqs = tl.sum(b_qr.to(tl.float32) * rq[:, None] * b_dq, axis=1)
                if GROUP == 1:
                    doqs = scale * lam * doqs
                else:
                    doqs = doqs - proj_q
                d_g += tl.cumsum(doqs, axis=0, reverse=True)
            m_g = m_r & (rows % M == 0)  # g sits on each token's first copy
            p_dg = dg + tok * HV + i_hv
            tl.store(p_dg, tl.load(p_dg, mask=m_g, other=0.0) + d_g, mask=m_g)
        p_scr = scratch + (i_c * HV + i_hv) * 2 * BT * BT
        if DO_DK:
            b_dk = tl.dot(tl.load(p_scr + BT * BT + o_t[:, None] * BT + o_t[None, :]).to(DT), b_kd, b_dk,
                          input_precision=DOT_PRECISION)  # (dA o G) K
            b_dk = tl.dot(tl.load(p_scr + BT * BT + o_t[None, :] * BT + o_t[:, None]).to(DT), b_kd, b_dk,
                          input_precision=DOT_PRECISION)  # (dA o G)^T K
            b_dk = tl.dot(tl.load(p_scr + o_t[None, :] * BT + o_t[:, None]).to(DT), b_qd, b_dk,
                          input_precision=DOT_PRECISION)  # (dscores o G)^T Q
            if HAS_G and GROUP > 1:
                proj_k = tl.sum(b_kr.to(tl.float32) * rk[:, None] * b_dk, axis=1)
        if DO_DQ:
            b_dsG = tl.load(p_scr + o_t[:, None] * BT + o_t[None, :]).to(DT)
            if GROUP == 1:
                b_dq = tl.dot(b_dsG, b_kd, input_precision=DOT_PRECISION) + scale * lam[:, None] * b_dq
            else:
                b_dq = tl.dot(b_dsG, b_kd, b_dq, input_precision=DOT_PRECISION)
                if HAS_G:
                    proj_q = tl.sum(b_qr.to(tl.float32) * rq[:, None] * b_dq, axis=1)

    NO: tl.constexpr = HV if GROUP == 1 else H  # the heads dq and dk are written per
    i_o = i_g if GROUP == 1 else i_h
    if DO_DK:
        if USE_L2NORM:  # y = x r: dx = r (dy - y (y . dy))
            b_k = b_kr.to(tl.float32) * rk[:, None]
            b_dk = rk[:, None] * (b_dk - b_k * tl.sum(b_k * b_dk, axis=1)[:, None])
        tl.store(dk + (rows * NO + i_o)[:, None] * K + o_k[None, :], b_dk.to(dk.dtype.element_ty), mask=m_rk)
    if DO_DQ:
        if USE_L2NORM:
            b_q = b_qr.to(tl.float32) * rq[:, None]
            b_dq = rq[:, None] * (b_dq - b_q * tl.sum(b_q * b_dq, axis=1)[:, None])
        tl.store(dq + (tok * NO + i_o)[:, None] * K + o_k[None, :], b_dq.to(dq.dtype.element_ty), mask=m_qk)


@triton.jit(do_not_specialize=["T", "n_seq", "n_cs_rows"])
def chunk_delta_bwd_dqdk_kernel(
    q, k, g, beta, do, u, dy, states, dstates, dq, dk, dg, bdyks, scratch,
    cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, scale, n_cs_rows,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_G: tl.constexpr, USE_L2NORM: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DT: tl.constexpr, M: tl.constexpr = 1, PART: tl.constexpr = 1,
    GROUP: tl.constexpr = 1,
):
    """The parallel stage, second half: the state side. Grid (chunks x HV / GROUP,): per (chunk,
    value head), from S entering the chunk and dS leaving it, the V-sums

        dO S^T   [BT, K]                                          (dq)
        (gam o U) dS^T - (lam beta o dY) S^T   [BT, K],  S . dS    (dk)

    then dq = (dscores o G) K + scale lam o dO S^T and dk = (dscores o G)^T Q + (dA o G) K +
    (dA o G)^T K + the second sum, with the [BT, BT] tiles and their transposes loaded from the
    first half's scratch; the L2 norm's backward. dg's state terms are added to what the first half
    wrote in ``dg``, from the sums' projections on the queries and keys:

        scale lam o dO . (Q S) = scale lam o rowsum(Q o dO S^T)
        gam o (K dS) . U       = rowsum(K o the second sum) + bdyks

    the first through lam's reverse cumulative sum (with S . dS at the chunk's last row), the
    second through gam's (G's last row: an exclusive cumulative sum).

    PART (:data:`DQDK_DK`, :data:`DQDK_DQ`, :data:`DQDK_BOTH`): the gradient a launch computes;
    dk's launch runs first (it reads what the first half wrote in ``dg`` and adds to it, as dq's
    then does). Each program holds one [BT, K] accumulator (both at once spilled at 4 warps:
    docs/perf-history.md); DQDK_BOTH makes dk's pass, then dq's in the same program, which reads
    q, k and the state tiles it read again while they are in L2.

    GROUP: value heads a program takes, one after another. 1: dq and dk per value head
    ``[.., HV, K]`` (GVA sums them after). HV / H: a GVA group's, summed in the accumulator, and
    written per q/k head in q's and k's dtypes; dO comes into dq's sum scaled by scale lam (each
    head its own), and each head's projections are the differences of the sum's projections
    before and after it."""
    NG: tl.constexpr = HV // GROUP
    pid = tl.program_id(0).to(tl.int64)
    i_g = pid % NG
    i_c = pid // NG
    i_h = (i_g * GROUP) // (HV // H)  # the q/k head of the program's value heads
    valid, bos, eos, r0, cs = _chunk_rows(cu_seqlens, chunk_indices, chunk_offsets, i_c, T, n_seq, BT, IS_VARLEN, M)
    if not valid:
        return
    o_t, o_k, m_k, rows, m_r, m_rk = _chunk_tiles(r0, eos, BT, BK, K)
    cs_ok = (cs >= 0) & (cs < n_cs_rows)
    tok = rows // M  # a row's token: q, dO, g and dq live on the token stream
    m_q = m_r & (rows % M == M - 1)  # the query sits on each token's last copy
    m_qk = m_q[:, None] & m_k[None, :]

    if PART != 2:  # DQDK_DK, DQDK_BOTH
        _dqdk_pass(q, k, g, beta, do, u, dy, states, dstates, dq, dk, dg, bdyks, scratch, scale, i_c, i_g, i_h, cs,
                   cs_ok, o_t, o_k, m_k, rows, m_r, m_rk, tok, m_q, m_qk, H, HV, K, V, BT, BK, BV, HAS_G, USE_L2NORM,
                   DOT_PRECISION, DT, M, GROUP, False, True)
    if PART == 3:  # DQDK_BOTH
        tl.debug_barrier()  # dk's pass added to dg; dq's reads it back
    if PART != 1:  # DQDK_DQ, DQDK_BOTH
        _dqdk_pass(q, k, g, beta, do, u, dy, states, dstates, dq, dk, dg, bdyks, scratch, scale, i_c, i_g, i_h, cs,
                   cs_ok, o_t, o_k, m_k, rows, m_r, m_rk, tok, m_q, m_qk, H, HV, K, V, BT, BK, BV, HAS_G, USE_L2NORM,
                   DOT_PRECISION, DT, M, GROUP, True, False)
