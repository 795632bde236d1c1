"""Training Mamba2 SSD on the Triton path: the output's parts outside the recurrence,
y = (o + D x) silu(z), as one elementwise kernel each way (kernels/gla/ssd_gate.py) rather than a
chain of float32 PyTorch operations whose intermediates autograd keeps. ``reference.ssd.skip_and_gate``
is the form it is checked against (tests/test_kernels_ssd.py)."""
from __future__ import annotations

import torch
import triton

from ..kernels.gla.ssd_gate import ssd_gate_bwd_kernel, ssd_gate_fwd_kernel

ROWS_PER_PROGRAM = 64


def _grid(o):
    H, P = o.shape[-2:]
    rows = o.numel() // (H * P)
    return rows, H, P, (triton.cdiv(rows, ROWS_PER_PROGRAM), H)


def _flags(D, z, P):
    return dict(BR=ROWS_PER_PROGRAM, BP=max(16, triton.next_power_of_2(P)), HAS_D=D is not None,
                D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_Z=z is not None)


class SkipAndGate(torch.autograd.Function):
    """``apply(o, x, D, z) -> y``: o, x, z ``[..., H, P]`` (z or D may be None), D ``[H]`` or
    ``[H, P]``; y in o's dtype. Saved for the backward: o, x, D, z themselves (no copies)."""

    @staticmethod
    def forward(ctx, o, x, D, z):
        o, x = o.contiguous(), x.contiguous()
        D = None if D is None else D.contiguous()
        z = None if z is None else z.contiguous()
        rows, H, P, grid = _grid(o)
        y = torch.empty_like(o)
        ssd_gate_fwd_kernel[grid](o, x, o if D is None else D, o if z is None else z, y, rows, H=H, P=P,
                                  **_flags(D, z, P))
        ctx.save_for_backward(o, x, D, z)
        return y

    @staticmethod
    def backward(ctx, dy):
        o, x, D, z = ctx.saved_tensors
        dy = dy.contiguous()
        rows, H, P, grid = _grid(o)
        do = torch.empty_like(o)
        dx = torch.empty_like(x) if D is not None else None
        dz = torch.empty_like(z) if z is not None else None
        part = torch.zeros(grid[0], H, P, dtype=torch.float32, device=o.device) if D is not None else None
        ssd_gate_bwd_kernel[grid](dy, o, x, o if D is None else D, o if z is None else z, do,
                                  o if dx is None else dx, o if dz is None else dz, o if part is None else part,
                                  rows, H=H, P=P, **_flags(D, z, P))
        dD = None
        if D is not None:
            dD = part.sum(0) if D.dim() == 2 else part[..., 0].sum(0)
            dD = dD.to(D.dtype)
        return do, dx, dD, dz
