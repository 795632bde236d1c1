"""Public decode ops of the delta-rule family: the token-by-token (recurrent) form against a state
cache, with speculative-decoding snapshots, and Gated Delta Product decode by folding its
Householder copies into the sequence.

Backends. CUDA tensors run the streaming Triton kernel (``recurscan/kernels/recurrent.py``).
CPU tensors run the PyTorch oracle's token loop, unless ``backend="triton"`` is passed: then the
same Triton kernel runs on the CPU tensors under the interpreter (``TRITON_INTERPRET=1`` must be
set before triton is first imported; tests/conftest.py does it on machines without a GPU). This
is the convention of the chunked prefill ops (``recurscan/kernels/chunk_delta.py``).

The hot path (a CUDA call whose argument shapes were seen before) reads no device value on the
host and does no planning: validation and the launch rule run once per distinct call signature
(shapes, dtypes, devices, options) and are cached, so a call is a dictionary lookup, an output
allocation and one launch, and captures in a CUDA graph.
"""
from __future__ import annotations

import torch

from ..plan import DISPATCH_STEP_BOUND, plan
from ..problem import (check_decode_extras, check_householder, check_scale, contiguous_indices, delta_problem,
                       key_contiguous, needs_grad)
from ..reference import delta as ref
from ..runtime.cache import SignatureCache, launch_key
from . import _cache

_LAUNCH = None


def _launch():
    """launch/stream.py, imported on first use: triton is imported only on the Triton path."""
    global _LAUNCH
    if _LAUNCH is None:
        from ..launch import stream
        _LAUNCH = stream
    return _LAUNCH


class _Prepared:
    """What a validated call signature needs at launch: cached per signature for CUDA tensors.
    Everything decided from shapes, strides and dtypes is decided here once (the key holds them)."""

    __slots__ = ("schedule", "problem", "beta_mode", "launches", "copy_q", "copy_k", "o_like_v")

    def __init__(self, schedule, problem, beta_mode, q, k, v):
        self.schedule, self.problem, self.beta_mode = schedule, problem, beta_mode
        self.launches = None  # launch/stream.py's StreamLaunches, built on the first Triton call
        self.copy_q, self.copy_k = q.stride(-1) != 1, k.stride(-1) != 1  # the kernel reads K contiguous
        self.o_like_v = v.dtype == q.dtype and v.is_contiguous()  # empty_like(v) is o: the cheaper allocation


#: CUDA call signature -> its _Prepared.
PREPARED = SignatureCache("recurrent delta rule")


def _prepare(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, state, state_indices,
             intermediate_states, steps_per_token, num_accepted_tokens, backend):
    problem = delta_problem(q, k, v, g, beta, num_householder=1, scale=scale, initial_state=initial_state,
                            cu_seqlens=cu_seqlens, state=state, state_indices=state_indices,
                            output_final_state=output_final_state)
    check_decode_extras(problem, state, intermediate_states, steps_per_token, num_accepted_tokens)
    schedule = plan("delta_rule", problem, q.device, "recurrent", backend)
    beta_mode = None if beta is None else ("value" if beta.dim() == 4 else "head")
    return _Prepared(schedule, problem, beta_mode, q, k, v)


def fused_recurrent_gated_delta_rule_update(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                                            output_final_state=False, use_qk_l2norm_in_kernel=False,
                                            cu_seqlens=None, state=None, state_indices=None,
                                            intermediate_states=None, steps_per_token=1, *,
                                            num_accepted_tokens=None, backend=None):
    """Recurrent Gated DeltaNet (decode and speculative decoding) against an in-place state cache.

    Per value head and token: ``S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = scale S^T q``.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g: ``[B, T, HV]`` or None;
        beta: ``[B, T, HV]`` or ``[B, T, HV, V]`` or None (ones); scale: default ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` or None (zeros); output_final_state: return the final state
            (float32 ``[N, HV, K, V]``).
        use_qk_l2norm_in_kernel: L2-normalise q and k (eps 1e-6) in the kernel.
        cu_seqlens: ``[N + 1]`` boundaries for packed variable-length input (B = 1).
        state: ``[S, HV, K, V]`` cache (float32, bfloat16 or float64), read and written in place at
            ``state_indices [N]``; -1 marks a padding request (zero output, its slot untouched).
            Supersedes initial_state / output_final_state; the returned final state is ``state``.
            Inference-only: with inputs (or the cache) that require grad, a NotImplementedError on every
            backend.
            A cache laid out ``[S, HV, V, K]`` (key rows contiguous: vLLM's, SGLang's and
            FlashInfer's layout) is passed as its view ``cache.transpose(-1, -2)``: the kernel
            reads states through their strides, and the launch rule gives key-contiguous states
            their own tiles (figures for both layouts in docs/kernels-decode.md).
        intermediate_states: ``[S, T // steps_per_token, HV, K, V]`` snapshot buffer, written at the
            cache slots: entry ``[slot, i]`` is the state after draft token i (after its
            ``steps_per_token`` steps). Padding requests write nothing. Needs ``state``.
        steps_per_token: recurrence steps per draft token (M when GDP is folded into the sequence).
        num_accepted_tokens: ``[N]`` int (an extension): request n starts from
            ``intermediate_states[slot, a - 1]`` where ``a = num_accepted_tokens[n] > 0`` (its last
            accepted draft token of the previous step), else from ``state[slot]``. Needs
            ``intermediate_states`` (read before it is overwritten, column block by column block).
            Each value must lie in ``[0, intermediate_states.shape[1]]``: on CPU tensors anything
            else is a ValueError; on CUDA tensors (not read on the host) the kernel reads a value
            below 0 as 0 and one above the buffer as its last snapshot, never outside the buffer.
        backend: None (the planner's choice), "torch" or "triton" (CPU tensors: the interpreter).

    Any state dtype accumulates in float32 (float64 on the torch backend for float64 inputs).

    Returns:
        ``(o [B, T, HV, V] in q's dtype, final_state)``; with ``state`` the final state is the cache.

    Example:
        >>> import torch, recurscan
        >>> cache = torch.zeros(8, 4, 16, 16)
        >>> q, k, v = torch.randn(3, 1, 2, 16), torch.randn(3, 1, 2, 16), torch.randn(3, 1, 4, 16)
        >>> g, beta = -torch.rand(3, 1, 4), torch.rand(3, 1, 4)
        >>> o, _ = recurscan.fused_recurrent_gated_delta_rule_update(
        ...     q, k, v, g, beta, state=cache, state_indices=torch.tensor([5, -1, 2]))
        >>> bool(o[1].eq(0).all()), bool(cache[0].eq(0).all())
        (True, True)
    """
    on_gpu = isinstance(q, torch.Tensor) and q.is_cuda
    prep = None
    cu_seqlens, state_indices, num_accepted_tokens = contiguous_indices(cu_seqlens, state_indices, num_accepted_tokens)
    if on_gpu:  # the hot path: one key over every argument, validated and planned once per key
        key = (launch_key((q, k, v, g, beta, initial_state, cu_seqlens, state, state_indices, intermediate_states,
                     num_accepted_tokens)), output_final_state, use_qk_l2norm_in_kernel, steps_per_token, backend,
               DISPATCH_STEP_BOUND["cuda"])
        prep = PREPARED.get(key)
        if prep is not None and scale is not None:
            check_scale(scale)
    if prep is None:
        prep = _prepare(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, state,
                        state_indices, intermediate_states, steps_per_token, num_accepted_tokens, backend)
        if on_gpu:
            PREPARED.put(key, prep)
    grad = needs_grad(q, k, v, g, beta, initial_state)
    if state is not None and (grad or needs_grad(state)):
        raise NotImplementedError(
            "fused_recurrent_gated_delta_rule_update / fused_recurrent_gated_delta_product_update: a state cache "
            "(state, state_indices) is inference-only on every backend (written in place, it would carry this "
            "call's autograd graph into the next call that reads it): train through chunk_gated_delta_rule with "
            "initial_state / output_final_state, or call under torch.no_grad()")
    if prep.schedule.backend == "torch":
        return _delta_torch(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                            cu_seqlens, state, state_indices, intermediate_states, steps_per_token,
                            num_accepted_tokens)
    if grad:
        raise NotImplementedError(
            "fused_recurrent_gated_delta_rule(_update) / fused_recurrent_gated_delta_product_update: the Triton "
            "recurrent kernel is forward-only (its outputs would carry no gradient); for gradients call "
            "chunk_gated_delta_rule (the same recurrence, with a Triton backward) or pass backend='torch', or "
            "call under torch.no_grad()")
    p = prep.problem
    if prep.copy_q:
        q = q.contiguous()
    if prep.copy_k:
        k = k.contiguous()
    if prep.o_like_v:
        o = torch.empty_like(v)
    else:
        o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    if state is not None:
        initial, final, by_slot = state, state, True
    else:
        initial, by_slot = initial_state, False
        final = _new_final_state(p.sequences, v.shape[2], p.key_dim, v.shape[3], q.device, initial_state) \
            if output_final_state else None
    scale = p.scale if scale is None else scale
    L_ = _launch()
    # launch/stream.StreamTensors' fields, as a plain tuple (its constructor costs 0.4 us a call)
    tensors = (q, k, v, g, beta, o, None, None, None, None, initial, final, state_indices, intermediate_states,
               num_accepted_tokens, cu_seqlens)
    if prep.launches is None:
        prep.launches = L_.build_stream_launches(
            tensors, prep.schedule.launch, scale=scale, delta=True, gate=None if g is None else "scalar",
            beta_mode=prep.beta_mode, l2norm=use_qk_l2norm_in_kernel, final_by_slot=by_slot,
            steps_per_token=steps_per_token, num_sequences=p.sequences)
    L_.run_stream(prep.launches, tensors, scale)
    return o, final


def _new_final_state(N, HV, K, V, device, like, dtype=torch.float32):
    """A ``[N, HV, K, V]`` final state, laid out as the initial state is: a transposed view of an
    ``[N, HV, V, K]`` tensor when the initial state is one (key rows contiguous)."""
    if key_contiguous(like):
        return torch.empty(N, HV, V, K, dtype=dtype, device=device).transpose(-1, -2)
    return torch.empty(N, HV, K, V, dtype=dtype, device=device)


def _delta_torch(q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, cu_seqlens, state,
                 state_indices, snaps, steps_per_token, accepted):
    """The oracle's token loop (gated_delta_rule_naive), with the cache handled around it."""
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, T = q.shape[:2]
    if state is not None:
        S0 = _cache.gather(state, state_indices, compute)
        if accepted is not None:  # start from the last accepted draft token's snapshot
            slots = state_indices.long().clamp(min=0)
            a = accepted.long().clamp(max=snaps.shape[1])
            rows = snaps[slots, (a - 1).clamp(min=0)].to(compute)
            use = ((a > 0) & (state_indices >= 0)).view(-1, 1, 1, 1)
            S0 = torch.where(use, rows, S0)
    else:
        S0 = initial_state
    chunk = steps_per_token if snaps is not None else T + 1
    o, final, *entering = ref.gated_delta_rule_naive(
        q, k, v, g, beta, scale=scale, initial_state=S0, use_qk_l2norm_in_kernel=l2norm, cu_seqlens=cu_seqlens,
        chunk_size=max(chunk, 1), return_chunk_states=snaps is not None)
    if state is None:
        if output_final_state and initial_state is not None:  # laid out as the initial state, as on the GPU
            N, HV, K, V = final.shape
            final = _new_final_state(N, HV, K, V, final.device, initial_state, final.dtype).copy_(final)
        return o.to(q.dtype), (final if output_final_state else None)
    o = o.masked_fill(_cache.padding_token_mask(state_indices, B, T, cu_seqlens)[..., None, None], 0)
    if snaps is not None:
        _write_snapshots(snaps, entering[0], final, state_indices, B, T, cu_seqlens, steps_per_token)
    _cache.scatter(state, state_indices, final)
    return o.to(q.dtype), state


def _write_snapshots(buffer, entering, final, state_indices, batch, length, cu_seqlens, steps):
    """Store, for each live sequence, the state after each of its complete draft tokens."""
    if cu_seqlens is None:
        lengths = [length] * batch
    else:
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    row = 0
    for n, L in enumerate(lengths):
        chunks = -(-L // steps)
        slot = int(state_indices[n])
        if slot >= 0:
            after = list(entering[row + 1: row + chunks]) + [final[n]]
            for i in range(min(L // steps, buffer.shape[1])):  # only complete draft tokens have a snapshot
                buffer[slot, i] = after[i].to(buffer.dtype)
        row += chunks


# fla 0.6's keyword options of fused_recurrent_gated_delta_rule that recurscan does not implement,
# with the default that makes each a no-op: accepted at that default, refused (ValueError) otherwise.
_FLA_NOOP_OPTIONS = dict(gv=None, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                         use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False)


def _is_noop(value, default) -> bool:
    """None is a no-op for every option (fla tests the flags for truth); False only for the flags."""
    return value is None or (default is False and value is False)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, cu_seqlens=None,
                                     use_qk_l2norm_in_kernel=False, *, gk=None, state_v_first=False,
                                     backend=None, **unsupported):
    """fla's ``fused_recurrent_gated_delta_rule`` signature and returns: switch by changing an import.

    Shapes and semantics as :func:`fused_recurrent_gated_delta_rule_update` (no cache); returns
    ``(o, final_state or None)``. fla 0.6's keyword options: ``gk [B, T, HV, K]`` (a log decay per
    key, applied before the write, as fla) and ``state_v_first`` (states laid out ``[N, HV, V, K]``)
    are supported; the others (gv, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
    allow_neg_eigval) are accepted at their no-op default (None, or False for the flags) and refused
    with a ValueError when set, rather than ignored. Any other keyword is a TypeError, as Python's
    own (a misspelled option is never silently dropped).

    Example:
        >>> import torch, recurscan
        >>> q, k = torch.randn(1, 5, 2, 16), torch.randn(1, 5, 2, 16)
        >>> v, g, beta = torch.randn(1, 5, 4, 32), -torch.rand(1, 5, 4), torch.rand(1, 5, 4)
        >>> o, final = recurscan.fused_recurrent_gated_delta_rule(
        ...     q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
        >>> o.shape, final.shape
        (torch.Size([1, 5, 4, 32]), torch.Size([1, 4, 16, 32]))
        >>> recurscan.fused_recurrent_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernal=True)
        Traceback (most recent call last):
            ...
        TypeError: fused_recurrent_gated_delta_rule() got an unexpected keyword argument 'use_qk_l2norm_in_kernal'
    """
    unknown = [name for name in unsupported if name not in _FLA_NOOP_OPTIONS]  # in the caller's order
    if unknown:
        raise TypeError(f"fused_recurrent_gated_delta_rule() got an unexpected keyword argument {unknown[0]!r}")
    bad = {name: val for name, val in unsupported.items() if not _is_noop(val, _FLA_NOOP_OPTIONS[name])}
    if bad:
        raise ValueError(f"{', '.join(sorted(bad))}: fla option(s) not supported by recurscan's "
                         f"fused_recurrent_gated_delta_rule")
    if gk is None and not state_v_first:
        return fused_recurrent_gated_delta_rule_update(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, backend=backend)
    return _fla_extended(q, k, v, g, gk, beta, scale, initial_state, output_final_state, cu_seqlens,
                         use_qk_l2norm_in_kernel, state_v_first, backend)


def _fla_extended(q, k, v, g, gk, beta, scale, initial_state, output_final_state, cu_seqlens, l2norm,
                  state_v_first, backend):
    """fla's per-key decay and V-first state layout (no cache)."""
    from ..problem import check_tensor, FLOAT_DTYPES
    if g is not None and gk is not None:
        raise ValueError("gk: pass either g (one log decay per head) or gk (one per key), not both")
    # initial_state checked in the caller's layout ([N, HV, V, K] with state_v_first), then seen as [N, HV, K, V]
    problem = delta_problem(q, k, v, None, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                            output_final_state=output_final_state, state_v_first=state_v_first)
    init = initial_state.transpose(-1, -2) if initial_state is not None and state_v_first else initial_state
    if gk is not None:
        check_tensor("gk", gk, FLOAT_DTYPES, q.device)
        if tuple(gk.shape) != (problem.batch, problem.tokens, problem.value_heads, problem.key_dim):
            raise ValueError(f"gk: expected shape [B, T, HV, K] = {[problem.batch, problem.tokens, problem.value_heads, problem.key_dim]}, "
                             f"got {list(gk.shape)}")
    schedule = plan("delta_rule", problem, q.device, "recurrent", backend)
    N, HV, K, V = problem.sequences, problem.value_heads, problem.key_dim, problem.value_dim
    if schedule.backend == "torch":
        o, final = ref.gated_delta_rule_naive(q, k, v, g if gk is None else gk, beta, problem.scale, init,
                                              use_qk_l2norm_in_kernel=l2norm, cu_seqlens=cu_seqlens)
        o = o.to(q.dtype)
    else:
        streaming_recurrence = _launch().streaming_recurrence
        o = torch.empty(*v.shape, dtype=q.dtype, device=q.device)
        final = torch.empty(N, HV, K, V, dtype=torch.float32, device=q.device) if output_final_state else None
        streaming_recurrence(q.contiguous(), k.contiguous(), v, o, scale=problem.scale, delta=True,
                             gate="per_key" if gk is not None else (None if g is None else "scalar"),
                             g=gk if gk is not None else g, beta=beta,
                             beta_mode=None if beta is None else ("value" if beta.dim() == 4 else "head"),
                             l2norm=l2norm, cu_seqlens=cu_seqlens, initial=init, final=final,
                             shape=schedule.launch, num_sequences=N)
    if not output_final_state:
        return o, None
    return o, (final.transpose(-1, -2).contiguous() if state_v_first else final)


# ------------------------------------------------------------------------------------------------
# Gated Delta Product decode: the M Householder copies folded into the sequence
# ------------------------------------------------------------------------------------------------


def fold_householder(q, g, num_householder, cu_seqlens=None):
    """Fold GDP's token stream into its expanded stream for the recurrent kernel.

    q ``[B, T, H, K]`` -> ``[B, T*M, H, K]`` with the query on each token's last copy (zeros on the
    others); g ``[B, T, HV]`` -> ``[B, T*M, HV]`` with the decay on the first copy (0 = decay 1 on
    the others); cu_seqlens -> ``cu_seqlens * M``. k, v and beta already live on the expanded
    stream (the layout of :func:`recurscan.chunk_gated_delta_product_varlen`) and need no
    folding. One draft token is then ``steps_per_token = M`` recurrence steps.

    Example:
        >>> import torch
        >>> from recurscan import fold_householder
        >>> q, g = torch.ones(1, 2, 1, 2), -torch.ones(1, 2, 1)
        >>> qf, gf, _ = fold_householder(q, g, 3)
        >>> qf[0, :, 0, 0].tolist(), gf[0, :, 0].tolist()
        ([0.0, 0.0, 1.0, 0.0, 0.0, 1.0], [-1.0, 0.0, 0.0, -1.0, 0.0, 0.0])
    """
    q_f, g_f = ref.expand_householder(q, g, num_householder)
    return q_f, g_f, (None if cu_seqlens is None else cu_seqlens * num_householder)


def unfold_householder(o, num_householder):
    """The answer on the token stream: the output row of each token's last copy,
    ``[B, T*M, HV, V]`` -> ``[B, T, HV, V]`` (a view).

    Example:
        >>> import torch
        >>> from recurscan import unfold_householder
        >>> o = torch.arange(6.0).reshape(1, 6, 1, 1)   # T = 2 tokens, M = 3 copies each
        >>> unfold_householder(o, 3).flatten().tolist()
        [2.0, 5.0]
    """
    return o[:, num_householder - 1:: num_householder]


def fused_recurrent_gated_delta_product_update(q, k, v, g, beta, num_householder, scale=None, initial_state=None,
                                               output_final_state=False, use_qk_l2norm_in_kernel=False,
                                               cu_seqlens=None, state=None, state_indices=None,
                                               intermediate_states=None, *, num_accepted_tokens=None,
                                               backend=None):
    """Gated Delta Product decode (and speculative decode) by folding its Householder copies into
    the sequence (:func:`fold_householder`).

    Args:
        q: ``[B, T, H, K]``; k: ``[B, T*M, H, K]``; v: ``[B, T*M, HV, V]``; g: ``[B, T, HV]`` or None;
        beta: ``[B, T*M, HV]`` / ``[B, T*M, HV, V]`` or None; num_householder: M.
        cu_seqlens: boundaries on the token stream. intermediate_states: ``[S, T, HV, K, V]``, one
        snapshot per token (after its M writes). Others as
        :func:`fused_recurrent_gated_delta_rule_update`.

    Returns:
        ``(o [B, T, HV, V], final_state)``.

    Example:
        >>> import torch, recurscan
        >>> T, M = 1, 2   # one new token per request, two Householder copies each
        >>> cache = torch.zeros(4, 2, 16, 16)
        >>> q, g = torch.randn(3, T, 2, 16), -torch.rand(3, T, 2)
        >>> k, v, beta = torch.randn(3, T * M, 2, 16), torch.randn(3, T * M, 2, 16), torch.rand(3, T * M, 2)
        >>> o, state = recurscan.fused_recurrent_gated_delta_product_update(
        ...     q, k, v, g, beta, M, state=cache, state_indices=torch.tensor([3, -1, 0]))
        >>> o.shape, state is cache, bool(o[1].eq(0).all()), bool(cache[1].eq(0).all())
        (torch.Size([3, 1, 2, 16]), True, True, True)
    """
    check_householder(num_householder)
    delta_problem(q, k, v, g, beta, num_householder=num_householder, scale=scale, initial_state=initial_state,
                  cu_seqlens=cu_seqlens, state=state, state_indices=state_indices)
    M = num_householder
    # The in-kernel L2 norm normalises each folded row: a query row as the token's query, a zero
    # row stays zero (0 * rsqrt(0 + eps)), and each Householder key copy on its own, as the oracle.
    q_f, g_f, cu_f = fold_householder(q, g, M, cu_seqlens)
    o, final = fused_recurrent_gated_delta_rule_update(
        q_f, k, v, g_f, beta, scale=q.shape[-1] ** -0.5 if scale is None else scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_f, state=state, state_indices=state_indices, intermediate_states=intermediate_states,
        steps_per_token=M, num_accepted_tokens=num_accepted_tokens, backend=backend)
    return unfold_householder(o, M), final
