"""The delta rule's prep (each chunk's wy, aqk and row coefficients) as a warp-specialised Gluon
kernel, GPU only (sm_90). Its twin is ``recurscan.kernels.delta.prep.chunk_delta_prep_kernel``
(the same quantities in the same buffers, for the same sweep; the inverse associated as
``kernels/gluon/wy_inverse.py`` does, so within fp16's rounding of it, not the same bits). Its
arithmetic is the fused prefill's prep (``kernels/gluon/delta_fused.py``), here written out to
memory for the Triton sweep instead of handed to chains in shared memory.

Why: the Triton prep's program loads its tiles, forms its vectors and takes its inverse on one
path, 3.9 us of SM-time a (chunk, value head) at B1 T16384 HV32; the fused kernel's prep
warpgroup, its tiles brought a chunk ahead by a load warp and its vectors laid out by the
pre-pass (``kernels/delta/chunk_vectors.py``), takes ~2.6 us a chunk alone on an SM. With two
such programs an SM the prep's SM-time a chunk is what this kernel measures against the twin's.

One program per (sequence, run of CHUNKS consecutive chunks, value head), two partitions:

1. **loads** (one warp): each chunk's k and q tiles and its vectors by bulk copies through
   descriptors over the program's own sequence (a partial last chunk reads zeros past its end)
   into a two-stage ring, a stage once the prep freed it.
2. **prep** (one warpgroup): K K^T and Q K^T on wgmma; the coefficients (lam rk, lam rq, gam rk,
   and lam_last on row 0) stored from registers; aqk = G o (rq Q K^T rk) and wy = (G o Tinv)
   diag(beta) through one staging buffer each by bulk stores, which stop at the sequence's end.

Scope: GDN (M = 1), l2norm, 16-bit q and k, K = 128, a decay and beta per head, dense (B
sequences of T tokens), inference (no Tinv kept for a backward). A chunk the pre-pass marked
(NaN decays: a non-finite input, beta < 0, a step that is no contraction) gets NaN-laden
outputs here; the twin's answer for it is its own (launch/ decides who writes those chunks).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .wy_inverse import inverse_on_blocks

BT = 64
NUM_STAGES = 2
#: Registers a thread of the prep warpgroup (the default partition) and of the load warp's
#: warpgroup (setmaxnreg): the launch's MAXNREG over 256 threads (the load warp padded to its
#: warpgroup), 128 x 256 = 232 x 128 + 24 x 128. Two programs share an SM (their shared memory,
#: 106 KB each, allows no third), and so its whole register file; at 168 the prep spilled.
PREP_REGS = 232
LOAD_REGS = 24
MAXNREG = 128
#: Chunks a program: its first waits for its tiles; the rest come while the chunk before runs.
CHUNKS = 8


@gluon.jit
def _prep_loads(k_desc, q_desc, gv_desc, k_s, q_s, gv_s, ready, empty, col_qk, t0, vec0, n_mine,
                HV: gl.constexpr, BT: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The load warp: the program's chunk j (chunk t0 + j of its sequence) k, q tiles and vectors
    (at ``vec0 + j HV 4 BT`` floats) into stage j % NUM_STAGES once the prep freed it."""
    nbytes: gl.constexpr = k_desc.block_type.nbytes + q_desc.block_type.nbytes + gv_desc.block_type.nbytes
    for j in range(n_mine):
        s = j % NUM_STAGES
        bar = ready.index(s)
        mbarrier.wait(empty.index(s), ((j // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(bar, nbytes)
        r = (t0 + j) * BT
        tma.async_copy_global_to_shared(k_desc, [r, col_qk], bar, k_s.index(s))
        tma.async_copy_global_to_shared(q_desc, [r, col_qk], bar, q_s.index(s))
        tma.async_copy_global_to_shared(gv_desc, [vec0 + j * (HV * 4 * BT)], bar, gv_s.index(s))


@gluon.jit
def _prep_chunks(k_s, q_s, gv_s, out_s, cf_s, d_s, b_s, a_s, t_s, x_s, ready, empty, wy_desc, aqk_desc, cf_desc,
                 scale, t0, coef0, col_out, n_mine, HV: gl.constexpr, BT: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The prep warpgroup: for the program's chunk j (chunk t0 + j of its sequence), aqk and wy by
    bulk stores at the chunk's rows, columns ``col_out`` (stopping at the sequence's end), and its
    coefficients, [BT, 4] floats (lam rk, lam rq, gam rk, lam_last), by a bulk store at ``coef0 + j
    HV BT 4`` floats (the chunk's own slot: rows past the sequence's end hold a zero key's)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    rowv: gl.constexpr = gl.SliceLayout(1, mma)
    colv: gl.constexpr = gl.SliceLayout(0, mma)
    one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    DT: gl.constexpr = k_s.dtype
    cf_flat = cf_s._reinterpret(gl.float32, [4 * BT], cf_desc.layout)
    o_t = gl.arange(0, BT, layout=rowv)
    o_c = gl.arange(0, BT, layout=colv)
    r = o_t[:, None]
    c = o_c[None, :]
    causal = r >= c
    zero = gl.zeros([BT, BT], gl.float32, mma)
    # Tinv's blocks above the diagonal, never written: zeroed once (the loop's first barrier orders it)
    t_s.store(gl.zeros([BT, BT], gl.float16, mma))
    for j in range(n_mine):
        s = j % NUM_STAGES
        mbarrier.wait(ready.index(s), (j // NUM_STAGES) & 1)
        ks = k_s.index(s)
        kk = warpgroup_mma(ks, ks.permute((1, 0)), zero, is_async=True)
        qk = warpgroup_mma(q_s.index(s), ks.permute((1, 0)), zero, is_async=True)
        kk, qk = warpgroup_mma_wait(num_outstanding=0, deps=(kk, qk))

        gv = gv_s.index(s)
        gc_last = gl.sum(gv.slice(BT - 1, 1).load(one), axis=0)  # the decay across the chunk's rows
        gc = gv.slice(0, BT).load(rowv)
        gc_c = gv.slice(0, BT).load(colv)
        b_beta = gv.slice(BT, BT).load(rowv)
        beta_c = gv.slice(BT, BT).load(colv)
        rk = gv.slice(2 * BT, BT).load(rowv)
        rk_c = gv.slice(2 * BT, BT).load(colv)
        rq = gv.slice(3 * BT, BT).load(rowv) * scale
        gl.thread_barrier()  # every warp has read the stage
        mbarrier.arrive(empty.index(s), count=1)

        lam = gl.exp2(gc)
        G = gl.where(causal, gl.exp2(gc[:, None] - gc_c[None, :]), 0.0)
        tma.store_wait(pendings=0)  # the chunk before's tiles have left the staging buffers
        # the chunk's [BT, 4] coefficient rows (lam_last on every row; the sweep reads row 0's)
        cf = gl.join(gl.join(lam * rk, gl.exp2(gc_last - gc) * rk), gl.join(lam * rq, lam * 0.0 + gl.exp2(gc_last)))
        cf_s.store(gl.reshape(cf, [BT, 4]))
        out_s.index(0).store((G * qk * rq[:, None] * rk_c[None, :]).to(DT))
        Gb = (G * beta_c[None, :]).to(gl.float16)
        # the inverse: A = diag(beta) strictLower(K K^T) for normalised keys
        A = gl.where(r > c, kk * (b_beta * rk)[:, None] * rk_c[None, :], 0.0)
        Tinv = inverse_on_blocks(A, r, c, d_s, b_s, a_s, t_s, x_s, mma, False)
        out_s.index(1).store((Gb.to(gl.float32) * Tinv.to(gl.float32)).to(DT))
        fence_async_shared()
        gl.thread_barrier()  # every warp's tiles written before the bulk stores read them
        row = (t0 + j) * BT
        tma.async_copy_shared_to_global(aqk_desc, [row, col_out], out_s.index(0))
        tma.async_copy_shared_to_global(wy_desc, [row, col_out], out_s.index(1))
        tma.async_copy_shared_to_global(cf_desc, [coef0 + j * (HV * BT * 4)], cf_flat)
    tma.store_wait(pendings=0)


@gluon.jit
def gluon_prep_kernel(q, k, vec, wy, aqk, coef, scale, T, n_vec,
                      H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, BT: gl.constexpr,
                      NUM_STAGES: gl.constexpr, CHUNKS: gl.constexpr, LOAD_REGS: gl.constexpr):
    """Grid (B * ceil(ceil(T / BT) / CHUNKS) * HV,): program -> (sequence, run of CHUNKS chunks,
    value head), the head fastest. ``q, k [B, T, H, K]`` contiguous, 16-bit; ``vec`` the pre-pass's
    vectors (kernels/delta/chunk_vectors.py), ``n_vec`` floats (< 2^31). Writes, as the twin:
    ``wy, aqk [B * T, HV, BT]`` in q's dtype (rows of the token stream, zeros above the diagonal)
    and ``coef [slots, HV, BT, 4]`` float32 (slot = the chunk's ``_chunk_slot``), rows past a
    sequence's end not written."""
    gl.static_assert(BT == 64 and K == 128, "chunks of 64 rows, K = 128")
    NT = (T + BT - 1) // BT
    runs = (NT + CHUNKS - 1) // CHUNKS
    pid = gl.program_id(0)
    i_hv = pid % HV
    i_run = (pid // HV) % runs
    i_n = (pid // HV) // runs
    i_h = i_hv // (HV // H)
    t0 = i_run * CHUNKS
    n_mine = gl.minimum(NT - t0, CHUNKS)
    bos = i_n.to(gl.int64) * T
    # The chunk's slot: (bos + c BT) // BT + n = bos // BT + n + c, so chunk t0 + j's vectors and
    # coefficients start j HV 4 BT floats after the run's first (int32: the launch checks n_vec).
    slot0 = (bos // BT + i_n + t0).to(gl.int32)
    vec0 = (slot0 * HV + i_hv) * (4 * BT)
    DT: gl.constexpr = k.dtype.element_ty
    rows = gl.maximum(T, 1)
    l_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], DT)
    l_tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], DT)
    l_gv: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
    k_desc = tma.make_tensor_descriptor(k + bos * (H * K), [rows, H * K], [H * K, 1], [BT, K], l_qk)
    q_desc = tma.make_tensor_descriptor(q + bos * (H * K), [rows, H * K], [H * K, 1], [BT, K], l_qk)
    wy_desc = tma.make_tensor_descriptor(wy + bos * (HV * BT), [rows, HV * BT], [HV * BT, 1], [BT, BT], l_tt)
    aqk_desc = tma.make_tensor_descriptor(aqk + bos * (HV * BT), [rows, HV * BT], [HV * BT, 1], [BT, BT], l_tt)
    gv_desc = tma.make_tensor_descriptor(vec, [n_vec], [1], [4 * BT], l_gv)
    cf_desc = tma.make_tensor_descriptor(coef, [n_vec], [1], [4 * BT], l_gv)

    k_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], l_qk)
    q_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], l_qk)
    gv_s = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, 4 * BT], l_gv)
    out_s = gl.allocate_shared_memory(DT, [2, BT, BT], l_tt)  # aqk, wy
    cf_s = gl.allocate_shared_memory(gl.float32, [BT, 4], gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1,
                                                                                 order=[1, 0]))
    # The inverse's scratch, swizzled as the fused kernel's (kernels/gluon/delta_fused.py).
    swz2: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    swz3: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=4, max_phase=2, order=[2, 1, 0])
    d_s = gl.allocate_shared_memory(gl.float16, [4, 16, 16], swz3)
    b_s = gl.allocate_shared_memory(gl.float16, [4, 16, 16], swz3)
    a_s = gl.allocate_shared_memory(gl.float16, [BT, BT], swz2)
    t_s = gl.allocate_shared_memory(gl.float16, [BT, BT], swz2)
    x_s = gl.allocate_shared_memory(gl.float16, [2, 16, 16], swz3)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()

    coef0 = vec0  # a chunk's coefficients, [BT, 4] floats, sit where its vectors, [4, BT], do
    gl.warp_specialize([
        (_prep_chunks, (k_s, q_s, gv_s, out_s, cf_s, d_s, b_s, a_s, t_s, x_s, ready, empty, wy_desc, aqk_desc,
                        cf_desc, scale, t0, coef0, i_hv * BT, n_mine, HV, BT, NUM_STAGES)),
        (_prep_loads, (k_desc, q_desc, gv_desc, k_s, q_s, gv_s, ready, empty, i_h * K, t0, vec0, n_mine, HV, BT,
                       NUM_STAGES)),
    ], [1], [LOAD_REGS])
