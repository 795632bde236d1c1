"""The GLA backward's reverse sweep on the group prep's scores, in Gluon: the Triton twin is
:func:`recurscan.kernels.gla.backward.chunk_simple_gla_bwd_sweep_kernel` with GATE_SCORES (same
arguments, same arithmetic in the same order, so the same bits at 64 value columns on 4 warps),
which has the algebra. GPU only (sm_90); the planner takes it where ``plan.gla.gluon_usable``
and ``plan.gla.GLUON_GLA_REVERSE_SWEEP`` allow.

What differs from the twin is how a chunk's work is scheduled, per program (one warpgroup, dS'^T
[BV, K] float32 in registers):

1. The tiles (k, q, dO and the query/key head's scores) arrive by bulk tensor copies into a ring
   of NUM_STAGES shared-memory stages, one mbarrier each, issued NUM_STAGES chunks ahead. The
   descriptors are made on the device per program over its own sequence's rows, so a partial last
   chunk reads zeros past the sequence's end and its stores stop there (the twin's masks).
2. Two asynchronous products start together: (K dS')^T = dS'^T K^T and the next dS'^T =
   lam_C dS'^T + (lam scale o dO^T) Q (the chain, which does not wait on the first); dV^T's
   product is issued on the first's result, calm chunks taking the scores as they arrived, the
   others the gate tile G o scores formed in registers and stored to shared memory.
3. dS' leaving the chunk and dV leave through shared memory by bulk tensor stores that are waited
   on a chunk later, not at once.
4. Each chunk's row coefficients (lam scale, gam, the calm factors, gc, seg) are loaded one chunk
   ahead in a compact layout and moved into the products' layout where used.

Scope (``plan.gla.gluon_reverse_sweep_ok`` checks it): GATE_SCORES (the group prep with its calm
gates), not PER_KEY, 16-bit inputs, K 64 or 128, V a multiple of BV = 64, 16-byte aligned
tensors; dense or varlen.
"""
from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .delta_backward_sweep import _sequence_place, _state_offsets

#: A timing probe (``RECURSCAN_REVERSE_PROBE`` when this module is imported; only
#: benchmarks/gpu_gla_reverse_probe.py sets it): 0 the kernel; 1 the ring of loads and the chain,
#: the chunk's outputs off ((K dS')^T, dV, the dS' and dV stores); 2 the ring and the outputs, the
#: chain's product off (dS' stays as it entered). Probes 1 and 2 write wrong gradients: for timing
#: only. What they split is a chunk's time between the chain and the outputs, which decides whether
#: the outputs on warpgroups of their own would pay (docs/kernels-gla-plan.md, "The next GPU
#: session", 2c).
_PROBE = os.environ.get("RECURSCAN_REVERSE_PROBE", "0")
if _PROBE not in ("0", "1", "2"):
    raise ValueError(f"RECURSCAN_REVERSE_PROBE: expected 0, 1 or 2, got {_PROBE!r}")
PROBE = gl.constexpr(int(_PROBE))


@gluon.jit
def _issue_loads(j, n_chunks, k_desc, q_desc, do_desc, s_desc, k_s, q_s, do_s, a_s, bars, col_qk, col_v, col_s,
                 BT: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The bulk copies of the program's j-th chunk in its walk (chunk n_chunks - 1 - j of the
    sequence) into stage j % NUM_STAGES; none past its last."""
    s = j % NUM_STAGES
    pred = j < n_chunks
    bar = bars.index(s)
    nbytes: gl.constexpr = (k_desc.block_type.nbytes + q_desc.block_type.nbytes + do_desc.block_type.nbytes
                            + s_desc.block_type.nbytes)
    mbarrier.expect(bar, nbytes, pred=pred)
    r = (n_chunks - 1 - j) * BT
    tma.async_copy_global_to_shared(k_desc, [r, col_qk], bar, k_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(q_desc, [r, col_qk], bar, q_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(do_desc, [r, col_v], bar, do_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(s_desc, [r, col_s], bar, a_s.index(s), pred=pred)


@gluon.jit
def _row_coefficients(coef, bos, L, c, i_n, i_hv, o_t, HV: gl.constexpr, BT: gl.constexpr, CW: gl.constexpr):
    """Chunk c's (calm factors f, lam scale, gam, gc, seg) along its rows in o_t's layout (zero past
    the sequence's end), lam_C and the calm test's f of its first row (NaN where the chunk is not
    calm): the twin's coefficient tile (kernels/gla/group_prep.py's rows of CW floats). ``c`` may
    be -1 (the walk's end): the loads are then masked off."""
    live = c >= 0
    m_r = (c * BT + o_t < L) & live
    p_coef = coef + (((bos + c * BT) // BT + i_n) * HV + i_hv) * (BT * CW)
    f = gl.load(p_coef + o_t * CW, mask=m_r, other=0.0)
    lam_s = gl.load(p_coef + o_t * CW + 1, mask=m_r, other=0.0)
    gam = gl.load(p_coef + o_t * CW + 2, mask=m_r, other=0.0)
    gc = gl.load(p_coef + o_t * CW + 4, mask=m_r, other=0.0)
    seg = gl.load(p_coef + o_t * CW + 5, mask=m_r, other=0.0)
    lam_last = gl.load(p_coef + 3, mask=live, other=0.0)
    f_0 = gl.load(p_coef, mask=live, other=0.0)
    return f, lam_s, gam, gc, seg, lam_last, f_0


@gluon.jit
def _stormy_gate_tile(St, gc, seg, o_i, o_j, r0, L, row64: gl.constexpr, col64: gl.constexpr):
    """A stormy chunk's G o scores [i, j] (float32) from its scores ``St`` and its rows' gc and
    segments (``gc``, ``seg``, moved to the tile's rows ``o_i`` and columns ``o_j``):
    G_ij = 2^(gc_i - gc_j) for j <= i in one segment, rows past the sequence's end (``r0`` the
    chunk's first row, ``L`` its length) selected out."""
    gc_i = gl.convert_layout(gc, row64)[:, None]
    sg_i = gl.convert_layout(seg, row64)[:, None]
    gc_j = gl.convert_layout(gc, col64)[None, :]
    sg_j = gl.convert_layout(seg, col64)[None, :]
    keep = (o_i[:, None] >= o_j[None, :]) & (sg_i == sg_j) & (r0 + o_i < L)[:, None]
    return gl.where(keep, gl.exp2(gc_i - gc_j), 0.0) * St


@gluon.jit
def _calm_dv(Wdo, scores, acc, f, a64: gl.constexpr, col64: gl.constexpr):
    """dV^T of a calm chunk: f o ((lam scale o dO)^T scores + acc), ``Wdo`` = (lam scale o dO)^T
    [BV, BT] in the products' dtype, ``scores`` [BT, BT] in shared memory, ``acc`` = scale
    lam_last (K dS')^T, f the column factors (along ``col64``)."""
    dvt = warpgroup_mma(gl.convert_layout(Wdo, a64), scores, acc, is_async=True)
    dvt = warpgroup_mma_wait(num_outstanding=0, deps=(dvt,))
    return gl.convert_layout(f, col64)[None, :] * dvt


@gluon.jit
def _sequence_operands(q, k, do, aqk, dv, dstates, cu_seqlens, chunk_offsets, T, n_cs_rows, i_n, H: gl.constexpr,
                       HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
                       IS_VARLEN: gl.constexpr, DT: gl.constexpr, DV_DT: gl.constexpr = gl.float32):
    """Sequence ``i_n``'s first row ``bos``, length ``L`` (int64), chunks and first chunk-state row ``cs0``,
    and the bulk-copy descriptors a reverse-sweep program reads and writes through: k, q ([BT, K]
    tiles), dO ([BT, BV]), the scores ([BT, BT]) and ``dv`` ([BT, BV] in DV_DT: dV in float32, or
    SSD_GRADS's dx in x's dtype) over the sequence's rows (a tile past its end reads zeros, a store
    stops there), and the chunk states ([K, BV] tiles; rows outside [0, n_cs_rows), from a wrong
    chunk_offsets entry, are moved just past them)."""
    bos, L, n_chunks, cs0, rows, _ = _sequence_place(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    l_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], DT)
    l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DT)
    l_tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], DT)
    l_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K, BV], DT)
    l_dv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DV_DT)
    k_desc = tma.make_tensor_descriptor(k + bos * (H * K), [rows, H * K], [H * K, 1], [BT, K], l_qk)
    q_desc = tma.make_tensor_descriptor(q + bos * (H * K), [rows, H * K], [H * K, 1], [BT, K], l_qk)
    do_desc = tma.make_tensor_descriptor(do + bos * (HV * V), [rows, HV * V], [HV * V, 1], [BT, BV], l_tv)
    s_desc = tma.make_tensor_descriptor(aqk + bos * (H * BT), [rows, H * BT], [H * BT, 1], [BT, BT], l_tt)
    dv_desc = tma.make_tensor_descriptor(dv + bos * (HV * V), [rows, HV * V], [HV * V, 1], [BT, BV], l_dv)
    ds_desc = tma.make_tensor_descriptor(dstates, [n_cs_rows * (HV * K), V], [V, 1], [K, BV], l_kv)
    return bos, L, n_chunks, cs0, k_desc, q_desc, do_desc, s_desc, dv_desc, ds_desc


@gluon.jit
def gluon_gla_bwd_sweep_kernel(
    q, k, g, do, dstates, dht, dh0, dv, cu_seqlens, chunk_offsets, T, scale, n_cs_rows, qg, kg, aqk, dl, coef,
    x, step, D, dx, dstep, dD,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_G: gl.constexpr, HAS_DHT: gl.constexpr,
    STORE_DH0: gl.constexpr, DOT_PRECISION: gl.constexpr, DT: gl.constexpr, PER_KEY: gl.constexpr = False,
    GATE_SCORES: gl.constexpr = False, SSD_GRADS: gl.constexpr = False, HAS_D: gl.constexpr = False,
    D_PER_CHANNEL: gl.constexpr = False, NUM_STAGES: gl.constexpr = 2,
):
    """Grid (N * HV * V / BV,), as the twin's: one program per (sequence, value head, value block
    of BV = 64), the block fastest. Per chunk, last to first, from raw q, k, the query/key head's
    scores ``aqk [rows, H, BT]`` (scale Q K^T, causal, in q's dtype) and ``coef`` (the group prep's
    rows of 8 with its calm gates)::

        calm:      dV^T = f o ((lam scale o dO^T) scores + (scale lam_C) (K dS')^T)
        otherwise: dV^T = dO^T (G o scores) + gam o (K dS')^T
        dS'^T <- lam_C dS'^T + (lam scale o dO^T) Q

    writing dS' leaving the chunk (its chunk-state row of ``dstates``) and dV (float32); dh0 is
    dS' entering the first chunk. g, qg, kg, dl, BK, DOT_PRECISION and HAS_G are the twin's
    arguments, unused here (the gates come from ``coef``, tiles are K wide, products 16-bit)."""
    gl.static_assert(BV == 64, "the Gluon GLA reverse sweep takes 64 value columns a program")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    gl.static_assert(GATE_SCORES and not PER_KEY, "the group prep's scores (GATE_SCORES), a scalar decay")
    gl.static_assert(not SSD_GRADS, "SSD_GRADS: the warp-specialised form or the Triton kernel")
    CW: gl.constexpr = 8  # the group prep's coef floats a row (kernels/gla/group_prep.py, GROUP_COEF_WIDTH)
    NV: gl.constexpr = V // BV
    pid = gl.program_id(0)
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_n = pid // (NV * HV)
    i_h = i_hv // (HV // H)
    bos, L, n_chunks, cs0, k_desc, q_desc, do_desc, s_desc, dv_desc, ds_desc = _sequence_operands(
        q, k, do, aqk, dv, dstates, cu_seqlens, chunk_offsets, T, n_cs_rows, i_n, H, HV, K, V, BT, BV, IS_VARLEN, DT)
    col_qk = i_h * K
    col_v = i_hv * V + i_v * BV
    col_s = i_h * BT

    # Layouts: one warpgroup; results N = 64 (a chunk's columns) and N = K (the state).
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    mmaK: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    a64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma64, k_width=2)
    aK: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mmaK, k_width=2)
    col64: gl.constexpr = gl.SliceLayout(0, mma64)  # along a [BV, BT] tile's columns (the chunk's rows)
    row64: gl.constexpr = gl.SliceLayout(1, mma64)  # along a [BT, BT] tile's rows (i)
    compact: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # a row vector, one register a thread
    blk: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])  # state tiles in

    k_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], k_desc.layout)
    q_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], q_desc.layout)
    do_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], do_desc.layout)
    a_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BT], s_desc.layout)
    g_s = gl.allocate_shared_memory(DT, [BT, BT], s_desc.layout)  # a stormy chunk's G o scores
    ds_s = gl.allocate_shared_memory(DT, [K, BV], ds_desc.layout)
    dv_s = gl.allocate_shared_memory(gl.float32, [BT, BV], dv_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(NUM_STAGES):
        _issue_loads(i, n_chunks, k_desc, q_desc, do_desc, s_desc, k_s, q_s, do_s, a_s, bars, col_qk, col_v, col_s,
                     BT, NUM_STAGES)

    p_h = (i_n.to(gl.int64) * HV + i_hv) * (K * V)
    if HAS_DHT:  # loaded in a layout of its own and converted once
        dS_t = gl.convert_layout(gl.load(dht + p_h + _state_offsets(i_v, blk, BV, K, V)), mmaK)
    else:
        dS_t = gl.zeros([BV, K], gl.float32, layout=mmaK)

    o_t = gl.arange(0, BT, layout=compact)
    o_i = gl.arange(0, BT, layout=row64)  # a [BT, BT] tile's rows i
    o_j = gl.arange(0, BT, layout=col64)  # and columns j
    zero64 = gl.zeros([BV, BT], gl.float32, layout=mma64)
    n_f, n_ls, n_gam, n_gc, n_seg, n_last, n_f0 = _row_coefficients(coef, bos, L, n_chunks - 1, i_n, i_hv, o_t, HV,
                                                                     BT, CW)
    for j in range(n_chunks):
        s = j % NUM_STAGES
        c = n_chunks - 1 - j
        mbarrier.wait(bars.index(s), (j // NUM_STAGES) & 1)
        f, lam_s, gam, gc, seg, lam_last, f_0 = n_f, n_ls, n_gam, n_gc, n_seg, n_last, n_f0
        n_f, n_ls, n_gam, n_gc, n_seg, n_last, n_f0 = _row_coefficients(coef, bos, L, c - 1, i_n, i_hv, o_t, HV, BT,
                                                                        CW)

        # dS' leaving chunk c to its chunk-state row (the previous chunk's dS' store has drained).
        S_b = dS_t.to(DT)
        if PROBE != 1:
            tma.store_wait(pendings=1)
            ds_s.permute((1, 0)).store(S_b)
            fence_async_shared()
            cs = cs0 + c
            cs = gl.where((cs >= 0) & (cs < n_cs_rows), cs, n_cs_rows)  # past the descriptor: not stored
            tma.async_copy_shared_to_global(ds_desc, [(cs * HV + i_hv).to(gl.int32) * K, i_v * BV], ds_s)

        # (K dS')^T, and the next dS'^T onto lam_C dS'^T (the chain) beside it.
        dOt = do_s.index(s).permute((1, 0)).load(mma64).to(gl.float32)  # [BV, BT]
        Wdo = (gl.convert_layout(lam_s, col64)[None, :] * dOt).to(DT)  # (lam scale o dO)^T
        if PROBE != 1:
            dSK = warpgroup_mma(gl.convert_layout(S_b, a64), k_s.index(s).permute((1, 0)), zero64, use_acc=False,
                                is_async=True)
        if PROBE != 2:
            dS_t = warpgroup_mma(gl.convert_layout(Wdo, aK), q_s.index(s), lam_last * dS_t, is_async=True)
        if PROBE != 1:
            dSK = warpgroup_mma_wait(num_outstanding=0 if PROBE == 2 else 1, deps=(dSK,))
            if f_0 == f_0:  # calm (the column factors are NaN in every row otherwise)
                dvt = _calm_dv(Wdo, a_s.index(s), (scale * lam_last) * dSK, f, a64, col64)
            else:
                # G_ij = 2^(gc_i - gc_j) for j <= i in one segment, rows past the end selected out.
                St = a_s.index(s).load(mma64).to(gl.float32)  # scores [i, j]
                g_s.store(_stormy_gate_tile(St, gc, seg, o_i, o_j, c * BT, L, row64, col64).to(DT))
                fence_async_shared()
                gl.thread_barrier()
                dvt = warpgroup_mma(gl.convert_layout(dOt.to(DT), a64), g_s,
                                    gl.convert_layout(gam, col64)[None, :] * dSK, is_async=True)
                dvt = warpgroup_mma_wait(num_outstanding=0, deps=(dvt,))
        if PROBE != 2:
            dS_t = warpgroup_mma_wait(num_outstanding=0, deps=(dS_t,))

        # Stage s is free: refill it with the chunk NUM_STAGES on; dV out (the previous chunk's
        # dV store has drained; this chunk's dS' store may still be pending).
        _issue_loads(j + NUM_STAGES, n_chunks, k_desc, q_desc, do_desc, s_desc, k_s, q_s, do_s, a_s, bars, col_qk,
                     col_v, col_s, BT, NUM_STAGES)
        if PROBE != 1:
            tma.store_wait(pendings=1)
            dv_s.permute((1, 0)).store(dvt)
            fence_async_shared()
            tma.async_copy_shared_to_global(dv_desc, [c * BT, col_v], dv_s)
    tma.store_wait(pendings=0)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))
    if STORE_DH0:
        gl.store(dh0 + p_h + _state_offsets(i_v, mmaK, BV, K, V), dS_t)
