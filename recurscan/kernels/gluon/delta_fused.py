"""The delta rule's prefill with the prep beside the chain: one warp-specialised Gluon program per
(sequence, value head), GPU only (sm_90). Its twin is the planned pair of Triton kernels,
``recurscan.kernels.delta.prep.chunk_delta_prep_kernel`` and ``...sweep.chunk_delta_sweep_kernel``
(the same arithmetic: the prep's as ``kernels/gluon/wy_inverse.py`` associates the inverse, the
chain's as the Gluon sweep twin, ``kernels/gluon/delta_sweep.py``), with wy, aqk and the row
coefficients handed over in shared memory instead of through memory. Where every SM holds chains
(many sequences and value heads), the prep's SM-time then hides under the chain's, where the
planned kernels take their sum (docs/kernels-chunk-delta.md, "The fused kernel").

Before it, ``kernels/delta/chunk_vectors.py`` lays out each chunk's cumulative decays, beta and
the norm factors (one read of q and k), so that the prep forms no Q Q^T and moves no vector
between layouts, and (D_FROM_PASS) the inverses of the WY matrix's four diagonal 16 x 16 blocks.
Then one program, four partitions:

1. **loads** (one warp): the chunk's k, q and v tiles, its vectors and diagonal inverses, by bulk copies through
   descriptors over the program's own sequence (a partial last chunk reads zeros past its end),
   into a two-stage ring, a stage once both chains freed it; k, q and the vectors on one barrier
   (the prep's), v on another (the chains wait on both).
2. **prep** (one warpgroup): K K^T and Q K^T on wgmma, the gates, the chain's coefficients (lam rk,
   lam rq, gam rk, lam_last), aqk, and the WY inverse (``inverse_on_blocks``), wy = (G o Tinv)
   diag(beta); wy, aqk and the coefficients into the stage's buffers. The inverse's diagonal 16 x 16
   blocks come from the pre-pass (D_FROM_PASS, planned), copied with the chunk's k and q.
3. **two chains** (one warpgroup each, 64 of the 128 value columns each): S^T [64, K] float32 in
   registers, and per chunk, as the sweep twin::

       KS^T = S^T K^T;   U^T = V^T wy^T - (lam rk o KS^T) wy^T
       O^T  = lam rq o (S^T Q^T) + U^T aqk^T;   S^T <- lam_last S^T + (U^T o gam rk) K

   S^T and U^T reach the products through shared memory (from registers the chains spill at their
   160 registers), the outputs leave by bulk stores (clipped at the sequence's end), and at the
   end the final state (or the cache slot's) and a flag for each row of S^T (a value column of the
   state): 1 where it came out non-finite. U^T is staged in a buffer of its own, not the outputs',
   so that staging it waits for no output store.

A flagged value column is computed again by the token loop (launch/delta_fused.py; a column's
state and outputs read no other column): a non-finite input, growth past float32, or a chunk the
pre-pass marked (a reset, beta < 0, a step that is no contraction) leaves it non-finite here. With
a cache, such a column's slot entry is left for the token loop to read and write.

Scope (``plan.delta.fused_prefill_scope``; the launch layer checks the call): GDN (M = 1), l2norm in
the kernel, 16-bit q, k, v, K = V = 128, dense or varlen, an initial state or none, the final state
or none, or a state cache in place (USE_CACHE; ``plan.delta.FUSED_PREFILL_CACHE``); no chunk
states or kept prep (training).
"""
from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .delta_sweep import _sequence_bounds, _state_offsets
from .wy_inverse import inverse_on_blocks

BT = 64
BV = 64
NUM_STAGES = 2
#: Registers a thread (setmaxnreg) of the prep's warpgroup, the second chain's and the load warp's;
#: the first chain (the default partition) takes what the launch's 128 a thread over 512 threads
#: (the load warp padded to its warpgroup) leaves, the same as the second: 512 - 168 - 160 - 24.
PREP_REGS = 168
CHAIN_REGS = 160
LOAD_REGS = 24
#: The same for the PIPELINED form (``plan.delta.FUSED_PIPELINED``). With the chains at 160 ptxas
#: serialises every wgmma of the kernel (C7512, "insufficient register resources": a wait after
#: each 64x64x16 product, the chains' and the prep's); it pipelines them once both chains have 176
#: (offline, sm_90), and at 184 / 120 no form spills, the prep holding one [64, 64] product at a
#: time and reading wy's column vectors again after the inverse (PIPELINED; the splits tried:
#: docs/perf-history.md, 2026-12-08).
PIPELINED_PREP_REGS = 120
PIPELINED_CHAIN_REGS = 184
MAXNREG = 128

#: A timing probe (``RECURSCAN_FUSED_PROBE`` when this module is imported; only
#: benchmarks/gpu_fused_probe.py sets it): 0 the kernel; 1 the inverse's diagonal blocks neither
#: inverted nor copied from the pass (D read as whatever its buffer holds); 2 no inverse at all
#: (Tinv = I); 3 no aqk formed or stored (the chains read a stale tile); 4 no prep work (the prep
#: waits for a chunk's tiles and hands it over, the chains read stale wy, aqk and coefficients);
#: 5 no chain work (each chain waits for a chunk's tiles and its prep and frees the stage: the
#: period is the prep's and the loads' alone; no outputs written).
#: Probes 1-5 compute wrong outputs: for timing only. They say how the ring's period follows the
#: prep's path (docs/kernels-chunk-delta.md, "The fused kernel").
_PROBE = os.environ.get("RECURSCAN_FUSED_PROBE", "0")
if _PROBE not in ("0", "1", "2", "3", "4", "5"):
    raise ValueError(f"RECURSCAN_FUSED_PROBE: expected 0, 1, 2, 3, 4 or 5, got {_PROBE!r}")
PROBE = gl.constexpr(int(_PROBE))


@gluon.jit
def _chunks_to_run(n_chunks, state_indices, n_slots, USE_CACHE: gl.constexpr, HV: gl.constexpr):
    """The chunks the loads and the prep run: none for a padding slot's program (formed in each
    partition: passed in, the count went through local memory to reach the load warp)."""
    if USE_CACHE:
        slot = gl.load(state_indices + gl.program_id(0) // HV)
        n_chunks = gl.where((slot < 0) | (slot >= n_slots), 0, n_chunks)
    return n_chunks


@gluon.jit
def _loads(k_desc, q_desc, v_desc, gv_desc, d_desc, k_s, q_s, v_s, gv_s, dv_s, ready, ready_v, empty, h0_read, col_qk,
           col_v, vec0, state_indices, n_slots, n_chunks, USE_CACHE: gl.constexpr, HV: gl.constexpr, BT: gl.constexpr,
           BV: gl.constexpr, NUM_STAGES: gl.constexpr, HAS_H0: gl.constexpr, D_FROM_PASS: gl.constexpr):
    """The load warp: chunk j's k, q, both value blocks of v and its vectors (at ``vec0 + j HV 4
    BT`` floats) into stage j % NUM_STAGES, once both chains freed it (HAS_H0: the first once both
    chains read their initial state, or the cache slot's, out of the k and q stages). What the prep
    reads (k, q, the vectors) completes ``ready`` and v ``ready_v``, so that the prep starts on a
    chunk without waiting for its v; the chains wait on both. D_FROM_PASS: the pass's diagonal
    inverses too (rows ``vec0 / 4 + j HV BT`` of ``d_desc``), with k and q."""
    kq_bytes: gl.constexpr = k_desc.block_type.nbytes + q_desc.block_type.nbytes + gv_desc.block_type.nbytes + \
        (d_desc.block_type.nbytes if D_FROM_PASS else 0)
    v_bytes: gl.constexpr = 2 * v_desc.block_type.nbytes
    if HAS_H0:
        mbarrier.wait(h0_read.index(0), 0)
    for j in range(_chunks_to_run(n_chunks, state_indices, n_slots, USE_CACHE, HV)):
        s = j % NUM_STAGES
        bar = ready.index(s)
        bar_v = ready_v.index(s)
        mbarrier.wait(empty.index(s), ((j // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(bar, kq_bytes)
        mbarrier.expect(bar_v, v_bytes)
        r = j * BT
        tma.async_copy_global_to_shared(k_desc, [r, col_qk], bar, k_s.index(s))
        tma.async_copy_global_to_shared(q_desc, [r, col_qk], bar, q_s.index(s))
        tma.async_copy_global_to_shared(gv_desc, [vec0 + j * (HV * 4 * BT)], bar, gv_s.index(s))
        if D_FROM_PASS:
            tma.async_copy_global_to_shared(d_desc, [vec0 // 4 + j * (HV * BT), 0], bar, dv_s.index(s))
        tma.async_copy_global_to_shared(v_desc, [r, col_v], bar_v, v_s.index(2 * s))
        tma.async_copy_global_to_shared(v_desc, [r, col_v + BV], bar_v, v_s.index(2 * s + 1))


@gluon.jit
def _prep(k_s, q_s, gv_s, dv_s, wy_s, aqk_s, cf_s, d_s, b_s, a_s, t_s, x_s, ready, prepped, state_indices, n_slots,
          n_chunks, scale, USE_CACHE: gl.constexpr, HV: gl.constexpr, BT: gl.constexpr, NUM_STAGES: gl.constexpr,
          D_FROM_PASS: gl.constexpr, PIPELINED: gl.constexpr = False):
    """The prep warpgroup: chunk j's wy, aqk and row coefficients (lam rk, lam rq, gam rk, and
    lam_last in 64 copies) into stage j % NUM_STAGES's buffers, then ``prepped``. The vectors are
    read from the stage along the rows and along the columns where each is used. D_FROM_PASS: the
    inverse's diagonal blocks are the pass's (``dv_s``), copied into its scratch, not computed.
    PIPELINED (with the blocks from the pass): Q K^T and aqk first, then K K^T (one [64, 64]
    accumulator at a time), and wy's G and beta columns read again from the stage after the
    inverse, so that the prep fits PIPELINED_PREP_REGS without spills."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    rowv: gl.constexpr = gl.SliceLayout(1, mma)
    colv: gl.constexpr = gl.SliceLayout(0, mma)
    one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    rows16: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])  # a [64, 16] fp16 tile's copy
    DT: gl.constexpr = k_s.dtype
    PASS_BLOCKS: gl.constexpr = D_FROM_PASS and PROBE != 1  # the diagonal blocks' inverses are the pass's
    ONE_PRODUCT: gl.constexpr = PIPELINED and PASS_BLOCKS  # one [64, 64] accumulator at a time
    o_t = gl.arange(0, BT, layout=rowv)
    o_c = gl.arange(0, BT, layout=colv)
    r = o_t[:, None]
    c = o_c[None, :]
    causal = r >= c
    zero = gl.zeros([BT, BT], gl.float32, mma)
    # Tinv's blocks above the diagonal, never written: zeroed once (the loop's first barrier orders it)
    t_s.store(gl.zeros([BT, BT], gl.float16, mma))
    for j in range(_chunks_to_run(n_chunks, state_indices, n_slots, USE_CACHE, HV)):
        s = j % NUM_STAGES
        mbarrier.wait(ready.index(s), (j // NUM_STAGES) & 1)
        if PROBE == 4:
            gl.thread_barrier()
            mbarrier.arrive(prepped.index(s), count=1)
        else:
            ks = k_s.index(s)
            if ONE_PRODUCT:
                qk = warpgroup_mma(q_s.index(s), ks.permute((1, 0)), zero, is_async=True)
                qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk,))
            else:
                kk = warpgroup_mma(ks, ks.permute((1, 0)), zero, is_async=True)
                qk = warpgroup_mma(q_s.index(s), ks.permute((1, 0)), zero, is_async=True)
                kk, qk = warpgroup_mma_wait(num_outstanding=0, deps=(kk, qk))

            gv = gv_s.index(s)
            gc_last = gl.sum(gv.slice(BT - 1, 1).load(one), axis=0)  # the decay across the chunk's rows
            gc = gv.slice(0, BT).load(rowv)
            gc_c = gv.slice(0, BT).load(colv)
            b_beta = gv.slice(BT, BT).load(rowv)
            beta_c = gv.slice(BT, BT).load(colv)
            rk = gv.slice(2 * BT, BT).load(rowv)
            rk_c = gv.slice(2 * BT, BT).load(colv)
            rq = gv.slice(3 * BT, BT).load(rowv) * scale
            lam = gl.exp2(gc)
            cf_s.index(4 * s).store(lam * rk)
            cf_s.index(4 * s + 1).store(lam * rq)
            cf_s.index(4 * s + 2).store(gl.exp2(gc_last - gc) * rk)
            cf_s.index(4 * s + 3).store(gl.zeros([BT], gl.float32, rowv) + gl.exp2(gc_last))
            G = gl.where(causal, gl.exp2(gc[:, None] - gc_c[None, :]), 0.0)
            if PROBE != 3:
                aqk_s.index(s).store((G * qk * rq[:, None] * rk_c[None, :]).to(DT))
            if not PASS_BLOCKS:
                Gb = (G * beta_c[None, :]).to(gl.float16)
            if ONE_PRODUCT:
                kk = warpgroup_mma(ks, ks.permute((1, 0)), zero, is_async=True)
                kk = warpgroup_mma_wait(num_outstanding=0, deps=(kk,))
            # the inverse: A = diag(beta) strictLower(K K^T) for normalised keys; with the diagonal
            # blocks' inverses given, only A's blocks below them are read, so it goes unmasked
            A = kk * (b_beta * rk)[:, None] * rk_c[None, :]
            if not PASS_BLOCKS:
                A = gl.where(r > c, A, 0.0)
            if PROBE == 2:
                Tinv = gl.where(r == c, 1.0, 0.0) + A * 0.0
            else:
                if PASS_BLOCKS:
                    d_s.reshape([BT, 16]).store(dv_s.index(s).load(rows16))
                Tinv = inverse_on_blocks(A, r, c, d_s, b_s, a_s, t_s, x_s, mma, False, PROBE == 1 or D_FROM_PASS)
            if ONE_PRODUCT:  # G and beta's columns read again from the stage, not held across the inverse
                G = gl.where(causal, gl.exp2(gc[:, None] - gv.slice(0, BT).load(colv)[None, :]), 0.0)
                wy_s.index(s).store((G * gv.slice(BT, BT).load(colv)[None, :] * Tinv.to(gl.float32)).to(DT))
            elif PASS_BLOCKS:
                wy_s.index(s).store((G * beta_c[None, :] * Tinv.to(gl.float32)).to(DT))
            else:  # G o beta held across the inverse in fp16: the registers of the form inverting its own blocks
                wy_s.index(s).store((Gb.to(gl.float32) * Tinv.to(gl.float32)).to(DT))
            fence_async_shared()
            gl.thread_barrier()  # every warp's buffers written (and t_s read) before the hand-over
            mbarrier.arrive(prepped.index(s), count=1)


@gluon.jit
def _staged_initial_state(stage, h0_pair, s0_k, s0_v, layout: gl.constexpr, PART: gl.constexpr, BV: gl.constexpr,
                          K: gl.constexpr):
    """S^T [BV, K] float32 in ``layout`` of value block PART of the pair's initial state (``h0_pair``,
    strides ``s0_k``, ``s0_v``, any float dtype), through ``stage`` (a k or q ring stage pair, 32 KB, not yet loaded):
    read in halves of K in a layout of whole value runs, stored, and read back in ``layout``. Read
    straight into the products' layout its offsets take 64 registers a thread beside it, which the
    chain's 160 do not hold."""
    runs: gl.constexpr = gl.BlockedLayout([4, 1], [16, 2], [1, 4], [0, 1])  # [BV, K / 2]: 4 value rows a thread
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    buf = stage._reinterpret(gl.float32, [BV, K], flat)
    o_v = PART * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, runs))
    for half in gl.static_range(2):
        o_k = half * (K // 2) + gl.arange(0, K // 2, layout=gl.SliceLayout(0, runs))
        tile = gl.load(h0_pair + o_v[:, None] * s0_v + o_k[None, :] * s0_k)
        buf.slice(half * (K // 2), K // 2, 1).store(tile.to(gl.float32))
    gl.thread_barrier()
    S_t = buf.load(layout)
    gl.thread_barrier()  # every warp has read it before the loads may overwrite the stage
    return S_t


@gluon.jit
def _cache_slot(cache, state_indices, n_slots, pid, s0_n, s0_h, HV: gl.constexpr):
    """(pad, the pair's state in its slot) for program ``pid``: a slot outside [0, n_slots) is
    padding (its pointer unused)."""
    slot = gl.load(state_indices + pid // HV).to(gl.int64)
    pad = (slot < 0) | (slot >= n_slots)
    return pad, cache + gl.where(pad, 0, slot) * s0_n + (pid % HV) * s0_h


@gluon.jit
def _program_id_again():
    """The program's id, read again where used (an opaque read, so that the compiler holds no index
    derived from it across the chain's loop: at the chain's 160 registers, one such index went
    through local memory)."""
    return gl.inline_asm_elementwise("mov.u32 $0, %ctaid.x;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _chain(k_s, q_s, v_s, wy_s, aqk_s, cf_s, sa_s, o_s, ready, ready_v, prepped, empty, h0_read, o_desc, h0,
           ht, flags, state_indices, n_slots, n_chunks, s0_n, s0_h, s0_k, s0_v, ht_n, ht_h,
           HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
           NUM_STAGES: gl.constexpr, PART: gl.constexpr, HAS_H0: gl.constexpr, STORE_FINAL: gl.constexpr,
           USE_CACHE: gl.constexpr):
    """A chain warpgroup: value columns [PART BV, (PART + 1) BV) of the state over the sequence's
    chunks (the Gluon sweep twin's products and their order), its outputs by bulk stores, then its
    block of the final state and its rows' flags. USE_CACHE: the state is the cache slot's (``h0``
    the cache); a padding slot's program writes zero outputs and touches no state, and a row whose
    state came out non-finite is left in the slot for the token loop."""
    DT: gl.constexpr = k_s.dtype
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    mmaK: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    a64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma64, k_width=2)
    aK: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mmaK, k_width=2)
    col64: gl.constexpr = gl.SliceLayout(0, mma64)
    rowK: gl.constexpr = gl.SliceLayout(1, mmaK)
    sa = sa_s.index(PART)
    o_b = o_s.index(PART)
    u_b = o_s.index(2 + PART)
    zero64 = gl.zeros([BV, BT], gl.float32, layout=mma64)
    S_t = gl.zeros([BV, K], gl.float32, layout=mmaK)
    pad = False
    if HAS_H0 or USE_CACHE:
        pid = gl.program_id(0)
        if USE_CACHE:
            pad, h0_pair = _cache_slot(h0, state_indices, n_slots, pid, s0_n, s0_h, HV)
        else:
            h0_pair = h0 + (pid // HV).to(gl.int64) * s0_n + (pid % HV) * s0_h
        if not pad:
            S_t = _staged_initial_state(k_s if PART == 0 else q_s, h0_pair, s0_k, s0_v, mmaK, PART, BV, K)
        mbarrier.arrive(h0_read.index(0), count=1)
    if pad:  # zero outputs over the sequence, no state access (the loads and the prep run no chunk)
        o_b.store(gl.zeros([BT, BV], DT, layout=mma64))
        fence_async_shared()
        gl.thread_barrier()
        for j in range(n_chunks):
            tma.async_copy_shared_to_global(o_desc, [j * BT, PART * BV], o_b)
        n_chunks = 0
    if PROBE == 5:  # no chain work: each chunk's stage freed once its tiles and prep are in
        for j in range(n_chunks):
            s = j % NUM_STAGES
            ph = (j // NUM_STAGES) & 1
            mbarrier.wait(ready.index(s), ph)
            mbarrier.wait(ready_v.index(s), ph)
            mbarrier.wait(prepped.index(s), ph)
            mbarrier.arrive(empty.index(s), count=1)
        n_chunks = 0
    for j in range(n_chunks):
        s = j % NUM_STAGES
        ph = (j // NUM_STAGES) & 1
        sa.store(S_t.to(DT))  # S^T, the operand of K S and Q S
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.wait(ready.index(s), ph)
        mbarrier.wait(ready_v.index(s), ph)
        mbarrier.wait(prepped.index(s), ph)
        w_t = wy_s.index(s).permute((1, 0))
        # Group 1: K S (the chain) and V^T wy^T.
        KSt = warpgroup_mma(sa, k_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
        Ut = warpgroup_mma(v_s.index(2 * s + PART).permute((1, 0)), w_t, zero64, use_acc=False, is_async=True)
        KSt, Ut = warpgroup_mma_wait(num_outstanding=0, deps=(KSt, Ut))
        # Group 2: -(lam rk o K S) wy^T onto U^T (the chain), and S^T Q^T.
        KSt = cf_s.index(4 * s).load(col64)[None, :] * KSt  # lam rk
        Ut = warpgroup_mma(gl.convert_layout((-KSt).to(DT), a64), w_t, Ut, is_async=True)
        QSt = warpgroup_mma(sa, q_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
        Ut, QSt = warpgroup_mma_wait(num_outstanding=0, deps=(Ut, QSt))
        # Group 3: the next state (the chain), and the outputs onto lam rq o S^T Q^T; U^T, the
        # outputs' operand, staged in its own buffer (whose last reader, chunk j - 1's products,
        # every warp waited on before the barrier after S^T's store).
        u_b.permute((1, 0)).store(Ut.to(DT))
        U_g = gl.convert_layout((Ut * cf_s.index(4 * s + 2).load(col64)[None, :]).to(DT), aK)  # gam rk
        fence_async_shared()
        gl.thread_barrier()
        lam_last = cf_s.index(4 * s + 3).slice(0, BV).load(rowK)  # BV copies of the chunk's lam_last
        S_t = warpgroup_mma(U_g, k_s.index(s), S_t * lam_last[:, None], is_async=True)
        O_t = warpgroup_mma(u_b.permute((1, 0)), aqk_s.index(s).permute((1, 0)),
                            cf_s.index(4 * s + 1).load(col64)[None, :] * QSt, is_async=True)  # lam rq
        S_t, O_t = warpgroup_mma_wait(num_outstanding=0, deps=(S_t, O_t))
        mbarrier.arrive(empty.index(s), count=1)
        tma.store_wait(pendings=0)  # the chunk before's outputs have left their buffer (a barrier after)
        o_b.permute((1, 0)).store(O_t.to(DT))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(o_desc, [j * BT, PART * BV], o_b)
    tma.store_wait(pendings=0)
    pid = _program_id_again()
    i_hv = pid % HV
    i_n = (pid // HV).to(gl.int64)
    bad = gl.max(gl.where(S_t * 0.0 == 0.0, 0, 1), axis=1)  # [BV] along the state's value rows
    if USE_CACHE:
        pad, slot_pair = _cache_slot(h0, state_indices, n_slots, pid, s0_n, s0_h, HV)
        o_s0 = _state_offsets(PART, s0_k, s0_v, mmaK, BV, K)
        gl.store(slot_pair + o_s0, S_t.to(h0.dtype.element_ty), mask=(bad == 0)[:, None] & (o_s0 >= 0) & (not pad))
        bad = gl.where(pad, 0, bad)
    elif STORE_FINAL:
        gl.store(ht + i_n * ht_n + i_hv * ht_h + _state_offsets(PART, V, 1, mmaK, BV, K), S_t)
    o_v = PART * BV + gl.arange(0, BV, layout=rowK)
    gl.store(flags + (i_n * HV + i_hv) * V + o_v, bad)


@gluon.jit
def gluon_fused_prefill_kernel(q, k, v, vec, dinv, o, h0, ht, flags, cu_seqlens, state_indices, scale, T, n_vec,
                               n_slots, s0_n, s0_h, s0_k, s0_v, o_st, o_sh, ht_n, ht_h,
                               H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                               BT: gl.constexpr, BV: gl.constexpr, NUM_STAGES: gl.constexpr,
                               IS_VARLEN: gl.constexpr, HAS_H0: gl.constexpr, STORE_FINAL: gl.constexpr,
                               USE_CACHE: gl.constexpr,
                               CHAIN_REGS: gl.constexpr, PREP_REGS: gl.constexpr, LOAD_REGS: gl.constexpr,
                               D_FROM_PASS: gl.constexpr = False, PIPELINED: gl.constexpr = False):
    """Grid (N * HV,): program -> (sequence, value head), the head fastest. ``q, k [B, T, H, K]``,
    ``v [B, T, HV, V]`` contiguous (varlen: B = 1 and ``cu_seqlens [N + 1]``, each sequence's
    bounds clamped to [0, T]); ``vec`` the pre-pass's vectors (kernels/delta/chunk_vectors.py), ``n_vec``
    floats (< 2^31: the bulk copies' coordinates are int32);
    ``o`` like v through its strides (token ``o_st``, head ``o_sh``, the batch's T token strides);
    ``h0`` (HAS_H0) read through strides ``s0_*``; ``ht`` float32 (STORE_FINAL) with rows of V,
    sequence and head strides ``ht_n``, ``ht_h``; ``flags [N * HV, V]`` int32, each value row's
    flag (1: its state came out non-finite). USE_CACHE: ``h0`` is the state cache ``[n_slots, HV,
    K, V]`` (any float dtype, strides ``s0_*``), read and written at ``state_indices[n]``; a slot
    outside [0, n_slots) is padding: zero outputs, the cache untouched, no flag. D_FROM_PASS: ``dinv``
    the pass's diagonal inverses ``[n_vec / 4, 16]`` float16 (else unread). PIPELINED: the prep in
    the form that fits PIPELINED_PREP_REGS (:func:`_prep`), for the registers given with it."""
    gl.static_assert(BT == 64 and BV == 64 and V == 2 * BV, "chunks of 64 rows, two chains of 64 value columns")
    gl.static_assert(K == 128, "K = 128")
    pid = gl.program_id(0)
    i_hv = pid % HV
    i_n = (pid // HV).to(gl.int64)
    i_h = i_hv // (HV // H)
    bos, eos = _sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN)
    L = eos - bos
    n_chunks = ((L + BT - 1) // BT).to(gl.int32)
    # The sequence's chunk j has the pre-pass's slot (bos + j BT) // BT + i_n = slot0 + j
    # (kernels/delta/common.py's _chunk_slot); its vectors start vec0 + j HV 4 BT floats in.
    vec0 = (((bos // BT + i_n) * HV + i_hv) * (4 * BT)).to(gl.int32)
    DT: gl.constexpr = k.dtype.element_ty
    # Descriptors over this sequence's rows: a tile past its end reads zeros, a store stops there.
    rows = gl.maximum(L, 1).to(gl.int32)
    l_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], DT)
    l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DT)
    l_tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], DT)
    l_vk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BV, K], DT)
    l_gv: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
    k_desc = tma.make_tensor_descriptor(k + bos * (H * K), [rows, H * K], [H * K, 1], [BT, K], l_qk)
    q_desc = tma.make_tensor_descriptor(q + bos * (H * K), [rows, H * K], [H * K, 1], [BT, K], l_qk)
    v_desc = tma.make_tensor_descriptor(v + bos * (HV * V), [rows, HV * V], [HV * V, 1], [BT, BV], l_tv)
    o_desc = tma.make_tensor_descriptor(o + bos * o_st + i_hv * o_sh, [rows, V], [o_st, 1], [BT, BV], l_tv)
    gv_desc = tma.make_tensor_descriptor(vec, [n_vec], [1], [4 * BT], l_gv)

    k_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], l_qk)
    q_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], l_qk)
    v_s = gl.allocate_shared_memory(DT, [2 * NUM_STAGES, BT, BV], l_tv)
    wy_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BT], l_tt)
    gv_s = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, 4 * BT], l_gv)
    aqk_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BT], l_tt)
    if D_FROM_PASS:
        l_d: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, 16], gl.float16)
        d_desc = tma.make_tensor_descriptor(dinv, [n_vec // 4, 16], [16, 1], [BT, 16], l_d)
        dv_s = gl.allocate_shared_memory(gl.float16, [NUM_STAGES, BT, 16], l_d)
    else:
        d_desc = gv_desc  # not read
        dv_s = gv_s
    # The inverse's scratch, swizzled: unswizzled, its rows of 128 and 32 bytes meet in one bank for
    # the small products' operand loads (perf-history 2026-12-06).
    swz2: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    swz3: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=4, max_phase=2, order=[2, 1, 0])
    plain1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    cf_s = gl.allocate_shared_memory(gl.float32, [4 * NUM_STAGES, BT], plain1)  # a stage's 4 rows
    sa_s = gl.allocate_shared_memory(DT, [2, BV, K], l_vk)
    o_s = gl.allocate_shared_memory(DT, [4, BT, BV], l_tv)  # each chain's outputs (0, 1), then its U^T (2, 3)
    d_s = gl.allocate_shared_memory(gl.float16, [4, 16, 16], swz3)
    b_s = gl.allocate_shared_memory(gl.float16, [4, 16, 16], swz3)
    a_s = gl.allocate_shared_memory(gl.float16, [BT, BT], swz2)
    t_s = gl.allocate_shared_memory(gl.float16, [BT, BT], swz2)
    x_s = gl.allocate_shared_memory(gl.float16, [2, 16, 16], swz3)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    ready_v = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    h0_read = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    prepped = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(ready_v.index(i), count=1)
        mbarrier.init(prepped.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both chains
    mbarrier.init(h0_read.index(0), count=2)
    fence_async_shared()

    gl.warp_specialize([
        (_chain, (k_s, q_s, v_s, wy_s, aqk_s, cf_s, sa_s, o_s, ready, ready_v, prepped, empty, h0_read, o_desc,
                  h0, ht, flags, state_indices, n_slots, n_chunks, s0_n, s0_h, s0_k, s0_v, ht_n, ht_h, HV, K, V, BT, BV,
                  NUM_STAGES, 0, HAS_H0, STORE_FINAL, USE_CACHE)),
        (_chain, (k_s, q_s, v_s, wy_s, aqk_s, cf_s, sa_s, o_s, ready, ready_v, prepped, empty, h0_read, o_desc,
                  h0, ht, flags, state_indices, n_slots, n_chunks, s0_n, s0_h, s0_k, s0_v, ht_n, ht_h, HV, K, V, BT, BV,
                  NUM_STAGES, 1, HAS_H0, STORE_FINAL, USE_CACHE)),
        (_prep, (k_s, q_s, gv_s, dv_s, wy_s, aqk_s, cf_s, d_s, b_s, a_s, t_s, x_s, ready, prepped,
                 state_indices, n_slots, n_chunks, scale, USE_CACHE, HV, BT, NUM_STAGES, D_FROM_PASS, PIPELINED)),
        (_loads, (k_desc, q_desc, v_desc, gv_desc, d_desc, k_s, q_s, v_s, gv_s, dv_s, ready, ready_v, empty, h0_read,
                  i_h * K, i_hv * V, vec0, state_indices, n_slots, n_chunks, USE_CACHE, HV, BT, BV, NUM_STAGES,
                  HAS_H0 or USE_CACHE, D_FROM_PASS)),
    ], [4, 4, 1], [CHAIN_REGS, PREP_REGS, LOAD_REGS])
