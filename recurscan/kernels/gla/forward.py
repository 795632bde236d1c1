"""The chunked forward of gated linear attention with one decay per head and token, in one kernel
(docs/kernels-gla-plan.md). The algebra is ``reference.gla.gla_chunk``'s, transposed: the program
holds S^T [BV, K], as the delta sweep does (kernels/delta/sweep.py)."""
from __future__ import annotations

import triton
import triton.language as tl

from ..delta.common import _chunk_gates, _gates_of, _sequence
from .common import _ssd_steps


@triton.jit(do_not_specialize=["T"])
def chunk_simple_gla_fwd_kernel(
    q, k, v, g, o, h0, ht, cu_seqlens, dt, A, dt_bias, D, z, chunk_states, chunk_offsets, state_indices, qg, kg,
    aqk, dl,
    T, scale, dt_min, dt_max, s0_n, s0_h, s0_k, s0_v, n_slots, n_cs_rows,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_G: tl.constexpr, HAS_H0: tl.constexpr,
    STORE_FINAL: tl.constexpr, DOT_PRECISION: tl.constexpr, DT: tl.constexpr,
    SSD: tl.constexpr = False, HAS_DT_BIAS: tl.constexpr = False, DT_SOFTPLUS: tl.constexpr = False,
    DT_LIMIT: tl.constexpr = False, HAS_D: tl.constexpr = False, D_PER_CHANNEL: tl.constexpr = False,
    HAS_Z: tl.constexpr = False, STORE_CHUNK_STATES: tl.constexpr = False, USE_CACHE: tl.constexpr = False,
    OUTPUTS: tl.constexpr = True, PER_KEY: tl.constexpr = False,
):
    """Grid (N * HV * ceil(V / BV),): one program per (sequence, value head, value block) walks the
    chunks first to last. Per chunk of BT rows, with G[i, j] = exp(g_{j+1} + ... + g_i) for j <= i
    in the same segment (0 across a reset, g = -inf), lam_i = G[i, start], gam_j = G[end, j]:

        O^T = scale (S^T Q^T) o lam  +  V^T A,      A[j, i] = G[i, j] scale (k_j . q_i)
        S^T <- lam_C S^T + (V^T o gam) K

    A is formed as K Q^T (no transpose of a product result). Non-finite input, as the token loop
    has it: a row whose k or decay is NaN or inf is selected out of every product (its q and k as 0,
    its decay as 1), and so is a non-finite value element; the outputs from that row on (in that
    value column, for a value) and the state leaving the chunk are NaN instead. A non-finite query
    enters no state: its row's output alone is NaN. So the outputs before it, and every other
    sequence, keep the bits they have without it.

    SSD (Mamba2, mamba_ssm's parameterisation): q = C, k = B (the groups as GVA), ``v`` holds x,
    and per token the step size dt <- clamp(softplus?(dt + dt_bias), [dt_min, dt_max]) (each part
    where its flag is set) gives the value dt x and the log decay dt A; the output is
    (o + D x) silu(z) (D per head or per channel). ``g`` is then ``[B * T]`` (HAS_G): a log decay
    added per token, whatever the head (-inf where a sequence of mamba's seq_idx starts).

    PER_KEY (a decay per key dimension, fla's chunk_gla; or any decay, the split launch of
    plan/gla.py): the chunk's gates come from the prep (kernels/gla/prep.py): the decayed queries ``qg`` and keys ``kg`` ``[B, T, HV, K]`` (a NaN row
    marks a non-finite query, resp. key or decay), ``aqk [B, T, HV, BT]`` (A, row i: query i) and
    the chunk's decay ``dl [n_cs_rows, HV, K]`` at its chunk-state row; per chunk then
    O^T = S^T qg^T + V^T A^T and S^T <- S^T o dl + V^T kg (q, k and g are not read).

    STORE_CHUNK_STATES (the backward's recompute): row ``chunk_offsets[n] + c`` (dense:
    ``n * ceil(T / BT) + c``) of ``chunk_states [n_cs_rows, HV, K, V]`` receives the state entering
    chunk c (a row outside it is not written). OUTPUTS=False (the recompute): the states alone; q is
    not read, A and the outputs not formed.

    The initial state is read through its strides ``s0_n, s0_h, s0_k, s0_v`` (element [n, hv, k, v];
    so mamba's [N, H, P, Nstate] states need no copy): ``h0[n]`` (HAS_H0), or with USE_CACHE the
    slot ``state_indices[n]`` of the cache ``h0`` (a slot outside ``[0, n_slots)`` is padding: zero
    outputs, nothing read or written), whose slot then receives the final state (cast to its dtype)."""
    pid = tl.program_id(0).to(tl.int64)
    NV: tl.constexpr = (V + BV - 1) // BV
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_n = pid // (NV * HV)
    i_h = i_hv // (HV // H)
    bos, eos = _sequence(cu_seqlens, i_n, T, IS_VARLEN)  # clamped: a wrong boundary reaches nothing outside
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_vk = m_v[:, None] & m_k[None, :]
    o_vk = o_k[None, :] * V + o_v[:, None]  # S[k, v] of a [K, V] state, as a [BV, BK] tile
    o_s0 = o_k[None, :].to(tl.int64) * s0_k + o_v[:, None].to(tl.int64) * s0_v  # the same through h0's strides
    live = True
    if USE_CACHE:
        slot = tl.load(state_indices + i_n).to(tl.int64)
        live = (slot >= 0) & (slot < n_slots)
        p_h0 = h0 + tl.where(live, slot, 0) * s0_n + i_hv * s0_h + o_s0
        b_St = tl.load(p_h0, mask=m_vk & live, other=0.0).to(tl.float32)
    elif HAS_H0:
        b_St = tl.load(h0 + i_n * s0_n + i_hv * s0_h + o_s0, mask=m_vk, other=0.0).to(tl.float32)
    else:
        b_St = tl.zeros([BV, BK], dtype=tl.float32)
    # A^T's mask: row j (key), column i (query), i >= j.
    upper = o_t[:, None] <= o_t[None, :]
    if STORE_CHUNK_STATES or PER_KEY:
        if IS_VARLEN:
            cs0 = tl.load(chunk_offsets + i_n).to(tl.int64)
        else:
            cs0 = i_n * ((T + BT - 1) // BT)
    for c in range(0, (eos - bos + BT - 1) // BT):
        if STORE_CHUNK_STATES:
            # a padding sequence writes none; no chunk_offsets reaches past the rows
            tl.store(chunk_states + ((cs0 + c) * HV + i_hv) * K * V + o_vk, b_St.to(chunk_states.dtype.element_ty),
                     mask=m_vk & live & (cs0 + c >= 0) & (cs0 + c < n_cs_rows))
        rows = bos + c * BT + o_t.to(tl.int64)
        m_r = rows < eos
        m_rk = m_r[:, None] & m_k[None, :]
        p_vk = (rows * HV + i_hv)[:, None] * K + o_k[None, :]  # [BT, BK] tiles of [rows, HV, K] tensors
        if PER_KEY:
            b_k = tl.load(kg + p_vk, mask=m_rk, other=0.0).to(tl.float32)
        else:
            b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
        p_vr = (rows * HV + i_hv)[None, :] * V + o_v[:, None]  # [BV, BT] tiles of [rows, HV, V] tensors
        m_vr = m_v[:, None] & m_r[None, :]
        b_vt = tl.load(v + p_vr, mask=m_vr, other=0.0).to(tl.float32)  # V^T [BV, BT] (SSD: x^T)
        if SSD:
            b_dt = _ssd_steps(dt, dt_bias, rows, m_r, i_hv, HV, dt_min, dt_max, HAS_DT_BIAS, DT_SOFTPLUS, DT_LIMIT)
            b_xt = b_vt
            b_vt = b_xt * b_dt[None, :]
        if PER_KEY:  # the prep marked non-finite decays in kg
            bad_g = o_t < 0
        elif SSD:
            b_ga = tl.load(A + i_hv).to(tl.float32) * b_dt  # natural-log decay dt A
            if HAS_G:  # seq_idx: -inf where a sequence starts, per token
                b_ga += tl.load(g + rows, mask=m_r, other=0.0).to(tl.float32)
            gc, seg, bad_g = _gates_of(tl.where(m_r, b_ga * 1.4426950408889634, 0.0))
        else:
            gc, seg, bad_g = _chunk_gates(g, rows, rows * 0, m_r, i_hv, HV, 1, BT, HAS_G)
        # Non-finite rows and value elements, selected out; the first one poisons what follows.
        bad = bad_g | (tl.max((b_k * 0.0 != 0.0).to(tl.int32), axis=1) != 0)
        b_k = tl.where(bad[:, None], 0.0, b_k)
        if OUTPUTS:  # a non-finite query enters its own output alone
            if PER_KEY:
                b_q = tl.load(qg + p_vk, mask=m_rk, other=0.0).to(tl.float32)
            else:
                b_q = tl.load(q + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
            bad_q = tl.max((b_q * 0.0 != 0.0).to(tl.int32), axis=1) != 0
            b_q = tl.where((bad | bad_q)[:, None], 0.0, b_q)
        bad_v = b_vt * 0.0 != 0.0
        b_vt = tl.where(bad_v, 0.0, b_vt)
        first = tl.minimum(tl.min(tl.where(bad_v, o_t[None, :], BT), axis=1),
                           tl.min(tl.where(bad, o_t, BT), axis=0))  # [BV]: the first poisoned row
        if not PER_KEY:
            gc_last = tl.sum(tl.where(o_t == BT - 1, gc, 0.0), axis=0)
            seg_last = tl.sum(tl.where(o_t == BT - 1, seg, 0), axis=0)
            gam = tl.where(seg == seg_last, tl.exp2(tl.where(seg == seg_last, gc_last - gc, 0.0)), 0.0)
            lam_last = tl.where(seg_last == 0, tl.exp2(gc_last), 0.0)
        b_kd = b_k.to(DT)
        if OUTPUTS:
            if PER_KEY:
                b_At = tl.load(aqk + (rows * HV + i_hv)[None, :] * BT + o_t[:, None], mask=m_r[None, :], other=0.0)
                b_ot = tl.dot(b_St.to(DT), tl.trans(b_q.to(DT)), input_precision=DOT_PRECISION)
                b_ot += tl.dot(b_vt.to(DT), b_At.to(DT), input_precision=DOT_PRECISION)
            else:
                lam = tl.where(seg == 0, tl.exp2(gc), 0.0)
                # A[j, i] = G[i, j] scale (k_j . q_i): the gate from row j to row i, i >= j, same segment.
                b_Gt = tl.where(upper & (seg[:, None] == seg[None, :]), tl.exp2(gc[None, :] - gc[:, None]), 0.0)
                b_A = b_Gt * scale * tl.dot(b_kd, tl.trans(b_q.to(DT)), input_precision=DOT_PRECISION)
                b_ot = (scale * lam)[None, :] * tl.dot(b_St.to(DT), tl.trans(b_q.to(DT)), input_precision=DOT_PRECISION)
                b_ot += tl.dot(b_vt.to(DT), b_A.to(DT), input_precision=DOT_PRECISION)
            b_ot = tl.where((o_t[None, :] >= first[:, None]) | bad_q[None, :], float("nan"), b_ot)
            if SSD:
                if HAS_D:
                    if D_PER_CHANNEL:
                        b_ot += tl.load(D + i_hv * V + o_v, mask=m_v, other=0.0).to(tl.float32)[:, None] * b_xt
                    else:
                        b_ot += tl.load(D + i_hv).to(tl.float32) * b_xt
                if HAS_Z:
                    b_zt = tl.load(z + p_vr, mask=m_vr, other=0.0).to(tl.float32)
                    b_ot = b_ot * (b_zt * tl.sigmoid(b_zt))
            if USE_CACHE:  # a padding sequence's outputs are zeros
                b_ot = tl.where(live, b_ot, 0.0)
            tl.store(o + p_vr, b_ot.to(o.dtype.element_ty), mask=m_vr)
        if PER_KEY:
            b_dl = tl.load(dl + ((cs0 + c) * HV + i_hv) * K + o_k, mask=m_k & (cs0 + c >= 0) & (cs0 + c < n_cs_rows),
                           other=0.0)
            b_St = b_St * b_dl[None, :] + tl.dot(b_vt.to(DT), b_kd, input_precision=DOT_PRECISION)
        else:
            b_St = lam_last * b_St + tl.dot((b_vt * gam[None, :]).to(DT), b_kd, input_precision=DOT_PRECISION)
        b_St = tl.where((first < tl.minimum(eos - bos - c * BT, BT))[:, None], float("nan"), b_St)
    if USE_CACHE:
        tl.store(p_h0, b_St.to(h0.dtype.element_ty), mask=m_vk & live)
    elif STORE_FINAL:
        tl.store(ht + (i_n * HV + i_hv) * K * V + o_vk, b_St, mask=m_vk)
