"""The GLA backward's dg launch (a scalar decay whose query/key heads serve many value heads: the
parallel stage's PART 2) in Gluon: the Triton twin is
:func:`recurscan.kernels.gla.backward.chunk_simple_gla_bwd_grads_kernel` with ``PART = 2`` (same
arguments), whose ``_group_grads`` has the algebra. GPU only (sm_90); the planner takes it where
``plan.gla.GLUON_GLA_DG`` allows.

Per (chunk, value head), from dO, V, the state S entering the chunk and dS' leaving it, with
dsG = causal(scale dO V^T) o G (G the gate tile, one segment) and Q K^T of the query/key head::

    dlam = scale rowsum(dO o (Q S)) (the last row adding S . dS')    kdsv = rowsum(V o (K dS'))
    dSeg = dsG o (Q K^T), its last row adding gam o kdsv
    dg_m = sum_{i >= m} (sum_{j < i} dSeg_ij - sum_{l > i} dSeg_li + dlam_i lam_i)

What differs from the twin is the schedule:

1. Persistent programs (the launch's grid: one an SM, eight warps) take items (chunk, query/key
   head) ``pid, pid + programs, ...``; an item's steps are its group's value heads, one after the
   other, and a program's steps run on without a break between items.
2. Each step's tiles (dO and V [BT, V], S and dS' [K, V]) arrive by bulk tensor copies into a ring
   of NUM_STAGES stages issued NUM_STAGES steps ahead; q and k once an item, and Q K^T formed once
   an item (the twin forms it once a program of HEADS value heads).
3. A step's four products (dO V^T, S^T Q^T, dS'^T K^T, S^T dS') are issued together and waited
   once, the gates' scans and dO^T's and V^T's loads from shared memory running beside them; the
   decays of the next value head load a step ahead.
4. The copies read whole tensors, so a chunk's rows past its sequence's end hold the next
   sequence's (the twin's masks read zeros): every term those rows reach is selected out (Q K^T,
   dsG, dlam, kdsv, dO^T and V^T), and dg is stored on the sequence's rows only.

The arithmetic is the twin's, in the same order, except the reductions (the row sums, S . dS',
the scans), whose order follows the layout: dg agrees with the twin's to float32 rounding (the GPU
test compares it with the twin's and, through training, every gradient with the float64 oracle).

Scope (``plan.gla.gluon_dg_scope`` checks it): a scalar decay given (HAS_G), 16-bit inputs, K 64
or 128, V 64, a group of at least NUM_STAGES value heads a query/key head, 16-byte aligned
tensors; dense or varlen.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .delta_backward_dqdk import _chunk_place, _plus, _segment_gates


@gluon.jit
def _item(it, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, H: gl.constexpr, BT: gl.constexpr,
          IS_VARLEN: gl.constexpr, M: gl.constexpr = 1):
    """Item ``it`` = (chunk it // H, head it % H): the chunk's (valid, eos, r0, cs) on the stream of
    M rows a token (:func:`.delta_backward_dqdk._chunk_place`)."""
    return _chunk_place(it // H, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, BT, IS_VARLEN, M)


@gluon.jit
def _issue_step(step, n_steps, r0, cs, i_h, do_desc, v_desc, s_desc, ds_desc, do_s, v_s, s_s, ds_s, bars,
                HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, GROUP: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The bulk copies of the program's step ``step`` (value head step % GROUP of the item whose
    first row, chunk-state row and query/key head are r0, cs, i_h) into stage step % NUM_STAGES;
    none past its last step."""
    s = step % NUM_STAGES
    pred = step < n_steps
    bar = bars.index(s)
    nbytes: gl.constexpr = 2 * do_desc.block_type.nbytes + 2 * s_desc.block_type.nbytes
    mbarrier.expect(bar, nbytes, pred=pred)
    i_hv = i_h * GROUP + step % GROUP
    r = r0.to(gl.int32)
    tma.async_copy_global_to_shared(do_desc, [r, i_hv * V], bar, do_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(v_desc, [r, i_hv * V], bar, v_s.index(s), pred=pred)
    row_s = (cs * HV + i_hv).to(gl.int32) * K
    tma.async_copy_global_to_shared(s_desc, [row_s, 0], bar, s_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(ds_desc, [row_s, 0], bar, ds_s.index(s), pred=pred)


@gluon.jit
def _issue_qk(pred, r0, i_h, q_desc, k_desc, q_s, k_s, once, K: gl.constexpr):
    """An item's q and k tiles onto the barrier ``once``."""
    mbarrier.expect(once, 2 * q_desc.block_type.nbytes, pred=pred)
    r = r0.to(gl.int32)
    tma.async_copy_global_to_shared(q_desc, [r, i_h * K], once, q_s, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [r, i_h * K], once, k_s, pred=pred)


@gluon.jit
def _program_items(n_cs_rows, H: gl.constexpr, GROUP: gl.constexpr):
    """A persistent program's id, the programs, the items (chunk, query/key head) of ``n_cs_rows x
    H``, this program's items (``pid, pid + programs, ...``) and its steps (GROUP value heads an
    item)."""
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    n_items = n_cs_rows * H
    n_mine = (n_items - pid + programs - 1) // programs
    return pid, programs, n_items, n_mine, n_mine * GROUP


@gluon.jit
def _step_ring(do_desc, v_desc, s_desc, ds_desc, NUM_STAGES: gl.constexpr):
    """The ring of a step's tiles (dO and V [BT, V], S and dS' [K, V]), NUM_STAGES deep, in the
    descriptors' layouts."""
    do_s = gl.allocate_shared_memory(do_desc.dtype, [NUM_STAGES] + do_desc.block_type.shape, do_desc.layout)
    v_s = gl.allocate_shared_memory(v_desc.dtype, [NUM_STAGES] + v_desc.block_type.shape, v_desc.layout)
    s_s = gl.allocate_shared_memory(s_desc.dtype, [NUM_STAGES] + s_desc.block_type.shape, s_desc.layout)
    ds_s = gl.allocate_shared_memory(ds_desc.dtype, [NUM_STAGES] + ds_desc.block_type.shape, ds_desc.layout)
    return do_s, v_s, s_s, ds_s


@gluon.jit
def _descriptors(q, k, v, do, states, dstates, T, n_seq, n_cs_rows, H: gl.constexpr, HV: gl.constexpr,
                 K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, IS_VARLEN: gl.constexpr, DT: gl.constexpr):
    """The bulk copies' descriptors of q, k ([BT, K] tiles), dO, V ([BT, V]) over the rows of every
    sequence (dense batch or packed varlen), and of the chunk states S and dS' ([K, V] tiles; rows
    outside [0, n_cs_rows) read zeros), in DT."""
    l_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], DT)
    l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, V], DT)
    l_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K, V], DT)
    rows_all = T if IS_VARLEN else n_seq * T
    q_desc = tma.make_tensor_descriptor(q, [rows_all, H * K], [H * K, 1], [BT, K], l_qk)
    k_desc = tma.make_tensor_descriptor(k, [rows_all, H * K], [H * K, 1], [BT, K], l_qk)
    do_desc = tma.make_tensor_descriptor(do, [rows_all, HV * V], [HV * V, 1], [BT, V], l_tv)
    v_desc = tma.make_tensor_descriptor(v, [rows_all, HV * V], [HV * V, 1], [BT, V], l_tv)
    s_desc = tma.make_tensor_descriptor(states, [n_cs_rows * (HV * K), V], [V, 1], [K, V], l_kv)
    ds_desc = tma.make_tensor_descriptor(dstates, [n_cs_rows * (HV * K), V], [V, 1], [K, V], l_kv)
    return q_desc, k_desc, do_desc, v_desc, s_desc, ds_desc


@gluon.jit
def _decays(g, rows_l, eos, i_hv, HV: gl.constexpr):
    """Value head i_hv's log2 decays on the chunk's rows (0 past the sequence's end): the twin's
    _chunk_decays."""
    return gl.load(g + rows_l * HV + i_hv, mask=rows_l < eos, other=0.0).to(gl.float32) * 1.4426950408889634


@gluon.jit
def _steps(step_sizes, rows_l, eos, i_hv, HV: gl.constexpr, V_FROM_X: gl.constexpr):
    """Value head i_hv's step sizes dt on the chunk's rows (0 past the sequence's end) where
    V_FROM_X (v = dt x formed in the products' factors), else None."""
    dt = None
    if V_FROM_X:
        dt = gl.load(step_sizes + rows_l * HV + i_hv, mask=rows_l < eos, other=0.0)
    return dt


@gluon.jit
def _tile_indices(mma: gl.constexpr, along_i: gl.constexpr, along_j: gl.constexpr, line: gl.constexpr,
                  BT: gl.constexpr):
    """A [BT, BT] product tile's row and column indices (``along_i``, ``along_j``), a [BT] vector's
    (``line``), the tile's masks (causal i >= j, strict i > j, the diagonal: S^T dS' is [V, V] with
    V = BT, its trace), the last row's, and a zero tile (``mma``)."""
    o_i = gl.arange(0, BT, layout=along_i)
    o_j = gl.arange(0, BT, layout=along_j)
    o_l = gl.arange(0, BT, layout=line)
    causal = o_i[:, None] >= o_j[None, :]
    strict = o_i[:, None] > o_j[None, :]
    diag = o_i[:, None] == o_j[None, :]
    last_i = o_i == BT - 1
    zero = gl.zeros([BT, BT], gl.float32, layout=mma)
    return o_i, o_j, o_l, causal, strict, diag, last_i, zero


@gluon.jit
def _row_sums(SqT, dSkT, SdS, dOt, Vt, m_j, scale, diag, last_i, along_i: gl.constexpr):
    """A value head's row sums from its products (Q S)^T, (K dS')^T and S^T dS' and its dO^T and
    V^T (zero past the sequence's end): dlam = scale rowsum(dO o (Q S)), the last row adding
    S . dS' (``along_i``), and kdsv = rowsum(V o (K dS')) (along the tiles' columns)."""
    dlam = gl.where(m_j, scale * gl.sum(dOt * SqT, axis=0), 0.0)  # along the chunk's rows
    kdsv = gl.where(m_j, gl.sum(Vt * dSkT, axis=0), 0.0)
    sds = gl.sum(gl.sum(gl.where(diag, SdS, 0.0), axis=1), axis=0)
    return gl.convert_layout(dlam, along_i) + gl.where(last_i, sds, 0.0), kdsv


@gluon.jit
def _head_dg(dOV, QK, dlam, kdsv, lam, gam, gc_i, gc_j, seg_i, seg_j, m_i, m_j, scale, causal, strict, last_i,
             along_j: gl.constexpr, line: gl.constexpr, dt_l=None, V_FROM_X: gl.constexpr = False):
    """A value head's dg on the chunk's rows (``line``'s layout) from its product dO V^T, its row
    sums (:func:`_row_sums`), the item's Q K^T, and its gates
    (:func:`.delta_backward_dqdk._segment_gates`; gc and the segments along the tiles' rows ``_i``
    and columns ``_j``)::

        dSeg = dsG o (Q K^T), its last row adding gam o kdsv,   dsG = causal(scale dO V^T) o G
        dg_m = sum_{i >= m} (sum_{j < i} dSeg_ij - sum_{l > i} dSeg_li + dlam_i lam_i)

    V_FROM_X: the products and sums were of x, and v = dt x enters here: dt (``dt_l``, the chunk's
    step sizes in ``line``'s layout) scales dO X^T's columns and the row sums kdsv."""
    if V_FROM_X:
        dt_j = gl.convert_layout(dt_l, along_j)
        dsG = gl.where(causal & (seg_i == seg_j) & m_i[:, None] & m_j[None, :],
                       scale * dOV * (gl.exp2(gc_i - gc_j) * dt_j[None, :]), 0.0)  # dscores o G
        kdsv = kdsv * dt_j
    else:
        dsG = gl.where(causal & (seg_i == seg_j) & m_i[:, None] & m_j[None, :],
                       scale * dOV * gl.exp2(gc_i - gc_j), 0.0)  # dscores o G
    dSeg = dsG * QK + gl.where(last_i[:, None], (kdsv * gl.convert_layout(gam, along_j))[None, :], 0.0)
    b_strict = gl.where(strict, dSeg, 0.0)
    r = gl.convert_layout(gl.sum(b_strict, axis=1), line) - \
        gl.convert_layout(gl.sum(b_strict, axis=0), line) + gl.convert_layout(dlam, line) * lam
    return gl.associative_scan(r, 0, _plus, reverse=True)


@gluon.jit
def gluon_gla_bwd_dg_kernel(
    q, k, v, g, do, states, dstates, dq, dk, dg, scratch, cu_seqlens, chunk_indices, chunk_offsets,
    T, n_seq, scale, n_cs_rows, step,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_G: gl.constexpr, DOT_PRECISION: gl.constexpr,
    DT: gl.constexpr, PER_KEY: gl.constexpr = False, HEADS: gl.constexpr = 1, PART: gl.constexpr = 2,
    SIDE: gl.constexpr = 0, V_FROM_X: gl.constexpr = False, NUM_STAGES: gl.constexpr = 3,
):
    """Persistent programs over items (chunk, query/key head) of ``n_cs_rows x H``, each item's
    steps its GROUP = HV / H value heads: dg ``[rows, HV]`` (float32) of every value head from
    q, k ``[rows, H, K]``, v, do ``[rows, HV, V]``, the log decays g ``[rows, HV]``, and the chunk
    states ``states`` (entering) and ``dstates`` (dS' leaving) ``[n_cs_rows, HV, K, V]``. dq, dk,
    scratch, BK, BV, DOT_PRECISION, PER_KEY, HEADS and SIDE are the twin's arguments, unused here
    (PART 2 forms dg alone; tiles K and V wide, products 16-bit). V_FROM_X: v holds x and
    ``step`` dt ``[rows, HV]`` (:func:`_head_dg`). Eight warps."""
    gl.static_assert(PART == 2 and HAS_G and not PER_KEY, "the dg launch of a scalar decay")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    gl.static_assert(V == 64, "64 value columns")
    GROUP: gl.constexpr = HV // H
    gl.static_assert(GROUP >= NUM_STAGES, "a group of at least NUM_STAGES value heads")
    gl.static_assert(gl.num_warps() == 8, "two warpgroups")
    pid, programs, n_items, n_mine, n_steps = _program_items(n_cs_rows, H, GROUP)
    q_desc, k_desc, do_desc, v_desc, s_desc, ds_desc = _descriptors(q, k, v, do, states, dstates, T, n_seq, n_cs_rows,
                                                                    H, HV, K, V, BT, IS_VARLEN, DT)

    # Every product's result is [64, 64]: rows over the 4 warps of a warpgroup, columns halved.
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    along_i: gl.constexpr = gl.SliceLayout(1, mma)  # a tile's rows
    along_j: gl.constexpr = gl.SliceLayout(0, mma)  # its columns
    line: gl.constexpr = gl.BlockedLayout([2], [32], [8], [0])  # a [BT] vector, whole in every warp: scans by shuffles

    do_s, v_s, s_s, ds_s = _step_ring(do_desc, v_desc, s_desc, ds_desc, NUM_STAGES)
    q_s = gl.allocate_shared_memory(DT, [BT, K], q_desc.layout)
    k_s = gl.allocate_shared_memory(DT, [BT, K], k_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    once = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(i), count=1)
    mbarrier.init(once, count=1)

    valid, eos, r0, cs = _item(pid, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, H, BT, IS_VARLEN)
    _issue_qk(n_mine > 0, r0, pid % H, q_desc, k_desc, q_s, k_s, once, K)
    for i in gl.static_range(NUM_STAGES):  # the first item's first steps (GROUP >= NUM_STAGES)
        _issue_step(i, n_steps, r0, cs, pid % H, do_desc, v_desc, s_desc, ds_desc, do_s, v_s, s_s, ds_s, bars, HV, K,
                    V, GROUP, NUM_STAGES)

    o_i, o_j, o_l, causal, strict, diag, last_i, zero = _tile_indices(mma, along_i, along_j, line, BT)
    for m in range(n_mine):
        it = pid + m * programs
        i_h = it % H
        it_n = gl.minimum(it + programs, n_items - 1)  # past the last item: never issued
        n_valid, n_eos, n_r0, n_cs = _item(it_n, cu_seqlens, chunk_indices, chunk_offsets, T, n_seq, n_cs_rows, H, BT,
                                           IS_VARLEN)
        m_i = r0 + o_i.to(gl.int64) < eos
        m_j = r0 + o_j.to(gl.int64) < eos
        rows_l = r0 + o_l.to(gl.int64)
        m_l = rows_l < eos
        mbarrier.wait(once, m & 1)
        QK = warpgroup_mma(q_s, k_s.permute((1, 0)), zero, use_acc=False, is_async=True)
        QK = warpgroup_mma_wait(num_outstanding=0, deps=(QK,))
        QK = gl.where(m_i[:, None] & m_j[None, :], QK, 0.0)  # rows past the end: the next sequence's
        b_g_next = _decays(g, rows_l, eos, i_h * GROUP, HV)
        for h in range(GROUP):
            n = m * GROUP + h  # the program's step
            s = n % NUM_STAGES
            i_hv = i_h * GROUP + h
            mbarrier.wait(bars.index(s), (n // NUM_STAGES) & 1)
            dOV = warpgroup_mma(do_s.index(s), v_s.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
            SqT = warpgroup_mma(s_s.index(s).permute((1, 0)), q_s.permute((1, 0)), zero, use_acc=False,
                                is_async=True)  # (Q S)^T [V, BT]
            dSkT = warpgroup_mma(ds_s.index(s).permute((1, 0)), k_s.permute((1, 0)), zero, use_acc=False,
                                 is_async=True)  # (K dS')^T
            SdS = warpgroup_mma(s_s.index(s).permute((1, 0)), ds_s.index(s), zero, use_acc=False, is_async=True)

            # Beside the products: this head's gates (the twin's _gates_of), the next head's decays.
            b_g = b_g_next
            b_g_next = _decays(g, rows_l, eos, i_h * GROUP + gl.minimum(h + 1, GROUP - 1), HV)
            gc, seg, lam, gam = _segment_gates(b_g, o_l, BT)
            dt_l = _steps(step, rows_l, eos, i_hv, HV, V_FROM_X)
            dOt = gl.where(m_j[None, :], do_s.index(s).permute((1, 0)).load(mma).to(gl.float32), 0.0)  # [V, BT]
            Vt = gl.where(m_j[None, :], v_s.index(s).permute((1, 0)).load(mma).to(gl.float32), 0.0)
            gc_i = gl.convert_layout(gc, along_i)[:, None]
            gc_j = gl.convert_layout(gc, along_j)[None, :]
            seg_i = gl.convert_layout(seg, along_i)[:, None]
            seg_j = gl.convert_layout(seg, along_j)[None, :]

            dOV, SqT, dSkT, SdS = warpgroup_mma_wait(num_outstanding=0, deps=(dOV, SqT, dSkT, SdS))
            gl.thread_barrier()  # every warp has read stage s: the step NUM_STAGES on, of this item or the next
            ahead = n + NUM_STAGES
            nxt = ahead // GROUP > m
            _issue_step(ahead, n_steps, gl.where(nxt, n_r0, r0), gl.where(nxt, n_cs, cs),
                        gl.where(nxt, it_n % H, i_h), do_desc, v_desc, s_desc, ds_desc, do_s, v_s, s_s, ds_s, bars,
                        HV, K, V, GROUP, NUM_STAGES)

            dlam, kdsv = _row_sums(SqT, dSkT, SdS, dOt, Vt, m_j, scale, diag, last_i, along_i)
            d_g = _head_dg(dOV, QK, dlam, kdsv, lam, gam, gc_i, gc_j, seg_i, seg_j, m_i, m_j, scale, causal, strict,
                           last_i, along_j, line, dt_l, V_FROM_X)
            gl.store(dg + rows_l * HV + i_hv, d_g, mask=m_l & valid)
        gl.thread_barrier()  # every product has read q and k: the next item's
        _issue_qk(m + 1 < n_mine, n_r0, it_n % H, q_desc, k_desc, q_s, k_s, once, K)
        valid, eos, r0, cs = n_valid, n_eos, n_r0, n_cs
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))
    mbarrier.invalidate(once)
