"""The elementwise parts of training Mamba2 SSD (autograd/ssd.py's SsdChunkScan) outside the
recurrence's kernels, one pass each: the gate y = u silu(z) on the recurrence's u = o + D x and
its backward; the values v = dt x for the backward's stages. ``reference.ssd.skip_and_gate`` is
the form to check the gate against. The forward's v = dt x and skip D x are in the delta sweep's
prep and output store (as inference's are, and the gate too there); x's, dt's and D's gradients
in the GLA backward's reverse sweep (kernels/gla/backward.py, SSD)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile(rows_block, i_h, n_rows, H: tl.constexpr, P: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr):
    """Offsets and mask of a [BR, BP] tile of head i_h of a contiguous [n_rows, H, P] tensor."""
    o_r = rows_block * BR + tl.arange(0, BR).to(tl.int64)
    o_p = tl.arange(0, BP)
    mask = (o_r < n_rows)[:, None] & (o_p < P)[None, :]
    return (o_r * H + i_h)[:, None] * P + o_p[None, :], mask


@triton.jit
def ssd_gate_fwd_kernel(u, z, y, n_rows, H: tl.constexpr, P: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr):
    """Grid (ceil(n_rows / BR), H): the gate y = u silu(z) over rows (batch x tokens) of one head,
    u = o + D x as the recurrence's kernel stores it; float32 inside, y in its own dtype."""
    offs, mask = _tile(tl.program_id(0), tl.program_id(1), n_rows, H, P, BR, BP)
    b_z = tl.load(z + offs, mask=mask, other=0.0).to(tl.float32)
    b_y = tl.load(u + offs, mask=mask, other=0.0).to(tl.float32) * (b_z * tl.sigmoid(b_z))
    tl.store(y + offs, b_y.to(y.dtype.element_ty), mask=mask)


@triton.jit
def ssd_gate_bwd_kernel(dy, u, z, du, dz, n_rows, H: tl.constexpr, P: tl.constexpr, BR: tl.constexpr,
                        BP: tl.constexpr):
    """Grid (ceil(n_rows / BR), H): the gate's gradients, with s = sigmoid(z),

        du = dy z s,   dz = dy u s (1 + z (1 - s)),

    each in its tensor's dtype."""
    offs, mask = _tile(tl.program_id(0), tl.program_id(1), n_rows, H, P, BR, BP)
    b_dy = tl.load(dy + offs, mask=mask, other=0.0).to(tl.float32)
    b_z = tl.load(z + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(b_z)
    tl.store(du + offs, (b_dy * (b_z * sig)).to(du.dtype.element_ty), mask=mask)
    b_u = tl.load(u + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(dz + offs, (b_dy * b_u * sig * (1.0 + b_z * (1.0 - sig))).to(dz.dtype.element_ty), mask=mask)


@triton.jit
def ssd_value_kernel(x, step, v, n_rows, H: tl.constexpr, P: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr):
    """Grid (ceil(n_rows / BR), H): the recurrence's values v = dt x (float32 inside, v in its
    own dtype), step ``[n_rows, H]`` float32."""
    offs, mask = _tile(tl.program_id(0), tl.program_id(1), n_rows, H, P, BR, BP)
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    b_step = tl.load(step + o_r * H + tl.program_id(1), mask=o_r < n_rows, other=0.0)
    b_x = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(v + offs, (b_x * b_step[:, None]).to(v.dtype.element_ty), mask=mask)
