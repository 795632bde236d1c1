"""The prep of a scalar decay whose query/key heads serve many value heads (Mamba2 SSD: C and B
shared by a group's heads; GLA under GVA) for the delta sweep with its WY step off and
GATE_SCORES: the chunk's scores once per query/key head, and the gates of every value head of it
as [BT, heads] tiles; the sweep gates the scores per value head. docs/kernels-gla-plan.md has the
design and its measurements."""
from __future__ import annotations

import triton
import triton.language as tl

from ..delta.common import _chunk_slot, _gates_of, _prep_chunk
from .common import _ssd_steps

#: Floats a row of ``coef`` holds with GATE_SCORES (kernels/delta/sweep.py reads them).
GROUP_COEF_WIDTH = tl.constexpr(8)
#: CALM_GATES: a chunk is calm (its gates factored) for a head when lam scale = +-2^gcs lies in
#: [2^-96, 2^96] on every row before its first bad one: its column factors c / (lam scale) and
#: the outputs' partial sums (at most 2^96 times the outputs) then stay finite, and a term of
#: U o f below bf16's smallest normal (2^-126) would have added under 2^-30 |score| to an output.
CALM_LOG2_SPAN = tl.constexpr(96.0)


@triton.jit
def _row_of_8(c0, c1, c2, c3, c4, c5, c6, c7):
    """[BT, HB, 8]: the eight [BT, HB] tiles side by side along a new last axis, for one 32-byte
    store a row. A join puts its new axis last, so nested joins of pairs interleave: joining
    (x0, x1) and (x2, x3) gives x0 x2 x1 x3; the tiles go in in bit-reversed order to come out in
    order."""
    row = tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)), tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    return tl.reshape(row, [c0.shape[0], c0.shape[1], 8])


@triton.jit
def _max_keeping_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit(do_not_specialize=["n_seq", "chunk_lo", "chunk_span", "wait_primary"])
def chunk_group_prep_kernel(
    q, k, g, scores, coef, cu_seqlens, chunk_indices, sequence_order, dt, A, dt_bias,
    scale, T, n_seq, chunk_lo, chunk_span, wait_primary, dt_min, dt_max,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, HB: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_G: tl.constexpr, DT: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr = False, SCORES: tl.constexpr = True, SSD: tl.constexpr = False,
    HAS_DT_BIAS: tl.constexpr = False, DT_SOFTPLUS: tl.constexpr = False, DT_LIMIT: tl.constexpr = False,
    CALM_GATES: tl.constexpr = False,
):
    """Grid (chunks x H x ceil(HV / H / HB),): program -> (chunk, query/key head, block of HB of
    its value heads), the block fastest; without SCORES (chunks x ceil(HV / HB),): (chunk, block of
    HB value heads), the heads of any query/key head. For its chunk of BT = 64 rows (M = 1: rows
    are tokens) it writes

    - ``scores [rows, H, BT]`` (SCORES, the head's first block; float32, in the inputs' dtype with
      CALM_GATES): scale Q K^T, the causal part (zeros above the diagonal), the column of a key
      with a NaN or inf zero; none without SCORES (the sweep forms them, SWEEP_SCORES);
    - for each value head hv of its block, ``coef[slot, hv, 0:BT, 0:8]`` float32 at slot =
      :func:`_chunk_slot`, a row of 8 in one store: 1 lam scale (NaN from the head's first bad row
      on), 2 gam c, 3 lam_last (read from row 0), 4 gc, 5 seg (a float), 6 c with a bad row's 0;
      with CALM_GATES 0 the column factor f = c / (lam scale) (0 from the first bad row on; NaN in
      every row of a chunk that is not calm), else 0 zero; 7 c scale with a bad row's 0 (for a
      sweep that forms the scores itself, SWEEP_SCORES, where a key is not read here, so that only
      a bad decay or step size makes a row bad); every row of the slot, rows past
      the sequence's end (within its last chunk) from masked inputs. gc and seg are the prefix
      sums of the log2 decays and the resets (:func:`_gates_of`), lam = 2^gc before the first
      reset, gam the decay to the chunk end within the last segment, c the column factor (SSD: the
      step size dt; else 1). A chunk is calm for a head when it has one segment and lam scale
      within 2^+-:data:`CALM_LOG2_SPAN` on its rows before the first bad one;

    so that the sweep (GATE_SCORES) forms each value head's aqk^T [j, i] = G_ij c_j scores_ij,
    G_ij = 2^(gc_i - gc_j) for j <= i in one segment (in a calm chunk G_ij c_j = (lam_i scale)
    f_j: the outputs' row factor lam scale times the column factor), and otherwise reads lam
    scale, gam c and lam_last as it reads the delta prep's coef (kernels/delta/prep.py, WY False): the same
    algebra, with the G o (Q K^T) products formed once per query/key head instead of once per
    value head, and no [BT, BT] tile a value head written to memory.

    SSD (q = C, k = B, v = x): the step sizes :func:`_ssd_steps`, the log decay dt A (plus
    ``g [B * T]`` where HAS_G: mamba's seq_idx as -inf resets); else ``g [B * T, HV]`` the log decay
    per value head (HAS_G; none: decay 1). Bad rows as the delta prep's: a key with a NaN or inf
    (every head of the group; with SCORES only), a decay or step size NaN or +inf (its head):
    selected out of every product, and the head's outputs from the row on and its state poisoned.
    Without SCORES the sweep's own products carry a bad key as the token loop does: its outputs
    from the key's row on (across a reset too: the sweep keeps a non-finite score past a segment's
    start) and the state's entries it enters. Varlen and phases as
    :func:`chunk_delta_prep_kernel` (:func:`_prep_chunk`, ``wait_primary`` and PDL the same)."""
    # With SCORES a program's value heads share its query/key head's scores; without, nothing is
    # formed per query/key head, so a block of HB value heads may span several of them.
    QK_BLOCKS: tl.constexpr = H if SCORES else 1
    SPAN: tl.constexpr = HV // QK_BLOCKS  # the value heads of a query/key head (without SCORES: all)
    NHB: tl.constexpr = (SPAN + HB - 1) // HB  # blocks of them, a program each
    pid = tl.program_id(0).to(tl.int64)
    i_c = pid // (QK_BLOCKS * NHB)
    i_h = (pid // NHB) % QK_BLOCKS
    i_hb = pid % NHB
    valid, i_n, i_t, bos, eos = _prep_chunk(cu_seqlens, chunk_indices, sequence_order, i_c,
                                            pid % (QK_BLOCKS * NHB) == 0, T, n_seq, chunk_lo, chunk_span, 1, BT,
                                            IS_VARLEN)
    if not valid:  # padding, or a chunk outside its sequence: nothing to do
        return
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    rows = bos + i_t * BT + o_t.to(tl.int64)
    m_r = rows < eos
    m_rk = m_r[:, None] & (o_k < K)[None, :]
    if SCORES:  # a bad key's column of the scores zeroed, and its row marked bad
        b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0)
        bad_k = ~(tl.reduce(tl.abs(b_k.to(tl.float32)), 1, _max_keeping_nan) < float("inf"))  # a NaN or inf in it
    else:  # the sweep forms the scores: a bad key reaches the products there, as in the token loop
        bad_k = o_t < 0
    if SCORES and i_hb == 0:
        b_q = tl.load(q + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=m_rk, other=0.0)
        b_s = tl.dot(b_q.to(DT), tl.trans(b_k.to(DT)), input_precision=PRECISION) * scale
        b_s = tl.where((o_t[:, None] >= o_t[None, :]) & (bad_k == 0)[None, :], b_s, 0.0)
        tl.store(scores + (rows * H + i_h)[:, None] * BT + o_t[None, :], b_s, mask=m_r[:, None])

    slot = _chunk_slot(bos, i_t, i_n, BT)
    # the block's value heads
    o_h = i_hb * HB + tl.arange(0, HB)
    m_h = o_h < SPAN
    hv = i_h * SPAN + tl.minimum(o_h, SPAN - 1)  # in range for the loads; the stores are masked by m_h
    m_rh = m_r[:, None] & m_h[None, :]
    if SSD:
        b_c = _ssd_steps(dt, dt_bias, rows[:, None], m_rh, hv[None, :], HV, dt_min, dt_max, HAS_DT_BIAS,
                         DT_SOFTPLUS, DT_LIMIT)
        bad_dt = b_c * 0.0 != 0.0
        b_lg = tl.load(A + hv).to(tl.float32)[None, :] * b_c
        if HAS_G:  # seq_idx: -inf where a sequence starts
            b_lg += tl.load(g + rows, mask=m_r, other=0.0).to(tl.float32)[:, None]
        # A non-finite step is a bad row (its decay NaN here, so _gates_of flags it), not a reset.
        b_lg = tl.where(m_rh, tl.where(bad_dt, float("nan"), b_lg) * 1.4426950408889634, 0.0)
        b_c = tl.where(bad_dt, 0.0, b_c)
    else:
        if HAS_G:
            b_lg = tl.load(g + rows[:, None] * HV + hv[None, :], mask=m_rh, other=0.0).to(tl.float32)
            b_lg = b_lg * 1.4426950408889634
        else:
            b_lg = tl.zeros([BT, HB], dtype=tl.float32)
        b_c = tl.full([BT, HB], 1.0, tl.float32)
    gc, seg, bad = _gates_of(b_lg)
    bad |= bad_k[:, None]
    first_bad = tl.min(tl.where(bad, o_t[:, None], BT), axis=0)  # [HB]
    gc_last = tl.sum(tl.where(o_t[:, None] == BT - 1, gc, 0.0), axis=0)
    seg_last = tl.sum(tl.where(o_t[:, None] == BT - 1, seg, 0), axis=0)
    lam = tl.where(seg == 0, tl.exp2(gc), 0.0)
    last = seg == seg_last[None, :]
    gam = tl.where(last, tl.exp2(tl.where(last, gc_last[None, :] - gc, 0.0)), 0.0)
    lam_last = tl.where(first_bad < BT, float("nan"), tl.where(seg_last == 0, tl.exp2(gc_last), 0.0))
    zero = tl.zeros([BT, HB], dtype=tl.float32)
    f = zero
    if CALM_GATES:  # rows past the end have log decay 0; rows from the first bad one on are NaN anyway
        gcs = gc + tl.log2(tl.abs(scale))  # lam scale = +-2^gcs
        live = o_t[:, None] < first_bad[None, :]
        span = tl.max(tl.where(live, tl.abs(gcs), 0.0), axis=0)  # NaN or inf where scale is
        calm = (seg_last == 0) & (span <= CALM_LOG2_SPAN) & (scale * 0.0 == 0.0)
        f = tl.where(live, b_c * tl.exp2(-gcs) * tl.where(scale < 0, -1.0, 1.0), 0.0)
        f = tl.where(calm[None, :], f, float("nan"))
    lam_scale = tl.where(o_t[:, None] < first_bad[None, :], lam * scale, float("nan"))
    c_good = tl.where(bad, 0.0, b_c)
    row = _row_of_8(f, lam_scale, gam * b_c, zero + lam_last[None, :], gc, seg.to(tl.float32), c_good,
                    c_good * scale)
    o_w = tl.arange(0, GROUP_COEF_WIDTH)
    # the slot's offset in 64 bits once, the block's within it in 32
    p_coef = coef + slot * (HV * BT * GROUP_COEF_WIDTH) + \
        (((hv.to(tl.int32)[None, :] * BT + o_t[:, None]) * GROUP_COEF_WIDTH)[:, :, None] + o_w[None, None, :])
    # every row of the chunk's slot, those past the sequence's end too (from masked inputs: finite
    # unless an earlier row was bad), so that a reader may load a chunk's coef rows unmasked
    tl.store(p_coef, row, mask=(m_h[None, :] & (o_t >= 0)[:, None])[:, :, None])
    if PDL:
        if (wait_primary != 0) & (pid == tl.num_programs(0) - 1):
            tl.extra.cuda.gdc_wait()
