"""Triton kernels: chunked prefill of the delta-rule family (Gated DeltaNet, Gated Delta Product).

GDN is GDP with one Householder copy (M = 1), so one set of kernels serves both; M is a constexpr.
The algebra is the oracle's (``reference/delta.py::gdn_chunk``), rearranged so that only two
launches run (prep, sweep; more for segments or phases) and only the outputs (and the states asked
for) go back to memory.

Seed 003's four stages, and where each runs
-------------------------------------------
1. Log decays interleaved across the Householder copies (decay on each token's first copy), then
   the within-chunk cumulative sum, in base 2 (``_chunk_gates``, in the prep kernel). A log2 decay
   below -150 (``-inf`` included) is a *reset* (its decay is 0 in float32): positions are given
   segment ids (a cumulative sum of reset flags) and two positions in different segments get decay
   exactly 0, so ``-inf - -inf`` never appears. The prep stores, per row, the decays the sweep needs
   times the row's norm factors (``coef``), so the sweep's chunk loop runs no scan and no exp2.
2. The WY representation. :func:`chunk_delta_prep_kernel`, fully parallel over (chunk, value head),
   computes the *gate-free* inverse ``Tinv = (I + strictLower(diag(beta) K K^T))^-1`` per chunk
   (recursive block doubling on the tensor cores, :func:`_wy_inverse`). The gate is applied
   elementwise and exactly: ``(I + diag(beta) (G o L))^-1 = G o Tinv`` with
   ``G_ij = 2^(gc_i - gc_j)`` (a diagonal similarity ``D Tinv D^-1``); across a reset both sides
   are block diagonal and ``G`` is 0 there. It stores ``wy = (G o Tinv) diag(beta)`` and
   ``aqk = G o (scale Q K^T)`` in the input dtype, so w and u are never materialised: the sweep
   forms ``u - w S = wy X``.
3. and 4. The inter-chunk state sweep and the outputs: :func:`chunk_delta_sweep_kernel`, one
   program per (sequence, value head, block of BV value columns), holds its ``[K, BV]`` float32
   state on chip across all chunks of its sequence (state columns are independent, so the value
   split is exact). Per chunk of 64 expanded rows::

       X     = diag(beta) (V - lam o (K S))                 lam_i: decay from chunk start to row i
       U     = (G o Tinv) X                                 the chunk's writes (fla's v_new)
       O     = lam o (Q S) + (G o scale Q K^T) U            rows of the token stream only
       S    <- lam_last S + K^T (gam o U)                   gam_j: decay from row j to chunk end

   and it writes the chunk-boundary states (token-stream chunk c starts at expanded chunk c*M),
   the output rows, and the final state (into the cache slot, or a dense final-state tensor).

The two chunkings of seed 003: k, v, beta and the WY blocks live on the expanded stream
(``ceil(L*M/64)`` chunks per sequence); q, g and o on the token stream. The kernels walk the
expanded stream and map row ``e`` to token ``e // M`` and copy ``e % M``: the decay is read on
copy 0, the query on copy M-1 (where the output is written); other rows get 0. Token chunk c is
expanded chunk c*M, so chunk states are the state entering every M-th expanded chunk.

Conventions: inputs ``[B, T, heads, dim]`` contiguous (varlen: B = 1 and cu_seqlens); value head
hv reads q/k head ``hv // (HV // H)``; states ``[N, HV, K, V]``; every offset that multiplies a
row or a slot is int64.

Running on CPU tensors (CI)
---------------------------
Set ``TRITON_INTERPRET=1`` in the environment *before* triton is first imported, then call the
public op with ``backend="triton"`` on CPU tensors (or call :func:`chunk_delta_fwd` directly)::

    TRITON_INTERPRET=1 python -c "import torch, recurscan; ...
        recurscan.chunk_gated_delta_rule(q, k, v, g, beta, backend='triton')"

Without ``backend="triton"``, CPU tensors keep running the PyTorch oracle; CUDA tensors take the
Triton path whenever the planner has a row for the problem (``recurscan/plan.py``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._launch import CallArg, DirectLaunch, compile_together, jit_launch

CHUNK = 64  # BT: rows of the expanded stream per chunk (the WY blocks are 64 x 64)
LOG2E = 1.4426950408889634
# A base-2 log decay below this is 0 in float32 (2^-150 < the smallest subnormal): an exact reset.
RESET_LOG2 = -150.0
# Sequences one program ranks for the varlen sweep's order (_rank_sequences).
RANK_BLOCK = tl.constexpr(128)

# Tests set this (or RECURSCAN_POISON_BUFFERS=1) so that every buffer the op allocates with
# torch.empty starts as NaN: an element the kernels forget to write then shows up.
POISON_BUFFERS = os.environ.get("RECURSCAN_POISON_BUFFERS", "0") == "1"
# Triton's interpreter (CPU tensors).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _empty(*shape, dtype, device):
    if POISON_BUFFERS:  # NaN, or -1 for integer buffers (an index no kernel may use)
        poison = float("nan") if dtype.is_floating_point else -1
        return torch.full(shape, poison, dtype=dtype, device=device)
    return torch.empty(*shape, dtype=dtype, device=device)


# ----------------------------------------------------------------------------------------------
# Helpers (inlined)
# ----------------------------------------------------------------------------------------------


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
    if HAS_G:
        b_g = tl.load(g + tok * HV + i_hv, mask=m_r & (cp == 0), other=0.0).to(tl.float32) * 1.4426950408889634
    else:
        b_g = tl.zeros([BT], dtype=tl.float32)
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
def _wy_inverse(b_T, b_A, o_t, FP16: tl.constexpr, PRECISION: tl.constexpr):
    """Tinv = (I + A)^-1 for strictly lower A [BT, BT], from b_T = D_2 = I - A_1 (the inverses of
    the 2 x 2 diagonal blocks, exact). Recursive block doubling: with D_s the inverse of the s x s
    diagonal blocks, D_2s = D_s - D_s (A_s D_s), A_s the part of A inside the 2s-blocks but outside
    the s-blocks (the block formula [[Ta, 0], [-Tb A_ba Ta, Tb]], all blocks of a level at once):
    five levels for BT = 64, two products each, no reductions. ``o_t = arange(BT)``: entry (i, j)
    lies in A_s (s = 2^lvl) exactly when the highest bit where i and j differ is bit lvl, i.e.
    ``(i >> lvl) ^ (j >> lvl) == 1``. FP16: fp16 operands (tf32's 10-bit mantissa, a narrower range; float32
    accumulation), else float32 operands at PRECISION."""
    if FP16:
        b_A = b_A.to(tl.float16)
    for lvl in tl.static_range(1, 6):
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


# ----------------------------------------------------------------------------------------------
# Stages 1 and 2: gates, the gate-free WY inverse, gated and stored; parallel over chunks
# ----------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["n_seq", "chunk_lo", "chunk_span", "wait_primary"])
def chunk_delta_prep_kernel(
    q, k, g, beta, wy, aqk, coef, cu_seqlens, chunk_indices, sequence_order,
    scale, T, n_seq, chunk_lo, chunk_span, wait_primary,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr,
    USE_L2NORM: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_G: tl.constexpr,
    INV_PRECISION: tl.constexpr, DT: tl.constexpr, INV_FP16: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """Grid (chunks of the expanded stream x HV,), chunk-major: program -> (chunk pid // HV, value
    head pid % HV), so that the value heads of a GVA group, which share their q/k tiles, run side by
    side. For the program's chunk and value head, writes
    (rows of the expanded stream, BT = 64 columns within the chunk, zeros above the diagonal):

    - ``wy[rows, hv, :]  = (G o Tinv) diag(beta)``, ``Tinv = (I + strictLower(diag(beta) K K^T))^-1``
      computed gate-free, so ``U = wy X`` solves the chunk's gated triangular system;
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
    operands, same mantissa as tf32, half the operand bytes and twice the tensor-core rate (H200,
    B1 T16384 HV32: prep 0.355 -> 0.255 ms, output error vs float64 unchanged); any other chunk keeps
    tf32, whose range it needs.

    Varlen: ``chunk_indices [NT_pad, 2]`` holds (sequence, chunk) on the expanded stream; a row with
    sequence -1 is padding and does nothing. Programs (c, 0) with c < ceil(n_seq / RANK_BLOCK) write
    the sweep's order of sequences, longest first (``sequence_order [n_seq]``, :func:`_rank_sequences`;
    in this launch rather than one of its own, which cost ~20 us between the prep and the sweep).
    Dense: program c covers expanded chunk ``chunk_lo + c % chunk_span`` of sequence
    ``c // chunk_span`` (all chunks: 0 and ceil(T*M/BT); a phase of the phased sweep: its range).

    ``wait_primary`` != 0 (a phase after the first, launched as the programmatic dependent of the
    previous phase's sweep, so that it runs beside it on the SMs that sweep leaves free): the last
    program ends by waiting for that sweep (``griddepcontrol.wait``), so that this kernel's end
    implies the sweep's, as the next launch in the stream expects; the others run freely (they read
    only the op's inputs and write only their own phase's scratch). A runtime value, so that one
    compiled kernel serves every launch; PDL (a constexpr: False under the interpreter, which has
    no grid dependency control) compiles the wait in.
    """
    pid = tl.program_id(0).to(tl.int64)
    i_c = pid // HV
    i_hv = pid % HV
    i_h = i_hv // (HV // H)
    if IS_VARLEN:
        if (i_hv == 0) & (i_c * RANK_BLOCK < n_seq):
            _rank_sequences(cu_seqlens, sequence_order, n_seq, i_c, RANK_BLOCK, 16)
        i_n = tl.load(chunk_indices + i_c * 2).to(tl.int64)
        i_t = tl.load(chunk_indices + i_c * 2 + 1).to(tl.int64)
        if (i_n < 0) | (i_n >= n_seq):  # padding (or no sequence): nothing to do
            return
        # Clamped to [0, T] and the chunk to the sequence: a wrong descriptor writes nothing outside.
        bos_t = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n).to(tl.int64), 0), T)
        eos_t = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n + 1).to(tl.int64), bos_t), T)
        bos = bos_t * M
        eos = eos_t * M
        if (i_t < 0) | (i_t * BT >= eos - bos):
            return
    else:
        i_n = i_c // chunk_span
        i_t = chunk_lo + i_c % chunk_span
        bos = i_n * T * M
        eos = bos + T * M
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
    b_q = tl.load(q + ((rows // M) * H + i_h)[:, None] * K + o_k[None, :], mask=m_q[:, None] & m_k[None, :],
                  other=0.0)
    b_beta = tl.load(beta + rows * HV + i_hv, mask=m_r, other=0.0).to(tl.float32)

    # Stage 1: within-chunk cumulative log2 decays; G[i, j] = decay from row j to row i.
    gc, seg, bad_g = _chunk_gates(g, rows // M, rows % M, m_r, i_hv, HV, M, BT, HAS_G)
    causal = o_t[:, None] >= o_t[None, :]

    # Norm factors of the raw q, k.
    eye = o_t[:, None] == o_t[None, :]
    b_kk = tl.dot(b_k.to(DT), tl.trans(b_k.to(DT)), input_precision=INV_PRECISION)  # raw K K^T
    # Squared norms from the diagonals of K K^T and Q Q^T (tensor-core products of the raw tiles,
    # float32 accumulation): fewer instructions than squaring the [BT, K] tiles.
    k_sq = tl.sum(tl.where(eye, b_kk, 0.0), axis=1)
    # Causality under non-finite input: a row whose k, beta or decay is NaN or inf is selected out
    # of every product below (its decay counts as 1, its k and beta as 0), so that no 0 * inf
    # reaches an earlier row; its output and every later one are poisoned instead (NaN in lam rq,
    # and in lam_last for the state), as the token loop's are. One reduction gives both chunk
    # flags: any reset (seg_last != 0) and, rarely, any such row (then has_reset may be a false
    # positive, which only costs the segment comparison).
    bad = bad_g | (k_sq * 0.0 != 0.0) | (b_beta * 0.0 != 0.0)
    flags = tl.max(seg + 128 * bad.to(tl.int32), axis=0)
    has_reset = flags != 0
    any_bad = flags >= 128
    first_bad = flags * 0 + BT
    if any_bad:
        first_bad = tl.min(tl.where(bad, o_t, BT), axis=0)
        b_kk = tl.where(bad[:, None] | bad[None, :], 0.0, b_kk)
    k_sq = tl.where(bad, 0.0, k_sq)
    b_beta = tl.where(bad, 0.0, b_beta)
    if USE_L2NORM:
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
    # sweep (rows of 16 B at a stride of HV x 16 B were slower on the H200, docs "Latest").
    p_coef = coef + ((_chunk_slot(bos, i_t, i_n, BT) * HV + i_hv) * BT + o_t) * 4
    tl.store(p_coef, lam * rk, mask=m_r)
    tl.store(p_coef + 1, lam * rq, mask=m_q)
    tl.store(p_coef + 2, gam * rk, mask=m_r)
    tl.store(p_coef + 3, tl.zeros([BT], dtype=tl.float32) + lam_last, mask=o_t == 0)  # read on row 0 only
    p_out = (rows * HV + i_hv)[:, None] * BT + o_t[None, :]

    # aqk = G o (scale Q K^T) (normalised q, k: the factors scale the product's rows and columns).
    # It and lam rq are stored on the query rows only (every M-th row), the only ones the sweep
    # reads; for GDP that halves the aqk bytes written (M = 2).
    b_qk = tl.dot(b_q.to(DT), tl.trans(b_k.to(DT)), input_precision=INV_PRECISION) * rq[:, None] * rk[None, :]
    if any_bad:  # a non-finite key's column
        b_qk = tl.where(bad[None, :], 0.0, b_qk)
    b_G = _gate_tile(gc, seg, causal, has_reset)
    tl.store(aqk + p_out, (b_G * b_qk).to(aqk.dtype.element_ty), mask=m_q[:, None])
    # G diag(beta), wy's factor besides Tinv, held across the inverse at 16 bits for 16-bit inputs
    # (16 registers a thread, not the 48 of the gate and beta vectors in the product's layout):
    # fp16 rounds it to 2^-11 relative (under the 2^-9 that wy is stored with in bf16), and entries
    # under 2^-14 to 2^-25 absolute (fp16's subnormals), far under the rounding of the sums they
    # enter. Float32 inputs keep it in float32.
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
            b_T = _wy_inverse(b_T, b_A, o_t, True, INV_PRECISION)
        else:
            b_T = _wy_inverse(b_T, b_A, o_t, False, INV_PRECISION)
    else:
        b_T = _wy_inverse(b_T, b_A, o_t, False, INV_PRECISION)
    # p_out and m_r formed anew from scalars and o_t: the same expressions would be one value, held
    # in registers across the inverse (the stores' addresses are 64-bit).
    p_wy = wy + (r0 * HV + i_hv) * BT + (o_t * (HV * BT))[:, None] + o_t[None, :]
    tl.store(p_wy, (b_Gb.to(tl.float32) * b_T).to(wy.dtype.element_ty), mask=(o_t < eos - r0)[:, None])
    if PDL:
        if (wait_primary != 0) & (pid == tl.num_programs(0) - 1):
            tl.extra.cuda.gdc_wait()


# ----------------------------------------------------------------------------------------------
# Varlen: the sweep's order of sequences, longest first
# ----------------------------------------------------------------------------------------------


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


@triton.jit(do_not_specialize=["N"])
def sequence_order_kernel(cu_seqlens, order, N, BLOCK: tl.constexpr):
    """Grid (ceil(N / BLOCK),): ``order`` = the sequences by length, longest first, ties in index
    order (:func:`_rank_sequences`). The prep kernel does this ranking itself (its first programs);
    this launch serves a sweep run alone (benchmarks) and the tests.

    Why the varlen sweep wants it: each sweep program walks its sequence's chunks one after
    another and programs start in launch order, so a long sequence launched last adds the whole of
    its walk to the end (list scheduling; longest first is the classic remedy). H200, the
    16-sequence varlen workload packed shortest first: 1.096 -> 0.940 ms with the ranking in the
    prep (docs/kernels-chunk-delta.md)."""
    _rank_sequences(cu_seqlens, order, N, tl.program_id(0), BLOCK, 16)


# ----------------------------------------------------------------------------------------------
# Stages 3 and 4: the state sweep with the outputs, one program per (sequence, head, value block)
# ----------------------------------------------------------------------------------------------


@triton.jit
def _outputs_causal(b_Sd, b_q, b_Wt, b_At, lam_rk, lam_rq, out_rows, k, v, e, m_r, i_h, i_hv, o_t, o_k, o_v, m_k,
                    m_vt, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                    V_PRODUCT: tl.constexpr, DOT_PRECISION: tl.constexpr, DT: tl.constexpr):
    """O^T of a chunk in the replay of a program whose state came out non-finite: in the products
    over the chunk's rows a NaN or inf at row t reaches every earlier row as 0 * inf. Here
    U = wy (V - lam rk o (K S)) is formed from k and v with their non-finite entries (and those of
    K S) selected out, U's non-finite entries are selected out before the next product, and each
    value column's outputs from its first non-finite row of X or U on are NaN, as the token loop's
    are; earlier rows get the clean run's bits (the same products in the same order, adding exact
    zeros).
    ``out_rows`` [BT or BT // M]: the chunk row of each output column of O^T."""
    b_k = tl.load(k + (e * H + i_h)[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.0)
    b_k = tl.where(b_k * 0.0 == 0.0, b_k, 0.0).to(DT)  # [BT, BK]
    b_vt = tl.load(v + (e * HV + i_hv)[None, :] * V + o_v[:, None], mask=m_vt, other=0.0)  # [BV, BT]
    b_KSt = lam_rk[None, :] * tl.dot(b_Sd, tl.trans(b_k), input_precision=DOT_PRECISION)
    bad = (b_vt * 0.0 != 0.0) | (b_KSt * 0.0 != 0.0)
    b_vt = tl.where(bad, 0.0, b_vt)
    b_KSt = tl.where(bad, 0.0, b_KSt)
    # The same products, in the same order, as the chunk's own (_sweep_chunk): the same bits.
    if V_PRODUCT:
        b_Ut = tl.dot(b_vt.to(DT), b_Wt, input_precision=DOT_PRECISION)
        b_Ut = tl.dot((-b_KSt).to(DT), b_Wt, b_Ut, input_precision=DOT_PRECISION)
    else:
        b_Ut = tl.dot((b_vt.to(tl.float32) - b_KSt).to(DT), b_Wt, input_precision=DOT_PRECISION)
    bad |= b_Ut * 0.0 != 0.0
    first_bad = tl.min(tl.where(bad, o_t[None, :], BT), axis=1)  # [BV]
    b_Ut = tl.where(o_t[None, :] < first_bad[:, None], b_Ut, 0.0)
    b_ot = lam_rq[None, :] * tl.dot(b_Sd, tl.trans(b_q), input_precision=DOT_PRECISION)
    b_ot += tl.dot(b_Ut.to(DT), b_At, input_precision=DOT_PRECISION)
    return tl.where(out_rows[None, :] < first_bad[:, None], b_ot, float("nan"))


@triton.jit
def _start_state(p_state, h0, seg_n, m_s0, m_vk, o_vk, o_s0, s0_n, s0_h, i_n, i_s, n_seg, i_hv, first_phase,
                 HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
                 PASS: tl.constexpr, USE_CACHE: tl.constexpr, HAS_H0: tl.constexpr):
    """S^T [BV, BK] that a sweep program starts from: its segment's fixed-up S_in (PASS 2), the
    state the phase before left (PASS 3 after the first phase), else the cache slot, h0 or zeros
    (masked by ``m_s0``)."""
    if PASS == 2:
        b_St = tl.load(seg_n + ((i_n * n_seg + i_s) * HV + i_hv) * K * V + o_vk, mask=m_vk, other=0.0)
    else:
        if USE_CACHE:
            b_St = tl.load(p_state, mask=m_s0, other=0.0).to(tl.float32)
        elif HAS_H0:
            b_St = tl.load(h0 + i_n * s0_n + i_hv * s0_h + o_s0, mask=m_s0, other=0.0).to(tl.float32)
        else:
            b_St = tl.zeros([BV, BK], dtype=tl.float32)
        if PASS == 3:
            if not first_phase:  # the state the phase before left (seg_n [N, HV, K, V])
                b_St = tl.load(seg_n + (i_n * HV + i_hv) * K * V + o_vk, mask=m_vk, other=0.0)
    return b_St


@triton.jit
def _sweep_chunk(c, b_St, q, k, v, wy, aqk, coef, o, o_desc, chunk_states, cs0, n_cs_rows, bos, bos_t, L, i_n,
                 i_h, i_hv, i_v, o_t, o_k, o_v, m_k, m_v, m_vk, o_vk, use_v,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
                 BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PASS: tl.constexpr,
                 V_PRODUCT: tl.constexpr, TMA_STORE: tl.constexpr, STORE_CHUNK_STATES: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, DT: tl.constexpr, FULL: tl.constexpr, CAREFUL: tl.constexpr):
    """One expanded chunk c of :func:`chunk_delta_sweep_kernel` (its docstring has the algebra):
    returns the state S^T leaving the chunk, having written the chunk's outputs (PASS != 1) and,
    when it starts a token chunk, the state entering it (STORE_CHUNK_STATES). FULL: all 64 rows
    lie in the sequence, so nothing is masked by row; a full chunk of GDP with M | 64 forms its
    outputs on its query rows alone. CAREFUL: the outputs by :func:`_outputs_causal` (the replay
    of a program whose state came out non-finite); the state the same either way."""
    r = c * BT + o_t.to(tl.int64)  # [BT] row inside the sequence (expanded stream)
    if FULL:  # every row lies in the sequence: the loads and stores below go unpredicated
        m_r = tl.full([BT], True, tl.int1)
    else:
        m_r = r < L
    e = bos + r  # global expanded row
    tok = bos_t + r // M  # its token
    cp = r % M  # its Householder copy
    m_q = m_r & (cp == M - 1)  # rows that carry a query (and an output)
    # GDP with M | BT, a chunk of whole tokens: the outputs are formed on the chunk's BT // M query
    # rows alone (every M-th row) rather than on all BT rows with the others masked (M = 2, 4: the
    # query rows must still make a product of >= 16 rows).
    COMPACT_Q: tl.constexpr = FULL and (PASS != 1) and _compact_queries(M, BT)
    if COMPACT_Q:
        BTQ: tl.constexpr = BT // M
        o_tq = tl.arange(0, BTQ).to(tl.int64)
        tok_q = bos_t + c * BTQ + o_tq  # the chunk's tokens
        e_q = bos + c * BT + o_tq * M + (M - 1)  # their query rows on the expanded stream

    if STORE_CHUNK_STATES:
        if c % M == 0:  # expanded chunk c*M starts token chunk c
            cs_row = cs0 + c // M
            p_cs = chunk_states + (cs_row * HV + i_hv) * K * V + o_vk
            tl.store(p_cs, b_St, mask=m_vk & (cs_row >= 0) & (cs_row < n_cs_rows))

    # Loads: raw tiles straight into the products (none depends on the state).
    b_k = tl.load(k + (e * H + i_h)[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :],
                  other=0.0).to(DT)  # [BT, BK]
    if PASS == 1:  # no outputs; the transition's programs read no values
        m_vt = m_r[None, :] & m_v[:, None] & use_v
    else:
        m_vt = m_r[None, :] & m_v[:, None]
        if COMPACT_Q:  # the chunk's BT // M tokens, one query each
            b_q = tl.load(q + (tok_q * H + i_h)[:, None] * K + o_k[None, :], mask=m_k[None, :],
                          other=0.0).to(DT)  # [BTQ, BK]
        else:
            b_q = tl.load(q + (tok * H + i_h)[:, None] * K + o_k[None, :], mask=m_q[:, None] & m_k[None, :],
                          other=0.0).to(DT)  # [BT, BK]
    b_vt = tl.load(v + (e * HV + i_hv)[None, :] * V + o_v[:, None], mask=m_vt, other=0.0)  # [BV, BT] = V^T
    # wy^T and aqk^T: [BT (j), BT (i)] = wy[i, j]
    b_Wt = tl.load(wy + (e * HV + i_hv)[None, :] * BT + o_t[:, None], mask=m_r[None, :], other=0.0).to(DT)
    if COMPACT_Q:  # aqk^T on the query rows only: [BT (j), BTQ (i)]
        b_At = tl.load(aqk + (e_q * HV + i_hv)[None, :] * BT + o_t[:, None]).to(DT)
    elif PASS != 1:
        b_At = tl.load(aqk + (e * HV + i_hv)[None, :] * BT + o_t[:, None], mask=m_r[None, :], other=0.0).to(DT)
    # Stage 1, precomputed by the prep kernel: the rows' decays times their norm factors. One
    # [BT, 4] tile: one pipelined buffer (four vectors took four, each 1 KB aligned; loaded as
    # separate vectors, each element became its own 4-byte copy: 190 more instructions per
    # chunk, sm_90 SASS).
    o_4 = tl.arange(0, 4)
    p_coef = coef + (_chunk_slot(bos, c, i_n, BT) * HV + i_hv) * BT * 4  # the chunk's [BT, 4] tile
    b_coef = tl.load(p_coef + o_t[:, None] * 4 + o_4[None, :], mask=m_r[:, None], other=0.0)
    lam_rk = tl.sum(tl.where(o_4[None, :] == 0, b_coef, 0.0), axis=1)
    gam_rk = tl.sum(tl.where(o_4[None, :] == 2, b_coef, 0.0), axis=1)
    # The decay across the chunk, as a scalar load of the chunk's first row (always a row of the
    # sequence): taken from the tile it was a block-wide max (shuffles, three barriers per chunk).
    lam_last = tl.load(p_coef + 3)

    # Stage 3: the chunk's writes, transposed: U^T = (V - lam o K S)^T wy^T.
    b_Sd = b_St.to(DT)
    b_KSt = lam_rk[None, :] * tl.dot(b_Sd, tl.trans(b_k), input_precision=DOT_PRECISION)
    if V_PRODUCT:
        # U^T = V^T wy^T - (lam o K S)^T wy^T: as a product operand V^T is pipelined through
        # shared memory like the other tiles (held in registers, it waited on its load at every
        # chunk: 21% of the sweep's stall samples on the H200), at 16 KB more shared memory
        # (two stages) and one more 64 x 64 product per chunk, beside the chain.
        b_Ut = tl.dot(b_vt.to(DT), b_Wt, input_precision=DOT_PRECISION)  # [BV, BT]
        b_Ut = tl.dot((-b_KSt).to(DT), b_Wt, b_Ut, input_precision=DOT_PRECISION)
    else:
        b_Ut = tl.dot((b_vt.to(tl.float32) - b_KSt).to(DT), b_Wt, input_precision=DOT_PRECISION)

    # Stage 4: outputs O^T = (S^T Q^T) o lam + U^T aqk^T, written on the token stream.
    if COMPACT_Q:
        lam_rq = tl.load(p_coef + (o_tq * M + (M - 1)) * 4 + 1)
        b_ot = lam_rq[None, :] * tl.dot(b_Sd, tl.trans(b_q), input_precision=DOT_PRECISION)
        b_ot += tl.dot(b_Ut.to(DT), b_At, input_precision=DOT_PRECISION)  # [BV, BTQ]
        if CAREFUL:
            b_ot = _outputs_causal(b_Sd, b_q, b_Wt, b_At, lam_rk, lam_rq, o_tq * M + (M - 1), k, v, e, m_r, i_h,
                                   i_hv, o_t, o_k, o_v, m_k, m_vt, H, HV, K, V, BT, V_PRODUCT, DOT_PRECISION, DT)
        tl.store(o + (tok_q * HV + i_hv)[None, :] * V + o_v[:, None], b_ot.to(o.dtype.element_ty),
                 mask=m_v[:, None])
    elif PASS != 1:
        lam_rq = tl.sum(tl.where((o_4[None, :] == 1) & m_q[:, None], b_coef, 0.0), axis=1)
        b_ot = lam_rq[None, :] * tl.dot(b_Sd, tl.trans(b_q), input_precision=DOT_PRECISION)
        b_ot += tl.dot(b_Ut.to(DT), b_At, input_precision=DOT_PRECISION)
        if CAREFUL:
            b_ot = _outputs_causal(b_Sd, b_q, b_Wt, b_At, lam_rk, lam_rq, o_t, k, v, e, m_r, i_h, i_hv, o_t, o_k,
                                   o_v, m_k, m_vt, H, HV, K, V, BT, V_PRODUCT, DOT_PRECISION, DT)
        if TMA_STORE:
            o_desc.store([tl.cast(c * BT, tl.int32), tl.cast(i_v * BV, tl.int32)],
                         tl.trans(b_ot.to(o.dtype.element_ty)))
        else:
            p_o = o + (tok * HV + i_hv)[None, :] * V + o_v[:, None]
            tl.store(p_o, b_ot.to(o.dtype.element_ty), mask=m_q[None, :] & m_v[:, None])

    # Stage 3 (end): the state leaving the chunk, S^T <- lam_last S^T + (U^T o gam) K.
    b_St = b_St * lam_last + tl.dot((b_Ut * gam_rk[None, :]).to(DT), b_k, input_precision=DOT_PRECISION)
    return b_St


# n_seg and seg_chunks are not specialised (divisibility by 16, == 1): one compiled kernel per
# pass serves every segment count.
@triton.jit(do_not_specialize=["n_seg", "seg_chunks", "tc_first", "tc_count", "trigger_dependents", "n_slots",
                               "n_cs_rows"])
def chunk_delta_sweep_kernel(
    q, k, v, wy, aqk, coef, o,
    h0, ht, state, state_indices, chunk_states, cu_seqlens, chunk_offsets, sequence_order,
    seg_n, seg_m, n_seg, seg_chunks, tc_first, tc_count, trigger_dependents, T,
    s0_n, s0_h, s0_k, s0_v, n_slots, n_cs_rows, replay_flags,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_H0: tl.constexpr,
    STORE_FINAL: tl.constexpr, USE_CACHE: tl.constexpr, STORE_CHUNK_STATES: tl.constexpr,
    DOT_PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, DT: tl.constexpr, PASS: tl.constexpr = 0,
    V_PRODUCT: tl.constexpr = True, TMA_STORE: tl.constexpr = False, PDL: tl.constexpr = False,
    REPLAY: tl.constexpr = False,
):
    """Grid (N * HV * ceil(V / BV),): program -> (sequence n, value head hv, value block iv),
    iv fastest so neighbouring programs share the q/k rows in L2.

    Per chunk (q, k raw; rk, rq their norm factors, rq with the scale; lam, gam, lam_last the
    decays from the chunk start to each row, from each row to the chunk end, and across it; the
    products lam rk, lam rq, gam rk and lam_last come from the prep kernel's ``coef``)::

        X = V - (lam rk) o (K S);   U = wy X;   O = (lam rq) o (Q S) + aqk U
        S <- lam_last S + K^T ((gam rk) o U)

    computed transposed (S^T, X^T, U^T, O^T) so that the chained values are left operands.

    TMA_STORE (M = 1 only; the plan checks): the output tile goes out as one bulk tensor store
    through a descriptor made per program over its sequence's rows, which clips the rows past the
    sequence's end, instead of a masked store (which moves the tile to a coalesced layout through
    shared memory in four pieces, two barriers each). The descriptor needs 128 B of global scratch
    per program (kernels/_launch.py passes it).

    The chunk body is :func:`_sweep_chunk`: unmasked over the chunks whose 64 rows lie in the
    sequence (the pipelined loop), masked once for a partial last chunk; a full chunk of GDP with
    M | 64 forms its outputs on its query rows alone.

    Varlen: program block n (in launch order) sweeps sequence ``sequence_order[n]``, the longest
    sequences first (ranked by the prep kernel's first programs, :func:`_rank_sequences`): each
    program walks its sequence's chunks one after another, so a long sequence launched last would
    end the kernel alone.

    The initial state is ``state[state_indices[n]]`` (USE_CACHE; slot -1: zero output, nothing
    read or written), else ``h0[n]`` (HAS_H0), else zeros. Both are read and the cache written
    through their strides ``s0_n, s0_h, s0_k, s0_v`` (a slot-strided pool, a transposed
    ``[S, HV, V, K]`` cache). Descriptors are bounded: a slot outside ``[0, n_slots)`` is treated
    as padding, sequence bounds are clamped to ``[0, T]``, and a chunk-state row at or past
    ``n_cs_rows`` is not written, so no descriptor, however wrong, reaches outside a tensor. The
    final state goes back to the cache slot, or to ``ht[n]`` (STORE_FINAL). With
    STORE_CHUNK_STATES, row ``chunk_offsets[n] + c`` of ``chunk_states`` receives the state entering
    token chunk c (dense: ``n * ceil(T/BT) + c``).

    Non-finite input (NaN or inf in q, k, v, beta or a decay; growth past float32's range): the
    prep selects bad rows out of its products and poisons the outputs from them on and the state;
    a program whose state comes out non-finite raises ``replay_flags[pid]`` and leaves its cache
    slot, and the REPLAY launch of this kernel (the same grid, after this one) runs those
    programs again with each chunk's outputs formed causally (:func:`_outputs_causal`), writing
    the outputs and the slot. Outputs before a bad token keep the clean run's bits.

    Segments (``PASS`` 1 and 2, dense batches; the wrapper launches them, with
    :func:`chunk_delta_fixup_kernel` between): each sequence's token chunks are cut into ``n_seg``
    segments of ``seg_chunks`` token chunks (so of ``seg_chunks * M`` expanded chunks: no token and
    no chunk state straddles two segments). Per value head a segment maps the state affinely,
    ``S_out = M_i S_in + N_i``, with the same ``M_i [K, K]`` for every value column.
    ``seg_n [N, n_seg, HV, K, V]`` and ``seg_m [N, n_seg, HV, K, K]`` are float32 scratch.

    - PASS 1, grid ``(N * (n_seg - 1) * HV * (NV + NK),)``, NK = ceil(K / BV); program ->
      (n, segment i < n_seg - 1, hv, column block j): for j < NV the sweep of segment i's chunks,
      no outputs, from the sequence's initial state (i = 0; it also copies that state to row 0 of
      ``seg_n``, so that pass 2 never reads the cache that its last segment writes) or from zero
      (i > 0), ending in row i + 1 of ``seg_n`` (``N_i``, or for i = 0 the true ``S_in[1]``); for
      j >= NV (i > 0 only) the same sweep with the value input switched off from the identity
      state: the "value" columns are then K wide and the end state is ``M_i`` (row i of
      ``seg_m``). Resets need nothing special: a reset zeroes ``lam``, so it zeroes M's columns as
      it zeroes a state's.
    - PASS 2, grid ``(N * n_seg * HV * NV,)``: the sweep of segment i from row i of ``seg_n`` (the
      fixed-up ``S_in[i]``) with its outputs and chunk states; the last segment writes the final
      state (or the cache slot).

    Phases (``PASS`` 3, dense batches): the single pass cut in time, so that the prep of the next
    phase's chunks runs beside this phase's sweep (the wrapper launches prep 0, sweep 0, prep 1,
    sweep 1, ...; each prep after the first as the programmatic dependent of the sweep before it,
    ``trigger_dependents`` != 0 letting it start as soon as every program of this sweep has; PDL, a
    constexpr, compiles the trigger in). Grid as
    PASS 0; the phase covers token chunks ``[tc_first, tc_first + tc_count)`` of every sequence,
    from the sequence's initial state (first phase) or from its state in ``seg_n [N, HV, K, V]``,
    to the final state or cache slot (last phase) or back into ``seg_n``. The chunks and their
    order are the single pass's, so the results are its bits.
    """
    pid = tl.program_id(0).to(tl.int64)
    if REPLAY:  # the replay launch: only the programs the pass before flagged (see the end)
        if PDL:
            tl.extra.cuda.gdc_wait()
        if tl.load(replay_flags + pid) != 1:
            return
    if PDL:
        if trigger_dependents != 0:  # the next phase's prep may start once every program here has
            tl.extra.cuda.gdc_launch_dependents()
    NV: tl.constexpr = (V + BV - 1) // BV
    if PASS == 1:
        NK: tl.constexpr = (K + BV - 1) // BV
        i_j = pid % (NV + NK)
        i_hv = (pid // (NV + NK)) % HV
        i_s = (pid // ((NV + NK) * HV)) % (n_seg - 1)
        i_n = pid // ((NV + NK) * HV * (n_seg - 1))
        role_m = i_j >= NV  # this program computes columns of the transition M_i
        if role_m:
            if i_s == 0:  # segment 0 starts from the true state: no transition needed
                return
        i_v = tl.where(role_m, i_j - NV, i_j)
        W = tl.where(role_m, K, V)  # width (and row stride) of the state this program carries
    elif PASS == 2:
        i_v = pid % NV
        i_hv = (pid // NV) % HV
        i_s = (pid // (NV * HV)) % n_seg
        i_n = pid // (NV * HV * n_seg)
        W = V
    else:
        i_v = pid % NV
        i_hv = (pid // NV) % HV
        i_n = pid // (NV * HV)
        i_s = 0  # one segment
        if IS_VARLEN:  # longest sequences first (ranked by the prep)
            i_n = tl.load(sequence_order + i_n).to(tl.int64)
        W = V
    i_h = i_hv // (HV // H)
    if IS_VARLEN:  # clamped to [0, T]: a wrong cu_seqlens reads and writes no row outside the inputs
        bos_t = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n).to(tl.int64), 0), T)
        eos_t = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n + 1).to(tl.int64), bos_t), T)
    else:
        bos_t = i_n * T
        eos_t = bos_t + T
    L = (eos_t - bos_t) * M  # rows of this sequence on the expanded stream
    bos = bos_t * M
    first_phase = True  # PASS 3 sets both
    last_phase = True
    if PASS == 0:
        tc_lo = 0  # token chunks [tc_lo, tc_hi), expanded chunks [c_lo, c_hi) of this program
        tc_hi = tl.cdiv(eos_t - bos_t, BT)
        c_lo = 0
        c_hi = tl.cdiv(L, BT)
    elif PASS == 3:
        tc_lo = tc_first
        tc_hi = tl.minimum(tc_first + tc_count, tl.cdiv(eos_t - bos_t, BT))
        c_lo = tc_lo * M
        c_hi = tl.minimum(tc_hi * M, tl.cdiv(L, BT))
        first_phase = tc_lo == 0
        last_phase = tc_hi == tl.cdiv(eos_t - bos_t, BT)
    else:
        tc_lo = i_s * seg_chunks
        tc_hi = tl.minimum(tc_lo + seg_chunks, tl.cdiv(eos_t - bos_t, BT))
        c_lo = tc_lo * M
        c_hi = tl.minimum(tc_hi * M, tl.cdiv(L, BT))

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < W
    # The state is held transposed, St = S^T [BV, BK]: every chained value (St, X^T, U^T) is then
    # the left operand of its next product and stays in registers; the tiles read from memory
    # (k, q, wy^T, aqk^T) are the right operands, in shared memory.
    m_vk = m_v[:, None] & m_k[None, :]
    o_vk = o_k[None, :].to(tl.int64) * W + o_v[:, None]  # [BV, BK] offsets of S[k, v] in a [K, W] state
    o_s0 = o_k[None, :].to(tl.int64) * s0_k + o_v[:, None].to(tl.int64) * s0_v  # the same in state / h0

    p_state = state  # the cache slot's tile with USE_CACHE (below); unread otherwise
    if USE_CACHE:
        slot = tl.load(state_indices + i_n).to(tl.int64)
        if (slot < 0) | (slot >= n_slots):  # padding (or no slot of the cache): zero output, no state access
            if PASS != 1:
                for c in range(tc_lo, tc_hi):
                    o_tok = bos_t + c * BT + o_t.to(tl.int64)
                    p_o = o + (o_tok * HV + i_hv)[:, None] * V + o_v[None, :]
                    tl.store(p_o, tl.zeros([BT, BV], dtype=o.dtype.element_ty),
                             mask=(o_tok < eos_t)[:, None] & m_v[None, :])
                if not REPLAY:
                    if last_phase:
                        tl.store(replay_flags + pid, 0)
            return
        p_state = state + slot * s0_n + i_hv * s0_h + o_s0
    if PASS == 1:
        m_s0 = m_vk & (i_j < NV) & (i_s == 0)  # only segment 0's state programs read it
    elif PASS == 3:
        m_s0 = m_vk & first_phase  # later phases start from the state the phase before left
    else:
        m_s0 = m_vk
    b_St = _start_state(p_state, h0, seg_n, m_s0, m_vk, o_vk, o_s0, s0_n, s0_h, i_n, i_s, n_seg, i_hv, first_phase,
                        HV, K, V, BV, BK, PASS, USE_CACHE, HAS_H0)
    if PASS == 1:
        if i_s == 0:  # a copy of S_in[0] for pass 2 (role_m programs returned above)
            tl.store(seg_n + (i_n * n_seg * HV + i_hv) * K * V + o_vk, b_St, mask=m_vk)
        b_St = tl.where(role_m, (o_v[:, None] == o_k[None, :]).to(tl.float32), b_St)
        use_v = i_j < NV

    if STORE_CHUNK_STATES:
        if IS_VARLEN:
            cs0 = tl.load(chunk_offsets + i_n).to(tl.int64)
        else:
            cs0 = i_n * tl.cdiv(T, BT)

    if TMA_STORE and PASS != 1:  # the sequence's output rows [L, V] of value head hv; rows past L clipped
        o_desc = tl.make_tensor_descriptor(o + (bos_t * HV + i_hv) * V, shape=[(eos_t - bos_t).to(tl.int32), V],
                                           strides=[HV * V, 1], block_shape=[BT, BV])
    else:  # _sweep_chunk takes every name; the flags below keep these placeholders unread
        o_desc = o
    if PASS != 1:
        use_v = True
    if not STORE_CHUNK_STATES:
        cs0 = 0
    # Chunks whose 64 rows all lie in the sequence run unmasked (masks were a sixth of the chunk
    # loop's instructions, sm_90 SASS); the sequence's last chunk, when partial, runs masked after.
    c_full = tl.minimum(c_hi, L // BT)
    for c in tl.range(c_lo, c_full, num_stages=NUM_STAGES):
        b_St = _sweep_chunk(c, b_St, q, k, v, wy, aqk, coef, o, o_desc, chunk_states, cs0, n_cs_rows, bos, bos_t, L,
                            i_n, i_h, i_hv, i_v, o_t, o_k, o_v, m_k, m_v, m_vk, o_vk, use_v,
                            H, HV, K, V, M, BT, BK, BV, PASS, V_PRODUCT, TMA_STORE, STORE_CHUNK_STATES,
                            DOT_PRECISION, DT, True, REPLAY)
    c_tail = tl.maximum(c_lo, c_full)
    if c_tail < c_hi:
        b_St = _sweep_chunk(c_tail, b_St, q, k, v, wy, aqk, coef, o, o_desc, chunk_states, cs0, n_cs_rows, bos, bos_t,
                            L, i_n, i_h, i_hv, i_v, o_t, o_k, o_v, m_k, m_v, m_vk, o_vk, use_v,
                            H, HV, K, V, M, BT, BK, BV, PASS, V_PRODUCT, TMA_STORE, STORE_CHUNK_STATES,
                            DOT_PRECISION, DT, False, REPLAY)
    # Causality under non-finite input. A NaN or inf in U reaches every earlier row of its chunk
    # through the products over the chunk's rows (0 * inf), and it always leaves the state
    # non-finite (nothing in the state's path selects it out). So a program whose state comes out
    # finite wrote right outputs; one whose does not raises its flag, and the replay launch
    # (REPLAY, after this one) runs its chunks again from the state it started with, each chunk's
    # outputs formed with the bad entries selected out (_outputs_causal). The cache slot it starts
    # from is left for the replay to write.
    replay = False
    if (PASS != 1) and (not REPLAY):
        if last_phase:
            replay = tl.max(tl.max(tl.where(b_St * 0.0 == 0.0, 0, 1), axis=1), axis=0) != 0
            tl.store(replay_flags + pid, replay.to(tl.int32))
    if PASS == 1:
        if role_m:  # M_i: row i of seg_m ([K, K], row stride W = K)
            tl.store(seg_m + ((i_n * n_seg + i_s) * HV + i_hv) * K * K + o_vk, b_St, mask=m_vk)
        else:  # N_i (S_in[1] for segment 0): row i + 1 of seg_n
            tl.store(seg_n + ((i_n * n_seg + i_s + 1) * HV + i_hv) * K * V + o_vk, b_St, mask=m_vk)
    elif PASS == 2:
        if i_s == n_seg - 1:  # the last segment ends the sequence
            if USE_CACHE:
                tl.store(p_state, b_St.to(state.dtype.element_ty), mask=m_vk & (not replay))
            elif STORE_FINAL:
                tl.store(ht + (i_n * HV + i_hv) * K * V + o_vk, b_St, mask=m_vk)
    elif PASS == 3:
        if last_phase:
            if USE_CACHE:
                tl.store(p_state, b_St.to(state.dtype.element_ty), mask=m_vk & (not replay))
            elif STORE_FINAL:
                tl.store(ht + (i_n * HV + i_hv) * K * V + o_vk, b_St, mask=m_vk)
        else:
            tl.store(seg_n + (i_n * HV + i_hv) * K * V + o_vk, b_St, mask=m_vk)
    else:
        if USE_CACHE:
            tl.store(p_state, b_St.to(state.dtype.element_ty), mask=m_vk & (not replay))
        elif STORE_FINAL:
            tl.store(ht + (i_n * HV + i_hv) * K * V + o_vk, b_St, mask=m_vk)


@triton.jit(do_not_specialize=["n_seg", "n_slots"])
def chunk_delta_fixup_kernel(
    seg_n, seg_m, state_indices, n_seg, n_slots,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_CACHE: tl.constexpr, PRECISION: tl.constexpr,
):
    """Grid (N * HV * ceil(V / BV),): the segments' sequential fix-up, in float32. For one
    (sequence, value head, column block), in place in ``seg_n``: row 1 already holds ``S_in[1]``;
    for i = 1 .. n_seg - 2, ``row i + 1 <- M_i row i + row i + 1`` (``S_in[i+1] = M_i S_in[i] + N_i``).
    PRECISION "ieee" for float32 inputs, else "tf32x3" (float32-level error on the tensor cores).
    One step is a [K, K] x [K, BV] product; at K = 128, BV 32, 8 warps, tf32x3 it compiles for
    sm_90 to 255 registers, 40 B of stack, 160 KB of shared memory (one program per SM)."""
    pid = tl.program_id(0).to(tl.int64)
    NV: tl.constexpr = (V + BV - 1) // BV
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_n = pid // (NV * HV)
    if USE_CACHE:
        slot = tl.load(state_indices + i_n)
        if (slot < 0) | (slot >= n_slots):  # padding: pass 2 writes zeros and reads nothing
            return
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    m_kk = (o_k < K)[:, None] & (o_k < K)[None, :]
    o_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    o_kk = o_k[:, None].to(tl.int64) * K + o_k[None, :]
    b_S = tl.load(seg_n + ((i_n * n_seg + 1) * HV + i_hv) * K * V + o_kv, mask=m_kv, other=0.0)
    for i in range(1, n_seg - 1):
        b_M = tl.load(seg_m + ((i_n * n_seg + i) * HV + i_hv) * K * K + o_kk, mask=m_kk, other=0.0)
        p_n = seg_n + ((i_n * n_seg + i + 1) * HV + i_hv) * K * V + o_kv
        b_S = tl.dot(b_M, b_S, input_precision=PRECISION) + tl.load(p_n, mask=m_kv, other=0.0)
        tl.store(p_n, b_S, mask=m_kv)


# ----------------------------------------------------------------------------------------------
# Launch wrapper
# ----------------------------------------------------------------------------------------------


#: The per-call values of a planned call, in order: the inputs, then the buffers the call allocates.
INPUT_NAMES = ("q", "k", "v", "g", "beta", "initial_state", "state", "state_indices", "cu_seqlens",
               "chunk_indices_dp", "chunk_offsets")
BUFFER_NAMES = ("o", "final", "chunk_states", "beta_ones", "wy", "aqk", "coef", "seg_n", "seg_m",
                "sequence_order", "replay_flags")
CALL_NAMES = INPUT_NAMES + BUFFER_NAMES


@dataclass
class _Step:
    """One kernel launch of a plan: per-call values in ``kwargs`` are ``CallArg`` names."""

    kernel: object
    grid: tuple
    kwargs: dict
    options: dict
    # A programmatic dependent of the previous launch (the direct launches; the first, through
    # Triton's JIT, is plain): it may start once every program of that launch has started or
    # triggered. Not a compile option, so one compiled kernel serves both kinds of launch.
    programmatic: bool = False
    min_shared: int = 0  # shared memory its direct launches reserve per program, at least
    direct: DirectLaunch | None = None  # the compiled kernel's direct launch, after the first call


@dataclass
class ChunkDeltaPlan:
    """Everything a call of one signature needs but its tensors: the buffers to allocate
    (name -> (shape, dtype, fill); fill None = uninitialised, else a constant), the launches in
    order, and where each returned tensor sits in the call's values (None: a None output). Built
    once per signature; keeps no tensor. ``launched``: its first call has run (and compiled every
    kernel it launches)."""

    buffers: dict
    steps: list
    outputs: tuple
    device: torch.device
    launched: bool = False

    def __post_init__(self):  # names -> positions in CALL_NAMES, once rather than per call
        self.outputs = tuple(None if n is None else CALL_NAMES.index(n) for n in self.outputs)


def plan_chunk_delta(q, k, v, g, beta, *, num_householder=1, scale=None, initial_state=None,
                     output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                     chunk_indices_dp=None, chunk_offsets=None, num_chunk_rows=None, state=None,
                     state_indices=None, return_chunk_states=False, block_v=32, num_warps=4,
                     num_stages=2, prep_warps=4, stages="both", segments=1,
                     inverse_fp16=None, v_product=True, tma_store=False, phases=1,
                     prep_maxnreg=None) -> ChunkDeltaPlan:
    """The launches of :func:`chunk_delta_fwd` for these tensors' shapes (read, never kept)."""
    M = num_householder
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else float(scale)
    if inverse_fp16 is None:  # fp16 operands for the WY inverse where safe: 16-bit inputs
        inverse_fp16 = q.dtype != torch.float32
    device = q.device
    varlen = cu_seqlens is not None
    N = cu_seqlens.shape[0] - 1 if varlen else B
    BT = CHUNK
    BK = max(16, triton.next_power_of_2(K))
    BV = min(block_v, max(16, triton.next_power_of_2(V)))
    if varlen:
        if chunk_indices_dp is None:
            raise ValueError("chunk_delta_fwd: varlen input needs chunk_indices_dp (recurscan.descriptors)")
        n_prep = chunk_indices_dp.shape[0]
    else:
        n_prep = B * triton.cdiv(T * M, BT)
    use_cache = state is not None
    store_final = not use_cache and output_final_state

    buffers = {
        "o": ((B, T, HV, V), q.dtype, None),
        "wy": ((B, T * M, HV, BT), q.dtype, None),
        "aqk": ((B, T * M, HV, BT), q.dtype, None),
    }
    # per (chunk slot, head): slots (bos + 64 c) // 64 + n < B*T*M // 64 + N (_chunk_slot)
    buffers["coef"] = (((B * T * M) // BT + N, HV, BT, 4), torch.float32, None)
    if varlen and N > 0:  # the sweep's order of sequences, longest first (written by the prep)
        buffers["sequence_order"] = ((N,), torch.int32, None)
    if beta is None:
        buffers["beta_ones"] = ((B, T * M, HV), q.dtype, 1.0)
    if store_final:
        buffers["final"] = ((N, HV, K, V), torch.float32, None)
    if return_chunk_states:
        if varlen:
            if chunk_offsets is None or num_chunk_rows is None:
                raise ValueError("chunk_delta_fwd: chunk states of varlen input need chunk_offsets and num_chunk_rows")
            rows = num_chunk_rows
        else:
            rows = B * triton.cdiv(T, BT)
        # Zeros: rows past the last sequence's (descriptor padding) and a padding sequence's rows.
        buffers["chunk_states"] = ((rows, HV, K, V), torch.float32, 0.0)

    def arg(name, present=True):  # a per-call tensor; an absent one points at o (its flag keeps it unread)
        return CallArg(name if present else "o")

    dot_precision = "ieee" if q.dtype == torch.float32 else "tf32"
    # The products take the input dtype (bf16/fp16 operands, float32 accumulation). Triton 3.6's
    # interpreter multiplies bf16 tiles as raw uint16 bits, so there bf16 products run in float32.
    dt = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[q.dtype]
    if dt == tl.bfloat16 and INTERPRET:
        dt = tl.float32
    beta_arg = arg("beta") if beta is not None else arg("beta_ones")
    steps = []
    NTe = triton.cdiv(T * M, BT)  # expanded chunks of a dense sequence
    prep = dict(
        q=arg("q"), k=arg("k"), g=arg("g", g is not None), beta=beta_arg, wy=arg("wy"), aqk=arg("aqk"),
        coef=arg("coef"),
        cu_seqlens=arg("cu_seqlens", varlen), chunk_indices=arg("chunk_indices_dp", varlen),
        sequence_order=arg("sequence_order", varlen and N > 0), scale=scale, T=T, n_seq=N if varlen else 0,
        chunk_lo=0, chunk_span=0 if varlen else NTe,
        H=H, HV=HV, K=K, M=M, BT=BT, BK=BK,
        USE_L2NORM=use_qk_l2norm_in_kernel, IS_VARLEN=varlen, HAS_G=g is not None,
        INV_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", DT=dt, INV_FP16=inverse_fp16,
        wait_primary=0, PDL=not INTERPRET)
    for name, value in (("segments", segments), ("phases", phases)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"chunk_delta_fwd: {name} must be an int >= 1, got {value!r}")
    for name, value in (("v_product", v_product), ("tma_store", tma_store)):
        if not isinstance(value, bool):
            raise ValueError(f"chunk_delta_fwd: {name} must be a bool, got {value!r}")
    if prep_maxnreg is not None and (not isinstance(prep_maxnreg, int) or isinstance(prep_maxnreg, bool)
                                     or not 128 <= prep_maxnreg <= 255):
        raise ValueError(f"chunk_delta_fwd: prep_maxnreg must be None or an int in [128, 255], got {prep_maxnreg!r}")
    phased = phases > 1 and stages == "both" and not varlen and segments <= 1 and T > 0
    # A register cap (compile option) sets how many prep programs share a multiprocessor.
    prep_options = dict(num_warps=prep_warps, **({} if prep_maxnreg is None else {"maxnreg": prep_maxnreg}))
    if n_prep > 0 and stages in ("both", "prep") and not phased:
        steps.append(_Step(chunk_delta_prep_kernel, (n_prep * HV,), prep, prep_options))
    outputs = ("o", "state" if use_cache else ("final" if store_final else None)) + \
        (("chunk_states",) if return_chunk_states else ())
    if stages == "prep":
        return ChunkDeltaPlan(buffers, steps, outputs, device)
    NV = triton.cdiv(V, BV)
    P, seg_chunks = 1, 0
    if segments > 1 and not varlen and T > 0:
        seg_chunks = triton.cdiv(triton.cdiv(T, BT), segments)
        P = triton.cdiv(triton.cdiv(T, BT), seg_chunks)  # no empty segment
    # The initial state's source (the cache, or initial_state) is read and written through its strides.
    s0 = state.stride() if use_cache else initial_state.stride() if initial_state is not None else (0, 0, 0, 0)
    sweep = dict(
        q=arg("q"), k=arg("k"), v=arg("v"), wy=arg("wy"), aqk=arg("aqk"), coef=arg("coef"), o=arg("o"),
        h0=arg("initial_state", initial_state is not None), ht=arg("final", store_final),
        state=arg("state", use_cache), state_indices=arg("state_indices", use_cache),
        chunk_states=arg("chunk_states", return_chunk_states), cu_seqlens=arg("cu_seqlens", varlen),
        chunk_offsets=arg("chunk_offsets", varlen and return_chunk_states),
        sequence_order=arg("sequence_order", varlen and N > 0),
        seg_n=arg("o"), seg_m=arg("o"), n_seg=1, seg_chunks=0, tc_first=0, tc_count=0, trigger_dependents=0, T=T,
        s0_n=s0[0], s0_h=s0[1], s0_k=s0[2], s0_v=s0[3], n_slots=state.shape[0] if use_cache else 0,
        n_cs_rows=buffers["chunk_states"][0][0] if return_chunk_states else 0, replay_flags=arg("replay_flags"),
        H=H, HV=HV, K=K, V=V, M=M, BT=BT, BK=BK, BV=BV,
        IS_VARLEN=varlen, HAS_H0=initial_state is not None, USE_CACHE=use_cache, STORE_FINAL=store_final,
        STORE_CHUNK_STATES=return_chunk_states, DOT_PRECISION=dot_precision, NUM_STAGES=num_stages, DT=dt, PASS=0,
        V_PRODUCT=v_product, TMA_STORE=tma_store and M == 1 and V * q.element_size() % 16 == 0,
        PDL=not INTERPRET, REPLAY=False)
    options = dict(num_warps=num_warps)
    if varlen and N > 0 and stages == "sweep":  # the sweep alone: its order of sequences (else the prep's)
        steps.append(_Step(sequence_order_kernel, (triton.cdiv(N, RANK_BLOCK.value),), dict(
            cu_seqlens=arg("cu_seqlens"), order=arg("sequence_order"), N=N, BLOCK=RANK_BLOCK.value),
            dict(num_warps=4)))
    if phased:
        # prep 0, sweep 0, prep 1, sweep 1, ...: each prep after the first is the programmatic
        # dependent of the sweep before it, so it runs on the SMs that sweep leaves free.
        buffers["seg_n"] = ((N, HV, K, V), torch.float32, None)  # the state between phases
        bounds = phase_bounds(triton.cdiv(T, BT), phases)
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            c_lo, c_hi = lo * M, min(hi * M, NTe)
            steps.append(_Step(chunk_delta_prep_kernel, (N * (c_hi - c_lo) * HV,),
                               dict(prep, chunk_lo=c_lo, chunk_span=c_hi - c_lo, wait_primary=int(i > 0)),
                               prep_options, programmatic=i > 0, min_shared=PREP_SHARED_BESIDE_SWEEP))
            # The sweep after its prep's end (as a programmatic dependent of the prep, its programs
            # placed early and waiting: no faster on the H200, gpu_chunk_variants_ph_nopdl.json).
            steps.append(_Step(chunk_delta_sweep_kernel, (N * HV * NV,),
                               dict(sweep, seg_n=arg("seg_n"), tc_first=lo, tc_count=hi - lo, PASS=3,
                                    trigger_dependents=int(i < len(bounds) - 2)), options))
        replay = (N * HV * NV,), sweep  # the whole sequence again: the phases' bits are the single pass's
    elif P == 1:
        steps.append(_Step(chunk_delta_sweep_kernel, (N * HV * NV,), sweep, options))
        replay = (N * HV * NV,), sweep
    else:
        # Pass 1: segment end states from zero (segment 0: from the initial state) and the
        # transitions M_i (identity state, no values); fix-up S_in[i+1] = M_i S_in[i] + N_i;
        # pass 2: every segment's outputs from its S_in.
        buffers["seg_n"] = ((N, P, HV, K, V), torch.float32, None)
        if P > 2:
            buffers["seg_m"] = ((N, P, HV, K, K), torch.float32, None)
        seg = dict(seg_n=arg("seg_n"), seg_m=arg("seg_m") if P > 2 else arg("seg_n"), n_seg=P, seg_chunks=seg_chunks)
        NK = triton.cdiv(K, BV)
        steps.append(_Step(chunk_delta_sweep_kernel, (N * (P - 1) * HV * (NV + NK),),
                           dict(sweep, **seg, STORE_FINAL=False, STORE_CHUNK_STATES=False, PASS=1), options))
        if P > 2:
            BVF = min(32, max(16, triton.next_power_of_2(V)))
            steps.append(_Step(chunk_delta_fixup_kernel, (N * HV * triton.cdiv(V, BVF),), dict(
                seg_n=arg("seg_n"), seg_m=arg("seg_m"), state_indices=arg("state_indices", use_cache), n_seg=P,
                n_slots=state.shape[0] if use_cache else 0,
                HV=HV, K=K, V=V, BK=BK, BV=BVF, USE_CACHE=use_cache,
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32x3"), dict(num_warps=8)))
        steps.append(_Step(chunk_delta_sweep_kernel, (N * P * HV * NV,), dict(sweep, **seg, PASS=2), options))
        replay = (N * P * HV * NV,), dict(sweep, **seg, PASS=2)
    if N * HV * NV > 0:
        # The programs whose state came out non-finite, again (their flags, their outputs only): a
        # programmatic dependent of the last sweep, whose programs wait for it and mostly just exit.
        grid, kwargs = replay
        buffers["replay_flags"] = (grid, torch.int32, None)
        steps.append(_Step(chunk_delta_sweep_kernel, grid, dict(kwargs, REPLAY=True, NUM_STAGES=1), options,
                           programmatic=True))
    return ChunkDeltaPlan(buffers, steps, outputs, device)


#: Shared memory a phased prep program reserves, at least: a prep program beside a sweep program
#: slows the sweep's chain more than it adds (measured: B1 T16384 0.536 -> 0.584 ms, and 0.577
#: with a 33 KB prep), and 48 KB does not fit beside the phased sweep's 182.5 KB (the H200 has
#: 228 KB a multiprocessor, 1 KB of it reserved per program), while three still fit where no sweep
#: runs. 48 KB is also the most a launch may ask for without the kernel's opt-in.
PREP_SHARED_BESIDE_SWEEP = 48 * 1024


#: Each phase of the phased sweep is this fraction of the one before (phase_bounds): the prep of
#: phase i + 1 runs beside the sweep of phase i on the SMs it leaves free, so it covers fewer chunks
#: in that time than the sweep does (see docs/kernels-chunk-delta.md for the measurement).
PHASE_RATIO = 0.9


def phase_bounds(n_chunks: int, phases: int, ratio: float | None = None) -> list[int]:
    """Token-chunk boundaries ``[0, b_1, ..., n_chunks]`` of ``phases`` phases (fewer if there are
    fewer chunks) whose lengths fall geometrically by ``ratio``, each at least one chunk.

    >>> phase_bounds(256, 4)
    [0, 74, 141, 202, 256]
    >>> phase_bounds(2, 4)
    [0, 1, 2]
    """
    ratio = PHASE_RATIO if ratio is None else ratio
    phases = max(1, min(phases, n_chunks))
    weights = [ratio ** i for i in range(phases)]
    total = sum(weights)
    bounds, acc = [0], 0.0
    for i, w in enumerate(weights[:-1]):
        acc += w
        bounds.append(min(max(round(n_chunks * acc / total), bounds[-1] + 1), n_chunks - (phases - 1 - i)))
    bounds.append(n_chunks)
    return bounds


def run_chunk_delta(plan: ChunkDeltaPlan, inputs: tuple) -> tuple:
    """Allocate the plan's buffers and launch its steps on ``inputs`` (tensors or None, in the
    order of :data:`INPUT_NAMES`; they must have the signature the plan was made for). The first
    call of a plan launches through Triton's JIT; later ones launch the compiled kernels directly."""
    q, k, v, g, beta = inputs[:5]
    inputs = (q.contiguous(), k.contiguous(), v.contiguous(), g if g is None else g.contiguous(),
              beta if beta is None else beta.contiguous()) + tuple(inputs[5:])
    made = {}
    for name, (shape, dtype, fill) in plan.buffers.items():
        made[name] = _empty(*shape, dtype=dtype, device=plan.device) if fill is None else \
            torch.full(shape, fill, dtype=dtype, device=plan.device)
    values = inputs + tuple(made.get(n) for n in BUFFER_NAMES)
    if plan.launched or INTERPRET:
        _launch_steps(plan, values)
    else:  # the first call: every kernel compiles at once
        with compile_together([(s.kernel, s.grid, s.kwargs, s.options) for s in plan.steps], CALL_NAMES, values):
            _launch_steps(plan, values)
        plan.launched = True
    return tuple(None if i is None else values[i] for i in plan.outputs)


def _launch_steps(plan: ChunkDeltaPlan, values: tuple) -> None:
    for step in plan.steps:
        if step.direct is not None:
            step.direct(values)
        else:
            step.direct = jit_launch(step.kernel, step.grid, step.kwargs, step.options, CALL_NAMES, values,
                                     step.programmatic, step.min_shared)


def chunk_delta_fwd(q, k, v, g, beta, *, num_householder=1, scale=None, initial_state=None,
                    output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                    chunk_indices_dp=None, chunk_offsets=None, num_chunk_rows=None, state=None,
                    state_indices=None, return_chunk_states=False, block_v=32, num_warps=4,
                    num_stages=2, prep_warps=4, stages="both", segments=1, inverse_fp16=None,
                    v_product=True, tma_store=False, phases=1, prep_maxnreg=None):
    """Launch the kernels. Arguments as the public ops (``recurscan.chunk_gated_delta_rule``,
    ``recurscan.chunk_gated_delta_product_varlen``), with the descriptors already built:

    - varlen (``cu_seqlens`` given): ``chunk_indices_dp [NT_pad, 2]`` (sequence, chunk) of the
      expanded stream sizes the prep grid; with ``return_chunk_states``, ``chunk_offsets [N + 1]``
      and ``num_chunk_rows`` (rows of the chunk-state tensor, >= chunk_offsets[N]) too.
    - launch shape: ``block_v`` (BV), ``num_warps``/``num_stages`` of the sweep, ``prep_warps``;
      the planner picks them (``recurscan.plan``).
    - ``stages``: "both"; "prep" or "sweep" launch one kernel alone (benchmarks time each; the
      sweep alone then reads scratch the prep kernel wrote in an earlier call, or poison).
    - ``segments``: 1 runs the single sweep (one program walks a whole sequence). P > 1 (dense
      batches; varlen input ignores it and runs the single sweep) cuts each sequence into P
      segments of ``ceil(ceil(T/64) / P)`` token chunks (fewer segments if some would be empty)
      and runs the sweep in two parallel passes with a short fix-up between
      (:func:`chunk_delta_sweep_kernel`, PASS 1 and 2; :func:`chunk_delta_fixup_kernel`).
    - ``inverse_fp16``: None (default): True for 16-bit inputs. True: the WY inverse runs on fp16
      operands in every chunk whose steps are contractions (checked in the kernel; other chunks
      keep tf32); False: tf32 everywhere (benchmarks/gpu_prep_variants.py measures both).
    - ``v_product``: True: the sweep forms ``V^T wy^T`` as its own product, so V is pipelined
      through shared memory (best with one program per SM: few programs, deep pipelines); False:
      V is held in registers (16 KB less shared memory per program at BV 64 and two stages: two
      programs per SM fit).
    - ``prep_maxnreg``: a register cap on the prep kernel (None: the compiler's choice, 235-253 at
      sm_90), which sets how many of its programs share a multiprocessor; the planner asks 168
      (three), ``recurscan.plan.Launch``.
    - ``tma_store``: the sweep writes its output tiles with bulk tensor stores (M = 1 and output
      rows a multiple of 16 bytes; elsewhere it keeps the masked store).
    - ``phases``: 1 (default) runs the prep over every chunk, then the sweep. K > 1 (dense batches,
      single pass; varlen input and segments ignore it) cuts the token chunks into K phases
      (:func:`phase_bounds`) and launches prep 0, sweep 0, prep 1, sweep 1, ...: the prep of phase
      i + 1 runs beside the sweep of phase i, on the SMs that sweep leaves free (few sequence-head
      pairs). Same results, bit for bit, as one phase. The overlap comes from programmatic
      launches, which a kept plan makes from its second call on (:func:`run_chunk_delta`; the
      public ops keep one per call signature): this function plans anew at every call, so its
      launches go through Triton's JIT and the phases run one after another.

    This plans and runs in one go (:func:`plan_chunk_delta`, :func:`run_chunk_delta`); the public
    ops keep the plan of each call signature and only run it.

    Reads no device value on the host and sizes nothing from data: capturable in a CUDA graph.
    Scratch: ``wy`` and ``aqk`` (``[B, T*M, HV, 64]`` in the input dtype) and the per-row
    coefficients (``coef [B*T*M // 64 + N, HV, 64, 4]`` float32, by chunk), all written by the prep
    kernel before the sweep reads them;
    with segments, ``[B, P, HV, K, V]`` and ``[B, P, HV, K, K]`` float32 (segment states, transitions).
    Returns ``(o, final_state or None[, chunk_states])``; with a cache, the final state is ``state``.
    """
    plan = plan_chunk_delta(
        q, k, v, g, beta, num_householder=num_householder, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens, chunk_indices_dp=chunk_indices_dp, chunk_offsets=chunk_offsets,
        num_chunk_rows=num_chunk_rows, state=state, state_indices=state_indices,
        return_chunk_states=return_chunk_states, block_v=block_v, num_warps=num_warps, num_stages=num_stages,
        prep_warps=prep_warps, stages=stages, segments=segments, inverse_fp16=inverse_fp16,
        v_product=v_product, tma_store=tma_store, phases=phases, prep_maxnreg=prep_maxnreg)
    return run_chunk_delta(plan, (q, k, v, g, beta, initial_state, state, state_indices, cu_seqlens,
                                  chunk_indices_dp, chunk_offsets))
