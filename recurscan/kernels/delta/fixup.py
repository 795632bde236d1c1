"""The segments' sequential fix-up between the two sweep passes (dense batches cut into segments)."""
from __future__ import annotations

import triton
import triton.language as tl


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
