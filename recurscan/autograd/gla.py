"""Training through the GLA Triton path (a decay per head, or per key dimension): a ``torch.autograd.Function`` whose forward
is launch/gla.py's (a decay per head on the delta rule's prep and sweep with the WY step off where
planned, else kernels/gla/forward.py) and whose backward is kernels/gla/backward.py
(:func:`recurscan.launch.gla.chunk_simple_gla_bwd`), checked against autograd through the token
loop (``reference.gla.gla_naive``). Saved for the backward: the inputs, and where the plan keeps
them (``GlaShape.forward_states``, launch.gla.forward_states_rows) the states entering the chunks
in the inputs' dtype; otherwise those are recomputed there."""
from __future__ import annotations

import torch

from ..launch.gla import chunk_simple_gla_bwd, chunk_simple_gla_fwd, forward_states_rows
from .cotangents import leave_unread_outputs_none, output_cotangent

#: The gradients the backward's stages store in the inputs' dtypes (cast below at once anyway).
NARROW = ("dq", "dk", "dv")


class ChunkSimpleGla(torch.autograd.Function):
    """``apply(q, k, v, g, initial_state, options) -> (o, final_state)``; ``options``: scale,
    cu_seqlens, chunk_indices, chunk_offsets (varlen descriptors), final_read (the caller receives
    the final state), the launch shape and ``prep_rows`` (g per key dimension: the prep's programs
    per value head; None: g per head)."""

    @staticmethod
    def forward(ctx, q, k, v, g, initial_state, options):
        with torch.no_grad():
            per_key = options["prep_rows"] is not None  # through the prep (kernels/gla/prep.py)
            rows = None if per_key else forward_states_rows(options["shape"], q, g, options["cu_seqlens"],
                                                            options["chunk_indices"])
            o, final, *states = chunk_simple_gla_fwd(
                q, k, v, g, scale=options["scale"], initial_state=initial_state, output_final_state=True,
                cu_seqlens=options["cu_seqlens"], shape=options["shape"], prep_rows=options["prep_rows"],
                chunk_indices=options["chunk_indices"],
                chunk_offsets=options["chunk_offsets"] if per_key or rows is not None else None,
                chunk_state_rows=rows, states_for_backward=rows is not None,
                backward=dict(chunk_indices=options["chunk_indices"], chunk_offsets=options["chunk_offsets"],
                              final_read=options["final_read"], narrow=NARROW))
        ctx.save_for_backward(q, k, v, g, initial_state, *states)
        ctx.options = options
        leave_unread_outputs_none(ctx, o)
        return o, final

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, h0, *states = ctx.saved_tensors
        opt = ctx.options
        do = output_cotangent(ctx, do, q)
        grads = chunk_simple_gla_bwd(q, k, v, g, do, dht, scale=opt["scale"], initial_state=h0,
                                     cu_seqlens=opt["cu_seqlens"], chunk_indices=opt["chunk_indices"],
                                     chunk_offsets=opt["chunk_offsets"], shape=opt["shape"],
                                     chunk_states=states[0] if states else None, narrow=NARROW)
        inputs = (q, k, v, g, h0)
        return (*(None if d is None or not ctx.needs_input_grad[i] else d.to(inputs[i].dtype)
                  for i, d in enumerate(grads)), None)
