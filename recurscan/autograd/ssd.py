"""Training Mamba2 SSD on the Triton path (mamba_ssm's parameterisation), as one
``torch.autograd.Function`` around the GLA kernels: the forward on the recurrence's kernels with
v = dt x and the skip D x inside them (as inference runs it), the gate silu(z) one elementwise
pass after (kernels/gla/ssd_gate.py); the backward on the GLA backward's stages (launch/gla.py)
with v = dt x formed again, the gate's gradients one pass, and x's, dt's and D's gradients in
the reverse sweep, where x's two shares (through v and through the skip) add in float32 and round
once, as mamba_ssm's do. The step sizes (dt_bias, softplus, dt_limit) stay in PyTorch before it
(``[B, T, H]``, small). ``reference.ssd`` is the form it is checked against
(tests/test_kernels_ssd.py)."""
from __future__ import annotations

import torch
import triton

from ..kernels.gla.ssd_gate import ssd_gate_bwd_kernel, ssd_gate_fwd_kernel, ssd_value_kernel
from ..launch.gla import SsdGrads, SsdPrologue, chunk_simple_gla_bwd, chunk_simple_gla_fwd

ROWS_PER_PROGRAM = 64


def _grid(o):
    H, P = o.shape[-2:]
    rows = o.numel() // (H * P)
    return rows, H, P, (triton.cdiv(rows, ROWS_PER_PROGRAM), H)


def _blocks(P):
    return dict(BR=ROWS_PER_PROGRAM, BP=max(16, triton.next_power_of_2(P)))


def gate_forward(u, z):
    """``y = u silu(z)`` in u's dtype (float32 inside): u, z ``[..., H, P]``, contiguous."""
    rows, H, P, grid = _grid(u)
    y = torch.empty_like(u)
    ssd_gate_fwd_kernel[grid](u, z, y, rows, H=H, P=P, **_blocks(P))
    return y


def gate_backward(dy, u, z):
    """``(du, dz)`` of :func:`gate_forward` for ``dy``: du in u's dtype, dz in z's."""
    rows, H, P, grid = _grid(u)
    du, dz = torch.empty_like(u), torch.empty_like(z)
    ssd_gate_bwd_kernel[grid](dy.contiguous(), u, z, du, dz, rows, H=H, P=P, **_blocks(P))
    return du, dz


def values(x, step, kernel_dtype):
    """v = dt x ``[..., H, P]`` in ``kernel_dtype`` (float32 inside), x contiguous, step
    ``[..., H]`` float32."""
    rows, H, P, grid = _grid(x)
    v = torch.empty(x.shape, dtype=kernel_dtype, device=x.device)
    ssd_value_kernel[grid](x, step.contiguous(), v, rows, H=H, P=P, **_blocks(P))
    return v


class SsdChunkScan(torch.autograd.Function):
    """``apply(x, step, A, C, B, D, z, h0, resets, options) -> (y, final)``: x ``[Bt, T, H, P]``,
    step ``[Bt, T, H]`` float32 (the discretised dt), A ``[H]``, C and B ``[Bt, T, G, N]`` in the
    kernels' dtype, D ``[H]`` / ``[H, P]`` or None, z like x or None, h0 ``[N, H, Nstate, P]`` or
    None, resets ``[Bt, T]`` (-inf where mamba's seq_idx starts a sequence) or None; ``options``:
    the kernels' dtype, cu_seqlens, chunk_indices, chunk_offsets and the launch shape. y in the
    kernels' dtype, final ``[N, H, Nstate, P]`` float32.

    Forward: the recurrence's kernels as inference runs them (x raw, dt folded into the gates,
    u = o + D x in the output store; launch/gla.py's SSD prologue with the step sizes given), then
    the gate y = u silu(z) where z is given. Saved for the backward: the inputs, and u where z is
    given. Backward: the gate's (du = dy silu(z), rounded to the kernels' dtype as mamba_ssm's
    is), then v = dt x and the log decay formed again for the recurrence's backward, whose reverse
    sweep forms x's gradient (through v and the skip), dt's share through v and D's in place of
    v's (launch/gla.py's SsdGrads)."""

    @staticmethod
    def forward(ctx, x, step, A, C, B, D, z, h0, resets, options):
        x = x.contiguous()
        D = None if D is None else D.contiguous()
        z = None if z is None else z.contiguous()
        kernel_dtype = options["kernel_dtype"]
        prologue = SsdPrologue(step.contiguous(), A, None, D, None, False, (0.0, float("inf")))
        u, final = chunk_simple_gla_fwd(C, B, x.to(kernel_dtype), resets, scale=1.0, initial_state=h0,
                                        output_final_state=True, cu_seqlens=options["cu_seqlens"],
                                        shape=options["shape"], chunk_indices=options["chunk_indices"], ssd=prologue,
                                        backward=dict(chunk_indices=options["chunk_indices"],
                                                      chunk_offsets=options["chunk_offsets"],
                                                      ssd=SsdGrads(x.to(kernel_dtype), step, D)))
        y = u if z is None else gate_forward(u, z)
        ctx.save_for_backward(x, step, A, C, B, D, z, h0, resets, None if z is None else u)
        ctx.options = options
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, step, A, C, B, D, z, h0, resets, u = ctx.saved_tensors
        opt = ctx.options
        kernel_dtype = opt["kernel_dtype"]
        dz = None
        if z is None:
            do = dy.to(kernel_dtype)
        else:  # the skip's shares of x's and D's gradients come with v's, below
            do, dz = gate_backward(dy, u, z)
        v, g = _value_and_decay(x, step, A, resets, kernel_dtype)
        dC, dB, dx, dg, dh0, dstep, dD = chunk_simple_gla_bwd(
            C, B, v, g, do, dfinal, scale=1.0, initial_state=h0, cu_seqlens=opt["cu_seqlens"],
            chunk_indices=opt["chunk_indices"], chunk_offsets=opt["chunk_offsets"], shape=opt["shape"],
            ssd=SsdGrads(x.to(kernel_dtype), step, D))
        dstep = dstep + dg * A.float()  # the log decay's share
        dA = (dg * step).sum(tuple(range(dg.dim() - 1)))
        return (dx.to(x.dtype), dstep, dA.to(A.dtype), dC.to(C.dtype), dB.to(B.dtype),
                None if dD is None else dD.to(D.dtype), dz, None if dh0 is None else dh0.to(h0.dtype), None, None)


def _value_and_decay(x, step, A, resets, kernel_dtype):
    """v = dt x in the kernels' dtype (:func:`values`) and the log decay dt A, -inf where
    ``resets`` starts a sequence."""
    v = values(x, step, kernel_dtype)
    g = step * A.float()
    if resets is not None:
        g = g + resets[..., None]
    return v, g
