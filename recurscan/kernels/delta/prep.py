"""Stages 1 and 2 of the chunked delta rule: gates, the gate-free WY inverse, gated and stored;
fully parallel over (chunk, value head). See docs/kernels-chunk-delta.md."""
from __future__ import annotations

import triton
import triton.language as tl

from ..gla.common import _ssd_steps
from .common import _chunk_gates, _chunk_slot, _gate_tile, _gates_of, _prep_chunk, _wy_inverse


@triton.jit(do_not_specialize=["n_seq", "chunk_lo", "chunk_span", "wait_primary", "trigger_dependents"])
def chunk_delta_prep_kernel(
    q, k, g, beta, wy, aqk, coef, winv, ready_flags, cu_seqlens, chunk_indices, sequence_order, dt, A, dt_bias,
    scale, T, n_seq, chunk_lo, chunk_span, wait_primary, trigger_dependents, dt_min, dt_max,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr,
    USE_L2NORM: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_G: tl.constexpr,
    INV_PRECISION: tl.constexpr, DT: tl.constexpr, INV_FP16: tl.constexpr = False,
    PDL: tl.constexpr = False, STORE_INV: tl.constexpr = False, WY: tl.constexpr = True,
    SSD: tl.constexpr = False, HAS_DT_BIAS: tl.constexpr = False, DT_SOFTPLUS: tl.constexpr = False,
    DT_LIMIT: tl.constexpr = False, HEADS: tl.constexpr = 1, INV_SPLIT: tl.constexpr = 0,
    QUERY: tl.constexpr = 2, READY: tl.constexpr = False,
):
    """Grid (chunks of the expanded stream x HV,), chunk-major: program -> (chunk pid // HV, value
    head pid % HV), so that the value heads of a GVA group, which share their q/k tiles, run side by
    side. For the program's chunk and value head, writes
    (rows of the expanded stream, BT = 64 columns within the chunk, zeros above the diagonal):

    - ``wy[rows, hv, :]  = (G o Tinv) diag(beta)``, ``Tinv = (I + strictLower(diag(beta) K K^T))^-1``
      computed gate-free, so ``U = wy X`` solves the chunk's gated triangular system (with
      with STORE_INV, for the backward, also ``winv[rows, hv, :] = G o Tinv``, the inverse itself);
    - ``aqk[rows, hv, :] = G o (scale Q_exp K^T)``, causal (diagonal included), on the query rows
      (each token's last copy) only: the sweep reads no other;
    - ``coef[slot, hv, 0:64, 0:4] = (lam rk, lam rq, gam rk, lam_last)`` float32 for the chunk's 64
      rows, slot = :func:`_chunk_slot` (lam rq on the query rows only, lam_last on row 0 only): per
      row, the decay from the chunk start (lam) and to the chunk end (gam) times the row's norm
      factors (rk, and rq with the scale, on the query's row, the token's last copy; 1 and the
      scale without USE_L2NORM), and the decay across the whole chunk; so the sweep reads q and k
      raw and derives no gate.

    The inverse: recursive block doubling on the full 64 x 64 tile (2 -> 4 -> ... -> 64), ten
    products on the tensor cores and no reductions (:func:`_wy_inverse`). INV_PRECISION "tf32" for
    16-bit inputs: its error in Tinv (<= 8e-4 relative, simulated with strongly correlated keys) is
    at the level of the bf16 rounding wy is stored with (9e-4); "ieee" for float32 inputs (every
    product of the kernel then runs in float32). INV_FP16 (16-bit inputs): a chunk whose steps are
    all contractions (0 <= beta_i |k_i|^2 <= 2, checked in the kernel) runs the inverse on fp16
    operands, same mantissa as tf32, half the operand bytes and twice the tensor-core rate; any
    other chunk keeps tf32, whose range it needs. INV_SPLIT (16 or 32, with INV_FP16; 0 off): those
    chunks' inverse takes its levels up to blocks of INV_SPLIT rows on the diagonal blocks as a
    batch (:func:`_wy_inverse`).

    Varlen: ``chunk_indices [NT_pad, 2]`` holds (sequence, chunk) on the expanded stream; a row with
    sequence -1 is padding and does nothing. Programs (c, 0) with c < ceil(n_seq / RANK_BLOCK) write
    the sweep's order of sequences, longest first (``sequence_order [n_seq]``, :func:`_rank_sequences`;
    in this launch rather than one of its own, which would sit between the prep and the sweep).
    Dense: program c covers expanded chunk ``chunk_lo + c % chunk_span`` of sequence
    ``c // chunk_span`` (all chunks: 0 and ceil(T*M/BT); a phase of the phased sweep: its range).

    ``wait_primary`` != 0 (a phase after the first, launched as the programmatic dependent of the
    previous phase's sweep, so that it runs beside it on the SMs that sweep leaves free): the last
    program ends by waiting for that sweep (``griddepcontrol.wait``), so that this kernel's end
    implies the sweep's, as the next launch in the stream expects; the others run freely (they read
    only the op's inputs and write only their own phase's scratch). A runtime value, so that one
    compiled kernel serves every launch; PDL (a constexpr: False under the interpreter, which has
    no grid dependency control) compiles the wait in.

    WY False (gated linear attention, docs/kernels-gla-plan.md: the delta rule without its WY
    step, U = V): no beta, no inverse, no ``wy``; ``aqk`` and ``coef`` as above (M = 1, no l2norm),
    so that the sweep with WY False computes O = lam rq o (Q S) + aqk V, S <- lam_last S +
    K^T (gam o V). SSD (with WY False; Mamba2, q = C, k = B, v = x): the step sizes
    dt <- clamp(softplus?(dt + dt_bias)) of :func:`_ssd_steps` give the log decay dt A (plus
    ``g [B * T]`` per token where HAS_G: mamba's seq_idx as -inf resets), and V = dt o x enters
    through the coefficients: aqk's column j and gam_j carry dt_j, so the sweep reads x raw. A row
    whose dt is not finite is a bad row like a non-finite key.

    HEADS (WY False): a program covers that many consecutive value heads of one query/key head
    (grid: chunks x HV / HEADS), loading q and k and forming Q K^T once for them (SSD's group
    shares C and B across all its heads); 1 is one program per value head as above.

    READY (the chained schedule, launch/delta.py): once the program's stores are issued, its
    (chunk, value head) flag ``ready_flags[slot, hv]`` (int32, slot as coef's, zero before the launch) is
    set to 1 by a release at GPU scope after a barrier of the program's threads, so that a sweep
    reading it with acquire semantics sees everything the program wrote for that chunk. Dense
    programs then go chunk-major across the ``n_seq`` sequences (:func:`_prep_chunk`'s CHUNK_MAJOR),
    as the sweeps read the chunks. ``trigger_dependents`` != 0 (the chained schedule's lead, the
    chunks prepared before the sweep starts): each program lets the sweep, its programmatic
    dependent, launch as it starts, so that the sweep takes the SMs the lead's last programs free.

    QUERY (WY; 2, every launch of the package): 1 loads q for its norms alone and 0 not at all (lam
    rq then the scale alone); neither forms or stores aqk, so a sweep after them gives no output of
    the op's. Benchmarks only (benchmarks/gpu_prep_query_share.py): what the query's part costs.
    """
    tl.static_assert(QUERY == 2 or WY, "QUERY below 2 (benchmarks only) needs the WY step")
    if PDL:
        if trigger_dependents != 0:
            tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0).to(tl.int64)
    i_c = pid // (HV // HEADS)
    i_hv0 = (pid % (HV // HEADS)) * HEADS  # the program's first value head
    i_h = i_hv0 // (HV // H)
    valid, i_n, i_t, bos, eos = _prep_chunk(cu_seqlens, chunk_indices, sequence_order, i_c, i_hv0 == 0, T, n_seq,
                                            chunk_lo, chunk_span, M, BT, IS_VARLEN, READY)
    if not valid:  # padding, or a chunk outside its sequence: nothing to do
        return
    r0 = bos + i_t * BT

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    rows = r0 + o_t.to(tl.int64)  # [BT] rows of the expanded stream
    m_r = rows < eos
    m_q = m_r & (rows % M == M - 1)  # the query of row e is token e // M's, on its last copy only

    # Every load first: the q, k tiles, then beta and the gates. The gates' scan synchronises the
    # warps, which the compiler does not move loads across; issued after it, the tiles' latency
    # was paid a second time (ncu: the top stall sat on the gate load, then on the tiles).
    b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.0)
    if QUERY >= 1:
        b_q = tl.load(q + ((rows // M) * H + i_h)[:, None] * K + o_k[None, :], mask=m_q[:, None] & m_k[None, :],
                      other=0.0)
    if not WY:  # no norm factors: the raw Q K^T serves every value head of the program
        b_qk_raw = tl.dot(b_q.to(DT), tl.trans(b_k.to(DT)), input_precision=INV_PRECISION)
    for j in tl.static_range(HEADS):  # value heads of one query/key head: q, k and Q K^T shared
        i_hv = i_hv0 + j
        if WY:
            b_beta = tl.load(beta + rows * HV + i_hv, mask=m_r, other=0.0).to(tl.float32)

        # Stage 1: within-chunk cumulative log2 decays; G[i, j] = decay from row j to row i.
        if SSD:  # M = 1: rows are tokens
            b_dt = _ssd_steps(dt, dt_bias, rows, m_r, i_hv, HV, dt_min, dt_max, HAS_DT_BIAS, DT_SOFTPLUS, DT_LIMIT)
            bad_dt = b_dt * 0.0 != 0.0
            b_ga = tl.load(A + i_hv).to(tl.float32) * b_dt
            if HAS_G:  # seq_idx: -inf where a sequence starts
                b_ga += tl.load(g + rows, mask=m_r, other=0.0).to(tl.float32)
            # A non-finite step is a bad row (its decay NaN here, so _gates_of flags it), not a reset.
            gc, seg, bad_g = _gates_of(tl.where(m_r, tl.where(bad_dt, float("nan"), b_ga) * 1.4426950408889634, 0.0))
            b_dt = tl.where(bad_dt, 0.0, b_dt)
        else:
            gc, seg, bad_g = _chunk_gates(g, rows // M, rows % M, m_r, i_hv, HV, M, BT, HAS_G)
        causal = o_t[:, None] >= o_t[None, :]

        # Norm factors of the raw q, k.
        eye = o_t[:, None] == o_t[None, :]
        if WY:
            b_kk = tl.dot(b_k.to(DT), tl.trans(b_k.to(DT)), input_precision=INV_PRECISION)  # raw K K^T
            # Squared norms from the diagonals of K K^T and Q Q^T (tensor-core products of the raw
            # tiles, float32 accumulation): fewer instructions than squaring the [BT, K] tiles.
            k_sq = tl.sum(tl.where(eye, b_kk, 0.0), axis=1)
        else:  # no K K^T to take it from; only whether a key is finite matters (no l2norm)
            k_sq = tl.where(tl.max((b_k * 0.0 != 0.0).to(tl.int32), axis=1) != 0, float("nan"), 0.0)
        # Causality under non-finite input: a row whose k, beta or decay is NaN or inf is selected out
        # of every product below (its decay counts as 1, its k and beta as 0), so that no 0 * inf
        # reaches an earlier row; its output and every later one are poisoned instead (NaN in lam rq,
        # and in lam_last for the state), as the token loop's are. One reduction gives both chunk
        # flags: any reset (seg_last != 0) and, rarely, any such row (then has_reset may be a false
        # positive, which only costs the segment comparison).
        bad = bad_g | (k_sq * 0.0 != 0.0)
        if WY:
            bad |= b_beta * 0.0 != 0.0
        flags = tl.max(seg + 128 * bad.to(tl.int32), axis=0)
        has_reset = flags != 0
        any_bad = flags >= 128
        first_bad = flags * 0 + BT
        if any_bad:
            first_bad = tl.min(tl.where(bad, o_t, BT), axis=0)
            if WY:
                b_kk = tl.where(bad[:, None] | bad[None, :], 0.0, b_kk)
        k_sq = tl.where(bad, 0.0, k_sq)
        if WY:
            b_beta = tl.where(bad, 0.0, b_beta)
        if USE_L2NORM and QUERY == 0:
            rk = tl.rsqrt(k_sq + 1e-6)
            rq = tl.full([BT], 1.0, tl.float32) * scale
        elif USE_L2NORM:
            rk = tl.rsqrt(k_sq + 1e-6)
            b_qq = tl.dot(b_q.to(DT), tl.trans(b_q.to(DT)), input_precision=INV_PRECISION)
            rq = tl.rsqrt(tl.sum(tl.where(eye, b_qq, 0.0), axis=1) + 1e-6) * scale
        else:
            rk = tl.full([BT], 1.0, tl.float32)
            rq = tl.full([BT], 1.0, tl.float32) * scale
        # The sweep's per-row coefficients: decays (0 across a reset) times the norm factors.
        gc_last = tl.sum(tl.where(o_t == BT - 1, gc, 0.0), axis=0)
        seg_last = tl.sum(tl.where(o_t == BT - 1, seg, 0), axis=0)
        lam = tl.where(seg == 0, tl.exp2(gc), 0.0)
        gam = tl.where(seg == seg_last, tl.exp2(tl.where(seg == seg_last, gc_last - gc, 0.0)), 0.0)
        lam_last = tl.where(any_bad, float("nan"), tl.where(seg_last == 0, tl.exp2(gc_last), 0.0))
        rq = tl.where(o_t < first_bad, rq, float("nan"))
        # coef by (chunk, head): one contiguous 1 KB tile, whole lines written here and read by the
        # sweep (rather than rows of 16 B at a stride of HV x 16 B).
        p_coef = coef + ((_chunk_slot(bos, i_t, i_n, BT) * HV + i_hv) * BT + o_t) * 4
        tl.store(p_coef, lam * rk, mask=m_r)
        tl.store(p_coef + 1, lam * rq, mask=m_q)
        if SSD:  # V = dt o x: the state takes gam_j dt_j x_j
            tl.store(p_coef + 2, gam * rk * b_dt, mask=m_r)
        else:
            tl.store(p_coef + 2, gam * rk, mask=m_r)
        tl.store(p_coef + 3, tl.zeros([BT], dtype=tl.float32) + lam_last, mask=o_t == 0)  # read on row 0 only
        p_out = (rows * HV + i_hv)[:, None] * BT + o_t[None, :]

        # aqk = G o (scale Q K^T) (normalised q, k: the factors scale the product's rows and columns).
        # It and lam rq are stored on the query rows only (every M-th row), the only ones the sweep
        # reads; for GDP that halves the aqk bytes written (M = 2).
        if QUERY == 2:
            if WY:
                b_qk = tl.dot(b_q.to(DT), tl.trans(b_k.to(DT)), input_precision=INV_PRECISION) * rq[:, None] * rk[None, :]
            else:
                b_qk = b_qk_raw * rq[:, None] * rk[None, :]
            if SSD:  # and the outputs take aqk_ij dt_j x_j
                b_qk = b_qk * b_dt[None, :]
            if any_bad:  # a non-finite key's column
                b_qk = tl.where(bad[None, :], 0.0, b_qk)
        b_G = _gate_tile(gc, seg, causal, has_reset)
        if QUERY == 2:
            tl.store(aqk + p_out, (b_G * b_qk).to(aqk.dtype.element_ty), mask=m_q[:, None])
        if WY:  # stage 2, the WY inverse
            # G diag(beta), wy's factor besides Tinv, held across the inverse at 16 bits for 16-bit inputs
            # (16 registers a thread, not the 48 of the gate and beta vectors in the product's layout):
            # fp16 rounds it to 2^-11 relative (under the 2^-9 that wy is stored with in bf16), and entries
            # under 2^-14 to 2^-25 absolute (fp16's subnormals), far under the rounding of the sums they
            # enter. Float32 inputs keep it in float32.
            if STORE_INV:  # the backward's G o Tinv = (I + diag(beta) A)^-1, without the beta columns
                b_Gi = b_G.to(tl.float16 if wy.dtype.element_ty != tl.float32 else tl.float32)
            b_Gb = (b_G * b_beta[None, :]).to(tl.float16 if wy.dtype.element_ty != tl.float32 else tl.float32)

            # Stage 2: A = diag(beta) strictLower(K K^T) for normalised keys.
            b_A = b_kk * (b_beta * rk)[:, None] * rk[None, :]
            if INV_FP16:
                # fp16 operands are safe when every step I - beta_i k_i k_i^T of the chunk is a contraction
                # (0 <= beta_i |k_i|^2 <= 2): then every entry of Tinv and of the partial inverses is at
                # most 1 in magnitude, and A_s D_s at most 2 * 64. Otherwise this chunk keeps tf32.
                growth = tl.max(b_beta * (rk * rk * k_sq), axis=0)  # max_i beta_i |k_i|^2 (normalised)
                contraction = (growth <= 2.0) & (tl.min(b_beta, axis=0) >= 0.0)
            b_A = tl.where(o_t[:, None] > o_t[None, :], b_A, 0.0)

            # Tinv = (I + A)^-1 by recursive block doubling (_wy_inverse).
            b_T = eye.to(tl.float32) - tl.where((o_t[:, None] ^ o_t[None, :]) == 1, b_A, 0.0)
            if INV_FP16:
                if contraction:
                    b_T = _wy_inverse(b_T, b_A, o_t, True, INV_PRECISION, INV_SPLIT)
                else:
                    b_T = _wy_inverse(b_T, b_A, o_t, False, INV_PRECISION)
            else:
                b_T = _wy_inverse(b_T, b_A, o_t, False, INV_PRECISION)
            # p_out and m_r formed anew from scalars and o_t: the same expressions would be one value, held
            # in registers across the inverse (the stores' addresses are 64-bit).
            p_wy = wy + (r0 * HV + i_hv) * BT + (o_t * (HV * BT))[:, None] + o_t[None, :]
            tl.store(p_wy, (b_Gb.to(tl.float32) * b_T).to(wy.dtype.element_ty), mask=(o_t < eos - r0)[:, None])
            if STORE_INV:
                p_winv = winv + (r0 * HV + i_hv) * BT + (o_t * (HV * BT))[:, None] + o_t[None, :]
                tl.store(p_winv, (b_Gi.to(tl.float32) * b_T).to(winv.dtype.element_ty), mask=(o_t < eos - r0)[:, None])
        if READY:
            tl.debug_barrier()  # every thread's stores before the one thread's release
            tl.atomic_xchg(ready_flags + _chunk_slot(bos, i_t, i_n, BT) * HV + i_hv, 1, sem="release", scope="gpu")
    if PDL:
        if (wait_primary != 0) & (pid == tl.num_programs(0) - 1):
            tl.extra.cuda.gdc_wait()
