"""Training Mamba2 SSD on the Triton path (mamba_ssm's parameterisation), as one
``torch.autograd.Function`` around the GLA kernels: v = dt x and the log decay dt A, the recurrence
(launch/gla.py's forward and backward), and the output's parts outside it, y = (o + D x) silu(z),
as one elementwise Triton pass each way (kernels/gla/ssd_gate.py). Inside one Function, x's two
gradients (through v and through the skip) add in float32 and round once, as mamba_ssm's do; the
step sizes (dt_bias, softplus, dt_limit) stay in PyTorch before it (``[B, T, H]``, small).
``reference.ssd`` is the form it is checked against (tests/test_kernels_ssd.py)."""
from __future__ import annotations

import torch
import triton

from ..kernels.gla.ssd_gate import ssd_gate_bwd_kernel, ssd_gate_fwd_kernel, ssd_step_bwd_kernel, ssd_value_kernel
from ..launch.gla import chunk_simple_gla_bwd, chunk_simple_gla_fwd

ROWS_PER_PROGRAM = 64


def _grid(o):
    H, P = o.shape[-2:]
    rows = o.numel() // (H * P)
    return rows, H, P, (triton.cdiv(rows, ROWS_PER_PROGRAM), H)


def _flags(D, z, P):
    return dict(BR=ROWS_PER_PROGRAM, BP=max(16, triton.next_power_of_2(P)), HAS_D=D is not None,
                D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_Z=z is not None)


def gate_forward(o, x, D, z):
    """``y = (o + D x) silu(z)`` in o's dtype (float32 inside): o, x, z ``[..., H, P]`` (z or D
    may be None), D ``[H]`` or ``[H, P]``; all contiguous."""
    rows, H, P, grid = _grid(o)
    y = torch.empty_like(o)
    ssd_gate_fwd_kernel[grid](o, x, o if D is None else D, o if z is None else z, y, rows, H=H, P=P, **_flags(D, z, P))
    return y


def gate_backward(dy, o, x, D, z, with_dx=True):
    """``(do, dx, dD, dz)`` of :func:`gate_forward` for ``dy`` (None where an input is None; dx None
    without D, or where ``with_dx`` is False: :func:`step_backward` forms it with v's share): do in
    o's dtype, dx in x's, dz in z's, dD float32 from per-block partial sums, in D's dtype."""
    rows, H, P, grid = _grid(o)
    do = torch.empty_like(o)
    dx = torch.empty_like(x) if D is not None and with_dx else None
    dz = torch.empty_like(z) if z is not None else None
    part = torch.zeros(grid[0], H, P, dtype=torch.float32, device=o.device) if D is not None else None
    ssd_gate_bwd_kernel[grid](dy.contiguous(), o, x, o if D is None else D, o if z is None else z, do,
                              o if dx is None else dx, o if dz is None else dz, o if part is None else part, rows,
                              H=H, P=P, WITH_DX=dx is not None, **_flags(D, z, P))
    dD = None
    if D is not None:
        dD = (part.sum(0) if D.dim() == 2 else part[..., 0].sum(0)).to(D.dtype)
    return do, dx, dD, dz


def values(x, step, kernel_dtype):
    """v = dt x ``[..., H, P]`` in ``kernel_dtype`` (float32 inside), x contiguous, step
    ``[..., H]`` float32."""
    rows, H, P, grid = _grid(x)
    v = torch.empty(x.shape, dtype=kernel_dtype, device=x.device)
    ssd_value_kernel[grid](x, step.contiguous(), v, rows, H=H, P=P, BR=ROWS_PER_PROGRAM,
                           BP=max(16, triton.next_power_of_2(P)))
    return v


def step_backward(dv, dg, x, step, A, dy, D, z):
    """``(dx, dstep)``: x's gradient (through v = dt x, plus the skip's D dy silu(z) where D is
    given) in x's dtype, and dt's (through v and the log decay dt A) in float32, each formed in
    float32 and rounded once; dv ``[..., H, P]`` and dg ``[..., H]`` float32."""
    rows, H, P, grid = _grid(x)
    dx = torch.empty_like(x)
    dstep = torch.empty(step.shape, dtype=torch.float32, device=x.device)
    ssd_step_bwd_kernel[grid](dv.contiguous(), x, step.contiguous(), dy.contiguous() if D is not None else dx,
                              dx if z is None else z, dx if D is None else D, dg.contiguous(), A.float().contiguous(),
                              dx, dstep, rows, H=H, P=P, **_flags(D, z, P))
    return dx, dstep


class SsdChunkScan(torch.autograd.Function):
    """``apply(x, step, A, C, B, D, z, h0, resets, options) -> (y, final)``: x ``[Bt, T, H, P]``,
    step ``[Bt, T, H]`` float32 (the discretised dt), A ``[H]``, C and B ``[Bt, T, G, N]`` in the
    kernels' dtype, D ``[H]`` / ``[H, P]`` or None, z like x or None, h0 ``[N, H, Nstate, P]`` or
    None, resets ``[Bt, T]`` (-inf where mamba's seq_idx starts a sequence) or None; ``options``:
    the kernels' dtype, cu_seqlens, chunk_indices, chunk_offsets and the launch shape. y in o's
    dtype, final ``[N, H, Nstate, P]`` float32. Saved for the backward: the inputs and o (v and
    the log decay are formed again there)."""

    @staticmethod
    def forward(ctx, x, step, A, C, B, D, z, h0, resets, options):
        x = x.contiguous()
        D = None if D is None else D.contiguous()
        z = None if z is None else z.contiguous()
        v, g = _value_and_decay(x, step, A, resets, options["kernel_dtype"])
        o, final = chunk_simple_gla_fwd(C, B, v, g, scale=1.0, initial_state=h0, output_final_state=True,
                                        cu_seqlens=options["cu_seqlens"], shape=options["shape"],
                                        chunk_indices=options["chunk_indices"],
                                        backward=dict(chunk_indices=options["chunk_indices"],
                                                      chunk_offsets=options["chunk_offsets"]))
        y = o if D is None and z is None else gate_forward(o, x, D, z)
        ctx.save_for_backward(x, step, A, C, B, D, z, h0, resets, o)
        ctx.options = options
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, step, A, C, B, D, z, h0, resets, o = ctx.saved_tensors
        opt = ctx.options
        dD = dz = None
        if D is None and z is None:
            do = dy.to(o.dtype)
        else:  # x's share comes with v's, below
            do, _, dD, dz = gate_backward(dy, o, x, D, z, with_dx=False)
        v, g = _value_and_decay(x, step, A, resets, opt["kernel_dtype"])
        dC, dB, dv, dg, dh0 = chunk_simple_gla_bwd(C, B, v, g, do, dfinal, scale=1.0, initial_state=h0,
                                                   cu_seqlens=opt["cu_seqlens"], chunk_indices=opt["chunk_indices"],
                                                   chunk_offsets=opt["chunk_offsets"], shape=opt["shape"])
        dx, dstep = step_backward(dv, dg, x, step, A, dy, D, z)
        dA = (dg * step).sum(tuple(range(dg.dim() - 1)))
        return (dx, dstep, dA.to(A.dtype), dC.to(C.dtype), dB.to(B.dtype), dD, dz,
                None if dh0 is None else dh0.to(h0.dtype), None, None)


def _value_and_decay(x, step, A, resets, kernel_dtype):
    """v = dt x in the kernels' dtype (:func:`values`) and the log decay dt A, -inf where
    ``resets`` starts a sequence."""
    v = values(x, step, kernel_dtype)
    g = step * A.float()
    if resets is not None:
        g = g + resets[..., None]
    return v, g
