"""A Gluon prototype of the fused, warp-specialised GDN prefill (issue 21's third step; GPU only,
not in the package): each chunk's prep computed by warps of its own beside the state's chain, in
one program per (sequence, value head), so that the prep's SM-time hides under the chain where
every SM holds chains (B4 T8192 H16 HV64: 256 of them). Its twin is the package's planned prep and
sweep (``recurscan.kernels.delta.prep`` and ``sweep``): the same arithmetic, stage for stage
(the prep's as ``benchmarks/gluon_prep_proto.py`` forms it, the chain's as the Gluon sweep twin,
``recurscan.kernels.gluon.delta_sweep``), with wy, aqk and the row coefficients handed over in
shared memory instead of through memory.

First a Triton pass (:func:`chunk_vectors`, GATES 1 and 3) lays out what the prep would otherwise
form with layout changes: each chunk's cumulative decays (log2 units) and beta, and with GATES 3
the q and k rows' norm factors (one read of q and k; the prep then forms no Q Q^T). Then one
program, four partitions:

1. **loads** (one warp): the chunk's k, q and v tiles and its vectors by bulk copies into a ring
   of NUM_STAGES stages, a stage once both chains freed it.
2. **prep** (one warpgroup): per chunk, K K^T and Q K^T on wgmma (GATES 0 and 1: Q Q^T too, for
   the norms), the gates, the chain's coefficients (lam rk, lam rq, gam rk, lam_last), aqk, and
   the WY inverse on small products (the diagonal 16 x 16 blocks in registers, then 16 -> 32 ->
   64 through swizzled shared memory), wy = (G o Tinv) diag(beta); wy, aqk and the coefficients
   into the stage's buffers.
3. **two chains** (one warpgroup each, 64 of the 128 value columns each): S^T [64, K] float32 in
   registers; per chunk S^T to shared memory (the operand of K S and Q S), then as the twin:

       KS^T = S^T K^T;   U^T = V^T wy^T - (lam rk o KS^T) wy^T
       O^T  = lam rq o (S^T Q^T) + U^T aqk^T;   S^T <- lam_last S^T + (U^T o gam rk) K

   the outputs by bulk stores, the final state at the end.

DEEP (built, not yet measured: ``pending_gpu.sh 30``): v in one stage of its own, freed after the
chains' first products, and the outputs staged in the S^T buffers, which leaves room for a ring of
three stages, so that the prep's next chunk waits on the chains' chunk two before, not the one
before (with two stages it does, and that puts the chain's step on the prep's path).

A chunk's time would be the longer of the prep's path and the chain's step, where the planned
kernels take their sum in SM-time; measured, the two slow each other (perf-history, 2026-12-06:
on the H200 at HV64 the prep alone 2.9 us a chunk, the chains alone 2.8, together 4.1; the whole,
the pass included, 1.129 ms against the planned 1.506). PROBE (timing only; wrong outputs): 1
the chains skip their products (the loads and the prep alone), 2 the prep skips its work (the
loads and the chains), 3 the prep skips the inverse, 4 the second chain skips its products (one
chain beside the prep), 5 the chains skip the outputs' products (the state's chain beside the
prep).

    python benchmarks/gluon_fused_proto.py --out benchmarks/results/gluon_fused_proto.json
    python -m tests.helpers.sm90 gluon-fused-proto   # registers, stack and loops, offline

Scope: dense, M = 1, K = V = 128, 16-bit q, k, v, beta, float32 g, T a multiple of 64, l2norm in
the kernel, no initial state, the final state out, finite decays without resets, contraction
chunks (the prep prototype's).
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from benchmarks.gluon_prep_proto import _add, inverse_on_blocks
from recurscan.kernels.gluon.delta_sweep import _state_offsets

BT = 64
BV = 64
DEVICE = "cuda"
#: Registers a thread (setmaxnreg) of the second chain's warpgroup, the prep's and the load warp's;
#: the first chain (the default partition) takes what the launch's 128 a thread over 512 threads
#: leaves: 512 - CHAIN - PREP - LOAD, so CHAIN = (488 - PREP) / 2 gives both chains the same.
PREP_REGS = 168
CHAIN_REGS = (512 - 24 - PREP_REGS) // 2
LOAD_REGS = 24


@gluon.jit
def _loads(k_desc, q_desc, v_desc, gv_desc, k_s, q_s, v_s, gv_s, ready, empty, v_ready, v_empty, r0, col_qk, col_v,
           chunk0, n_chunks, BT: gl.constexpr, BV: gl.constexpr, NUM_STAGES: gl.constexpr, GATES: gl.constexpr,
           DEEP: gl.constexpr):
    """The load warp: chunk j's k, q and both value blocks of v (GATES 1: and its cumulative decays
    and beta) into stage j % NUM_STAGES, once both chains freed it; DEEP: v into a single stage of
    its own instead, once both chains' first products have read the chunk before's."""
    GV_BYTES: gl.constexpr = gv_desc.block_type.nbytes if GATES != 0 else 0
    V_BYTES: gl.constexpr = 2 * v_desc.block_type.nbytes
    nbytes: gl.constexpr = (k_desc.block_type.nbytes + q_desc.block_type.nbytes + GV_BYTES
                            + (0 if DEEP else V_BYTES))
    for j in range(n_chunks):
        s = j % NUM_STAGES
        bar = ready.index(s)
        mbarrier.wait(empty.index(s), ((j // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(bar, nbytes)
        r = r0 + j * BT
        tma.async_copy_global_to_shared(k_desc, [r, col_qk], bar, k_s.index(s))
        tma.async_copy_global_to_shared(q_desc, [r, col_qk], bar, q_s.index(s))
        if GATES != 0:
            tma.async_copy_global_to_shared(gv_desc, [(chunk0 + j) * (GATES + 1) * BT], bar, gv_s.index(s))
        if DEEP:
            bar = v_ready.index(0)
            mbarrier.wait(v_empty.index(0), (j & 1) ^ 1)
            mbarrier.expect(bar, V_BYTES)
            tma.async_copy_global_to_shared(v_desc, [r, col_v], bar, v_s.index(0))
            tma.async_copy_global_to_shared(v_desc, [r, col_v + BV], bar, v_s.index(1))
        else:
            tma.async_copy_global_to_shared(v_desc, [r, col_v], bar, v_s.index(2 * s))
            tma.async_copy_global_to_shared(v_desc, [r, col_v + BV], bar, v_s.index(2 * s + 1))


@gluon.jit
def _gate_vectors(g, beta, gvec, bos, i_hv, j, chunk0, o_t, HV: gl.constexpr, BT: gl.constexpr, GATES: gl.constexpr):
    """Chunk j's row vectors that the prep loads itself (one chunk ahead of their use): GATES 0 the
    decays in log2 units and beta along the rows; GATES 1 (the vectors arrive in the ring) only
    the chunk's last cumulative decay."""
    if GATES == 0:
        rows = bos + j * BT + o_t.to(gl.int64)
        b_g = gl.load(g + rows * HV + i_hv).to(gl.float32) * 1.4426950408889634
        b_beta = gl.load(beta + rows * HV + i_hv).to(gl.float32)
        gc_last = 0.0
    else:
        b_g = o_t * 0.0
        b_beta = b_g
        gc_last = gl.load(gvec + (chunk0 + j) * ((GATES + 1) * BT) + BT - 1)
    return b_g, b_beta, gc_last


@gluon.jit
def _prep(k_s, q_s, gv_s, wy_s, aqk_s, cf_s, d_s, b_s, a_s, t_s, x_s, ready, prepped, g, beta, gvec, bos, i_hv,
          chunk0, n_chunks, scale, HV: gl.constexpr, BT: gl.constexpr, NUM_STAGES: gl.constexpr, GATES: gl.constexpr,
          PROBE: gl.constexpr):
    """The prep warpgroup: chunk j's wy, aqk and row coefficients into stage j % NUM_STAGES's
    buffers (``benchmarks/gluon_prep_proto.py``'s arithmetic, form 0), then ``prepped``. GATES 1:
    the cumulative decays (log2 units) and beta from the ring's stage (``gv_s``), read along the
    rows and the columns where used, so that no vector changes layout but the norm factors; GATES 3:
    also the norm factors (no Q Q^T, no layout change)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    rowv: gl.constexpr = gl.SliceLayout(1, mma)
    colv: gl.constexpr = gl.SliceLayout(0, mma)
    line: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # the gate scan's layout
    DT: gl.constexpr = k_s.dtype
    o_t = gl.arange(0, BT, layout=rowv)
    o_c = gl.arange(0, BT, layout=colv)
    r = o_t[:, None]
    c = o_c[None, :]
    eye = r == c
    causal = r >= c
    zero = gl.zeros([BT, BT], gl.float32, mma)
    # Tinv's blocks above the diagonal, never written: zero once (the loop's first barrier orders it)
    t_s.store(gl.zeros([BT, BT], gl.float16, mma))
    n_g, n_beta, n_last = _gate_vectors(g, beta, gvec, bos, i_hv, 0, chunk0, o_t, HV, BT, GATES)
    for j in range(n_chunks):
        s = j % NUM_STAGES
        ph = (j // NUM_STAGES) & 1
        b_g, b_beta, gc_last = n_g, n_beta, n_last
        j_next = gl.minimum(j + 1, n_chunks - 1)
        n_g, n_beta, n_last = _gate_vectors(g, beta, gvec, bos, i_hv, j_next, chunk0, o_t, HV, BT, GATES)
        mbarrier.wait(ready.index(s), ph)
        if PROBE != 2:
            ks = k_s.index(s)
            qs = q_s.index(s)
            kk = warpgroup_mma(ks, ks.permute((1, 0)), zero, is_async=True)
            qk = warpgroup_mma(qs, ks.permute((1, 0)), zero, is_async=True)
            if GATES == 3:
                kk, qk = warpgroup_mma_wait(num_outstanding=0, deps=(kk, qk))
            else:
                qq = warpgroup_mma(qs, qs.permute((1, 0)), zero, is_async=True)
                kk, qk, qq = warpgroup_mma_wait(num_outstanding=0, deps=(kk, qk, qq))

            # gates, norm factors, the chain's coefficients, aqk
            if GATES == 0:
                gc = gl.convert_layout(gl.associative_scan(gl.convert_layout(b_g, line), 0, _add), rowv)
                gc_c = gl.convert_layout(gc, colv)
                beta_c = gl.convert_layout(b_beta, colv)
                gc_last = gl.sum(gl.where(o_t == BT - 1, gc, 0.0), axis=0)
            else:
                gv = gv_s.index(s)
                gc = gv.slice(0, BT).load(rowv)
                gc_c = gv.slice(0, BT).load(colv)
                b_beta = gv.slice(BT, BT).load(rowv)
                beta_c = gv.slice(BT, BT).load(colv)
            if GATES == 3:
                rk = gv.slice(2 * BT, BT).load(rowv)
                rk_c = gv.slice(2 * BT, BT).load(colv)
                rq = gv.slice(3 * BT, BT).load(rowv) * scale
            else:
                rk = gl.rsqrt(gl.sum(gl.where(eye, kk, 0.0), axis=1) + 1e-6)
                rq = gl.rsqrt(gl.sum(gl.where(eye, qq, 0.0), axis=1) + 1e-6) * scale
                rk_c = gl.convert_layout(rk, colv)
            lam = gl.exp2(gc)
            cf_s.index(4 * s).store(lam * rk)
            cf_s.index(4 * s + 1).store(lam * rq)
            cf_s.index(4 * s + 2).store(gl.exp2(gc_last - gc) * rk)
            cf_s.index(4 * s + 3).store(gl.zeros([BT], gl.float32, rowv) + gl.exp2(gc_last))
            G = gl.where(causal, gl.exp2(gc[:, None] - gc_c[None, :]), 0.0)
            aqk_s.index(s).store((G * qk * rq[:, None] * rk_c[None, :]).to(DT))
            Gb = (G * beta_c[None, :]).to(gl.float16)
            if PROBE == 3:  # the inverse skipped (timing only)
                wy_s.index(s).store(Gb.to(DT))
            else:
                # the inverse: A = diag(beta) strictLower(K K^T) for normalised keys
                A = gl.where(r > c, kk * (b_beta * rk)[:, None] * rk_c[None, :], 0.0)
                Tinv = inverse_on_blocks(A, r, c, d_s, b_s, a_s, t_s, x_s, mma, False)
                wy_s.index(s).store((Gb.to(gl.float32) * Tinv.to(gl.float32)).to(DT))
        fence_async_shared()
        gl.thread_barrier()  # every warp's buffers written (and t_s read) before the hand-over
        mbarrier.arrive(prepped.index(s), count=1)


@gluon.jit
def _chain(k_s, q_s, v_s, wy_s, aqk_s, cf_s, sa_s, o_s, ready, prepped, empty, v_ready, v_empty, o_desc, ht, r0, i_n,
           i_hv, n_chunks,
           HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
           NUM_STAGES: gl.constexpr, PART: gl.constexpr, DEEP: gl.constexpr, PROBE: gl.constexpr):
    """A chain warpgroup: value columns [PART BV, (PART + 1) BV) of the state over the program's
    chunks (the Gluon sweep twin's products and their order), its outputs by bulk stores, then
    its block of the final state."""
    DT: gl.constexpr = k_s.dtype
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    mmaK: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    a64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma64, k_width=2)
    aK: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mmaK, k_width=2)
    col64: gl.constexpr = gl.SliceLayout(0, mma64)
    rowK: gl.constexpr = gl.SliceLayout(1, mmaK)
    sa = sa_s.index(PART)
    if DEEP:  # the outputs staged in the S^T buffer, free once the chunk's products are done
        l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DT)
        o_b = sa._reinterpret(DT, [BT, BV], l_tv)
    else:
        o_b = o_s.index(PART)
    zero64 = gl.zeros([BV, BT], gl.float32, layout=mma64)
    S_t = gl.zeros([BV, K], gl.float32, layout=mmaK)
    for j in range(n_chunks):
        s = j % NUM_STAGES
        ph = (j // NUM_STAGES) & 1
        # S^T, the operand of K S and Q S, from shared memory: from registers (the twin's form) the
        # chains spill at these register splits and the kernel was slower (perf-history 2026-12-06)
        if DEEP:
            tma.store_wait(pendings=0)  # the chunk before's outputs out of the buffer
        sa.store(S_t.to(DT))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.wait(ready.index(s), ph)
        mbarrier.wait(prepped.index(s), ph)
        if DEEP:
            mbarrier.wait(v_ready.index(0), j & 1)
            v_t = v_s.index(PART).permute((1, 0))
        else:
            v_t = v_s.index(2 * s + PART).permute((1, 0))
        if PROBE != 1 and not (PROBE == 4 and PART == 1):
            w_t = wy_s.index(s).permute((1, 0))
            # Group 1: K S (the chain) and V^T wy^T.
            KSt = warpgroup_mma(sa, k_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
            Ut = warpgroup_mma(v_t, w_t, zero64, use_acc=False, is_async=True)
            KSt, Ut = warpgroup_mma_wait(num_outstanding=0, deps=(KSt, Ut))
            if DEEP:
                mbarrier.arrive(v_empty.index(0), count=1)
            # Group 2: -(lam rk o K S) wy^T onto U^T (the chain), and S^T Q^T.
            KSt = cf_s.index(4 * s).load(col64)[None, :] * KSt  # lam rk
            Ut = warpgroup_mma(gl.convert_layout((-KSt).to(DT), a64), w_t, Ut, is_async=True)
            if PROBE == 5:
                Ut = warpgroup_mma_wait(num_outstanding=0, deps=(Ut,))
            else:
                QSt = warpgroup_mma(sa, q_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
                Ut, QSt = warpgroup_mma_wait(num_outstanding=0, deps=(Ut, QSt))
            # Group 3: the next state (the chain), and the outputs onto lam rq o S^T Q^T.
            U_g = gl.convert_layout((Ut * cf_s.index(4 * s + 2).load(col64)[None, :]).to(DT), aK)  # gam rk
            lam_last = cf_s.index(4 * s + 3).slice(0, BV).load(rowK)  # BV copies of the chunk's lam_last
            S_t = warpgroup_mma(U_g, k_s.index(s), S_t * lam_last[:, None], is_async=True)
            if PROBE == 5:
                S_t = warpgroup_mma_wait(num_outstanding=0, deps=(S_t,))
                O_t = zero64
            else:
                O_t = warpgroup_mma(gl.convert_layout(Ut.to(DT), a64), aqk_s.index(s).permute((1, 0)),
                                    cf_s.index(4 * s + 1).load(col64)[None, :] * QSt, is_async=True)  # lam rq
                S_t, O_t = warpgroup_mma_wait(num_outstanding=0, deps=(S_t, O_t))
        else:
            O_t = zero64
            if DEEP:
                mbarrier.arrive(v_empty.index(0), count=1)
        mbarrier.arrive(empty.index(s), count=1)
        if not DEEP:
            tma.store_wait(pendings=0)
        o_b.permute((1, 0)).store(O_t.to(DT))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(o_desc, [r0 + j * BT, i_hv * V + PART * BV], o_b)
    tma.store_wait(pendings=0)
    gl.store(ht + (i_n * HV + i_hv) * (K * V) + _state_offsets(PART, V, 1, mmaK, BV, K), S_t)


@gluon.jit
def gluon_fused_kernel(q, k, v, g, beta, gvec, o, ht, scale, T, N, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr,
                       V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, NUM_STAGES: gl.constexpr,
                       CHAIN_REGS: gl.constexpr, PREP_REGS: gl.constexpr, LOAD_REGS: gl.constexpr,
                       GATES: gl.constexpr = 0, DEEP: gl.constexpr = False,
                       PROBE: gl.constexpr = 0):
    """Grid (N * HV,): program -> (sequence, value head), the head fastest. Dense ``q, k [N, T, H,
    K]``, ``v, o [N, T, HV, V]``, ``g, beta [N, T, HV]``; ``ht [N, HV, K, V]`` float32; with
    GATES 1 ``gvec [N, HV, T / 64, 2, 64]`` float32: each chunk's cumulative decays (log2 units) and
    its beta; GATES 3 ``[N, HV, T / 64, 4, 64]``, also the keys' and queries' norm factors
    (GATES 0: unread)."""
    gl.static_assert(BT == 64 and BV == 64 and V == 2 * BV, "chunks of 64 rows, two chains of 64 value columns")
    gl.static_assert(K == 128, "K = 128")
    pid = gl.program_id(0)
    i_hv = pid % HV
    i_n = (pid // HV).to(gl.int64)
    i_h = i_hv // (HV // H)
    bos = i_n * T
    r0 = (i_n * T).to(gl.int32)
    n_chunks = T // BT
    DT: gl.constexpr = k.dtype.element_ty
    rows = (N * T).to(gl.int32)
    l_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], DT)
    l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DT)
    l_tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], DT)
    l_vk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BV, K], DT)
    k_desc = tma.make_tensor_descriptor(k, [rows, H * K], [H * K, 1], [BT, K], l_qk)
    q_desc = tma.make_tensor_descriptor(q, [rows, H * K], [H * K, 1], [BT, K], l_qk)
    v_desc = tma.make_tensor_descriptor(v, [rows, HV * V], [HV * V, 1], [BT, BV], l_tv)
    o_desc = tma.make_tensor_descriptor(o, [rows, HV * V], [HV * V, 1], [BT, BV], l_tv)
    chunk0 = ((i_n * HV + i_hv) * n_chunks).to(gl.int32)  # the program's first chunk in gvec

    k_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], l_qk)
    q_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], l_qk)
    # DEEP: v in one stage of its own, the outputs staged in the S^T buffers: room for three stages
    v_s = gl.allocate_shared_memory(DT, [2 if DEEP else 2 * NUM_STAGES, BT, BV], l_tv)
    wy_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BT], l_tt)
    if GATES != 0:
        l_gv: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
        gv_desc = tma.make_tensor_descriptor(gvec, [rows * HV * (GATES + 1)], [1], [(GATES + 1) * BT], l_gv)
        gv_s = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, (GATES + 1) * BT], l_gv)
    else:  # placeholders, unread
        gv_desc = k_desc
        gv_s = k_s
    aqk_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BT], l_tt)
    # The inverse's scratch, swizzled: unswizzled, its rows of 128 and 32 bytes meet in one bank for
    # the small products' operand loads (the prep 40% slower on its own, perf-history 2026-12-06).
    swz2: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    swz3: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=4, max_phase=2, order=[2, 1, 0])
    plain1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    cf_s = gl.allocate_shared_memory(gl.float32, [4 * NUM_STAGES, BT], plain1)  # a stage's 4 rows
    sa_s = gl.allocate_shared_memory(DT, [2, BV, K], l_vk)
    if DEEP:  # placeholder, unread
        o_s = sa_s
    else:
        o_s = gl.allocate_shared_memory(DT, [2, BT, BV], l_tv)
    d_s = gl.allocate_shared_memory(gl.float16, [4, 16, 16], swz3)
    b_s = gl.allocate_shared_memory(gl.float16, [4, 16, 16], swz3)
    a_s = gl.allocate_shared_memory(gl.float16, [BT, BT], swz2)
    t_s = gl.allocate_shared_memory(gl.float16, [BT, BT], swz2)
    x_s = gl.allocate_shared_memory(gl.float16, [2, 16, 16], swz3)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    prepped = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(prepped.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both chains
    mbarrier.init(v_ready.index(0), count=1)
    mbarrier.init(v_empty.index(0), count=2)
    fence_async_shared()

    gl.warp_specialize([
        (_chain, (k_s, q_s, v_s, wy_s, aqk_s, cf_s, sa_s, o_s, ready, prepped, empty, v_ready, v_empty, o_desc, ht, r0,
                  i_n, i_hv, n_chunks, HV, K, V, BT, BV, NUM_STAGES, 0, DEEP, PROBE)),
        (_chain, (k_s, q_s, v_s, wy_s, aqk_s, cf_s, sa_s, o_s, ready, prepped, empty, v_ready, v_empty, o_desc, ht, r0,
                  i_n, i_hv, n_chunks, HV, K, V, BT, BV, NUM_STAGES, 1, DEEP, PROBE)),
        (_prep, (k_s, q_s, gv_s, wy_s, aqk_s, cf_s, d_s, b_s, a_s, t_s, x_s, ready, prepped, g, beta, gvec, bos, i_hv,
                 chunk0, n_chunks, scale, HV, BT, NUM_STAGES, GATES, PROBE)),
        (_loads, (k_desc, q_desc, v_desc, gv_desc, k_s, q_s, v_s, gv_s, ready, empty, v_ready, v_empty, r0, i_h * K,
                  i_hv * V, chunk0, n_chunks, BT, BV, NUM_STAGES, GATES, DEEP)),
    ], [4, 4, 1], [CHAIN_REGS, PREP_REGS, LOAD_REGS])


@triton.jit
def chunk_vectors_kernel(q, k, g, beta, out, T, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                         BT: tl.constexpr, NORMS: tl.constexpr):
    """Grid (N * T / BT, H): one (chunk, q/k head) a program; writes :func:`chunk_vectors_reference`'s
    rows for the head's HV / H value heads: the norm factors of its q and k rows once (NORMS), each
    value head's cumulative decays (log2 units, a scan within the chunk) and beta."""
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    NT = T // BT
    i_n = i_c // NT
    i_t = i_c % NT
    R: tl.constexpr = 4 if NORMS else 2
    o_t = tl.arange(0, BT)
    rows = i_n.to(tl.int64) * T + i_t * BT + o_t
    if NORMS:
        o_k = tl.arange(0, K)
        kt = tl.load(k + (rows[:, None] * H + i_h) * K + o_k[None, :]).to(tl.float32)
        rk = tl.rsqrt(tl.sum(kt * kt, axis=1) + 1e-6)
        qt = tl.load(q + (rows[:, None] * H + i_h) * K + o_k[None, :]).to(tl.float32)
        rq = tl.rsqrt(tl.sum(qt * qt, axis=1) + 1e-6)
    for i in tl.static_range(HV // H):
        hv = i_h * (HV // H) + i
        gc = tl.cumsum(tl.load(g + rows * HV + hv).to(tl.float32), axis=0) * 1.4426950408889634
        base = out + ((i_n.to(tl.int64) * HV + hv) * NT + i_t) * (R * BT)
        tl.store(base + o_t, gc)
        tl.store(base + BT + o_t, tl.load(beta + rows * HV + hv).to(tl.float32))
        if NORMS:
            tl.store(base + 2 * BT + o_t, rk)
            tl.store(base + 3 * BT + o_t, rq)


def _check_dense(**tensors) -> None:
    """The prototype's kernels index their inputs as dense row-major tensors: refuse any other by
    name (they would read other elements)."""
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name}: the prototype takes contiguous tensors, got strides {tuple(t.stride())}")


def chunk_vectors(q, k, g, beta, gates: int) -> torch.Tensor:
    """What the load warp brings a chunk beside its tiles, by :func:`chunk_vectors_kernel` (GATES 0:
    g itself, unread)."""
    if not gates:
        return g
    _check_dense(q=q, k=k, g=g, beta=beta)
    N, T, H, K = q.shape
    HV = g.shape[2]
    out = torch.empty(N, HV, T // BT, 4 if gates == 3 else 2, BT, dtype=torch.float32, device=q.device)
    chunk_vectors_kernel[(N * (T // BT), H)](q, k, g, beta, out, T, H=H, HV=HV, K=K, BT=BT, NORMS=gates == 3)
    return out


def chunk_vectors_reference(q, k, g, beta, gates: int) -> torch.Tensor:
    """What the load warp brings a chunk beside its tiles, laid out [N, HV, T / 64, rows, 64]
    float32: GATES 1 the cumulative decays within the chunk (log2 units) and beta; GATES 3 also the
    keys' and queries' norm factors 1 / sqrt(|x|^2 + 1e-6) of each value head's q/k head."""
    N, T, H, _ = q.shape
    HV = g.shape[2]
    rows = [(g.float().view(N, T // BT, BT, HV).cumsum(2) * 1.4426950408889634).view(N, T, HV), beta.float()]
    if gates == 3:
        for x in (k, q):
            sq = torch.linalg.vector_norm(x, dim=-1, dtype=torch.float32).square()
            rows.append(torch.rsqrt(sq + 1e-6).repeat_interleave(HV // H, dim=2))
    return torch.stack(rows, dim=2).view(N, T // BT, BT, len(rows), HV).permute(0, 4, 1, 3, 2).contiguous()


def gluon_fused(q, k, v, g, beta, o, ht, scale: float, probe: int = 0, prep_regs: int = PREP_REGS,
                num_stages: int = 2, gates: int = 0, gvec: torch.Tensor | None = None,
                deep: bool = False) -> None:
    """Launch the prototype on dense ``q, k [N, T, H, K]``, ``v [N, T, HV, V]``, ``g, beta [N, T,
    HV]`` into ``o`` (like v) and ``ht [N, HV, K, V]`` float32, every one contiguous. ``gates`` 1
    and 3: the chunk vectors first (:func:`chunk_vectors`, unless given as ``gvec``), for the ring."""
    from recurscan.runtime.launcher import scratch_allocator
    N, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if T % BT or K != 128 or V != 2 * BV:
        raise ValueError(f"the prototype takes T a multiple of {BT} and K = V = 128, got T {T}, K {K}, V {V}")
    _check_dense(q=q, k=k, v=v, g=g, beta=beta, o=o, ht=ht)
    if gvec is None:
        gvec = chunk_vectors(q, k, g, beta, gates)
    with scratch_allocator():
        gluon_fused_kernel[(N * HV,)](q, k, v, g, beta, gvec, o, ht, scale, T, N, H=H, HV=HV, K=K, V=V, BT=BT, BV=BV,
                                      NUM_STAGES=num_stages, CHAIN_REGS=(512 - LOAD_REGS - prep_regs) // 2,
                                      PREP_REGS=prep_regs, LOAD_REGS=LOAD_REGS, GATES=gates, DEEP=deep, PROBE=probe,
                                      num_warps=4, maxnreg=128)


def _rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    from tests.helpers.tolerances import relative_rms
    return relative_rms(got.double(), want.double())


WORKLOADS = ["gdn_b4_t8192_h16_hv64", "gdn_b4_t4096_h16"]


def compare(name: str, rep_ms: int, probes: list, prep_regs: int, gates: int, deep: bool = False,
            stages: int = 2) -> list[dict]:
    """One workload: the package's op as planned and the prototype, their outputs and final states
    against the float64 chunked oracle (and each other), each timed by graph replay; then the
    prototype's probes."""
    import triton.testing as tt

    import recurscan
    from recurscan.reference.delta import gated_delta_rule_chunked

    from benchmarks import registry

    x = registry.get(name).make_inputs(DEVICE, 0)
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    assert x["cu_seqlens"] is None and g.dtype == torch.float32 and bool(torch.isfinite(g).all())
    scale = q.shape[-1] ** -0.5
    N, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]

    def planned():
        return recurscan.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, use_qk_l2norm_in_kernel=True,
                                                output_final_state=True)

    o = torch.full_like(v, float("nan"))
    ht = torch.full((N, HV, K, V), float("nan"), device=DEVICE)

    def fused(probe=0, gvec=None):
        gluon_fused(q, k, v, g, beta, o, ht, scale, probe, prep_regs, gates=gates, gvec=gvec, deep=deep,
                    num_stages=stages)

    with torch.no_grad():
        o_ref, ht_ref = planned()
        fused()
        torch.cuda.synchronize()
        want = gated_delta_rule_chunked(*(t.double() for t in (q, k, v, g, beta)), scale=scale,
                                        use_qk_l2norm_in_kernel=True)
        row = dict(workload=name, prep_regs=prep_regs, gates=gates, deep=deep, stages=stages,
                   o_rel_rms_vs_f64=_rel_rms(o, want[0]), planned_o_rel_rms_vs_f64=_rel_rms(o_ref, want[0]),
                   state_rel_rms_vs_f64=_rel_rms(ht, want[1]), planned_state_rel_rms_vs_f64=_rel_rms(ht_ref, want[1]),
                   o_rel_rms_vs_planned=_rel_rms(o, o_ref), state_rel_rms_vs_planned=_rel_rms(ht, ht_ref))
        del want
        row["planned_ms"] = tt.do_bench_cudagraph(planned, rep=rep_ms)
        row["fused_ms"] = tt.do_bench_cudagraph(fused, rep=rep_ms)  # the chunk vectors' pass included
        gvec = chunk_vectors(q, k, g, beta, gates)
        row["chunk_vectors_ms"] = tt.do_bench_cudagraph(lambda: chunk_vectors(q, k, g, beta, gates), rep=rep_ms)
        row["fused_kernel_ms"] = tt.do_bench_cudagraph(lambda: fused(0, gvec), rep=rep_ms)
        for probe in probes:  # the kernel alone
            row[f"fused_probe{probe}_ms"] = tt.do_bench_cudagraph(lambda: fused(probe, gvec), rep=rep_ms)
    print(row, flush=True)
    return [row]


def main():
    from benchmarks.runner import save_rows
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append")
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--probe", type=int, action="append",
                    help="timing probes (1: no chain work, 2: no prep work, 3: no inverse, 4: one chain, "
                         "5: no outputs; default 1 2 3)")
    ap.add_argument("--gates", type=int, action="append",
                    help="the prep's vector forms (0: scanned; 1: chunk sums first; 3: and the norm factors)")
    ap.add_argument("--prep-regs", type=int, action="append", help=f"the prep's registers (default {PREP_REGS})")
    ap.add_argument("--deep", type=int, action="append",
                    help="1: v in one stage of its own and the outputs staged in the S^T buffers (default 0)")
    ap.add_argument("--stages", type=int, action="append", help="the ring's depth (default 2; 3 takes --deep 1)")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = [row for regs in (args.prep_regs or [PREP_REGS]) for gates in (args.gates or [1, 3])
            for deep in (args.deep or [0]) for stages in (args.stages or [2]) if not (stages == 3 and not deep)
            for name in (args.workload or WORKLOADS)
            for row in compare(name, args.rep_ms, args.probe or [1, 2, 3], regs, gates, bool(deep), stages)]
    if args.out:
        save_rows(rows, args.out, torch.device("cuda"))


if __name__ == "__main__":
    main()
