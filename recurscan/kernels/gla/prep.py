"""The prep of gated linear attention with a decay per key dimension (fla's chunk_gla), parallel
over (chunk, value head): everything of a chunk that does not need the state entering it, so the
sweep (the delta sweep's KEY_DECAY, or kernels/gla/forward.py with PER_KEY) carries only the
state's chain.

Per chunk of BT rows and key k, with gl[i, k] the sum of the finite log2 decays of rows <= i and
seg[i, k] the count of resets (decay exactly 0) at rows <= i (rows past the end: decay 1):

    qg[i]  = scale q_i o [seg_i = 0] 2^gl_i                         (the query, decayed from the chunk start)
    kg[j]  = k_j o [seg_j = seg_last] 2^(gl_last - gl_j)            (the key, decayed to the chunk end)
    dl     = [seg_last = 0] 2^gl_last                                (the state's decay over the chunk)
    A[i, j] = scale sum_k q_ik k_jk [seg_ik = seg_jk] 2^(gl_ik - gl_jk),  j <= i

Every factor is at most 1 for decays <= 1. A is formed in blocks of 16 rows: between blocks
through the factor split at the row before the query's block (both factors <= 1), as fla's
secondary chunking; within a block through the split at the block's start where the decays of
the keys in hand are calm in the chunk (no reset, every factor within 2^+-CALM), else pair by pair (no split whose
factors could overflow). Each exponent is summed over the rows it spans (within a block, or from
the blocks' totals), never taken as the difference of two long prefix sums, whose rounding would
swamp a normal decay after a run of strong ones. A chunk whose decays are calm throughout (the
common case: GLA's gates are logsigmoid / 16) takes none of that: its prefix sums over the chunk
stay within +-CALM, and the calm pass (:func:`_calm_chunk`) forms it in a few whole-chunk steps.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..delta.common import RANK_BLOCK, _chunk_head, _chunk_rows, _chunk_slot, _chunk_tiles, _rank_sequences
from .common import _ssd_steps

#: Rows of the blocks A is formed in.
SUB = tl.constexpr(16)
#: The largest prefix sum of log2 decays (from a chunk's start in the calm pass, from a block's
#: start for the general steps' diagonal blocks) at which A is one product split at that start:
#: its factors stay within 2^+-CALM, and an exponent a pair sees, the difference of two such sums,
#: is off by at most float32's spacing at CALM (2^-18).
CALM = tl.constexpr(32.0)


@triton.jit
def _log2_decays(g, dt, A, dt_bias, r, m_r, i_hv, o_k, m_k, dt_min, dt_max, HV: tl.constexpr, K: tl.constexpr,
                 BK: tl.constexpr, HAS_G: tl.constexpr, SCALAR: tl.constexpr, SSD: tl.constexpr,
                 HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr, DT_LIMIT: tl.constexpr):
    """The log2 decays of rows ``r`` ([len(r), BK]; 0 where not ``m_r``): per key from g
    ``[B, T, HV, K]``; SCALAR: one a head from g ``[B, T, HV]`` (none without g); SSD: dt A from the
    raw step sizes, plus g ``[B * T]`` where given (seq_idx's resets)."""
    if SSD:
        b_dt = _ssd_steps(dt, dt_bias, r, m_r, i_hv, HV, dt_min, dt_max, HAS_DT_BIAS, DT_SOFTPLUS, DT_LIMIT)
        gv = tl.load(A + i_hv).to(tl.float32) * b_dt
        if HAS_G:
            gv += tl.load(g + r, mask=m_r, other=0.0).to(tl.float32)
        gv = tl.where(m_r, gv, 0.0)
        return (gv * 1.4426950408889634)[:, None] + tl.zeros([BK], dtype=tl.float32)[None, :]
    elif SCALAR:
        if HAS_G:
            gv = tl.load(g + r * HV + i_hv, mask=m_r, other=0.0).to(tl.float32)
        else:
            gv = tl.zeros(r.shape, dtype=tl.float32)
        return (gv * 1.4426950408889634)[:, None] + tl.zeros([BK], dtype=tl.float32)[None, :]
    else:
        return tl.load(g + (r * HV + i_hv)[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :],
                       other=0.0).to(tl.float32) * 1.4426950408889634


@triton.jit
def _key_gates(b_g, o_t, BT: tl.constexpr, BK: tl.constexpr):
    """A chunk's gates per key from its log2 decays ``b_g [BT, BK]``: a bad decay (NaN, +inf)
    counts as 1 (``bad_g [BT]`` marks its row), a reset (decay exactly 0) starts a segment
    (``seg``, the resets at rows <= i; ``seg_last`` the last row's). Exponents, each a sum of the
    decays it spans, within a block of SUB rows or from the blocks' totals (never the difference
    of two long prefix sums, which loses the bits of a normal decay after a run of strong ones):
    ``bl`` (rows of the row's block up to it), ``bs`` (rows of its block after it), ``before`` /
    ``after`` (the blocks before / after the row's), ``gl_last`` (the whole chunk). Returns
    ``(bad_g, b_g with bad decays and resets as 0, seg, seg_last, bl, bs, before, after, gl_last)``."""
    bad_gk = (b_g != b_g) | (b_g == float("inf"))
    bad_g = tl.max(bad_gk.to(tl.int32), axis=1) != 0
    b_g = tl.where(bad_gk, 0.0, b_g)
    reset = b_g < -150.0
    b_g = tl.where(reset, 0.0, b_g)
    seg = tl.cumsum(reset.to(tl.int32), axis=0)
    last = o_t[:, None] == BT - 1
    seg_last = tl.sum(tl.where(last, seg, 0), axis=0)
    NB: tl.constexpr = BT // SUB
    blk = o_t // SUB
    g3 = tl.reshape(b_g, (NB, SUB, BK))
    bl = tl.reshape(tl.cumsum(g3, axis=1), (BT, BK))  # within the row's block, rows <= i
    bs = tl.reshape(tl.cumsum(g3, axis=1, reverse=True), (BT, BK)) - b_g  # within the block, rows > j
    end = o_t[:, None] % SUB == SUB - 1
    before = tl.zeros([BT, BK], dtype=tl.float32)  # the blocks before the row's
    after = tl.zeros([BT, BK], dtype=tl.float32)  # the blocks after the row's
    for m in tl.static_range(0, NB):
        tot = tl.sum(tl.where(end & (blk == m)[:, None], bl, 0.0), axis=0)
        before += tl.where((blk > m)[:, None], tot[None, :], 0.0)
        after += tl.where((blk < m)[:, None], tot[None, :], 0.0)
    gl_last = tl.sum(tl.where(last, before + bl, 0.0), axis=0)
    return bad_g, b_g, seg, seg_last, bl, bs, before, after, gl_last


@triton.jit
def _key_block(q, k, g, dt, A, dt_bias, rows, m_r, i_h, i_hv, o_k, dt_min, dt_max, H: tl.constexpr,
               HV: tl.constexpr, K: tl.constexpr, KB: tl.constexpr, HAS_G: tl.constexpr, SCALAR: tl.constexpr,
               SSD: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr, DT_LIMIT: tl.constexpr):
    """A chunk's keys ``o_k`` (KB of them): their mask, the rows' q and k (float32) and log2 decays
    ``[len(rows), KB]``, and the offsets of qg / kg's elements."""
    m_k = o_k < K
    m_rk = m_r[:, None] & m_k[None, :]
    p_qk = (rows * H + i_h)[:, None] * K + o_k[None, :]
    b_q = tl.load(q + p_qk, mask=m_rk, other=0.0).to(tl.float32)
    b_k = tl.load(k + p_qk, mask=m_rk, other=0.0).to(tl.float32)
    b_g = _log2_decays(g, dt, A, dt_bias, rows, m_r, i_hv, o_k, m_k, dt_min, dt_max, HV, K, KB, HAS_G, SCALAR, SSD,
                       HAS_DT_BIAS, DT_SOFTPLUS, DT_LIMIT)
    return m_k, m_rk, (rows * HV + i_hv)[:, None] * K + o_k[None, :], b_q, b_k, b_g


@triton.jit
def _calm_chunk(q, k, g, qg, kg, aqk, dl, coef, dt, A, dt_bias, r0, eos, cs, cs_ok, i_h, i_hv, scale, dt_min, dt_max,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                KB: tl.constexpr, DT: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_G: tl.constexpr,
                SCALAR: tl.constexpr, SSD: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
                DT_LIMIT: tl.constexpr, FOR_SWEEP: tl.constexpr):
    """The chunk's prep in a few whole-chunk steps, KB keys a step, where its decays are calm, and
    whether they are (every input finite, no reset, and each prefix sum G of the log2 decays
    within +-CALM):

        qg = scale q o 2^G,   kg = k o 2^(G_last - G),   dl = 2^G_last,
        A  = scale (q o 2^G)(k o 2^-G)^T, j <= i,

    every factor within 2^+-CALM and every exponent, a prefix sum or a difference of two, off by
    at most float32's spacing at CALM; no bad row (coef's lam rq 1 throughout). Where they are not, what was
    written is for the general steps of :func:`chunk_gla_prep_kernel` to overwrite."""
    o_t, o_kb, _, rows, m_r, _ = _chunk_tiles(r0, eos, BT, KB, K)
    wild = tl.zeros([BT], dtype=tl.int32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for kb in range(0, BK // KB):
        o_k = kb * KB + o_kb
        m_k, m_rk, p_vk, b_q, b_k, b_g = _key_block(q, k, g, dt, A, dt_bias, rows, m_r, i_h, i_hv, o_k, dt_min, dt_max,
                                                    H, HV, K, KB, HAS_G, SCALAR, SSD, HAS_DT_BIAS, DT_SOFTPLUS,
                                                    DT_LIMIT)
        b_G = tl.cumsum(b_g, axis=0)
        # a NaN fails every comparison: finite q and k have q * 0 == 0, a finite calm G |G| <= CALM
        bad = (b_q * 0.0 != 0.0) | (b_k * 0.0 != 0.0) | ~(tl.abs(b_G) <= CALM) | (b_g < -150.0)
        wild |= tl.max(bad.to(tl.int32), axis=1)
        g_last = tl.sum(b_g, axis=0)
        b_qd = b_q * tl.exp2(b_G)
        tl.store(qg + p_vk, (scale * b_qd).to(qg.dtype.element_ty), mask=m_rk)
        tl.store(kg + p_vk, (b_k * tl.exp2(g_last[None, :] - b_G)).to(kg.dtype.element_ty), mask=m_rk)
        tl.store(dl + (cs * HV + i_hv) * K + o_k, tl.exp2(g_last), mask=m_k & cs_ok)
        b_A += tl.dot(b_qd.to(DT), tl.trans((b_k * tl.exp2(-b_G)).to(DT)), input_precision=DOT_PRECISION)
    if FOR_SWEEP:
        tl.store(coef + ((cs * HV + i_hv) * BT + o_t) * 4 + 1, tl.full([BT], 1.0, tl.float32), mask=m_r)
    b_A = tl.where(o_t[None, :] <= o_t[:, None], scale * b_A, 0.0)
    tl.store(aqk + (rows * HV + i_hv)[:, None] * BT + o_t[None, :], b_A.to(aqk.dtype.element_ty), mask=m_r[:, None])
    return tl.max(wild, axis=0) == 0


@triton.jit(do_not_specialize=["T", "n_seq", "n_cs_rows"])
def chunk_gla_prep_kernel(
    q, k, g, qg, kg, aqk, dl, cu_seqlens, chunk_indices, chunk_offsets, dt, A, dt_bias, T, n_seq, scale, n_cs_rows,
    dt_min, dt_max, coef, sequence_order,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    IS_VARLEN: tl.constexpr, DT: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_G: tl.constexpr = True,
    SCALAR: tl.constexpr = False, SSD: tl.constexpr = False, HAS_DT_BIAS: tl.constexpr = False,
    DT_SOFTPLUS: tl.constexpr = False, DT_LIMIT: tl.constexpr = False, FOR_SWEEP: tl.constexpr = False,
    BKB: tl.constexpr = 0, calm_flags=None, CALM_PASS: tl.constexpr = 0,
):
    """Grid (chunks x HV,): one program per (chunk, value head). Writes ``qg``, ``kg`` ``[B, T, HV,
    K]`` (as formulas above), ``aqk [B, T, HV, BT]`` (A, row i: query i) and ``dl [n_cs_rows, HV, K]``
    (float32, at the chunk-state row: ``chunk_offsets[n] + c``, dense ``n * ceil(T / BT) + c``).

    Non-finite input, as the token loop has it: a row whose k or decay (one key's) is NaN or +inf
    takes part in no product (its decay counts as 1) and its ``kg`` row is NaN, the sweep's mark to
    poison the outputs from it on and the state; a row whose q is NaN or inf takes part in no
    product and its ``qg`` row is NaN (its own output alone is poisoned).

    SCALAR / SSD (the split launch of a scalar decay, plan/gla.py): the decays are one a head and
    token, as :func:`_log2_decays` reads them, the same for every key.

    FOR_SWEEP (the delta sweep's KEY_DECAY form, kernels/delta/sweep.py): the chunk's slot is
    the delta prep's (:func:`_chunk_slot`, ``dl [slots, HV, K]``), a bad row is marked as the delta
    prep marks it: its ``kg`` row is zero, ``coef[slot, hv, i, 1]`` (the sweep's lam rq) is 1
    before the first bad row and NaN from it on, and ``dl`` is NaN after one; ``aqk`` in its
    buffer's dtype; and varlen programs (c, 0) with c < ceil(n_seq / RANK_BLOCK) write the
    sweep's order of sequences (``sequence_order``, longest first) as the delta prep does.

    BKB: the keys a step of the loop over key blocks takes (a power of two dividing BK; 0: all of
    BK at once). Everything but A is per key; A sums the blocks' parts, and which rows are bad is
    read over every key first. Smaller blocks hold smaller tiles: more programs share an SM.

    CALM_PASS (two launches over the same grid; 0: one launch does every chunk): 1 writes every
    chunk as if its decays were calm (:func:`_calm_chunk`, a few whole-chunk steps, small enough
    that several programs share an SM) and ``calm_flags [chunks * HV]`` (int8, 1 where they are);
    2 writes the others again by the steps below and leaves the calm ones."""
    i_c, i_hv, i_h = _chunk_head(H, HV)
    if FOR_SWEEP and IS_VARLEN and CALM_PASS != 2:
        if (i_hv == 0) & (i_c * RANK_BLOCK < n_seq):
            _rank_sequences(cu_seqlens, sequence_order, n_seq, i_c, RANK_BLOCK, 16)
    valid, bos, eos, r0, cs = _chunk_rows(cu_seqlens, chunk_indices, chunk_offsets, i_c, T, n_seq, BT, IS_VARLEN, 1)
    if not valid:
        return
    if FOR_SWEEP:  # the delta sweep's slot of this chunk
        if IS_VARLEN:
            i_n = tl.load(chunk_indices + i_c * 2).to(tl.int64)
        else:
            i_n = i_c // tl.cdiv(T, BT)
        cs = _chunk_slot(r0, 0, i_n, BT)
    KB: tl.constexpr = BK if BKB == 0 else BKB
    if CALM_PASS == 1:
        calm = _calm_chunk(q, k, g, qg, kg, aqk, dl, coef, dt, A, dt_bias, r0, eos, cs, (cs >= 0) & (cs < n_cs_rows),
                           i_h, i_hv, scale, dt_min, dt_max, H, HV, K, BT, BK, KB, DT,
                           DOT_PRECISION, HAS_G, SCALAR, SSD, HAS_DT_BIAS, DT_SOFTPLUS, DT_LIMIT, FOR_SWEEP)
        tl.store(calm_flags + i_c * HV + i_hv, calm.to(tl.int8))
        return
    if CALM_PASS == 2:
        if tl.load(calm_flags + i_c * HV + i_hv) != 0:
            return
    o_t, o_kb, _, rows, m_r, _ = _chunk_tiles(r0, eos, BT, KB, K)
    NKB: tl.constexpr = BK // KB
    # 0. Rows whose input is bad in any key: a bad decay counts as 1 and marks its row, a bad k or
    #    q keeps its row out of every product (the key blocks below each see a part of the row).
    bad_g = o_t < 0
    bad_kq = o_t < 0
    bad_q = o_t < 0
    for kb in range(0, NKB):
        o_k = kb * KB + o_kb
        _mk, _mrk, _pvk, b_q, b_k, b_g = _key_block(q, k, g, dt, A, dt_bias, rows, m_r, i_h, i_hv, o_k, dt_min, dt_max,
                                                    H, HV, K, KB, HAS_G, SCALAR, SSD, HAS_DT_BIAS, DT_SOFTPLUS,
                                                    DT_LIMIT)
        bad_g |= tl.max(((b_g != b_g) | (b_g == float("inf"))).to(tl.int32), axis=1) != 0
        bad_kq |= tl.max((b_k * 0.0 != 0.0).to(tl.int32), axis=1) != 0
        bad_q |= tl.max((b_q * 0.0 != 0.0).to(tl.int32), axis=1) != 0
    bad_k = bad_g | bad_kq
    first_bad = tl.min(tl.where(bad_k, o_t, BT), axis=0)
    NB: tl.constexpr = BT // SUB
    blk = o_t // SUB
    end = o_t[:, None] % SUB == SUB - 1
    cs_ok = (cs >= 0) & (cs < n_cs_rows)
    if FOR_SWEEP:  # bad rows as the delta prep marks them (their kg rows are 0 below)
        tl.store(coef + ((cs * HV + i_hv) * BT + o_t) * 4 + 1, tl.where(o_t < first_bad, 1.0, float("nan")),
                 mask=m_r)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for kb in range(0, NKB):  # A is a sum over keys: each block of KB keys adds its part
        o_k = kb * KB + o_kb
        m_k, m_rk, p_vk, b_q, b_k, b_g = _key_block(q, k, g, dt, A, dt_bias, rows, m_r, i_h, i_hv, o_k, dt_min, dt_max,
                                                    H, HV, K, KB, HAS_G, SCALAR, SSD, HAS_DT_BIAS, DT_SOFTPLUS,
                                                    DT_LIMIT)
        # 1. Gates per key: bad decays count as 1, resets start a segment. Every exponent below
        #    is a sum of the decays it spans, taken within a block of SUB rows or from the blocks'
        #    totals, never a difference of two long prefix sums (which loses the bits of a normal
        #    decay after a run of strong ones).
        _bad_here, b_g, seg, seg_last, bl, bs, before, after, gl_last = _key_gates(b_g, o_t, BT, KB)
        b_q = tl.where((bad_q | bad_k)[:, None], 0.0, b_q)
        b_k = tl.where(bad_k[:, None], 0.0, b_k)
        # 2. The decayed query and key, and the chunk's decay.
        b_qg = scale * b_q * tl.where(seg == 0, tl.exp2(before + bl), 0.0)
        to_end = seg == seg_last[None, :]
        b_kg = b_k * tl.where(to_end, tl.exp2(tl.where(to_end, bs + after, 0.0)), 0.0)
        tl.store(qg + p_vk, tl.where(bad_q[:, None], float("nan"), b_qg).to(qg.dtype.element_ty), mask=m_rk)
        b_dl = tl.where(seg_last == 0, tl.exp2(gl_last), 0.0)
        if FOR_SWEEP:
            tl.store(kg + p_vk, b_kg.to(kg.dtype.element_ty), mask=m_rk)
            b_dl = tl.where(first_bad < BT, float("nan"), b_dl)
        else:
            tl.store(kg + p_vk, tl.where(bad_k[:, None], float("nan"), b_kg).to(kg.dtype.element_ty), mask=m_rk)
        tl.store(dl + (cs * HV + i_hv) * K + o_k, b_dl, mask=m_k & cs_ok)
        # 3. A between blocks: for the queries of block b, the keys of the blocks before it, split
        #    at the end of block b - 1 (both factors <= 1): the query's decay since its block
        #    began, the key's until block b begins.
        for b in tl.static_range(1, NB):
            at = o_t[:, None] == b * SUB - 1
            sref = tl.sum(tl.where(at, seg, 0), axis=0)
            mid = tl.zeros([BT, KB], dtype=tl.float32)  # the blocks between the key's and b
            for m in tl.static_range(1, b):
                tot = tl.sum(tl.where(end & (blk == m)[:, None], bl, 0.0), axis=0)
                mid += tl.where((blk < m)[:, None], tot[None, :], 0.0)
            in_b = (blk == b)[:, None] & (seg == sref[None, :])
            earlier = (blk < b)[:, None] & (seg == sref[None, :])
            b_qs = tl.where(in_b, b_q * tl.exp2(tl.where(in_b, bl, 0.0)), 0.0)
            b_ks = tl.where(earlier, b_k * tl.exp2(tl.where(earlier, bs + mid, 0.0)), 0.0)
            b_A += tl.dot(b_qs.to(DT), tl.trans(b_ks.to(DT)), input_precision=DOT_PRECISION)
        # 4. A within each block. Where these keys' decays
        #    are calm in this chunk (no reset, and no row's decay since its block began beyond
        #    2^-CALM), as one product split at each block's start: q_i 2^bl_i and k_j 2^-bl_j, both
        #    within 2^+-CALM, bl_i - bl_j the decays of rows j+1..i summed over at most SUB rows.
        #    Elsewhere pair by pair: row i with column j = its block's row jj, jj from the block's
        #    end down, so that the exponent (the decays of rows j+1..i) and whether a reset lies
        #    among them grow by one gathered row a step; k_j is gathered from memory (a row of a
        #    register tile cannot be indexed).
        calm = (tl.max(tl.max(tl.abs(bl), axis=1), axis=0) <= CALM) & (tl.max(seg_last, axis=0) == 0)
        if calm:
            b_qd = b_q * tl.exp2(bl)
            b_kd = b_k * tl.exp2(-bl)
            same = (blk[:, None] == blk[None, :]) & (o_t[None, :] <= o_t[:, None])
            b_A += tl.where(same, tl.dot(b_qd.to(DT), tl.trans(b_kd.to(DT)), input_precision=DOT_PRECISION), 0.0)
        else:
            span = tl.zeros([BT, KB], dtype=tl.float32)
            cut = tl.zeros([BT, KB], dtype=tl.int32)
            for t in range(0, SUB):
                jj = SUB - 1 - t
                col = blk * SUB + jj  # [BT]: row i's column in its block
                m_n = (o_t % SUB >= jj + 1) & (r0 + col + 1 < eos)  # rows whose span now includes row j + 1
                m_nk = m_n[:, None] & m_k[None, :]
                g_n = _log2_decays(g, dt, A, dt_bias, r0 + col + 1, m_n, i_hv, o_k, m_k, dt_min, dt_max, HV, K, KB,
                                   HAS_G, SCALAR, SSD, HAS_DT_BIAS, DT_SOFTPLUS, DT_LIMIT)
                g_n = tl.where((g_n != g_n) | (g_n == float("inf")), 0.0, g_n)
                cut = cut | (m_nk & (g_n < -150.0)).to(tl.int32)
                span += tl.where(m_nk & (g_n >= -150.0), g_n, 0.0)
                m_j = (o_t % SUB >= jj) & (r0 + col < eos)
                m_jk = m_j[:, None] & m_k[None, :]
                p_j = (r0 + col)[:, None]
                k_j = tl.load(k + (p_j * H + i_h) * K + o_k[None, :], mask=m_jk, other=0.0).to(tl.float32)
                bad_j = tl.max(tl.where(o_t[None, :] == col[:, None], bad_k.to(tl.int32)[None, :], 0), axis=1) != 0
                pair = m_jk & ~bad_j[:, None] & (cut == 0)
                term = tl.where(pair, b_q * k_j * tl.exp2(tl.where(pair, span, 0.0)), 0.0)
                b_A += tl.where(o_t[None, :] == col[:, None], tl.sum(term, axis=1)[:, None], 0.0)
    tl.store(aqk + (rows * HV + i_hv)[:, None] * BT + o_t[None, :], (scale * b_A).to(aqk.dtype.element_ty),
             mask=m_r[:, None])
