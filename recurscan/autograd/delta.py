"""Training through the delta-rule Triton path: a ``torch.autograd.Function`` whose forward is the
Triton kernels and whose backward is the Triton backward stages
(:mod:`recurscan.launch.delta_backward`; GDP on its expanded stream), checked against the
written-out chunkwise backward (:mod:`recurscan.reference.delta_backward`).

Saved for the backward: the inputs (q, k, v, g, beta, initial_state), and where the planner keeps
them (``plan.delta.keep_prep_for_backward``), the prep's outputs (wy, G o Tinv, aqk, coef), which
spare the backward's recompute its prep. The states entering the chunks are recomputed there, from
the initial state, or where the planner keeps them (``plan.delta.checkpoint_chunks_for_backward``)
from the float32 states entering every E-th chunk, every segment of E chunks at once.
"""
from __future__ import annotations

import torch

from ..launch.delta_backward import chunk_delta_bwd, chunk_delta_product_bwd, compile_backward_early
from .cotangents import leave_unread_outputs_none, output_cotangent


class ChunkDelta(torch.autograd.Function):
    """``apply(q, k, v, g, beta, initial_state, forward, options) -> (o, final_state)``.

    ``forward()``: the no-grad forward (the Triton launches), returning ``(o, final_state, *kept)``
    (``kept``: the prep's outputs when ``options["keep_prep"]``, then the checkpoint states when
    ``options["checkpoint_chunks"]``);
    ``options``: num_householder, scale, use_qk_l2norm_in_kernel, cu_seqlens, final_read (the caller
    receives the final state: its backward may get a cotangent for it), and for the Triton
    backward the launch shape and the varlen descriptors (chunk_indices, chunk_indices_dp,
    chunk_offsets); ``signature``: the forward call's signature (None: not kept), on whose first
    call the backward's kernels start compiling beside the forward's; ``gluon``: the planner may
    run a backward stage as its Gluon twin (False under ``backend="triton"``).
    """

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, forward, options):
        with torch.no_grad():
            opt = options
            # The backward's kernels start compiling before the forward's first call compiles its
            # own, beside them.
            compile_backward_early(
                opt["signature"], q, k, v, g, beta, num_householder=opt["num_householder"], scale=opt["scale"],
                initial_state=initial_state, use_qk_l2norm_in_kernel=opt["use_qk_l2norm_in_kernel"],
                cu_seqlens=opt["cu_seqlens"],
                shape=opt["shape"], chunk_offsets=opt["chunk_offsets"],
                chunk_indices=opt["chunk_indices_dp" if opt["num_householder"] > 1 else "chunk_indices"],
                prep_kept=opt["keep_prep"], checkpoint_chunks=opt["checkpoint_chunks"], gluon=opt["gluon"],
                final_read=opt["final_read"])
            o, final, *prep = forward()
        ctx.save_for_backward(q, k, v, g, beta, initial_state, *prep)
        ctx.options = options
        leave_unread_outputs_none(ctx, o)
        return o, final

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, h0, *prep = ctx.saved_tensors
        opt = ctx.options
        do = output_cotangent(ctx, do, q)
        extra = {}
        if opt["checkpoint_chunks"]:
            *prep, checkpoints = prep
            extra = dict(checkpoints=checkpoints, checkpoint_chunks=opt["checkpoint_chunks"])
        common = dict(scale=opt["scale"], initial_state=h0, use_qk_l2norm_in_kernel=opt["use_qk_l2norm_in_kernel"],
                      cu_seqlens=opt["cu_seqlens"], prep=tuple(prep) or None, gluon=opt["gluon"])
        if opt["num_householder"] > 1:
            grads = chunk_delta_product_bwd(q, k, v, g, beta, opt["num_householder"], do, dht, shape=opt["shape"],
                                            chunk_indices_dp=opt["chunk_indices_dp"], **common)
        else:
            grads = chunk_delta_bwd(q, k, v, g, beta, do, dht, shape=opt["shape"], chunk_indices=opt["chunk_indices"],
                                    chunk_offsets=opt["chunk_offsets"], **common, **extra)
        inputs = (q, k, v, g, beta, h0)
        out = tuple(None if d is None or not ctx.needs_input_grad[i] else d.to(inputs[i].dtype)
                    for i, d in enumerate(grads))
        return (*out, None, None)
