"""The delta rule's dq and dk (the parallel stage's state side) in Gluon: the Triton twin is
:func:`recurscan.kernels.delta.backward.chunk_delta_bwd_dqdk_kernel` with ``PART = DQDK_BOTH``
(same arguments), which has the algebra. GPU only (sm_90); the planner takes it where
:func:`recurscan.plan.delta.gluon_dqdk` allows.

What differs from the twin, per program (one (chunk, value head), one warpgroup):

1. dq's and dk's sums over the value columns run in one loop, each tile of S read once (the twin
   walks the columns twice, dk's pass then dq's, two [BT, K] accumulators being more registers
   than Triton's build of that loop could hold without spilling). The tiles (S, dS, U, dY, dO) come
   by bulk tensor copies into a ring of NUM_STAGES stages of BV columns; q, k and the first half's
   score tiles by one copy at the start, landing while the loop runs.
2. The products take the score tiles' transposes as transposed shared-memory operands: no product
   result is ever a transposed operand (fla's issue 640), and no scratch round trip for them.
3. The normalised q and k the epilogue's products need replace the raw tiles in shared memory;
   the L2 norm's backward reads the raw rows again (L2).

The arithmetic is the twin's, in the same order, except the reductions (each row's |q|, |k|, the
projections on q and k, S . dS), whose order follows the layout: the results agree with the twin's
to float32 rounding, then bf16's (the GPU test compares both with the float64 oracle).

Scope (``plan.delta.gluon_dqdk`` checks it): M = 1, one value head a q/k head (H = HV), 16-bit
inputs, K 64 or 128, V a multiple of BV; dense or varlen.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)


@gluon.jit
def _plus(a, b):
    return a + b


@gluon.jit
def _issue_step(j, n_steps, col_v, r_rel, s_row, s_desc, ds_desc, u_desc, dy_desc, do_desc, s_s, ds_s, u_s, dy_s,
                do_s, bars, BV: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The bulk copies of value step j (columns col_v + j BV) into stage j % NUM_STAGES; none past
    the last."""
    s = j % NUM_STAGES
    pred = j < n_steps
    bar = bars.index(s)
    nbytes: gl.constexpr = (2 * s_desc.block_type.nbytes + 3 * u_desc.block_type.nbytes)
    mbarrier.expect(bar, nbytes, pred=pred)
    c = col_v + j * BV
    tma.async_copy_global_to_shared(s_desc, [s_row, j * BV], bar, s_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(ds_desc, [s_row, j * BV], bar, ds_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(u_desc, [r_rel, c], bar, u_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(dy_desc, [r_rel, c], bar, dy_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(do_desc, [r_rel, c], bar, do_s.index(s), pred=pred)


@gluon.jit
def _normalised(x_s, layout: gl.constexpr, USE_L2NORM: gl.constexpr):
    """A [BT, K] tile of raw rows from shared memory, in float32 in ``layout``, and each row's
    L2-norm factor (ones without USE_L2NORM)."""
    x = x_s.load(layout).to(gl.float32)
    if USE_L2NORM:
        r = gl.rsqrt(gl.sum(x * x, axis=1) + 1e-6)
    else:
        r = gl.full([x.shape[0]], 1.0, gl.float32, layout=gl.SliceLayout(1, layout))
    return x, r


@gluon.jit
def _l2norm_backward(dx, x_ptr, row_heads, o_k, m_r, r, K: gl.constexpr, USE_L2NORM: gl.constexpr):
    """y = x r: dx = r (dy - y (y . dy)), the raw rows read again (``row_heads``: each row's
    token x heads + head)."""
    if USE_L2NORM:
        y = gl.load(x_ptr + row_heads[:, None] * K + o_k[None, :], mask=m_r[:, None], other=0.0).to(gl.float32)
        y = y * r[:, None]
        dx = r[:, None] * (dx - y * gl.sum(y * dx, axis=1)[:, None])
    return dx


@gluon.jit
def gluon_bwd_dqdk_kernel(
    q, k, g, beta, do, u, dy, states, dstates, dq, dk, dg, bdyks, scratch,
    cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, scale, n_cs_rows,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_G: gl.constexpr, USE_L2NORM: gl.constexpr,
    DOT_PRECISION: gl.constexpr, DT: gl.constexpr, M: gl.constexpr = 1, PART: gl.constexpr = 3,
    GROUP: gl.constexpr = 1, NUM_STAGES: gl.constexpr = 2,
):
    """Grid (chunks x HV,), as the twin's: one program per (chunk, value head). From S entering the
    chunk and dS leaving it (``states``, ``dstates``), U and dY (``u``, ``dy``), dO, the first half's
    (dscores o G) and (dA o G) (``scratch``) and ``bdyks``:

        dq = (dscores o G) K + scale lam o dO S^T
        dk = (dscores o G)^T Q + (dA o G) K + (dA o G)^T K + (gam o U) dS^T - (lam beta o dY) S^T

    then the L2 norm's backward, and dg's state terms added to ``dg`` (the twin's docstring has
    them). BK, DOT_PRECISION, M, PART and GROUP are the twin's arguments (K wide tiles, 16-bit
    products, M = 1, dk and dq both, one value head a program)."""
    gl.static_assert(M == 1, "GDN only (M = 1)")
    gl.static_assert(GROUP == 1, "one value head a program")
    gl.static_assert(H == HV, "one value head a q/k head")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    gl.static_assert(V % BV == 0, "V a multiple of BV")
    NV: gl.constexpr = V // BV
    pid = gl.program_id(0)
    i_hv = pid % HV
    i_c = pid // HV
    i_h = i_hv
    if IS_VARLEN:
        i_n = gl.load(chunk_indices + i_c * 2).to(gl.int64)
        i_t = gl.load(chunk_indices + i_c * 2 + 1).to(gl.int64)
        n_ok = (i_n >= 0) & (i_n < n_seq)
        i_n = gl.where(n_ok, i_n, 0)
        bos = gl.minimum(gl.maximum(gl.load(cu_seqlens + i_n).to(gl.int64), 0), T)
        eos = gl.minimum(gl.maximum(gl.load(cu_seqlens + i_n + 1).to(gl.int64), bos), T)
        valid = n_ok & (i_t >= 0) & (i_t * BT < eos - bos)
        cs = gl.load(chunk_offsets + i_n).to(gl.int64) + i_t
    else:
        NTd = (T + BT - 1) // BT
        i_n = (i_c // NTd).to(gl.int64)
        i_t = (i_c % NTd).to(gl.int64)
        bos = i_n * T
        eos = bos + T
        valid = i_c >= 0
        cs = i_c.to(gl.int64)
    if not valid:
        return
    L = eos - bos
    rows_d = gl.maximum(L, 1).to(gl.int32)
    r_rel = (i_t * BT).to(gl.int32)

    l_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], DT)
    l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DT)
    l_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K, BV], DT)
    l_tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], DT)
    # Over this sequence's rows: a chunk past its end reads zeros (the twin's masks).
    k_desc = tma.make_tensor_descriptor(k + bos * (H * K), [rows_d, H * K], [H * K, 1], [BT, K], l_qk)
    q_desc = tma.make_tensor_descriptor(q + bos * (H * K), [rows_d, H * K], [H * K, 1], [BT, K], l_qk)
    u_desc = tma.make_tensor_descriptor(u + bos * (HV * V), [rows_d, HV * V], [HV * V, 1], [BT, BV], l_tv)
    dy_desc = tma.make_tensor_descriptor(dy + bos * (HV * V), [rows_d, HV * V], [HV * V, 1], [BT, BV], l_tv)
    do_desc = tma.make_tensor_descriptor(do + bos * (HV * V), [rows_d, HV * V], [HV * V, 1], [BT, BV], l_tv)
    # Chunk-state rows outside [0, n_cs_rows) (a wrong chunk_offsets entry) read zeros.
    s_desc = tma.make_tensor_descriptor(states, [n_cs_rows * (HV * K), V], [V, 1], [K, BV], l_kv)
    ds_desc = tma.make_tensor_descriptor(dstates, [n_cs_rows * (HV * K), V], [V, 1], [K, BV], l_kv)
    scr_desc = tma.make_tensor_descriptor(scratch, [n_cs_rows * (HV * 2 * BT), BT], [BT, 1], [BT, BT], l_tt)
    s_row = (cs * HV + i_hv).to(gl.int32) * K
    scr_row = ((i_c * HV + i_hv) * 2).to(gl.int32) * BT
    col_v = i_hv * V

    mmaK: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    aK: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mmaK, k_width=2)
    row: gl.constexpr = gl.SliceLayout(1, mmaK)  # along a [BT, K] tile's rows
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])  # [BT, BV] tiles scaled by row
    blk_kv: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])  # [K, BV] state tiles
    line: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # a [BT] vector for the scans

    s_s = gl.allocate_shared_memory(DT, [NUM_STAGES, K, BV], l_kv)
    ds_s = gl.allocate_shared_memory(DT, [NUM_STAGES, K, BV], l_kv)
    u_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    dy_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    do_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    k_s = gl.allocate_shared_memory(DT, [BT, K], l_qk)
    q_s = gl.allocate_shared_memory(DT, [BT, K], l_qk)
    dsg_s = gl.allocate_shared_memory(DT, [BT, BT], l_tt)  # dscores o G
    dag_s = gl.allocate_shared_memory(DT, [BT, BT], l_tt)  # dA o G
    bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    once = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(i), count=1)
    mbarrier.init(once, count=1)
    mbarrier.expect(once, 2 * k_desc.block_type.nbytes + 2 * scr_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [r_rel, i_h * K], once, k_s)
    tma.async_copy_global_to_shared(q_desc, [r_rel, i_h * K], once, q_s)
    tma.async_copy_global_to_shared(scr_desc, [scr_row, 0], once, dsg_s)
    tma.async_copy_global_to_shared(scr_desc, [scr_row + BT, 0], once, dag_s)
    for i in gl.static_range(NUM_STAGES):
        _issue_step(i, NV, col_v, r_rel, s_row, s_desc, ds_desc, u_desc, dy_desc, do_desc, s_s, ds_s, u_s, dy_s, do_s,
                    bars, BV, NUM_STAGES)

    # The chunk's decays (the twin's _chunk_gates): gc sums the finite log2 decays, seg the resets;
    # scanned in a 1-D layout (a scan along a product layout's rows does not lower), then moved.
    o_t = gl.arange(0, BT, layout=row)
    rows = bos + r_rel + o_t.to(gl.int64)
    m_r = rows < eos
    o_l = gl.arange(0, BT, layout=line)
    rows_l = bos + r_rel + o_l.to(gl.int64)
    if HAS_G:
        b_g = gl.load(g + rows_l * HV + i_hv, mask=rows_l < eos, other=0.0).to(gl.float32) * 1.4426950408889634
    else:
        b_g = gl.zeros([BT], gl.float32, layout=line)
    bad = (b_g != b_g) | (b_g == float("inf"))
    b_g = gl.where(bad, 0.0, b_g)
    reset = b_g < -150.0
    gc = gl.associative_scan(gl.where(reset, 0.0, b_g), 0, _plus)
    seg = gl.associative_scan(reset.to(gl.int32), 0, _plus)
    seg_last = gl.sum(gl.where(o_l == BT - 1, seg, 0), axis=0)
    gc_last = gl.sum(gl.where(o_l == BT - 1, gc, 0.0), axis=0)
    lam_l = gl.where(seg == 0, gl.exp2(gc), 0.0)
    gam = gl.where(seg == seg_last, gl.exp2(gl.where(seg == seg_last, gc_last - gc, 0.0)), 0.0)
    lam_end = gl.sum(gl.where(o_l == BT - 1, lam_l, 0.0), axis=0)
    lam = gl.convert_layout(lam_l, row)
    b_beta = gl.load(beta + rows * HV + i_hv, mask=m_r, other=0.0).to(gl.float32)
    gam_b = gl.convert_layout(gam, gl.SliceLayout(1, blk))
    lb_b = gl.convert_layout(-(lam * b_beta), gl.SliceLayout(1, blk))

    # dq's and dk's sums over the value columns, S . dS beside them.
    acc_k = gl.zeros([BT, K], gl.float32, layout=mmaK)
    acc_q = gl.zeros([BT, K], gl.float32, layout=mmaK)
    sds = gl.zeros([K], gl.float32, layout=gl.SliceLayout(1, blk_kv))
    for j in range(NV):
        s = j % NUM_STAGES
        mbarrier.wait(bars.index(s), (j // NUM_STAGES) & 1)
        A1 = gl.convert_layout((gam_b[:, None] * u_s.index(s).load(blk).to(gl.float32)).to(DT), aK)
        acc_k = warpgroup_mma(A1, ds_s.index(s).permute((1, 0)), acc_k, is_async=True)
        A2 = gl.convert_layout((lb_b[:, None] * dy_s.index(s).load(blk).to(gl.float32)).to(DT), aK)
        acc_k = warpgroup_mma(A2, s_s.index(s).permute((1, 0)), acc_k, is_async=True)
        acc_q = warpgroup_mma(do_s.index(s), s_s.index(s).permute((1, 0)), acc_q, is_async=True)
        sds += gl.sum(s_s.index(s).load(blk_kv).to(gl.float32) * ds_s.index(s).load(blk_kv).to(gl.float32), axis=1)
        acc_k, acc_q = warpgroup_mma_wait(num_outstanding=0, deps=(acc_k, acc_q))
        _issue_step(j + NUM_STAGES, NV, col_v, r_rel, s_row, s_desc, ds_desc, u_desc, dy_desc, do_desc, s_s, ds_s,
                    u_s, dy_s, do_s, bars, BV, NUM_STAGES)

    # q and k normalised in place (their raw rows are read again for the norm's backward).
    mbarrier.wait(once, 0)
    qr, rq = _normalised(q_s, mmaK, USE_L2NORM)
    kr, rk = _normalised(k_s, mmaK, USE_L2NORM)
    kf = kr * rk[:, None]
    gkdsu = gl.sum(kf * acc_k, axis=1) + gl.load(bdyks + rows * HV + i_hv, mask=m_r, other=0.0)
    gl.thread_barrier()  # every raw tile read before any is overwritten
    q_s.store((qr * rq[:, None]).to(DT))
    k_s.store(kf.to(DT))
    fence_async_shared()
    gl.thread_barrier()
    # dk: (dA o G) K + (dA o G)^T K + (dscores o G)^T Q onto the state sum.
    acc_k = warpgroup_mma(dag_s, k_s, acc_k, is_async=True)
    acc_k = warpgroup_mma(dag_s.permute((1, 0)), k_s, acc_k, is_async=True)
    acc_k = warpgroup_mma(dsg_s.permute((1, 0)), q_s, acc_k, is_async=True)
    acc_k = warpgroup_mma_wait(num_outstanding=0, deps=(acc_k,))

    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, mmaK))
    if HAS_G:
        # gam o (K dS) . U through gam's exclusive cumulative sum, S . dS at the chunk's last row.
        gkdsu = gl.convert_layout(gkdsu, line)
        d_g = gl.convert_layout((gl.associative_scan(gkdsu, 0, _plus) - gkdsu) + lam_end * gl.sum(sds, axis=0), row)
    head_rows = rows * H + i_h
    acc_k = _l2norm_backward(acc_k, k, head_rows, o_k, m_r, rk, K, USE_L2NORM)
    gl.store(dk + (rows * HV + i_hv)[:, None] * K + o_k[None, :], acc_k.to(dk.dtype.element_ty), mask=m_r[:, None])

    # dq: scale lam o dO S^T, its projection on q into dg, then (dscores o G) K onto it.
    slam = scale * lam
    if HAS_G:
        qf = gl.load(q + head_rows[:, None] * K + o_k[None, :], mask=m_r[:, None], other=0.0).to(gl.float32)
        doqs = slam * gl.sum(qf * rq[:, None] * acc_q, axis=1)
        # Added as the twin's two passes add them: dk's terms first, then dq's.
        p_dg = dg + rows * HV + i_hv
        d_q = gl.convert_layout(gl.associative_scan(gl.convert_layout(doqs, line), 0, _plus, reverse=True), row)
        d_g = (gl.load(p_dg, mask=m_r, other=0.0) + d_g) + d_q
        gl.store(p_dg, d_g, mask=m_r)
    acc_q = warpgroup_mma(dsg_s, k_s, slam[:, None] * acc_q, is_async=True)
    acc_q = warpgroup_mma_wait(num_outstanding=0, deps=(acc_q,))
    acc_q = _l2norm_backward(acc_q, q, head_rows, o_k, m_r, rq, K, USE_L2NORM)
    gl.store(dq + (rows * HV + i_hv)[:, None] * K + o_k[None, :], acc_q.to(dq.dtype.element_ty), mask=m_r[:, None])
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))
    mbarrier.invalidate(once)
