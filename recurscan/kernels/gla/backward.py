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

from ..delta.common import (_chunk_decays, _chunk_gates, _chunk_rows, _chunk_slot, _chunk_tiles, _gates_of,
                            _sequence)
from .group_prep import GROUP_COEF_WIDTH
from .prep import CALM, SUB, _key_gates, _log2_decays


@triton.jit(do_not_specialize=["T", "n_cs_rows"])
def chunk_simple_gla_bwd_sweep_kernel(
    q, k, g, do, dstates, dht, dh0, dv, cu_seqlens, chunk_offsets, T, scale, n_cs_rows, qg, kg, aqk, dl, coef,
    x, step, D, dx, dstep, dD,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_G: tl.constexpr, HAS_DHT: tl.constexpr,
    STORE_DH0: tl.constexpr, DOT_PRECISION: tl.constexpr, DT: tl.constexpr, PER_KEY: tl.constexpr = False,
    GATE_SCORES: tl.constexpr = False, SSD_GRADS: tl.constexpr = False, HAS_D: tl.constexpr = False,
    D_PER_CHANNEL: tl.constexpr = False,
):
    """Grid (N * HV * ceil(V / BV),): one program per (sequence, value head, value block) holds
    dS^T [BV, K] (the gradient of the state leaving the chunk) and walks the chunks last to first:
    writes dS' per chunk (``dstates``, the chunk-state rows) and dV; dh0 is dS entering the first.

    PER_KEY (a decay per key dimension): the chunk's gates come from the prep (kernels/gla/prep.py:
    the decayed query ``qg`` with the scale, key ``kg``, ``aqk`` = A and the state's decay ``dl``
    per key), so dV^T = dO^T A + (kg dS')^T and dS^T = dO^T qg + dl o dS'^T.

    GATE_SCORES (a scalar decay whose recompute ran the group prep, kernels/gla/group_prep.py,
    with CALM_GATES): the chunk's scores ``aqk [rows, H, BT]`` (scale Q K^T, causal) and gates
    ``coef`` (rows of 8 at the chunk's slot: lam scale, gam, lam_last, gc, seg, and the calm
    column factors f = 1 / (lam scale)) come from that prep, so no Q K^T product and no gates are
    formed here; in a calm chunk G_ij = lam_i / lam_j and gam_j = lam_last / lam_j, so
    dV^T = f o ((lam scale o dO)^T scores + scale lam_last (K dS')^T), the first operand the one the
    dS update takes, and no [BT, BT] tile of exp2 either.

    SSD_GRADS (Mamba2 SSD without a gate z: v = dt x, y = o + D x, dO = dy): dV goes no further
    than this program; it writes instead what autograd/ssd.py's step_backward forms from it, each
    in float32 and rounded once (:func:`recurscan.kernels.gla.ssd_gate.ssd_step_bwd_kernel`'s sums)::

        dx = dt o dV + D o dO                  (x's dtype, at dv's place)
        dstep[r, hv, i_v] = sum over the block's columns of x o dV    (float32 [rows, HV, NV])
        dD[0, n, hv, columns] = sum over the sequence's rows of x o dO   (float32 [2, N, HV, V], HAS_D;
                                                               dD[1] zeros: the twin's second share)

    from ``x`` and ``step`` (dt, float32 ``[rows, HV]``); dt's gradient through the log decay
    (dg A) is added after dg is formed."""
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
    if SSD_GRADS and HAS_D:  # D per value column ([BV, 1]) or per head, and D's sum over the rows
        if D_PER_CHANNEL:
            d_skip = tl.load(D + i_hv * V + o_v, mask=m_v, other=0.0).to(tl.float32)[:, None]
        else:
            d_skip = tl.load(D + i_hv).to(tl.float32)
        b_dD = tl.zeros([BV], dtype=tl.float32)
    for cc in range(0, n_chunks):
        c = n_chunks - 1 - cc
        rows = bos + c * BT + o_t.to(tl.int64)
        m_r = rows < eos
        m_rk = m_r[:, None] & m_k[None, :]
        row_ok = (cs0 + c >= 0) & (cs0 + c < n_cs_rows)  # no chunk_offsets reaches past the rows
        tl.store(dstates + ((cs0 + c) * HV + i_hv) * K * V + o_vk, b_dSt.to(dstates.dtype.element_ty),
                 mask=m_vk & row_ok)
        p_vr = (rows * HV + i_hv)[None, :] * V + o_v[:, None]
        m_vr = m_v[:, None] & m_r[None, :]
        b_dot = tl.load(do + p_vr, mask=m_vr, other=0.0).to(tl.float32)  # dO^T [BV, BT]
        if PER_KEY:
            p_g = (rows * HV + i_hv)[:, None] * K + o_k[None, :]
            b_qg = tl.load(qg + p_g, mask=m_rk, other=0.0).to(DT)
            b_kg = tl.load(kg + p_g, mask=m_rk, other=0.0).to(DT)
            b_A = tl.load(aqk + (rows * HV + i_hv)[:, None] * BT + o_t[None, :], mask=m_r[:, None], other=0.0)
            b_dl = tl.load(dl + ((cs0 + c) * HV + i_hv) * K + o_k, mask=m_k & row_ok, other=0.0)
            b_dvt = tl.dot(b_dot.to(DT), b_A.to(DT), input_precision=DOT_PRECISION) + \
                tl.dot(b_dSt.to(DT), tl.trans(b_kg), input_precision=DOT_PRECISION)
            b_dSt = tl.dot(b_dot.to(DT), b_qg, input_precision=DOT_PRECISION) + b_dl[None, :] * b_dSt
        elif GATE_SCORES:
            b_q = tl.load(q + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(DT)
            b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(DT)
            b_s = tl.load(aqk + (rows * H + i_h)[:, None] * BT + o_t[None, :], mask=m_r[:, None], other=0.0)
            p_coef = coef + (_chunk_slot(bos, c, i_n, BT) * HV + i_hv) * BT * GROUP_COEF_WIDTH
            o_w = tl.arange(0, GROUP_COEF_WIDTH)
            b_coef = tl.load(p_coef + o_t[:, None] * GROUP_COEF_WIDTH + o_w[None, :], mask=m_r[:, None], other=0.0)
            lam_s = tl.sum(tl.where(o_w[None, :] == 1, b_coef, 0.0), axis=1)  # lam scale
            lam_last = tl.load(p_coef + 3)
            b_Wdo = (lam_s[None, :] * b_dot).to(DT)  # (lam scale o dO)^T
            b_dSK = tl.dot(b_dSt.to(DT), tl.trans(b_k), input_precision=DOT_PRECISION)  # (K dS')^T
            f_0 = tl.load(p_coef)
            # dV^T = cols o (lhs^T (Gm o scores) + adds o (K dS')^T), the scores' one use after the
            # branch (a load read in both branches is not pipelined: Triton 3.6)
            if f_0 == f_0:  # calm (the column factors are NaN in every row otherwise)
                b_Gm = tl.full([BT, BT], 1.0, tl.float32)
                b_lhs = b_Wdo
                cols = tl.sum(tl.where(o_w[None, :] == 0, b_coef, 0.0), axis=1)
                adds = tl.full([BT], 1.0, tl.float32) * (scale * lam_last)
            else:
                gc = tl.sum(tl.where(o_w[None, :] == 4, b_coef, 0.0), axis=1)
                seg = tl.sum(tl.where(o_w[None, :] == 5, b_coef, 0.0), axis=1)
                # rows past the end (gc 0 as loaded) selected out: 2^(0 - gc_j) may be inf there
                keep = lower & (seg[:, None] == seg[None, :]) & m_r[:, None]
                b_Gm = tl.where(keep, tl.exp2(gc[:, None] - gc[None, :]), 0.0)
                b_lhs = b_dot.to(DT)
                cols = tl.full([BT], 1.0, tl.float32)
                adds = tl.sum(tl.where(o_w[None, :] == 2, b_coef, 0.0), axis=1)  # gam
            b_dvt = cols[None, :] * tl.dot(b_lhs, (b_Gm * b_s).to(DT), adds[None, :] * b_dSK,
                                           input_precision=DOT_PRECISION)
            b_dSt = tl.dot(b_Wdo, b_q, input_precision=DOT_PRECISION) + lam_last * b_dSt
        else:
            b_q = tl.load(q + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(DT)
            b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(DT)
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
            b_dSt = tl.dot((scale * lam[None, :] * b_dot).to(DT), b_q, input_precision=DOT_PRECISION) + \
                lam_last * b_dSt
        if SSD_GRADS:  # dx, dstep's share and D's (the docstring), in place of dV
            b_xt = tl.load(x + p_vr, mask=m_vr, other=0.0).to(tl.float32)  # x^T [BV, BT]
            b_dxt = b_dvt * tl.load(step + rows * HV + i_hv, mask=m_r, other=0.0)[None, :]
            if HAS_D:
                b_dxt += d_skip * b_dot
                b_dD += tl.sum(b_dot * b_xt, axis=1)
            tl.store(dx + p_vr, b_dxt.to(dx.dtype.element_ty), mask=m_vr)
            tl.store(dstep + (rows * HV + i_hv) * NV + i_v, tl.sum(b_dvt * b_xt, axis=0), mask=m_r)
        else:
            tl.store(dv + p_vr, b_dvt.to(dv.dtype.element_ty), mask=m_vr)
    if SSD_GRADS and HAS_D:  # dD [2, N, HV, V]: the second half is the warp-specialised twin's
        tl.store(dD + (i_n * HV + i_hv) * V + o_v, b_dD, mask=m_v)
        second = tl.num_programs(0) // NV * V  # dD[1]'s offset: N HV V
        tl.store(dD + second + (i_n * HV + i_hv) * V + o_v, tl.zeros([BV], dtype=tl.float32), mask=m_v)
    if STORE_DH0:
        tl.store(dh0 + (i_n * HV + i_hv) * K * V + o_vk, b_dSt, mask=m_vk)


@triton.jit
def _segment_sum(v1, c1, v2, c2):
    """A reverse scan's step that stops at a cut: v2 + (v1 unless c2)."""
    return v2 + tl.where(c2, 0.0, v1), c1 | c2


@triton.jit
def _row_decays(g, r, m_r, i_hv, o_k, m_k, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr):
    """Rows ``r``'s log2 decays per key ``[len(r), BK]``, a bad one (NaN, +inf) as 0, and whether
    each row has one."""
    b_g = _log2_decays(g, g, g, g, r, m_r, i_hv, o_k, m_k, 0.0, 0.0, HV, K, BK, True, False, False, False, False,
                       False)
    bad = (b_g != b_g) | (b_g == float("inf"))
    return tl.where(bad, 0.0, b_g), tl.max(bad.to(tl.int32), axis=1) != 0


@triton.jit
def _per_key_grads(q, k, g, b_q, b_k, b_dOS, b_VdS, b_dOV, b_VdO, sds, r0, eos, rows, m_r, i_h, i_hv, o_t, o_k, m_k,
                   scale, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                   DT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dq, dk and dg ``[BT, BK]`` of a chunk with a decay per key dimension (value head i_hv's
    part), from dO S^T, V dS'^T, dO V^T, V dO^T and S . dS' by key row. With b_i the cumulative
    log decay to row i (per key, within the chunk), E_ij = 2^(b_i - b_j) where i and j share a
    segment (no reset in rows j+1..i), and dA = causal(dO V^T):

        dq_i = scale (e_q o dO S^T + sum_j<=i dA_ij k_j o E_ij)       e_q = [seg = 0] 2^b_i
        dk_j = e_k o V dS'^T + scale sum_i>=j dA_ij q_i o E_ij        e_k = [seg = seg_last] 2^(b_last - b_j)
        dg_u = sum_{i >= u, same segment} (q_i o dq_i - k_i o dk_i) + [seg_u = seg_last] sum_v S' o dS'

    (the log decays enter only through q_i 2^b_i and k_j 2^-b_j, and the state leaving the chunk
    through 2^b_last; sum_v S' o dS' = dl o (S . dS') + sum_j kg_j o V dS'^T; a reset's dg is 0).
    fla's chunk_gla takes dg the same way.
    The sums over j (over i) are formed as the prep forms A (kernels/gla/prep.py): where the
    chunk's decays are calm, as one product split at the chunk's start; elsewhere between blocks
    of SUB rows through the factor split at a block's end (both factors <= 1), within a block pair
    by pair with the other row gathered from memory."""
    b_graw = _log2_decays(g, g, g, g, rows, m_r, i_hv, o_k, m_k, 0.0, 0.0, HV, K, BK, True, False, False, False,
                          False, False)
    bad_g, _gz, seg, seg_last, bl, bs, before, after, gl_last = _key_gates(b_graw, o_t, BT, BK)
    # Calm decays (as kernels/gla/prep.py's _calm_chunk: every input finite, no reset, each prefix
    # sum G within +-CALM): the sums over j and over i are one product each, split at the chunk's
    # start, in place of the blocks and pairs below.
    b_G = tl.cumsum(b_graw, axis=0)
    wild = (b_q * 0.0 != 0.0) | (b_k * 0.0 != 0.0) | ~(tl.abs(b_G) <= CALM) | (b_graw < -150.0)
    calm = tl.max(tl.max(wild.to(tl.int32), axis=1), axis=0) == 0
    bad_k = bad_g | (tl.max((b_k * 0.0 != 0.0).to(tl.int32), axis=1) != 0)
    bad_q = tl.max((b_q * 0.0 != 0.0).to(tl.int32), axis=1) != 0
    b_q = tl.where((bad_q | bad_k)[:, None], 0.0, b_q)
    b_k = tl.where(bad_k[:, None], 0.0, b_k)
    NB: tl.constexpr = BT // SUB
    blk = o_t // SUB
    end = o_t[:, None] % SUB == SUB - 1
    e_q = tl.where(seg == 0, tl.exp2(before + bl), 0.0)
    to_end = seg == seg_last[None, :]
    e_k = tl.where(to_end, tl.exp2(tl.where(to_end, bs + after, 0.0)), 0.0)
    dl = tl.where(seg_last == 0, tl.exp2(gl_last), 0.0)
    dA = tl.where(o_t[:, None] >= o_t[None, :], b_dOV, 0.0).to(DT)  # [i, j]
    dAt = tl.where(o_t[:, None] <= o_t[None, :], b_VdO, 0.0).to(DT)  # [j, i]
    dAf = dA.to(tl.float32)
    dAtf = dAt.to(tl.float32)
    if calm:  # the pairs j < i (the diagonal is added below)
        Dq = e_q * tl.dot(tl.where(o_t[:, None] > o_t[None, :], dAf, 0.0).to(DT), (b_k * tl.exp2(-b_G)).to(DT),
                          input_precision=DOT_PRECISION)
        Dk = tl.exp2(-b_G) * tl.dot(tl.where(o_t[:, None] < o_t[None, :], dAtf, 0.0).to(DT),
                                    (b_q * tl.exp2(b_G)).to(DT), input_precision=DOT_PRECISION)
    else:
        Dq = tl.zeros([BT, BK], dtype=tl.float32)
        Dk = tl.zeros([BT, BK], dtype=tl.float32)
        # Between blocks. dq: queries of block b, keys of the blocks before, split at row b SUB - 1.
        # dk: keys of block m, queries of the blocks after, split at row (m + 1) SUB - 1.
        for b in tl.static_range(1, NB):
            sref = tl.sum(tl.where(o_t[:, None] == b * SUB - 1, seg, 0), axis=0)
            mid = tl.zeros([BT, BK], dtype=tl.float32)  # the blocks between the key's and b
            for m in tl.static_range(1, b):
                tot = tl.sum(tl.where(end & (blk == m)[:, None], bl, 0.0), axis=0)
                mid += tl.where((blk < m)[:, None], tot[None, :], 0.0)
            in_b = (blk == b)[:, None] & (seg == sref[None, :])
            earlier = (blk < b)[:, None] & (seg == sref[None, :])
            b_ks = tl.where(earlier, b_k * tl.exp2(tl.where(earlier, bs + mid, 0.0)), 0.0)
            Dq += tl.where(in_b, tl.exp2(tl.where(in_b, bl, 0.0)), 0.0) * \
                tl.dot(dA, b_ks.to(DT), input_precision=DOT_PRECISION)
        for m in tl.static_range(0, NB - 1):
            sref = tl.sum(tl.where(o_t[:, None] == (m + 1) * SUB - 1, seg, 0), axis=0)
            mid = tl.zeros([BT, BK], dtype=tl.float32)  # the blocks between m and the query's
            for m2 in tl.static_range(m + 1, NB):
                tot = tl.sum(tl.where(end & (blk == m2)[:, None], bl, 0.0), axis=0)
                mid += tl.where((blk > m2)[:, None], tot[None, :], 0.0)
            in_m = (blk == m)[:, None] & (seg == sref[None, :])
            later = (blk > m)[:, None] & (seg == sref[None, :])
            b_qs = tl.where(later, b_q * tl.exp2(tl.where(later, bl + mid, 0.0)), 0.0)
            Dk += tl.where(in_m, tl.exp2(tl.where(in_m, bs, 0.0)), 0.0) * \
                tl.dot(dAt, b_qs.to(DT), input_precision=DOT_PRECISION)
        # Within a block, pair by pair. dq: row i with key j = its block's row jj, jj from the
        # block's end down (the span, rows j+1..i, grows by one gathered row a step); dk: row j with
        # query i = j + t, t up from 0 (the span, rows j+1..i, grows likewise).
        span_q = tl.zeros([BT, BK], dtype=tl.float32)
        cut_q = tl.zeros([BT, BK], dtype=tl.int32)
        span_k = tl.zeros([BT, BK], dtype=tl.float32)
        cut_k = tl.zeros([BT, BK], dtype=tl.int32)
        for t in range(0, SUB):
            jj = SUB - 1 - t
            col = blk * SUB + jj  # [BT]: row i's key in its block
            m_n = (o_t % SUB >= jj + 1) & (r0 + col + 1 < eos)  # rows whose span now includes row j + 1
            m_nk = m_n[:, None] & m_k[None, :]
            g_n, _bn = _row_decays(g, r0 + col + 1, m_n, i_hv, o_k, m_k, HV, K, BK)
            cut_q = cut_q | (m_nk & (g_n < -150.0)).to(tl.int32)
            span_q += tl.where(m_nk & (g_n >= -150.0), g_n, 0.0)
            m_j = (o_t % SUB > jj) & (r0 + col < eos)  # j < i: the diagonal pair is added after
            k_j = tl.load(k + ((r0 + col) * H + i_h)[:, None] * K + o_k[None, :], mask=m_j[:, None] & m_k[None, :],
                          other=0.0).to(tl.float32)
            _gj, bad_gj = _row_decays(g, r0 + col, m_j, i_hv, o_k, m_k, HV, K, BK)
            bad_j = bad_gj | (tl.max((k_j * 0.0 != 0.0).to(tl.int32), axis=1) != 0)
            pair = (m_j & ~bad_j)[:, None] & m_k[None, :] & (cut_q == 0)
            dA_col = tl.sum(tl.where(o_t[None, :] == col[:, None], dAf, 0.0), axis=1)
            Dq += tl.where(pair, dA_col[:, None] * k_j * tl.exp2(tl.where(pair, span_q, 0.0)), 0.0)
            ii = o_t + t + 1  # [BT]: row j's query, i > j
            m_i = (o_t % SUB + t + 1 < SUB) & (r0 + ii < eos)
            m_ik = m_i[:, None] & m_k[None, :]
            g_i, bad_gi = _row_decays(g, r0 + ii, m_i, i_hv, o_k, m_k, HV, K, BK)
            grow = m_ik
            cut_k = cut_k | (grow & (g_i < -150.0)).to(tl.int32)
            span_k += tl.where(grow & (g_i >= -150.0), g_i, 0.0)
            p_i = ((r0 + ii) * H + i_h)[:, None] * K + o_k[None, :]
            q_i = tl.load(q + p_i, mask=m_ik, other=0.0).to(tl.float32)
            k_i = tl.load(k + p_i, mask=m_ik, other=0.0).to(tl.float32)
            bad_i = bad_gi | (tl.max(((q_i * 0.0 != 0.0) | (k_i * 0.0 != 0.0)).to(tl.int32), axis=1) != 0)
            pair = (m_i & ~bad_i)[:, None] & m_k[None, :] & (cut_k == 0)
            dA_row = tl.sum(tl.where(o_t[None, :] == ii[:, None], dAtf, 0.0), axis=1)
            Dk += tl.where(pair, dA_row[:, None] * q_i * tl.exp2(tl.where(pair, span_k, 0.0)), 0.0)
    diag = tl.sum(tl.where(o_t[:, None] == o_t[None, :], dAf, 0.0), axis=1)  # dA_ii
    b_dq = scale * (e_q * b_dOS + Dq + diag[:, None] * b_k)
    b_dk = e_k * b_VdS + scale * (Dk + diag[:, None] * b_q)
    # dg: within each segment, the reverse sum of q o dq - k o dk from the row on, and on the last
    # segment's rows sum_v S' o dS'. Written without the terms that cancel exactly (the diagonal
    # pairs; kg o V dS'^T of the rows from u on, against the same in S'), so that a gradient that
    # is 0 comes out 0: q o dq - k o dk without them, and dl o (S . dS') + the rows before u of
    # kg o V dS'^T.
    kgvds = b_k * e_k * b_VdS
    dB = b_q * scale * (e_q * b_dOS + Dq) - b_k * scale * Dk
    carry = dl[None, :] * sds[None, :] + tl.cumsum(kgvds, axis=0) - kgvds
    nxt = rows + 1
    m_nx = m_r & (o_t < BT - 1) & (nxt < eos)
    g_nx, _bx = _row_decays(g, nxt, m_nx, i_hv, o_k, m_k, HV, K, BK)
    cut = m_nx[:, None] & (g_nx < -150.0)  # the next row starts a segment
    d_g, _c = tl.associative_scan((dB, cut), 0, _segment_sum, reverse=True)
    d_g += tl.where(seg == seg_last[None, :], carry, 0.0)
    d_g = tl.where((b_graw < -150.0) | bad_g[:, None], 0.0, d_g)  # a reset's, and a bad decay's row
    return b_dq, b_dk, d_g


@triton.jit(do_not_specialize=["T", "n_seq", "n_cs_rows"])
def chunk_simple_gla_bwd_grads_kernel(
    q, k, v, g, do, states, dstates, dq, dk, dg, scratch, cu_seqlens, chunk_indices, chunk_offsets,
    T, n_seq, scale, n_cs_rows, step,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_G: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DT: tl.constexpr, PER_KEY: tl.constexpr = False, HEADS: tl.constexpr = 1, PART: tl.constexpr = 0,
    SIDE: tl.constexpr = 0, V_FROM_X: tl.constexpr = False,
):
    """Grid (chunks x H x SPLIT,), SPLIT = HV / H / HEADS: one program per (chunk, query/key head,
    HEADS of its value heads). dq and dk ``[rows, H, SPLIT, K]`` are that program's share of the
    group's sum (SPLIT = 1: the sum itself); dg is per value head.

    HEADS = 1: one value head. The sums over V accumulated a block of BV columns at a time
    (dO S^T and V dS'^T [BT, K], dO V^T [BT, BT]), then dq, dk and dg. (dscores o G)^T, the left
    operand of dk's intra-chunk product, is read back transposed through a per-program scratch
    [BT, BT] (no product result is transposed). PER_KEY (g ``[B, T, HV, K]``, a decay per key
    dimension): :func:`_per_key_grads` from the same sums (and V dO^T, the transpose accumulated as
    a product of its own); dg ``[B, T, HV, K]``.

    HEADS > 1 or PART > 0 (a scalar decay, V <= BV: every value column in one tile):
    :func:`_group_grads`, the heads' sums in the program, so that no per-head dq or dk crosses
    memory; PART 1 forms dq and dk alone, PART 2 dg alone (two launches), PART 0 both. In PART 1,
    SIDE 1 forms dq alone and SIDE 2 dk alone (one accumulator a program), SIDE 0 both.
    V_FROM_X (there; Mamba2 SSD): ``v`` holds x and ``step`` dt ``[rows, HV]`` (float32), and
    v = dt x enters as dt's row factors (of V dS'^T's left operand) and column factors (of dO
    V^T), so that v itself is never formed."""
    tl.static_assert(HEADS > 1 or PART > 0 or not V_FROM_X, "V_FROM_X: the group form (HEADS > 1 or PART > 0)")
    SPLIT: tl.constexpr = HV // H // HEADS
    pid = tl.program_id(0).to(tl.int64)
    i_c = pid // (H * SPLIT)
    i_h = (pid // SPLIT) % H
    i_hv = i_h * (HV // H) + (pid % SPLIT) * HEADS  # the program's first value head
    valid, bos, eos, r0, cs = _chunk_rows(cu_seqlens, chunk_indices, chunk_offsets, i_c, T, n_seq, BT, IS_VARLEN, 1)
    if not valid:
        return
    o_t, o_k, m_k, rows, m_r, m_rk = _chunk_tiles(r0, eos, BT, BK, K)
    causal = o_t[:, None] >= o_t[None, :]
    strict = o_t[:, None] > o_t[None, :]
    cs_ok = (cs >= 0) & (cs < n_cs_rows)
    p_out = ((rows * H + i_h) * SPLIT + pid % SPLIT)[:, None] * K + o_k[None, :]
    if HEADS > 1 or PART > 0:
        b_dq, b_dk = _group_grads(q, k, v, g, do, states, dstates, dg, scratch + pid * BT * BT, rows, m_r, m_rk, o_t,
                                  o_k, m_k, cs, cs_ok, i_h, i_hv, scale, H, HV, K, V, BT, BK, BV, HEADS, HAS_G,
                                  DOT_PRECISION, DT, PART, SIDE, step, V_FROM_X)
        if PART != 2 and SIDE != 2:
            tl.store(dq + p_out, b_dq, mask=m_rk)
        if PART != 2 and SIDE != 1:
            tl.store(dk + p_out, b_dk, mask=m_rk)
        return
    p_s = states + (cs * HV + i_hv) * K * V
    p_ds = dstates + (cs * HV + i_hv) * K * V
    b_q = tl.load(q + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
    b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
    b_dOS = tl.zeros([BT, BK], dtype=tl.float32)  # dO S^T
    b_VdS = tl.zeros([BT, BK], dtype=tl.float32)  # V dS'^T
    b_dOV = tl.zeros([BT, BT], dtype=tl.float32)  # dO V^T
    b_VdO = tl.zeros([BT, BT], dtype=tl.float32)  # V dO^T (PER_KEY)
    sds = tl.zeros([BK], dtype=tl.float32)  # S . dS', by key row
    for i_v in range(0, (V + BV - 1) // BV):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_rv = m_r[:, None] & m_v[None, :]
        m_kv = m_k[:, None] & m_v[None, :] & cs_ok
        p_rv = (rows * HV + i_hv)[:, None] * V + o_v[None, :]
        # A pipelined load that is a product's shared-memory operand (the transposed ones here) has
        # that one use; every other use loads again, with another cache modifier so that no pass
        # merges the two: a load with both uses raced on the H200 with Triton 3.6 (the delta
        # rule's dk kernel, docs/kernels-delta-backward.md).
        b_v = tl.load(v + p_rv, mask=m_rv, other=0.0).to(DT)
        b_do = tl.load(do + p_rv, mask=m_rv, other=0.0).to(DT)
        o_kv = o_k[:, None] * V + o_v[None, :]
        b_S = tl.load(p_s + o_kv, mask=m_kv, other=0.0).to(DT)
        b_dS = tl.load(p_ds + o_kv, mask=m_kv, other=0.0).to(DT)
        b_vt = tl.trans(tl.load(v + p_rv, mask=m_rv, other=0.0, cache_modifier=".cg").to(DT))
        b_dOS = tl.dot(b_do, tl.trans(b_S), b_dOS, input_precision=DOT_PRECISION)
        b_VdS = tl.dot(b_v, tl.trans(b_dS), b_VdS, input_precision=DOT_PRECISION)
        b_dOV = tl.dot(b_do, b_vt, b_dOV, input_precision=DOT_PRECISION)
        if PER_KEY:
            b_dot = tl.trans(tl.load(do + p_rv, mask=m_rv, other=0.0, cache_modifier=".cg").to(DT))
            b_VdO = tl.dot(b_v, b_dot, b_VdO, input_precision=DOT_PRECISION)
        sds += tl.sum(tl.load(p_s + o_kv, mask=m_kv, other=0.0, cache_modifier=".cg").to(tl.float32) *
                      tl.load(p_ds + o_kv, mask=m_kv, other=0.0, cache_modifier=".cg").to(tl.float32), axis=1)

    if PER_KEY:
        b_dq, b_dk, d_g = _per_key_grads(q, k, g, b_q, b_k, b_dOS, b_VdS, b_dOV, b_VdO, sds, r0, eos, rows, m_r, i_h,
                                         i_hv, o_t, o_k, m_k, scale, H, HV, K, BT, BK, DT, DOT_PRECISION)
        tl.store(dq + p_out, b_dq, mask=m_rk)
        tl.store(dk + p_out, b_dk, mask=m_rk)
        tl.store(dg + p_out, d_g, mask=m_rk)
        return
    gc, seg, bad = _chunk_gates(g, rows, rows * 0, m_r, i_hv, HV, 1, BT, HAS_G)
    seg_last = tl.sum(tl.where(o_t == BT - 1, seg, 0), axis=0)
    gc_last = tl.sum(tl.where(o_t == BT - 1, gc, 0.0), axis=0)
    lam = tl.where(seg == 0, tl.exp2(gc), 0.0)
    gam = tl.where(seg == seg_last, tl.exp2(tl.where(seg == seg_last, gc_last - gc, 0.0)), 0.0)
    b_G = tl.where(causal & (seg[:, None] == seg[None, :]), tl.exp2(gc[:, None] - gc[None, :]), 0.0)
    b_kd = b_k.to(DT)
    b_QK = tl.dot(b_q.to(DT), tl.trans(b_kd), input_precision=DOT_PRECISION)
    b_dscores = tl.where(causal, scale * b_dOV, 0.0)
    b_dsG = b_dscores * b_G
    b_dq = tl.dot(b_dsG.to(DT), b_kd, input_precision=DOT_PRECISION) + scale * lam[:, None] * b_dOS
    p_scr = scratch + pid * BT * BT
    tl.store(p_scr + o_t[:, None] * BT + o_t[None, :], b_dsG.to(scratch.dtype.element_ty))
    tl.debug_barrier()
    b_dsGt = tl.load(p_scr + o_t[None, :] * BT + o_t[:, None], cache_modifier=".cg").to(DT)
    b_dk = tl.dot(b_dsGt, b_q.to(DT), input_precision=DOT_PRECISION) + gam[:, None] * b_VdS
    kdsv = tl.sum(b_k * b_VdS, axis=1)  # (K dS') . V by row: gam's gradient
    dlam = scale * tl.sum(b_q * b_dOS, axis=1) + tl.where(o_t == BT - 1, tl.sum(sds, axis=0), 0.0)
    b_dG = b_dscores * b_QK + tl.where(o_t[:, None] == BT - 1, kdsv[None, :], 0.0)  # gam = G[last, :]
    d_g = _scalar_dg(tl.where(causal, b_dG * b_G, 0.0), dlam, lam, strict)
    tl.store(dq + p_out, b_dq, mask=m_rk)
    tl.store(dk + p_out, b_dk, mask=m_rk)
    if HAS_G:
        tl.store(dg + rows * HV + i_hv, d_g, mask=m_r)


@triton.jit
def _scalar_dg(b_dSeg, dlam, lam, strict):
    """A scalar decay's dg [BT] for one value head of a chunk (reference step 5): from
    dSeg = causal(dG o G), dG = dscores o (Q K^T) with G's last row gam adding (K dS') . V there,
    and dlam = scale q . (dO S^T) by row (the last row adding S . dS', lam_C = lam[last]). The
    decay of row m enters the pairs i >= m > j, so dg_m = sum_{i >= m, j < m} dSeg_ij + sum_{i >= m}
    dlam_i lam_i: the reverse cumulative sum of each row's strictly lower sum less each column's
    strictly lower sum, plus dlam lam (no [BT, BT] cumulative sum)."""
    b_strict = tl.where(strict, b_dSeg, 0.0)
    return tl.cumsum(tl.sum(b_strict, axis=1) - tl.sum(b_strict, axis=0) + dlam * lam, axis=0, reverse=True)


@triton.jit
def _group_grads(q, k, v, g, do, states, dstates, dg, p_scr, rows, m_r, m_rk, o_t, o_k, m_k, cs, cs_ok, i_h, hv0,
                 scale, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                 BK: tl.constexpr, BV: tl.constexpr, HEADS: tl.constexpr, HAS_G: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, DT: tl.constexpr, PART: tl.constexpr, SIDE: tl.constexpr = 0,
                 step=None, V_FROM_X: tl.constexpr = False):
    """(dq, dk) ``[BT, BK]`` summed over value heads hv0 .. hv0 + HEADS - 1 of one query/key head,
    and each head's dg (stored here). The heads' terms that share an operand are summed before the
    product: dq = (sum_h dsG_h) K + sum_h (scale lam_h o dO_h) S_h^T and dk = (sum_h dsG_h)^T Q +
    sum_h (gam_h o V_h) dS'_h^T, each sum over h one accumulator, with dsG_h = causal(scale dO_h
    V_h^T) o G_h. A head's row sums for dg come from products of [BT, V], not from its own dq or
    dk: q . (dO S^T) = dO . (Q S) and k . (V dS'^T) = V . (K dS') by row. Q K^T once for the group.
    PART 1: dq and dk alone (SIDE 1: dq alone, SIDE 2: dk alone); PART 2: dg alone (dq and dk
    returned as zeros); PART 0: both. V_FROM_X: ``v`` is x, and dt (``step``) scales what V
    would: dsG's columns, gam's rows of dk's left operand, V o (K dS')'s row sums."""
    causal = o_t[:, None] >= o_t[None, :]
    strict = o_t[:, None] > o_t[None, :]
    o_v = tl.arange(0, BV)
    m_v = o_v < V
    m_rv = m_r[:, None] & m_v[None, :]
    m_vr = m_v[:, None] & m_r[None, :]
    m_vk = m_v[:, None] & m_k[None, :] & cs_ok
    m_kv = m_k[:, None] & m_v[None, :] & cs_ok
    o_vk = o_k[None, :] * V + o_v[:, None]
    o_kv = o_k[:, None] * V + o_v[None, :]
    p_q = q + (rows * H + i_h)[:, None] * K + o_k[None, :]
    p_k = k + (rows * H + i_h)[:, None] * K + o_k[None, :]
    if PART != 1:
        b_QK = tl.dot(tl.load(p_q, mask=m_rk, other=0.0).to(DT), tl.trans(tl.load(p_k, mask=m_rk, other=0.0).to(DT)),
                      input_precision=DOT_PRECISION)
        b_qt = tl.trans(tl.load(p_q, mask=m_rk, other=0.0, cache_modifier=".cg").to(DT))
        b_kt = tl.trans(tl.load(p_k, mask=m_rk, other=0.0, cache_modifier=".cg").to(DT))
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_M = tl.zeros([BT, BT], dtype=tl.float32)  # sum_h dsG_h
    # The loads no product takes (a head's decays; dO^T and V^T for dg's row sums) go a head ahead
    # by hand: Triton 3.6's pipeliner leaves them synchronous, a global latency each on every head
    # (benchmarks/sm90_loop_loads.py gla-backward).
    b_g_next = _chunk_decays(g, rows, m_r, hv0, HV, BT, HAS_G)
    if V_FROM_X:  # the heads' step sizes (v = dt x by rows), a head ahead as the decays
        b_dt_next = tl.load(step + rows * HV + hv0, mask=m_r, other=0.0)
    if PART != 1:
        p_vr_next = (rows * HV + hv0)[None, :] * V + o_v[:, None]
        b_dot_next = tl.load(do + p_vr_next, mask=m_vr, other=0.0, cache_modifier=".cg")
        b_vt_next = tl.load(v + p_vr_next, mask=m_vr, other=0.0, cache_modifier=".ca")
    for j in range(0, HEADS):
        i_hv = hv0 + j
        gc, seg, bad = _gates_of(b_g_next)
        hv_next = hv0 + tl.minimum(j + 1, HEADS - 1)  # the last head loads itself again
        b_g_next = _chunk_decays(g, rows, m_r, hv_next, HV, BT, HAS_G)
        if V_FROM_X:
            b_dt = b_dt_next
            b_dt_next = tl.load(step + rows * HV + hv_next, mask=m_r, other=0.0)
        if PART != 1:
            b_dot, b_vtr = b_dot_next, b_vt_next  # dO^T and V^T, [BV, BT]
            p_vr_next = (rows * HV + hv_next)[None, :] * V + o_v[:, None]
            b_dot_next = tl.load(do + p_vr_next, mask=m_vr, other=0.0, cache_modifier=".cg")
            b_vt_next = tl.load(v + p_vr_next, mask=m_vr, other=0.0, cache_modifier=".ca")
        seg_last = tl.sum(tl.where(o_t == BT - 1, seg, 0), axis=0)
        gc_last = tl.sum(tl.where(o_t == BT - 1, gc, 0.0), axis=0)
        lam = tl.where(seg == 0, tl.exp2(gc), 0.0)
        gam = tl.where(seg == seg_last, tl.exp2(tl.where(seg == seg_last, gc_last - gc, 0.0)), 0.0)
        p_rv = (rows * HV + i_hv)[:, None] * V + o_v[None, :]
        p_st = states + (cs * HV + i_hv) * K * V + o_vk  # S^T [BV, BK]
        p_dst = dstates + (cs * HV + i_hv) * K * V + o_vk
        p_ds = dstates + (cs * HV + i_hv) * K * V + o_kv  # dS' [BK, BV]
        # A pipelined load that is a product's shared-memory operand has that one use; the other
        # uses load again with another cache modifier (the rule of the per-head form above). q and
        # k are shared-memory operands only (right operands, or left ones as loaded): as register
        # operands each warpgroup would hold them whole.
        b_do = tl.load(do + p_rv, mask=m_rv, other=0.0).to(tl.float32)
        b_vt = tl.trans(tl.load(v + p_rv, mask=m_rv, other=0.0, cache_modifier=".cg").to(DT))
        if V_FROM_X:  # dO V^T = dO X^T o dt along the columns
            b_dsG = tl.where(causal & (seg[:, None] == seg[None, :]),
                             scale * tl.dot(b_do.to(DT), b_vt, input_precision=DOT_PRECISION) *
                             (tl.exp2(gc[:, None] - gc[None, :]) * b_dt[None, :]), 0.0)  # dscores o G
        else:
            b_dsG = tl.where(causal & (seg[:, None] == seg[None, :]),
                             scale * tl.dot(b_do.to(DT), b_vt, input_precision=DOT_PRECISION) *
                             tl.exp2(gc[:, None] - gc[None, :]), 0.0)  # dscores o G
        if PART != 2:
            b_M += b_dsG
            if SIDE != 2:
                b_dq = tl.dot((scale * lam[:, None] * b_do).to(DT), tl.load(p_st, mask=m_vk, other=0.0).to(DT),
                              b_dq, input_precision=DOT_PRECISION)
            if SIDE != 1:
                b_v = tl.load(v + p_rv, mask=m_rv, other=0.0).to(tl.float32)
                gam_v = gam
                if V_FROM_X:  # (gam o V) = (gam dt o X)
                    gam_v = gam * b_dt
                b_dk = tl.dot((gam_v[:, None] * b_v).to(DT), tl.load(p_dst, mask=m_vk, other=0.0).to(DT), b_dk,
                              input_precision=DOT_PRECISION)
        if PART != 1:
            b_SqT = tl.dot(tl.load(p_st, mask=m_vk, other=0.0, cache_modifier=".ca").to(DT), b_qt,
                           input_precision=DOT_PRECISION)  # (Q S)^T
            dlam = scale * tl.sum(b_dot.to(tl.float32) * b_SqT, axis=0)
            b_dSkT = tl.dot(tl.load(p_dst, mask=m_vk, other=0.0, cache_modifier=".ca").to(DT), b_kt,
                            input_precision=DOT_PRECISION)  # (K dS')^T
            kdsv = tl.sum(b_vtr.to(tl.float32) * b_dSkT, axis=0)
            if V_FROM_X:
                kdsv = kdsv * b_dt
            # S . dS' (lam_C's gradient, on dlam's last row) as the trace of S^T dS': a [BV, BV]
            # product, where the elementwise sum would hold two [BK, BV] float32 tiles
            b_SdS = tl.dot(tl.load(p_st, mask=m_vk, other=0.0, cache_modifier=".cg").to(DT),
                           tl.load(p_ds, mask=m_kv, other=0.0, cache_modifier=".cg").to(DT),
                           input_precision=DOT_PRECISION)
            sds = tl.sum(tl.sum(tl.where(o_v[:, None] == o_v[None, :], b_SdS, 0.0), axis=1), axis=0)
            dlam += tl.where(o_t == BT - 1, sds, 0.0)
            # dG o G = (dscores o G) o (Q K^T), G's last row gam
            b_dSeg = b_dsG * b_QK + tl.where(o_t[:, None] == BT - 1, (kdsv * gam)[None, :], 0.0)
            d_g = _scalar_dg(b_dSeg, dlam, lam, strict)
            if HAS_G:
                tl.store(dg + rows * HV + i_hv, d_g, mask=m_r)
    if PART != 2 and SIDE != 2:
        b_dq = tl.dot(b_M.to(DT), tl.load(p_k, mask=m_rk, other=0.0, cache_modifier=".ca").to(DT), b_dq,
                      input_precision=DOT_PRECISION)
    if PART != 2 and SIDE != 1:
        tl.store(p_scr + o_t[:, None] * BT + o_t[None, :], b_M.to(p_scr.dtype.element_ty))
        tl.debug_barrier()
        b_Mt = tl.load(p_scr + o_t[None, :] * BT + o_t[:, None], cache_modifier=".cg").to(DT)
        b_dk = tl.dot(b_Mt, tl.load(p_q, mask=m_rk, other=0.0, cache_modifier=".ca").to(DT), b_dk,
                      input_precision=DOT_PRECISION)
    return b_dq, b_dk
