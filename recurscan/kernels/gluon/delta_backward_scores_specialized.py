"""The delta rule's backward, the parallel stage's [BT, BT] side (the scores kernel) in Gluon,
warp-specialised: the Triton twin is
:func:`recurscan.kernels.delta.backward.chunk_delta_bwd_scores_kernel` (same arguments, plus
``n_chunks`` and NUM_STAGES), which has the algebra. GPU only (sm_90).

Persistent programs (one an SM) take the twin's items (chunk, value head) ``pid, pid + programs,
...`` on three partitions:

1. two **scores** warpgroups (the default partition and a worker), item m to warpgroup m % 2:
   each sums dO U^T and dY U^T ([BT, BT]) and the rows' dY . V and dY . (lam o K S) over the
   value steps, then runs the item's epilogue (q and k normalised, Q K^T and K K^T, the gate tile,
   dbeta, dg, the two score tiles stored);
2. the **loads** (one warp): each step's tiles (dO, dY, U, V, lam o K S, [BT, BV] each) into a
   ring of NUM_STAGES stages in the items' order, each stage freed by the warpgroup that read it;
   each item's q and k into its warpgroup's slot, after the item's first NUM_STAGES steps.

So one item's epilogue runs beside the other warpgroup's value loop, where the twin's programs
(two or three an SM, each holding an SM's share of registers) overlap only as the scheduler
interleaves them.

What differs from the twin's arithmetic:

- the copies read whole tensors, so a chunk's rows past its sequence's end hold the next
  sequence's values (the twin's masks read zeros): the sums' rows and columns there, and q's and
  k's rows, are selected out before use (so a NaN in another sequence stays out);
- dg's [BT, BT] part is the reverse cumulative sum of the strict tile's row sums less its column
  sums (sum_{i >= m} sum_{j < m} dSeg_ij), with beta o dY . (lam o K S) in the same sum, where the
  twin sums each row of the tile's reverse cumulative sum; the reductions' order follows the
  layout. dg agrees with the twin's to float32 rounding; the score tiles, dbeta and bdyks are
  formed as the twin forms them (the GPU test, tests/gpu/test_delta_grad_gpu.py).

Gated Delta Product (M > 1, every tile on the expanded stream of M copies a token): a chunk's
rows are held copy-major, the query's copy (M - 1) of its BT / M tokens first, then copy M - 2, ...,
copy 0 (:func:`_stream_row`; each [BT / M, ...] block by a bulk copy of its own, the tensors seen as
[tokens, M x columns]). q and dO, on the token stream, fill the first block of their tiles, whose
other rows are zero (q's written so in its normalisation, dO's once when the kernel starts), so
dO U^T and Q K^T are the twin's with its other copies' zero rows, and every [BT, BT] tile's rows and
columns are in the same order: the masks, the gates and the stores take each row's place on the
stream, and dg's reverse sum runs over the rows put back in the stream's order.

Scope (``plan.delta.gluon_scores_scope``): M 1 or 2, 16-bit inputs, K 64 or 128, V a multiple of
BV = 64; dense or varlen.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .delta_backward_dqdk import SCAN_LINE, _normalised, _plus, _segment_gates
from .gla_backward_dg import _item
from .gla_sweep_specialized import _handover_barriers

#: Registers a thread of the worker scores warpgroup and of the load warp (setmaxnreg); the default
#: scores warpgroup takes what the launch's cap leaves (launch.delta_backward's
#: SPECIALIZED_STAGE_MAXNREG: 168 a thread over three warpgroups, so 3 x 168 - 240 - 24 = 240).
SCORES_REGS = gl.constexpr(240)
LOAD_REGS = gl.constexpr(24)


@gluon.jit
def _stream_row(o, M: gl.constexpr, BQ: gl.constexpr):
    """The expanded stream's row (within the chunk) of this kernel's tile row ``o``: copy M - 1 of
    the chunk's BQ tokens first, then copy M - 2, ..., copy 0; ``o`` itself at M = 1."""
    if M == 1:
        return o
    else:
        return (o % BQ) * M + (M - 1 - o // BQ)


@gluon.jit
def _tile_row(n, M: gl.constexpr, BQ: gl.constexpr):
    """The inverse of :func:`_stream_row`: the tile row of the stream's row ``n``."""
    return (M - 1 - n % M) * BQ + n // M


@gluon.jit
def _scores(p, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
            BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_G: gl.constexpr, USE_L2NORM: gl.constexpr,
            DT: gl.constexpr, NUM_STAGES: gl.constexpr, PART: gl.constexpr, M: gl.constexpr):
    """A scores warpgroup: the program's items m = PART, PART + 2, ..., each as the twin computes
    it, its tiles waited for rather than loaded."""
    (do_s, dy_s, u_s, v_s, ks_s, q_slots, k_slots, ready, empty, once_ready, once_empty, do_desc, dy_desc, u_desc,
     v_desc, ks_desc, q_desc, k_desc, g, beta, dg, dbeta, bdyks, scratch, cu_seqlens, chunk_indices, chunk_offsets,
     T, n_seq, scale, n_chunks, pid, programs, n_mine) = p
    NV: gl.constexpr = V // BV
    BQ: gl.constexpr = BT // M  # a chunk's tokens
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    along_i: gl.constexpr = gl.SliceLayout(1, mma)  # a tile's rows
    along_j: gl.constexpr = gl.SliceLayout(0, mma)  # its columns
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])  # [BT, BV] tiles for the row sums
    rows_qk: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])  # [BT, K] rows to normalise
    line: gl.constexpr = SCAN_LINE
    if M == 1:
        out: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])  # 16-byte stores of a [BT, BT] tile
    else:  # a warp writes a row of the stream's tile (its columns are the tile's in another order)
        out: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [4, 1], [1, 0])
    q_s = q_slots.index(PART)
    k_s = k_slots.index(PART)
    o_i = gl.arange(0, BT, layout=along_i)
    o_j = gl.arange(0, BT, layout=along_j)
    o_l = gl.arange(0, BT, layout=line)
    # Each tile row's row on the expanded stream (the tile row itself at M = 1).
    e_i = _stream_row(o_i, M, BQ)
    e_j = _stream_row(o_j, M, BQ)
    e_l = _stream_row(o_l, M, BQ)
    causal = e_i[:, None] >= e_j[None, :]
    strict = e_i[:, None] > e_j[None, :]
    zero = gl.zeros([BT, BT], gl.float32, layout=mma)
    for m in range(PART, n_mine, 2):
        i = m // 2  # this warpgroup's item count: the phase of its slot's barrier
        it = pid + m * programs
        i_hv = it % HV
        valid, eos, r0, _ = _item(it, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_chunks, HV, BT,
                                  IS_VARLEN, M)  # (chunk it // HV, value head it % HV)
        m_i = r0 + e_i.to(gl.int64) < eos
        m_j = r0 + e_j.to(gl.int64) < eos
        rows_l = r0 + e_l.to(gl.int64)
        m_l = rows_l < eos
        m_b = gl.convert_layout(m_l, gl.SliceLayout(1, blk))

        # q and k normalised in place, before the sums are live.
        mbarrier.wait(once_ready.index(PART), i & 1)
        # Rows past the sequence's end (the next sequence's: their factor may be NaN) selected to
        # zero after the scaling, as the twin's masked loads give; q's rows past its tokens too (M > 1).
        m_k = gl.convert_layout(m_l, gl.SliceLayout(1, rows_qk))
        if M == 1:
            m_q = m_k
        else:
            m_q = m_k & (gl.arange(0, BT, layout=gl.SliceLayout(1, rows_qk)) < BQ)
        x, r = _normalised(q_s, rows_qk, USE_L2NORM)
        q_s.store(gl.where(m_q[:, None], x * r[:, None], 0.0).to(DT))
        x, r = _normalised(k_s, rows_qk, USE_L2NORM)
        k_s.store(gl.where(m_k[:, None], x * r[:, None], 0.0).to(DT))
        fence_async_shared()
        gl.thread_barrier()

        # dO U^T and dY U^T over the value columns; dY . V and dY . (lam o K S) beside them.
        dOU = zero
        dYU = zero
        dyv = gl.zeros([BT], gl.float32, layout=gl.SliceLayout(1, blk))
        dyks = gl.zeros([BT], gl.float32, layout=gl.SliceLayout(1, blk))
        for j in range(NV):
            step = m * NV + j
            s = step % NUM_STAGES
            mbarrier.wait(ready.index(s), (step // NUM_STAGES) & 1)
            Ut = u_s.index(s).permute((1, 0))
            dOU = warpgroup_mma(do_s.index(s), Ut, dOU, is_async=True)
            dYU = warpgroup_mma(dy_s.index(s), Ut, dYU, is_async=True)
            b_dy = dy_s.index(s).load(blk).to(gl.float32)
            dyv += gl.sum(b_dy * v_s.index(s).load(blk).to(gl.float32), axis=1)
            dyks += gl.sum(b_dy * ks_s.index(s).load(blk).to(gl.float32), axis=1)
            dOU, dYU = warpgroup_mma_wait(num_outstanding=0, deps=(dOU, dYU))
            gl.thread_barrier()  # every warp has read stage s
            mbarrier.arrive(empty.index(s), count=1)

        # Q K^T and K K^T.
        QK = warpgroup_mma(q_s, k_s.permute((1, 0)), zero, use_acc=False, is_async=True)
        KK = warpgroup_mma(k_s, k_s.permute((1, 0)), zero, use_acc=False, is_async=True)

        # Beside the products: the gates (a token's decay on its first copy) and beta.
        rows_n = r0 + o_l.to(gl.int64)  # the chunk's rows in the stream's order
        if HAS_G:
            b_g = gl.load(g + (rows_n // M) * HV + i_hv, mask=(rows_n < eos) & (rows_n % M == 0),
                          other=0.0).to(gl.float32) * 1.4426950408889634
        else:
            b_g = gl.zeros([BT], gl.float32, layout=line)
        gc, seg, lam, gam = _segment_gates(b_g, o_l, BT)
        if M > 1:  # to the tile's order (a gather: the values' bits)
            gc = gl.gather(gc, e_l, 0)
            seg = gl.gather(seg, e_l, 0)
        gc_i = gl.convert_layout(gc, along_i)[:, None]
        gc_j = gl.convert_layout(gc, along_j)[None, :]
        seg_i = gl.convert_layout(seg, along_i)[:, None]
        seg_j = gl.convert_layout(seg, along_j)[None, :]
        b_beta = gl.load(beta + rows_l * HV + i_hv, mask=m_l, other=0.0).to(gl.float32)
        beta_i = gl.convert_layout(b_beta, along_i)
        causal_in = causal & m_i[:, None] & m_j[None, :]  # rows and columns of the sequence
        G = gl.where(causal_in & (seg_i == seg_j), gl.exp2(gc_i - gc_j), 0.0)

        QK, KK = warpgroup_mma_wait(num_outstanding=0, deps=(QK, KK))
        gl.thread_barrier()  # every product has read the slot's q and k
        mbarrier.arrive(once_empty.index(PART), count=1)

        dscores = gl.where(causal_in, scale * dOU, 0.0)
        A = gl.where(strict, KK * G, 0.0)
        dsys = gl.where(strict & causal_in, -dYU, 0.0)
        dyv = gl.where(m_b, dyv, 0.0)
        dyks = gl.where(m_b, dyks, 0.0)
        d_beta = (gl.convert_layout(gl.sum(dsys * A, axis=1), line) + gl.convert_layout(dyv, line)) - \
            gl.convert_layout(dyks, line)
        dA = beta_i[:, None] * dsys
        dSeg = gl.where(causal, (dscores * QK + dA * KK) * G, 0.0)
        b_bdyks = b_beta * gl.convert_layout(dyks, line)
        # sum_{i >= m} sum_{j < m} dSeg_ij (in the stream's order): the reverse cumulative sum of
        # each row's strict sum less each column's.
        b_strict = gl.where(strict, dSeg, 0.0)
        r = gl.convert_layout(gl.sum(b_strict, axis=1), line) - gl.convert_layout(gl.sum(b_strict, axis=0), line)
        if M == 1:
            d_g = gl.associative_scan(r - b_bdyks, 0, _plus, reverse=True)
        else:
            d_g = gl.associative_scan(gl.gather(r - b_bdyks, _tile_row(o_l, M, BQ), 0), 0, _plus, reverse=True)

        o_r = _stream_row(gl.arange(0, BT, layout=gl.SliceLayout(1, out)), M, BQ)
        o_c = _stream_row(gl.arange(0, BT, layout=gl.SliceLayout(0, out)), M, BQ)
        # the twin's tile (i_c HV + i_hv) of the scratch: the item's own number
        p_scr = scratch + it.to(gl.int64) * (2 * BT * BT) + (o_r * BT)[:, None] + o_c[None, :]
        gl.store(p_scr, gl.convert_layout((dscores * G).to(DT), out), mask=valid)
        gl.store(p_scr + BT * BT, gl.convert_layout((dA * G).to(DT), out), mask=valid)
        m_st = m_l & valid
        gl.store(dbeta + rows_l * HV + i_hv, d_beta, mask=m_st)
        gl.store(bdyks + rows_l * HV + i_hv, b_bdyks, mask=m_st)
        if HAS_G:  # on each token's first copy
            gl.store(dg + (rows_n // M) * HV + i_hv, d_g, mask=(rows_n < eos) & (rows_n % M == 0) & valid)


@gluon.jit
def _copy_blocks(desc, t, col, width: gl.constexpr, bar, dst):
    """A chunk's tile of an expanded-stream tensor at M = 2 (``desc`` over it seen as [tokens,
    2 x width], boxes of BT / 2 rows) into ``dst`` [BT, ...] in :func:`_stream_row`'s order: copy 1
    (columns width + col on) into the first half, copy 0 into the second."""
    BQ: gl.constexpr = desc.block_type.shape[0]
    tma.async_copy_global_to_shared(desc, [t, width + col], bar, dst.slice(0, BQ))
    tma.async_copy_global_to_shared(desc, [t, col], bar, dst.slice(BQ, BQ))


@gluon.jit
def _loads(p, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
           BV: gl.constexpr, IS_VARLEN: gl.constexpr, NUM_STAGES: gl.constexpr, M: gl.constexpr):
    """The load warp: the program's steps in order, a stage once the warpgroup that read it freed
    it; an item's q and k once its warpgroup freed its slot (two items back), after the item's
    first NUM_STAGES steps (so the other warpgroup's steps are never held up behind that wait).
    An expanded-stream tile at M = 2 comes as two blocks of BT / 2 rows (:func:`_copy_blocks`)."""
    (do_s, dy_s, u_s, v_s, ks_s, q_slots, k_slots, ready, empty, once_ready, once_empty, do_desc, dy_desc, u_desc,
     v_desc, ks_desc, q_desc, k_desc, g, beta, dg, dbeta, bdyks, scratch, cu_seqlens, chunk_indices, chunk_offsets,
     T, n_seq, scale, n_chunks, pid, programs, n_mine) = p
    NV: gl.constexpr = V // BV
    BQ: gl.constexpr = BT // M
    # The item's q and k go after the step that fills the ring's last stage or the item's last
    # step. The scores warpgroups wait on a stage's ready barrier by phase parity alone, so a stage's
    # previous fill (often the other warpgroup's step) must have landed before a warpgroup waits on
    # it: a warpgroup waits for its q and k first, and issuing them here means the load warp has
    # already seen every earlier step of the stages this item reads freed. Issued sooner, a wait at
    # V > NUM_STAGES x BV could pass on the old phase while the other item's copy still lands.
    ONCE_AT: gl.constexpr = (NUM_STAGES if NUM_STAGES < NV else NV) - 1
    nbytes: gl.constexpr = do_desc.block_type.nbytes + 4 * M * dy_desc.block_type.nbytes
    once_bytes: gl.constexpr = q_desc.block_type.nbytes + M * k_desc.block_type.nbytes
    for m in range(n_mine):
        b = m % 2  # the item's warpgroup, and its slot
        it = pid + m * programs
        i_hv = it % HV
        valid, eos, r0, _ = _item(it, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_chunks, HV, BT,
                                  IS_VARLEN, M)  # (chunk it // HV, value head it % HV)
        t = (r0 // M).to(gl.int32)  # the chunk's first token
        for j in range(NV):
            step = m * NV + j
            s = step % NUM_STAGES
            mbarrier.wait(empty.index(s), ((step // NUM_STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            c = i_hv * V + j * BV
            if M == 1:
                tma.async_copy_global_to_shared(do_desc, [t, c], bar, do_s.index(s))
                tma.async_copy_global_to_shared(dy_desc, [t, c], bar, dy_s.index(s))
                tma.async_copy_global_to_shared(u_desc, [t, c], bar, u_s.index(s))
                tma.async_copy_global_to_shared(v_desc, [t, c], bar, v_s.index(s))
                tma.async_copy_global_to_shared(ks_desc, [t, c], bar, ks_s.index(s))
            else:
                tma.async_copy_global_to_shared(do_desc, [t, c], bar, do_s.index(s).slice(0, BQ))
                _copy_blocks(dy_desc, t, c, HV * V, bar, dy_s.index(s))
                _copy_blocks(u_desc, t, c, HV * V, bar, u_s.index(s))
                _copy_blocks(v_desc, t, c, HV * V, bar, v_s.index(s))
                _copy_blocks(ks_desc, t, c, HV * V, bar, ks_s.index(s))
            if j == ONCE_AT:
                mbarrier.wait(once_empty.index(b), ((m // 2) & 1) ^ 1)
                once = once_ready.index(b)
                mbarrier.expect(once, once_bytes)
                i_h = i_hv // (HV // H)
                if M == 1:
                    tma.async_copy_global_to_shared(q_desc, [t, i_h * K], once, q_slots.index(b))
                    tma.async_copy_global_to_shared(k_desc, [t, i_h * K], once, k_slots.index(b))
                else:
                    tma.async_copy_global_to_shared(q_desc, [t, i_h * K], once, q_slots.index(b).slice(0, BQ))
                    _copy_blocks(k_desc, t, i_h * K, H * K, once, k_slots.index(b))


@gluon.jit(do_not_specialize=["T", "n_seq", "n_chunks"])
def gluon_bwd_scores_specialized_kernel(
    q, k, v, g, beta, do, dy, u, ks, dg, dbeta, bdyks, scratch,
    cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, scale, n_chunks,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_G: gl.constexpr, USE_L2NORM: gl.constexpr,
    DOT_PRECISION: gl.constexpr, DT: gl.constexpr, M: gl.constexpr = 1, NUM_STAGES: gl.constexpr = 3,
):
    """The twin's arguments (BK, DOT_PRECISION and M its: K wide tiles, 16-bit products, M 1 or 2)
    and ``n_chunks``, the twin's grid's chunks (its grid is n_chunks x HV); persistent programs over
    its items. Launched on four warps (the default scores warpgroup; the worker scores warpgroup
    and the load warp are the partitions') with ``maxnreg`` for the three warpgroups' registers
    (launch.delta_backward)."""
    gl.static_assert(M == 1 or M == 2, "GDN (M = 1) or Gated Delta Product at M = 2")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    # The bulk copies' boxes and expected bytes are DT's: another dtype would overrun a stage.
    gl.static_assert((q.dtype.element_ty == DT) & (k.dtype.element_ty == DT) & (v.dtype.element_ty == DT) &
                     (do.dtype.element_ty == DT) & (dy.dtype.element_ty == DT) & (u.dtype.element_ty == DT) &
                     (ks.dtype.element_ty == DT), "q, k, v, dO, dY, U and lam o K S in DT")
    gl.static_assert(V % BV == 0, "V a multiple of BV")
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    n_items = n_chunks * HV
    n_mine = (n_items - pid + programs - 1) // programs  # this program's items

    BQ: gl.constexpr = BT // M  # a chunk's tokens: the boxes' rows
    l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DT)
    l_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], DT)
    tokens = T if IS_VARLEN else n_seq * T  # over whole tensors: the dense batch's tokens, or the packed ones
    # The expanded stream's tensors seen as [tokens, M x columns]: copy c of a token at columns c x (its width) on.
    do_desc = tma.make_tensor_descriptor(do, [tokens, HV * V], [HV * V, 1], [BQ, BV], l_tv)
    dy_desc = tma.make_tensor_descriptor(dy, [tokens, M * HV * V], [M * HV * V, 1], [BQ, BV], l_tv)
    u_desc = tma.make_tensor_descriptor(u, [tokens, M * HV * V], [M * HV * V, 1], [BQ, BV], l_tv)
    v_desc = tma.make_tensor_descriptor(v, [tokens, M * HV * V], [M * HV * V, 1], [BQ, BV], l_tv)
    ks_desc = tma.make_tensor_descriptor(ks, [tokens, M * HV * V], [M * HV * V, 1], [BQ, BV], l_tv)
    q_desc = tma.make_tensor_descriptor(q, [tokens, H * K], [H * K, 1], [BQ, K], l_qk)
    k_desc = tma.make_tensor_descriptor(k, [tokens, M * H * K], [M * H * K, 1], [BQ, K], l_qk)
    do_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    dy_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    u_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    v_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    ks_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    q_slots = gl.allocate_shared_memory(DT, [2, BT, K], l_qk)  # a slot a scores warpgroup
    k_slots = gl.allocate_shared_memory(DT, [2, BT, K], l_qk)
    if M > 1:
        # dO fills its stages' first BQ rows; the others stay zero (written once here), so dO U^T
        # is the twin's with its other copies' zero rows.
        blk: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
        for i in gl.static_range(NUM_STAGES):
            do_s.index(i).store(gl.zeros([BT, BV], DT, layout=blk))
        fence_async_shared()
        gl.thread_barrier()
    # a stage freed by the warpgroup that read it; a slot by its warpgroup
    ready, empty, once_ready, once_empty = _handover_barriers(NUM_STAGES, STAGE_READERS=1, HANDED_READERS=1)

    p = (do_s, dy_s, u_s, v_s, ks_s, q_slots, k_slots, ready, empty, once_ready, once_empty, do_desc, dy_desc, u_desc,
         v_desc, ks_desc, q_desc, k_desc, g, beta, dg, dbeta, bdyks, scratch, cu_seqlens, chunk_indices,
         chunk_offsets, T, n_seq, scale, n_chunks, pid, programs, n_mine)
    # Each partition's arguments written out in the call: a tuple named first would carry the
    # constexprs as values (Triton 3.6).
    gl.warp_specialize([
        (_scores, (p, H, HV, K, V, BT, BV, IS_VARLEN, HAS_G, USE_L2NORM, DT, NUM_STAGES, 0, M)),
        (_scores, (p, H, HV, K, V, BT, BV, IS_VARLEN, HAS_G, USE_L2NORM, DT, NUM_STAGES, 1, M)),
        (_loads, (p, H, HV, K, V, BT, BV, IS_VARLEN, NUM_STAGES, M)),
    ], [4, 1], [SCORES_REGS, LOAD_REGS])
