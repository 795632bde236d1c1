"""The GLA backward's reverse sweep on the group prep's scores, warp-specialised: the same arithmetic
as the Gluon twin :func:`recurscan.kernels.gluon.gla_backward_sweep.gluon_gla_bwd_sweep_kernel`
(so the Triton kernel's bits, which that twin has), on three partitions of one program:

1. the **chain** (the default partition, one warpgroup): dS'^T [BV, K] float32 in registers; per
   chunk, last to first, it writes dS' leaving the chunk into a shared-memory buffer (two of them,
   one for each outputs warpgroup), stores it from there to its chunk-state row of ``dstates`` by
   a bulk copy, hands the buffer to the chunk's outputs warpgroup, then forms the next state,
   dS'^T <- lam_C dS'^T + (lam scale o dO^T) Q;
2. the **outputs** (two warpgroups, alternate chunks each): per chunk, (K dS')^T from the handed-
   over buffer, then dV^T (the calm product, or dO^T (G o scores) with the gate tile formed in
   registers), stored by a bulk copy;
3. the **loads** (one warp): the chunk's k, q, dO and scores by bulk copies into a ring of
   NUM_STAGES stages, each freed when the chain and the chunk's outputs warpgroup are done with it.

With SSD_GRADS (Mamba2 SSD without a gate z; the Triton kernel's flag) the ring also holds x's
tiles; the outputs write dx = dt o dV + D o dO (16-bit, from a staging of their own) and dt's
share sum_p x o dV in dV's place, and the chain forms D's sums (x o dO over the rows) while its
product runs.

The twin's timing probes put its outputs at 2.34 us a chunk and its chain at 0.74 (SSD B1 T16384,
results/gpu_gla_reverse_probe_4c4f11f.json): the forward sweep's shape, whose split over two outputs
warpgroups took its chunk from 1.53 to 1.32 us (docs/kernels-gla-plan.md, "The next GPU session", 2c).

Scope: the twin's (``launch.gla``'s ``_reverse_sweep_twin`` checks it), taken where
``plan.gla.GLUON_GLA_REVERSE_SPECIALIZED`` is on. Takes the twin's arguments, so a launch record
names either kernel; launched with ``maxnreg`` (:data:`recurscan.launch.delta.SPECIALIZED_MAXNREG`)
over its 16 warps (the load warp padded to its warpgroup).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .delta_backward_sweep import _state_offsets
from .gla_backward_sweep import _calm_dv, _row_coefficients, _sequence_operands, _stormy_gate_tile
from .gla_sweep_specialized import COEF_PREFETCH, _handover_barriers, _prefetch_2kb

#: Registers a thread of each outputs warpgroup and of the load warp (setmaxnreg); the chain, the
#: default partition, takes what the kernel's cap leaves (512 - 2 x 160 - 24 = 168): offline for
#: sm_90, fewer for the outputs spill theirs and more spill the chain's.
OUTPUT_REGS = gl.constexpr(160)
#: The same with SSD_GRADS, whose outputs also hold x's tile and D's sums (the chain then has
#: 512 - 2 x 168 - 24 = 152).
SSD_OUTPUT_REGS = gl.constexpr(168)
LOAD_REGS = gl.constexpr(24)


@gluon.jit
def _program(H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
             BV: gl.constexpr):
    """The program's (sequence, value head, value block) and its tiles' columns (k and q, dO and
    dV, the scores), from its id: each partition forms them itself rather than carrying them
    across the partitions' split."""
    NV: gl.constexpr = V // BV
    pid = gl.program_id(0)
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_n = pid // (NV * HV)
    i_h = i_hv // (HV // H)
    return i_n, i_hv, i_v, i_h * K, i_hv * V + i_v * BV, i_h * BT


@gluon.jit
def _chain(p, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
           CW: gl.constexpr, NUM_STAGES: gl.constexpr, HAS_DHT: gl.constexpr, STORE_DH0: gl.constexpr,
           SSD_GRADS: gl.constexpr, HAS_D: gl.constexpr, D_PER_CHANNEL: gl.constexpr):
    """The default partition: dS' over the program's chunks, last to first; each chunk's leaving
    dS' to its chunk-state row and to the chunk's outputs warpgroup; dh0 at the end."""
    (k_s, q_s, do_s, a_s, hs_s, g_s, dv_s, x_s, ready, empty, s_ready, s_empty, k_desc, q_desc, do_desc,
     s_desc, dv_desc, ds_desc, x_desc, coef, dht, dh0, scale, bos, L, n_chunks, cs0, n_cs_rows, step, D, dstep,
     dD) = p
    i_n, i_hv, i_v, col_qk, col_v, col_s = _program(H, HV, K, V, BT, BV)
    DT: gl.constexpr = k_s.dtype
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    mmaK: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    aK: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mmaK, k_width=2)
    col64: gl.constexpr = gl.SliceLayout(0, mma64)
    blk: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])
    p_h = (i_n.to(gl.int64) * HV + i_hv) * (K * V)
    if HAS_DHT:  # loaded in a layout of its own and converted once
        dS_t = gl.convert_layout(gl.load(dht + p_h + _state_offsets(i_v, blk, BV, K, V)), mmaK)
    else:
        dS_t = gl.zeros([BV, K], gl.float32, layout=mmaK)
    compact: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # a row vector, one register a thread
    o_t = gl.arange(0, BT, layout=compact)
    if SSD_GRADS and HAS_D:  # D's sums over the rows (x o dO), formed while the chain's product runs
        dD_sum = gl.zeros([BV], gl.float32, layout=gl.SliceLayout(1, mma64))
    for j in range(n_chunks):
        s = j % NUM_STAGES
        b = j % 2
        c = n_chunks - 1 - j
        # lam scale and lam_C (the twin's coefficient loads, the others unused), before the waits
        _, lam_s, _, _, _, lam_last, _ = _row_coefficients(coef, bos, L, c, i_n, i_hv, o_t, HV, BT, CW)
        # dS' leaving chunk c: to its chunk-state row, and to the outputs (the buffer they freed two
        # chunks ago, whose own store has drained: one bulk store a chunk, so at most one pending).
        S_b = dS_t.to(DT)
        mbarrier.wait(s_empty.index(b), ((j // 2) & 1) ^ 1)
        tma.store_wait(pendings=1)
        hs_s.index(b).permute((1, 0)).store(S_b)
        fence_async_shared()
        gl.thread_barrier()
        cs = cs0 + c
        cs = gl.where((cs >= 0) & (cs < n_cs_rows), cs, n_cs_rows)  # past the descriptor: not stored
        tma.async_copy_shared_to_global(ds_desc, [(cs * HV + i_hv).to(gl.int32) * K, i_v * BV], hs_s.index(b))
        mbarrier.arrive(s_ready.index(b), count=1)
        # The next dS'^T onto lam_C dS'^T.
        mbarrier.wait(ready.index(s), (j // NUM_STAGES) & 1)
        dOt = do_s.index(s).permute((1, 0)).load(mma64).to(gl.float32)  # [BV, BT]
        Wdo = (gl.convert_layout(lam_s, col64)[None, :] * dOt).to(DT)  # (lam scale o dO)^T
        dS_t = warpgroup_mma(gl.convert_layout(Wdo, aK), q_s.index(s), lam_last * dS_t, is_async=True)
        if SSD_GRADS and HAS_D:
            dD_sum += gl.sum(dOt * x_s.index(s).permute((1, 0)).load(mma64).to(gl.float32), axis=1)
        dS_t = warpgroup_mma_wait(num_outstanding=0, deps=(dS_t,))
        mbarrier.arrive(empty.index(s), count=1)
    tma.store_wait(pendings=0)
    if SSD_GRADS and HAS_D:  # dD [2, N, HV, V]: this program's sums, then zeros (the Triton kernel's layout)
        along_v: gl.constexpr = gl.SliceLayout(1, mma64)
        o_d = ((i_n * HV + i_hv) * V + i_v * BV + gl.arange(0, BV, layout=along_v)).to(gl.int64)
        gl.store(dD + o_d, dD_sum)
        gl.store(dD + gl.num_programs(0) // (V // BV) * V + o_d, gl.zeros([BV], gl.float32, layout=along_v))
    if STORE_DH0:
        gl.store(dh0 + p_h + _state_offsets(i_v, mmaK, BV, K, V), dS_t)


@gluon.jit
def _outputs(p, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
             CW: gl.constexpr, NUM_STAGES: gl.constexpr, HAS_DHT: gl.constexpr, STORE_DH0: gl.constexpr,
             SSD_GRADS: gl.constexpr, HAS_D: gl.constexpr, D_PER_CHANNEL: gl.constexpr, PART: gl.constexpr):
    """A worker warpgroup: dV of every other chunk of the walk (those with j % 2 == PART) from the
    dS' the chain handed over in buffer PART; with SSD_GRADS what the Triton kernel forms from it
    in its place (dx, dstep's share, and D's sum over this warpgroup's chunks in dD[PART])."""
    (k_s, q_s, do_s, a_s, hs_s, g_s, dv_s, x_s, ready, empty, s_ready, s_empty, k_desc, q_desc, do_desc,
     s_desc, dv_desc, ds_desc, x_desc, coef, dht, dh0, scale, bos, L, n_chunks, cs0, n_cs_rows, step, D, dstep,
     dD) = p
    i_n, i_hv, i_v, col_qk, col_v, col_s = _program(H, HV, K, V, BT, BV)
    DT: gl.constexpr = k_s.dtype
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    a64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma64, k_width=2)
    col64: gl.constexpr = gl.SliceLayout(0, mma64)  # along a [BV, BT] tile's columns (the chunk's rows)
    row64: gl.constexpr = gl.SliceLayout(1, mma64)  # along a [BT, BT] tile's rows (i)
    compact: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # a row vector, one register a thread
    o_t = gl.arange(0, BT, layout=compact)
    zero64 = gl.zeros([BV, BT], gl.float32, layout=mma64)
    g_s = g_s.index(PART)  # a stormy chunk's G o scores
    dv_s = dv_s.index(PART)  # dV's staging for its bulk store (SSD_GRADS: dx's)
    b = PART
    for j in range(PART, n_chunks, 2):
        s = j % NUM_STAGES
        c = n_chunks - 1 - j
        # the chunk's coefficients in the twin's compact layout (moved where used), before the waits
        f, lam_s, gam, gc, seg, lam_last, f_0 = _row_coefficients(coef, bos, L, c, i_n, i_hv, o_t, HV, BT, CW)
        if SSD_GRADS:  # the rows' step sizes, and where their dt shares go: a row a thread
            p_step = (bos + c * BT) * HV + i_hv + o_t * HV
            m_step = c * BT + o_t < L
            step_r = gl.load(step + p_step, mask=m_step, other=0.0)
            if HAS_D:  # D per value column ([BV, 1]) or per head, loaded a chunk: no register held across
                if D_PER_CHANNEL:
                    d_skip = gl.load(D + i_hv * V + i_v * BV + gl.arange(0, BV, layout=row64)).to(gl.float32)[:, None]
                else:
                    d_skip = gl.load(D + i_hv).to(gl.float32)
        mbarrier.wait(ready.index(s), (j // NUM_STAGES) & 1)
        mbarrier.wait(s_ready.index(b), (j // 2) & 1)
        dSK = warpgroup_mma(hs_s.index(b).permute((1, 0)), k_s.index(s).permute((1, 0)), zero64, use_acc=False,
                            is_async=True)
        dOt = do_s.index(s).permute((1, 0)).load(mma64)  # [BV, BT], in dO's dtype (the fewest registers)
        dSK = warpgroup_mma_wait(num_outstanding=0, deps=(dSK,))
        mbarrier.arrive(s_empty.index(b), count=1)
        if f_0 == f_0:  # calm (the column factors are NaN in every row otherwise)
            Wdo = (gl.convert_layout(lam_s, col64)[None, :] * dOt.to(gl.float32)).to(DT)  # (lam scale o dO)^T
            dvt = _calm_dv(Wdo, a_s.index(s), (scale * lam_last) * dSK, f, a64, col64)
        else:
            # G_ij = 2^(gc_i - gc_j) for j <= i in one segment, rows past the end selected out.
            St = a_s.index(s).load(mma64).to(gl.float32)  # scores [i, j]
            o_i = gl.arange(0, BT, layout=row64)  # the tile's rows i
            o_j = gl.arange(0, BT, layout=col64)  # and columns j
            g_s.store(_stormy_gate_tile(St, gc, seg, o_i, o_j, c * BT, L, row64, col64).to(DT))
            fence_async_shared()
            gl.thread_barrier()
            dvt = warpgroup_mma(gl.convert_layout(dOt, a64), g_s,
                                gl.convert_layout(gam, col64)[None, :] * dSK, is_async=True)
            dvt = warpgroup_mma_wait(num_outstanding=0, deps=(dvt,))
        if SSD_GRADS:  # dx, dstep's share and D's in dV's place (the Triton kernel's sums)
            xt = x_s.index(s).permute((1, 0)).load(mma64)  # x^T [BV, BT], in x's dtype (the fewest registers)
            mbarrier.arrive(empty.index(s), count=1)
            dstep_r = gl.convert_layout(gl.sum(dvt * xt.to(gl.float32), axis=0), compact)  # one value block
            gl.store(dstep + p_step, dstep_r, mask=m_step)
            dvt = dvt * gl.convert_layout(step_r, col64)[None, :]
            if HAS_D:
                dvt += d_skip * dOt.to(gl.float32)
            tma.store_wait(pendings=0)  # this warpgroup's last dx out of dv_s
            dv_s.permute((1, 0)).store(dvt.to(DT))
        else:
            mbarrier.arrive(empty.index(s), count=1)
            tma.store_wait(pendings=0)  # this warpgroup's last dV out of dv_s
            dv_s.permute((1, 0)).store(dvt)
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(dv_desc, [c * BT, col_v], dv_s)
    tma.store_wait(pendings=0)


@gluon.jit
def _loads(p, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
           CW: gl.constexpr, NUM_STAGES: gl.constexpr, HAS_DHT: gl.constexpr, STORE_DH0: gl.constexpr,
           SSD_GRADS: gl.constexpr, HAS_D: gl.constexpr, D_PER_CHANNEL: gl.constexpr):
    """A worker warp: the chunks' tiles, last chunk first, by bulk copies (with SSD_GRADS x's too),
    a stage once both warpgroups freed it."""
    (k_s, q_s, do_s, a_s, hs_s, g_s, dv_s, x_s, ready, empty, s_ready, s_empty, k_desc, q_desc, do_desc,
     s_desc, dv_desc, ds_desc, x_desc, coef, dht, dh0, scale, bos, L, n_chunks, cs0, n_cs_rows, step, D, dstep,
     dD) = p
    i_n, i_hv, i_v, col_qk, col_v, col_s = _program(H, HV, K, V, BT, BV)
    nbytes: gl.constexpr = (k_desc.block_type.nbytes + q_desc.block_type.nbytes + do_desc.block_type.nbytes
                            + s_desc.block_type.nbytes + (x_desc.block_type.nbytes if SSD_GRADS else 0))
    gl.static_assert(BT * CW * 4 == 2048, "a chunk's coef block is the 2 KB prefetched")
    p_coef = coef + ((bos // BT + i_n) * HV + i_hv) * (BT * CW)  # chunk c's block: + c HV BT CW (its slot)
    for j in range(n_chunks):
        s = j % NUM_STAGES
        bar = ready.index(s)
        mbarrier.wait(empty.index(s), ((j // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(bar, nbytes)
        r = (n_chunks - 1 - j) * BT
        tma.async_copy_global_to_shared(k_desc, [r, col_qk], bar, k_s.index(s))
        tma.async_copy_global_to_shared(q_desc, [r, col_qk], bar, q_s.index(s))
        tma.async_copy_global_to_shared(do_desc, [r, col_v], bar, do_s.index(s))
        tma.async_copy_global_to_shared(s_desc, [r, col_s], bar, a_s.index(s))
        if SSD_GRADS:
            tma.async_copy_global_to_shared(x_desc, [r, col_v], bar, x_s.index(s))
        if COEF_PREFETCH:
            _prefetch_2kb(p_coef + (n_chunks - 1 - j) * (HV * BT * CW))


@gluon.jit
def gluon_gla_bwd_sweep_specialized_kernel(
    q, k, g, do, dstates, dht, dh0, dv, cu_seqlens, chunk_offsets, T, scale, n_cs_rows, qg, kg, aqk, dl, coef,
    x, step, D, dx, dstep, dD,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_G: gl.constexpr, HAS_DHT: gl.constexpr,
    STORE_DH0: gl.constexpr, DOT_PRECISION: gl.constexpr, DT: gl.constexpr, PER_KEY: gl.constexpr = False,
    GATE_SCORES: gl.constexpr = False, SSD_GRADS: gl.constexpr = False, HAS_D: gl.constexpr = False,
    D_PER_CHANNEL: gl.constexpr = False, NUM_STAGES: gl.constexpr = 2,
):
    """Grid (N * HV * V / BV,), as the twin's: one program per (sequence, value head, value block
    of BV = 64), the block fastest; the twin's arguments and, per chunk, its algebra::

        calm:      dV^T = f o ((lam scale o dO^T) scores + (scale lam_C) (K dS')^T)
        otherwise: dV^T = dO^T (G o scores) + gam o (K dS')^T
        dS'^T <- lam_C dS'^T + (lam scale o dO^T) Q

    with the chain, the outputs and the loads on partitions of their own (module docstring).
    SSD_GRADS (V = 64: one value block): the Triton kernel's form of the flag (x's tiles in the
    ring, dx stored from a 16-bit staging in dV's place, dstep's share stored per row), D's sums
    one a warpgroup, in ``dD [2, N, HV, V]``."""
    gl.static_assert(BV == 64, "64 value columns a program")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    gl.static_assert(GATE_SCORES and not PER_KEY, "the group prep's scores (GATE_SCORES), a scalar decay")
    gl.static_assert(not SSD_GRADS or V == BV, "SSD_GRADS: one value block (dstep's share a row)")
    CW: gl.constexpr = 8  # the group prep's coef floats a row (kernels/gla/group_prep.py, GROUP_COEF_WIDTH)
    i_n, i_hv, i_v, col_qk, col_v, col_s = _program(H, HV, K, V, BT, BV)
    # dV's descriptor (float32), or with SSD_GRADS dx's in its place (x's dtype)
    bos, L, _, cs0, k_desc, q_desc, do_desc, s_desc, dv_desc, ds_desc = _sequence_operands(
        q, k, do, aqk, dx if SSD_GRADS else dv, dstates, cu_seqlens, chunk_offsets, T, n_cs_rows, i_n, H, HV, K, V,
        BT, BV, IS_VARLEN, DT, DT if SSD_GRADS else gl.float32)
    # L and the chunk count in int32 into the partitions: int64 values spill at their split (sm_90)
    L = L.to(gl.int32)
    n_chunks = (L + BT - 1) // BT

    k_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], k_desc.layout)
    q_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], q_desc.layout)
    do_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], do_desc.layout)
    a_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BT], s_desc.layout)
    hs_s = gl.allocate_shared_memory(DT, [2, K, BV], ds_desc.layout)  # dS' handed to the outputs (and stored)
    g_s = gl.allocate_shared_memory(DT, [2, BT, BT], s_desc.layout)  # each outputs warpgroup's gate tile
    if SSD_GRADS:  # x's tiles in the ring; dx (in x's dtype) stored where dV was
        rows = gl.maximum(L, 1).to(gl.int32)
        x_desc = tma.make_tensor_descriptor(x + bos * (HV * V), [rows, HV * V], [HV * V, 1], [BT, BV], do_desc.layout)
        x_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], x_desc.layout)
        dv_s = gl.allocate_shared_memory(DT, [2, BT, BV], dv_desc.layout)  # and its dx staging
    else:
        x_desc = do_desc  # unread
        x_s = do_s
        dv_s = gl.allocate_shared_memory(gl.float32, [2, BT, BV], dv_desc.layout)  # and its dV staging
    ready, empty, s_ready, s_empty = _handover_barriers(NUM_STAGES)

    p = (k_s, q_s, do_s, a_s, hs_s, g_s, dv_s, x_s, ready, empty, s_ready, s_empty, k_desc, q_desc, do_desc,
         s_desc, dv_desc, ds_desc, x_desc, coef, dht, dh0, scale, bos, L, n_chunks, cs0, n_cs_rows, step, D, dstep,
         dD)
    OUT_REGS: gl.constexpr = SSD_OUTPUT_REGS if SSD_GRADS else OUTPUT_REGS
    # Each partition's arguments written out in the call: a tuple named first would carry the
    # constexprs as values (Triton 3.6).
    gl.warp_specialize([
        (_chain, (p, H, HV, K, V, BT, BV, CW, NUM_STAGES, HAS_DHT, STORE_DH0, SSD_GRADS, HAS_D, D_PER_CHANNEL)),
        (_outputs, (p, H, HV, K, V, BT, BV, CW, NUM_STAGES, HAS_DHT, STORE_DH0, SSD_GRADS, HAS_D, D_PER_CHANNEL, 0)),
        (_outputs, (p, H, HV, K, V, BT, BV, CW, NUM_STAGES, HAS_DHT, STORE_DH0, SSD_GRADS, HAS_D, D_PER_CHANNEL, 1)),
        (_loads, (p, H, HV, K, V, BT, BV, CW, NUM_STAGES, HAS_DHT, STORE_DH0, SSD_GRADS, HAS_D, D_PER_CHANNEL)),
    ], [4, 4, 1], [OUT_REGS, OUT_REGS, LOAD_REGS])
