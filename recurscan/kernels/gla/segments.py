"""The scalar-decay GLA forward (and Mamba2 SSD on it) parallel over the sequence, in three stages:
the readable form is ``reference.gla_segments.gla_segmented``; the one-kernel form, whose chain walks
every chunk of a sequence, is kernels/gla/forward.py. Per (sequence, value head), the tokens fall in
segments of E blocks of BT = 64 rows; with b_t the sum of the log decays from the segment's start
through t (a reset, decay 0, cuts every product across it):

1. ``gla_segment_states_kernel`` (parallel over segments): the state each segment adds from zero,
   dS = sum_t exp(b_end - b_t) k_t u_t^T, and its decay exp(b_end); one block's product a step.
2. ``gla_segment_pass_kernel`` (parallel over state elements, a chain over segments): S_0 = h0,
   S_{s+1} = exp(b_end) S_s + dS_s, elementwise; S_s replaces dS_s in place, the last is the final
   state.
3. ``gla_segment_output_kernel`` (parallel over blocks): for the rows i of one block of segment s,
   o_i = scale (exp(b_i) S_s^T q_i + sum_{j <= i in s} exp(b_i - b_j) (q_i . k_j) u_j), the
   segment's earlier blocks walked from the block before it back to its first.

u is v (SSD: dt x, with mamba_ssm's step sizes; the output then (o + D x) silu(z)). Non-finite
input as the one-kernel form and the token loop have it: from a non-finite key, decay or value
element on, the outputs (in that value column, for a value) and the states are NaN, across resets
too; a non-finite query enters its own output alone; so outputs before it keep their bits. The
stages find them without a second use of a pipelined product operand (docs/kernels-delta-backward.md):
a key through its column of Q K^T, a value by a check of the tile the product then takes sanitised.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..delta.common import _gates_of
from .common import _ssd_steps

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _block_values(v, dt, A, dt_bias, g, i_b, i_hv, t0, T, o_t, o_v, m_v, HV: tl.constexpr, V: tl.constexpr,
                  dt_min, dt_max, HAS_G: tl.constexpr, SSD: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
                  DT_SOFTPLUS: tl.constexpr, DT_LIMIT: tl.constexpr):
    """One block's rows ``t0 .. t0 + BT`` of sequence i_b, value head i_hv: (u [BT, BV] float32,
    x [BT, BV] (SSD's x; else u), log2 decays [BT] (0 past T), rows in T)."""
    pos = t0 + o_t
    m_r = pos < T
    rows = i_b * T + pos
    b_x = tl.load(v + (rows * HV + i_hv)[:, None] * V + o_v[None, :], mask=m_r[:, None] & m_v[None, :],
                  other=0.0).to(tl.float32)
    if SSD:
        b_dt = _ssd_steps(dt, dt_bias, rows, m_r, i_hv, HV, dt_min, dt_max, HAS_DT_BIAS, DT_SOFTPLUS, DT_LIMIT)
        b_u = b_x * b_dt[:, None]
        b_a = tl.load(A + i_hv).to(tl.float32) * b_dt
        if HAS_G:  # mamba's seq_idx as -inf where a sequence starts
            b_a += tl.load(g + rows, mask=m_r, other=0.0).to(tl.float32)
    else:
        b_u = b_x
        if HAS_G:
            b_a = tl.load(g + rows * HV + i_hv, mask=m_r, other=0.0).to(tl.float32)
        else:
            b_a = tl.zeros([o_t.shape[0]], dtype=tl.float32)
    return b_u, b_x, tl.where(m_r, b_a * LOG2E, 0.0), m_r


@triton.jit
def _last(x, o_t, BT: tl.constexpr):
    return tl.sum(tl.where(o_t == BT - 1, x, 0), axis=0)


@triton.jit(do_not_specialize=["T"])
def gla_segment_states_kernel(
    k, v, g, dt, A, dt_bias, seg_states, seg_decay, T, n_seg, dt_min, dt_max,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, E: tl.constexpr, HAS_G: tl.constexpr, DT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SSD: tl.constexpr = False, HAS_DT_BIAS: tl.constexpr = False, DT_SOFTPLUS: tl.constexpr = False,
    DT_LIMIT: tl.constexpr = False,
):
    """Stage 1. Grid (B * n_seg * HV * ceil(V / BV),). Writes dS ``seg_states [B, n_seg, HV, K, V]``
    (float32, element [k, v]) and, from the first value block, exp(b_end) ``seg_decay [B, n_seg,
    HV]``. Per block: dS <- lam_C dS + K^T (gam o U) (lam_C: the block's decay, gam: each row's to the
    block's end); a non-finite decay, flagged by the gates, makes dS NaN."""
    pid = tl.program_id(0).to(tl.int64)
    NV: tl.constexpr = (V + BV - 1) // BV
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_s = (pid // (NV * HV)) % n_seg
    i_b = pid // (NV * HV * n_seg)
    i_h = i_hv // (HV // H)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    b_S = tl.zeros([BK, BV], dtype=tl.float32)
    decay = tl.full([], 1.0, tl.float32)
    bad_any = tl.full([], 0, tl.int32)
    for c in range(E):
        t0 = (i_s * E + c) * BT
        b_u, b_x, b_lg, m_r = _block_values(v, dt, A, dt_bias, g, i_b, i_hv, t0, T, o_t, o_v, m_v, HV, V, dt_min,
                                            dt_max, HAS_G, SSD, HAS_DT_BIAS, DT_SOFTPLUS, DT_LIMIT)
        rows = i_b * T + t0 + o_t
        b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.0)
        gc, seg, bad = _gates_of(b_lg)
        gc_last = _last(gc, o_t, BT)
        seg_last = _last(seg, o_t, BT)
        gam = tl.where(seg == seg_last, tl.exp2(tl.where(seg == seg_last, gc_last - gc, 0.0)), 0.0)
        lam = tl.where(seg_last == 0, tl.exp2(gc_last), 0.0)
        b_S = lam * b_S + tl.dot(tl.trans(b_k.to(DT)), (b_u * gam[:, None]).to(DT), input_precision=DOT_PRECISION)
        decay = decay * lam
        bad_any = tl.maximum(bad_any, tl.max(bad.to(tl.int32), axis=0))
    b_S = tl.where(bad_any != 0, float("nan"), b_S)
    base = (i_b * n_seg + i_s) * HV + i_hv
    tl.store(seg_states + base * K * V + o_k[:, None] * V + o_v[None, :], b_S, mask=m_k[:, None] & m_v[None, :])
    tl.store(seg_decay + base, decay, mask=i_v == 0)


@triton.jit
def gla_segment_pass_kernel(seg_states, seg_decay, h0, ht, n_seg, s0_n, s0_h, s0_k, s0_v,
                            HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BLOCK: tl.constexpr,
                            HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr):
    """Stage 2. Grid (B * HV * ceil(K V / BLOCK),): BLOCK elements of one (sequence, value head)'s
    state through the segments; the initial state through its strides (mamba's [N, H, P, Nstate]
    needs no copy), the final state to ``ht [B, HV, K, V]``."""
    pid = tl.program_id(0).to(tl.int64)
    NB: tl.constexpr = (K * V + BLOCK - 1) // BLOCK
    i_blk = pid % NB
    i_hv = (pid // NB) % HV
    i_b = pid // (NB * HV)
    o = i_blk * BLOCK + tl.arange(0, BLOCK)
    m = o < K * V
    if HAS_H0:
        b_S = tl.load(h0 + i_b * s0_n + i_hv * s0_h + (o // V) * s0_k + (o % V) * s0_v, mask=m, other=0.0)
        b_S = b_S.to(tl.float32)
    else:
        b_S = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(n_seg):
        base = (i_b * n_seg + s) * HV + i_hv
        b_d = tl.load(seg_decay + base)
        b_X = tl.load(seg_states + base * K * V + o, mask=m, other=0.0)
        tl.store(seg_states + base * K * V + o, b_S, mask=m)
        b_S = b_d * b_S + b_X
    if STORE_FINAL:
        tl.store(ht + (i_b * HV + i_hv) * K * V + o, b_S, mask=m)


@triton.jit
def _scores(b_q, k, rows, m_r, i_h, o_k, m_k, H: tl.constexpr, K: tl.constexpr, DT: tl.constexpr,
            DOT_PRECISION: tl.constexpr, bad_q):
    """(Q K^T [BT, BT] of the query block and the key block at ``rows``, each key row's flag: a
    non-finite entry in its column on a finite query's row, i.e. a non-finite key)."""
    b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.0)
    b_P = tl.dot(b_q, tl.trans(b_k.to(DT)), input_precision=DOT_PRECISION)
    bad_k = tl.max(((b_P * 0.0 != 0.0) & ~bad_q[:, None]).to(tl.int32), axis=0) != 0
    return b_P, bad_k


@triton.jit(do_not_specialize=["T"])
def gla_segment_output_kernel(
    q, k, v, g, o, seg_states, dt, A, dt_bias, D, z, T, n_seg, scale, dt_min, dt_max,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, E: tl.constexpr, HAS_G: tl.constexpr, DT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SSD: tl.constexpr = False, HAS_DT_BIAS: tl.constexpr = False, DT_SOFTPLUS: tl.constexpr = False,
    DT_LIMIT: tl.constexpr = False, HAS_D: tl.constexpr = False, D_PER_CHANNEL: tl.constexpr = False,
    HAS_Z: tl.constexpr = False,
):
    """Stage 3. Grid (B * n_seg * HV * ceil(V / BV) * E,), a segment's E blocks adjacent (they read
    one S_s). The block's own rows first (causal, the gate tile within the block), then the
    segment's earlier blocks from the nearest back, carrying the sum of their log decays (rem)
    and resets (rc); then the state's part, exp(b_i) from rem and the block's own gates."""
    pid = tl.program_id(0).to(tl.int64)
    NV: tl.constexpr = (V + BV - 1) // BV
    i_e = pid % E
    i_v = (pid // E) % NV
    i_hv = (pid // (E * NV)) % HV
    i_s = (pid // (E * NV * HV)) % n_seg
    i_b = pid // (E * NV * HV * n_seg)
    i_h = i_hv // (HV // H)
    i_c = i_s * E + i_e
    if i_c * BT < T:
        o_t = tl.arange(0, BT)
        o_k = tl.arange(0, BK)
        o_v = i_v * BV + tl.arange(0, BV)
        m_k = o_k < K
        m_v = o_v < V
        b_u, b_x, b_lg, m_r = _block_values(v, dt, A, dt_bias, g, i_b, i_hv, i_c * BT, T, o_t, o_v, m_v, HV, V,
                                            dt_min, dt_max, HAS_G, SSD, HAS_DT_BIAS, DT_SOFTPLUS, DT_LIMIT)
        rows = i_b * T + i_c * BT + o_t
        b_q = tl.load(q + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.0)
        bad_q = tl.max((b_q.to(tl.float32) * 0.0 != 0.0).to(tl.int32), axis=1) != 0
        b_q = b_q.to(DT)
        gc, seg, bad_g = _gates_of(b_lg)
        # Within the block: causal, one reset segment; a bad value element is taken as 0, and the
        # outputs from its row on in its column are NaN (first), as from a bad key or decay row.
        b_P, bad_k = _scores(b_q, k, rows, m_r, i_h, o_k, m_k, H, K, DT, DOT_PRECISION, bad_q)
        causal = (o_t[:, None] >= o_t[None, :]) & (seg[:, None] == seg[None, :])
        b_G = tl.where(causal, tl.exp2(tl.where(causal, gc[:, None] - gc[None, :], 0.0)), 0.0)
        b_A = tl.where(causal, b_P * b_G, 0.0)
        bad_u = b_u * 0.0 != 0.0
        first = tl.minimum(tl.min(tl.where(bad_u, o_t[:, None], BT), axis=0),
                           tl.min(tl.where(bad_g | bad_k, o_t, BT), axis=0))  # [BV]
        b_acc = tl.dot(b_A.to(DT), tl.where(bad_u, 0.0, b_u).to(DT), input_precision=DOT_PRECISION)
        # The segment's earlier blocks, nearest first; any non-finite key or decay there poisons
        # every row here (a value does so through the product itself).
        rem = tl.full([], 0.0, tl.float32)
        rc = tl.full([], 0, tl.int32)
        for jj in range(0, i_e):
            j = i_c - 1 - jj
            b_uj, b_xj, b_lgj, m_rj = _block_values(v, dt, A, dt_bias, g, i_b, i_hv, j * BT, T, o_t, o_v, m_v, HV,
                                                    V, dt_min, dt_max, HAS_G, SSD, HAS_DT_BIAS, DT_SOFTPLUS,
                                                    DT_LIMIT)
            gcj, segj, bad_gj = _gates_of(b_lgj)
            rem += _last(gcj, o_t, BT)
            seg_lastj = _last(segj, o_t, BT)
            rc += seg_lastj
            b_Pj, bad_kj = _scores(b_q, k, i_b * T + j * BT + o_t, m_rj, i_h, o_k, m_k, H, K, DT, DOT_PRECISION,
                                   bad_q)
            live = (seg[:, None] == 0) & (rc - seg_lastj == 0) & (segj[None, :] == seg_lastj)
            b_Gj = tl.where(live, tl.exp2(tl.where(live, gc[:, None] + rem - gcj[None, :], 0.0)), 0.0)
            b_acc += tl.dot(tl.where(live, b_Pj * b_Gj, 0.0).to(DT), b_uj.to(DT), input_precision=DOT_PRECISION)
            first = tl.where(tl.max((bad_gj | bad_kj).to(tl.int32), axis=0) != 0, 0, first)
        # The state entering the segment: exp(b_i) S^T q_i, 0 o NaN staying NaN across a reset.
        b_S = tl.load(seg_states + ((i_b * n_seg + i_s) * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0.0)
        lam = tl.where((seg == 0) & (rc == 0), tl.exp2(tl.where((seg == 0) & (rc == 0), gc + rem, 0.0)), 0.0)
        b_acc += lam[:, None] * tl.dot(b_q, b_S.to(DT), input_precision=DOT_PRECISION)
        b_o = scale * b_acc
        b_o = tl.where(o_t[:, None] >= first[None, :], float("nan"), b_o)
        m_rv = m_r[:, None] & m_v[None, :]
        p_rv = (rows * HV + i_hv)[:, None] * V + o_v[None, :]
        if SSD:
            if HAS_D:
                if D_PER_CHANNEL:
                    b_o += tl.load(D + i_hv * V + o_v, mask=m_v, other=0.0).to(tl.float32)[None, :] * b_x
                else:
                    b_o += tl.load(D + i_hv).to(tl.float32) * b_x
            if HAS_Z:
                b_z = tl.load(z + p_rv, mask=m_rv, other=0.0).to(tl.float32)
                b_o = b_o * (b_z * tl.sigmoid(b_z))
        tl.store(o + p_rv, b_o.to(o.dtype.element_ty), mask=m_rv)
