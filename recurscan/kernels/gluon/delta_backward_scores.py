"""The delta rule's parallel stage, first half (the [BT, BT] side: the score tiles, dbeta and dg's
part) in Gluon: the Triton twin is
:func:`recurscan.kernels.delta.backward.chunk_delta_bwd_scores_kernel` (same arguments, and the
item count ``n_chunks``), which has the algebra. GPU only (sm_90); the planner takes it where
:func:`recurscan.plan.delta.gluon_twins` allows.

What differs from the twin:

1. Persistent programs (the launch's grid: one an SM, eight warps), each taking (chunk, value head)
   items ``pid, pid + programs, ...``: the next item's tiles load while this one's epilogue runs.
2. The tiles (U, dY, dO, V, lam o K S) come by bulk tensor copies into a ring of NUM_STAGES
   stages of BV columns, the steps of one item after the other's; q and k by one copy an item,
   issued when the item before has used them. dO U^T and dY U^T are asynchronous wgmma from
   shared memory (U^T a transposed view), the row sums beside them.
3. Q K^T and K K^T from the normalised q and k, written into shared memory beside the raw tiles.
4. The copies read whole tensors, so a chunk's rows past its sequence's end hold the next
   sequence's (the twin's masks read zeros): q and k are masked after the copy, and those rows are
   selected out of both score tiles and of beta o dY . (lam o K S) before the reverse cumulative
   sums, which run from later rows to earlier.

The arithmetic is the twin's, except the order of the sums over the value columns (BV at a time
rather than the twin's 128) and of the reductions (each row's |q| and |k|, the row sums): the
results agree with the twin's to float32 rounding, then the score tiles' bf16 rounding (the GPU
test compares both with the float64 oracle).

Scope (``plan.delta.gluon_scores_scope`` checks it): M = 1, 16-bit inputs, K 64 or 128, V a
multiple of BV; GVA (each value head reads its q/k head's rows); dense or varlen.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .delta_backward_dqdk import _item, _normalised, _plus, _tile_offsets


@gluon.jit
def _issue_step(g, n_steps, r0, col_v, u_desc, dy_desc, do_desc, v_desc, ks_desc, u_s, dy_s, do_s, v_s, ks_s, bars,
                NV: gl.constexpr, BV: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The bulk copies of the program's value step g (step g % NV of its item g // NV, whose first
    row and columns are r0, col_v) into stage g % NUM_STAGES; none past its last step."""
    s = g % NUM_STAGES
    pred = g < n_steps
    bar = bars.index(s)
    mbarrier.expect(bar, 5 * u_desc.block_type.nbytes, pred=pred)
    c = col_v + (g % NV) * BV
    r = r0.to(gl.int32)
    tma.async_copy_global_to_shared(u_desc, [r, c], bar, u_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(dy_desc, [r, c], bar, dy_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(do_desc, [r, c], bar, do_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(v_desc, [r, c], bar, v_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(ks_desc, [r, c], bar, ks_s.index(s), pred=pred)


@gluon.jit
def _issue_qk(pred, r0, col_qk, k_desc, q_desc, k_s, q_s, once):
    """An item's q and k tiles, one copy each, onto the barrier ``once``."""
    mbarrier.expect(once, 2 * k_desc.block_type.nbytes, pred=pred)
    r = r0.to(gl.int32)
    tma.async_copy_global_to_shared(k_desc, [r, col_qk], once, k_s, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [r, col_qk], once, q_s, pred=pred)


@gluon.jit
def _store_tile(dst, x_s, valid, layout: gl.constexpr):
    """A [BT, BT] tile from shared memory to ``dst`` (rows BT apart) in 16-byte runs; nothing
    where not ``valid``."""
    y = x_s.load(layout)
    gl.store(dst + _tile_offsets(y.shape[1], layout, y.shape[0], y.shape[1]), y, mask=valid)


@gluon.jit
def gluon_bwd_scores_kernel(
    q, k, v, g, beta, do, dy, u, ks, dg, dbeta, bdyks, scratch,
    cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, scale,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_G: gl.constexpr, USE_L2NORM: gl.constexpr,
    DOT_PRECISION: gl.constexpr, DT: gl.constexpr, M: gl.constexpr = 1, n_chunks=1,
    NUM_STAGES: gl.constexpr = 3,
):
    """Persistent programs over the twin's items, (chunk, value head) ``pid, pid + programs, ...``
    of ``n_chunks x HV`` (the twin's grid). Per item, from dY (the reverse sweep's), U and
    lam o (K S) (the recompute's), dO, V and the normalised q, k:

        dscores = lower(scale dO U^T);  dsys = -strict(dY U^T);  dA = beta o dsys
        dbeta = rowsum(dsys o A) + dY . V - dY . (lam o K S)
        dg    = the [BT, BT] tile's part - the reverse cumulative sum of beta o dY . (lam o K S)

    and (dscores o G), (dA o G) into ``scratch``, ``bdyks`` = beta o dY . (lam o K S) (the twin's
    docstring has the algebra). BK, DOT_PRECISION and M are the twin's arguments (K wide tiles,
    16-bit products, M = 1). Eight warps."""
    gl.static_assert(M == 1, "GDN only (M = 1)")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    gl.static_assert(V % BV == 0, "V a multiple of BV")
    NV: gl.constexpr = V // BV
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    n_items = n_chunks * HV
    n_mine = (n_items - pid + programs - 1) // programs  # this program's items
    n_steps = n_mine * NV

    l_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], DT)
    l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DT)
    l_tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], DT)
    # Over whole tensors: the rows of every sequence (the dense batch's, or the packed varlen one).
    rows_all = T if IS_VARLEN else n_seq * T
    k_desc = tma.make_tensor_descriptor(k, [rows_all, H * K], [H * K, 1], [BT, K], l_qk)
    q_desc = tma.make_tensor_descriptor(q, [rows_all, H * K], [H * K, 1], [BT, K], l_qk)
    u_desc = tma.make_tensor_descriptor(u, [rows_all, HV * V], [HV * V, 1], [BT, BV], l_tv)
    dy_desc = tma.make_tensor_descriptor(dy, [rows_all, HV * V], [HV * V, 1], [BT, BV], l_tv)
    do_desc = tma.make_tensor_descriptor(do, [rows_all, HV * V], [HV * V, 1], [BT, BV], l_tv)
    v_desc = tma.make_tensor_descriptor(v, [rows_all, HV * V], [HV * V, 1], [BT, BV], l_tv)
    ks_desc = tma.make_tensor_descriptor(ks, [rows_all, HV * V], [HV * V, 1], [BT, BV], l_tv)

    gl.static_assert(gl.num_warps() == 8, "two warpgroups")
    mmaT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                   instr_shape=[16, BT // 2, 16])  # [BT, BT] tiles
    mmaK: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                   instr_shape=[16, K // 2, 16])  # [BT, K] rows of q, k
    rowT: gl.constexpr = gl.SliceLayout(1, mmaT)
    colT: gl.constexpr = gl.SliceLayout(0, mmaT)
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [8, 1], [1, 0])  # [BT, BV] tiles for the row sums
    line: gl.constexpr = gl.BlockedLayout([1], [32], [8], [0])  # a [BT] vector for the scans
    scan: gl.constexpr = gl.BlockedLayout([8, 2], [8, 4], [1, 8], [0, 1])  # [BT, BT], scanned down its columns
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [8, 1], [1, 0])  # 16-byte stores of rows

    u_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    dy_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    do_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    v_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    ks_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    k_s = gl.allocate_shared_memory(DT, [BT, K], l_qk)  # raw rows
    q_s = gl.allocate_shared_memory(DT, [BT, K], l_qk)
    kn_s = gl.allocate_shared_memory(DT, [BT, K], l_qk)  # normalised
    qn_s = gl.allocate_shared_memory(DT, [BT, K], l_qk)
    dsg_s = gl.allocate_shared_memory(DT, [BT, BT], l_tt)  # dscores o G
    dag_s = gl.allocate_shared_memory(DT, [BT, BT], l_tt)  # dA o G
    bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    once = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(i), count=1)
    mbarrier.init(once, count=1)

    G_HEADS: gl.constexpr = HV // H  # value heads a q/k head
    valid, eos, r0, _s_row, scr_row = _item(pid, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_chunks, HV,
                                            K, BT, IS_VARLEN)
    _issue_qk(n_mine > 0, r0, ((pid % HV) // G_HEADS) * K, k_desc, q_desc, k_s, q_s, once)
    for i in gl.static_range(NUM_STAGES):
        _issue_step(i, n_steps, r0, (pid % HV) * V, u_desc, dy_desc, do_desc, v_desc, ks_desc, u_s, dy_s, do_s, v_s,
                    ks_s, bars, NV, BV, NUM_STAGES)
    for m in range(n_mine):
        gl.thread_barrier()  # the item before has read its shared tiles
        it = pid + m * programs
        i_hv = it % HV
        # The next item's place, read now: its steps are issued from this item's loop on.
        it_n = gl.minimum(it + programs, n_items - 1)  # past the last item: never issued
        n_valid, n_eos, n_r0, _n_s_row, n_scr_row = _item(it_n, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq,
                                                          n_chunks, HV, K, BT, IS_VARLEN)
        n_hv = it_n % HV

        # dO U^T and dY U^T, dY . V and dY . (lam o K S), over the value columns.
        dOU = gl.zeros([BT, BT], gl.float32, layout=mmaT)
        dYU = gl.zeros([BT, BT], gl.float32, layout=mmaT)
        dyv = gl.zeros([BT], gl.float32, layout=gl.SliceLayout(1, blk))
        dyks = gl.zeros([BT], gl.float32, layout=gl.SliceLayout(1, blk))
        for j in range(NV):
            step = m * NV + j
            s = step % NUM_STAGES
            mbarrier.wait(bars.index(s), (step // NUM_STAGES) & 1)
            dOU = warpgroup_mma(do_s.index(s), u_s.index(s).permute((1, 0)), dOU, is_async=True)
            dYU = warpgroup_mma(dy_s.index(s), u_s.index(s).permute((1, 0)), dYU, is_async=True)
            dy_f = dy_s.index(s).load(blk).to(gl.float32)
            dyv += gl.sum(dy_f * v_s.index(s).load(blk).to(gl.float32), axis=1)
            dyks += gl.sum(dy_f * ks_s.index(s).load(blk).to(gl.float32), axis=1)
            dOU, dYU = warpgroup_mma_wait(num_outstanding=0, deps=(dOU, dYU))
            # Stage s is free: the step NUM_STAGES on, of this item or the next.
            ahead = step + NUM_STAGES
            nxt = ahead // NV > m
            _issue_step(ahead, n_steps, gl.where(nxt, n_r0, r0), gl.where(nxt, n_hv, i_hv) * V, u_desc, dy_desc,
                        do_desc, v_desc, ks_desc, u_s, dy_s, do_s, v_s, ks_s, bars, NV, BV, NUM_STAGES)

        # The chunk's decays (the twin's _chunk_gates), scanned in a 1-D layout.
        o_l = gl.arange(0, BT, layout=line)
        rows_l = r0 + o_l.to(gl.int64)
        m_l = rows_l < eos
        if HAS_G:
            b_g = gl.load(g + rows_l * HV + i_hv, mask=m_l, other=0.0).to(gl.float32) * 1.4426950408889634
        else:
            b_g = gl.zeros([BT], gl.float32, layout=line)
        bad = (b_g != b_g) | (b_g == float("inf"))
        b_g = gl.where(bad, 0.0, b_g)
        reset = b_g < -150.0
        gc = gl.associative_scan(gl.where(reset, 0.0, b_g), 0, _plus)
        seg = gl.associative_scan(reset.to(gl.int32), 0, _plus)
        o_i = gl.arange(0, BT, layout=rowT)
        rows = r0 + o_i.to(gl.int64)
        m_r = rows < eos
        b_beta = gl.load(beta + rows * HV + i_hv, mask=m_r, other=0.0).to(gl.float32)

        # q and k normalised (rows past the sequence's end zeroed) beside their raw tiles.
        mbarrier.wait(once, m & 1)
        qr, rq = _normalised(q_s, mmaK, USE_L2NORM)
        qn_s.store((gl.where(gl.convert_layout(m_r, gl.SliceLayout(1, mmaK))[:, None], qr, 0.0)
                    * rq[:, None]).to(DT))
        kr, rk = _normalised(k_s, mmaK, USE_L2NORM)
        kn_s.store((gl.where(gl.convert_layout(m_r, gl.SliceLayout(1, mmaK))[:, None], kr, 0.0)
                    * rk[:, None]).to(DT))
        fence_async_shared()
        gl.thread_barrier()
        QK = warpgroup_mma(qn_s, kn_s.permute((1, 0)), gl.zeros([BT, BT], gl.float32, layout=mmaT), is_async=True)
        KK = warpgroup_mma(kn_s, kn_s.permute((1, 0)), gl.zeros([BT, BT], gl.float32, layout=mmaT), is_async=True)
        QK, KK = warpgroup_mma_wait(num_outstanding=0, deps=(QK, KK))
        gl.thread_barrier()  # every product has read q and k: the next item's
        _issue_qk(m + 1 < n_mine, n_r0, (n_hv // G_HEADS) * K, k_desc, q_desc, k_s, q_s, once)

        o_j = gl.arange(0, BT, layout=colT)
        causal = o_i[:, None] >= o_j[None, :]
        strict = o_i[:, None] > o_j[None, :]
        G = gl.where(causal & (gl.convert_layout(seg, rowT)[:, None] == gl.convert_layout(seg, colT)[None, :]),
                     gl.exp2(gl.convert_layout(gc, rowT)[:, None] - gl.convert_layout(gc, colT)[None, :]), 0.0)
        live = m_r[:, None]  # rows of the sequence: the rest hold the next one's dO and dY
        dscores = gl.where(causal & live, scale * dOU, 0.0)
        A = gl.where(strict, KK * G, 0.0)
        dsys = gl.where(strict & live, -dYU, 0.0)
        d_beta = gl.sum(dsys * A, axis=1) + gl.convert_layout(dyv, rowT) - gl.convert_layout(dyks, rowT)
        dA = b_beta[:, None] * dsys
        dSeg = gl.where(causal, (dscores * QK + dA * KK) * G, 0.0)
        dsg_s.store((dscores * G).to(DT))
        dag_s.store((dA * G).to(DT))
        below = gl.associative_scan(gl.convert_layout(dSeg, scan), 0, _plus, reverse=True)  # row m: rows i >= m
        o_is = gl.arange(0, BT, layout=gl.SliceLayout(1, scan))
        o_js = gl.arange(0, BT, layout=gl.SliceLayout(0, scan))
        b_bdyks = gl.where(m_r, b_beta * gl.convert_layout(dyks, rowT), 0.0)
        d_g = gl.convert_layout(gl.sum(gl.where(o_is[:, None] > o_js[None, :], below, 0.0), axis=1), line) - \
            gl.associative_scan(gl.convert_layout(b_bdyks, line), 0, _plus, reverse=True)
        m_st = m_r & valid
        gl.store(dbeta + rows * HV + i_hv, d_beta, mask=m_st)
        gl.store(bdyks + rows * HV + i_hv, b_bdyks, mask=m_st)
        if HAS_G:
            gl.store(dg + rows_l * HV + i_hv, d_g, mask=m_l & valid)
        gl.thread_barrier()  # both score tiles in shared memory
        p_scr = scratch + scr_row.to(gl.int64) * BT
        _store_tile(p_scr, dsg_s, valid, out_layout)
        _store_tile(p_scr + BT * BT, dag_s, valid, out_layout)
        valid, eos, r0, scr_row = n_valid, n_eos, n_r0, n_scr_row
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))
    mbarrier.invalidate(once)
