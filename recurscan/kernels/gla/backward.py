"""The backward of the scalar-decay GLA forward (kernels/gla/forward.py): a reverse sweep over
chunks carrying dS, then a stage parallel over chunks for dq, dk and dg. The delta-rule backward's
structure (kernels/delta/backward.py) without the WY terms. Per chunk, with the forward's
A^T[i, j] = G[i, j] scale (q_i . k_j) (i >= j), lam, gam, lam_C and S entering the chunk:

    O  = scale lam o (Q S) + A^T V                 S' = lam_C S + K^T (gam o V)
    dV = A dO + gam o (K dS')                      dS = scale Q^T (lam o dO) + lam_C dS'
    dQ = (dscores o G) K + scale lam o (dO S^T)    dscores = causal(scale dO V^T)
    dK = (dscores o G)^T Q + gam o (V dS'^T)
    dg from dG = dscores o (Q K^T) (G[last, :] = gam adds (K dS') . V) and dlam = scale q . (dO S^T)
    (lam_C = lam[last] adds S . dS'), by the reverse cumulative sums of reference step 5.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..delta.common import _chunk_gates, _chunk_head, _chunk_rows, _chunk_tiles, _sequence


@triton.jit(do_not_specialize=["T", "n_cs_rows"])
def chunk_simple_gla_bwd_sweep_kernel(
    q, k, g, do, dstates, dht, dh0, dv, cu_seqlens, chunk_offsets, T, scale, n_cs_rows,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_G: tl.constexpr, HAS_DHT: tl.constexpr,
    STORE_DH0: tl.constexpr, DOT_PRECISION: tl.constexpr, DT: tl.constexpr,
):
    """Grid (N * HV * ceil(V / BV),): one program per (sequence, value head, value block) holds
    dS^T [BV, K] (the gradient of the state leaving the chunk) and walks the chunks last to first:
    writes dS' per chunk (``dstates``, the chunk-state rows) and dV; dh0 is dS entering the first."""
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
    m_vk = m_v[:, None] & m_k[None, :]
    o_vk = o_k[None, :] * V + o_v[:, None]  # S[k, v] of a [K, V] state, as a [BV, BK] tile
    if HAS_DHT:
        b_dSt = tl.load(dht + (i_n * HV + i_hv) * K * V + o_vk, mask=m_vk, other=0.0).to(tl.float32)
    else:
        b_dSt = tl.zeros([BV, BK], dtype=tl.float32)
    lower = o_t[:, None] >= o_t[None, :]
    n_chunks = (eos - bos + BT - 1) // BT
    for cc in range(0, n_chunks):
        c = n_chunks - 1 - cc
        rows = bos + c * BT + o_t.to(tl.int64)
        m_r = rows < eos
        m_rk = m_r[:, None] & m_k[None, :]
        row_ok = (cs0 + c >= 0) & (cs0 + c < n_cs_rows)  # no chunk_offsets reaches past the rows
        tl.store(dstates + ((cs0 + c) * HV + i_hv) * K * V + o_vk, b_dSt.to(dstates.dtype.element_ty),
                 mask=m_vk & row_ok)
        b_q = tl.load(q + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(DT)
        b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(DT)
        p_vr = (rows * HV + i_hv)[None, :] * V + o_v[:, None]
        m_vr = m_v[:, None] & m_r[None, :]
        b_dot = tl.load(do + p_vr, mask=m_vr, other=0.0).to(tl.float32)  # dO^T [BV, BT]
        gc, seg, bad = _chunk_gates(g, rows, rows * 0, m_r, i_hv, HV, 1, BT, HAS_G)
        gc_last = tl.sum(tl.where(o_t == BT - 1, gc, 0.0), axis=0)
        seg_last = tl.sum(tl.where(o_t == BT - 1, seg, 0), axis=0)
        lam = tl.where(seg == 0, tl.exp2(gc), 0.0)
        gam = tl.where(seg == seg_last, tl.exp2(tl.where(seg == seg_last, gc_last - gc, 0.0)), 0.0)
        lam_last = tl.where(seg_last == 0, tl.exp2(gc_last), 0.0)
        # A^T[i, j] = G[i, j] scale (q_i . k_j): dV^T = dO^T A^T + (gam o (K dS'))^T
        b_G = tl.where(lower & (seg[:, None] == seg[None, :]), tl.exp2(gc[:, None] - gc[None, :]), 0.0)
        b_At = b_G * scale * tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION)
        b_dvt = tl.dot(b_dot.to(DT), b_At.to(DT), input_precision=DOT_PRECISION) + \
            gam[None, :] * tl.dot(b_dSt.to(DT), tl.trans(b_k), input_precision=DOT_PRECISION)
        tl.store(dv + p_vr, b_dvt.to(dv.dtype.element_ty), mask=m_vr)
        b_dSt = tl.dot((scale * lam[None, :] * b_dot).to(DT), b_q, input_precision=DOT_PRECISION) + lam_last * b_dSt
    if STORE_DH0:
        tl.store(dh0 + (i_n * HV + i_hv) * K * V + o_vk, b_dSt, mask=m_vk)


@triton.jit(do_not_specialize=["T", "n_seq", "n_cs_rows"])
def chunk_simple_gla_bwd_grads_kernel(
    q, k, v, g, do, states, dstates, dq, dk, dg, scratch, cu_seqlens, chunk_indices, chunk_offsets,
    T, n_seq, scale, n_cs_rows,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_G: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DT: tl.constexpr,
):
    """Grid (chunks x HV,): one program per (chunk, value head): the sums over V accumulated a
    block of BV columns at a time (dO S^T and V dS'^T [BT, K], dO V^T [BT, BT]), then dq, dk (per
    value head) and dg. (dscores o G)^T, the left operand of dk's intra-chunk product, is read back
    transposed through a per-program scratch [BT, BT] (no product result is transposed)."""
    i_c, i_hv, i_h = _chunk_head(H, HV)
    valid, bos, eos, r0, cs = _chunk_rows(cu_seqlens, chunk_indices, chunk_offsets, i_c, T, n_seq, BT, IS_VARLEN, 1)
    if not valid:
        return
    o_t, o_k, m_k, rows, m_r, m_rk = _chunk_tiles(r0, eos, BT, BK, K)
    causal = o_t[:, None] >= o_t[None, :]
    strict = o_t[:, None] > o_t[None, :]
    cs_ok = (cs >= 0) & (cs < n_cs_rows)
    p_s = states + (cs * HV + i_hv) * K * V
    p_ds = dstates + (cs * HV + i_hv) * K * V
    b_q = tl.load(q + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
    b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
    gc, seg, bad = _chunk_gates(g, rows, rows * 0, m_r, i_hv, HV, 1, BT, HAS_G)
    seg_last = tl.sum(tl.where(o_t == BT - 1, seg, 0), axis=0)
    gc_last = tl.sum(tl.where(o_t == BT - 1, gc, 0.0), axis=0)
    lam = tl.where(seg == 0, tl.exp2(gc), 0.0)
    gam = tl.where(seg == seg_last, tl.exp2(tl.where(seg == seg_last, gc_last - gc, 0.0)), 0.0)

    b_dOS = tl.zeros([BT, BK], dtype=tl.float32)  # dO S^T
    b_VdS = tl.zeros([BT, BK], dtype=tl.float32)  # V dS'^T
    b_dOV = tl.zeros([BT, BT], dtype=tl.float32)  # dO V^T
    sds = tl.zeros([BK], dtype=tl.float32)  # S . dS', by key row
    for i_v in range(0, (V + BV - 1) // BV):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_rv = m_r[:, None] & m_v[None, :]
        m_kv = m_k[:, None] & m_v[None, :] & cs_ok
        p_rv = (rows * HV + i_hv)[:, None] * V + o_v[None, :]
        b_v = tl.load(v + p_rv, mask=m_rv, other=0.0).to(DT)
        b_do = tl.load(do + p_rv, mask=m_rv, other=0.0).to(DT)
        o_kv = o_k[:, None] * V + o_v[None, :]
        b_S = tl.load(p_s + o_kv, mask=m_kv, other=0.0).to(DT)
        b_dS = tl.load(p_ds + o_kv, mask=m_kv, other=0.0).to(DT)
        b_dOS = tl.dot(b_do, tl.trans(b_S), b_dOS, input_precision=DOT_PRECISION)
        b_VdS = tl.dot(b_v, tl.trans(b_dS), b_VdS, input_precision=DOT_PRECISION)
        b_dOV = tl.dot(b_do, tl.trans(b_v), b_dOV, input_precision=DOT_PRECISION)
        sds += tl.sum(b_S.to(tl.float32) * b_dS.to(tl.float32), axis=1)

    b_G = tl.where(causal & (seg[:, None] == seg[None, :]), tl.exp2(gc[:, None] - gc[None, :]), 0.0)
    b_kd = b_k.to(DT)
    b_QK = tl.dot(b_q.to(DT), tl.trans(b_kd), input_precision=DOT_PRECISION)
    b_dscores = tl.where(causal, scale * b_dOV, 0.0)
    b_dsG = b_dscores * b_G
    b_dq = tl.dot(b_dsG.to(DT), b_kd, input_precision=DOT_PRECISION) + scale * lam[:, None] * b_dOS
    p_scr = scratch + (i_c * HV + i_hv) * BT * BT
    tl.store(p_scr + o_t[:, None] * BT + o_t[None, :], b_dsG.to(scratch.dtype.element_ty))
    tl.debug_barrier()
    b_dsGt = tl.load(p_scr + o_t[None, :] * BT + o_t[:, None], cache_modifier=".cg").to(DT)
    b_dk = tl.dot(b_dsGt, b_q.to(DT), input_precision=DOT_PRECISION) + gam[:, None] * b_VdS
    kdsv = tl.sum(b_k * b_VdS, axis=1)  # (K dS') . V by row: gam's gradient
    b_dG = b_dscores * b_QK
    b_dG += tl.where(o_t[:, None] == BT - 1, kdsv[None, :], 0.0)  # gam = G[last, :]
    dlam = scale * tl.sum(b_q * b_dOS, axis=1)
    dlam += tl.where(o_t == BT - 1, tl.sum(sds, axis=0), 0.0)  # lam_C = lam[last]
    b_dSeg = tl.where(causal, b_dG * b_G, 0.0)
    below = tl.cumsum(b_dSeg, axis=0, reverse=True)  # row m: the rows i >= m, summed
    d_g = tl.sum(tl.where(strict, below, 0.0), axis=1) + tl.cumsum(dlam * lam, axis=0, reverse=True)
    p_out = (rows * HV + i_hv)[:, None] * K + o_k[None, :]
    tl.store(dq + p_out, b_dq, mask=m_rk)
    tl.store(dk + p_out, b_dk, mask=m_rk)
    if HAS_G:
        tl.store(dg + rows * HV + i_hv, d_g, mask=m_r)
