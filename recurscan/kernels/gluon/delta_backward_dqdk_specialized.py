"""dq and dk of the delta rule's backward warp-specialised: the arithmetic of the Gluon twin
:func:`recurscan.kernels.gluon.delta_backward_dqdk.gluon_bwd_dqdk_kernel` (its helpers; same
arguments plus ``n_programs``, same grid: persistent programs, one an SM, over items (chunk, GROUP
value heads)) on three partitions:

1. the **sums** warpgroup (the default partition): per item, dk's and dq's sums over the value
   columns, (gam o U) dS^T - (lam beta o dY) S^T and dO S^T (under GVA the group's value heads one
   after another into the same sums, dO scaled by each head's scale lam), with S . dS beside them;
   after each value head it hands the sums so far and the head's S . dS to the epilogue through
   shared memory and goes on;
2. the **epilogue** warpgroup (a worker): per item, q and k normalised; per value head, its dg state
   terms from the projections of the sums handed over after it less those before it (the twin's
   differences); then every head's score-tile products onto the group's sums, the L2 norm's
   backward, dq and dk stored (per q/k head);
3. the **loads** (one warp): each item's steps (S, dS [K, BV], U, dY, dO [BT, BV]) into a ring
   of NUM_STAGES stages freed by the sums warpgroup, then the item's q, k and every value head's
   score tiles into the epilogue's slot once it has finished the item before; it also makes the
   bulk copies' descriptors.

So an item's epilogue runs beside the next item's sums, where the twin's eight warps run each
item's epilogue alone on the SM (~1.9 TB/s over the stage's bytes at B4 T4096:
docs/kernels-delta-backward.md, "Where the time goes"). The sums warpgroup holds the two sums
([BT, K] over four warps, each as two column halves: two thirds of its registers at K = 128) and
only the value loop's addresses; the epilogue holds one column half of one sum at a time, its loops
over the halves rolled. One warpgroup holding both sums through a loop and an epilogue would not
fit them in its registers beside both parts' addresses (perf-history, 2026-12-05).
The hand-over costs 64 KB of shared memory, written and read once a value head.

dq, dk and dg are the twin's arithmetic except the reductions' order (the layout's) and, under
GVA, the score-tile products added after the group's value sums (the twin interleaves them): the
GPU test compares them with the Triton kernel's and the float64 oracle
(tests/gpu/test_delta_grad_gpu.py).

Scope: the twin's with at most ``plan.delta.GLUON_DQDK_SPECIALIZED_GROUP`` = 2 value heads a q/k
head (the slot holds every head's score tiles: two take 226 KB at K = 128); a larger group runs the
twin.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .delta_backward_dqdk import (SCAN_LINE, _dg_state_terms, _dqdk_descriptors, _gates, _issue_step, _issue_tiles,
                                  _item, _tile_offsets)
from .gla_sweep_specialized import _handover_barriers

#: Registers a thread of the epilogue warpgroup and of the load warp (setmaxnreg); the sums
#: warpgroup takes what the launch's cap leaves (launch.delta_backward's SPECIALIZED_STAGE_MAXNREG:
#: 168 a thread over the three warpgroups: ptxas gives the sums warpgroup 232, the epilogue 240, the
#: load warp 32; results/sm90_delta_backward_specialised.txt).
EPILOGUE_REGS = gl.constexpr(240)
LOAD_REGS = gl.constexpr(32)


@gluon.jit
def _program(n_cs_rows, programs, HV: gl.constexpr, GROUP: gl.constexpr):
    """This persistent program's id, the programs, and its items (pid, pid + programs, ... of
    n_cs_rows x HV / GROUP); formed in each partition. The programs come as an argument: ptxas
    hoists the partitions' reads of the grid's size to the kernel's entry, where they spill across
    the partitions' dispatch."""
    pid = gl.program_id(0)
    return pid, programs, (n_cs_rows * (HV // GROUP) - pid + programs - 1) // programs


@gluon.jit
def _half(x_s, c: gl.constexpr, dim: gl.constexpr):
    """Half ``c`` of a shared tile along ``dim``."""
    n: gl.constexpr = x_s.shape[dim] // 2
    return x_s.slice(c * n, n, dim=dim)


@gluon.jit
def _sums(p, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
          BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_G: gl.constexpr, DT: gl.constexpr, GROUP: gl.constexpr,
          NUM_STAGES: gl.constexpr):
    """The sums warpgroup: the twin's value loops of every item of the program, each sum held as two
    column halves (its products two of N = K / 2). After each value head the sums so far (under GVA
    the group's, dO scaled by the head's scale lam as the twin's) go to the epilogue through shared
    memory, with the head's S . dS."""
    (s_s, ds_s, u_s, dy_s, do_s, k_s, q_s, kn_s, qn_s, dsg_s, dag_s, acc_s, sds_s, ready, empty, handed, freed,
     q, k, u, dy, do, states, dstates, scratch, g, beta, dq, dk, dg, bdyks, cu_seqlens,
     chunk_indices, chunk_offsets, T, n_seq, scale, n_cs_rows, n_programs) = p
    pid, programs, n_mine = _program(n_cs_rows, n_programs, HV, GROUP)
    NV: gl.constexpr = V // BV
    NG: gl.constexpr = HV // GROUP
    STEPS: gl.constexpr = GROUP * NV
    KH: gl.constexpr = K // 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, KH, 16])
    row: gl.constexpr = gl.SliceLayout(1, mma)
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])  # [BT, BV] tiles scaled by row
    blk_kv: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])  # [K, BV] state tiles
    line: gl.constexpr = SCAN_LINE
    o_t = gl.arange(0, BT, layout=row)
    o_l = gl.arange(0, BT, layout=line)
    for m in range(n_mine):
        it = pid + m * programs
        i_hv0 = (it % NG) * GROUP  # the item's first value head
        valid, eos, r0, s_row, scr_row = _item(it, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, HV,
                                               K, BT, IS_VARLEN, GROUP)
        rows = r0 + o_t.to(gl.int64)
        rows_l = r0 + o_l.to(gl.int64)
        acc_k0 = gl.zeros([BT, KH], gl.float32, layout=mma)  # dk's sum, key columns [0, K / 2)
        acc_k1 = gl.zeros([BT, KH], gl.float32, layout=mma)  # and [K / 2, K)
        acc_q0 = gl.zeros([BT, KH], gl.float32, layout=mma)  # dO S^T (GVA: scale lam o dO S^T)
        acc_q1 = gl.zeros([BT, KH], gl.float32, layout=mma)
        for h in gl.static_range(GROUP):
            lam, gam, lam_end, b_beta = _gates(g, beta, rows, rows_l, eos, i_hv0 + h, HV, HAS_G, row, line)
            gam_b = gl.convert_layout(gam, gl.SliceLayout(1, blk))
            lb_b = gl.convert_layout(-(lam * b_beta), gl.SliceLayout(1, blk))
            slam_b = gl.convert_layout(scale * lam, gl.SliceLayout(1, blk))
            sds = gl.zeros([K], gl.float32, layout=gl.SliceLayout(1, blk_kv))
            for j in range(NV):
                step = m * STEPS + h * NV + j
                s = step % NUM_STAGES
                mbarrier.wait(ready.index(s), (step // NUM_STAGES) & 1)
                St = s_s.index(s)
                dSt = ds_s.index(s)
                A1 = gl.convert_layout((gam_b[:, None] * u_s.index(s).load(blk).to(gl.float32)).to(DT), a_op)
                acc_k0 = warpgroup_mma(A1, _half(dSt, 0, 0).permute((1, 0)), acc_k0, is_async=True)
                acc_k1 = warpgroup_mma(A1, _half(dSt, 1, 0).permute((1, 0)), acc_k1, is_async=True)
                A2 = gl.convert_layout((lb_b[:, None] * dy_s.index(s).load(blk).to(gl.float32)).to(DT), a_op)
                acc_k0 = warpgroup_mma(A2, _half(St, 0, 0).permute((1, 0)), acc_k0, is_async=True)
                acc_k1 = warpgroup_mma(A2, _half(St, 1, 0).permute((1, 0)), acc_k1, is_async=True)
                if GROUP > 1:  # dO scaled by this head's scale lam before the sum over heads
                    A3 = gl.convert_layout((slam_b[:, None] * do_s.index(s).load(blk).to(gl.float32)).to(DT), a_op)
                    acc_q0 = warpgroup_mma(A3, _half(St, 0, 0).permute((1, 0)), acc_q0, is_async=True)
                    acc_q1 = warpgroup_mma(A3, _half(St, 1, 0).permute((1, 0)), acc_q1, is_async=True)
                else:
                    acc_q0 = warpgroup_mma(do_s.index(s), _half(St, 0, 0).permute((1, 0)), acc_q0, is_async=True)
                    acc_q1 = warpgroup_mma(do_s.index(s), _half(St, 1, 0).permute((1, 0)), acc_q1, is_async=True)
                sds += gl.sum(St.load(blk_kv).to(gl.float32) * dSt.load(blk_kv).to(gl.float32), axis=1)
                acc_k0, acc_k1, acc_q0, acc_q1 = warpgroup_mma_wait(num_outstanding=0,
                                                                    deps=(acc_k0, acc_k1, acc_q0, acc_q1))
                gl.thread_barrier()  # every warp has read stage s
                mbarrier.arrive(empty.index(s), count=1)
            # The hand-over, once the epilogue has taken the one before.
            n = m * GROUP + h
            mbarrier.wait(freed.index(1), (n & 1) ^ 1)
            acc_s.index(0).store(acc_k0)
            acc_s.index(1).store(acc_k1)
            acc_s.index(2).store(acc_q0)
            acc_s.index(3).store(acc_q1)
            sds_s.store(sds)
            gl.thread_barrier()
            mbarrier.arrive(handed.index(1), count=1)


@gluon.jit
def _raw(x_s, c, layout: gl.constexpr):
    """Half ``c`` of the raw [BT, K] rows (``x_s`` [2, BT, K / 2]: their two column halves) in float32."""
    return x_s.index(c).load(layout).to(gl.float32)


@gluon.jit
def _normalise_into(x_s, dst_s, m_r, layout: gl.constexpr, USE_L2NORM: gl.constexpr):
    """The twin's normalised rows of the raw [BT, K] tile ``x_s`` into ``dst_s``, rows past the
    sequence's end (``m_r`` False: the next sequence's, whose factor may be NaN) selected to zero
    after the scaling; returns each row's factor."""
    if USE_L2NORM:
        x0 = _raw(x_s, 0, layout)
        x1 = _raw(x_s, 1, layout)
        r = gl.rsqrt((gl.sum(x0 * x0, axis=1) + gl.sum(x1 * x1, axis=1)) + 1e-6)
    else:
        BT: gl.constexpr = x_s.shape[1]
        r = gl.full([BT], 1.0, gl.float32, layout=gl.SliceLayout(1, layout))
    for c in range(2):
        gl.thread_barrier()  # one half in registers at a time (as _norm_backward_out)
        dst_s.index(c).store(gl.where(m_r[:, None], _raw(x_s, c, layout) * r[:, None], 0.0).to(dst_s.dtype))
    return r


@gluon.jit
def _norm_backward_out(acc_s, first: gl.constexpr, x_s, r, stage, layout: gl.constexpr, USE_L2NORM: gl.constexpr):
    """A gradient's sum, its halves ``acc_s[first]`` and ``acc_s[first + 1]`` in shared memory,
    through the L2 norm's backward over the raw rows ``x_s`` (factors ``r``; y = x r, dx = r (dy - y
    (y . dy)), the twin's arithmetic) into ``stage`` in its dtype. One half in registers at a time:
    the barriers between the halves keep the compiler from loading the next half's tiles early (or
    reusing the first loads), which would hold the whole tiles live: more than the registers."""
    if USE_L2NORM:
        dot = gl.sum((_raw(x_s, 0, layout) * r[:, None]) * acc_s.index(first).load(layout), axis=1)
        gl.thread_barrier()
        dot += gl.sum((_raw(x_s, 1, layout) * r[:, None]) * acc_s.index(first + 1).load(layout), axis=1)
    for c in range(2):
        gl.thread_barrier()
        a = acc_s.index(first + c).load(layout)
        if USE_L2NORM:
            a = r[:, None] * (a - (_raw(x_s, c, layout) * r[:, None]) * dot[:, None])
        stage.index(c).store(a.to(stage.dtype))


@gluon.jit
def _store_staged(dst, stage, n_rows, valid, stride: gl.constexpr, layout: gl.constexpr):
    """The [BT, K] tile in ``stage`` (its two column halves) to the rows of ``dst`` (``stride``
    elements apart) below ``n_rows``, 16-byte runs of a row a thread (the twin's _store_rows from
    its staged tile)."""
    gl.thread_barrier()
    BT: gl.constexpr = stage.shape[1]
    KH: gl.constexpr = stage.shape[2]
    o_r = gl.arange(0, BT, layout=gl.SliceLayout(1, layout))
    offs = _tile_offsets(stride, layout, BT, KH)
    for c in range(2):
        gl.store(dst + c * KH + offs, stage.index(c).load(layout).to(dst.dtype.element_ty),
                 mask=(o_r < n_rows)[:, None] & valid)


@gluon.jit
def _project(x_s, r, m_r, acc_s, first: gl.constexpr, layout: gl.constexpr):
    """rowsum(X o acc): X the normalised rows of the raw halves ``x_s`` (factors ``r``; rows past
    the sequence's end, ``m_r`` False, zero), acc the sum whose halves are ``acc_s[first]`` and
    ``acc_s[first + 1]`` (the twin's _projection), one half in registers at a time. A row past the
    end may come out NaN (its factor from the next sequence's row): the callers select those rows
    away, which costs fewer registers than selecting here (8 B of spills under GVA)."""
    BT: gl.constexpr = x_s.shape[1]
    out = gl.zeros([BT], gl.float32, layout=gl.SliceLayout(1, layout))
    for c in range(2):
        gl.thread_barrier()
        out += gl.sum((gl.where(m_r[:, None], _raw(x_s, c, layout), 0.0) * r[:, None]) *
                      acc_s.index(first + c).load(layout), axis=1)
    return out


@gluon.jit
def _epilogue(p, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
              BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_G: gl.constexpr, USE_L2NORM: gl.constexpr,
              DT: gl.constexpr, GROUP: gl.constexpr):
    """The epilogue warpgroup: the twin's epilogue of every item of the program on the sums' halves
    in the hand-over buffer, one half in registers at a time. Each value head's dg terms come from
    the projections of the sums handed over after it, less those handed over before it (the twin's
    differences of projections); then every head's score tiles' products go onto the group's sums
    (two of N = K / 2 a product, written back there), and the L2 norm's backward."""
    (s_s, ds_s, u_s, dy_s, do_s, k_s, q_s, kn_s, qn_s, dsg_s, dag_s, acc_s, sds_s, ready, empty, handed, freed,
     q, k, u, dy, do, states, dstates, scratch, g, beta, dq, dk, dg, bdyks, cu_seqlens,
     chunk_indices, chunk_offsets, T, n_seq, scale, n_cs_rows, n_programs) = p
    pid, programs, n_mine = _program(n_cs_rows, n_programs, HV, GROUP)
    NG: gl.constexpr = HV // GROUP
    KH: gl.constexpr = K // 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, KH, 16])
    row: gl.constexpr = gl.SliceLayout(1, mma)
    line: gl.constexpr = SCAN_LINE
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16-byte stores of half rows
    o_t = gl.arange(0, BT, layout=row)
    o_l = gl.arange(0, BT, layout=line)
    for m in range(n_mine):
        it = pid + m * programs
        i_h = it % NG  # the q/k head (GROUP 1: the value head)
        i_hv0 = i_h * GROUP
        valid, eos, r0, s_row, scr_row = _item(it, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, HV,
                                               K, BT, IS_VARLEN, GROUP)
        rows = r0 + o_t.to(gl.int64)
        m_r = rows < eos
        rows_l = r0 + o_l.to(gl.int64)
        # q and k normalised (rows past the sequence's end zeroed) beside their raw tiles.
        mbarrier.wait(handed.index(0), m & 1)
        rq = _normalise_into(q_s, qn_s, m_r, mma, USE_L2NORM)
        rk = _normalise_into(k_s, kn_s, m_r, mma, USE_L2NORM)
        fence_async_shared()
        gl.thread_barrier()
        # Each value head's dg terms, from the sums handed over after it.
        pk_before = gl.zeros([BT], gl.float32, layout=row)  # the projections of the sums before this head
        pq_before = gl.zeros([BT], gl.float32, layout=row)
        for h in gl.static_range(GROUP):
            i_hv = i_hv0 + h
            lam, gam, lam_end, b_beta = _gates(g, beta, rows, rows_l, eos, i_hv, HV, HAS_G, row, line)
            mbarrier.wait(handed.index(1), (m * GROUP + h) & 1)
            if HAS_G:
                pk = _project(k_s, rk, m_r, acc_s, 0, mma)
                pq = _project(q_s, rq, m_r, acc_s, 2, mma)
                gkdsu = gl.where(m_r, (pk - pk_before) + gl.load(bdyks + rows * HV + i_hv, mask=m_r, other=0.0),
                                 0.0)
                if GROUP == 1:  # dO S^T unscaled: scale lam here (the twin's GROUP 1)
                    doqs = gl.where(m_r, scale * lam * pq, 0.0)
                else:
                    doqs = gl.where(m_r, pq - pq_before, 0.0)
                d_g, d_q = _dg_state_terms(gkdsu, doqs, lam_end, sds_s.load(line), line, row)
                p_dg = dg + rows * HV + i_hv
                m_st = m_r & valid
                gl.store(p_dg, (gl.load(p_dg, mask=m_st, other=0.0) + d_g) + d_q, mask=m_st)
                pk_before = pk
                pq_before = pq
            if h < GROUP - 1:  # the next head's sums may come; the last ones stay for the products
                gl.thread_barrier()
                mbarrier.arrive(freed.index(1), count=1)
        # The score tiles' products onto the group's sums: dk's (dA o G) K + (dA o G)^T K +
        # (dscores o G)^T Q, dq's (dscores o G) K (GROUP 1: onto scale lam o dO S^T).
        for c in range(2):
            gl.thread_barrier()  # one half in registers at a time
            a = acc_s.index(c).load(mma)
            for h in gl.static_range(GROUP):
                a = warpgroup_mma(dag_s.index(h), kn_s.index(c), a, is_async=True)
                a = warpgroup_mma(dag_s.index(h).permute((1, 0)), kn_s.index(c), a, is_async=True)
                a = warpgroup_mma(dsg_s.index(h).permute((1, 0)), qn_s.index(c), a, is_async=True)
            a = warpgroup_mma_wait(num_outstanding=0, deps=(a,))
            acc_s.index(c).store(a)
            gl.thread_barrier()
            b = acc_s.index(2 + c).load(mma)
            if GROUP == 1:
                b = (scale * lam)[:, None] * b
            for h in gl.static_range(GROUP):
                b = warpgroup_mma(dsg_s.index(h), kn_s.index(c), b, is_async=True)
            b = warpgroup_mma_wait(num_outstanding=0, deps=(b,))
            acc_s.index(2 + c).store(b)
        gl.thread_barrier()  # every product has read the score tiles and Q, K: their buffers take dk, dq
        # The L2 norm's backward; dk and dq out through the normalised tiles' buffers, per q/k head.
        p_row = (r0 * H + i_h) * K
        _norm_backward_out(acc_s, 0, k_s, rk, qn_s, mma, USE_L2NORM)
        _store_staged(dk + p_row, qn_s, eos - r0, valid, H * K, out_layout)
        _norm_backward_out(acc_s, 2, q_s, rq, kn_s, mma, USE_L2NORM)
        # Every warp has read the hand-over buffer and the slot (q, k raw, the score tiles): the next
        # item's sums may come, and its slot fill while dq goes out from kn_s (not the slot's).
        gl.thread_barrier()
        mbarrier.arrive(freed.index(1), count=1)
        mbarrier.arrive(freed.index(0), count=1)
        _store_staged(dq + p_row, kn_s, eos - r0, valid, H * K, out_layout)
        gl.thread_barrier()  # every warp has read its staged dq before the next item's q, k go there


@gluon.jit
def _loads(p, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
           BV: gl.constexpr, IS_VARLEN: gl.constexpr, DT: gl.constexpr, GROUP: gl.constexpr,
           NUM_STAGES: gl.constexpr):
    """The load warp: an item's steps (its value heads' one after another), a stage once the sums
    warpgroup freed it, then its q, k and every value head's score tiles once the epilogue has
    finished the item before (after the steps: that wait never holds up the item's sums)."""
    (s_s, ds_s, u_s, dy_s, do_s, k_s, q_s, kn_s, qn_s, dsg_s, dag_s, acc_s, sds_s, ready, empty, handed, freed,
     q, k, u, dy, do, states, dstates, scratch, g, beta, dq, dk, dg, bdyks, cu_seqlens,
     chunk_indices, chunk_offsets, T, n_seq, scale, n_cs_rows, n_programs) = p
    pid, programs, n_mine = _program(n_cs_rows, n_programs, HV, GROUP)
    NV: gl.constexpr = V // BV
    NG: gl.constexpr = HV // GROUP
    STEPS: gl.constexpr = GROUP * NV
    n_steps = n_mine * STEPS
    # The bulk copies' descriptors, made here (nothing else reads them): q and k by column halves.
    _, _, u_desc, dy_desc, do_desc, s_desc, ds_desc, scr_desc = _dqdk_descriptors(
        q, k, u, dy, do, states, dstates, scratch, T, n_seq, n_cs_rows, H, HV, K, V, BT, BV, IS_VARLEN, DT)
    l_half: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K // 2], DT)
    rows_all = T if IS_VARLEN else n_seq * T
    k_desc = tma.make_tensor_descriptor(k, [rows_all, H * K], [H * K, 1], [BT, K // 2], l_half)
    q_desc = tma.make_tensor_descriptor(q, [rows_all, H * K], [H * K, 1], [BT, K // 2], l_half)
    for m in range(n_mine):
        it = pid + m * programs
        i_h = it % NG
        valid, eos, r0, s_row, scr_row = _item(it, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, HV,
                                               K, BT, IS_VARLEN, GROUP)
        for j in range(STEPS):
            step = m * STEPS + j
            mbarrier.wait(empty.index(step % NUM_STAGES), ((step // NUM_STAGES) & 1) ^ 1)
            _issue_step(step, n_steps, r0, i_h * GROUP * V, s_row, s_desc, ds_desc, u_desc, dy_desc, do_desc, s_s,
                        ds_s, u_s, dy_s, do_s, ready, NV, BV, NUM_STAGES, GROUP)
        # The slot once the epilogue has finished the item before.
        mbarrier.wait(freed.index(0), (m & 1) ^ 1)
        once = handed.index(0)
        mbarrier.expect(once, 4 * k_desc.block_type.nbytes + 2 * GROUP * scr_desc.block_type.nbytes)
        r = r0.to(gl.int32)
        for c in gl.static_range(2):
            tma.async_copy_global_to_shared(k_desc, [r, i_h * K + c * (K // 2)], once, k_s.index(c))
            tma.async_copy_global_to_shared(q_desc, [r, i_h * K + c * (K // 2)], once, q_s.index(c))
        for h in gl.static_range(GROUP):
            _issue_tiles(True, scr_row + h * (2 * BT), scr_desc, dsg_s.index(h), dag_s.index(h), once, False)


@gluon.jit(do_not_specialize=["T", "n_seq", "n_cs_rows", "n_programs"])
def gluon_bwd_dqdk_specialized_kernel(
    q, k, g, beta, do, u, dy, states, dstates, dq, dk, dg, bdyks, scratch,
    cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, scale, n_cs_rows, n_programs,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_G: gl.constexpr, USE_L2NORM: gl.constexpr,
    DOT_PRECISION: gl.constexpr, DT: gl.constexpr, M: gl.constexpr = 1, PART: gl.constexpr = 3,
    GROUP: gl.constexpr = 1, NUM_STAGES: gl.constexpr = 2,
):
    """The twin's arguments and grid (persistent programs over its items, (chunk, GROUP value
    heads) ``pid, pid + n_programs, ...`` of ``n_cs_rows x HV / GROUP``, ``n_programs`` the grid's
    size; the twin's docstring has what an item computes). Launched on four warps (the sums
    warpgroup; the epilogue warpgroup and the load warp are the partitions') with ``maxnreg`` for
    the three warpgroups' registers (launch.delta_backward)."""
    gl.static_assert(M == 1, "GDN only (M = 1)")
    gl.static_assert(GROUP * H == HV, "one value head a q/k head, or a GVA group summed in the kernel")
    gl.static_assert(GROUP <= 2, "at most two value heads a q/k head (their score tiles fill the shared memory)")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    gl.static_assert(V % BV == 0, "V a multiple of BV")
    # The bulk copies' boxes and expected bytes are DT's: another dtype would overrun a stage.
    gl.static_assert((q.dtype.element_ty == DT) & (k.dtype.element_ty == DT) & (u.dtype.element_ty == DT) &
                     (dy.dtype.element_ty == DT) & (do.dtype.element_ty == DT) & (states.dtype.element_ty == DT) &
                     (dstates.dtype.element_ty == DT) & (scratch.dtype.element_ty == DT),
                     "q, k, U, dY, dO, the states and the scratch in DT")

    # Shared memory in the bulk copies' layouts (their descriptors are the load warp's).
    l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DT)
    l_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K, BV], DT)
    l_tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], DT)
    l_half: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K // 2], DT)  # q and k by column halves
    s_s = gl.allocate_shared_memory(DT, [NUM_STAGES, K, BV], l_kv)
    ds_s = gl.allocate_shared_memory(DT, [NUM_STAGES, K, BV], l_kv)
    u_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    dy_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    do_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    # The epilogue's slot: q and k raw and normalised (each as its two column halves), the score tiles.
    k_s = gl.allocate_shared_memory(DT, [2, BT, K // 2], l_half)
    q_s = gl.allocate_shared_memory(DT, [2, BT, K // 2], l_half)
    kn_s = gl.allocate_shared_memory(DT, [2, BT, K // 2], l_half)
    qn_s = gl.allocate_shared_memory(DT, [2, BT, K // 2], l_half)
    dsg_s = gl.allocate_shared_memory(DT, [GROUP, BT, BT], l_tt)  # each value head's
    dag_s = gl.allocate_shared_memory(DT, [GROUP, BT, BT], l_tt)
    # The hand-over: an item's two sums, each as two column halves (dk's, dq's), and S . dS by key row.
    l_acc: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K // 2], gl.float32)
    acc_s = gl.allocate_shared_memory(gl.float32, [4, BT, K // 2], l_acc)
    sds_s = gl.allocate_shared_memory(gl.float32, [K], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    # ready / empty a ring stage; handed / freed 0: the epilogue's slot (q, k, the score tiles),
    # 1: the hand-over buffer
    ready, empty, handed, freed = _handover_barriers(NUM_STAGES, STAGE_READERS=1, HANDED_READERS=1)

    p = (s_s, ds_s, u_s, dy_s, do_s, k_s, q_s, kn_s, qn_s, dsg_s, dag_s, acc_s, sds_s, ready, empty,
         handed, freed, q, k, u, dy, do, states, dstates, scratch, g, beta, dq, dk, dg, bdyks, cu_seqlens,
         chunk_indices, chunk_offsets, T, n_seq, scale, n_cs_rows, n_programs)
    # Each partition's arguments written out in the call: a tuple named first would carry the
    # constexprs as values (Triton 3.6).
    gl.warp_specialize([
        (_sums, (p, H, HV, K, V, BT, BV, IS_VARLEN, HAS_G, DT, GROUP, NUM_STAGES)),
        (_epilogue, (p, H, HV, K, V, BT, BV, IS_VARLEN, HAS_G, USE_L2NORM, DT, GROUP)),
        (_loads, (p, H, HV, K, V, BT, BV, IS_VARLEN, DT, GROUP, NUM_STAGES)),
    ], [4, 1], [EPILOGUE_REGS, LOAD_REGS])
