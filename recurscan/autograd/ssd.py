"""Training Mamba2 SSD on the Triton path (mamba_ssm's parameterisation), as one
``torch.autograd.Function`` around the GLA kernels: the forward on the recurrence's kernels with
v = dt x and the skip D x inside them (as inference runs it), the gate silu(z) one elementwise
pass after; the backward on the GLA backward's stages (launch/gla.py) with v = dt x formed again,
and the elementwise gradients one Triton pass each (kernels/gla/ssd_gate.py). Inside one Function,
x's two gradients (through v and through the skip) add in float32 and round once, as mamba_ssm's
do; the step sizes (dt_bias, softplus, dt_limit) stay in PyTorch before it (``[B, T, H]``,
small).
``reference.ssd`` is the form it is checked against (tests/test_kernels_ssd.py)."""
from __future__ import annotations

import torch
import triton

from ..kernels.gla.ssd_gate import ssd_gate_bwd_kernel, ssd_gate_fwd_kernel, ssd_step_bwd_kernel, ssd_value_kernel
from ..launch.gla import SsdPrologue, chunk_simple_gla_bwd, chunk_simple_gla_fwd, forward_states_rows
from .cotangents import leave_unread_outputs_none, output_cotangent

#: The gradients the backward's stages store in the inputs' dtypes: dC and dB (q's and k's), cast at
#: once anyway; dV stays float32 where it is formed (x's and dt's gradients are formed from it).
NARROW = ("dq", "dk")

ROWS_PER_PROGRAM = 64


def _grid(o):
    H, P = o.shape[-2:]
    rows = o.numel() // (H * P)
    return rows, H, P, (triton.cdiv(rows, ROWS_PER_PROGRAM), H)


def _blocks(P):
    return dict(BR=ROWS_PER_PROGRAM, BP=max(16, triton.next_power_of_2(P)))


def _flags(D, z, P):
    return dict(_blocks(P), HAS_D=D is not None, D_PER_CHANNEL=D is not None and D.dim() == 2, HAS_Z=z is not None)


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


def step_backward(dv, dg, x, step, A, dy, D, z):
    """``(dx, dstep, dD)``: x's gradient (through v = dt x, plus the skip's D dy silu(z) where D
    is given) in x's dtype, dt's (through v and the log decay dt A) in float32, each formed in
    float32 and rounded once, and D's (None without D) from per-block partial sums, in D's dtype;
    dv ``[..., H, P]`` and dg ``[..., H]`` float32, dy the gradient of y = (o + D x) silu(z)."""
    rows, H, P, grid = _grid(x)
    dx = torch.empty_like(x)
    dstep = torch.empty(step.shape, dtype=torch.float32, device=x.device)
    part = torch.empty(grid[0], H, P, dtype=torch.float32, device=x.device) if D is not None else None
    ssd_step_bwd_kernel[grid](dv.contiguous(), x, step.contiguous(), dy.contiguous() if D is not None else dx,
                              dx if z is None else z, dx if D is None else D, dg.contiguous(), A.float().contiguous(),
                              dx, dstep, dx if part is None else part, rows, H=H, P=P, **_flags(D, z, P))
    dD = None
    if D is not None:
        dD = (part.sum(0) if D.dim() == 2 else part[..., 0].sum(0)).to(D.dtype)
    return dx, dstep, dD


class SsdChunkScan(torch.autograd.Function):
    """``apply(x, step, A, C, B, D, z, h0, resets, options) -> (y, final)``: x ``[Bt, T, H, P]``,
    step ``[Bt, T, H]`` float32 (the discretised dt), A ``[H]``, C and B ``[Bt, T, G, N]`` in the
    kernels' dtype, D ``[H]`` / ``[H, P]`` or None, z like x or None, h0 ``[N, H, Nstate, P]`` or
    None, resets ``[Bt, T]`` (-inf where mamba's seq_idx starts a sequence) or None; ``options``:
    the kernels' dtype, cu_seqlens, chunk_indices, chunk_offsets, final_read (the caller receives
    the final states) and the launch shape. y in the kernels' dtype, final ``[N, H, Nstate, P]``
    float32.

    Forward: the recurrence's kernels as inference runs them (x raw, dt folded into the gates,
    u = o + D x in the output store; launch/gla.py's SSD prologue with the step sizes given), then
    the gate y = u silu(z) where z is given. Saved for the backward: the inputs, u where z is
    given, and the states entering the chunks where the plan keeps them (``GlaShape.forward_states``,
    launch.gla.forward_states_rows; in the kernels' dtype, from x raw with dt in the gates, so they
    differ from a recompute's on v = dt x by that rounding). Backward: the gate's, then v = dt x and
    the log decay formed again for the recurrence's backward, then x's, dt's and D's gradients in
    one pass; or, where the plan says so (``GlaShape.reverse_ssd_grads``) and there is no gate z,
    those formed by the recurrence's reverse sweep in place of dV (launch.gla.SsdGrads), dt's
    share through the log decay (dg A) added after."""

    @staticmethod
    def forward(ctx, x, step, A, C, B, D, z, h0, resets, options):
        x = x.contiguous()
        D = None if D is None else D.contiguous()
        z = None if z is None else z.contiguous()
        kernel_dtype = options["kernel_dtype"]
        prologue = SsdPrologue(step.contiguous(), A, None, D, None, False, (0.0, float("inf")))
        rows = forward_states_rows(options["shape"], C, step, options["cu_seqlens"], options["chunk_indices"])
        u, final, *states = chunk_simple_gla_fwd(
            C, B, x.to(kernel_dtype), resets, scale=1.0, initial_state=h0, output_final_state=True,
            cu_seqlens=options["cu_seqlens"], shape=options["shape"], chunk_indices=options["chunk_indices"],
            ssd=prologue, chunk_state_rows=rows, states_for_backward=rows is not None,
            chunk_offsets=options["chunk_offsets"] if rows is not None else None,
            backward=dict(chunk_indices=options["chunk_indices"], chunk_offsets=options["chunk_offsets"],
                          final_read=options["final_read"], narrow=NARROW,
                          ssd_grads=(x, step, D) if _folds(options, x, z, kernel_dtype) else None))
        y = u if z is None else gate_forward(u, z)
        ctx.save_for_backward(x, step, A, C, B, D, z, h0, resets, None if z is None else u, *states)
        ctx.options = options
        leave_unread_outputs_none(ctx, y)
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, step, A, C, B, D, z, h0, resets, u, *states = ctx.saved_tensors
        opt = ctx.options
        dy = output_cotangent(ctx, dy, x)
        dz = None
        if z is None:
            do = dy.to(opt["kernel_dtype"])
        else:  # x's and D's shares of the skip come with v's, below
            do, dz = gate_backward(dy, u, z)
        g = _decay(step, A, resets)
        fold = _folds(opt, x, z, dy.dtype)  # x's, dt's and D's gradients in the reverse sweep
        # v = dt x for the backward's stages; folded, only where one reads it (a callable)
        v = (lambda: values(x, step, opt["kernel_dtype"])) if fold else values(x, step, opt["kernel_dtype"])
        grads = chunk_simple_gla_bwd(C, B, v, g, do, dfinal, scale=1.0, initial_state=h0,
                                     cu_seqlens=opt["cu_seqlens"], chunk_indices=opt["chunk_indices"],
                                     chunk_offsets=opt["chunk_offsets"], shape=opt["shape"],
                                     chunk_states=states[0] if states else None,
                                     ssd_grads=(x, step, D) if fold else None, narrow=NARROW)
        if fold:
            dC, dB, dx, dg, dh0, dstep_v, dD_shares = grads
            dstep = dstep_v.sum(-1) + dg * A.float()
            dD = None if D is None else dD_shares.sum((0, 1) if D.dim() == 2 else (0, 1, 3)).to(D.dtype)
        else:
            dC, dB, dv, dg, dh0 = grads
            dx, dstep, dD = step_backward(dv, dg, x, step, A, dy, D, z)
        dA = (dg * step).sum(tuple(range(dg.dim() - 1)))
        return (dx, dstep, dA.to(A.dtype), dC.to(C.dtype), dB.to(B.dtype), dD, dz,
                None if dh0 is None else dh0.to(h0.dtype), None, None)


def _folds(options, x, z, dy_dtype) -> bool:
    """Whether the backward forms x's, dt's and D's gradients in the reverse sweep
    (``GlaShape.reverse_ssd_grads``): no gate z (dO is then dy itself), and x and dy in the
    kernels' dtype (the sweep reads x's tiles beside dO's and writes dx in that dtype)."""
    kernel_dtype = options["kernel_dtype"]
    return options["shape"].reverse_ssd_grads and z is None and x.dtype == kernel_dtype and dy_dtype == kernel_dtype


def _decay(step, A, resets):
    """The log decay dt A, -inf where ``resets`` starts a sequence."""
    g = step * A.float()
    if resets is not None:
        g = g + resets[..., None]
    return g
