"""Stages 3 and 4 of the chunked delta rule: the state sweep across chunks with the outputs, one
program per (sequence, value head, block of value columns). See docs/kernels-chunk-delta.md."""
from __future__ import annotations

import triton
import triton.language as tl

from ..gla.group_prep import GROUP_COEF_WIDTH
from .common import _chunk_slot, _compact_queries


@triton.constexpr_function
def _coef_width(gate_scores):
    """Floats a row of ``coef`` holds: the delta prep's 4, or with GATE_SCORES the group prep's 8
    (kernels/gla/group_prep.py)."""
    return GROUP_COEF_WIDTH.value if getattr(gate_scores, "value", gate_scores) else 4


@triton.jit
def _outputs_causal(b_Sd, b_q, b_Wt, b_At, lam_rk, lam_rq, out_rows, k, v, e, m_r, i_h, i_hv, o_t, o_k, o_v, m_k,
                    m_vt, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                    V_PRODUCT: tl.constexpr, DOT_PRECISION: tl.constexpr, DT: tl.constexpr):
    """O^T of a chunk in the replay of a program whose state came out non-finite: in the products
    over the chunk's rows a NaN or inf at row t reaches every earlier row as 0 * inf. Here
    U = wy (V - lam rk o (K S)) is formed from k and v with their non-finite entries (and those of
    K S) selected out, U's non-finite entries are selected out before the next product, and each
    value column's outputs from its first non-finite row of X or U on are NaN, as the token loop's
    are; earlier rows get the clean run's bits (the same products in the same order, adding exact
    zeros). WY False (U = V) selects V's entries out in :func:`_sweep_chunk` itself.
    ``out_rows`` [BT or BT // M]: the chunk row of each output column of O^T."""
    b_k = tl.load(k + (e * H + i_h)[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.0)
    b_k = tl.where(b_k * 0.0 == 0.0, b_k, 0.0).to(DT)  # [BT, BK]
    b_vt = tl.load(v + (e * HV + i_hv)[None, :] * V + o_v[:, None], mask=m_vt, other=0.0)  # [BV, BT]
    b_KSt = lam_rk[None, :] * tl.dot(b_Sd, tl.trans(b_k), input_precision=DOT_PRECISION)
    bad = (b_vt * 0.0 != 0.0) | (b_KSt * 0.0 != 0.0)
    b_vt = tl.where(bad, 0.0, b_vt)
    b_KSt = tl.where(bad, 0.0, b_KSt)
    # The same products, in the same order, as the chunk's own (_sweep_chunk): the same bits.
    if V_PRODUCT:
        b_Ut = tl.dot(b_vt.to(DT), b_Wt, input_precision=DOT_PRECISION)
        b_Ut = tl.dot((-b_KSt).to(DT), b_Wt, b_Ut, input_precision=DOT_PRECISION)
    else:
        b_Ut = tl.dot((b_vt.to(tl.float32) - b_KSt).to(DT), b_Wt, input_precision=DOT_PRECISION)
    bad |= b_Ut * 0.0 != 0.0
    first_bad = tl.min(tl.where(bad, o_t[None, :], BT), axis=1)  # [BV]
    b_Ut = tl.where(o_t[None, :] < first_bad[:, None], b_Ut, 0.0)
    b_ot = lam_rq[None, :] * tl.dot(b_Sd, tl.trans(b_q), input_precision=DOT_PRECISION)
    b_ot += tl.dot(b_Ut.to(DT), b_At, input_precision=DOT_PRECISION)
    return tl.where(out_rows[None, :] < first_bad[:, None], b_ot, float("nan"))


@triton.jit
def _gated_scores(b_st, p_j, p_i, m_r, o_t, SWEEP_SCORES: tl.constexpr = False):
    """aqk^T [BT (j), BT (i)] = G_ij c_j scores_ij (float32) from the scores ``b_st`` [j, i] and
    the coef rows at ``p_j`` [BT, 1] and ``p_i`` [1, BT]: gc (column 4), the segments (5) and the
    column factors (6) of kernels/gla/group_prep.py; G_ij = 2^(gc_i - gc_j) for j <= i in one segment.
    SWEEP_SCORES: ``b_st`` is K Q^T as the sweep formed it, so the column factor is c scale
    (column 7), and the prep marks no bad key: a non-finite score is kept past a segment's start
    too, so that a bad key reaches every output from its row on, across a reset in its chunk, as the
    token loop's 0 x NaN carries it (a bad query's own row is non-finite anyway)."""
    gc_j = tl.load(p_j + 4, mask=m_r[:, None], other=0.0)
    gc_i = tl.load(p_i + 4, mask=m_r[None, :], other=0.0)
    seg_j = tl.load(p_j + 5, mask=m_r[:, None], other=0.0)
    seg_i = tl.load(p_i + 5, mask=m_r[None, :], other=0.0)
    col_j = tl.load(p_j + (7 if SWEEP_SCORES else 6), mask=m_r[:, None], other=0.0)
    same = seg_j == seg_i
    if SWEEP_SCORES:
        same |= b_st * 0.0 != 0.0
    keep = (o_t[:, None] <= o_t[None, :]) & same
    return tl.where(keep, tl.exp2(gc_i - gc_j) * col_j * b_st, 0.0)


@triton.jit
def _start_state(p_state, h0, seg_n, m_s0, m_vk, o_vk, o_s0, s0_n, s0_h, i_n, i_s, n_seg, i_hv, first_phase,
                 HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
                 PASS: tl.constexpr, USE_CACHE: tl.constexpr, HAS_H0: tl.constexpr):
    """S^T [BV, BK] that a sweep program starts from: its segment's fixed-up S_in (PASS 2), the
    state the phase before left (PASS 3 after the first phase), else the cache slot, h0 or zeros
    (masked by ``m_s0``)."""
    if PASS == 2:
        b_St = tl.load(seg_n + ((i_n * n_seg + i_s) * HV + i_hv) * K * V + o_vk, mask=m_vk, other=0.0)
    else:
        if USE_CACHE:
            b_St = tl.load(p_state, mask=m_s0, other=0.0).to(tl.float32)
        elif HAS_H0:
            b_St = tl.load(h0 + i_n * s0_n + i_hv * s0_h + o_s0, mask=m_s0, other=0.0).to(tl.float32)
        else:
            b_St = tl.zeros([BV, BK], dtype=tl.float32)
        if PASS == 3:
            if not first_phase:  # the state the phase before left (seg_n [N, HV, K, V])
                b_St = tl.load(seg_n + (i_n * HV + i_hv) * K * V + o_vk, mask=m_vk, other=0.0)
    return b_St


@triton.jit
def _sweep_chunk(c, b_St, q, k, v, wy, aqk, coef, o, o_desc, o_st, o_sh, chunk_states, u_out, ks_out, D, z, dl,
                 cs0, n_cs_rows, bos, bos_t, L, i_n, i_h, i_hv, i_v, o_t, o_k, o_v, m_k, m_v, m_vk, o_vk, use_v,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
                 BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PASS: tl.constexpr,
                 V_PRODUCT: tl.constexpr, TMA_STORE: tl.constexpr, STORE_CHUNK_STATES: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, DT: tl.constexpr, FULL: tl.constexpr, CAREFUL: tl.constexpr,
                 OUTPUTS: tl.constexpr, STORE_U: tl.constexpr, WY: tl.constexpr, HAS_D: tl.constexpr,
                 D_PER_CHANNEL: tl.constexpr, HAS_Z: tl.constexpr, KEY_DECAY: tl.constexpr,
                 GATE_SCORES: tl.constexpr, CALM_GATES: tl.constexpr, SWEEP_SCORES: tl.constexpr):
    """One expanded chunk c of :func:`chunk_delta_sweep_kernel` (its docstring has the algebra):
    returns the state S^T leaving the chunk, having written the chunk's outputs (PASS != 1) and,
    when it starts a token chunk, the state entering it (STORE_CHUNK_STATES). FULL: all 64 rows
    lie in the sequence, so nothing is masked by row; a full chunk of GDP with M | 64 forms its
    outputs on its query rows alone. CAREFUL: the outputs by :func:`_outputs_causal` (the replay
    of a program whose state came out non-finite); the state the same either way. OUTPUTS False:
    the state alone (the backward's recompute of the chunk states), no query or output touched.
    STORE_U: the chunk's U and lam o (K S) (rows of ``u_out`` and ``ks_out``, laid out as v), which
    the backward's parallel stage takes instead of recomputing them from the state. WY False and
    the SSD epilogue (HAS_D, HAS_Z), KEY_DECAY, GATE_SCORES, CALM_GATES, SWEEP_SCORES: see
    :func:`chunk_delta_sweep_kernel`."""
    r = c * BT + o_t.to(tl.int64)  # [BT] row inside the sequence (expanded stream)
    if FULL:  # every row lies in the sequence: the loads and stores below go unpredicated
        m_r = tl.full([BT], True, tl.int1)
    else:
        m_r = r < L
    e = bos + r  # global expanded row
    tok = bos_t + r // M  # its token
    cp = r % M  # its Householder copy
    m_q = m_r & (cp == M - 1)  # rows that carry a query (and an output)
    # GDP with M | BT, a chunk of whole tokens: the outputs are formed on the chunk's BT // M query
    # rows alone (every M-th row) rather than on all BT rows with the others masked (M = 2, 4: the
    # query rows must still make a product of >= 16 rows).
    COMPACT_Q: tl.constexpr = FULL and (PASS != 1) and OUTPUTS and _compact_queries(M, BT)
    if COMPACT_Q:
        BTQ: tl.constexpr = BT // M
        o_tq = tl.arange(0, BTQ).to(tl.int64)
        tok_q = bos_t + c * BTQ + o_tq  # the chunk's tokens
        e_q = bos + c * BT + o_tq * M + (M - 1)  # their query rows on the expanded stream

    if STORE_CHUNK_STATES == 2:  # every expanded chunk's (the GDP backward's recompute)
        cs_row = cs0 + c
        p_cs = chunk_states + (cs_row * HV + i_hv) * K * V + o_vk
        tl.store(p_cs, b_St, mask=m_vk & (cs_row >= 0) & (cs_row < n_cs_rows))
    elif STORE_CHUNK_STATES:
        if c % M == 0:  # expanded chunk c*M starts token chunk c
            cs_row = cs0 + c // M
            p_cs = chunk_states + (cs_row * HV + i_hv) * K * V + o_vk
            tl.store(p_cs, b_St, mask=m_vk & (cs_row >= 0) & (cs_row < n_cs_rows))

    # Loads: raw tiles straight into the products (none depends on the state).
    b_k = tl.load(k + (e * H + i_h)[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :],
                  other=0.0).to(DT)  # [BT, BK]
    if PASS == 1:  # no outputs; the transition's programs read no values
        m_vt = m_r[None, :] & m_v[:, None] & use_v
    else:
        m_vt = m_r[None, :] & m_v[:, None]
        if COMPACT_Q:  # the chunk's BT // M tokens, one query each
            b_q = tl.load(q + (tok_q * H + i_h)[:, None] * K + o_k[None, :], mask=m_k[None, :],
                          other=0.0).to(DT)  # [BTQ, BK]
        elif OUTPUTS:
            b_q = tl.load(q + (tok * H + i_h)[:, None] * K + o_k[None, :], mask=m_q[:, None] & m_k[None, :],
                          other=0.0).to(DT)  # [BT, BK]
    b_vt = tl.load(v + (e * HV + i_hv)[None, :] * V + o_v[:, None], mask=m_vt, other=0.0)  # [BV, BT] = V^T
    # wy^T and aqk^T: [BT (j), BT (i)] = wy[i, j]
    if WY:
        b_Wt = tl.load(wy + (e * HV + i_hv)[None, :] * BT + o_t[:, None], mask=m_r[None, :], other=0.0).to(DT)
    else:  # _outputs_causal takes the name; unread
        b_Wt = b_vt
    if COMPACT_Q:  # aqk^T on the query rows only: [BT (j), BTQ (i)]
        b_At = tl.load(aqk + (e_q * HV + i_hv)[None, :] * BT + o_t[:, None]).to(DT)
    elif (PASS != 1) and OUTPUTS and (not GATE_SCORES):
        b_At = tl.load(aqk + (e * HV + i_hv)[None, :] * BT + o_t[:, None], mask=m_r[None, :], other=0.0).to(DT)
    # Stage 1, precomputed by the prep kernel: the rows' decays times their norm factors. One
    # [BT, 4] tile (with GATE_SCORES [BT, 8]): one pipelined buffer (four vectors took four, each
    # 1 KB aligned; loaded as separate vectors, each element became its own 4-byte copy: 190 more
    # instructions per chunk, sm_90 SASS).
    CW: tl.constexpr = _coef_width(GATE_SCORES)
    o_4 = tl.arange(0, CW)
    p_coef = coef + (_chunk_slot(bos, c, i_n, BT) * HV + i_hv) * BT * CW  # the chunk's [BT, CW] tile
    b_coef = tl.load(p_coef + o_t[:, None] * CW + o_4[None, :], mask=m_r[:, None], other=0.0)
    lam_rk = tl.sum(tl.where(o_4[None, :] == 0, b_coef, 0.0), axis=1)
    gam_rk = tl.sum(tl.where(o_4[None, :] == 2, b_coef, 0.0), axis=1)
    # FACTORED: a calm chunk's gates factored into the outputs' products (below).
    FACTORED: tl.constexpr = GATE_SCORES and CALM_GATES and (PASS != 1) and OUTPUTS
    if GATE_SCORES and (PASS != 1) and OUTPUTS:
        # aqk^T [BT (j), BT (i)] = G_ij c_j scores_ij, from the query/key head's scores and this
        # value head's prefix sums (gc), segments and column factors (kernels/gla/group_prep.py).
        # Loaded as [BT, 1] (by j) and [1, BT] (by i) tiles, which broadcast in the tile's layout.
        p_j = p_coef + o_t[:, None] * CW
        p_i = p_coef + o_t[None, :] * CW
        if SWEEP_SCORES:  # K Q^T [j, i] from the chunk's tiles (rows past the end are zeros)
            b_st = tl.dot(b_k, tl.trans(b_q), input_precision=DOT_PRECISION)
        else:
            b_st = tl.load(aqk + (e * H + i_h)[None, :] * BT + o_t[:, None], mask=m_r[None, :], other=0.0)
        if FACTORED:
            f_0 = tl.load(p_coef)
            calm = f_0 == f_0  # column 0 is NaN in every row of a chunk that is not calm
        else:
            b_At = _gated_scores(b_st, p_j, p_i, m_r, o_t, SWEEP_SCORES).to(DT)
    # The decay across the chunk, as a scalar load of the chunk's first row (always a row of the
    # sequence): taken from the tile it was a block-wide max (shuffles, three barriers per chunk).
    lam_last = tl.load(p_coef + 3)

    # Stage 3: the chunk's writes, transposed: U^T = (V - lam o K S)^T wy^T.
    b_Sd = b_St.to(DT)
    if not WY:  # gated linear attention: U = V
        b_Ut = b_vt.to(tl.float32)
        b_Uo = b_Ut  # the outputs' U
        if CAREFUL and (PASS != 1) and OUTPUTS:
            # V's non-finite entries selected out of the outputs' products, and each value
            # column's outputs NaN from its first non-finite row on (below), as the token loop's:
            # earlier rows get the clean run's bits (the same products, adding exact zeros).
            first_bad = tl.min(tl.where(b_Ut * 0.0 != 0.0, o_t[None, :], BT), axis=1)  # [BV]
            b_Uo = tl.where(o_t[None, :] < first_bad[:, None], b_Ut, 0.0)
    elif V_PRODUCT:
        # U^T = V^T wy^T - (lam o K S)^T wy^T: as a product operand V^T is pipelined through
        # shared memory like the other tiles (in registers it waits on its load every chunk), at
        # 16 KB more shared memory (two stages) and one more 64 x 64 product per chunk.
        b_KSt = lam_rk[None, :] * tl.dot(b_Sd, tl.trans(b_k), input_precision=DOT_PRECISION)
        b_Ut = tl.dot(b_vt.to(DT), b_Wt, input_precision=DOT_PRECISION)  # [BV, BT]
        b_Ut = tl.dot((-b_KSt).to(DT), b_Wt, b_Ut, input_precision=DOT_PRECISION)
    else:
        b_KSt = lam_rk[None, :] * tl.dot(b_Sd, tl.trans(b_k), input_precision=DOT_PRECISION)
        b_Ut = tl.dot((b_vt.to(tl.float32) - b_KSt).to(DT), b_Wt, input_precision=DOT_PRECISION)

    if STORE_U and (PASS != 1):  # pass 1's programs sweep from stand-in states
        p_u = (e * HV + i_hv)[None, :] * V + o_v[:, None]
        tl.store(u_out + p_u, b_Ut.to(u_out.dtype.element_ty), mask=m_vt)
        tl.store(ks_out + p_u, b_KSt.to(ks_out.dtype.element_ty), mask=m_vt)

    # Stage 4: outputs O^T = (S^T Q^T) o lam + U^T aqk^T, written on the token stream.
    if COMPACT_Q:
        lam_rq = tl.load(p_coef + (o_tq * M + (M - 1)) * 4 + 1)
        b_ot = lam_rq[None, :] * tl.dot(b_Sd, tl.trans(b_q), input_precision=DOT_PRECISION)
        b_ot += tl.dot(b_Ut.to(DT), b_At, input_precision=DOT_PRECISION)  # [BV, BTQ]
        if CAREFUL:
            b_ot = _outputs_causal(b_Sd, b_q, b_Wt, b_At, lam_rk, lam_rq, o_tq * M + (M - 1), k, v, e, m_r, i_h,
                                   i_hv, o_t, o_k, o_v, m_k, m_vt, H, HV, K, V, BT, V_PRODUCT, DOT_PRECISION, DT)
        tl.store(o + tok_q[None, :] * o_st + i_hv * o_sh + o_v[:, None], b_ot.to(o.dtype.element_ty),
                 mask=m_v[:, None])
    elif (PASS != 1) and OUTPUTS:
        lam_rq = tl.sum(tl.where((o_4[None, :] == 1) & m_q[:, None], b_coef, 0.0), axis=1)
        if FACTORED:
            # A calm chunk (one segment, bounded decays): G_ij c_j = lam_i c_j / lam_j, so with
            # f_j = c_j / (lam_j scale) (column 0, read as lam_rk) the outputs are
            # lam rq o (Q S + (U o f) scores^T): the scores as loaded, one accumulator, no
            # [BT, BT] tile of exp2 or segment compare (the scores are causal).
            if calm:
                b_ot = tl.dot(b_Sd, tl.trans(b_q), input_precision=DOT_PRECISION)
                b_ot = tl.dot((b_Uo * lam_rk[None, :]).to(DT), b_st.to(DT), b_ot, input_precision=DOT_PRECISION)
                b_ot = lam_rq[None, :] * b_ot
            else:
                b_ot = lam_rq[None, :] * tl.dot(b_Sd, tl.trans(b_q), input_precision=DOT_PRECISION)
                b_At = _gated_scores(b_st, p_j, p_i, m_r, o_t, SWEEP_SCORES).to(DT)
                b_ot += tl.dot(b_Uo.to(DT), b_At, input_precision=DOT_PRECISION)
        elif WY:
            b_ot = lam_rq[None, :] * tl.dot(b_Sd, tl.trans(b_q), input_precision=DOT_PRECISION)
            b_ot += tl.dot(b_Ut.to(DT), b_At, input_precision=DOT_PRECISION)
        else:
            b_ot = lam_rq[None, :] * tl.dot(b_Sd, tl.trans(b_q), input_precision=DOT_PRECISION)
            b_ot += tl.dot(b_Uo.to(DT), b_At, input_precision=DOT_PRECISION)
        if CAREFUL:
            if WY:
                b_ot = _outputs_causal(b_Sd, b_q, b_Wt, b_At, lam_rk, lam_rq, o_t, k, v, e, m_r, i_h, i_hv, o_t, o_k,
                                       o_v, m_k, m_vt, H, HV, K, V, BT, V_PRODUCT, DOT_PRECISION, DT)
            else:
                b_ot = tl.where(o_t[None, :] < first_bad[:, None], b_ot, float("nan"))
        if HAS_D:  # Mamba2's skip D x (v holds x), then its gate silu(z)
            if D_PER_CHANNEL:
                b_ot += tl.load(D + i_hv * V + o_v, mask=m_v, other=0.0).to(tl.float32)[:, None] * b_vt
            else:
                b_ot += tl.load(D + i_hv).to(tl.float32) * b_vt
        if HAS_Z:
            b_zt = tl.load(z + (tok * HV + i_hv)[None, :] * V + o_v[:, None], mask=m_vt, other=0.0).to(tl.float32)
            b_ot = b_ot * (b_zt * tl.sigmoid(b_zt))
        if TMA_STORE:
            o_desc.store([tl.cast(c * BT, tl.int32), tl.cast(i_v * BV, tl.int32)],
                         tl.trans(b_ot.to(o.dtype.element_ty)))
        else:
            p_o = o + tok[None, :] * o_st + i_hv * o_sh + o_v[:, None]
            tl.store(p_o, b_ot.to(o.dtype.element_ty), mask=m_q[None, :] & m_v[:, None])

    # Stage 3 (end): the state leaving the chunk, S^T <- lam_last S^T + (U^T o gam) K.
    if KEY_DECAY:  # k holds the keys decayed to the chunk end; the state decays per key
        b_dl = tl.load(dl + (_chunk_slot(bos, c, i_n, BT) * HV + i_hv) * K + o_k, mask=m_k, other=0.0)
        b_St = b_St * b_dl[None, :] + tl.dot(b_Ut.to(DT), b_k, input_precision=DOT_PRECISION)
    else:
        b_St = b_St * lam_last + tl.dot((b_Ut * gam_rk[None, :]).to(DT), b_k, input_precision=DOT_PRECISION)
    return b_St


# n_seg and seg_chunks are not specialised (divisibility by 16, == 1): one compiled kernel per
# pass serves every segment count.
@triton.jit(do_not_specialize=["n_seg", "seg_chunks", "tc_first", "tc_count", "trigger_dependents", "n_slots",
                               "n_cs_rows"])
def chunk_delta_sweep_kernel(
    q, k, v, wy, aqk, coef, o,
    h0, ht, state, state_indices, chunk_states, cu_seqlens, chunk_offsets, sequence_order,
    seg_n, seg_m, n_seg, seg_chunks, tc_first, tc_count, trigger_dependents, T,
    s0_n, s0_h, s0_k, s0_v, n_slots, n_cs_rows, replay_flags, u_out, ks_out, checkpoints, n_ckpt, D, z, dl,
    o_st, o_sh, ht_n, ht_h, ready_flags,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_H0: tl.constexpr,
    STORE_FINAL: tl.constexpr, USE_CACHE: tl.constexpr, STORE_CHUNK_STATES: tl.constexpr,
    DOT_PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, DT: tl.constexpr, PASS: tl.constexpr = 0,
    V_PRODUCT: tl.constexpr = True, TMA_STORE: tl.constexpr = False, PDL: tl.constexpr = False,
    REPLAY: tl.constexpr = False, OUTPUTS: tl.constexpr = True, STORE_U: tl.constexpr = False,
    CKPT_CHUNKS: tl.constexpr = 0, WY: tl.constexpr = True, HAS_D: tl.constexpr = False,
    D_PER_CHANNEL: tl.constexpr = False, HAS_Z: tl.constexpr = False, KEY_DECAY: tl.constexpr = False,
    GATE_SCORES: tl.constexpr = False, CALM_GATES: tl.constexpr = False, SWEEP_SCORES: tl.constexpr = False,
):
    """Grid (N * HV * ceil(V / BV),): program -> (sequence n, value head hv, value block iv),
    iv fastest so neighbouring programs share the q/k rows in L2.

    Per chunk (q, k raw; rk, rq their norm factors, rq with the scale; lam, gam, lam_last the
    decays from the chunk start to each row, from each row to the chunk end, and across it; the
    products lam rk, lam rq, gam rk and lam_last come from the prep kernel's ``coef``)::

        X = V - (lam rk) o (K S);   U = wy X;   O = (lam rq) o (Q S) + aqk U
        S <- lam_last S + K^T ((gam rk) o U)

    computed transposed (S^T, X^T, U^T, O^T) so that the chained values are left operands.

    TMA_STORE (M = 1 only; the plan checks): the output tile goes out as one bulk tensor store
    through a descriptor made per program over its sequence's rows, which clips the rows past the
    sequence's end, instead of a masked store (which moves the tile to a coalesced layout through
    shared memory in four pieces, two barriers each). The descriptor needs 128 B of global scratch
    per program (runtime/launcher.py passes it).

    The chunk body is :func:`_sweep_chunk`: unmasked over the chunks whose 64 rows lie in the
    sequence (the pipelined loop), masked once for a partial last chunk; a full chunk of GDP with
    M | 64 forms its outputs on its query rows alone.

    Varlen: program block n (in launch order) sweeps sequence ``sequence_order[n]``, the longest
    sequences first (ranked by the prep kernel's first programs, :func:`_rank_sequences`): each
    program walks its sequence's chunks one after another, so a long sequence launched last would
    end the kernel alone.

    The initial state is ``state[state_indices[n]]`` (USE_CACHE; slot -1: zero output, nothing
    read or written), else ``h0[n]`` (HAS_H0), else zeros. Both are read and the cache written
    through their strides ``s0_n, s0_h, s0_k, s0_v`` (a slot-strided pool, a transposed
    ``[S, HV, V, K]`` cache). Descriptors are bounded: a slot outside ``[0, n_slots)`` is treated
    as padding, sequence bounds are clamped to ``[0, T]``, and a chunk-state row at or past
    ``n_cs_rows`` is not written, so no descriptor, however wrong, reaches outside a tensor. The
    final state goes back to the cache slot, or to ``ht[n]`` (STORE_FINAL). With
    STORE_CHUNK_STATES, row ``chunk_offsets[n] + c`` of ``chunk_states`` receives the state entering
    token chunk c (dense: ``n * ceil(T/BT) + c``); STORE_CHUNK_STATES = 2, the state entering every
    chunk c of the expanded stream, row ``chunk_offsets[n] + c`` (dense: ``n * ceil(T M / BT) + c``),
    which the GDP backward reads.

    Non-finite input (NaN or inf in q, k, v, beta or a decay; growth past float32's range): the
    prep selects bad rows out of its products and poisons the outputs from them on and the state;
    a program whose state comes out non-finite raises ``replay_flags[pid]`` and leaves its cache
    slot, and the REPLAY launch of this kernel (the same grid, after this one) runs those
    programs again with each chunk's outputs formed causally (:func:`_outputs_causal`), writing
    the outputs and the slot. Outputs before a bad token keep the clean run's bits.

    Segments (``PASS`` 1 and 2; the wrapper launches them, with :func:`chunk_delta_fixup_kernel`
    between): each sequence's token chunks are cut into ``n_seg`` segments of ``seg_chunks`` token
    chunks (so of ``seg_chunks * M`` expanded chunks: no token and no chunk state straddles two
    segments); varlen: of ``ceil(chunks / n_seg)`` of the sequence's own chunks, the last ones
    empty for a sequence of fewer than ``n_seg`` chunks (an empty segment maps the state to itself). Per value head a segment maps the state affinely,
    ``S_out = M_i S_in + N_i``, with the same ``M_i [K, K]`` for every value column.
    ``seg_n [N, n_seg, HV, K, V]`` and ``seg_m [N, n_seg, HV, K, K]`` are float32 scratch.

    - PASS 1, grid ``(N * (n_seg - 1) * HV * (NV + NK),)``, NK = ceil(K / BV); program ->
      (n, segment i < n_seg - 1, hv, column block j): for j < NV the sweep of segment i's chunks,
      no outputs, from the sequence's initial state (i = 0; it also copies that state to row 0 of
      ``seg_n``, so that pass 2 never reads the cache that its last segment writes) or from zero
      (i > 0), ending in row i + 1 of ``seg_n`` (``N_i``, or for i = 0 the true ``S_in[1]``); for
      j >= NV (i > 0 only) the same sweep with the value input switched off from the identity
      state: the "value" columns are then K wide and the end state is ``M_i`` (row i of
      ``seg_m``). With WY False (GLA) M_i is the segment's decay times I: those programs multiply
      the chunks' ``lam_last`` and sweep nothing. Resets need nothing special: a reset zeroes
      ``lam``, so it zeroes M's columns as it zeroes a state's.
    - PASS 2, grid ``(N * n_seg * HV * NV,)``: the sweep of segment i from row i of ``seg_n`` (the
      fixed-up ``S_in[i]``) with its outputs and chunk states; the last segment writes the final
      state (or the cache slot).

    Phases (``PASS`` 3, dense batches): the single pass cut in time, so that the prep of the next
    phase's chunks runs beside this phase's sweep (the wrapper launches prep 0, sweep 0, prep 1,
    sweep 1, ...; each prep after the first as the programmatic dependent of the sweep before it,
    ``trigger_dependents`` != 0 letting it start as soon as every program of this sweep has; PDL, a
    constexpr, compiles the trigger in). Grid as
    PASS 0; the phase covers token chunks ``[tc_first, tc_first + tc_count)`` of every sequence,
    from the sequence's initial state (first phase) or from its state in ``seg_n [N, HV, K, V]``,
    to the final state or cache slot (last phase) or back into ``seg_n``. The chunks and their
    order are the single pass's, so the results are its bits.

    OUTPUTS False (the backward's recompute): the chunk states and final state alone; no query,
    ``aqk`` or output is read or written, and no replay flag is raised. STORE_U (with it): each
    chunk's U and lam o (K S) into ``u_out`` and ``ks_out`` (v's layout), for the backward.

    CKPT_CHUNKS > 0 (a forward under autograd, dense batches; PASS 0, 2 or 3): the float32 state
    entering token chunk j, for every j a multiple of CKPT_CHUNKS, goes to row ``j // CKPT_CHUNKS``
    of ``checkpoints [N, n_ckpt, HV, K, V]``, the ``seg_n`` of a PASS 2 launch with ``seg_chunks =
    CKPT_CHUNKS``: the backward recomputes the chunk states as that launch, every segment at once.

    WY False (gated linear attention and Mamba2 SSD on this sweep, docs/kernels-gla-plan.md; the
    prep with WY False writes aqk and coef): U = V, so per chunk O = (lam rq) o (Q S) + aqk V and
    S <- lam_last S + K^T ((gam rk) o V); no ``wy`` is read and K S is not formed. With HAS_D /
    HAS_Z (SSD, ``v`` holding x): the outputs become (O + D x) silu(z), D ``[HV]`` or
    ``[HV, V]`` (D_PER_CHANNEL), z laid out as v.

    ``ready_flags``: the chained schedule's per-chunk flags (launch/delta.py), which only the
    warp-specialised Gluon form waits on (CHAINED); unread here, as this kernel runs after the whole
    prep wherever the schedule is chained.

    Outputs are written through strides: ``o`` at ``tok * o_st + hv * o_sh + v`` (``o_st = HV V``,
    ``o_sh = V`` for a ``[B, T, HV, V]`` tensor; the traced scan's packed result is head-major,
    ops/scan.py), the final state at ``n * ht_n + hv * ht_h + k V + v``.

    KEY_DECAY (with WY False; fla's chunk_gla, a decay per key dimension, whose prep is
    kernels/gla/prep.py with FOR_SWEEP): ``q`` and ``k`` are the prep's decayed queries and keys
    ``[B, T, HV, K]`` (H = HV; the queries carry the scale and the decay from the chunk start,
    the keys the decay to the chunk end), the coefficients hold lam rq = 1 (NaN from a bad row
    on), and ``dl [slots, HV, K]`` float32 the chunk's decay per key at its coef slot (NaN after
    a bad row): per chunk O = (lam rq) o (Q S) + aqk V and S <- diag(dl) S + K^T V.

    GATE_SCORES (with WY False, M = 1; a scalar decay whose query/key heads serve many value
    heads, SSD's groups): the prep is kernels/gla/group_prep.py's, ``aqk`` holds the scores
    ``[rows, H, BT]`` float32 (scale Q K^T, once per query/key head) and ``coef`` rows of 8
    floats; each chunk forms its value head's aqk^T from them in registers (G o c^T o scores:
    a [BT, BT] tile of exp2) rather than loading it. CALM_GATES (with GATE_SCORES; the group prep
    with CALM_GATES): in a chunk the prep found calm, O = (lam rq) o (Q S + scores (U o f)) with
    f = c / (lam scale) the prep's column factors: no tile of exp2. SWEEP_SCORES (with GATE_SCORES,
    without CALM_GATES): ``aqk`` unread; each chunk forms K Q^T from its q and k tiles (one more
    product) and takes the scale with the column factors (the group prep's coef column 7).
    """
    pid = tl.program_id(0).to(tl.int64)
    if REPLAY:  # the replay launch: only the programs the pass before flagged (see the end)
        if PDL:
            tl.extra.cuda.gdc_wait()
        if tl.load(replay_flags + pid) != 1:
            return
    if PDL:
        if trigger_dependents != 0:  # the next phase's prep may start once every program here has
            tl.extra.cuda.gdc_launch_dependents()
    NV: tl.constexpr = (V + BV - 1) // BV
    if PASS == 1:
        NK: tl.constexpr = (K + BV - 1) // BV
        i_j = pid % (NV + NK)
        i_hv = (pid // (NV + NK)) % HV
        i_s = (pid // ((NV + NK) * HV)) % (n_seg - 1)
        i_n = pid // ((NV + NK) * HV * (n_seg - 1))
        role_m = i_j >= NV  # this program computes columns of the transition M_i
        if role_m:
            if i_s == 0:  # segment 0 starts from the true state: no transition needed
                return
        i_v = tl.where(role_m, i_j - NV, i_j)
        W = tl.where(role_m, K, V)  # width (and row stride) of the state this program carries
    elif PASS == 2:
        i_v = pid % NV
        i_hv = (pid // NV) % HV
        i_s = (pid // (NV * HV)) % n_seg
        i_n = pid // (NV * HV * n_seg)
        W = V
    else:
        i_v = pid % NV
        i_hv = (pid // NV) % HV
        i_n = pid // (NV * HV)
        i_s = 0  # one segment
        if IS_VARLEN:  # longest sequences first (ranked by the prep)
            i_n = tl.load(sequence_order + i_n).to(tl.int64)
        W = V
    i_h = i_hv // (HV // H)
    if IS_VARLEN:  # clamped to [0, T]: a wrong cu_seqlens reads and writes no row outside the inputs
        bos_t = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n).to(tl.int64), 0), T)
        eos_t = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n + 1).to(tl.int64), bos_t), T)
    else:
        bos_t = i_n * T
        eos_t = bos_t + T
    L = (eos_t - bos_t) * M  # rows of this sequence on the expanded stream
    bos = bos_t * M
    first_phase = True  # PASS 3 sets both
    last_phase = True
    if PASS == 0:
        tc_lo = 0  # token chunks [tc_lo, tc_hi), expanded chunks [c_lo, c_hi) of this program
        tc_hi = tl.cdiv(eos_t - bos_t, BT)
        c_lo = 0
        c_hi = tl.cdiv(L, BT)
    elif PASS == 3:
        tc_lo = tc_first
        tc_hi = tl.minimum(tc_first + tc_count, tl.cdiv(eos_t - bos_t, BT))
        c_lo = tc_lo * M
        c_hi = tl.minimum(tc_hi * M, tl.cdiv(L, BT))
        first_phase = tc_lo == 0
        last_phase = tc_hi == tl.cdiv(eos_t - bos_t, BT)
    else:
        if IS_VARLEN:  # each sequence in n_seg segments of its own length (some empty if it is short)
            seg_chunks = tl.cdiv(tl.cdiv(eos_t - bos_t, BT), n_seg)
        tc_lo = i_s * seg_chunks
        tc_hi = tl.minimum(tc_lo + seg_chunks, tl.cdiv(eos_t - bos_t, BT))
        c_lo = tc_lo * M
        c_hi = tl.minimum(tc_hi * M, tl.cdiv(L, BT))

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < W
    # The state is held transposed, St = S^T [BV, BK]: every chained value (St, X^T, U^T) is then
    # the left operand of its next product and stays in registers; the tiles read from memory
    # (k, q, wy^T, aqk^T) are the right operands, in shared memory.
    m_vk = m_v[:, None] & m_k[None, :]
    o_vk = o_k[None, :].to(tl.int64) * W + o_v[:, None]  # [BV, BK] offsets of S[k, v] in a [K, W] state
    o_s0 = o_k[None, :].to(tl.int64) * s0_k + o_v[:, None].to(tl.int64) * s0_v  # the same in state / h0

    p_state = state  # the cache slot's tile with USE_CACHE (below); unread otherwise
    if USE_CACHE:
        slot = tl.load(state_indices + i_n).to(tl.int64)
        if (slot < 0) | (slot >= n_slots):  # padding (or no slot of the cache): zero output, no state access
            if PASS != 1:
                for c in range(tc_lo, tc_hi):
                    o_tok = bos_t + c * BT + o_t.to(tl.int64)
                    p_o = o + o_tok[:, None] * o_st + i_hv * o_sh + o_v[None, :]
                    tl.store(p_o, tl.zeros([BT, BV], dtype=o.dtype.element_ty),
                             mask=(o_tok < eos_t)[:, None] & m_v[None, :])
                if not REPLAY:
                    if last_phase:
                        tl.store(replay_flags + pid, 0)
            return
        p_state = state + slot * s0_n + i_hv * s0_h + o_s0
    if PASS == 1:
        m_s0 = m_vk & (i_j < NV) & (i_s == 0)  # only segment 0's state programs read it
    elif PASS == 3:
        m_s0 = m_vk & first_phase  # later phases start from the state the phase before left
    else:
        m_s0 = m_vk
    b_St = _start_state(p_state, h0, seg_n, m_s0, m_vk, o_vk, o_s0, s0_n, s0_h, i_n, i_s, n_seg, i_hv, first_phase,
                        HV, K, V, BV, BK, PASS, USE_CACHE, HAS_H0)
    if PASS == 1:
        if i_s == 0:  # a copy of S_in[0] for pass 2 (role_m programs returned above)
            tl.store(seg_n + (i_n * n_seg * HV + i_hv) * K * V + o_vk, b_St, mask=m_vk)
        b_St = tl.where(role_m, (o_v[:, None] == o_k[None, :]).to(tl.float32), b_St)
        use_v = i_j < NV

    if STORE_CHUNK_STATES:
        if IS_VARLEN:
            cs0 = tl.load(chunk_offsets + i_n).to(tl.int64)
        elif STORE_CHUNK_STATES == 2:
            cs0 = i_n * tl.cdiv(T * M, BT)
        else:
            cs0 = i_n * tl.cdiv(T, BT)

    if TMA_STORE and (PASS != 1) and OUTPUTS:  # the sequence's output rows [L, V] of value head hv; rows past L clipped
        o_desc = tl.make_tensor_descriptor(o + bos_t * o_st + i_hv * o_sh, shape=[(eos_t - bos_t).to(tl.int32), V],
                                           strides=[o_st, 1], block_shape=[BT, BV])
    else:  # _sweep_chunk takes every name; the flags below keep these placeholders unread
        o_desc = o
    if PASS != 1:
        use_v = True
    if not STORE_CHUNK_STATES:
        cs0 = 0
    # Chunks whose 64 rows all lie in the sequence run unmasked (masks were a sixth of the chunk
    # loop's instructions, sm_90 SASS); the sequence's last chunk, when partial, runs masked after.
    c_end = c_hi
    if PASS == 1:
        if not WY:  # a GLA segment's transition is its decay times I: its programs sweep no chunk (below)
            c_end = tl.where(role_m, c_lo, c_hi)
    c_full = tl.minimum(c_end, L // BT)
    STORE_CKPT: tl.constexpr = (CKPT_CHUNKS > 0) and (PASS != 1) and (not REPLAY)
    p_ckpt = checkpoints + (i_n * n_ckpt * HV + i_hv) * K * V + o_vk
    for c in tl.range(c_lo, c_full, num_stages=NUM_STAGES):
        if STORE_CKPT:
            if c % (CKPT_CHUNKS * M) == 0:
                tl.store(p_ckpt + (c // (CKPT_CHUNKS * M)) * HV * K * V, b_St, mask=m_vk)
        b_St = _sweep_chunk(c, b_St, q, k, v, wy, aqk, coef, o, o_desc, o_st, o_sh, chunk_states, u_out, ks_out,
                            D, z, dl, cs0, n_cs_rows, bos, bos_t, L, i_n, i_h, i_hv, i_v, o_t, o_k, o_v, m_k, m_v,
                            m_vk, o_vk, use_v,
                            H, HV, K, V, M, BT, BK, BV, PASS, V_PRODUCT, TMA_STORE, STORE_CHUNK_STATES,
                            DOT_PRECISION, DT, True, REPLAY, OUTPUTS, STORE_U, WY, HAS_D, D_PER_CHANNEL,
                            HAS_Z, KEY_DECAY, GATE_SCORES, CALM_GATES, SWEEP_SCORES)
    c_tail = tl.maximum(c_lo, c_full)
    if c_tail < c_end:
        if STORE_CKPT:
            if c_tail % (CKPT_CHUNKS * M) == 0:
                tl.store(p_ckpt + (c_tail // (CKPT_CHUNKS * M)) * HV * K * V, b_St, mask=m_vk)
        b_St = _sweep_chunk(c_tail, b_St, q, k, v, wy, aqk, coef, o, o_desc, o_st, o_sh, chunk_states, u_out, ks_out,
                            D, z, dl, cs0, n_cs_rows, bos, bos_t, L, i_n, i_h, i_hv, i_v, o_t, o_k, o_v, m_k, m_v,
                            m_vk, o_vk, use_v,
                            H, HV, K, V, M, BT, BK, BV, PASS, V_PRODUCT, TMA_STORE, STORE_CHUNK_STATES,
                            DOT_PRECISION, DT, False, REPLAY, OUTPUTS, STORE_U, WY, HAS_D, D_PER_CHANNEL,
                            HAS_Z, KEY_DECAY, GATE_SCORES, CALM_GATES, SWEEP_SCORES)
    if PASS == 1:
        if not WY:
            if role_m:  # M_i = (the product of the segment's chunk decays) I; NaN after a bad row
                if KEY_DECAY:  # a diagonal, one decay per key
                    decay_k = tl.full([BK], 1.0, tl.float32)
                    for c in range(c_lo, c_hi):
                        decay_k *= tl.load(dl + (_chunk_slot(bos, c, i_n, BT) * HV + i_hv) * K + o_k, mask=m_k,
                                           other=0.0)
                    b_St = b_St * decay_k[None, :]
                else:
                    decay = tl.zeros([], dtype=tl.float32) + 1.0
                    for c in range(c_lo, c_hi):
                        decay *= tl.load(coef + (_chunk_slot(bos, c, i_n, BT) * HV + i_hv) * BT *
                                         _coef_width(GATE_SCORES) + 3)
                    b_St = b_St * decay
    # Causality under non-finite input. A NaN or inf in U reaches every earlier row of its chunk
    # through the products over the chunk's rows (0 * inf), and it always leaves the state
    # non-finite (nothing in the state's path selects it out). So a program whose state comes out
    # finite wrote right outputs; one whose does not raises its flag, and the replay launch
    # (REPLAY, after this one) runs its chunks again from the state it started with, each chunk's
    # outputs formed with the bad entries selected out (_outputs_causal). The cache slot it starts
    # from is left for the replay to write.
    replay = False
    if (PASS != 1) and (not REPLAY) and OUTPUTS:
        if last_phase:
            replay = tl.max(tl.max(tl.where(b_St * 0.0 == 0.0, 0, 1), axis=1), axis=0) != 0
            tl.store(replay_flags + pid, replay.to(tl.int32))
    if PASS == 1:
        if role_m:  # M_i: row i of seg_m ([K, K], row stride W = K)
            tl.store(seg_m + ((i_n * n_seg + i_s) * HV + i_hv) * K * K + o_vk, b_St, mask=m_vk)
        else:  # N_i (S_in[1] for segment 0): row i + 1 of seg_n
            tl.store(seg_n + ((i_n * n_seg + i_s + 1) * HV + i_hv) * K * V + o_vk, b_St, mask=m_vk)
    elif PASS == 2:
        if i_s == n_seg - 1:  # the last segment ends the sequence
            if USE_CACHE:
                tl.store(p_state, b_St.to(state.dtype.element_ty), mask=m_vk & (not replay))
            elif STORE_FINAL:
                tl.store(ht + i_n * ht_n + i_hv * ht_h + o_vk, b_St, mask=m_vk)
    elif PASS == 3:
        if last_phase:
            if USE_CACHE:
                tl.store(p_state, b_St.to(state.dtype.element_ty), mask=m_vk & (not replay))
            elif STORE_FINAL:
                tl.store(ht + i_n * ht_n + i_hv * ht_h + o_vk, b_St, mask=m_vk)
        else:
            tl.store(seg_n + (i_n * HV + i_hv) * K * V + o_vk, b_St, mask=m_vk)
    else:
        if USE_CACHE:
            tl.store(p_state, b_St.to(state.dtype.element_ty), mask=m_vk & (not replay))
        elif STORE_FINAL:
            tl.store(ht + i_n * ht_n + i_hv * ht_h + o_vk, b_St, mask=m_vk)
