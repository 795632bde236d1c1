"""The GLA backward's dg launch warp-specialised: the arithmetic of the Gluon twin
:func:`recurscan.kernels.gluon.gla_backward_dg.gluon_gla_bwd_dg_kernel` (its helpers, in its
order), on three partitions of a persistent program:

1. two **heads** warpgroups (the default partition and a worker), each taking every other value
   head of every item (chunk, query/key head): per head its products (Q K^T among them, formed
   again each head: held over an item it would not fit the registers), its gates, its row sums
   and its dg, stored;
2. the **loads** (one warp): each item's q and k into one of two slots, each head's dO, V, S and
   dS' into a ring of NUM_STAGES stages, each stage freed by the warpgroup that read it, each slot
   by both.

So one head's epilogue (row and column sums across the warps, the scans, the layout changes: a
chain of dependent steps with barriers) runs beside the other warpgroup's products and epilogue,
where the twin's eight warps run each head's products and then its epilogue, one head at a time
(~4.3 us a head an SM, ~1.5 of them its tiles' bytes at the H200's bandwidth:
docs/kernels-gla-plan.md, "The next steps", item 2).

A warpgroup's tiles are [64, 64] over its four warps (the twin's over eight): twice the registers
a tile, under :data:`HEADS_REGS` each. dg agrees with the twin's to float32 rounding (the order of
the reductions follows the layout, as the twin's does against the Triton kernel).

Scope: the twin's (``plan.gla.gluon_dg_scope``), a group of at least
``plan.gla.GLUON_GLA_DG_SPECIALIZED_MIN_GROUP`` value heads (the launch layer runs the twin for
smaller ones).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from .delta_backward_dqdk import _segment_gates
from .gla_sweep_specialized import _handover_barriers
from .gla_backward_dg import (_decays, _descriptors, _head_dg, _issue_qk, _issue_step, _item, _program_items,
                              _step_ring, _steps, _tile_indices)

#: Registers a thread of the worker heads warpgroup and of the load warp (setmaxnreg); the default
#: heads warpgroup takes what the launch's cap leaves (launch.gla's DG_SPECIALIZED_MAXNREG: 168 a
#: thread over three warpgroups, so 3 x 168 - 240 - 24 = 240).
HEADS_REGS = gl.constexpr(240)
LOAD_REGS = gl.constexpr(24)


@gluon.jit
def _heads(p, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
           GROUP: gl.constexpr, NUM_STAGES: gl.constexpr, IS_VARLEN: gl.constexpr, V_FROM_X: gl.constexpr,
           PART: gl.constexpr):
    """A heads warpgroup: value heads h = PART, PART + 2, ... of each of the program's items (with
    V_FROM_X the twin's: v holds x, dt enters in _head_dg)."""
    (q_s, k_s, do_s, v_s, s_s, ds_s, ready, empty, qk_ready, qk_empty, q_desc, k_desc, do_desc, v_desc, s_desc,
     ds_desc, g, dg, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, scale, pid, programs, n_mine,
     n_steps, step_sizes) = p
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    along_i: gl.constexpr = gl.SliceLayout(1, mma)  # a tile's rows
    along_j: gl.constexpr = gl.SliceLayout(0, mma)  # its columns
    line: gl.constexpr = gl.BlockedLayout([2], [32], [4], [0])  # a [BT] vector, whole in every warp
    o_i, o_j, o_l, causal, strict, diag, last_i, zero = _tile_indices(mma, along_i, along_j, line, BT)
    for m in range(n_mine):
        it = pid + m * programs
        i_h = it % H
        valid, eos, r0, cs = _item(it, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, H, BT,
                                   IS_VARLEN)
        m_i = r0 + o_i.to(gl.int64) < eos
        m_j = r0 + o_j.to(gl.int64) < eos
        rows_l = r0 + o_l.to(gl.int64)
        m_l = rows_l < eos
        b = m % 2
        mbarrier.wait(qk_ready.index(b), (m // 2) & 1)
        b_g_next = _decays(g, rows_l, eos, i_h * GROUP + PART, HV)
        for h in range(PART, GROUP, 2):
            step = m * GROUP + h
            s = step % NUM_STAGES
            mbarrier.wait(ready.index(s), (step // NUM_STAGES) & 1)
            SqT = warpgroup_mma(s_s.index(s).permute((1, 0)), q_s.index(b).permute((1, 0)), zero, use_acc=False,
                                is_async=True)  # (Q S)^T [V, BT]
            dSkT = warpgroup_mma(ds_s.index(s).permute((1, 0)), k_s.index(b).permute((1, 0)), zero, use_acc=False,
                                 is_async=True)  # (K dS')^T
            SdS = warpgroup_mma(s_s.index(s).permute((1, 0)), ds_s.index(s), zero, use_acc=False, is_async=True)

            # Beside the products: this head's gates, this warpgroup's next head's decays.
            b_g = b_g_next
            b_g_next = _decays(g, rows_l, eos, i_h * GROUP + gl.minimum(h + 2, GROUP - 1), HV)
            gc, seg, lam, gam = _segment_gates(b_g, o_l, BT)
            dt_l = _steps(step_sizes, rows_l, eos, i_h * GROUP + h, HV, V_FROM_X)
            gc_i = gl.convert_layout(gc, along_i)[:, None]
            gc_j = gl.convert_layout(gc, along_j)[None, :]
            seg_i = gl.convert_layout(seg, along_i)[:, None]
            seg_j = gl.convert_layout(seg, along_j)[None, :]

            SqT, dSkT, SdS = warpgroup_mma_wait(num_outstanding=0, deps=(SqT, dSkT, SdS))
            # The twin's _row_sums, each tile loaded where it is used and each sum formed as soon as
            # it can be, so that fewer [64, 64] tiles are live at once.
            sds = gl.sum(gl.sum(gl.where(diag, SdS, 0.0), axis=1), axis=0)
            dOt = gl.where(m_j[None, :], do_s.index(s).permute((1, 0)).load(mma).to(gl.float32), 0.0)  # [V, BT]
            dlam = gl.where(m_j, scale * gl.sum(dOt * SqT, axis=0), 0.0)
            Vt = gl.where(m_j[None, :], v_s.index(s).permute((1, 0)).load(mma).to(gl.float32), 0.0)
            kdsv = gl.where(m_j, gl.sum(Vt * dSkT, axis=0), 0.0)
            dlam = gl.convert_layout(dlam, along_i) + gl.where(last_i, sds, 0.0)
            # dO V^T, and Q K^T again each head, after the row sums: their accumulators beside the
            # sums' (and Q K^T's held over an item) would not fit the registers.
            dOV = warpgroup_mma(do_s.index(s), v_s.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
            QK = warpgroup_mma(q_s.index(b), k_s.index(b).permute((1, 0)), zero, use_acc=False, is_async=True)
            dOV, QK = warpgroup_mma_wait(num_outstanding=0, deps=(dOV, QK))
            QK = gl.where(m_i[:, None] & m_j[None, :], QK, 0.0)  # rows past the end: the next sequence's
            gl.thread_barrier()  # every warp has read stage s
            mbarrier.arrive(empty.index(s), count=1)
            d_g = _head_dg(dOV, QK, dlam, kdsv, lam, gam, gc_i, gc_j, seg_i, seg_j, m_i, m_j, scale, causal, strict,
                           last_i, along_j, line, dt_l, V_FROM_X)
            gl.store(dg + rows_l * HV + i_h * GROUP + h, d_g, mask=m_l & valid)
        gl.thread_barrier()  # every product has read the item's q and k
        mbarrier.arrive(qk_empty.index(b), count=1)


@gluon.jit
def _loads(p, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
           GROUP: gl.constexpr, NUM_STAGES: gl.constexpr, IS_VARLEN: gl.constexpr):
    """The load warp: each item's q and k once both warpgroups freed its slot (two items back),
    then its heads' tiles, a stage once the warpgroup that read it freed it."""
    (q_s, k_s, do_s, v_s, s_s, ds_s, ready, empty, qk_ready, qk_empty, q_desc, k_desc, do_desc, v_desc, s_desc,
     ds_desc, g, dg, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, scale, pid, programs, n_mine,
     n_steps, step_sizes) = p
    for m in range(n_mine):
        it = pid + m * programs
        valid, eos, r0, cs = _item(it, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, H, BT,
                                   IS_VARLEN)
        b = m % 2
        mbarrier.wait(qk_empty.index(b), ((m // 2) & 1) ^ 1)
        _issue_qk(True, r0, it % H, q_desc, k_desc, q_s.index(b), k_s.index(b), qk_ready.index(b), K)
        for h in range(GROUP):
            step = m * GROUP + h
            mbarrier.wait(empty.index(step % NUM_STAGES), ((step // NUM_STAGES) & 1) ^ 1)
            _issue_step(step, n_steps, r0, cs, it % H, do_desc, v_desc, s_desc, ds_desc, do_s, v_s, s_s, ds_s, ready,
                        HV, K, V, GROUP, NUM_STAGES)


@gluon.jit
def gluon_gla_bwd_dg_specialized_kernel(
    q, k, v, g, do, states, dstates, dq, dk, dg, scratch, cu_seqlens, chunk_indices, chunk_offsets,
    T, n_seq, scale, n_cs_rows, step,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_G: gl.constexpr, DOT_PRECISION: gl.constexpr,
    DT: gl.constexpr, PER_KEY: gl.constexpr = False, HEADS: gl.constexpr = 1, PART: gl.constexpr = 2,
    SIDE: gl.constexpr = 0, V_FROM_X: gl.constexpr = False, NUM_STAGES: gl.constexpr = 3,
):
    """The twin's arguments and grid (persistent programs over items (chunk, query/key head) of
    ``n_cs_rows x H``, one an SM): dg ``[rows, HV]`` (float32) of every value head. Launched on
    four warps (the default heads warpgroup; the worker heads warpgroup and the load warp are the
    partitions') with ``maxnreg`` for the three warpgroups' registers (launch.gla)."""
    gl.static_assert(PART == 2 and HAS_G and not PER_KEY, "the dg launch of a scalar decay")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    gl.static_assert(V == 64, "64 value columns")
    GROUP: gl.constexpr = HV // H
    gl.static_assert(GROUP >= 2, "a group of at least two value heads")
    pid, programs, _, n_mine, n_steps = _program_items(n_cs_rows, H, GROUP)
    q_desc, k_desc, do_desc, v_desc, s_desc, ds_desc = _descriptors(q, k, v, do, states, dstates, T, n_seq, n_cs_rows,
                                                                    H, HV, K, V, BT, IS_VARLEN, DT)

    do_s, v_s, s_s, ds_s = _step_ring(do_desc, v_desc, s_desc, ds_desc, NUM_STAGES)
    # two items' q and k: the warpgroups may be an item apart
    q_s = gl.allocate_shared_memory(DT, [2, BT, K], q_desc.layout)
    k_s = gl.allocate_shared_memory(DT, [2, BT, K], k_desc.layout)
    # a stage freed by the warpgroup that read it; an item's q and k by both
    ready, empty, qk_ready, qk_empty = _handover_barriers(NUM_STAGES, STAGE_READERS=1, HANDED_READERS=2)

    p = (q_s, k_s, do_s, v_s, s_s, ds_s, ready, empty, qk_ready, qk_empty, q_desc, k_desc, do_desc, v_desc, s_desc,
         ds_desc, g, dg, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, scale, pid, programs, n_mine,
         n_steps, step)
    # Each partition's arguments written out in the call: a tuple named first would carry the
    # constexprs as values (Triton 3.6).
    gl.warp_specialize([
        (_heads, (p, H, HV, K, V, BT, GROUP, NUM_STAGES, IS_VARLEN, V_FROM_X, 0)),
        (_heads, (p, H, HV, K, V, BT, GROUP, NUM_STAGES, IS_VARLEN, V_FROM_X, 1)),
        (_loads, (p, H, HV, K, V, BT, GROUP, NUM_STAGES, IS_VARLEN)),
    ], [4, 1], [HEADS_REGS, LOAD_REGS])
