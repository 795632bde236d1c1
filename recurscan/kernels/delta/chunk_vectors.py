"""The fused prefill's pre-pass (kernels/gluon/delta_fused.py): each chunk's row vectors, laid out
so that the fused kernel's load warp brings them beside the chunk's tiles in one bulk copy and its
prep moves no vector between layouts. One read of q and k per (chunk, query/key head).

Per chunk and value head, ``vec[slot, hv, 0:4, 0:64]`` float32 (slot = ``_chunk_slot``, as the
prep's ``coef``):

    row 0  gc    the cumulative log decay within the chunk, in log2 units (g * log2(e), summed)
    row 1  beta
    row 2  rk    1 / sqrt(|k|^2 + 1e-6), the key's l2norm factor
    row 3  rq    the query's (without the scale)

With DINV (the fused kernel's D_FROM_PASS, ``plan.delta.FUSED_DIAGONAL_FROM_PASS``) the pass also
writes ``dinv[slot, hv, 0:64, 0:16]`` float16: row i holds row i % 16 of D_w = (I + A_ww)^-1, the
inverse of diagonal block w = i // 16 of the WY matrix I + A, A = diag(beta) strictLower(K K^T) for
the normalised keys: the first step of the fused prep's inverse (kernels/gluon/wy_inverse.py's
three doubling levels on a [4, 16, 16] batch, fp16 operands and float32 sums, the same association;
K K^T's diagonal blocks formed here on their own, so not bit for bit the prep's), taken off the
fused kernel's chunk period.

Rows past the sequence's end hold g = 0 (so gc stays at the last row's: gc[63] is the decay
across the chunk's rows), beta = 0, and the factors of a zero key and query.

A chunk the fused kernel must not compute gets gc = NaN throughout: any row with a non-finite
decay (a reset, g = -inf, among them), beta or key, or with a step that is not a contraction
(beta < 0 or beta |k|^2 > 2 for the normalised key, where its fp16 inverse could overflow). NaN in
gc reaches the chunk's decay across it and so the state; the program's non-finite state flags it,
and the token loop computes its sequence and head again (launch/delta.py). The Triton prep's
answer for such chunks (a tf32 inverse, bad rows selected out) is the token loop's within the
oracle's tolerance, so the flagged programs get the same outputs either way.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import _chunk_slot, _prep_chunk

#: Rows of a chunk's vectors (gc, beta, rk, rq).
VECTOR_ROWS = 4


def chunk_vectors_grid(n_prep: int, H: int) -> tuple[int]:
    """The pass's grid: one program a (chunk, query/key head), the head fastest, so that the
    programs resident together read whole rows of q and k (a token's H heads are adjacent in
    memory) rather than one head's 256 bytes of every row; one dimension, so that no grid limit
    binds the chunk count."""
    return (n_prep * H,)


@triton.jit
def _small(a, b):
    """a b for batches of square tiles: fp16 operands, float32 sums (the fused prep's mma.sync)."""
    return tl.dot(a.to(tl.float16), b.to(tl.float16))


@triton.jit
def _diagonal_inverses(A, i, j):
    """(I + A_w)^-1 for a batch of strictly lower 16 x 16 blocks ``A [W, 16, 16]`` (rows ``i``,
    columns ``j`` of a block): 2 x 2 blocks inverted exactly, then three doubling levels
    D <- D - D A_s D (wy_inverse.py's inverse_on_blocks, the same association)."""
    D = tl.where(i == j, 1.0, 0.0) - tl.where((i ^ j) == 1, A, 0.0)
    for lvl in tl.static_range(1, 4):
        D = D - _small(D, _small(tl.where(((i >> lvl) ^ (j >> lvl)) == 1, A, 0.0), D))
    return D


@triton.jit(do_not_specialize=["n_seq"])
def chunk_vectors_kernel(q, k, g, beta, vec, cu_seqlens, chunk_indices, T, n_seq,
                         H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                         IS_VARLEN: tl.constexpr, HAS_G: tl.constexpr, DINV: tl.constexpr = False, dinv=None,
                         KK_DT: tl.constexpr = tl.float32):
    """Grid :func:`chunk_vectors_grid`: program -> (chunk, query/key head), writing the vectors of
    the chunk's HV / H value heads (the module docstring). q, k ``[B, T, H, K]``, g, beta ``[B, T,
    HV]`` contiguous (HAS_G False: no decay, g unread; varlen: B = 1, ``chunk_indices [NT_pad, 2]``
    (sequence, chunk), padding rows skipped); K a power of two. DINV: also ``dinv`` (the module
    docstring; else unread), K K^T's diagonal blocks from ``KK_DT`` operands (the keys' dtype on the
    GPU; float32 under the interpreter, whose 16-bit products are not the GPU's).

    Every load is issued before the first reduction: the group's decays and betas as one [BT,
    group] tile each (a scan synchronises the warps, and no load moves across it)."""
    pid = tl.program_id(0).to(tl.int64)
    i_c = pid // H
    i_h = (pid % H).to(tl.int32)
    valid, i_n, i_t, bos, eos = _prep_chunk(cu_seqlens, chunk_indices, cu_seqlens, i_c, i_h < 0, T, n_seq, 0,
                                            tl.cdiv(T, BT), 1, BT, IS_VARLEN)
    if not valid:
        return
    GROUP: tl.constexpr = HV // H
    GP: tl.constexpr = triton.next_power_of_2(GROUP)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_g = tl.arange(0, GP)
    rows = bos + i_t * BT + o_t
    live = rows < eos
    m_g = live[:, None] & (o_g < GROUP)[None, :]
    p_hv = rows[:, None] * HV + i_h * GROUP + o_g[None, :]  # [BT, GP]: the group's value heads
    # the keys as W blocks of 16 rows: their squares' sums here, the diagonal blocks' products below
    W: tl.constexpr = BT // 16
    k_w = tl.load(k + (tl.reshape(rows, [W, 16]) * H + i_h)[:, :, None] * K + o_k[None, None, :],
                  mask=tl.reshape(live, [W, 16])[:, :, None], other=0.0)
    b_q = tl.load(q + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    if HAS_G:
        b_g = tl.load(g + p_hv, mask=m_g, other=0.0).to(tl.float32)
    else:
        b_g = tl.zeros([BT, GP], tl.float32)
    b_beta = tl.load(beta + p_hv, mask=m_g, other=0.0).to(tl.float32)
    k_f = k_w.to(tl.float32)
    k_sq = tl.reshape(tl.sum(k_f * k_f, axis=2), [BT])
    rq = tl.rsqrt(tl.sum(b_q * b_q, axis=1) + 1e-6)
    rk = tl.rsqrt(k_sq + 1e-6)
    k_bad = k_sq * 0.0 != 0.0
    bad = k_bad[:, None] | (b_g * 0.0 != 0.0) | (b_beta * 0.0 != 0.0) | (b_beta < 0.0) | \
        (b_beta * (k_sq * rk * rk)[:, None] > 2.0)
    gc = tl.cumsum(b_g, axis=0) * 1.4426950408889634
    gc = tl.where((tl.max(bad.to(tl.int32), axis=0) != 0)[None, :], float("nan"), gc)
    slot = _chunk_slot(bos, i_t, i_n, BT)
    p = vec + ((slot * HV + i_h * GROUP + o_g) * (4 * BT))[None, :] + o_t[:, None]  # [BT, GP]
    m_v = (o_g < GROUP)[None, :] & (o_t >= 0)[:, None]
    tl.store(p, gc, mask=m_v)
    tl.store(p + BT, b_beta, mask=m_v)
    tl.store(p + 2 * BT, tl.zeros([BT, GP], tl.float32) + rk[:, None], mask=m_v)
    tl.store(p + 3 * BT, tl.zeros([BT, GP], tl.float32) + rq[:, None], mask=m_v)
    if DINV:
        # K K^T's diagonal blocks [W, 16, 16] alone (no [BT, BT] tile)
        k_d = k_w.to(KK_DT)
        kk = tl.dot(k_d, tl.trans(k_d, (0, 2, 1)))  # the keys' own 16-bit products, float32 sums
        i = tl.arange(0, 16)[None, :, None]
        j = tl.arange(0, 16)[None, None, :]
        rk_j = tl.reshape(rk, [W, 16])[:, None, :]
        o_d = tl.arange(0, 16)
        for i_g in tl.static_range(GROUP):
            b_beta_g = tl.sum(tl.where((o_g == i_g)[None, :], b_beta, 0.0), axis=1)
            A = tl.where(i > j, kk * tl.reshape(b_beta_g * rk, [W, 16])[:, :, None] * rk_j, 0.0)
            D = tl.reshape(_diagonal_inverses(A, i, j), [BT, 16])
            p_d = dinv + ((slot * HV + i_h * GROUP + i_g) * BT + o_t)[:, None] * 16 + o_d[None, :]
            tl.store(p_d, D.to(tl.float16))
