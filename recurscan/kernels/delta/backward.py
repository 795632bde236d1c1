"""The backward of the chunked delta rule (GDN, M = 1): a reverse sweep over chunks that carries
dS, then a stage parallel over chunks for dq, dk, dg and dbeta. The algebra is
``reference/delta_backward.py``'s, the identities and the plan are docs/kernels-delta-backward.md.

Both read what the forward's prep writes, with STORE_INV (``winv = G o Tinv``, ``aqk``, ``coef``),
and the states entering each chunk (the forward's chunk states).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import _chunk_gates, _chunk_slot, _gate_tile


@triton.jit
def _mm(a, b, DT: tl.constexpr, PRECISION: tl.constexpr):
    """a @ b on DT operands (the inputs' dtype: 16-bit tiles halve the shared memory the products
    stage through), float32 accumulation."""
    return tl.dot(a.to(DT), b.to(DT), input_precision=PRECISION)


@triton.jit
def _sequence(cu_seqlens, i_n, T, IS_VARLEN: tl.constexpr):
    """(bos, length) of sequence i_n, clamped to [0, T]."""
    if IS_VARLEN:
        bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n).to(tl.int64), 0), T)
        eos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n + 1).to(tl.int64), bos), T)
    else:
        bos = i_n * T
        eos = bos + T
    return bos, eos


@triton.jit(do_not_specialize=["T", "n_cs_rows"])
def chunk_delta_bwd_sweep_kernel(
    q, k, v, beta, do, winv, aqk, coef, states, dstates, dht, dh0, u_out, dy_out, dv,
    cu_seqlens, chunk_offsets, T, n_cs_rows,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DT: tl.constexpr,
):
    """Grid (N * HV * ceil(V / BV),): one program per (sequence, value head, value block) holds
    dS [K, BV] (the gradient of the state leaving the chunk) and walks the chunks last to first.
    Per chunk, from the state S entering it (``states``) and raw q, k:

        X  = V - (lam rk) o (K S);   U = winv (beta o X)              the chunk's writes, again
        dU = aqk^T dO + (gam rk) o (K dS)
        dY = winv^T dU;              dv = beta o dY
        dS <- (lam rq)^T-weighted Q^T dO + lam_C dS - K^T ((lam rk) o dv)

    and writes dv, U and dY (the parallel stage's inputs) and dS leaving the chunk
    (``dstates``, the chunk-state rows); dh0 is dS entering the first chunk."""
    pid = tl.program_id(0).to(tl.int64)
    NV: tl.constexpr = (V + BV - 1) // BV
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_n = pid // (NV * HV)
    i_h = i_hv // (HV // H)
    bos, eos = _sequence(cu_seqlens, i_n, T, IS_VARLEN)
    if IS_VARLEN:
        cs0 = tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        cs0 = i_n * ((T + BT - 1) // BT)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]
    if HAS_DHT:
        b_dS = tl.load(dht + (i_n * HV + i_hv) * K * V + o_kv, mask=m_kv, other=0.0).to(tl.float32)
    else:
        b_dS = tl.zeros([BK, BV], dtype=tl.float32)
    n_chunks = (eos - bos + BT - 1) // BT
    for cc in range(0, n_chunks):
        c = n_chunks - 1 - cc
        r0 = bos + c * BT
        rows = r0 + o_t.to(tl.int64)
        m_r = rows < eos
        m_rk = m_r[:, None] & m_k[None, :]
        m_rv = m_r[:, None] & m_v[None, :]
        b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
        b_q = tl.load(q + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
        p_rv = (rows * HV + i_hv)[:, None] * V + o_v[None, :]
        b_v = tl.load(v + p_rv, mask=m_rv, other=0.0).to(tl.float32)
        b_do = tl.load(do + p_rv, mask=m_rv, other=0.0).to(tl.float32)
        b_beta = tl.load(beta + rows * HV + i_hv, mask=m_r, other=0.0).to(tl.float32)
        p_coef = coef + ((_chunk_slot(bos, c, i_n, BT) * HV + i_hv) * BT + o_t) * 4
        lam_rk = tl.load(p_coef, mask=m_r, other=0.0)
        lam_rq = tl.load(p_coef + 1, mask=m_r, other=0.0)
        gam_rk = tl.load(p_coef + 2, mask=m_r, other=0.0)
        lam_last = tl.sum(tl.load(p_coef + 3, mask=o_t == 0, other=0.0), axis=0)
        p_tt = (rows * HV + i_hv)[:, None] * BT + o_t[None, :]
        b_W = tl.load(winv + p_tt, mask=m_r[:, None], other=0.0).to(tl.float32)  # [BT, BT] G o Tinv
        b_Aqk = tl.load(aqk + p_tt, mask=m_r[:, None], other=0.0).to(tl.float32)
        p_state = ((cs0 + c) * HV + i_hv) * K * V + o_kv
        m_row = m_kv & (cs0 + c >= 0) & (cs0 + c < n_cs_rows)  # no chunk_offsets reaches past the rows
        b_S = tl.load(states + p_state, mask=m_row, other=0.0)
        tl.store(dstates + p_state, b_dS, mask=m_row)

        b_X = b_v - lam_rk[:, None] * _mm(b_k, b_S, DT, DOT_PRECISION)
        b_U = _mm(b_W, b_beta[:, None] * b_X, DT, DOT_PRECISION)
        b_dU = _mm(tl.trans(b_Aqk), b_do, DT, DOT_PRECISION) + \
            gam_rk[:, None] * _mm(b_k, b_dS, DT, DOT_PRECISION)
        b_dY = _mm(tl.trans(b_W), b_dU, DT, DOT_PRECISION)
        b_dv = b_beta[:, None] * b_dY
        tl.store(u_out + p_rv, b_U, mask=m_rv)
        tl.store(dy_out + p_rv, b_dY, mask=m_rv)
        tl.store(dv + p_rv, b_dv, mask=m_rv)
        b_dS = _mm(tl.trans(b_q), lam_rq[:, None] * b_do, DT, DOT_PRECISION) + lam_last * b_dS \
            - _mm(tl.trans(b_k), lam_rk[:, None] * b_dv, DT, DOT_PRECISION)
    if STORE_DH0:
        tl.store(dh0 + (i_n * HV + i_hv) * K * V + o_kv, b_dS, mask=m_kv)


@triton.jit(do_not_specialize=["T", "n_seq", "part_rows", "n_cs_rows"])
def chunk_delta_bwd_grads_kernel(
    q, k, v, g, beta, do, u, dy, states, dstates, dq, dk, dg, dbeta,
    cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, scale, part_rows, n_cs_rows,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_G: tl.constexpr, USE_L2NORM: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DT: tl.constexpr,
):
    """Grid (chunks x HV x ceil(V / BV),): one program per (chunk, value head, value block). From U,
    dY (the sweep's), S entering the chunk and dS leaving it, the steps 2-5 of
    ``reference.delta_backward.gdn_chunk_backward`` on the normalised q, k, over the block's value
    columns: every gradient here is a sum over the value columns of terms linear in them (the L2
    norm's backward too, for fixed q and k), so each block writes its part, ``dq[i_v]``,
    ``dk[i_v]``, ``dg[i_v]``, ``dbeta[i_v]`` (float32, before the GVA sum), and the launch sums
    the parts."""
    pid = tl.program_id(0).to(tl.int64)
    NV: tl.constexpr = (V + BV - 1) // BV
    i_v = pid % NV
    i_c = pid // (NV * HV)
    i_hv = (pid // NV) % HV
    i_h = i_hv // (HV // H)
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_c * 2).to(tl.int64)
        i_t = tl.load(chunk_indices + i_c * 2 + 1).to(tl.int64)
        if (i_n < 0) | (i_n >= n_seq):
            return
        bos, eos = _sequence(cu_seqlens, i_n, T, True)
        if (i_t < 0) | (i_t * BT >= eos - bos):
            return
        cs = tl.load(chunk_offsets + i_n).to(tl.int64) + i_t
    else:
        NTd = (T + BT - 1) // BT
        i_n = i_c // NTd
        i_t = i_c % NTd
        bos = i_n * T
        eos = bos + T
        cs = i_c
    r0 = bos + i_t * BT
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    rows = r0 + o_t.to(tl.int64)
    m_r = rows < eos
    m_rk = m_r[:, None] & m_k[None, :]
    m_rv = m_r[:, None] & m_v[None, :]
    m_kv = m_k[:, None] & m_v[None, :]
    causal = o_t[:, None] >= o_t[None, :]
    strict = o_t[:, None] > o_t[None, :]

    b_q = tl.load(q + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
    b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
    if USE_L2NORM:
        rq = tl.rsqrt(tl.sum(b_q * b_q, axis=1) + 1e-6)
        rk = tl.rsqrt(tl.sum(b_k * b_k, axis=1) + 1e-6)
        b_q = b_q * rq[:, None]
        b_k = b_k * rk[:, None]
    p_rv = (rows * HV + i_hv)[:, None] * V + o_v[None, :]
    b_v = tl.load(v + p_rv, mask=m_rv, other=0.0).to(tl.float32)
    b_do = tl.load(do + p_rv, mask=m_rv, other=0.0).to(tl.float32)
    b_U = tl.load(u + p_rv, mask=m_rv, other=0.0)
    b_dY = tl.load(dy + p_rv, mask=m_rv, other=0.0)
    b_beta = tl.load(beta + rows * HV + i_hv, mask=m_r, other=0.0).to(tl.float32)
    o_kv = o_k[:, None] * V + o_v[None, :]
    m_row = m_kv & (cs >= 0) & (cs < n_cs_rows)  # no chunk_offsets reaches past the rows
    b_S = tl.load(states + (cs * HV + i_hv) * K * V + o_kv, mask=m_row, other=0.0)
    b_dSn = tl.load(dstates + (cs * HV + i_hv) * K * V + o_kv, mask=m_row, other=0.0)

    # 1. The decays (the prep's stage 1): rows past the sequence carry decay 1, so the last row
    #    stands for the chunk's end.
    gc, seg, bad = _chunk_gates(g, rows, rows * 0, m_r, i_hv, HV, 1, BT, HAS_G)
    seg_last = tl.sum(tl.where(o_t == BT - 1, seg, 0), axis=0)
    gc_last = tl.sum(tl.where(o_t == BT - 1, gc, 0.0), axis=0)
    b_G = _gate_tile(gc, seg, causal, seg_last != 0)
    lam = tl.where(seg == 0, tl.exp2(gc), 0.0)
    gam = tl.where(seg == seg_last, tl.exp2(tl.where(seg == seg_last, gc_last - gc, 0.0)), 0.0)

    # 2. Through the outputs and the state leaving the chunk.
    b_QK = _mm(b_q, tl.trans(b_k), DT, DOT_PRECISION)
    b_KK = _mm(b_k, tl.trans(b_k), DT, DOT_PRECISION)
    b_ds = tl.where(causal, scale * _mm(b_do, tl.trans(b_U), DT, DOT_PRECISION), 0.0)
    b_dsG = b_ds * b_G
    b_dq = _mm(b_dsG, b_k, DT, DOT_PRECISION) + \
        scale * lam[:, None] * _mm(b_do, tl.trans(b_S), DT, DOT_PRECISION)
    b_KdS = _mm(b_k, b_dSn, DT, DOT_PRECISION)
    b_dk = _mm(tl.trans(b_dsG), b_q, DT, DOT_PRECISION) + \
        gam[:, None] * _mm(b_U, tl.trans(b_dSn), DT, DOT_PRECISION)
    b_dG = b_ds * b_QK
    b_dG += tl.where(o_t[:, None] == BT - 1, tl.sum(b_KdS * b_U, axis=1)[None, :], 0.0)  # gam = G[last, :]
    b_KS = _mm(b_k, b_S, DT, DOT_PRECISION)
    dlam = scale * tl.sum(b_do * _mm(b_q, b_S, DT, DOT_PRECISION), axis=1)
    dlam += tl.where(o_t == BT - 1, tl.sum(tl.sum(b_S * b_dSn, axis=1), axis=0), 0.0)

    # 3. Through the solve: dA = -strict(drhs U^T), drhs = beta o dY; dbeta = dY . (rhs - A U).
    b_drhs = b_beta[:, None] * b_dY
    b_A = tl.where(strict, b_KK * b_G, 0.0)
    b_dA = tl.where(strict, -_mm(b_drhs, tl.trans(b_U), DT, DOT_PRECISION), 0.0)
    b_dAG = b_dA * b_G
    b_dk += _mm(b_dAG, b_k, DT, DOT_PRECISION) + _mm(tl.trans(b_dAG), b_k, DT, DOT_PRECISION)
    b_dG += b_dA * b_KK
    b_rhs = b_v - lam[:, None] * b_KS
    d_beta = tl.sum(b_dY * (b_rhs - _mm(b_A, b_U, DT, DOT_PRECISION)), axis=1)

    # 4. Through rhs = V - diag(lam) K S.
    dlam -= tl.sum(b_drhs * b_KS, axis=1)
    b_dk -= lam[:, None] * _mm(b_drhs, tl.trans(b_S), DT, DOT_PRECISION)

    # 5. dg_m = sum_{i >= m} dlam_i lam_i + sum_{i >= m > j} dG[i, j] G[i, j].
    b_dSeg = tl.where(causal, b_dG * b_G, 0.0)
    below = tl.cumsum(b_dSeg, axis=0, reverse=True)  # row m: the rows i >= m, summed
    d_g = tl.sum(tl.where(strict, below, 0.0), axis=1) + tl.cumsum(dlam * lam, axis=0, reverse=True)

    if USE_L2NORM:  # y = x r: dx = r (dy - y (y . dy))
        b_dq = rq[:, None] * (b_dq - b_q * tl.sum(b_q * b_dq, axis=1)[:, None])
        b_dk = rk[:, None] * (b_dk - b_k * tl.sum(b_k * b_dk, axis=1)[:, None])
    part = i_v * part_rows  # the value block's part of [NV, B * T * HV, .]: part_rows = B * T * HV
    p_rk = (part + rows * HV + i_hv)[:, None] * K + o_k[None, :]
    tl.store(dq + p_rk, b_dq, mask=m_rk)
    tl.store(dk + p_rk, b_dk, mask=m_rk)
    tl.store(dbeta + part + rows * HV + i_hv, d_beta, mask=m_r)
    if HAS_G:
        tl.store(dg + part + rows * HV + i_hv, d_g, mask=m_r)
