"""Device helpers shared by the delta-rule stages (inlined into the kernels that call them).

The algebra of the stages is described in docs/kernels-chunk-delta.md: stage 1 (gates, resets),
the gate-free WY inverse of stage 2, the per-chunk scratch slot, and the varlen ranking of
sequences (longest first) that the prep writes for the sweep.
"""
from __future__ import annotations

import triton
import triton.language as tl

# Sequences one program ranks for the varlen sweep's order (_rank_sequences).
RANK_BLOCK = tl.constexpr(128)


@triton.constexpr_function
def _compact_queries(M, BT):
    """Whether a full chunk of BT expanded rows is BT // M whole tokens whose query rows the sweep
    can handle alone: M | BT, M > 1, and BT // M rows still make a tensor-core product (>= 16)."""
    M, BT = getattr(M, "value", M), getattr(BT, "value", BT)
    return M > 1 and BT % M == 0 and BT // M >= 16


@triton.jit
def _chunk_gates(g, tok, cp, m_r, i_hv, HV: tl.constexpr, M: tl.constexpr, BT: tl.constexpr,
                 HAS_G: tl.constexpr):
    """Stage 1 for one chunk of BT rows: (gc [BT], seg [BT] int32, bad [BT] bool). gc_i sums the
    finite log2 decays of rows <= i; seg_i counts the resets at rows <= i. Rows past the sequence
    end carry decay 1 (gc and seg flat), so the last row stands for the chunk end. ``bad``: the
    row's decay is NaN or +inf; it counts as 1 here, and the caller poisons the rows from it on."""
    return _gates_of(_chunk_decays(g, tok, m_r & (cp == 0), i_hv, HV, BT, HAS_G))


@triton.jit
def _chunk_decays(g, tok, m, i_hv, HV: tl.constexpr, BT: tl.constexpr, HAS_G: tl.constexpr):
    """The log2 decays ``[BT]`` of one value head on the rows ``m`` selects (0 elsewhere, and
    everywhere without g): :func:`_gates_of`'s input."""
    if HAS_G:
        return tl.load(g + tok * HV + i_hv, mask=m, other=0.0).to(tl.float32) * 1.4426950408889634
    else:
        return tl.zeros([BT], dtype=tl.float32)


@triton.jit
def _gates_of(b_g):
    """:func:`_chunk_gates` from the chunk's log2 decays ``b_g [BT]`` (0 on rows past the end)."""
    bad = (b_g != b_g) | (b_g == float("inf"))
    b_g = tl.where(bad, 0.0, b_g)
    reset = b_g < -150.0
    gc = tl.cumsum(tl.where(reset, 0.0, b_g), axis=0)
    seg = tl.cumsum(reset.to(tl.int32), axis=0)
    return gc, seg, bad


@triton.jit
def _gate_tile(gc, seg, causal, has_reset):
    """G [BT, BT]: G_ij = 2^(gc_i - gc_j) for j <= i in the same segment, else 0. gc is finite
    (resets and non-finite decays are kept out of the sum), so the exp2 is finite (or overflows
    with a growth past 2^128, which the sweep's replay catches), or inf where the select drops it:
    no mask inside the exp2; a chunk without a reset skips the segment comparison."""
    if has_reset:
        return tl.where(causal & (seg[:, None] == seg[None, :]), tl.exp2(gc[:, None] - gc[None, :]), 0.0)
    else:
        return tl.where(causal, tl.exp2(gc[:, None] - gc[None, :]), 0.0)


@triton.jit
def _diagonal_blocks(x, NB: tl.constexpr, S: tl.constexpr):
    """The NB diagonal S x S blocks of ``x [NB * S, NB * S]`` as a batch [NB, S, S]."""
    x4 = tl.reshape(x, [NB, S, NB, S])
    block_row = tl.arange(0, NB)[:, None, None, None]
    block_col = tl.arange(0, NB)[None, None, :, None]
    return tl.sum(tl.where(block_row == block_col, x4, 0.0), axis=2)


@triton.jit
def _block_diagonal(d, NB: tl.constexpr, S: tl.constexpr):
    """The [NB * S, NB * S] tile whose diagonal blocks are the batch ``d [NB, S, S]``, zero elsewhere."""
    block_row = tl.arange(0, NB)[:, None, None, None]
    block_col = tl.arange(0, NB)[None, None, :, None]
    return tl.reshape(tl.where(block_row == block_col, d[:, :, None, :], 0.0), [NB * S, NB * S])


@triton.jit
def _wy_inverse(b_T, b_A, o_t, FP16: tl.constexpr, PRECISION: tl.constexpr, SPLIT: tl.constexpr = 0):
    """Tinv = (I + A)^-1 for strictly lower A [BT, BT], from b_T = D_2 = I - A_1 (the inverses of
    the 2 x 2 diagonal blocks, exact). Recursive block doubling: with D_s the inverse of the s x s
    diagonal blocks, D_2s = D_s - D_s (A_s D_s), A_s the part of A inside the 2s-blocks but outside
    the s-blocks (the block formula [[Ta, 0], [-Tb A_ba Ta, Tb]], all blocks of a level at once):
    five levels for BT = 64, two products each, no reductions. ``o_t = arange(BT)``: entry (i, j)
    lies in A_s (s = 2^lvl) exactly when the highest bit where i and j differ is bit lvl, i.e.
    ``(i >> lvl) ^ (j >> lvl) == 1``. FP16: fp16 operands (tf32's 10-bit mantissa, a narrower range; float32
    accumulation), else float32 operands at PRECISION.

    SPLIT (16 or 32, with FP16; 0: off): the levels whose blocks reach SPLIT rows run on the
    BT / SPLIT diagonal SPLIT x SPLIT blocks taken out as a batch (small products on mma.sync, a
    warp a block, instead of [BT, BT] ones that are zero outside those blocks), the later levels
    on the whole tile; the same doubling, so the same result to the rounding of the sums."""
    FIRST: tl.constexpr = 4 if SPLIT == 16 else (5 if SPLIT == 32 else 1)  # the first level on the whole tile
    if SPLIT:
        NB: tl.constexpr = o_t.shape[0] // SPLIT
        i3 = tl.arange(0, SPLIT)[None, :, None]
        j3 = tl.arange(0, SPLIT)[None, None, :]
        A_blocks = _diagonal_blocks(b_A, NB, SPLIT).to(tl.float16)
        D = _diagonal_blocks(b_T, NB, SPLIT)
        for lvl in tl.static_range(1, FIRST):
            A_s = tl.where(((i3 >> lvl) ^ (j3 >> lvl)) == 1, A_blocks, 0.0)
            D = D - tl.dot(D.to(tl.float16), tl.dot(A_s, D.to(tl.float16)).to(tl.float16))
        b_T = _block_diagonal(D, NB, SPLIT)
    if FP16:
        b_A = b_A.to(tl.float16)
    for lvl in tl.static_range(FIRST, 6):
        # (i >> lvl) ^ (j >> lvl) == 1 from the row and column vectors: no [BT, BT] index tile
        # shared by the levels, so none stays live across them.
        b_As = tl.where(((o_t[:, None] >> lvl) ^ (o_t[None, :] >> lvl)) == 1, b_A, 0.0)
        if FP16:
            b_X = tl.dot(b_As, b_T.to(tl.float16))
            b_T = b_T - tl.dot(b_T.to(tl.float16), b_X.to(tl.float16))
        else:
            b_T = b_T - tl.dot(b_T, tl.dot(b_As, b_T, input_precision=PRECISION), input_precision=PRECISION)
    return b_T


@triton.jit
def _chunk_slot(bos, c, i_n, BT: tl.constexpr):
    """Slot of expanded chunk c of sequence i_n (its rows start at bos) in the per-chunk scratch
    (``coef``): ``(bos + c * BT) // BT + i_n``, distinct for every chunk of every sequence (the
    + i_n separates two sequences whose chunks start in the same 64-row block) and
    < T*M // BT + N."""
    return (bos + c * BT) // BT + i_n


@triton.jit
def _rank_sequences(cu_seqlens, order, N, i_block, BLOCK: tl.constexpr, BLOCK_J: tl.constexpr):
    """Sequences ``i_block * BLOCK + [0, BLOCK)`` ranked among all N by length, longest first, ties
    in index order, and scattered to ``order[rank]``: over all blocks, ``order`` is a stable
    descending argsort of ``cu_seqlens[1:] - cu_seqlens[:-1]``. BLOCK x N comparisons, BLOCK_J
    columns at a time (few registers: it runs inside the prep kernel)."""
    i = i_block * BLOCK + tl.arange(0, BLOCK)
    m_i = i < N
    len_i = tl.load(cu_seqlens + i + 1, mask=m_i, other=0) - tl.load(cu_seqlens + i, mask=m_i, other=0)
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    for j0 in range(0, N, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        m_j = j < N
        len_j = tl.load(cu_seqlens + j + 1, mask=m_j, other=0) - tl.load(cu_seqlens + j, mask=m_j, other=0)
        ahead = (len_j[None, :] > len_i[:, None]) | ((len_j[None, :] == len_i[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((ahead & m_j[None, :]).to(tl.int32), axis=1)
    tl.store(order + rank, i, mask=m_i)


@triton.jit
def _prep_chunk(cu_seqlens, chunk_indices, sequence_order, i_c, rank_here, T, n_seq, chunk_lo, chunk_span,
                M: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr, CHUNK_MAJOR: tl.constexpr = False):
    """(valid, i_n, i_t, bos, eos) of a prep program's chunk i_c: its sequence i_n, its chunk i_t
    within it and the sequence's rows [bos, eos) of the expanded stream; valid is False for a
    padding descriptor row or a chunk past its sequence's end (the program then writes nothing).
    Varlen: ``chunk_indices [NT_pad, 2]`` holds (sequence, chunk); the sequence's bounds are
    clamped to [0, T], so that a wrong descriptor writes nothing outside; where ``rank_here``, the
    programs of the first ceil(n_seq / RANK_BLOCK) chunks write the sweep's order of sequences,
    longest first (:func:`_rank_sequences`). Dense: chunk ``chunk_lo + i_c % chunk_span`` of
    sequence ``i_c // chunk_span`` (all chunks, or a phase's range); CHUNK_MAJOR: chunk ``chunk_lo +
    i_c // n_seq`` of sequence ``i_c % n_seq``, every sequence's chunk c before any chunk c + 1 (the
    order in which the chained schedule's sweeps, one per sequence, read them)."""
    if IS_VARLEN:
        if rank_here & (i_c * RANK_BLOCK < n_seq):
            _rank_sequences(cu_seqlens, sequence_order, n_seq, i_c, RANK_BLOCK, 16)
        i_n = tl.load(chunk_indices + i_c * 2).to(tl.int64)
        i_t = tl.load(chunk_indices + i_c * 2 + 1).to(tl.int64)
        valid = (i_n >= 0) & (i_n < n_seq)
        bos = i_n * 0
        eos = bos
        if valid:
            bos_t, eos_t = _sequence(cu_seqlens, i_n, T, True)
            bos = bos_t * M
            eos = eos_t * M
            valid = (i_t >= 0) & (i_t * BT < eos - bos)
    else:
        if CHUNK_MAJOR:
            i_n = i_c % n_seq
            i_t = chunk_lo + i_c // n_seq
        else:
            i_n = i_c // chunk_span
            i_t = chunk_lo + i_c % chunk_span
        bos = i_n * T * M
        eos = bos + T * M
        valid = True
    return valid, i_n, i_t, bos, eos


@triton.jit
def _sequence(cu_seqlens, i_n, T, IS_VARLEN: tl.constexpr):
    """(bos, length) of sequence i_n, clamped to [0, T]."""
    if IS_VARLEN:
        bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n).to(tl.int64), 0), T)
        eos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n + 1).to(tl.int64), bos), T)
    else:
        bos = i_n * T
        eos = bos + T
    return bos, eos


@triton.jit
def _chunk_head(H: tl.constexpr, HV: tl.constexpr):
    """(i_c, i_hv, i_h) of a program of a (chunk, value head) grid: its chunk, its value head and
    the q/k head that value head reads."""
    pid = tl.program_id(0).to(tl.int64)
    i_hv = pid % HV
    return pid // HV, i_hv, i_hv // (HV // H)


@triton.jit
def _chunk_tiles(r0, eos, BT: tl.constexpr, BK: tl.constexpr, K: tl.constexpr):
    """(o_t, o_k, m_k, rows, m_r, m_rk): a chunk's row and key offsets and masks, its first row r0
    and its sequence ending at row eos."""
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    rows = r0 + o_t.to(tl.int64)
    m_r = rows < eos
    return o_t, o_k, m_k, rows, m_r, m_r[:, None] & m_k[None, :]


@triton.jit
def _chunk_rows(cu_seqlens, chunk_indices, chunk_offsets, i_c, T, n_seq, BT: tl.constexpr, IS_VARLEN: tl.constexpr,
                M: tl.constexpr):
    """(valid, bos, eos, r0, cs) of parallel-stage chunk i_c: its sequence's rows [bos, eos) of the
    expanded stream, its first row r0 and its chunk-state row cs; valid is False for a padding
    chunk (which does nothing)."""
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_c * 2).to(tl.int64)
        i_t = tl.load(chunk_indices + i_c * 2 + 1).to(tl.int64)
        n_ok = (i_n >= 0) & (i_n < n_seq)
        i_n = tl.where(n_ok, i_n, 0)
        bos, eos = _sequence(cu_seqlens, i_n, T, True)
        bos, eos = bos * M, eos * M
        valid = n_ok & (i_t >= 0) & (i_t * BT < eos - bos)
        cs = tl.load(chunk_offsets + i_n).to(tl.int64) + i_t
    else:
        NTd = (T * M + BT - 1) // BT
        i_n = i_c // NTd
        i_t = i_c % NTd
        bos = i_n * T * M
        eos = bos + T * M
        valid = i_c >= 0
        cs = i_c
    return valid, bos, eos, bos + i_t * BT, cs
