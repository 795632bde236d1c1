"""What the training Functions share about cotangents: an output the loss does not read reaches
the backward as None (``ctx.set_materialize_grads(False)``), so autograd makes and the backward
reads no zeros for it; the final state's None goes on to the kernels (no dht), the output's is made
here, where the backward needs one."""
from __future__ import annotations

import torch


def leave_unread_outputs_none(ctx, output: torch.Tensor) -> None:
    """In a Function's forward: unread outputs' cotangents come as None; ``output`` (the one whose
    cotangent the backward always needs) is remembered by shape and dtype alone."""
    ctx.output = (output.shape, output.dtype)
    ctx.set_materialize_grads(False)


def output_cotangent(ctx, grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``grad``, or zeros of the remembered output's shape and dtype on ``like``'s device where the
    loss read the final state alone."""
    return grad if grad is not None else like.new_zeros(ctx.output[0], dtype=ctx.output[1])
