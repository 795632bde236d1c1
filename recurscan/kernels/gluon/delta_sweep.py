"""The delta rule's forward sweep in Gluon: the Triton twin is
:func:`recurscan.kernels.delta.sweep.chunk_delta_sweep_kernel` (same arguments, same arithmetic
in the same order, so the same bits), which has the algebra. GPU only (sm_90); the planner takes
it where :func:`recurscan.plan.device.gluon_usable` and ``plan.delta.gluon_forward_sweep`` allow.

What differs from the twin is how a chunk's work is scheduled, per program (one warpgroup, S^T
[BV, K] float32 in registers):

1. The tiles (k, v, wy, and with the outputs q and aqk) arrive by bulk tensor copies into a ring
   of NUM_STAGES shared-memory stages, one mbarrier each, issued NUM_STAGES chunks ahead, through
   descriptors made on the device per program over its own sequence's rows: a partial last chunk
   reads zeros past the sequence's end and its stores stop there (the twin's masks).
2. The products go in three asynchronous groups, each waited on once: {K S, V^T wy^T} (the chain's
   first product and the value part of U), {-(lam rk o K S) wy^T onto it, S^T Q^T}, {the next
   state, the outputs}; the twin's compiler waits on each product.
3. The outputs, the chunk states and U, lam o K S (the backward's recompute) leave through shared
   memory by bulk tensor stores, each waited on only when its buffer is next written.
4. Each chunk's row coefficients are loaded one chunk ahead in a compact layout (one register a
   vector) and moved into the products' layout where used.

With the WY step off (gated linear attention and Mamba2 SSD: U = V) a chunk is two groups:
{S^T Q^T, the next state} and then the outputs onto lam rq o S^T Q^T, V^T the outputs' operand as
it arrived in shared memory and read into registers once for the state's operand and SSD's skip
D x. With GATE_SCORES (the group prep's scores, one tile per query/key head) each value head's
gate tile is formed in registers while the first group runs and stored as the outputs' operand.

Scope (``plan.delta.gluon_sweep_scope``; the launch layer checks the call): GDN (M = 1,
the WY step on, V as a product operand), or a scalar decay per head with the WY step off (SSD's
skip D per head or per channel; the delta prep's aqk or the group prep's scores without calm
gates; no gate z: the launch layer runs the twin for that); 16-bit
inputs, K 64 or 128, V a multiple of BV = 64, PASS 0 (one pass), 2 (a segmented sweep's second
pass, and the recompute from checkpoints) and 3 (a phase); no replay (the twin's REPLAY launch
runs after this one, on the flags it raises).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)


@gluon.jit
def _issue_loads(j, n_chunks, c_lo, k_desc, q_desc, v_desc, w_desc, a_desc, k_s, q_s, v_s, w_s, a_s, bars,
                 col_qk, col_v, col_w, BT: gl.constexpr, NUM_STAGES: gl.constexpr, OUTPUTS: gl.constexpr,
                 WY: gl.constexpr):
    """The bulk copies of the program's j-th chunk (chunk c_lo + j of the sequence) into stage
    j % NUM_STAGES; none past its last. WY False: no wy tile."""
    s = j % NUM_STAGES
    pred = j < n_chunks
    bar = bars.index(s)
    W_BYTES: gl.constexpr = w_desc.block_type.nbytes if WY else 0
    if OUTPUTS:
        nbytes: gl.constexpr = (k_desc.block_type.nbytes + q_desc.block_type.nbytes + v_desc.block_type.nbytes
                                + W_BYTES + a_desc.block_type.nbytes)
    else:
        nbytes: gl.constexpr = k_desc.block_type.nbytes + v_desc.block_type.nbytes + W_BYTES
    mbarrier.expect(bar, nbytes, pred=pred)
    r = (c_lo + j) * BT  # int32: a row of the sequence
    tma.async_copy_global_to_shared(k_desc, [r, col_qk], bar, k_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(v_desc, [r, col_v], bar, v_s.index(s), pred=pred)
    if WY:
        tma.async_copy_global_to_shared(w_desc, [r, col_w], bar, w_s.index(s), pred=pred)
    if OUTPUTS:
        tma.async_copy_global_to_shared(q_desc, [r, col_qk], bar, q_s.index(s), pred=pred)
        tma.async_copy_global_to_shared(a_desc, [r, col_w], bar, a_s.index(s), pred=pred)


@gluon.jit
def _row_coefficients(coef, bos, L, c, c_hi, i_n, i_hv, o_t, HV: gl.constexpr, BT: gl.constexpr,
                      CW: gl.constexpr, GATE_SCORES: gl.constexpr):
    """Chunk c's (lam rk, lam rq, gam rk) along its rows in o_t's layout (zero past the sequence's
    end) and lam_last: the twin's coefficient tile of CW floats a row; with GATE_SCORES also the
    group prep's gc, segments and column factors (columns 4-6), else lam rk in their place. Past
    the program's last chunk (c >= c_hi) the loads are masked off."""
    live = c < c_hi
    m_r = (c * BT + o_t < L) & live
    p_coef = coef + (((bos + c * BT) // BT + i_n) * HV + i_hv) * (BT * CW)
    lam_rk = gl.load(p_coef + o_t * CW, mask=m_r, other=0.0)
    lam_rq = gl.load(p_coef + o_t * CW + 1, mask=m_r, other=0.0)
    gam_rk = gl.load(p_coef + o_t * CW + 2, mask=m_r, other=0.0)
    lam_last = gl.load(p_coef + 3, mask=live, other=0.0)
    if GATE_SCORES:
        gc = gl.load(p_coef + o_t * CW + 4, mask=m_r, other=0.0)
        seg = gl.load(p_coef + o_t * CW + 5, mask=m_r, other=0.0)
        col = gl.load(p_coef + o_t * CW + 6, mask=m_r, other=0.0)
    else:
        gc = lam_rk
        seg = lam_rk
        col = lam_rk
    return lam_rk, lam_rq, gam_rk, lam_last, gc, seg, col


@gluon.jit
def _sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN: gl.constexpr):
    """(bos, eos) int64 of sequence i_n's rows: from ``cu_seqlens`` clamped to [0, T] (no
    descriptor over them reaches outside the inputs), or the dense batch's n T."""
    if IS_VARLEN:
        bos = gl.minimum(gl.maximum(gl.load(cu_seqlens + i_n).to(gl.int64), 0), T)
        eos = gl.minimum(gl.maximum(gl.load(cu_seqlens + i_n + 1).to(gl.int64), bos), T)
    else:
        bos = i_n * T
        eos = bos + T
    return bos, eos


@gluon.jit
def _state_offsets(i_v, stride_k, stride_v, layout: gl.constexpr, BV: gl.constexpr, K: gl.constexpr):
    """Offsets of a [BV, K] tile S^T (value block i_v) of a state with strides (stride_k, stride_v),
    in 32 bits (a [BV, K] tile of 64-bit offsets is 128 registers a thread; the launch layer
    checks that a state's offsets fit)."""
    o_v = gl.arange(0, BV, layout=gl.SliceLayout(1, layout))
    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, layout))
    return (i_v * BV + o_v)[:, None] * stride_v + o_k[None, :] * stride_k


@gluon.jit
def _entering_state(h0, state, seg_n, slot, pad, first_phase, p_h, i_n, i_s, n_seg, i_hv, i_v, s0_n, s0_h, s0_k, s0_v,
                    layout: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
                    PASS: gl.constexpr, USE_CACHE: gl.constexpr, HAS_H0: gl.constexpr):
    """S^T [BV, K] float32 in ``layout`` that a sweep program starts from: its segment's fixed-up
    S_in (PASS 2), in a later phase (PASS 3) the state the phase before left at ``seg_n + p_h``,
    else the sequence's initial state (:func:`_initial_state`)."""
    if PASS == 2:  # the segment's fixed-up S_in (or a checkpoint)
        S_b = gl.load(seg_n + ((i_n * n_seg + i_s) * HV + i_hv) * (K * V) + _state_offsets(i_v, V, 1, layout, BV, K))
    elif PASS == 3:
        if first_phase:
            S_b = _initial_state(h0, state, slot, pad, i_n, i_hv, i_v, s0_n, s0_h, s0_k, s0_v, layout, BV, K,
                                 USE_CACHE, HAS_H0)
        else:  # a later phase starts from the state the phase before left
            S_b = gl.load(seg_n + p_h + _state_offsets(i_v, V, 1, layout, BV, K))
    else:
        S_b = _initial_state(h0, state, slot, pad, i_n, i_hv, i_v, s0_n, s0_h, s0_k, s0_v, layout, BV, K, USE_CACHE,
                             HAS_H0)
    return S_b


@gluon.jit
def _end_state(S_t, flags, ends, pad, replay_flags, pid, state, slot, s0_n, s0_h, s0_k, s0_v, ht, ht_n, ht_h, seg_n,
               p_h, i_n, i_hv, i_v, layout: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, K: gl.constexpr,
               OUTPUTS: gl.constexpr, USE_CACHE: gl.constexpr, STORE_FINAL: gl.constexpr, PASS: gl.constexpr):
    """Where a sweep program's state S^T [BV, K] (``layout``) goes after its last chunk. A program
    whose state came out non-finite raises its replay flag (``flags``: the programs a replay
    launch mirrors, with OUTPUTS; the twin's replay runs it again with each chunk's outputs formed
    causally, and writes its cache slot); a program that ends its sequence (``ends``) writes its
    cache slot (not a padding slot's, not a replayed one's) or the final state; a phase's
    (PASS 3) the next phase's entering state at ``seg_n + p_h``."""
    replay = False
    if OUTPUTS:
        if flags:
            bad = gl.max(gl.max(gl.where(S_t * 0.0 == 0.0, 0, 1), axis=1), axis=0)
            replay = (bad != 0) & (not pad)
            gl.store(replay_flags + pid, replay.to(gl.int32))
    o_vk = _state_offsets(i_v, V, 1, layout, BV, K)
    if ends:
        if USE_CACHE:
            o_s0 = _state_offsets(i_v, s0_k, s0_v, layout, BV, K)
            gl.store(state + slot * s0_n + i_hv * s0_h + o_s0, S_t.to(state.dtype.element_ty),
                     mask=(o_s0 >= 0) & (not replay) & (not pad))
        elif STORE_FINAL:
            gl.store(ht + i_n * ht_n + i_hv * ht_h + o_vk, S_t)
    elif PASS == 3:
        gl.store(seg_n + p_h + o_vk, S_t)


@gluon.jit
def _initial_state(h0, state, slot, pad, i_n, i_hv, i_v, s0_n, s0_h, s0_k, s0_v, layout: gl.constexpr,
                   BV: gl.constexpr, K: gl.constexpr, USE_CACHE: gl.constexpr, HAS_H0: gl.constexpr):
    """S^T [BV, K] float32 in ``layout`` of the sequence's initial state: its cache slot (none for a
    padding slot), ``h0[n]`` or zeros, read through the strides ``s0_*``."""
    if USE_CACHE:
        o_s0 = _state_offsets(i_v, s0_k, s0_v, layout, BV, K)
        S_b = gl.load(state + slot * s0_n + i_hv * s0_h + o_s0, mask=(o_s0 >= 0) & (not pad), other=0.0)
    elif HAS_H0:
        S_b = gl.load(h0 + i_n * s0_n + i_hv * s0_h + _state_offsets(i_v, s0_k, s0_v, layout, BV, K))
    else:
        S_b = gl.zeros([BV, K], gl.float32, layout=layout)
    return S_b.to(gl.float32)


@gluon.jit
def gluon_sweep_kernel(
    q, k, v, wy, aqk, coef, o,
    h0, ht, state, state_indices, chunk_states, cu_seqlens, chunk_offsets, sequence_order,
    seg_n, seg_m, n_seg, seg_chunks, tc_first, tc_count, trigger_dependents, T,
    s0_n, s0_h, s0_k, s0_v, n_slots, n_cs_rows, replay_flags, u_out, ks_out, checkpoints, n_ckpt, D, z, dl,
    o_st, o_sh, ht_n, ht_h, ready_flags,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, M: gl.constexpr,
    BT: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr,
    IS_VARLEN: gl.constexpr, HAS_H0: gl.constexpr,
    STORE_FINAL: gl.constexpr, USE_CACHE: gl.constexpr, STORE_CHUNK_STATES: gl.constexpr,
    DOT_PRECISION: gl.constexpr, NUM_STAGES: gl.constexpr, DT: gl.constexpr, PASS: gl.constexpr = 0,
    V_PRODUCT: gl.constexpr = True, TMA_STORE: gl.constexpr = False, PDL: gl.constexpr = False,
    REPLAY: gl.constexpr = False, OUTPUTS: gl.constexpr = True, STORE_U: gl.constexpr = False,
    CKPT_CHUNKS: gl.constexpr = 0, WY: gl.constexpr = True, HAS_D: gl.constexpr = False,
    D_PER_CHANNEL: gl.constexpr = False, HAS_Z: gl.constexpr = False, KEY_DECAY: gl.constexpr = False,
    GATE_SCORES: gl.constexpr = False, CALM_GATES: gl.constexpr = False, SWEEP_SCORES: gl.constexpr = False,
):
    """Grid as the twin's: PASS 0 and 3 (N * HV * V / BV,), PASS 2 (N * n_seg * HV * V / BV,);
    program -> (sequence, [segment,] value head, value block of BV = 64), the block fastest. Per
    chunk, from raw q and k (lam rk, lam rq, gam rk, lam_last from the prep's ``coef``)::

        KS^T = S^T K^T;    U^T = V^T wy^T - (lam rk o KS^T) wy^T    (WY False: U^T = V^T)
        O^T  = lam rq o (S^T Q^T) + U^T aqk^T  (+ D x^T with HAS_D)
        S^T <- lam_last S^T + (U^T o gam rk) K

    The initial state, the phases' and segments' states, the cache slot (and a padding slot's
    zero outputs), the chunk states, the checkpoints, STORE_U, the replay flags and the final
    state are the twin's (its docstring). TMA_STORE, DOT_PRECISION and BK are the twin's
    arguments, unused here: the outputs always leave by bulk stores (the launch layer checks their
    strides), the products take 16-bit operands, and tiles are K wide."""
    gl.static_assert(BV == 64, "the Gluon sweep takes 64 value columns a program")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    gl.static_assert(M == 1, "GDN only (M = 1)")
    gl.static_assert(V_PRODUCT or not WY, "with the WY step, V as a product operand")
    gl.static_assert(not (KEY_DECAY or HAS_Z or CALM_GATES), "a scalar decay per head, no gate z, no calm gates")
    gl.static_assert(not GATE_SCORES or not WY, "the group prep's scores: the WY step off")
    gl.static_assert(not (SWEEP_SCORES and OUTPUTS), "the prep's scores (the warp-specialised sweep forms its own)")
    gl.static_assert(WY or not STORE_U, "STORE_U: the delta rule's")
    gl.static_assert(not HAS_D or (OUTPUTS and not WY), "the skip D x: SSD's outputs")
    gl.static_assert(PASS != 1 and not REPLAY, "the single pass, a phase or a second pass; the twin replays")
    if PDL:
        if trigger_dependents != 0:  # the next phase's prep may start once every program here has
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
    NV: gl.constexpr = V // BV
    pid = gl.program_id(0)
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    if PASS == 2:
        i_s = (pid // (NV * HV)) % n_seg
        i_n = (pid // (NV * HV * n_seg)).to(gl.int64)
    else:
        i_s = 0
        i_n = (pid // (NV * HV)).to(gl.int64)
        if IS_VARLEN:  # longest sequences first (ranked by the prep)
            i_n = gl.load(sequence_order + i_n).to(gl.int64)
    i_h = i_hv // (HV // H)
    bos, eos = _sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN)
    L = eos - bos
    n_total = (L + BT - 1) // BT
    # Chunks [c_lo, c_hi) of the sequence; ``first_phase``: from the sequence's initial state;
    # ``ends``: the program ends the sequence (final state, cache slot); ``flags``: it raises its
    # replay flag (every program of a pass the replay launch mirrors: a phase's last, a pass's all).
    first_phase = True
    ends = True
    flags = True
    if PASS == 0:
        c_lo = (n_total * 0).to(gl.int32)
        c_hi = n_total.to(gl.int32)
    elif PASS == 3:
        c_lo = (n_total * 0 + tc_first).to(gl.int32)
        c_hi = gl.minimum(c_lo + tc_count, n_total).to(gl.int32)
        first_phase = c_lo == 0
        ends = c_hi == n_total
        flags = ends
    else:
        if IS_VARLEN:  # each sequence in n_seg segments of its own length (some empty if it is short)
            per_seg = (n_total + n_seg - 1) // n_seg
        else:
            per_seg = n_total * 0 + seg_chunks
        c_lo = (i_s * per_seg).to(gl.int32)
        c_hi = gl.minimum(c_lo + per_seg, n_total).to(gl.int32)
        ends = i_s == n_seg - 1
    n_chunks = gl.maximum(c_hi - c_lo, 0)
    pad = False
    slot = i_n * 0
    n_run = n_chunks
    if USE_CACHE:  # a slot outside [0, n_slots): padding, zero outputs, no state access
        slot = gl.load(state_indices + i_n).to(gl.int64)
        pad = (slot < 0) | (slot >= n_slots)
        n_run = gl.where(pad, 0, n_chunks)

    # Descriptors over this sequence's rows: a tile past its end reads zeros, a store stops there.
    rows = gl.maximum(L, 1).to(gl.int32)
    l_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], DT)
    l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DT)
    l_tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], DT)
    k_desc = tma.make_tensor_descriptor(k + bos * (H * K), [rows, H * K], [H * K, 1], [BT, K], l_qk)
    v_desc = tma.make_tensor_descriptor(v + bos * (HV * V), [rows, HV * V], [HV * V, 1], [BT, BV], l_tv)
    if WY:
        w_desc = tma.make_tensor_descriptor(wy + bos * (HV * BT), [rows, HV * BT], [HV * BT, 1], [BT, BT], l_tt)
    else:  # placeholder, unread
        w_desc = v_desc
    # aqk's tiles: a value head's [BT, BT] rows of the delta prep's, or with GATE_SCORES a query/key
    # head's scores (kernels/gla/group_prep.py, in their own dtype), gated here per value head.
    A_DT: gl.constexpr = aqk.dtype.element_ty
    AH: gl.constexpr = H if GATE_SCORES else HV
    l_at: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], A_DT)
    if OUTPUTS:
        q_desc = tma.make_tensor_descriptor(q + bos * (H * K), [rows, H * K], [H * K, 1], [BT, K], l_qk)
        a_desc = tma.make_tensor_descriptor(aqk + bos * (AH * BT), [rows, AH * BT], [AH * BT, 1], [BT, BT], l_at)
        o_desc = tma.make_tensor_descriptor(o + bos * o_st + i_hv * o_sh, [rows, V], [o_st, 1], [BT, BV], l_tv)
    else:  # placeholders, unread
        q_desc = k_desc
        a_desc = v_desc
        o_desc = v_desc
    col_qk = i_h * K
    col_v = i_hv * V + i_v * BV
    col_w = (i_h if GATE_SCORES else i_hv) * BT
    CW: gl.constexpr = 8 if GATE_SCORES else 4  # coef's floats a row (kernels/delta/sweep.py's _coef_width)

    # Layouts: one warpgroup; results N = 64 (a chunk's columns) and N = K (the state).
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    mmaK: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    a64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma64, k_width=2)
    aK: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mmaK, k_width=2)
    col64: gl.constexpr = gl.SliceLayout(0, mma64)  # along a [BV, BT] tile's columns (the chunk's rows)
    row64: gl.constexpr = gl.SliceLayout(1, mma64)  # along its rows (a [BT, BT] tile's j)
    compact: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # a row vector, one register a thread
    blk: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])  # state tiles in

    k_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], l_qk)
    v_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    if WY:
        w_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BT], l_tt)
    else:  # placeholder, unread
        w_s = v_s
    if OUTPUTS:
        q_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], l_qk)
        a_s = gl.allocate_shared_memory(A_DT, [NUM_STAGES, BT, BT], l_at)
        o_s = gl.allocate_shared_memory(DT, [BT, BV], l_tv)
        if GATE_SCORES:  # the chunk's gated scores, the outputs' operand
            g_s = gl.allocate_shared_memory(DT, [BT, BT], l_tt)
    else:
        q_s = k_s
        a_s = v_s
        o_s = v_s
    if STORE_U:
        u_desc = tma.make_tensor_descriptor(u_out + bos * (HV * V), [rows, HV * V], [HV * V, 1], [BT, BV], l_tv)
        ks_desc = tma.make_tensor_descriptor(ks_out + bos * (HV * V), [rows, HV * V], [HV * V, 1], [BT, BV], l_tv)
        u_s = gl.allocate_shared_memory(DT, [BT, BV], l_tv)
        ks_s = gl.allocate_shared_memory(DT, [BT, BV], l_tv)
    if STORE_CHUNK_STATES:
        CS_DT: gl.constexpr = chunk_states.dtype.element_ty
        l_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K, BV], CS_DT)
        # Chunk-state rows outside [0, n_cs_rows) (a wrong chunk_offsets entry) are moved just past it.
        cs_desc = tma.make_tensor_descriptor(chunk_states, [n_cs_rows * (HV * K), V], [V, 1], [K, BV], l_kv)
        cs_s = gl.allocate_shared_memory(CS_DT, [K, BV], l_kv)
        if IS_VARLEN:
            cs0 = gl.load(chunk_offsets + i_n).to(gl.int64)
        else:
            cs0 = i_n * ((T + BT - 1) // BT)
    # Bulk-store groups a chunk issues, in order: the chunk state, U and lam o K S, the outputs.
    # Before a staging buffer is written again, the stores issued after its last one may stay pending.
    N_CS: gl.constexpr = 1 if STORE_CHUNK_STATES else 0
    N_U: gl.constexpr = 2 if STORE_U else 0
    N_O: gl.constexpr = 1 if OUTPUTS else 0

    bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(NUM_STAGES):
        _issue_loads(i, n_run, c_lo, k_desc, q_desc, v_desc, w_desc, a_desc, k_s, q_s, v_s, w_s, a_s, bars,
                     col_qk, col_v, col_w, BT, NUM_STAGES, OUTPUTS, WY)

    # The state entering the program's first chunk, loaded in a layout of its own and converted once.
    p_h = (i_n * HV + i_hv) * (K * V)
    S_b = _entering_state(h0, state, seg_n, slot, pad, first_phase, p_h, i_n, i_s, n_seg, i_hv, i_v, s0_n, s0_h, s0_k,
                          s0_v, blk, HV, K, V, BV, PASS, USE_CACHE, HAS_H0)
    S_t = gl.convert_layout(S_b, mmaK)

    o_t = gl.arange(0, BT, layout=compact)
    zero64 = gl.zeros([BV, BT], gl.float32, layout=mma64)
    if GATE_SCORES:  # a [BT, BT] tile's j (rows) and i (columns)
        o_j = gl.arange(0, BT, layout=row64)
        o_i = gl.arange(0, BT, layout=col64)
    if HAS_D:  # D per head, or per value column ([BV, 1] along the tile's rows)
        if D_PER_CHANNEL:
            o_vd = i_v * BV + gl.arange(0, BV, layout=row64)
            d_skip = gl.load(D + i_hv * V + o_vd).to(gl.float32)[:, None]
        else:
            d_skip = gl.load(D + i_hv).to(gl.float32)
    n_rk, n_rq, n_gk, n_last, n_gc, n_sg, n_cf = _row_coefficients(coef, bos, L, c_lo, c_hi, i_n, i_hv, o_t, HV, BT,
                                                                   CW, GATE_SCORES)
    if CKPT_CHUNKS > 0:
        o_vk_m = _state_offsets(i_v, V, 1, mmaK, BV, K)
    for j in range(n_run):
        s = j % NUM_STAGES
        c = c_lo + j
        mbarrier.wait(bars.index(s), (j // NUM_STAGES) & 1)
        lam_rk, lam_rq, gam_rk, lam_last, gc, sg, cf = n_rk, n_rq, n_gk, n_last, n_gc, n_sg, n_cf
        n_rk, n_rq, n_gk, n_last, n_gc, n_sg, n_cf = _row_coefficients(coef, bos, L, c + 1, c_hi, i_n, i_hv, o_t, HV,
                                                                       BT, CW, GATE_SCORES)

        if CKPT_CHUNKS > 0:  # the float32 state entering every CKPT_CHUNKS-th chunk
            if c % CKPT_CHUNKS == 0:
                gl.store(checkpoints + ((i_n * n_ckpt + c // CKPT_CHUNKS) * HV + i_hv) * (K * V) + o_vk_m, S_t)
        S_d = S_t.to(DT)
        if STORE_CHUNK_STATES:  # the state entering chunk c, to its chunk-state row
            tma.store_wait(pendings=N_U + N_O)
            cs_s.permute((1, 0)).store(S_t.to(CS_DT))
            fence_async_shared()
            cs = cs0 + c
            cs = gl.where((cs >= 0) & (cs < n_cs_rows), cs, n_cs_rows)  # past the descriptor: not stored
            tma.async_copy_shared_to_global(cs_desc, [(cs * HV + i_hv).to(gl.int32) * K, i_v * BV], cs_s)

        if WY:
            # Group 1: K S (the chain) and V^T wy^T together.
            S_a = gl.convert_layout(S_d, a64)
            KSt = warpgroup_mma(S_a, k_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
            Ut = warpgroup_mma(v_s.index(s).permute((1, 0)), w_s.index(s).permute((1, 0)), zero64, use_acc=False,
                               is_async=True)
            KSt, Ut = warpgroup_mma_wait(num_outstanding=0, deps=(KSt, Ut))

            # Group 2: -(lam rk o K S) wy^T onto U^T (the chain), and S^T Q^T.
            KSt = gl.convert_layout(lam_rk, col64)[None, :] * KSt
            Ut = warpgroup_mma(gl.convert_layout((-KSt).to(DT), a64), w_s.index(s).permute((1, 0)), Ut, is_async=True)
            if OUTPUTS:
                QSt = warpgroup_mma(S_a, q_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
                Ut, QSt = warpgroup_mma_wait(num_outstanding=0, deps=(Ut, QSt))
            else:
                Ut = warpgroup_mma_wait(num_outstanding=0, deps=(Ut,))

            # Group 3: the next state (the chain), and the outputs onto lam rq o S^T Q^T.
            U_g = gl.convert_layout((Ut * gl.convert_layout(gam_rk, col64)[None, :]).to(DT), aK)
            S_t = warpgroup_mma(U_g, k_s.index(s), S_t * lam_last, is_async=True)
            if OUTPUTS:
                O_t = warpgroup_mma(gl.convert_layout(Ut.to(DT), a64), a_s.index(s).permute((1, 0)),
                                    gl.convert_layout(lam_rq, col64)[None, :] * QSt, is_async=True)
            if STORE_U:  # U and lam o K S, for the backward, while the group runs
                tma.store_wait(pendings=N_O + N_CS)
                u_s.permute((1, 0)).store(Ut.to(DT))
                ks_s.permute((1, 0)).store(KSt.to(DT))
                fence_async_shared()
                tma.async_copy_shared_to_global(u_desc, [c * BT, col_v], u_s)
                tma.async_copy_shared_to_global(ks_desc, [c * BT, col_v], ks_s)
            if OUTPUTS:
                S_t, O_t = warpgroup_mma_wait(num_outstanding=0, deps=(S_t, O_t))
            else:
                S_t = warpgroup_mma_wait(num_outstanding=0, deps=(S_t,))
        else:
            # U = V (gated linear attention, SSD): {S^T Q^T, the next state (the chain)}, then the
            # outputs onto lam rq o S^T Q^T; V^T is the outputs' shared-memory operand as it
            # arrived, and read into registers once for the state's operand and SSD's skip D x.
            Vt = v_s.index(s).permute((1, 0)).load(mma64).to(gl.float32)  # [BV, BT]
            U_g = gl.convert_layout((Vt * gl.convert_layout(gam_rk, col64)[None, :]).to(DT), aK)
            if OUTPUTS:
                QSt = warpgroup_mma(gl.convert_layout(S_d, a64), q_s.index(s).permute((1, 0)), zero64, use_acc=False,
                                    is_async=True)
            S_t = warpgroup_mma(U_g, k_s.index(s), S_t * lam_last, is_async=True)
            if OUTPUTS:
                if GATE_SCORES:
                    # aqk^T [j, i] = G_ij c_j scores_ij while the products run (the twin's
                    # _gated_scores: G_ij = 2^(gc_i - gc_j) for j <= i in one segment).
                    St = a_s.index(s).permute((1, 0)).load(mma64).to(gl.float32)  # [j, i]
                    gc_i = gl.convert_layout(gc, col64)[None, :]
                    sg_i = gl.convert_layout(sg, col64)[None, :]
                    gc_j = gl.convert_layout(gc, row64)[:, None]
                    sg_j = gl.convert_layout(sg, row64)[:, None]
                    cf_j = gl.convert_layout(cf, row64)[:, None]
                    keep = (o_j[:, None] <= o_i[None, :]) & (sg_j == sg_i)
                    At = gl.where(keep, gl.exp2(gc_i - gc_j) * cf_j * St, 0.0)
                    g_s.permute((1, 0)).store(At.to(DT))
                    fence_async_shared()
                    gl.thread_barrier()
                    a_op = g_s.permute((1, 0))
                else:
                    a_op = a_s.index(s).permute((1, 0))
                QSt = warpgroup_mma_wait(num_outstanding=1, deps=(QSt,))
                O_t = warpgroup_mma(v_s.index(s).permute((1, 0)), a_op,
                                    gl.convert_layout(lam_rq, col64)[None, :] * QSt, is_async=True)
                S_t, O_t = warpgroup_mma_wait(num_outstanding=0, deps=(S_t, O_t))
                if HAS_D:  # Mamba2's skip D x (v holds x)
                    O_t += d_skip * Vt
            else:
                S_t = warpgroup_mma_wait(num_outstanding=0, deps=(S_t,))

        # Stage s is free: refill it with the chunk NUM_STAGES on; O^T out.
        _issue_loads(j + NUM_STAGES, n_run, c_lo, k_desc, q_desc, v_desc, w_desc, a_desc, k_s, q_s, v_s, w_s, a_s,
                     bars, col_qk, col_v, col_w, BT, NUM_STAGES, OUTPUTS, WY)
        if OUTPUTS:
            tma.store_wait(pendings=N_CS + N_U)
            o_s.permute((1, 0)).store(O_t.to(DT))
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [c * BT, i_v * BV], o_s)
    if OUTPUTS:
        if pad:  # a padding slot: zero outputs over the program's chunks
            tma.store_wait(pendings=0)
            o_s.store(gl.zeros([BT, BV], DT, layout=blk))
            fence_async_shared()
            for j in range(n_chunks):
                tma.async_copy_shared_to_global(o_desc, [(c_lo + j) * BT, i_v * BV], o_s)
    tma.store_wait(pendings=0)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))

    _end_state(S_t, flags, ends, pad, replay_flags, pid, state, slot, s0_n, s0_h, s0_k, s0_v, ht, ht_n, ht_h, seg_n,
               p_h, i_n, i_hv, i_v, mmaK, V, BV, K, OUTPUTS, USE_CACHE, STORE_FINAL, PASS)
