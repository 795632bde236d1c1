"""Training through the delta-rule Triton path: a ``torch.autograd.Function`` whose forward is the
Triton kernels and whose backward is the Triton backward stages
(:mod:`recurscan.launch.delta_backward`; GDP as GDN on its expanded stream). Without a launch
shape (a caller outside the Triton path) it falls back to the written-out chunkwise backward
(:mod:`recurscan.reference.delta_backward`) in PyTorch.

Saved for the backward: the inputs (q, k, v, g, beta, initial_state) only. The states entering the
chunks are recomputed there from the initial state, not kept from the forward.
"""
from __future__ import annotations

import torch

from ..reference.delta_backward import gated_delta_product_chunked_backward, gated_delta_rule_chunked_backward


class ChunkDelta(torch.autograd.Function):
    """``apply(q, k, v, g, beta, initial_state, forward, options) -> (o, final_state)``.

    ``forward()``: the no-grad forward (the Triton launches), returning ``(o, final_state)``;
    ``options``: num_householder, scale, use_qk_l2norm_in_kernel, cu_seqlens, and for the Triton
    backward the launch shape and the varlen descriptors (chunk_indices, chunk_offsets).
    """

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, forward, options):
        with torch.no_grad():
            o, final = forward()
        ctx.save_for_backward(q, k, v, g, beta, initial_state)
        ctx.options = options
        return o, final

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, h0 = ctx.saved_tensors
        opt = ctx.options
        common = dict(scale=opt["scale"], initial_state=h0, use_qk_l2norm_in_kernel=opt["use_qk_l2norm_in_kernel"],
                      cu_seqlens=opt["cu_seqlens"])
        M, shape = opt["num_householder"], opt.get("shape")
        if shape is not None and M > 1:
            from ..launch.delta_backward import chunk_delta_product_bwd
            grads = chunk_delta_product_bwd(q, k, v, g, beta, M, do, dht, shape=shape, **common)
        elif shape is not None:
            from ..launch.delta_backward import chunk_delta_bwd
            grads = chunk_delta_bwd(q, k, v, g, beta, do, dht, shape=shape, chunk_indices=opt["chunk_indices"],
                                    chunk_offsets=opt["chunk_offsets"], **common)
        elif M > 1:
            grads = gated_delta_product_chunked_backward(q, k, v, g, beta, M, do, dht, **common)
        else:
            grads = gated_delta_rule_chunked_backward(q, k, v, g, beta, do, dht, **common)
        inputs = (q, k, v, g, beta, h0)
        out = tuple(None if d is None or not ctx.needs_input_grad[i] else d.to(inputs[i].dtype)
                    for i, d in enumerate(grads))
        return (*out, None, None)
