"""Public ops of the delta-rule family: Gated DeltaNet (GDN) and Gated Delta Product (GDP).

Every op is thin: validate (problem.py) -> plan (plan/) -> run the chosen backend. GDN is GDP
with M = 1, so all four entry points share one driver, :func:`_run_delta`.

Backends: "torch" (the oracle's chunked form; CPU tensors by default) and "triton" (the chunked
kernels of ``recurscan/kernels/delta/``, launched by ``recurscan/launch/delta.py``; CUDA tensors
by default). ``backend="triton"``
on CPU tensors runs those kernels under Triton's interpreter: set ``TRITON_INTERPRET=1`` in the
environment before triton is first imported (CI does, see tests/conftest.py).
"""
from __future__ import annotations

import torch

from ..plan import delta as plan_delta
from ..plan import plan
from ..problem import (check_chunk_descriptors, check_cu_seqlens, check_slots, contiguous_indices, debug_checks,
                       delta_problem, needs_grad)
from ..reference import delta as ref
from ..runtime.cache import SignatureCache, launch_key
from . import _cache


_LAUNCH = None


def _launch():
    """launch/delta.py, imported on first use: triton is imported only on the Triton path."""
    global _LAUNCH
    if _LAUNCH is None:
        from ..launch import delta
        _LAUNCH = delta
    return _LAUNCH


#: CUDA call signature -> its DeltaLaunches (launch/delta.py).
LAUNCHES = SignatureCache("chunked delta rule")
#: Signature (inputs that require grad) -> (problem, schedule): validated and planned once.
GRAD_PLANS = SignatureCache("chunked delta rule, training")


def _run_delta(q, k, v, g, beta, *, num_householder, scale, initial_state, output_final_state,
               use_qk_l2norm_in_kernel, cu_seqlens, state, state_indices, return_chunk_states,
               chunk_size=None, backend=None, chunk_indices=None, chunk_indices_dp=None, chunk_offsets=None,
               out=None):
    """The four entry points' driver. ``out``: ``(o, final)`` views the Triton path writes into
    (launch/delta.py's ``out_views``; the traced scan's packed result, ops/scan.py); the other
    paths ignore it (the caller compares data pointers and copies)."""
    cu_seqlens, state_indices, chunk_indices, chunk_indices_dp, chunk_offsets = contiguous_indices(
        cu_seqlens, state_indices, chunk_indices, chunk_indices_dp, chunk_offsets)
    if chunk_indices_dp is None and num_householder == 1:
        chunk_indices_dp = chunk_indices  # GDN: the two chunkings coincide
    if torch.compiler.is_compiling() and state is None and not return_chunk_states and chunk_size is None:
        # Being traced (torch.compile, torch.export): one scan node with a packed result (ops/scan.py).
        from .scan import traced_delta
        return traced_delta(q, k, v, g, beta, num_householder=num_householder, scale=scale,
                            initial_state=initial_state, output_final_state=output_final_state,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                            chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
                            chunk_indices_dp=chunk_indices_dp)
    if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1 and isinstance(q, torch.Tensor) \
            and q.dim() == 4 and plan_delta.varlen_as_dense(cu_seqlens.numel() - 1, num_householder,
                                                            return_chunk_states):
        # One sequence: the dense batch of one (its descriptors, checked, are not needed).
        check_cu_seqlens(cu_seqlens, q.shape[0], q.shape[1], q.device)
        check_chunk_descriptors(cu_seqlens, chunk_indices, chunk_indices_dp, chunk_offsets, num_householder,
                                q.device)
        return _run_delta(q, k, v, g, beta, num_householder=num_householder, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                          cu_seqlens=None, state=state, state_indices=state_indices,
                          return_chunk_states=return_chunk_states, chunk_size=chunk_size, backend=backend, out=out)
    if _streams(q, k, v, g, beta, initial_state, num_householder, cu_seqlens, return_chunk_states, chunk_size,
                backend):
        # Few tokens a sequence: the planner's cost model predicts the streaming kernel faster
        # (plan/cost.py, prefill_algorithm): the same recurrence token by token.
        from .decode import fused_recurrent_gated_delta_rule_update
        o, final = fused_recurrent_gated_delta_rule_update(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, state=state,
            state_indices=state_indices)
        return o, (final if output_final_state or state is not None else None)
    if isinstance(cu_seqlens, torch.Tensor) and isinstance(q, torch.Tensor) and q.dim() == 4 and chunk_size is None \
            and None in (chunk_indices, chunk_indices_dp, chunk_offsets):
        # Varlen without descriptors: derived padded to q's T, and the call goes on as one given
        # them (its launches kept by signature). On a GPU by one kernel (launch/descriptors.py: no
        # host read, so no sync, and a capture takes it); on the CPU, or with chunk states (trimmed to the batch's
        # own chunks, a count only the host read gives), from the boundaries read on the host and
        # validated as a CPU tensor's are.
        from ..descriptors import padded_descriptors, refuse_under_capture
        check_cu_seqlens(cu_seqlens, q.shape[0], q.shape[1], q.device)
        chunks = None
        if q.is_cuda and not return_chunk_states:
            from ..launch.descriptors import device_descriptors
            built = device_descriptors(cu_seqlens, num_householder, tokens=q.shape[1])
        else:
            refuse_under_capture(_op_name(num_householder))
            host = cu_seqlens.to("cpu")
            check_cu_seqlens(host, q.shape[0], q.shape[1], host.device)
            built, chunks = padded_descriptors(host, num_householder, tokens=q.shape[1], device=q.device)
        result = _run_delta(
            q, k, v, g, beta, num_householder=num_householder, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            cu_seqlens=cu_seqlens, state=state, state_indices=state_indices, return_chunk_states=return_chunk_states,
            backend=backend, chunk_indices=built.chunk_indices if chunk_indices is None else chunk_indices,
            chunk_indices_dp=built.chunk_indices_dp if chunk_indices_dp is None else chunk_indices_dp,
            chunk_offsets=built.chunk_offsets if chunk_offsets is None else chunk_offsets, out=out)
        return result[:2] + (result[2][:chunks],) if return_chunk_states else result
    inputs = (q, k, v, g, beta, initial_state, state, state_indices, cu_seqlens, chunk_indices_dp, chunk_offsets)
    key = None
    grad = needs_grad(q, k, v, g, beta, initial_state, state)  # a cache that requires grad: refused below
    if isinstance(q, torch.Tensor) and q.is_cuda and chunk_size is None:
        # The hot path: validation and planning ran for an earlier call of this signature (every
        # tensor's shape, strides, dtype, device and alignment, and every option).
        key = (launch_key(inputs + (chunk_indices,) + (out or ())), num_householder, scale, output_final_state,
               use_qk_l2norm_in_kernel, return_chunk_states, backend, grad)
        launches = None if grad else LAUNCHES.get(key)
        if launches is not None and not debug_checks():  # a cached entry implies _launch() ran
            return _LAUNCH.run_delta_launches(launches, inputs, _given(out))
        planned = GRAD_PLANS.get(key) if grad else None
        if planned is not None and not debug_checks():
            return _run_triton_with_grad(q, k, v, g, beta, *planned, initial_state=initial_state,
                                         output_final_state=output_final_state,
                                         use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                                         chunk_indices=chunk_indices, chunk_indices_dp=chunk_indices_dp,
                                         chunk_offsets=chunk_offsets, uses_cache=planned[0].uses_cache,
                                         return_chunk_states=return_chunk_states, key=key, backend=backend)
    problem = delta_problem(q, k, v, g, beta, num_householder=num_householder, scale=scale,
                            initial_state=initial_state, cu_seqlens=cu_seqlens, state=state,
                            state_indices=state_indices)
    if cu_seqlens is not None:
        check_chunk_descriptors(cu_seqlens, chunk_indices, chunk_indices_dp, chunk_offsets, num_householder,
                                problem.device)
    if debug_checks():
        _check_device_values(problem, cu_seqlens, state, state_indices)
    schedule = plan("delta_rule", problem, q.device, "chunked", backend)
    if grad and problem.uses_cache:
        raise NotImplementedError(
            f"{_op_name(num_householder)}: a state cache (state, state_indices) is inference-only on every backend "
            "(written in place, it would carry this call's autograd graph into the next call that reads it): train "
            "with initial_state / output_final_state, or call under torch.no_grad()")
    if schedule.backend == "triton" and grad:
        if key is not None:
            GRAD_PLANS.put(key, (problem, schedule))
        return _run_triton_with_grad(q, k, v, g, beta, problem, schedule, initial_state=initial_state,
                                     output_final_state=output_final_state,
                                     use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                                     chunk_indices=chunk_indices, chunk_indices_dp=chunk_indices_dp,
                                     chunk_offsets=chunk_offsets, uses_cache=problem.uses_cache,
                                     return_chunk_states=return_chunk_states, key=key, backend=backend)
    if schedule.backend == "triton":
        return _run_triton(q, k, v, g, beta, problem, schedule, initial_state=initial_state,
                           output_final_state=output_final_state,
                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                           chunk_indices=chunk_indices, chunk_indices_dp=chunk_indices_dp,
                           chunk_offsets=chunk_offsets, state=state, state_indices=state_indices,
                           return_chunk_states=return_chunk_states, key=key, out=out)
    S0 = initial_state
    if problem.uses_cache:
        S0 = _cache.gather(state, state_indices, torch.float64 if q.dtype == torch.float64 else torch.float32)
    fn = ref.gated_delta_product_chunked if num_householder > 1 else ref.gated_delta_rule_chunked
    extra = (num_householder,) if num_householder > 1 else ()
    o, final, *chunk_states = fn(
        q, k, v, g, beta, *extra, scale=problem.scale, initial_state=S0,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
        chunk_size=chunk_size or schedule.chunk_size, return_chunk_states=return_chunk_states)
    if not output_final_state and not problem.uses_cache:
        final = None
    if problem.uses_cache:
        o = o.masked_fill(_cache.padding_token_mask(state_indices, o.shape[0], o.shape[1], cu_seqlens)
                          [..., None, None], 0)
        _cache.scatter(state, state_indices, final)
        final = state
        if chunk_states:  # a padding sequence has no states: its rows are zero, like its output
            chunk_states = [_cache.zero_padding_rows(chunk_states[0], state_indices, o.shape[0], o.shape[1],
                                                     cu_seqlens, chunk_size or schedule.chunk_size)]
    return (o.to(q.dtype), final, *chunk_states)


def _check_device_values(problem, cu_seqlens, state, state_indices):
    """``RECURSCAN_CHECK=1`` on device tensors: the value checks that CPU tensors always get
    (cu_seqlens monotone from 0 to T, cache slots in range and unshared), at one host sync."""
    if cu_seqlens is not None and cu_seqlens.device.type != "cpu":
        check_cu_seqlens(cu_seqlens.cpu(), 1, problem.tokens, torch.device("cpu"))
    if state is not None and state_indices.device.type != "cpu":
        check_slots("state_indices", state_indices.cpu(), state.shape[0])


def _op_name(num_householder: int) -> str:
    return "chunk_gated_delta_rule" if num_householder == 1 else "chunk_gated_delta_product_varlen"


def _streams(q, k, v, g, beta, initial_state, num_householder, cu_seqlens, return_chunk_states, chunk_size,
             backend) -> bool:
    """Whether a chunked GDN call runs on the streaming kernel instead: a CUDA call the planner left
    to choose (no backend, chunk size or chunk states asked for, no gradient, M = 1, 4-D tensors)
    whose mean tokens a sequence the cost model gives to streaming (plan/cost.py,
    :func:`prefill_algorithm`; the shapes alone, so no host read)."""
    if backend is not None or chunk_size is not None or return_chunk_states or num_householder != 1:
        return False
    if not (isinstance(q, torch.Tensor) and q.is_cuda and q.dim() == 4 and isinstance(v, torch.Tensor)
            and v.dim() == 4) or needs_grad(q, k, v, g, beta, initial_state):
        return False
    if cu_seqlens is not None and not (isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1):
        return False  # the chunked path's validation says what is wrong
    from ..plan.cost import prefill_algorithm
    from ..plan.device import device_name
    sequences = q.shape[0] if cu_seqlens is None else max(cu_seqlens.numel() - 1, 1)
    tokens = q.shape[0] * q.shape[1]
    if tokens < sequences:
        return False
    return prefill_algorithm(tokens, sequences, q.shape[2], v.shape[2], q.shape[3], v.shape[3],
                             device_name(q.device)) == "recurrent"


def _run_triton_with_grad(q, k, v, g, beta, problem, schedule, *, initial_state, output_final_state,
                          use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices, chunk_indices_dp, chunk_offsets,
                          uses_cache, return_chunk_states, key=None, backend=None):
    """Inputs that require grad: the Triton forward inside autograd/delta.py's ChunkDelta, whose
    backward is the written-out chunkwise backward. Training takes no cache and no chunk states.
    ``key`` (the signature, marked for grad): the forward's launches are kept under it."""
    if uses_cache or return_chunk_states:
        raise NotImplementedError(
            "chunk_gated_delta_rule / chunk_gated_delta_product_varlen: gradients flow through o, the final "
            "state and initial_state; a state cache (state, state_indices) and return_chunk_states are "
            "inference-only: pass initial_state / output_final_state, or call under torch.no_grad()")
    from ..autograd.delta import ChunkDelta
    from ..plan import delta as plan_delta
    keep_prep = plan_delta.keep_prep_for_backward(problem)
    checkpoint_chunks = plan_delta.checkpoint_chunks_for_backward(problem, q.device)

    def forward():  # (o, final, *the prep's outputs where they are kept)
        return _run_triton(q.detach(), k.detach(), v.detach(), *(None if t is None else t.detach()
                                                                for t in (g, beta)),
                           problem, schedule, initial_state=None if initial_state is None else initial_state.detach(),
                           output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                           cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_indices_dp=chunk_indices_dp,
                           chunk_offsets=chunk_offsets, state=None, state_indices=None, return_chunk_states=False,
                           key=key, keep_prep=keep_prep, checkpoint_chunks=checkpoint_chunks)

    options = dict(num_householder=problem.householder, scale=problem.scale,
                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, shape=schedule.launch,
                   chunk_indices=chunk_indices, chunk_indices_dp=chunk_indices_dp, chunk_offsets=chunk_offsets,
                   signature=key, keep_prep=keep_prep, checkpoint_chunks=checkpoint_chunks,
                   gluon=backend is None, final_read=output_final_state)
    o, final = ChunkDelta.apply(q, k, v, g, beta, initial_state, forward, options)
    return o, (final if output_final_state else None)


def _run_triton(q, k, v, g, beta, problem, schedule, *, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices, chunk_indices_dp, chunk_offsets,
                state, state_indices, return_chunk_states, key=None, keep_prep=False, checkpoint_chunks=0, out=None):
    """The Triton backend: no host synchronisation when the varlen descriptors are given (or the
    input is a dense batch). With ``key`` (a CUDA call signature), the plan is kept for the next
    call of that signature when it depends on no device value. ``keep_prep``: the prep's outputs
    follow the call's own (for the backward), and then, with ``checkpoint_chunks``, the states the
    backward's recompute starts its segments from."""
    L_ = _launch()

    M = problem.householder
    num_rows = chunk_indices.shape[0] if cu_seqlens is not None and return_chunk_states else None
    launches = None if key is None else LAUNCHES.get(key)  # the training path's forward, planned before
    launches = launches or L_.build_delta_launches(
        q, k, v, g, beta, schedule.launch, num_householder=M, scale=problem.scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens, chunk_indices_dp=chunk_indices_dp, chunk_offsets=chunk_offsets,
        num_chunk_rows=num_rows, state=state, state_indices=state_indices,
        return_chunk_states=return_chunk_states, keep_prep=keep_prep, checkpoint_chunks=checkpoint_chunks,
        out_views=out)
    result = L_.run_delta_launches(launches, L_.DeltaInputs(q, k, v, g, beta, initial_state, state, state_indices,
                                                            cu_seqlens, chunk_indices_dp, chunk_offsets), _given(out))
    if key is not None:
        LAUNCHES.put(key, launches)
    return result


def _given(out) -> dict | None:
    """run_delta_launches' ``given`` of an ``out`` pair: the views as the o and final buffers."""
    return None if out is None else {"o": out[0], "final": out[1]}


def chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                           chunk_indices=None, chunk_offsets=None, state=None, state_indices=None,
                           return_chunk_states=False, backend=None):
    """Chunked Gated DeltaNet forward (prefill and training), with fla's signature and returns.

    Per value head: ``S <- exp(g_t) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = scale S^T q_t``.

    Args:
        q, k: ``[B, T, H, K]``.
        v: ``[B, T, HV, V]``; HV a multiple of H (value head hv reads q/k head hv // (HV // H)).
        g: ``[B, T, HV]`` natural-log decays (<= 0), or None for no decay; ``-inf`` is a decay of
            exactly 0 (a reset). ``g > 0`` (growth) is computed right until the true values leave
            float32's range (float64's for float64 inputs on the torch backend), and the outputs
            are non-finite from there, as the token loop's (the Triton kernels with 16-bit inputs
            hold a chunk's decay factors at 16 bits: growth past 2^16 within 64 tokens gives NaN
            from that row on). On both backends a NaN or inf in any input at token t leaves the
            outputs before t, and every other sequence, bit-identical to the clean run; the
            outputs from t on (in the value columns it reaches) and the state are non-finite.
        beta: ``[B, T, HV]`` or ``[B, T, HV, V]`` (per value column), or None for ones.
        scale: score scale, default ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` (float32), or None for zeros.
        output_final_state: return the final state ``[N, HV, K, V]`` (float32), else None. In
            training ask for it where the loss reads it: the first call's backward is compiled
            beside the forward for the cotangents it will get (none for a state not returned).
        use_qk_l2norm_in_kernel: L2-normalise q and k (eps 1e-6) inside the op.
        cu_seqlens: ``[N + 1]`` int32/int64 boundaries for variable-length input (B = 1).
        chunk_indices, chunk_offsets: precomputed varlen descriptors
            (:func:`recurscan.descriptors.build_chunk_descriptors`, once per step, padded to a fixed
            length). With them (or a dense batch) the Triton path never synchronises with the host
            and can be captured in a CUDA graph; without them it forms them from cu_seqlens on the
            device, padded to T (no sync either; with ``return_chunk_states`` from one host read,
            the chunk states then trimmed to the batch's chunks). The torch backend derives what it needs and ignores them. On CPU tensors their
            values are checked against cu_seqlens (a ValueError names the wrong entry); on CUDA
            they are not read on the host, and wrong ones give wrong numbers but never a read or
            write outside a tensor; ``RECURSCAN_CHECK=1`` checks them there too (one sync a call).
        state: ``[S, HV, K, V]`` state cache, read and written in place at ``state_indices``
            (supersedes initial_state/output_final_state; the returned final state is ``state``).
        state_indices: ``[N]`` cache slot per sequence; -1 marks padding (zero output, slot untouched).
        return_chunk_states: also return ``[NT, HV, K, V]``; row ``chunk_offsets[n] + c`` is
            sequence n's state entering its chunk c of 64 tokens. With given descriptors on the
            Triton path NT is the padded ``len(chunk_indices)`` and the rows past
            ``chunk_offsets[N]`` are zero (no data-dependent size).
        backend: None (the planner decides: CPU tensors -> "torch", CUDA -> "triton"), "torch",
            or "triton" (on CPU tensors: under ``TRITON_INTERPRET=1``, set before triton's import).
            With None, an inference call on the GPU (no gradient, no chunk states) whose sequences
            are a few tokens long runs the streaming kernel where the cost model predicts it faster
            (``recurscan.plan.cost.prefill_algorithm``: on the H200 HV32 K = V = 128, up to 4
            tokens a sequence in batches of 64 or more, 16 for one sequence); its rounding differs
            from the chunked kernels' within the same tolerance. With None, a training call on a
            Hopper GPU may run backward stages as their Gluon twins (docs/kernels-gluon.md: the
            reverse sweep the same bits, dq and dk within one bf16 rounding); "triton" keeps the
            Triton kernels.

    Returns:
        ``(o [B, T, HV, V] in q's dtype, final_state or None)``, plus chunk states when asked.

    On CPU tensors this runs the oracle's chunked form in PyTorch (float32 accumulation, or
    float64 for float64 inputs), and is differentiable through autograd. On CUDA tensors it runs
    the Triton kernels (bf16/fp16/fp32 inputs, float32 state). Inputs that require grad get
    gradients for q, k, v, g, beta and initial_state, with a gradient into the final state, from
    Triton backward stages (``recurscan.launch.delta_backward``, a first, untuned version; GDP as
    GDN on its expanded stream). They save
    only the inputs. A state cache and ``return_chunk_states`` are inference-only
    (NotImplementedError with grad).

    Example:
        >>> import torch, recurscan
        >>> q, k = torch.randn(1, 100, 2, 32), torch.randn(1, 100, 2, 32)
        >>> v = torch.randn(1, 100, 4, 32)
        >>> g, beta = -torch.rand(1, 100, 4), torch.rand(1, 100, 4)
        >>> o, S = recurscan.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
        ...                                         use_qk_l2norm_in_kernel=True)
        >>> o.shape, S.shape
        (torch.Size([1, 100, 4, 32]), torch.Size([1, 4, 32, 32]))
    """
    return _run_delta(q, k, v, g, beta, num_householder=1, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                      cu_seqlens=cu_seqlens, state=state, state_indices=state_indices,
                      return_chunk_states=return_chunk_states, backend=backend,
                      chunk_indices=chunk_indices, chunk_offsets=chunk_offsets)


def chunk_gated_delta_product_varlen(q, k, v, g, beta, num_householder, cu_seqlens, scale=None,
                                     initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, chunk_indices=None,
                                     chunk_indices_dp=None, chunk_offsets=None, state=None,
                                     state_indices=None, return_chunk_states=False, backend=None):
    """Variable-length chunked Gated Delta Product forward.

    Per token: decay by ``exp(g_t)``, then M delta-rule writes with the token's Householder copies
    ``(k, v, beta)[t*M + j]``, then the read ``o_t = scale S^T q_t``.

    Args:
        q: ``[1, T, H, K]``; k: ``[1, T*M, H, K]``; v: ``[1, T*M, HV, V]`` (expanded stream).
        g: ``[1, T, HV]`` log decays (on the token stream; ``-inf``, ``g > 0`` and non-finite input
            as :func:`chunk_gated_delta_rule`'s); beta: ``[1, T*M, HV]`` (or ``[.., V]``).
        num_householder: M >= 1 (M = 1 is Gated DeltaNet).
        cu_seqlens: ``[N + 1]`` boundaries on the token stream.
        chunk_indices, chunk_indices_dp, chunk_offsets: precomputed descriptors
            (:func:`recurscan.descriptors.build_chunk_descriptors` with ``num_householder=M``);
            see :func:`chunk_gated_delta_rule`.
        Other arguments as :func:`chunk_gated_delta_rule`; chunk states are taken every 64 tokens
        of the token stream.

    Returns:
        ``(o [1, T, HV, V], final_state)`` or ``(o, final_state, chunk_states [NT, HV, K, V])``.

    Example:
        >>> import torch, recurscan
        >>> T, M = 70, 2
        >>> q, g = torch.randn(1, T, 2, 16), -torch.rand(1, T, 2)
        >>> k, v, beta = torch.randn(1, T * M, 2, 16), torch.randn(1, T * M, 2, 16), torch.rand(1, T * M, 2)
        >>> cu = torch.tensor([0, 1, 70])
        >>> o, S = recurscan.chunk_gated_delta_product_varlen(q, k, v, g, beta, M, cu,
        ...                                                   output_final_state=True)
        >>> o.shape, S.shape
        (torch.Size([1, 70, 2, 16]), torch.Size([2, 2, 16, 16]))
    """
    if cu_seqlens is None:
        raise ValueError("cu_seqlens: required by the varlen op; pass [0, T] for one sequence")
    return _run_delta(q, k, v, g, beta, num_householder=num_householder, scale=scale,
                      initial_state=initial_state, output_final_state=output_final_state,
                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, state=state,
                      state_indices=state_indices, return_chunk_states=return_chunk_states,
                      backend=backend, chunk_indices=chunk_indices,
                      chunk_indices_dp=chunk_indices_dp, chunk_offsets=chunk_offsets)


#: (B, T, M, device) -> (cu_seqlens, descriptor kwargs) of a dense Gated Delta Product batch as varlen.
_DENSE_GDP = SignatureCache("dense gated delta product")


def chunk_gated_delta_product(q, k, v, g, beta, num_householder, scale=None, initial_state=None,
                              output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                              cu_seqlens_cpu=None, backend=None):
    """Chunked Gated Delta Product with fla's signature (``fla.ops.gated_delta_product``): dense
    batches, or varlen with ``cu_seqlens`` (B = 1). Runs :func:`chunk_gated_delta_product_varlen`
    (a dense batch as B sequences of T tokens, its descriptors built from the shape alone: no host
    synchronisation); trains through the same autograd.

    Args:
        q: ``[B, T, H, K]``; k: ``[B, T*M, H, K]``; v: ``[B, T*M, HV, V]`` (each token's M
            Householder copies in a row); g: ``[B, T, HV]`` log decays or None; beta:
            ``[B, T*M, HV]`` or None.
        num_householder: M >= 1.
        scale: default ``K ** -0.5``. initial_state: ``[N, HV, K, V]`` (N = B, or the number of
            sequences) or None. output_final_state: return the final states (else None).
        use_qk_l2norm_in_kernel: L2-normalise q and k first.
        cu_seqlens: ``[N + 1]`` token-stream boundaries (B = 1), or None for a dense batch.
        cu_seqlens_cpu: the same boundaries on the host: the varlen descriptors are built from them
            without reading the device tensor.
        backend: as :func:`chunk_gated_delta_rule`.

    Returns:
        ``(o [B, T, HV, V], final_state [N, HV, K, V] or None)``.

    Example:
        >>> import torch, recurscan
        >>> B, T, M = 2, 70, 2
        >>> q, g = torch.randn(B, T, 2, 16), -torch.rand(B, T, 2)
        >>> k, v, beta = torch.randn(B, T * M, 2, 16), torch.randn(B, T * M, 2, 16), torch.rand(B, T * M, 2)
        >>> o, S = recurscan.chunk_gated_delta_product(q, k, v, g, beta, M, output_final_state=True)
        >>> o.shape, S.shape
        (torch.Size([2, 70, 2, 16]), torch.Size([2, 2, 16, 16]))
    """
    from ..descriptors import build_chunk_descriptors
    common = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, backend=backend)
    if cu_seqlens is not None:
        desc = {}
        if cu_seqlens_cpu is not None:
            desc = build_chunk_descriptors(cu_seqlens_cpu, num_householder, device=q.device).as_kwargs()
        return chunk_gated_delta_product_varlen(q, k, v, g, beta, num_householder, cu_seqlens, **desc, **common)
    B, T = q.shape[:2]
    if torch.compiler.is_compiling():  # traced: boundaries from the shape on the device, no cache (T may be symbolic)
        cu = torch.arange(B + 1, dtype=torch.int32, device=q.device) * T
        flat = [None if x is None else x.reshape(1, -1, *x.shape[2:]) for x in (q, k, v, g, beta)]
        o, final = chunk_gated_delta_product_varlen(*flat, num_householder, cu, **common)
        return o.view(B, T, *o.shape[2:]), final
    # The dense shapes checked as such (the varlen call below checks the flattened ones).
    delta_problem(q, k, v, g, beta, num_householder=num_householder, scale=scale, initial_state=initial_state)
    key = (B, T, num_householder, q.device)
    dense = _DENSE_GDP.get(key)
    if dense is None:
        cu = torch.arange(B + 1, dtype=torch.int32) * T
        dense = _DENSE_GDP.put(key, (cu.to(q.device), build_chunk_descriptors(
            cu, num_householder, device=q.device).as_kwargs()))
    cu, desc = dense
    flat = [None if x is None else x.reshape(1, -1, *x.shape[2:]) for x in (q, k, v, g, beta)]
    o, final = chunk_gated_delta_product_varlen(*flat, num_householder, cu, **desc, **common)
    return o.view(B, T, *o.shape[2:]), final
