"""The WY inverse of a 64-row chunk on small products through shared memory, in Gluon (one
warpgroup): Tinv = (I + A)^-1 for a strictly lower A, fp16 operands and float32 sums, for chunks
whose steps are all contractions (0 <= beta_i |k_i|^2 <= 2, so every partial inverse is bounded
by 1). The Triton twin is ``recurscan.kernels.delta.common._wy_inverse`` (block doubling on the
whole tile, its levels up to 16 rows split as a batch): the same inverse, another association of
its sums. Used by the fused prefill (kernels/gluon/delta_fused.py) and the prep prototype
(benchmarks/gluon_prep_proto.py).

The doubling: the diagonal 16 x 16 blocks D_1..D_4 taken out of A in registers and inverted as a
batch on mma.sync (three levels), then X_21 = -D_2 A_21 D_1 and X_43 = -D_4 A_43 D_3 (a batch of
two) and X_BA = -D_B A_BA D_A ([32, 32]) through swizzled shared memory, each block written into
Tinv's [64, 64] tile there and read back once.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2


@gluon.jit
def _diagonal_blocks(x):
    """The one 16 x 16 block of each block row of ``x [64, 64]`` where x is not zero (the diagonal
    blocks, or those just below them) as a batch [4, 16, 16]: a sum over the column blocks of the
    reshaped tile, each thread's own (the wgmma layout gives a thread columns of every block)."""
    return gl.sum(gl.reshape(x, [4, 16, 4, 16]), axis=2)


@gluon.jit
def _small(a, b, layout: gl.constexpr):
    """a b for square (batches of) tiles in registers, on mma.sync in ``layout`` (NVMMA v2), fp16
    operands, float32 sums."""
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=layout, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=layout, k_width=2)
    return mma_v2(gl.convert_layout(a.to(gl.float16), a_op), gl.convert_layout(b.to(gl.float16), b_op),
                  gl.zeros(b.shape, gl.float32, layout))


@gluon.jit
def _small_smem(a_s, b, layout: gl.constexpr, SHAPE: gl.constexpr, B_SHARED: gl.constexpr):
    """a b for a square fp16 operand ``a_s`` in shared memory (a view) and ``b`` in shared memory
    (B_SHARED) or in registers, both of SHAPE, on mma.sync in ``layout``."""
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=layout, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=layout, k_width=2)
    if B_SHARED:
        b_val = b.load(b_op)
    else:
        b_val = gl.convert_layout(b.to(gl.float16), b_op)
    return mma_v2(a_s.load(a_op), b_val, gl.zeros(SHAPE, gl.float32, layout))


@gluon.jit
def inverse_on_blocks(A, r, c, d_s, b_s, a_s, t_s, x_s, mma: gl.constexpr, ZERO_UPPER: gl.constexpr,
                      D_GIVEN: gl.constexpr = False):
    """Tinv = (I + A)^-1 [64, 64] in ``mma`` (NVMMA v3, one warpgroup) for a strictly lower ``A`` in
    ``mma`` with rows ``r`` [64, 1] and columns ``c`` [1, 64], fp16 operands and float32 sums (the
    doubling needs every step a contraction): the diagonal blocks D_1..D_4 taken out of A in
    registers and inverted as a [4, 16, 16] batch on mma.sync (three doubling levels); then through
    shared memory X_21 = -D_2 A_21 D_1 and X_43 = -D_4 A_43 D_3 (a batch of two) and X_BA = -D_B
    A_BA D_A ([32, 32]), each block written to ``t_s``, Tinv's [64, 64] tile, whose blocks above the
    diagonal are zeroed here (ZERO_UPPER) or were by the caller once; read back once. Scratch:
    ``d_s``, ``b_s`` [4, 16, 16], ``a_s`` [64, 64], ``x_s`` [2, 16, 16], fp16 (swizzled, or every
    operand load meets in one bank). D_GIVEN: the diagonal blocks' inverses are already in ``d_s``
    (the three levels skipped: the fused kernel's D_FROM_PASS, and its timing probe 1); then only
    A's blocks below the diagonal blocks are read (A need not be masked above them), and the pairs'
    A_21 and A_43 are copied from ``a_s`` into ``b_s`` (2 elements a thread each) rather than taken
    out of A in registers (~85 instructions of masks and sums)."""
    batch4: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1], instr_shape=[1, 16, 8])
    batch2: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[2, 1, 2], instr_shape=[1, 16, 8])
    tile32: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[2, 2], instr_shape=[16, 8])
    blk16: gl.constexpr = gl.BlockedLayout([1, 2], [16, 2], [1, 4], [1, 0])  # a [16, 16] block's copy
    eye = r == c
    same = (r >> 4) == (c >> 4)
    if not D_GIVEN:
        D = _diagonal_blocks(gl.where(same, gl.where(eye, 1.0, 0.0) - gl.where((r ^ c) == 1, A, 0.0), 0.0))
        D = gl.convert_layout(D, batch4)
        for lvl in gl.static_range(1, 4):
            A_s = _diagonal_blocks(gl.where(((r >> lvl) ^ (c >> lvl)) == 1, A, 0.0))
            D = D - _small(D, _small(A_s, D, batch4), batch4)
        d_s.store(D.to(gl.float16))
    if not D_GIVEN:
        below = _diagonal_blocks(gl.where((r >> 4) == (c >> 4) + 1, A, 0.0))  # block w: A's (w, w - 1)
        b_s.store(below.to(gl.float16))
    a_s.store(A.to(gl.float16))
    if ZERO_UPPER:
        t_s.store(gl.zeros([64, 64], gl.float16, mma))
    gl.thread_barrier()
    if D_GIVEN:  # A_21 and A_43 (b_s's blocks 1 and 3, the pairs' products') copied from a_s: 2 elements a thread each
        for p in gl.static_range(2):
            b_s.reshape([64, 16]).slice(16 * (2 * p + 1), 16, 0).store(
                a_s.slice(32 * p + 16, 16, 0).slice(32 * p, 16, 1).load(blk16))
        gl.thread_barrier()
    # 16 -> 32: the batch of the pairs (D_2, A_21, D_1) and (D_4, A_43, D_3)
    d_pairs = d_s.reshape([2, 32, 16])
    a_pairs = b_s.reshape([2, 32, 16])
    X = _small_smem(a_pairs.slice(16, 16, 1), d_pairs.slice(0, 16, 1), batch2, [2, 16, 16], True)
    X = -_small_smem(d_pairs.slice(16, 16, 1), X, batch2, [2, 16, 16], False)
    x_s.store(X.to(gl.float16))
    for w in gl.static_range(4):  # D_1..D_4 on the diagonal of Tinv
        t_s.slice(16 * w, 16, 0).slice(16 * w, 16, 1).store(d_s.reshape([64, 16]).slice(16 * w, 16, 0).load(blk16))
    gl.thread_barrier()
    for p in gl.static_range(2):  # X_21, X_43 below them
        t_s.slice(32 * p + 16, 16, 0).slice(32 * p, 16, 1).store(x_s.reshape([32, 16]).slice(16 * p, 16, 0).load(blk16))
    gl.thread_barrier()
    # 32 -> 64: X_BA = -D_B A_BA D_A
    Y = _small_smem(a_s.slice(32, 32, 0).slice(0, 32, 1), t_s.slice(0, 32, 0).slice(0, 32, 1), tile32, [32, 32], True)
    X_BA = -_small_smem(t_s.slice(32, 32, 0).slice(32, 32, 1), Y, tile32, [32, 32], False)
    gl.thread_barrier()  # every warp has read D_A (the lower-left block is written next)
    t_s.slice(32, 32, 0).slice(0, 32, 1).store(X_BA.to(gl.float16))
    gl.thread_barrier()
    return t_s.load(mma)
