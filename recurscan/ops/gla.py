"""Public ops of gated linear attention: scalar decay per head (fla's chunk_simple_gla) and a
decay per key dimension (fla's chunk_gla). validate -> plan -> backend, as every op."""
from __future__ import annotations

import torch

from ..descriptors import CHUNK_SIZE
from ..plan import plan
from ..problem import contiguous_indices, gla_problem, needs_grad
from ..reference import gla as ref
from . import _cache


def _run_gla(q, k, v, g, *, per_key_decay, scale, initial_state, output_final_state, cu_seqlens, backend=None,
             g_gamma=None, state=None, state_indices=None, chunk_indices=None, chunk_offsets=None,
             return_chunk_states=False, out_views=None):
    """The two ops' driver. ``out_views``: ``(o, final)`` views an inference call on the delta sweep
    writes into (the traced scan's packed result, ops/scan.py); the other paths ignore it."""
    cu_seqlens, state_indices, chunk_indices, chunk_offsets = contiguous_indices(cu_seqlens, state_indices,
                                                                                 chunk_indices, chunk_offsets)
    if torch.compiler.is_compiling() and state is None and not return_chunk_states:
        # Being traced (torch.compile, torch.export): one scan node with a packed result (ops/scan.py).
        from .scan import traced_gla
        return traced_gla(q, k, v, g, per_key_decay=per_key_decay, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state, g_gamma=g_gamma, cu_seqlens=cu_seqlens,
                          chunk_indices=chunk_indices, chunk_offsets=chunk_offsets)
    problem = gla_problem(q, k, v, g, per_key_decay=per_key_decay, scale=scale, initial_state=initial_state,
                          cu_seqlens=cu_seqlens, g_gamma=g_gamma, state=state, state_indices=state_indices,
                          chunk_indices=chunk_indices, chunk_offsets=chunk_offsets)
    schedule = plan("gla", problem, q.device, "chunked", backend)
    if g_gamma is not None:  # a constant log decay per head, on top of g's
        dtype = g.dtype if g is not None else (torch.float64 if q.dtype == torch.float64 else torch.float32)
        g = g_gamma.to(dtype).expand(problem.batch, problem.tokens, problem.value_heads) + (0 if g is None else g)
    training = needs_grad(q, k, v, g, initial_state)
    if (state is not None or return_chunk_states) and (training or needs_grad(state)):
        raise NotImplementedError("chunk_simple_gla / chunk_gla: a state cache (state, state_indices) and "
                                  "return_chunk_states are inference-only; train with initial_state / "
                                  "output_final_state, or call under torch.no_grad()")
    if schedule.backend == "triton":
        if training:
            return _run_triton_with_grad(q, k, v, g, problem, schedule, initial_state=initial_state,
                                         output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                         chunk_indices=chunk_indices, chunk_offsets=chunk_offsets)
        from ..launch.gla import chunk_simple_gla_fwd
        rows = prep_rows = None
        # The fused kernel's prep sizes its grid from the chunk rows; the delta prep's (the sweep) from its own.
        prepped = (per_key_decay and schedule.launch.sweep is None) or schedule.launch.split
        if return_chunk_states or prepped:
            rows, chunk_indices, chunk_offsets = chunk_rows(q.shape[0], q.shape[1], cu_seqlens, chunk_indices,
                                                            chunk_offsets, q.device)
            rows, prep_rows = (rows if return_chunk_states else None), (rows if prepped else None)
        out = chunk_simple_gla_fwd(q, k, v, g, scale=problem.scale, initial_state=initial_state,
                                   output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                   shape=schedule.launch, state=state, state_indices=state_indices,
                                   chunk_state_rows=rows, chunk_offsets=chunk_offsets, prep_rows=prep_rows,
                                   chunk_indices=chunk_indices, out_views=out_views if state is None else None)
        final = out[1] if output_final_state or state is not None else None
        return (out[0], final, *out[2:])
    if g is None:  # no decay: plain causal linear attention
        g = q.new_zeros(problem.batch, problem.tokens, problem.value_heads).float()
    if state is not None:  # the cache gathered before and scattered after
        initial_state = _cache.gather(state, state_indices, torch.float64 if q.dtype == torch.float64 else torch.float32)
    o, final, *chunks = ref.gla_chunked(q, k, v, g, scale=problem.scale, initial_state=initial_state,
                                        cu_seqlens=cu_seqlens, chunk_size=schedule.chunk_size,
                                        return_chunk_states=return_chunk_states)
    if state is not None:
        o = o.masked_fill(_cache.padding_token_mask(state_indices, o.shape[0], o.shape[1], cu_seqlens)
                          [..., None, None], 0)
        _cache.scatter(state, state_indices, final)
        if chunks:  # a padding sequence has no states: its rows are zero, like its output
            chunks = [_cache.zero_padding_rows(chunks[0], state_indices, o.shape[0], o.shape[1], cu_seqlens,
                                               schedule.chunk_size)]
        return (o.to(q.dtype), state, *chunks)
    return (o.to(q.dtype), final if output_final_state else None, *chunks)


def chunk_rows(B, T, cu_seqlens, chunk_indices, chunk_offsets, device):
    """(rows, chunk_indices, chunk_offsets) of the Triton path's per-chunk tensors (the chunk
    states it returns, the per-key prep's programs): dense ``B * ceil(T / 64)``; varlen
    ``len(chunk_indices)`` (the padded count: no data-dependent size), the descriptors built here
    where not given (one host read of cu_seqlens)."""
    if cu_seqlens is None:
        return B * -(-T // CHUNK_SIZE), None, None
    if chunk_indices is None or chunk_offsets is None:
        from ..descriptors import descriptors_for_call
        built = descriptors_for_call(cu_seqlens, device=device, op="chunk_simple_gla / chunk_gla")
        chunk_indices, chunk_offsets = built.chunk_indices, built.chunk_offsets
    return chunk_indices.shape[0], chunk_indices, chunk_offsets


def _run_triton_with_grad(q, k, v, g, problem, schedule, *, initial_state, output_final_state, cu_seqlens,
                          chunk_indices=None, chunk_offsets=None):
    """Inputs that require grad: autograd/gla.py's ChunkSimpleGla (Triton forward and backward; g
    per head or per key dimension). Varlen without descriptors builds them here (one host read of
    cu_seqlens)."""
    from ..autograd.gla import ChunkSimpleGla
    if cu_seqlens is not None and (chunk_indices is None or chunk_offsets is None):
        from ..descriptors import descriptors_for_call
        built = descriptors_for_call(cu_seqlens, device=q.device, op="chunk_simple_gla / chunk_gla")
        chunk_indices, chunk_offsets = built.chunk_indices, built.chunk_offsets
    per_key = g is not None and g.dim() == 4  # the prep runs first, one program per chunk and value head
    options = dict(scale=problem.scale, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
                   chunk_offsets=chunk_offsets, shape=schedule.launch, final_read=output_final_state,
                   prep_rows=chunk_rows(q.shape[0], q.shape[1], cu_seqlens, chunk_indices, chunk_offsets,
                                        q.device)[0] if per_key else None)
    o, final = ChunkSimpleGla.apply(q, k, v, g, initial_state, options)
    return o, (final if output_final_state else None)


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None, backend=None, state=None, state_indices=None, chunk_indices=None,
                     chunk_offsets=None, return_chunk_states=False):
    """Gated linear attention with one decay per head and token (fla's ``chunk_simple_gla``).

    ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``, ``o_t = scale * S_t^T q_t``.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]`` (HV a multiple of H).
        g: ``[B, T, HV]`` natural-log decays, or None (no decay); ``-inf`` is a decay of exactly 0
            (a reset). ``g > 0`` (growth) is computed right until the true values leave float32's
            range (float64's for float64 inputs), and is non-finite from there; a NaN or inf in
            any input at token t leaves the outputs before t, and every other sequence,
            bit-identical.
        g_gamma: ``[HV]`` a constant log decay per head (fla's data-independent decay, RetNet's),
            added to g's where both are given; or None.
        scale: default ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` or None; output_final_state: return the final state.
        cu_seqlens: ``[N + 1]`` boundaries (B = 1) or None.
        backend: None (the planner's choice), "torch" (the PyTorch form, through autograd) or
            "triton" (kernels/gla/, forward and backward; on CPU tensors under
            ``TRITON_INTERPRET=1``).
        state, state_indices: an in-place state cache ``[S, HV, K, V]`` and ``[N]`` int slots
            (-1: padding, zero outputs, its slot untouched), as the delta-rule ops; inference
            only. The final state returned is then ``state``.
        chunk_indices, chunk_offsets: precomputed varlen descriptors
            (:func:`recurscan.build_chunk_descriptors`), as the delta-rule ops take them: with them
            the Triton path (training included) never synchronises with the host.
        return_chunk_states: also return ``[NT, HV, K, V]`` float32 (inference only); row
            ``chunk_offsets[n] + c`` is sequence n's state entering its chunk c of 64 tokens, as
            the delta-rule ops lay them out (with given descriptors on the Triton path NT is the
            padded ``len(chunk_indices)`` and the rows past ``chunk_offsets[N]`` are zero); a
            padding sequence's rows (slot -1) are zero.

    Returns:
        ``(o [B, T, HV, V], final_state [N, HV, K, V] or None)``, plus chunk states when asked.

    Example:
        >>> import torch, recurscan
        >>> q, k, v = torch.randn(1, 100, 2, 16), torch.randn(1, 100, 2, 16), torch.randn(1, 100, 2, 8)
        >>> o, S = recurscan.chunk_simple_gla(q, k, v, -torch.rand(1, 100, 2), output_final_state=True)
        >>> o.shape, S.shape
        (torch.Size([1, 100, 2, 8]), torch.Size([1, 2, 16, 8]))
    """
    return _run_gla(q, k, v, g, per_key_decay=False, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend, g_gamma=g_gamma,
                    state=state, state_indices=state_indices, chunk_indices=chunk_indices,
                    chunk_offsets=chunk_offsets, return_chunk_states=return_chunk_states)


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
              backend=None, state=None, state_indices=None, chunk_indices=None, chunk_offsets=None,
              return_chunk_states=False):
    """Gated linear attention with a decay per key dimension (fla's ``chunk_gla``).

    ``S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T``, ``o_t = scale * S_t^T q_t``.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g: ``[B, T, HV, K]`` natural-log decays
            (``-inf``, ``g > 0`` and non-finite input as :func:`chunk_simple_gla`'s).
        Other arguments as :func:`chunk_simple_gla`. On CUDA (the planner's choice, or
            ``backend="triton"``): a prep and the GLA sweep (kernels/gla/prep.py); with grad, the
            backward of kernels/gla/backward.py (every gradient, dg per key). On the H200, B4 T4096
            H16 K = V = 128 bf16: forward 2.50 ms (the PyTorch form 100 ms, fla 0.72), forward +
            backward 18.2 ms (the PyTorch form 425).

    Returns:
        ``(o [B, T, HV, V], final_state [N, HV, K, V] or None)``, plus chunk states when asked.

    Example:
        >>> import torch, recurscan
        >>> q, k, v = torch.randn(1, 70, 2, 16), torch.randn(1, 70, 2, 16), torch.randn(1, 70, 2, 8)
        >>> o, _ = recurscan.chunk_gla(q, k, v, -torch.rand(1, 70, 2, 16))
        >>> o.shape
        torch.Size([1, 70, 2, 8])
    """
    if g is None:
        raise ValueError("g: chunk_gla needs per-key log decays [B, T, HV, K]; use chunk_simple_gla for none")
    return _run_gla(q, k, v, g, per_key_decay=True, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend,
                    state=state, state_indices=state_indices, chunk_indices=chunk_indices,
                    chunk_offsets=chunk_offsets, return_chunk_states=return_chunk_states)
