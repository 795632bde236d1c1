"""The delta rule's dq and dk (the parallel stage's state side) in Gluon: the Triton twin is
:func:`recurscan.kernels.delta.backward.chunk_delta_bwd_dqdk_kernel` with ``PART = DQDK_BOTH``
(same arguments), which has the algebra. GPU only (sm_90); the planner takes it where
:func:`recurscan.plan.delta.gluon_twins` allows.

What differs from the twin:

1. Persistent programs (the launch's grid: one an SM, eight warps), each taking (chunk, value head)
   items ``pid, pid + programs, ...`` (under GVA, (chunk, q/k head) items, the group's value heads
   one after another): the next item's tiles load while this one's epilogue runs.
2. dq's and dk's sums over the value columns run in one loop, each tile of S read once (the twin
   walks the columns twice, dk's pass then dq's: two [BT, K] accumulators were more registers than
   Triton's build of that loop held without spilling). The tiles (S, dS, U, dY, dO) come by bulk
   tensor copies into a ring of NUM_STAGES stages of BV columns, the steps of one item after the
   other's; q, k and the first half's score tiles by one copy an item, issued when the item before
   has used them (under GVA each value head's score tiles by a copy of their own).
3. The products take the score tiles' transposes as transposed shared-memory operands: no product
   result is ever a transposed operand (fla's issue 640), and no scratch round trip for them.
4. The normalised q and k the epilogue's products need sit beside the raw tiles in shared memory
   (the L2 norm's backward reads those), and take dk and dq on their way out (16-byte stores).
5. The copies read whole tensors, so a chunk's rows past its sequence's end hold the next
   sequence's (the twin's masks read zeros): q's and k's normalised rows are selected to zero there
   (after the scaling: those rows' norm factors may be NaN, and 0 x NaN is NaN); those rows of U, dY
   and dO reach only their own rows of the sums, which are not stored, and dq's projection is
   masked before its reverse cumulative sum (the one sum that runs from later rows to earlier).
6. Gated Delta Product (M = 2, every stage on the expanded stream of M copies a token): the query
   sits on each token's last copy, so a chunk has BT / M query rows, its tokens. q, dO and
   (dscores o G)'s query rows (a descriptor of the scratch's rows M apart) come by token into the
   first BT / M rows of their [BT, ...] buffers, whose other rows are zeroed once: dq's sum and the
   products on Q are the twin's over its query rows with the other copies' zero rows (the same
   terms; rows in another order), dq leaves from those first rows to the token stream, and a
   token's dg joins its first copy's k-side terms (picked from the expanded rows) with the reverse
   cumulative sum of dO . (Q S) over the tokens, whose association differs from the twin's over
   the expanded rows: float32 rounding.

The arithmetic is the twin's, in the same order, except the reductions (each row's |q|, |k|, the
projections on q and k, S . dS), whose order follows the layout: the results agree with the twin's
to float32 rounding, then bf16's (the GPU test compares both with the float64 oracle).

Scope (``plan.delta.gluon_twins`` checks it): M = 1 with one value head a q/k head (H = HV) or a
GVA group of at most ``plan.delta.GLUON_DQDK_GROUP`` summed in the kernel (GROUP = HV / H; its
heads are unrolled), or M = 2 with H = HV; 16-bit inputs, K 64 or 128, V a multiple of BV with at
least NUM_STAGES steps; dense or varlen. The planner takes it at K = 128 alone
(``plan.delta.GLUON_DQDK_KEY_DIMS``: at K = 64 the Triton kernel was faster).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)


#: A [BT] vector's layout in one warpgroup for the gates' prefix sums and dg's scans: one element a
#: lane, the chunk's two halves on alternate warps, as this kernel's 8-warp line and the Triton
#: kernels' vectors at 4 warps, so the sums associate as theirs and the gates come out their bits
#: (another association moves dg and dk off the Triton kernel's where decays are strong:
#: docs/perf-history.md, 2026-12-05, 815a12e..94411ab).
SCAN_LINE = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))


@gluon.jit
def _plus(a, b):
    return a + b


@gluon.jit
def _chunk_place(i_c, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, BT: gl.constexpr,
                 IS_VARLEN: gl.constexpr, M: gl.constexpr = 1):
    """Parallel-stage chunk i_c's (valid, eos, r0, cs): the end of its sequence's rows, the chunk's
    first row (on the expanded stream of M rows a token) and its chunk-state row (one outside
    [0, n_cs_rows), from a wrong chunk_offsets entry, becomes n_cs_rows, the first row past them:
    read as zeros, as the twins' masks do); valid is False for a padding chunk (computed on, not
    stored)."""
    if IS_VARLEN:
        i_n = gl.load(chunk_indices + i_c * 2).to(gl.int64)
        i_t = gl.load(chunk_indices + i_c * 2 + 1).to(gl.int64)
        n_ok = (i_n >= 0) & (i_n < n_seq)
        i_n = gl.where(n_ok, i_n, 0)
        bos = gl.minimum(gl.maximum(gl.load(cu_seqlens + i_n).to(gl.int64), 0), T) * M
        eos = gl.minimum(gl.maximum(gl.load(cu_seqlens + i_n + 1).to(gl.int64), bos // M), T) * M
        valid = n_ok & (i_t >= 0) & (i_t * BT < eos - bos)
        i_t = gl.where(valid, i_t, 0)
        cs = gl.load(chunk_offsets + i_n).to(gl.int64) + i_t
    else:
        NTd = (T * M + BT - 1) // BT
        i_n = (i_c // NTd).to(gl.int64)
        i_t = (i_c % NTd).to(gl.int64)
        bos = i_n * T * M
        eos = bos + T * M
        valid = i_c >= 0
        cs = i_c.to(gl.int64)
    cs = gl.where((cs >= 0) & (cs < n_cs_rows), cs, n_cs_rows)
    return valid, eos, bos + i_t * BT, cs


@gluon.jit
def _item(it, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, HV: gl.constexpr, K: gl.constexpr,
          BT: gl.constexpr, IS_VARLEN: gl.constexpr, GROUP: gl.constexpr = 1, M: gl.constexpr = 1):
    """Item ``it`` = (chunk i_c, value heads i_hv ... i_hv + GROUP - 1, i_hv = it % (HV / GROUP) x
    GROUP): (valid, eos, r0, s_row, scr_row): :func:`_chunk_place`'s, with the row of its first
    value head in the chunk states seen as [rows x HV x K, V] and in the scratch seen as
    [chunks x HV x 2 x BT, BT] (the next value head's K and 2 BT rows on)."""
    NG: gl.constexpr = HV // GROUP
    i_hv = (it % NG) * GROUP
    i_c = it // NG
    valid, eos, r0, cs = _chunk_place(i_c, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, BT,
                                      IS_VARLEN, M)
    return valid, eos, r0, (cs * HV + i_hv).to(gl.int32) * K, ((i_c * HV + i_hv) * 2).to(gl.int32) * BT


@gluon.jit
def _issue_step(g, n_steps, r0, col_v, s_row, s_desc, ds_desc, u_desc, dy_desc, do_desc, s_s, ds_s, u_s, dy_s,
                do_s, bars, NV: gl.constexpr, BV: gl.constexpr, NUM_STAGES: gl.constexpr, GROUP: gl.constexpr = 1):
    """The bulk copies of the program's step g into stage g % NUM_STAGES; none past its last step.
    An item (first row r0, its first value head's columns col_v and chunk-state row s_row) takes
    GROUP x NV steps: each value head's NV steps of BV columns, one head after the other. dO comes
    by token (``do_desc``'s rows, BT / M of them) into the stage's first rows."""
    s = g % NUM_STAGES
    pred = g < n_steps
    bar = bars.index(s)
    nbytes: gl.constexpr = (2 * s_desc.block_type.nbytes + 2 * u_desc.block_type.nbytes
                            + do_desc.block_type.nbytes)
    BQ: gl.constexpr = do_desc.block_type.shape[0]  # the chunk's tokens
    mbarrier.expect(bar, nbytes, pred=pred)
    j = g % NV
    h = (g // NV) % GROUP  # the item's value head
    c = col_v + h * (NV * BV) + j * BV
    r = r0.to(gl.int32)
    row_s = s_row + h * s_desc.block_type.shape[0]
    tma.async_copy_global_to_shared(s_desc, [row_s, j * BV], bar, s_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(ds_desc, [row_s, j * BV], bar, ds_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(u_desc, [r, c], bar, u_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(dy_desc, [r, c], bar, dy_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(do_desc, [r // (u_desc.block_type.shape[0] // BQ), c], bar,
                                    do_s.index(s).slice(0, BQ), pred=pred)


@gluon.jit
def _issue_once(pred, r0, col_qk, scr_row, k_desc, q_desc, scr_desc, k_s, q_s, dsg_s, dag_s, once,
                TILES: gl.constexpr = True, scrq_desc=None):
    """An item's q, k and (TILES) score tiles, one copy each, onto the barrier ``once``; q by token
    (``q_desc``'s rows, BT / M of them) into q_s's first rows, and with M > 1 (dsg's query rows:
    ``scrq_desc``, :func:`_query_rows_descriptor`; at M = 1 ``scr_desc`` itself) the same for
    (dscores o G)."""
    BQ: gl.constexpr = q_desc.block_type.shape[0]  # the chunk's tokens
    M: gl.constexpr = k_desc.block_type.shape[0] // BQ
    nbytes: gl.constexpr = k_desc.block_type.nbytes + q_desc.block_type.nbytes + \
        ((scr_desc.block_type.nbytes + scrq_desc.block_type.nbytes) if TILES else 0)
    mbarrier.expect(once, nbytes, pred=pred)
    r = r0.to(gl.int32)
    tma.async_copy_global_to_shared(k_desc, [r, col_qk], once, k_s, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [r // M, col_qk], once, q_s.slice(0, BQ), pred=pred)
    if TILES:
        if M == 1:
            _issue_tiles(pred, scr_row, scr_desc, dsg_s, dag_s, once, False)
        else:
            tma.async_copy_global_to_shared(scrq_desc, [scr_row // M, 0], once, dsg_s.slice(0, BQ), pred=pred)
            tma.async_copy_global_to_shared(scr_desc, [scr_row + dsg_s.shape[0], 0], once, dag_s, pred=pred)


@gluon.jit
def _issue_tiles(pred, scr_row, scr_desc, dsg_s, dag_s, bar, EXPECT: gl.constexpr = True):
    """A value head's score tiles, (dscores o G) and (dA o G), onto ``bar``."""
    if EXPECT:
        mbarrier.expect(bar, 2 * scr_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(scr_desc, [scr_row, 0], bar, dsg_s, pred=pred)
    tma.async_copy_global_to_shared(scr_desc, [scr_row + dsg_s.shape[0], 0], bar, dag_s, pred=pred)


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
def _projection(x_s, r, m_r, acc):
    """rowsum(X o acc), X the normalised rows of the raw tile ``x_s`` (factors ``r``), rows past the
    sequence's end (``m_r`` False) zero."""
    x = gl.where(m_r[:, None], x_s.load(acc.type.layout).to(gl.float32), 0.0) * r[:, None]
    return gl.sum(x * acc, axis=1)


@gluon.jit
def _tile_offsets(stride: gl.constexpr, layout: gl.constexpr, BT: gl.constexpr, K: gl.constexpr):
    """int32 offsets of a [BT, K] tile of rows ``stride`` apart, in ``layout``: formed where used (a
    tile of 64-bit addresses held across the item loop took 128 registers)."""
    o_r = gl.arange(0, BT, layout=gl.SliceLayout(1, layout))
    o_c = gl.arange(0, K, layout=gl.SliceLayout(0, layout))
    return (o_r * stride)[:, None] + o_c[None, :]


@gluon.jit
def _store_rows(dst, x, stage, n_rows, valid, stride: gl.constexpr, layout: gl.constexpr):
    """A [BT, K] float32 tile ``x`` to the rows of ``dst`` (``stride`` elements apart) below
    ``n_rows``, in dst's dtype, through the shared-memory tile ``stage`` (so each thread stores
    16-byte runs of a row); nothing where not ``valid``."""
    stage.store(x.to(stage.dtype))
    gl.thread_barrier()
    y = stage.load(layout)
    o_r = gl.arange(0, y.shape[0], layout=gl.SliceLayout(1, layout))
    offs = _tile_offsets(stride, layout, y.shape[0], y.shape[1])
    gl.store(dst + offs, y.to(dst.dtype.element_ty), mask=(o_r < n_rows)[:, None] & valid)


@gluon.jit
def _segment_gates(b_g, o_l, BT: gl.constexpr):
    """A value head's gates on the chunk's rows from its log2 decays ``b_g`` (``o_l``'s layout, a
    1-D one: a scan along a product layout's rows does not lower): ``(gc, seg, lam, gam)``, the
    prefix sums of the finite decays and of the resets (a decay below -150), lam = 2^gc before the
    first reset, gam the decay to the chunk's end within the last segment; a NaN or +inf decay
    counts as 0."""
    bad = (b_g != b_g) | (b_g == float("inf"))
    b_g = gl.where(bad, 0.0, b_g)
    reset = b_g < -150.0
    gc = gl.associative_scan(gl.where(reset, 0.0, b_g), 0, _plus)
    seg = gl.associative_scan(reset.to(gl.int32), 0, _plus)
    seg_last = gl.sum(gl.where(o_l == BT - 1, seg, 0), axis=0)
    gc_last = gl.sum(gl.where(o_l == BT - 1, gc, 0.0), axis=0)
    lam = gl.where(seg == 0, gl.exp2(gc), 0.0)
    gam = gl.where(seg == seg_last, gl.exp2(gl.where(seg == seg_last, gc_last - gc, 0.0)), 0.0)
    return gc, seg, lam, gam


@gluon.jit
def _gates(g, beta, rows, rows_l, eos, i_hv, HV: gl.constexpr, HAS_G: gl.constexpr, row: gl.constexpr,
           line: gl.constexpr, M: gl.constexpr = 1):
    """The chunk's decays for value head i_hv (the twin's _chunk_gates, :func:`_segment_gates`; on
    the expanded stream a token's decay sits on its first copy); returns lam (along ``row``), gam
    (along ``line``), lam at the chunk's last row, and beta. HAS_G False: no decay."""
    BT: gl.constexpr = rows_l.shape[0]
    o_l = gl.arange(0, BT, layout=line)
    if HAS_G:
        b_g = gl.load(g + (rows_l // M) * HV + i_hv, mask=(rows_l < eos) & (rows_l % M == 0),
                      other=0.0).to(gl.float32) * 1.4426950408889634
    else:
        b_g = gl.zeros([BT], gl.float32, layout=line)
    gc, seg, lam_l, gam = _segment_gates(b_g, o_l, BT)
    lam_end = gl.sum(gl.where(o_l == BT - 1, lam_l, 0.0), axis=0)
    b_beta = gl.load(beta + rows * HV + i_hv, mask=rows < eos, other=0.0).to(gl.float32)
    return gl.convert_layout(lam_l, row), gam, lam_end, b_beta


@gluon.jit
def _dg_state_terms(gkdsu, doqs, lam_end, sds, line: gl.constexpr, row: gl.constexpr):
    """dg's state terms of a value head: gam o (K dS) . U through gam's exclusive cumulative sum,
    S . dS at the chunk's last row, then dO . (Q S) through lam's reverse one (the twin's passes
    add them in this order)."""
    gkdsu = gl.convert_layout(gkdsu, line)
    d_g = gl.convert_layout((gl.associative_scan(gkdsu, 0, _plus) - gkdsu) + lam_end * gl.sum(sds, axis=0), row)
    d_q = gl.convert_layout(gl.associative_scan(gl.convert_layout(doqs, line), 0, _plus, reverse=True), row)
    return d_g, d_q


@gluon.jit
def _dqdk_descriptors(q, k, u, dy, do, states, dstates, scratch, T, n_seq, n_cs_rows, H: gl.constexpr,
                      HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
                      IS_VARLEN: gl.constexpr, DT: gl.constexpr, M: gl.constexpr = 1):
    """The bulk copies' descriptors: k ([BT, K] tiles) and U, dY ([BT, BV]) over the rows of every
    sequence (the dense batch's, or the packed varlen one) on the expanded stream (M rows a token),
    q ([BT / M, K]) and dO ([BT / M, BV]) over its tokens, S and dS ([K, BV] tiles of the chunk
    states seen as [rows x HV x K, V]: rows outside [0, n_cs_rows), from a wrong chunk_offsets entry,
    read zeros) and the first half's score tiles ([BT, BT] of [chunks x HV x 2 x BT, BT]). Each
    descriptor's tile takes the layout of the shared-memory buffer it lands in (BT rows)."""
    l_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], DT)
    l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DT)
    l_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K, BV], DT)
    l_tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], DT)
    tokens = T if IS_VARLEN else n_seq * T
    rows_all = tokens * M
    BQ: gl.constexpr = BT // M
    k_desc = tma.make_tensor_descriptor(k, [rows_all, H * K], [H * K, 1], [BT, K], l_qk)
    q_desc = tma.make_tensor_descriptor(q, [tokens, H * K], [H * K, 1], [BQ, K], l_qk)
    u_desc = tma.make_tensor_descriptor(u, [rows_all, HV * V], [HV * V, 1], [BT, BV], l_tv)
    dy_desc = tma.make_tensor_descriptor(dy, [rows_all, HV * V], [HV * V, 1], [BT, BV], l_tv)
    do_desc = tma.make_tensor_descriptor(do, [tokens, HV * V], [HV * V, 1], [BQ, BV], l_tv)
    s_desc = tma.make_tensor_descriptor(states, [n_cs_rows * (HV * K), V], [V, 1], [K, BV], l_kv)
    ds_desc = tma.make_tensor_descriptor(dstates, [n_cs_rows * (HV * K), V], [V, 1], [K, BV], l_kv)
    scr_desc = tma.make_tensor_descriptor(scratch, [n_cs_rows * (HV * 2 * BT), BT], [BT, 1], [BT, BT], l_tt)
    return k_desc, q_desc, u_desc, dy_desc, do_desc, s_desc, ds_desc, scr_desc


@gluon.jit
def _query_rows_descriptor(scratch, n_cs_rows, HV: gl.constexpr, BT: gl.constexpr, M: gl.constexpr,
                           DT: gl.constexpr):
    """(dscores o G)'s query rows (each token's last copy: rows M - 1, 2 M - 1, ... of a chunk's
    first [BT, BT] tile in the scratch) as [BT / M, BT] tiles: the scratch's rows M apart, from its
    row M - 1, so that a chunk's tile starts at row scr_row / M."""
    l_tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], DT)
    return tma.make_tensor_descriptor(scratch + (M - 1) * BT, [n_cs_rows * (HV * 2 * BT) // M, BT], [M * BT, 1],
                                      [BT // M, BT], l_tt)


@gluon.jit
def _copy_rows(x, copy: gl.constexpr, M: gl.constexpr, layout: gl.constexpr, pick: gl.constexpr):
    """y[i] = x[i M + copy] for i < BT / M, 0 below (x a [BT] vector along the expanded stream's
    rows, y along the chunk's tokens, in ``layout``; ``pick`` a [BT, BT] layout): a masked sum of
    one term a row, so the values are x's bits."""
    BT: gl.constexpr = x.shape[0]
    o_i = gl.arange(0, BT, layout=gl.SliceLayout(1, pick))
    o_j = gl.arange(0, BT, layout=gl.SliceLayout(0, pick))
    xj = gl.convert_layout(x, gl.SliceLayout(0, pick))
    sel = (o_j[None, :] == o_i[:, None] * M + copy) & (o_i < BT // M)[:, None]
    return gl.convert_layout(gl.sum(gl.where(sel, xj[None, :], 0.0), axis=1), layout)


@gluon.jit
def gluon_bwd_dqdk_kernel(
    q, k, g, beta, do, u, dy, states, dstates, dq, dk, dg, bdyks, scratch,
    cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, scale, n_cs_rows,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_G: gl.constexpr, USE_L2NORM: gl.constexpr,
    DOT_PRECISION: gl.constexpr, DT: gl.constexpr, M: gl.constexpr = 1, PART: gl.constexpr = 3,
    GROUP: gl.constexpr = 1, NUM_STAGES: gl.constexpr = 2,
):
    """Persistent programs over the twin's items, (chunk, GROUP value heads) ``pid, pid + programs,
    ...`` of ``n_cs_rows x HV / GROUP`` (the twin's grid). Per item, from S entering the chunk and dS
    leaving it (``states``, ``dstates``), U and dY (``u``, ``dy``), dO, the first half's
    (dscores o G) and (dA o G) (``scratch``) and ``bdyks``:

        dq = (dscores o G) K + scale lam o dO S^T
        dk = (dscores o G)^T Q + (dA o G) K + (dA o G)^T K + (gam o U) dS^T - (lam beta o dY) S^T

    then the L2 norm's backward, and dg's state terms added to ``dg`` (the twin's docstring has
    them). BK, DOT_PRECISION, M and PART are the twin's arguments (K wide tiles, 16-bit products,
    M 1 or 2 (item 6 of the module's docstring), dk and dq both). GROUP: 1, one value head a
    program (H = HV); or HV / H, a GVA group's value heads summed in the accumulators one after
    another, dO scaled by scale lam per head, each head's dg projections the differences of the
    sums' projections before and after it, dq and dk written per q/k head (the twin's GROUP).
    Eight warps."""
    gl.static_assert(M == 1 or (M == 2 and GROUP == 1), "GDN (M = 1), or Gated Delta Product at M = 2, H = HV")
    gl.static_assert(GROUP == 1 or GROUP * H == HV, "one value head a program, or a GVA group")
    gl.static_assert(GROUP > 1 or H == HV, "one value head a q/k head")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    gl.static_assert(V % BV == 0, "V a multiple of BV")
    NV: gl.constexpr = V // BV
    gl.static_assert(NV >= NUM_STAGES, "at least NUM_STAGES value steps an item")
    NG: gl.constexpr = HV // GROUP  # items a chunk
    STEPS: gl.constexpr = GROUP * NV  # ring steps an item
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    n_items = n_cs_rows * NG
    n_mine = (n_items - pid + programs - 1) // programs  # this program's items
    n_steps = n_mine * STEPS

    k_desc, q_desc, u_desc, dy_desc, do_desc, s_desc, ds_desc, scr_desc = _dqdk_descriptors(
        q, k, u, dy, do, states, dstates, scratch, T, n_seq, n_cs_rows, H, HV, K, V, BT, BV, IS_VARLEN, DT, M)
    if M > 1:
        scrq_desc = _query_rows_descriptor(scratch, n_cs_rows, HV, BT, M, DT)
    else:
        scrq_desc = scr_desc
    # Two warpgroups, each with half of every [BT, K] tile's columns: three such tiles live at once
    # in the epilogue (two sums and a row tile) fit their registers without spilling.
    gl.static_assert(gl.num_warps() == 8, "two warpgroups")
    mmaK: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                   instr_shape=[16, K // 2, 16])
    aK: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mmaK, k_width=2)
    row: gl.constexpr = gl.SliceLayout(1, mmaK)  # along a [BT, K] tile's rows
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [8, 1], [1, 0])  # [BT, BV] tiles scaled by row
    blk_kv: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [8, 1], [1, 0])  # [K, BV] state tiles
    line: gl.constexpr = gl.BlockedLayout([1], [32], [8], [0])  # a [BT] vector for the scans
    pick: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])  # M > 1: _copy_rows's tile
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [8, 1], [1, 0])  # 16-byte stores of rows

    s_s = gl.allocate_shared_memory(DT, [NUM_STAGES, K, BV], s_desc.layout)
    ds_s = gl.allocate_shared_memory(DT, [NUM_STAGES, K, BV], s_desc.layout)
    u_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], u_desc.layout)
    dy_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], u_desc.layout)
    do_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], u_desc.layout)
    k_s = gl.allocate_shared_memory(DT, [BT, K], k_desc.layout)  # raw rows
    q_s = gl.allocate_shared_memory(DT, [BT, K], k_desc.layout)
    kn_s = gl.allocate_shared_memory(DT, [BT, K], k_desc.layout)  # normalised; then dq, dk on their way out
    qn_s = gl.allocate_shared_memory(DT, [BT, K], k_desc.layout)
    dsg_s = gl.allocate_shared_memory(DT, [BT, BT], scr_desc.layout)  # dscores o G
    dag_s = gl.allocate_shared_memory(DT, [BT, BT], scr_desc.layout)  # dA o G
    bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    once = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    tiles = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())  # GROUP > 1: a head's score tiles
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(i), count=1)
    mbarrier.init(once, count=1)
    mbarrier.init(tiles, count=1)
    if M > 1:
        # Query-first rows: a chunk's BT / M tokens of q, dO and (dscores o G) land in the first rows
        # of their [BT, ...] buffers, whose other rows stay zero (written once here), so the
        # products over those rows are the twin's with its other copies' zero rows.
        q_s.store(gl.zeros([BT, K], DT, layout=blk))
        dsg_s.store(gl.zeros([BT, BT], DT, layout=blk))
        for i in gl.static_range(NUM_STAGES):
            do_s.index(i).store(gl.zeros([BT, BV], DT, layout=blk))
        fence_async_shared()
        gl.thread_barrier()

    # The first item's tiles (one value head: its score tiles too); the ring's first steps.
    valid, eos, r0, s_row, scr_row = _item(pid, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, HV,
                                           K, BT, IS_VARLEN, GROUP, M)
    i_h = pid % NG if GROUP > 1 else pid % HV  # the q/k head
    _issue_once(n_mine > 0, r0, i_h * K, scr_row, k_desc, q_desc, scr_desc, k_s, q_s, dsg_s, dag_s, once, GROUP == 1,
                scrq_desc)
    for i in gl.static_range(NUM_STAGES):
        _issue_step(i, n_steps, r0, (pid % NG) * GROUP * V, s_row, s_desc, ds_desc, u_desc, dy_desc, do_desc, s_s,
                    ds_s, u_s, dy_s, do_s, bars, NV, BV, NUM_STAGES, GROUP)
    for m in range(n_mine):
        gl.thread_barrier()  # the item before has read its staged outputs
        it = pid + m * programs
        i_h = it % NG if GROUP > 1 else it % HV  # the q/k head (GROUP 1: the value head's)
        i_hv0 = (it % NG) * GROUP  # the item's first value head
        # The next item's place, read now: its steps are issued from this item's loop on.
        it_n = gl.minimum(it + programs, n_items - 1)  # past the last item: never issued
        n_valid, n_eos, n_r0, n_s_row, n_scr_row = _item(it_n, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq,
                                                         n_cs_rows, HV, K, BT, IS_VARLEN, GROUP, M)
        n_hv0 = (it_n % NG) * GROUP

        o_t = gl.arange(0, BT, layout=row)
        o_l = gl.arange(0, BT, layout=line)
        rows = r0 + o_t.to(gl.int64)
        m_r = rows < eos
        rows_l = r0 + o_l.to(gl.int64)
        acc_k = gl.zeros([BT, K], gl.float32, layout=mmaK)  # dk's sums (the group's so far)
        acc_q = gl.zeros([BT, K], gl.float32, layout=mmaK)  # GROUP 1: dO S^T, then dq; else the group's dq so far
        proj_k = gl.zeros([BT], gl.float32, layout=row)  # GROUP > 1: rowsum(K o acc_k) after the heads before
        proj_q = gl.zeros([BT], gl.float32, layout=row)
        for h in gl.static_range(GROUP):  # unrolled: GROUP 1 is one head's straight code
            i_hv = i_hv0 + h
            if GROUP > 1:  # this head's score tiles (the head before has used the buffers)
                _issue_tiles(True, scr_row + h * (2 * BT), scr_desc, dsg_s, dag_s, tiles)
            lam, gam, lam_end, b_beta = _gates(g, beta, rows, rows_l, eos, i_hv, HV, HAS_G, row, line, M)
            gam_b = gl.convert_layout(gam, gl.SliceLayout(1, blk))
            lb_b = gl.convert_layout(-(lam * b_beta), gl.SliceLayout(1, blk))
            slam_b = gl.convert_layout(scale * lam, gl.SliceLayout(1, blk))
            b_bdyks = gl.load(bdyks + rows * HV + i_hv, mask=m_r, other=0.0)

            # dq's and dk's sums over the value columns, S . dS beside them.
            sds = gl.zeros([K], gl.float32, layout=gl.SliceLayout(1, blk_kv))
            for j in range(NV):
                step = m * STEPS + h * NV + j
                s = step % NUM_STAGES
                mbarrier.wait(bars.index(s), (step // NUM_STAGES) & 1)
                A1 = gl.convert_layout((gam_b[:, None] * u_s.index(s).load(blk).to(gl.float32)).to(DT), aK)
                acc_k = warpgroup_mma(A1, ds_s.index(s).permute((1, 0)), acc_k, is_async=True)
                A2 = gl.convert_layout((lb_b[:, None] * dy_s.index(s).load(blk).to(gl.float32)).to(DT), aK)
                acc_k = warpgroup_mma(A2, s_s.index(s).permute((1, 0)), acc_k, is_async=True)
                if GROUP > 1:  # dO scaled by this head's scale lam before the sum over heads
                    A3 = gl.convert_layout((slam_b[:, None] * do_s.index(s).load(blk).to(gl.float32)).to(DT), aK)
                    acc_q = warpgroup_mma(A3, s_s.index(s).permute((1, 0)), acc_q, is_async=True)
                else:
                    acc_q = warpgroup_mma(do_s.index(s), s_s.index(s).permute((1, 0)), acc_q, is_async=True)
                sds += gl.sum(s_s.index(s).load(blk_kv).to(gl.float32) * ds_s.index(s).load(blk_kv).to(gl.float32),
                              axis=1)
                acc_k, acc_q = warpgroup_mma_wait(num_outstanding=0, deps=(acc_k, acc_q))
                # Stage s is free: the step NUM_STAGES on, of this item or the next.
                ahead = step + NUM_STAGES
                nxt = ahead // STEPS > m
                _issue_step(ahead, n_steps, gl.where(nxt, n_r0, r0), gl.where(nxt, n_hv0, i_hv0) * V,
                            gl.where(nxt, n_s_row, s_row), s_desc, ds_desc, u_desc, dy_desc, do_desc, s_s, ds_s, u_s,
                            dy_s, do_s, bars, NV, BV, NUM_STAGES, GROUP)
            if GROUP > 1:
                if h == 0:  # q and k normalised (rows past the sequence's end zeroed) beside their raw tiles
                    mbarrier.wait(once, m & 1)
                    qr, rq = _normalised(q_s, mmaK, USE_L2NORM)
                    qn_s.store(gl.where(m_r[:, None], qr * rq[:, None], 0.0).to(DT))
                    kr, rk = _normalised(k_s, mmaK, USE_L2NORM)
                    kn_s.store(gl.where(m_r[:, None], kr * rk[:, None], 0.0).to(DT))
                    fence_async_shared()
                    gl.thread_barrier()
                # This head's dg terms: the projections' differences from the heads before.
                if HAS_G:
                    gkdsu = _projection(k_s, rk, m_r, acc_k) - proj_k + b_bdyks
                    doqs = gl.where(m_r, _projection(q_s, rq, m_r, acc_q) - proj_q, 0.0)
                    d_g, d_q = _dg_state_terms(gkdsu, doqs, lam_end, sds, line, row)
                    p_dg = dg + rows * HV + i_hv
                    m_st = m_r & valid
                    gl.store(p_dg, (gl.load(p_dg, mask=m_st, other=0.0) + d_g) + d_q, mask=m_st)
                # The score tiles' products onto both sums.
                mbarrier.wait(tiles, (m * GROUP + h) & 1)
                acc_k = warpgroup_mma(dag_s, kn_s, acc_k, is_async=True)
                acc_k = warpgroup_mma(dag_s.permute((1, 0)), kn_s, acc_k, is_async=True)
                acc_k = warpgroup_mma(dsg_s.permute((1, 0)), qn_s, acc_k, is_async=True)
                acc_q = warpgroup_mma(dsg_s, kn_s, acc_q, is_async=True)
                acc_k, acc_q = warpgroup_mma_wait(num_outstanding=0, deps=(acc_k, acc_q))
                gl.thread_barrier()  # every warp has read this head's score tiles
                if HAS_G:  # the normalised rows loaded again: held across the products they spill
                    proj_k = _projection(k_s, rk, m_r, acc_k)
                    proj_q = _projection(q_s, rq, m_r, acc_q)

        p_row = (r0 * H + i_h) * K  # dk's rows (and dq's at M = 1), per q/k head, from the chunk's first row
        if GROUP > 1:
            # The L2 norm's backward of the group's sums; dk and dq out through the normalised
            # tiles' buffers (every product has read them).
            if USE_L2NORM:  # y = x r: dx = r (dy - y (y . dy))
                kf = k_s.load(mmaK).to(gl.float32) * rk[:, None]
                acc_k = rk[:, None] * (acc_k - kf * gl.sum(kf * acc_k, axis=1)[:, None])
            _store_rows(dk + p_row, acc_k, qn_s, eos - r0, valid, H * K, out_layout)
            if USE_L2NORM:
                qf = q_s.load(mmaK).to(gl.float32) * rq[:, None]
                acc_q = rq[:, None] * (acc_q - qf * gl.sum(qf * acc_q, axis=1)[:, None])
            gl.thread_barrier()  # every warp has read q and k: the next item's
            _issue_once(m + 1 < n_mine, n_r0, (it_n % NG) * K, n_scr_row, k_desc, q_desc, scr_desc, k_s, q_s, dsg_s,
                        dag_s, once, False)
            _store_rows(dq + p_row, acc_q, kn_s, eos - r0, valid, H * K, out_layout)
        else:
            # The query rows: the chunk's tokens, first (M = 1: its rows); m_q, those in the sequence.
            tok0 = r0 // M
            m_q = (o_t < BT // M) & (tok0 + o_t.to(gl.int64) < eos // M)
            # q and k normalised (rows past the sequence's end zeroed) beside their raw tiles.
            mbarrier.wait(once, m & 1)
            qr, rq = _normalised(q_s, mmaK, USE_L2NORM)
            qn_s.store(gl.where(m_q[:, None], qr * rq[:, None], 0.0).to(DT))
            kr, rk = _normalised(k_s, mmaK, USE_L2NORM)
            kf = gl.where(m_r[:, None], kr * rk[:, None], 0.0)
            gkdsu = gl.sum(kf * acc_k, axis=1) + b_bdyks
            kn_s.store(kf.to(DT))
            fence_async_shared()
            gl.thread_barrier()
            # dk: (dA o G) K + (dA o G)^T K + (dscores o G)^T Q onto the state sum; the norm's backward.
            acc_k = warpgroup_mma(dag_s, kn_s, acc_k, is_async=True)
            acc_k = warpgroup_mma(dag_s.permute((1, 0)), kn_s, acc_k, is_async=True)
            acc_k = warpgroup_mma(dsg_s.permute((1, 0)), qn_s, acc_k, is_async=True)
            acc_k = warpgroup_mma_wait(num_outstanding=0, deps=(acc_k,))
            if USE_L2NORM:  # y = x r: dx = r (dy - y (y . dy))
                kf = k_s.load(mmaK).to(gl.float32) * rk[:, None]
                acc_k = rk[:, None] * (acc_k - kf * gl.sum(kf * acc_k, axis=1)[:, None])
            gl.thread_barrier()  # every product has read Q: its buffer takes dk on its way out
            _store_rows(dk + p_row, acc_k, qn_s, eos - r0, valid, H * K, out_layout)
            # dq: its projection on q (for dg), then (dscores o G) K onto scale lam o dO S^T.
            if M == 1:
                slam = scale * lam
            else:  # lam on each token's last copy
                slam = scale * _copy_rows(lam, M - 1, M, row, pick)
            qf = q_s.load(mmaK).to(gl.float32) * rq[:, None]
            if HAS_G:
                doqs = gl.where(m_q, slam * gl.sum(qf * acc_q, axis=1), 0.0)
            acc_q = warpgroup_mma(dsg_s, kn_s, slam[:, None] * acc_q, is_async=True)
            acc_q = warpgroup_mma_wait(num_outstanding=0, deps=(acc_q,))
            if USE_L2NORM:
                acc_q = rq[:, None] * (acc_q - qf * gl.sum(qf * acc_q, axis=1)[:, None])
            gl.thread_barrier()  # every tile of the item read: the next item's q, k and score tiles
            _issue_once(m + 1 < n_mine, n_r0, (it_n % HV) * K, n_scr_row, k_desc, q_desc, scr_desc, k_s, q_s, dsg_s,
                        dag_s, once, True, scrq_desc)
            _store_rows(dq + (tok0 * H + i_h) * K, acc_q, kn_s, gl.minimum(eos // M - tok0, BT // M), valid, H * K,
                        out_layout)
            if HAS_G:  # dg on the token stream: a token's k-side terms are its first copy's
                d_g, d_q = _dg_state_terms(gkdsu, doqs, lam_end, sds, line, row)
                if M > 1:
                    d_g = _copy_rows(d_g, 0, M, row, pick)
                p_dg = dg + (tok0 + o_t.to(gl.int64)) * HV + i_h
                m_st = m_q & valid
                gl.store(p_dg, (gl.load(p_dg, mask=m_st, other=0.0) + d_g) + d_q, mask=m_st)
        valid, eos, r0, s_row, scr_row = n_valid, n_eos, n_r0, n_s_row, n_scr_row
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))
    mbarrier.invalidate(once)
    mbarrier.invalidate(tiles)
