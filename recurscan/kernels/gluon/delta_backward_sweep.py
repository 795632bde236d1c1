"""The delta rule's reverse sweep in Gluon: the Triton twin is
:func:`recurscan.kernels.delta.backward.chunk_delta_bwd_sweep_kernel` (same arguments; for GDN the
same arithmetic in the same order, so the same bits; for Gated Delta Product see item 5), which has
the algebra. GPU only (sm_90); the planner takes it where :func:`recurscan.kernels.gluon.gluon_usable`
and ``plan.delta.gluon_twins`` allow.

What differs from the twin is how a chunk's work is scheduled, per program (one warpgroup, dS^T
[BV, K] float32 in registers):

1. The tiles (k, q, dO, G o Tinv, aqk) arrive by bulk tensor copies into a ring of NUM_STAGES
   shared-memory stages, one mbarrier each, issued NUM_STAGES chunks ahead. The descriptors are
   made on the device per program over its own sequence's rows, so a partial last chunk reads
   zeros past the sequence's end and its stores stop there (the twin's masks).
2. The products are waited on four times a chunk: dS^T K^T; dO^T aqk onto (gam rk) o that (the
   twin's compiler makes the sum an accumulation, so its bits need this order); dU^T winv; and
   {(lam rq o dO^T) Q, -(lam rk o dv^T) K} issued together onto lam_C dS^T.
3. dS leaving the chunk, dY and dv leave through shared memory by bulk tensor stores that are
   waited on a chunk later, not at once.
4. Each chunk's row coefficients are loaded one chunk ahead in a compact layout (one register a
   vector) and moved into the products' layout where used.
5. Gated Delta Product (M > 1, every stage on the expanded stream of M copies a token): a chunk's
   query rows (each token's last copy) are BT / M tokens of q and dO, read from the token stream,
   and aqk's rows on them, read through a descriptor whose rows are M apart. The query-side
   products (dO^T aqk and (lam rq o dO^T) Q) then sum over those BT / M rows alone, where the twin
   sums over all BT rows with the other copies' rows zero: the same terms, added in another grouping
   inside the products, so the gradients agree with the twin's to float32 rounding of the reverse
   chain, not bit for bit (tests/gpu/test_delta_grad_gpu.py). At M = 1 the kernel is the form above.

Scope (``plan.delta.gluon_reverse_sweep_scope`` checks it): M 1 or 2, 16-bit inputs, K 64 or 128,
V a multiple of BV = 64, 16-byte aligned tensors; dense or varlen.
"""
from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)


#: A timing probe (``RECURSCAN_DELTA_REVERSE_PROBE`` when this module is imported; only
#: benchmarks/gpu_delta_reverse_probe.py sets it): 0 the kernel; 1 the ring of loads and the chain
#: alone (dS^T K^T, dU^T winv, -(lam rk o dv^T) K onto lam_C dS^T), without dO^T aqk, (lam rq o
#: dO^T) Q or the dS, dY and dv stores; 3 the kernel without those stores; 6 the kernel with their
#: staging buffers written but no store issued. Probes 1, 3 and 6 write wrong gradients: for timing
#: only. They split a chunk's time between the chain, the rest of its arithmetic and its stores
#: (docs/kernels-delta-backward.md, "Where the time goes").
_PROBE = os.environ.get("RECURSCAN_DELTA_REVERSE_PROBE", "0")
if _PROBE not in ("0", "1", "3", "6"):
    raise ValueError(f"RECURSCAN_DELTA_REVERSE_PROBE: expected 0, 1, 3 or 6, got {_PROBE!r}")
PROBE = gl.constexpr(int(_PROBE))


@gluon.jit
def _sequence_place(i_n, cu_seqlens, chunk_offsets, T, BT: gl.constexpr, IS_VARLEN: gl.constexpr,
                    M: gl.constexpr = 1):
    """Sequence ``i_n``'s first row ``bos`` and length ``L`` on the expanded stream (M rows a token;
    int64; varlen token boundaries clamped to [0, T], so no descriptor reaches outside the inputs),
    its chunks, its first chunk-state row ``cs0``, and a descriptor's rows over it on the expanded
    stream and on the token stream (the sequence's; an empty one reads nothing)."""
    if IS_VARLEN:
        bos = gl.minimum(gl.maximum(gl.load(cu_seqlens + i_n).to(gl.int64), 0), T)
        eos = gl.minimum(gl.maximum(gl.load(cu_seqlens + i_n + 1).to(gl.int64), bos), T)
        cs0 = gl.load(chunk_offsets + i_n).to(gl.int64)
    else:
        bos = i_n.to(gl.int64) * T
        eos = bos + T
        cs0 = i_n.to(gl.int64) * ((T * M + BT - 1) // BT)
    tokens = eos - bos
    L = tokens * M
    n_chunks = ((L + BT - 1) // BT).to(gl.int32)
    rows = gl.maximum(L, 1).to(gl.int32)
    token_rows = gl.maximum(tokens, 1).to(gl.int32)
    return bos * M, L, n_chunks, cs0, rows, token_rows


@gluon.jit
def _issue_loads(j, n_chunks, k_desc, q_desc, do_desc, w_desc, a_desc, k_s, q_s, do_s, w_s, a_s, bars,
                 col_qk, col_v, col_w, BT: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The bulk copies of the program's j-th chunk in its walk (chunk n_chunks - 1 - j of the
    sequence) into stage j % NUM_STAGES; none past its last. k and G o Tinv by the chunk's BT rows
    of the expanded stream; q, dO and aqk's query rows by its BT / M tokens."""
    s = j % NUM_STAGES
    pred = j < n_chunks
    bar = bars.index(s)
    nbytes: gl.constexpr = (k_desc.block_type.nbytes + q_desc.block_type.nbytes + do_desc.block_type.nbytes
                            + w_desc.block_type.nbytes + a_desc.block_type.nbytes)
    mbarrier.expect(bar, nbytes, pred=pred)
    c = n_chunks - 1 - j
    r = c * BT
    rq = c * q_desc.block_type.shape[0]
    tma.async_copy_global_to_shared(k_desc, [r, col_qk], bar, k_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(q_desc, [rq, col_qk], bar, q_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(do_desc, [rq, col_v], bar, do_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(w_desc, [r, col_w], bar, w_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(a_desc, [rq, col_w], bar, a_s.index(s), pred=pred)


@gluon.jit
def _row_coefficients(coef, beta, bos, L, c, i_n, i_hv, o_t, o_q, HV: gl.constexpr, BT: gl.constexpr,
                      M: gl.constexpr):
    """Chunk c's (lam rk, gam rk, beta) along its rows in o_t's layout, lam rq along its query rows
    (each token's last copy, o_q M + M - 1) in o_q's (zero past the sequence's end), and lam_C: the
    twin's coefficient tile. ``c`` may be -1 (the walk's end): the loads are then masked off."""
    m_r = (c * BT + o_t < L) & (c >= 0)
    p_coef = coef + (((bos + c * BT) // BT + i_n) * HV + i_hv) * (BT * 4)
    lam_rk = gl.load(p_coef + o_t * 4, mask=m_r, other=0.0)
    r_q = o_q * M + (M - 1)
    lam_rq = gl.load(p_coef + r_q * 4 + 1, mask=(c * BT + r_q < L) & (c >= 0), other=0.0)
    gam_rk = gl.load(p_coef + o_t * 4 + 2, mask=m_r, other=0.0)
    lam_last = gl.load(p_coef + 3, mask=c >= 0, other=0.0)
    b_beta = gl.load(beta + (bos + c * BT + o_t) * HV + i_hv, mask=m_r, other=0.0).to(gl.float32)
    return lam_rk, lam_rq, gam_rk, b_beta, lam_last


@gluon.jit
def _state_offsets(i_v, layout: gl.constexpr, BV: gl.constexpr, K: gl.constexpr, V: gl.constexpr):
    """Offsets of a [BV, K] tile S^T of a [K, V] state (value block i_v) in ``layout``."""
    o_v = gl.arange(0, BV, layout=gl.SliceLayout(1, layout))
    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, layout))
    return (i_v * BV + o_v)[:, None] + (o_k * V)[None, :]


@gluon.jit
def gluon_bwd_sweep_kernel(
    q, k, beta, do, winv, aqk, coef, dstates, dht, dh0, dy_out, dv,
    cu_seqlens, chunk_offsets, T, n_cs_rows,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_DHT: gl.constexpr, STORE_DH0: gl.constexpr,
    DOT_PRECISION: gl.constexpr, DT: gl.constexpr, M: gl.constexpr = 1, NUM_STAGES: gl.constexpr = 3,
):
    """Grid (N * HV * V / BV,), as the twin's: one program per (sequence, value head, value block
    of BV = 64), iv fastest. Per chunk, last to first, from raw q, k:

        dU^T = dO^T aqk + (gam rk) o (dS^T K^T)
        dY^T = dU^T winv;            dv^T = beta o dY^T
        dS^T <- lam_C dS^T + (lam rq o dO^T) Q - (lam rk o dv^T) K

    writing dS leaving the chunk (its chunk-state row of ``dstates``), dY and dv; dh0 is dS^T
    entering the first chunk. The query-side terms sum over the chunk's query rows alone (item 5
    of the module's docstring). BK and DOT_PRECISION are the twin's arguments, unused here (K wide
    tiles, 16-bit products)."""
    gl.static_assert(BV == 64, "the Gluon reverse sweep takes 64 value columns a program")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    gl.static_assert(M == 1 or M == 2, "GDN (M = 1) or Gated Delta Product with M = 2")
    BQ: gl.constexpr = BT // M  # a chunk's query rows: its tokens
    NV: gl.constexpr = V // BV
    pid = gl.program_id(0)
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_n = pid // (NV * HV)
    i_h = i_hv // (HV // H)
    bos, L, n_chunks, cs0, rows, token_rows = _sequence_place(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN,
                                                              M)
    tok0 = bos // M  # the sequence's first token

    # Descriptors over this sequence's rows: a tile past its end reads zeros, a store stops there.
    # k, G o Tinv and the outputs on the expanded stream; q, dO and aqk's query rows by token.
    l_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], DT)
    l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DT)
    l_tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], DT)
    l_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K, BV], DT)
    l_qq: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BQ, K], DT)
    l_qv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BQ, BV], DT)
    l_qt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BQ, BT], DT)
    k_desc = tma.make_tensor_descriptor(k + bos * (H * K), [rows, H * K], [H * K, 1], [BT, K], l_qk)
    q_desc = tma.make_tensor_descriptor(q + tok0 * (H * K), [token_rows, H * K], [H * K, 1], [BQ, K], l_qq)
    do_desc = tma.make_tensor_descriptor(do + tok0 * (HV * V), [token_rows, HV * V], [HV * V, 1], [BQ, BV], l_qv)
    w_desc = tma.make_tensor_descriptor(winv + bos * (HV * BT), [rows, HV * BT], [HV * BT, 1], [BT, BT], l_tt)
    a_desc = tma.make_tensor_descriptor(aqk + (bos + M - 1) * (HV * BT), [token_rows, HV * BT], [M * HV * BT, 1],
                                        [BQ, BT], l_qt)
    dy_desc = tma.make_tensor_descriptor(dy_out + bos * (HV * V), [rows, HV * V], [HV * V, 1], [BT, BV], l_tv)
    dv_desc = tma.make_tensor_descriptor(dv + bos * (HV * V), [rows, HV * V], [HV * V, 1], [BT, BV], l_tv)
    # Chunk-state rows outside [0, n_cs_rows) (a wrong chunk_offsets entry) are moved just past it.
    ds_desc = tma.make_tensor_descriptor(dstates, [n_cs_rows * (HV * K), V], [V, 1], [K, BV], l_kv)
    col_qk = i_h * K
    col_v = i_hv * V + i_v * BV
    col_w = i_hv * BT

    # Layouts: one warpgroup; results N = 64 (a chunk's columns) and N = K (the state).
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    mmaK: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    mmaQ: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BQ, 16])
    a64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma64, k_width=2)
    aK: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mmaK, k_width=2)
    col64: gl.constexpr = gl.SliceLayout(0, mma64)  # along a [BV, BT] tile's columns (the chunk's rows)
    colQ: gl.constexpr = gl.SliceLayout(0, mmaQ)  # along a [BV, BQ] tile's columns (its query rows)
    compact: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # a row vector, one register a thread
    blk: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])  # state tiles in and out

    k_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], l_qk)
    q_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BQ, K], l_qq)
    do_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BQ, BV], l_qv)
    w_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BT], l_tt)
    a_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BQ, BT], l_qt)
    ds_s = gl.allocate_shared_memory(DT, [K, BV], l_kv)
    dy_s = gl.allocate_shared_memory(DT, [BT, BV], l_tv)
    dv_s = gl.allocate_shared_memory(DT, [BT, BV], l_tv)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(NUM_STAGES):
        _issue_loads(i, n_chunks, k_desc, q_desc, do_desc, w_desc, a_desc, k_s, q_s, do_s, w_s, a_s, bars,
                     col_qk, col_v, col_w, BT, NUM_STAGES)

    p_h = (i_n.to(gl.int64) * HV + i_hv) * (K * V)
    if HAS_DHT:  # loaded in a layout of its own and converted once
        dS_t = gl.convert_layout(gl.load(dht + p_h + _state_offsets(i_v, blk, BV, K, V)), mmaK)
    else:
        dS_t = gl.zeros([BV, K], gl.float32, layout=mmaK)

    o_t = gl.arange(0, BT, layout=compact)
    o_q = gl.arange(0, BQ, layout=compact)
    zero64 = gl.zeros([BV, BT], gl.float32, layout=mma64)
    n_rk, n_rq, n_gk, n_beta, n_last = _row_coefficients(coef, beta, bos, L, n_chunks - 1, i_n, i_hv, o_t, o_q, HV,
                                                         BT, M)
    for j in range(n_chunks):
        s = j % NUM_STAGES
        c = n_chunks - 1 - j
        mbarrier.wait(bars.index(s), (j // NUM_STAGES) & 1)
        lam_rk, lam_rq, gam_rk, b_beta, lam_last = n_rk, n_rq, n_gk, n_beta, n_last
        n_rk, n_rq, n_gk, n_beta, n_last = _row_coefficients(coef, beta, bos, L, c - 1, i_n, i_hv, o_t, o_q, HV, BT,
                                                             M)

        # dS leaving chunk c to its chunk-state row (the previous chunk's dS store has drained).
        S_b = dS_t.to(DT)
        if PROBE != 1 and PROBE != 3:
            tma.store_wait(pendings=2)
            ds_s.permute((1, 0)).store(S_b)
            fence_async_shared()
            cs = cs0 + c
            cs = gl.where((cs >= 0) & (cs < n_cs_rows), cs, n_cs_rows)  # past the descriptor: not stored
            if PROBE != 6:
                tma.async_copy_shared_to_global(ds_desc, [(cs * HV + i_hv).to(gl.int32) * K, i_v * BV], ds_s)

        # Group 1: dS^T K^T (the chain), then dO^T aqk accumulated onto its scaled result, as the
        # twin's compiler combines the sum (a product added to a tensor becomes its accumulator).
        KSt = warpgroup_mma(gl.convert_layout(S_b, a64), k_s.index(s).permute((1, 0)), zero64, use_acc=False,
                            is_async=True)
        KSt = warpgroup_mma_wait(num_outstanding=0, deps=(KSt,))
        if PROBE == 1:
            dUt = gl.convert_layout(gam_rk, col64)[None, :] * KSt
        else:
            dUt = warpgroup_mma(do_s.index(s).permute((1, 0)), a_s.index(s),
                                gl.convert_layout(gam_rk, col64)[None, :] * KSt, is_async=True)
            dUt = warpgroup_mma_wait(num_outstanding=0, deps=(dUt,))

        # Group 2: dY^T = dU^T winv; meanwhile the next group's first operand.
        dYt = warpgroup_mma(gl.convert_layout(dUt.to(DT), a64), w_s.index(s), zero64, use_acc=False, is_async=True)
        if PROBE != 1:
            dOt = do_s.index(s).permute((1, 0)).load(mmaQ).to(gl.float32)
            A3 = gl.convert_layout((gl.convert_layout(lam_rq, colQ)[None, :] * dOt).to(DT), aK)
        dYt = warpgroup_mma_wait(num_outstanding=0, deps=(dYt,))
        dvt = gl.convert_layout(b_beta, col64)[None, :] * dYt

        # Group 3: dS^T <- lam_C dS^T + (lam rq o dO^T) Q - (lam rk o dv^T) K (the chain).
        if PROBE == 1:
            dS_t = lam_last * dS_t
        else:
            dS_t = warpgroup_mma(A3, q_s.index(s), lam_last * dS_t, is_async=True)
        A4 = gl.convert_layout((-gl.convert_layout(lam_rk, col64)[None, :] * dvt).to(DT), aK)
        dS_t = warpgroup_mma(A4, k_s.index(s), dS_t, is_async=True)
        # dY and dv out while the group runs (the previous chunk's have drained).
        if PROBE != 1 and PROBE != 3:
            tma.store_wait(pendings=1)
            dy_s.permute((1, 0)).store(dYt.to(DT))
            dv_s.permute((1, 0)).store(dvt.to(DT))
            fence_async_shared()
            if PROBE != 6:
                tma.async_copy_shared_to_global(dy_desc, [c * BT, col_v], dy_s)
                tma.async_copy_shared_to_global(dv_desc, [c * BT, col_v], dv_s)
        dS_t = warpgroup_mma_wait(num_outstanding=0, deps=(dS_t,))

        # Stage s is free: refill it with the chunk NUM_STAGES on.
        _issue_loads(j + NUM_STAGES, n_chunks, k_desc, q_desc, do_desc, w_desc, a_desc, k_s, q_s, do_s, w_s, a_s,
                     bars, col_qk, col_v, col_w, BT, NUM_STAGES)
    tma.store_wait(pendings=0)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))
    if STORE_DH0:
        gl.store(dh0 + p_h + _state_offsets(i_v, mmaK, BV, K, V), dS_t)
