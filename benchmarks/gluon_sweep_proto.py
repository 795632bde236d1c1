"""A prototype of the sweep in Gluon (``triton.experimental.gluon``) with asynchronous tensor-core
products: GPU only, not used by the library. Does a sweep whose products are not each waited on
at once run faster, and what does that give the whole op?

    python -m benchmarks.gluon_sweep_proto --sweep-alone --workload NAME --out FILE      # the sweep alone
    python -m benchmarks.gluon_sweep_proto --workload NAME [--phases K] [--phase-ratio R] --out FILE

Scope: dense GDN (M = 1), bf16, T a multiple of 64, K = 128, V a multiple of 64, BV = 64, zero
initial state, final state stored. It reads the prep kernel's scratch (wy, aqk, coef) and runs the
single pass or each phase of a phased plan (:func:`run_plan_with_gluon_sweep`: the plan's own prep
launches, the sweeps replaced). The algebra is the Triton sweep's
(:func:`recurscan.kernels.delta.sweep.chunk_delta_sweep_kernel`), per chunk, transposed (S^T
[BV, K] float32 in registers), with the same roundings; on the H200 its outputs and states are the
Triton sweep's bits::

    KSt = S^T K^T                     (P1)   QSt = S^T Q^T                  (PQ)
    U^T = V^T wy^T - (lam rk o KSt) wy^T     (PV, then PU into the same accumulator)
    S^T <- lam_last S^T + (U^T o gam rk) K   (P4)
    O^T = (lam rq o QSt) + U^T aqk^T         (PO)

Two kernels:

- :func:`gluon_sweep_kernel`, one warpgroup. Tiles arrive by bulk tensor copies into a ring of
  shared-memory stages (one mbarrier each). The products go in three groups, each issued together
  and waited on once: {P1, PV}, {PU, PQ}, {P4, PO}. That is three waits a chunk where the Triton
  kernel has six. Each chunk's coefficients are loaded one chunk ahead.
- :func:`gluon_ws_sweep_kernel`, two warpgroups (``gl.warp_specialize``). One runs the chain and
  issues the copies; the other forms and stores the outputs from S^T and U^T handed over through
  shared memory.

What ptxas does with them (sm_90) is in docs/kernels-chunk-delta.md. Gluon kernels do not run
under TRITON_INTERPRET=1: benchmarks/test_gluon_proto.py (run by hand, not in the default test run)
compiles both for sm_90 on the CPU, and this benchmark compares their results with the Triton sweep's on the GPU.
"""
from __future__ import annotations

import argparse
import json

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

BT = gl.constexpr(64)  # rows of a chunk (the kernel's constexpr; HOST_BT on the host)
BV = gl.constexpr(64)  # value columns of a program
HOST_BT, HOST_BV = 64, 64


@gluon.jit
def _issue_loads(j, n_chunks, row_c0, col_qk, col_v, col_w, k_desc, q_desc, v_desc, wy_desc, aqk_desc,
                 k_s, q_s, v_s, wy_s, aqk_s, bars, STAGES: gl.constexpr):
    """The bulk copies of the program's j-th chunk (its rows start at row_c0 + j * BT) into stage
    j % STAGES; nothing past its last chunk."""
    s = j % STAGES
    pred = j < n_chunks
    bar = bars.index(s)
    nbytes: gl.constexpr = (k_desc.block_type.nbytes + q_desc.block_type.nbytes + v_desc.block_type.nbytes
                            + wy_desc.block_type.nbytes + aqk_desc.block_type.nbytes)
    mbarrier.expect(bar, nbytes, pred=pred)
    r = row_c0 + j * BT
    tma.async_copy_global_to_shared(k_desc, [r, col_qk], bar, k_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(q_desc, [r, col_qk], bar, q_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(v_desc, [r, col_v], bar, v_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(wy_desc, [r, col_w], bar, wy_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(aqk_desc, [r, col_w], bar, aqk_s.index(s), pred=pred)


@gluon.jit
def _program(T, tc_first, tc_count, trigger_dependents, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr,
             V: gl.constexpr):
    """This program's (sequence, value head, value block), its chunk count and the coordinates of
    its tiles; lets the next launch start first when ``trigger_dependents`` != 0."""
    if trigger_dependents != 0:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    NV: gl.constexpr = V // BV
    pid = gl.program_id(0)
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_n = pid // (NV * HV)
    i_h = i_hv // (HV // H)
    n_total = T // BT
    n_chunks = gl.minimum(tc_count, n_total - tc_first)
    row_c0 = i_n * T + tc_first * BT  # the first row of the program's first chunk
    return i_n, i_hv, i_v, n_total, n_chunks, row_c0, i_h * K, i_hv * V + i_v * BV, i_hv * BT


@gluon.jit
def _tile_buffers(k_desc, q_desc, v_desc, wy_desc, aqk_desc, o_desc, STAGES: gl.constexpr):
    """Shared memory for STAGES stages of the five input tiles, and one output tile."""
    k_s = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    q_s = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    v_s = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    wy_s = gl.allocate_shared_memory(wy_desc.dtype, [STAGES] + wy_desc.block_type.shape, wy_desc.layout)
    aqk_s = gl.allocate_shared_memory(aqk_desc.dtype, [STAGES] + aqk_desc.block_type.shape, aqk_desc.layout)
    o_s = gl.allocate_shared_memory(o_desc.dtype, o_desc.block_type.shape, o_desc.layout)
    return k_s, q_s, v_s, wy_s, aqk_s, o_s


@gluon.jit
def _initial_state(seg_n, i_n, i_hv, i_v, tc_first, layout: gl.constexpr, HV: gl.constexpr, K: gl.constexpr,
                   V: gl.constexpr):
    """S^T [BV, K] entering the program's first chunk: zero (tc_first = 0) or the state the phase
    before left in ``seg_n [B, HV, K, V]``. Loaded in a layout of its own and converted once: index
    vectors in the state's layout would be the final store's too, held across the chunk loop
    (spilled)."""
    S_t = gl.zeros([BV, K], gl.float32, layout=layout)
    if tc_first > 0:
        blk: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])
        ov_b = gl.arange(0, BV, layout=gl.SliceLayout(1, blk))
        ok_b = gl.arange(0, K, layout=gl.SliceLayout(0, blk))
        S_b = gl.load(seg_n + (i_n * HV + i_hv) * (K * V) + ok_b[None, :] * V + (i_v * BV + ov_b)[:, None])
        S_t = gl.convert_layout(S_b, layout)
    return S_t


@gluon.jit
def _store_state(S_t, ht, seg_n, i_n, i_hv, i_v, last, layout: gl.constexpr, HV: gl.constexpr, K: gl.constexpr,
                 V: gl.constexpr):
    """S^T leaving the program's last chunk: to ``ht`` at the sequence's end (``last``), else to
    ``seg_n`` for the next phase."""
    o_v = gl.arange(0, BV, layout=gl.SliceLayout(1, layout))
    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, layout))
    offs = (o_v[:, None] + i_v * BV) + (o_k * V)[None, :] + (i_n * HV + i_hv) * (K * V)
    if last:
        gl.store(ht + offs, S_t)
    else:
        gl.store(seg_n + offs, S_t)


@gluon.jit
def _load_coef(coef, i_n, c, i_hv, T, o_t, HV: gl.constexpr):
    """Chunk c's (lam rk, gam rk, lam rq) along the chunk's rows, in o_t's layout, and lam_last."""
    p_coef = coef + ((i_n * (T // BT) + c + i_n) * HV + i_hv) * (BT * 4)
    return (gl.load(p_coef + o_t * 4), gl.load(p_coef + o_t * 4 + 2), gl.load(p_coef + o_t * 4 + 1),
            gl.load(p_coef + 3))


@gluon.jit
def _coef_vec(coef, i_n, c, i_hv, T, o_t, HV: gl.constexpr, COL: gl.constexpr):
    """Column COL of chunk c's coefficient tile (0 lam rk, 1 lam rq, 2 gam rk), in o_t's layout."""
    return gl.load(coef + ((i_n * (T // BT) + c + i_n) * HV + i_hv) * (BT * 4) + o_t * 4 + COL)


@gluon.jit
def gluon_sweep_kernel(k_desc, q_desc, v_desc, wy_desc, aqk_desc, o_desc, coef, ht, seg_n, T, tc_first, tc_count,
                       trigger_dependents, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                       STAGES: gl.constexpr):
    """Grid (B * HV * V // BV,): program -> (sequence n, value head hv, value block iv), iv fastest.

    Chunks [tc_first, tc_first + tc_count) of each sequence (clipped at its end): from a zero state
    (tc_first = 0) or from the state in ``seg_n [B, HV, K, V]``; to ``ht [B, HV, K, V]`` (the
    sequence's last chunk) or back to ``seg_n``: the Triton sweep's PASS 0 (one range of every chunk)
    and PASS 3 (one phase of the phased launches, launch/delta.py). trigger_dependents != 0
    lets the next launch, a programmatic dependent (the next phase's prep), start beside this one.
    """
    i_n, i_hv, i_v, n_total, n_chunks, row_c0, col_qk, col_v, col_w = _program(T, tc_first, tc_count,
                                                                                trigger_dependents, H, HV, K, V)

    # Layouts: one warpgroup; results of N = 64 (chunk columns) and N = K (the state).
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    mmaK: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    a64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma64, k_width=2)
    aK: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mmaK, k_width=2)
    col64: gl.constexpr = gl.SliceLayout(0, mma64)  # a vector along a [BV, 64] tile's columns (rows t)

    k_s, q_s, v_s, wy_s, aqk_s, o_s = _tile_buffers(k_desc, q_desc, v_desc, wy_desc, aqk_desc, o_desc, STAGES)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        _issue_loads(i, n_chunks, row_c0, col_qk, col_v, col_w, k_desc, q_desc, v_desc, wy_desc, aqk_desc,
                     k_s, q_s, v_s, wy_s, aqk_s, bars, STAGES)

    S_t = _initial_state(seg_n, i_n, i_hv, i_v, tc_first, mmaK, HV, K, V)

    o_t = gl.arange(0, BT, layout=col64)
    zero64 = gl.zeros([BV, BT], gl.float32, layout=mma64)
    # Each chunk's coefficients are loaded one chunk ahead: loaded in the chunk itself, their
    # latency (L2) stood on the chain (1.82 against 1.35 us a chunk at B1 T16384).
    lam_rk_n, gam_rk_n, lam_rq_n, lam_last_n = _load_coef(coef, i_n, tc_first, i_hv, T, o_t, HV)
    for j in range(n_chunks):
        s = j % STAGES
        c = tc_first + j
        mbarrier.wait(bars.index(s), (j // STAGES) & 1)
        # (Issued before the barrier wait instead, the next chunk's coefficients took 255 registers
        # and 56 B of stack, sm_90.)
        lam_rk, gam_rk, lam_rq, lam_last = lam_rk_n, gam_rk_n, lam_rq_n, lam_last_n
        lam_rk_n, gam_rk_n, lam_rq_n, lam_last_n = _load_coef(coef, i_n, gl.minimum(c + 1, n_total - 1), i_hv, T,
                                                              o_t, HV)

        # Group 1: P1 (the chain) and PV together, one wait.
        S_d = gl.convert_layout(S_t.to(gl.bfloat16), a64)
        KSt = warpgroup_mma(S_d, k_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
        Ut = warpgroup_mma(v_s.index(s).permute((1, 0)), wy_s.index(s).permute((1, 0)), zero64, use_acc=False,
                           is_async=True)
        KSt, Ut = warpgroup_mma_wait(num_outstanding=0, deps=(KSt, Ut))

        # Group 2: PU (the chain) and PQ (the outputs) together.
        X = gl.convert_layout((-(lam_rk[None, :] * KSt)).to(gl.bfloat16), a64)
        Ut = warpgroup_mma(X, wy_s.index(s).permute((1, 0)), Ut, is_async=True)
        QSt = warpgroup_mma(S_d, q_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
        Ut, QSt = warpgroup_mma_wait(num_outstanding=0, deps=(Ut, QSt))

        # Group 3: P4 (the chain) and PO (the outputs) together.
        U_g = gl.convert_layout((Ut * gam_rk[None, :]).to(gl.bfloat16), aK)
        S_t = warpgroup_mma(U_g, k_s.index(s), S_t * lam_last, is_async=True)
        U_d = gl.convert_layout(Ut.to(gl.bfloat16), a64)
        O_t = warpgroup_mma(U_d, aqk_s.index(s).permute((1, 0)), lam_rq[None, :] * QSt, is_async=True)
        S_t, O_t = warpgroup_mma_wait(num_outstanding=0, deps=(S_t, O_t))

        # This chunk's stage is free: refill it with the chunk STAGES on; store O^T.
        _issue_loads(j + STAGES, n_chunks, row_c0, col_qk, col_v, col_w, k_desc, q_desc, v_desc, wy_desc,
                     aqk_desc, k_s, q_s, v_s, wy_s, aqk_s, bars, STAGES)
        tma.store_wait(pendings=0)
        o_s.permute((1, 0)).store(O_t.to(o_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [row_c0 + j * BT, col_v], o_s)
    tma.store_wait(pendings=0)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    _store_state(S_t, ht, seg_n, i_n, i_hv, i_v, tc_first + n_chunks >= n_total, mmaK, HV, K, V)


@gluon.jit
def _ws_chain(k_desc, q_desc, v_desc, wy_desc, aqk_desc, k_s, q_s, v_s, wy_s, aqk_s, sd_s, u_s, bars, coef, ht,
              seg_n, i_n, i_hv, i_v, T, tc_first, n_chunks, n_total, row_c0, col_qk, col_v, col_w,
              HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, STAGES: gl.constexpr):
    """The chain's warpgroup: per chunk KSt, U^T and the next state. Hands S^T (entering the chunk)
    and then U^T, both bf16, to the outputs' warpgroup through one shared-memory slot each, and
    refills the tile stages (a stage once both warpgroups are done with it)."""
    ready, stage_empty, s_full, s_empty, u_full, u_empty = bars
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    mmaK: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    a64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma64, k_width=2)
    aK: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mmaK, k_width=2)
    col64: gl.constexpr = gl.SliceLayout(0, mma64)

    S_t = _initial_state(seg_n, i_n, i_hv, i_v, tc_first, mmaK, HV, K, V)
    o_t = gl.arange(0, BT, layout=col64)
    zero64 = gl.zeros([BV, BT], gl.float32, layout=mma64)
    p_last = coef + ((i_n * (T // BT) + i_n) * HV + i_hv) * (BT * 4) + 3  # chunk c's lam_last: + c * HV * BT * 4
    lam_rk_n = _coef_vec(coef, i_n, tc_first, i_hv, T, o_t, HV, 0)
    gam_rk_n = _coef_vec(coef, i_n, tc_first, i_hv, T, o_t, HV, 2)
    lam_last_n = gl.load(p_last + tc_first * (HV * BT * 4))
    for j in range(n_chunks):
        s = j % STAGES
        c = tc_first + j
        mbarrier.wait(ready.index(s), (j // STAGES) & 1)
        lam_rk, gam_rk, lam_last = lam_rk_n, gam_rk_n, lam_last_n
        c_next = gl.minimum(c + 1, n_total - 1)
        lam_rk_n = _coef_vec(coef, i_n, c_next, i_hv, T, o_t, HV, 0)
        gam_rk_n = _coef_vec(coef, i_n, c_next, i_hv, T, o_t, HV, 2)
        lam_last_n = gl.load(p_last + c_next * (HV * BT * 4))

        S_b = S_t.to(gl.bfloat16)
        mbarrier.wait(s_empty, (j & 1) ^ 1, pred=j >= 1)  # the outputs have read chunk j - 1's S^T
        sd_s.store(S_b)
        fence_async_shared()
        mbarrier.arrive(s_full, count=1)
        S_d = gl.convert_layout(S_b, a64)
        KSt = warpgroup_mma(S_d, k_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
        Ut = warpgroup_mma(v_s.index(s).permute((1, 0)), wy_s.index(s).permute((1, 0)), zero64, use_acc=False,
                           is_async=True)
        KSt, Ut = warpgroup_mma_wait(num_outstanding=0, deps=(KSt, Ut))
        # Refill the stage chunk j - 1 used (both warpgroups done with it) with chunk j - 1 + STAGES.
        sp = (j + STAGES - 1) % STAGES
        mbarrier.wait(stage_empty.index(sp), ((j - 1) // STAGES) & 1, pred=j >= 1)
        _issue_loads(j - 1 + STAGES, gl.where(j >= 1, n_chunks, 0), row_c0, col_qk, col_v, col_w, k_desc, q_desc,
                     v_desc, wy_desc, aqk_desc, k_s, q_s, v_s, wy_s, aqk_s, ready, STAGES)

        X = gl.convert_layout((-(lam_rk[None, :] * KSt)).to(gl.bfloat16), a64)
        Ut = warpgroup_mma(X, wy_s.index(s).permute((1, 0)), Ut, is_async=True)
        Ut = warpgroup_mma_wait(num_outstanding=0, deps=(Ut,))
        mbarrier.wait(u_empty, (j & 1) ^ 1, pred=j >= 1)  # the outputs have used chunk j - 1's U^T
        u_s.store(Ut.to(gl.bfloat16))
        fence_async_shared()
        mbarrier.arrive(u_full, count=1)
        U_g = gl.convert_layout((Ut * gam_rk[None, :]).to(gl.bfloat16), aK)
        S_t = warpgroup_mma(U_g, k_s.index(s), S_t * lam_last, is_async=True)
        S_t = warpgroup_mma_wait(num_outstanding=0, deps=(S_t,))
        mbarrier.arrive(stage_empty.index(s), count=1)

    _store_state(S_t, ht, seg_n, i_n, i_hv, i_v, tc_first + n_chunks >= n_total, mmaK, HV, K, V)


@gluon.jit
def _ws_outputs(q_s, aqk_s, sd_s, u_s, o_s, bars, o_desc, coef, i_n, i_hv, T, tc_first, n_chunks, n_total,
                row_c0, col_v, HV: gl.constexpr, STAGES: gl.constexpr):
    """The outputs' warpgroup: per chunk S^T Q^T as soon as S^T is handed over (beside the chain's
    first products), then O^T = (lam rq o S^T Q^T) + U^T aqk^T, stored by a bulk tensor store."""
    ready, stage_empty, s_full, s_empty, u_full, u_empty = bars
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    col64: gl.constexpr = gl.SliceLayout(0, mma64)
    o_t = gl.arange(0, BT, layout=col64)
    zero64 = gl.zeros([BV, BT], gl.float32, layout=mma64)
    lam_rq_n = _coef_vec(coef, i_n, tc_first, i_hv, T, o_t, HV, 1)
    for j in range(n_chunks):
        s = j % STAGES
        c = tc_first + j
        mbarrier.wait(ready.index(s), (j // STAGES) & 1)
        lam_rq = lam_rq_n
        lam_rq_n = _coef_vec(coef, i_n, gl.minimum(c + 1, n_total - 1), i_hv, T, o_t, HV, 1)
        mbarrier.wait(s_full, j & 1)
        QSt = warpgroup_mma(sd_s, q_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
        QSt = warpgroup_mma_wait(num_outstanding=0, deps=(QSt,))
        mbarrier.arrive(s_empty, count=1)
        mbarrier.wait(u_full, j & 1)
        O_t = warpgroup_mma(u_s, aqk_s.index(s).permute((1, 0)), lam_rq[None, :] * QSt, is_async=True)
        O_t = warpgroup_mma_wait(num_outstanding=0, deps=(O_t,))
        mbarrier.arrive(u_empty, count=1)
        mbarrier.arrive(stage_empty.index(s), count=1)
        tma.store_wait(pendings=0)
        o_s.permute((1, 0)).store(O_t.to(o_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [row_c0 + j * BT, col_v], o_s)
    tma.store_wait(pendings=0)


@gluon.jit
def gluon_ws_sweep_kernel(k_desc, q_desc, v_desc, wy_desc, aqk_desc, o_desc, coef, ht, seg_n, T, tc_first, tc_count,
                          trigger_dependents, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                          STAGES: gl.constexpr, OUT_REGS: gl.constexpr):
    """:func:`gluon_sweep_kernel` (same arguments, same results) on two warpgroups: the default one
    runs the state's chain and issues the bulk copies (:func:`_ws_chain`); a second one forms and
    stores the outputs (:func:`_ws_outputs`), so the outputs' products run beside the chain instead
    of between its products. Shared memory: the tile stages, one slot each for S^T and U^T in bf16,
    one output tile. mbarriers: tiles ready (per stage), stage free (two arrivals: both warpgroups),
    and full / free for each slot."""
    i_n, i_hv, i_v, n_total, n_chunks, row_c0, col_qk, col_v, col_w = _program(T, tc_first, tc_count,
                                                                                trigger_dependents, H, HV, K, V)

    k_s, q_s, v_s, wy_s, aqk_s, o_s = _tile_buffers(k_desc, q_desc, v_desc, wy_desc, aqk_desc, o_desc, STAGES)
    sd_s = gl.allocate_shared_memory(gl.bfloat16, [BV, K], gl.NVMMASharedLayout.get_default_for([BV, K], gl.bfloat16))
    u_s = gl.allocate_shared_memory(gl.bfloat16, [BV, BT], gl.NVMMASharedLayout.get_default_for([BV, BT], gl.bfloat16))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    stage_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    s_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    s_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    u_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    u_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(stage_empty.index(i), count=2)
    mbarrier.init(s_full, count=1)
    mbarrier.init(s_empty, count=1)
    mbarrier.init(u_full, count=1)
    mbarrier.init(u_empty, count=1)
    for i in gl.static_range(STAGES):
        _issue_loads(i, n_chunks, row_c0, col_qk, col_v, col_w, k_desc, q_desc, v_desc, wy_desc, aqk_desc,
                     k_s, q_s, v_s, wy_s, aqk_s, ready, STAGES)
    bars = (ready, stage_empty, s_full, s_empty, u_full, u_empty)
    gl.warp_specialize([
        (_ws_chain, (k_desc, q_desc, v_desc, wy_desc, aqk_desc, k_s, q_s, v_s, wy_s, aqk_s, sd_s, u_s, bars, coef,
                     ht, seg_n, i_n, i_hv, i_v, T, tc_first, n_chunks, n_total, row_c0, col_qk, col_v, col_w, HV, K,
                     V, STAGES)),
        (_ws_outputs, (q_s, aqk_s, sd_s, u_s, o_s, bars, o_desc, coef, i_n, i_hv, T, tc_first, n_chunks, n_total,
                       row_c0, col_v, HV, STAGES)),
    ], [4], [OUT_REGS])


def _desc(t2d, block):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)
    return TensorDescriptor(t2d, list(t2d.shape), list(t2d.stride()), block, layout)


def gluon_sweep(q, k, v, wy, aqk, coef, o, ht, seg_n=None, tc_first=0, tc_count=None, trigger_dependents=0,
                stages=3, ws=False, out_regs=168):
    """Launch the prototype sweep over token chunks [tc_first, tc_first + tc_count) (default: all)
    on the prep's scratch (``wy``, ``aqk``, ``coef``), writing ``o [B, T, HV, V]`` and ``ht`` or
    ``seg_n`` (``[B, HV, K, V]`` float32; see :func:`gluon_sweep_kernel`)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if T % HOST_BT or K != 128 or V % HOST_BV or q.dtype != torch.bfloat16:
        raise ValueError("gluon_sweep prototype: dense bf16, T % 64 == 0, K = 128, V % 64 == 0")
    tc_count = T // HOST_BT if tc_count is None else tc_count
    descs = (_desc(k.reshape(B * T, H * K), [HOST_BT, K]), _desc(q.reshape(B * T, H * K), [HOST_BT, K]),
             _desc(v.reshape(B * T, HV * V), [HOST_BT, HOST_BV]),
             _desc(wy.reshape(B * T, HV * HOST_BT), [HOST_BT, HOST_BT]),
             _desc(aqk.reshape(B * T, HV * HOST_BT), [HOST_BT, HOST_BT]),
             _desc(o.view(B * T, HV * V), [HOST_BT, HOST_BV]))
    grid = (B * HV * (V // HOST_BV),)
    args = (*descs, coef, ht, ht if seg_n is None else seg_n, T, tc_first, tc_count, trigger_dependents)
    if ws:
        gluon_ws_sweep_kernel[grid](*args, H=H, HV=HV, K=K, V=V, STAGES=stages, OUT_REGS=out_regs, num_warps=4)
    else:
        gluon_sweep_kernel[grid](*args, H=H, HV=HV, K=K, V=V, STAGES=stages, num_warps=4)


def run_plan_with_gluon_sweep(plan, inputs, stages=3, ws=False):
    """:func:`recurscan.launch.delta.run_delta_launches` with every sweep launch (single pass,
    or each phase of a phased plan) replaced by the prototype; the preps are the plan's own
    launches (programmatic ones included, from the second call on). Returns (o, final state)."""
    from recurscan.kernels.delta.sweep import chunk_delta_sweep_kernel
    from recurscan.launch.delta import BUFFER_NAMES, CALL_NAMES, _empty
    from recurscan.runtime.launcher import jit_launch

    made = {n: (_empty(*shape, dtype=dt, device=plan.device) if fill is None else
                torch.full(shape, fill, dtype=dt, device=plan.device))
            for n, (shape, dt, fill) in plan.buffers.items()}
    values = tuple(inputs) + tuple(made.get(n) for n in BUFFER_NAMES)
    q, k, v = inputs[:3]
    for step in plan.steps:
        if step.kernel is chunk_delta_sweep_kernel:
            kw = step.kwargs
            if kw.get("REPLAY"):  # the prototype raises no replay flags (finite inputs only)
                continue
            if kw["PASS"] == 0:
                first, count, trigger = 0, q.shape[1] // HOST_BT, 0
            elif kw["PASS"] == 3:
                first, count, trigger = kw["tc_first"], kw["tc_count"], kw["trigger_dependents"]
            else:
                raise ValueError("the prototype replaces single-pass and phased sweeps only")
            gluon_sweep(q, k, v, made["wy"], made["aqk"], made["coef"], made["o"], made["final"], made.get("seg_n"),
                        first, count, trigger, stages, ws)
        elif step.direct is not None:
            step.direct(values)
        else:
            step.direct = jit_launch(step.kernel, step.grid, step.kwargs, step.options, CALL_NAMES, values,
                                     step.programmatic, step.min_shared)
    return made["o"], made["final"]


def measure_sweep_alone(name, rep_ms, stages=3, ws_stages=3):
    """The sweep alone (single pass, graph replay) on the prep's scratch: the Triton kernel (BV 64,
    4 warps, 3 stages, bulk stores), the prototype and its two-warpgroup form; per chunk step of one
    program, and the outputs compared with the Triton sweep's."""
    import triton.testing as tt

    from recurscan.launch.delta import run_delta_launches

    from .delta_variants import variant_launches
    from .gpu_chunk_delta import kernel_inputs

    (q, k, v, g, beta), M, cu, kw = kernel_inputs(name)
    inputs = (q, k, v, g, beta, None, None, None, None, None, None)
    shape = dict(block_v=64, num_warps=4, num_stages=3, tma_store=True)
    full = variant_launches(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True, **shape)
    sweep = variant_launches(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True,
                             stage="sweep", **shape)
    n_chunks = q.shape[1] // HOST_BT
    row = {"workload": name, "triton_launch": shape, "times": {}}
    with torch.no_grad():
        ref_o, ref_ht = (t.clone() for t in run_delta_launches(full, inputs))
        # The prep's scratch, kept: the same launches' buffers, filled by its prep launch.
        from recurscan.launch.delta import BUFFER_NAMES, CALL_NAMES, _empty
        from recurscan.runtime.launcher import jit_launch
        made = {n: (_empty(*sh, dtype=dt, device=full.device) if fill is None else
                    torch.full(sh, fill, dtype=dt, device=full.device)) for n, (sh, dt, fill) in full.buffers.items()}
        values = inputs + tuple(made.get(n) for n in BUFFER_NAMES)
        for step in full.steps[:1]:  # the prep
            jit_launch(step.kernel, step.grid, step.kwargs, step.options, CALL_NAMES, values)
        o, ht = torch.empty_like(ref_o), torch.empty_like(ref_ht)
        runs = {"triton": lambda: run_delta_launches(sweep, inputs),
                "gluon": lambda: gluon_sweep(q, k, v, made["wy"], made["aqk"], made["coef"], o, ht, stages=stages),
                "gluon_ws": lambda: gluon_sweep(q, k, v, made["wy"], made["aqk"], made["coef"], o, ht,
                                                stages=ws_stages, ws=True)}
        for key, fn in runs.items():
            fn()
            if key != "triton":
                torch.cuda.synchronize()
                row[f"{key}_vs_triton_rel_rms"] = {
                    "o": ((o.float() - ref_o.float()).pow(2).mean().sqrt() / ref_o.float().pow(2).mean().sqrt()).item(),
                    "state": ((ht - ref_ht).pow(2).mean().sqrt() / ref_ht.pow(2).mean().sqrt()).item()}
            ms = tt.do_bench_cudagraph(fn, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
            row["times"][key] = {"median_ms": ms[0], "p20_ms": ms[1], "p80_ms": ms[2],
                                 "us_per_chunk": ms[0] * 1e3 / n_chunks}
    print(json.dumps(row), flush=True)
    return row


def measure(name, rep_ms, stages, phases=None, phase_ratio=None, ws_stages=3):
    """The whole op (prep + sweep, graph replay) at the planner's launch, with the Triton sweep and
    with the prototype's (BV 64: the planner's launch where it is BV 64, else a BV 64 plan beside
    the planned one), same process; outputs compared (relative RMS; 0 = the same bits)."""
    import triton.testing as tt

    from recurscan.launch.delta import run_delta_launches
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem

    from .delta_variants import variant_launches
    from .gpu_chunk_delta import kernel_inputs

    (q, k, v, g, beta), M, cu, kw = kernel_inputs(name)
    if M != 1 or cu is not None:
        raise ValueError(f"{name}: the prototype takes dense GDN")
    L = delta_shape(delta_problem(q, k, v, g, beta, num_householder=M, cu_seqlens=cu), torch.device("cuda"))
    inputs = (q, k, v, g, beta, None, None, None, None, None, None)

    def plan(**shape):
        return variant_launches(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True, **shape)

    planned = dict(block_v=L.block_v, num_warps=L.num_warps, num_stages=L.num_stages, segments=L.segments,
                   v_product=L.v_product, tma_store=L.tma_store, phases=phases or L.phases, prep_maxnreg=L.prep_maxnreg)
    if phase_ratio is not None:  # for the launches built here (phase_bounds reads it when building)
        from recurscan.launch import delta as launch_delta
        launch_delta.PHASE_RATIO = phase_ratio
    bv64 = dict(planned, block_v=64, num_warps=4, num_stages=3, segments=1, v_product=True, tma_store=True)
    runs = {"triton_planned": (plan(**planned), run_delta_launches),
            "triton_bv64": (plan(**bv64), run_delta_launches),
            "gluon_bv64": (plan(**bv64), lambda p, x: run_plan_with_gluon_sweep(p, x, stages)),
            "gluon_ws_bv64": (plan(**bv64), lambda p, x: run_plan_with_gluon_sweep(p, x, ws_stages, ws=True))}
    if planned == bv64:
        del runs["triton_bv64"]
    row = {"workload": name, "planned": planned, "phase_ratio": phase_ratio, "gluon_stages": stages, "times": {}}

    def rel(a, b):
        return ((a.float() - b.float()).pow(2).mean().sqrt() / b.float().pow(2).mean().sqrt()).item()

    with torch.no_grad():
        outs = {}
        for key, (p, fn) in runs.items():
            fn(p, inputs)  # first call: Triton's JIT (plain launches)
            outs[key] = [t.clone() for t in fn(p, inputs)]  # direct launches, programmatic ones included
            ms = tt.do_bench_cudagraph(lambda: fn(p, inputs), rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
            row["times"][key] = {"median_ms": ms[0], "p20_ms": ms[1], "p80_ms": ms[2]}
        ref = outs.get("triton_bv64", outs["triton_planned"])
        for key in ("gluon_bv64", "gluon_ws_bv64"):
            row[f"{key}_vs_triton_same_launch_rel_rms"] = {"o": rel(outs[key][0], ref[0]),
                                                           "state": rel(outs[key][1], ref[1])}
    print(json.dumps(row), flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gluon_sweep_proto")
    ap.add_argument("--workload", action="append", help="default: gdn_b1_t16384_h16_hv32")
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--phases", type=int, action="append", help="phase counts to run (default: the planner's)")
    ap.add_argument("--phase-ratio", type=float, action="append",
                    help="recurscan.launch.delta.PHASE_RATIO values to run")
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--sweep-alone", action="store_true", help="the sweep alone on the prep's scratch instead")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    from .runner import save_rows
    names = args.workload or ["gdn_b1_t16384_h16_hv32"]
    if args.sweep_alone:
        rows = [measure_sweep_alone(n, args.rep_ms, args.stages) for n in names]
    else:
        rows = [measure(n, args.rep_ms, args.stages, ph, r) for n in names for ph in args.phases or [None]
                for r in args.phase_ratio or [None]]
    if args.out:
        save_rows(rows, args.out, torch.device("cuda"))


if __name__ == "__main__":
    main()
