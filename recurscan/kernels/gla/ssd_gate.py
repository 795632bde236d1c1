"""The elementwise parts of training Mamba2 SSD (autograd/ssd.py's SsdChunkScan) outside the
recurrence's kernels, one pass each: the gate y = u silu(z) on the recurrence's u = o + D x and
its backward; the values v = dt x for the backward's stages; x's, dt's and D's gradients through
v, the log decay and the skip. ``reference.ssd.skip_and_gate`` is the form to check them against.
The forward's v = dt x and skip D x are in the delta sweep's prep and output store (as inference's
are, and the gate too there)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile(rows_block, i_h, n_rows, H: tl.constexpr, P: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr):
    """Offsets and mask of a [BR, BP] tile of head i_h of a contiguous [n_rows, H, P] tensor, and
    the tile's column indices."""
    o_r = rows_block * BR + tl.arange(0, BR).to(tl.int64)
    o_p = tl.arange(0, BP)
    mask = (o_r < n_rows)[:, None] & (o_p < P)[None, :]
    return (o_r * H + i_h)[:, None] * P + o_p[None, :], mask, o_p


@triton.jit
def _skip(D, i_h, o_p, P: tl.constexpr, D_PER_CHANNEL: tl.constexpr):
    """D of head i_h as a [1, BP] row (per channel) or a scalar (per head)."""
    if D_PER_CHANNEL:
        d = tl.load(D + i_h * P + o_p, mask=o_p < P, other=0.0).to(tl.float32)[None, :]
    else:
        d = tl.load(D + i_h).to(tl.float32)
    return d


@triton.jit
def ssd_gate_fwd_kernel(u, z, y, n_rows, H: tl.constexpr, P: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr):
    """Grid (ceil(n_rows / BR), H): the gate y = u silu(z) over rows (batch x tokens) of one head,
    u = o + D x as the recurrence's kernel stores it; float32 inside, y in its own dtype."""
    offs, mask, _ = _tile(tl.program_id(0), tl.program_id(1), n_rows, H, P, BR, BP)
    b_z = tl.load(z + offs, mask=mask, other=0.0).to(tl.float32)
    b_y = tl.load(u + offs, mask=mask, other=0.0).to(tl.float32) * (b_z * tl.sigmoid(b_z))
    tl.store(y + offs, b_y.to(y.dtype.element_ty), mask=mask)


@triton.jit
def ssd_gate_bwd_kernel(dy, u, z, du, dz, n_rows, H: tl.constexpr, P: tl.constexpr, BR: tl.constexpr,
                        BP: tl.constexpr):
    """Grid (ceil(n_rows / BR), H): the gate's gradients, with s = sigmoid(z),

        du = dy z s,   dz = dy u s (1 + z (1 - s)),

    each in its tensor's dtype."""
    offs, mask, _ = _tile(tl.program_id(0), tl.program_id(1), n_rows, H, P, BR, BP)
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
    offs, mask, _ = _tile(tl.program_id(0), tl.program_id(1), n_rows, H, P, BR, BP)
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    b_step = tl.load(step + o_r * H + tl.program_id(1), mask=o_r < n_rows, other=0.0)
    b_x = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(v + offs, (b_x * b_step[:, None]).to(v.dtype.element_ty), mask=mask)


@triton.jit
def ssd_step_bwd_kernel(dv, x, step, dy, z, D, dg, A, dx, dstep, dD_part, n_rows, H: tl.constexpr, P: tl.constexpr,
                        BR: tl.constexpr, BP: tl.constexpr, HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr,
                        HAS_Z: tl.constexpr):
    """Grid (ceil(n_rows / BR), H): x's and dt's gradients through v = dt x and the log decay
    dt A, with the skip's share of x's (D dy silu(z), formed from dy and z in float32 rather than
    kept), and the skip's own: in float32, each rounded once,

        dx = dv dt + D dy silu(z),    ddt = sum over P of dv x + dg A,
        dD = sum over rows (and over P for D per head) of dy silu(z) x,

    dv ``[n_rows, H, P]`` and dg ``[n_rows, H]`` float32 (the recurrence's backward), dstep
    ``[n_rows, H]`` float32, dD as this program's partial sum, ``dD_part [ceil(n_rows / BR), H,
    P]`` float32 (per head: in column 0)."""
    i_h = tl.program_id(1)
    offs, mask, o_p = _tile(tl.program_id(0), i_h, n_rows, H, P, BR, BP)
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    m_r = o_r < n_rows
    b_step = tl.load(step + o_r * H + i_h, mask=m_r, other=0.0)
    b_dv = tl.load(dv + offs, mask=mask, other=0.0)
    b_x = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
    b_dx = b_dv * b_step[:, None]
    if HAS_D:
        b_dys = tl.load(dy + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_Z:
            b_z = tl.load(z + offs, mask=mask, other=0.0).to(tl.float32)
            b_dys = b_dys * (b_z * tl.sigmoid(b_z))
        b_dx += _skip(D, i_h, o_p, P, D_PER_CHANNEL) * b_dys
        part = tl.sum(b_dys * b_x, axis=0)  # [BP]
        p_part = dD_part + (tl.program_id(0).to(tl.int64) * H + i_h) * P
        if D_PER_CHANNEL:
            tl.store(p_part + o_p, part, mask=o_p < P)
        else:
            tl.store(p_part, tl.sum(part, axis=0))
    tl.store(dx + offs, b_dx.to(dx.dtype.element_ty), mask=mask)
    b_dstep = tl.sum(b_dv * b_x, axis=1) + tl.load(dg + o_r * H + i_h, mask=m_r, other=0.0) * tl.load(A + i_h)
    tl.store(dstep + o_r * H + i_h, b_dstep, mask=m_r)
