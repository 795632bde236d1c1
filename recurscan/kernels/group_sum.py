"""The sum of per-value-head gradients over each GVA group (q and k are shared by a group of value
heads, so their gradients are the group's sum), cast to the input's dtype in the same pass."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def group_sum_kernel(x, out, rows, GROUP: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr):
    """Grid (ceil(rows / BR),): ``out[r, :] = sum_j x[r * GROUP + j, :]`` for r < rows, on the
    contiguous views ``x [rows * GROUP, K]`` (float32) and ``out [rows, K]`` (out's dtype); the
    sum in float32, in the order j = 0, 1, ... (deterministic)."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_k = tl.arange(0, BK)
    m = (o_r < rows)[:, None] & (o_k < K)[None, :]
    acc = tl.zeros([BR, BK], dtype=tl.float32)
    for j in range(0, GROUP):
        acc += tl.load(x + (o_r * GROUP + j)[:, None] * K + o_k[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(out + o_r[:, None] * K + o_k[None, :], acc.to(out.dtype.element_ty), mask=m)
