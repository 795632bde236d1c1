"""Public ops of Mamba2 SSD in mamba_ssm's parameterisation and signatures."""
from __future__ import annotations

import torch

from ..descriptors import CHUNK_SIZE
from ..plan import plan
from ..problem import check_dt_softplus, contiguous_indices, needs_grad, ssd_problem
from ..reference import ssd as ref
from . import _cache


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=256, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False, state=None,
                              state_indices=None, chunk_indices=None, chunk_offsets=None,
                              return_chunk_states=False, backend=None):
    """Chunked Mamba2 SSD forward, mamba_ssm's ``mamba_chunk_scan_combined`` signature and returns.

    Per head: ``dt <- clamp(softplus?(dt + dt_bias), dt_limit)``,
    ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = h_t C_t + D x_t``, ``y_t *= silu(z_t)``.

    Args:
        x: ``[Bt, T, H, P]``; dt: ``[Bt, T, H]``; A: ``[H]`` (negative rates). The log decay is
            ``A * dt``: where it is > 0 (growth) the outputs are right until the true values leave
            float32's range (float64's for float64 inputs), and non-finite from there; a NaN or
            inf in any input at token t leaves the outputs before t, and every other sequence,
            bit-identical.
        B, C: ``[Bt, T, G, Nstate]`` with G dividing H (head h reads group h // (H // G)).
        chunk_size: window length of the chunked algorithm (mamba's default 256).
        D: ``[H]`` or ``[H, P]`` skip; z: ``[Bt, T, H, P]`` gate; dt_bias: ``[H]``.
        initial_states: ``[N, H, P, Nstate]`` (N = Bt, or one per cu_seqlens sequence), or None.
        seq_idx: ``[Bt, T]`` integer, as mamba_ssm: several sequences packed in a row, a new one
            starting wherever seq_idx changes from the token before (the state is reset there;
            initial_states apply to each row's first sequence, final states are each row's last
            sequence's). With cu_seqlens, cu_seqlens alone marks the sequences. No host
            synchronisation on the Triton path (the PyTorch form reads it on the host).
        cu_seqlens: ``[N + 1]`` boundaries (Bt = 1) or None.
        dt_softplus, dt_limit: as mamba_ssm (the clamp applies only when dt_limit is not (0, inf)).
        return_final_states: also return the final states ``[N, H, P, Nstate]``.
        return_varlen_states: also return the per-sequence final states (the same tensor here:
            with cu_seqlens every final state is per sequence).
        state, state_indices: an in-place state cache ``[S, H, P, Nstate]`` and ``[N]`` slots
            (-1: padding, zero output, slot untouched), as the delta-rule ops.
        chunk_indices, chunk_offsets: precomputed varlen descriptors
            (:func:`recurscan.build_chunk_descriptors`): with them the Triton path (training
            included) never synchronises with the host.
        return_chunk_states: also return ``[NT, H, P, Nstate]`` float32 (inference only, not with
            seq_idx alone), last: row ``chunk_offsets[n] + c`` is sequence n's state entering its
            chunk c of 64 tokens whatever ``chunk_size`` is, as the delta-rule ops lay them out.
        backend: None (the planner's choice), "torch" (the PyTorch form, which trains through
            autograd) or "triton" (the GLA engine's kernels with q = C, k = B, v = dt x, forward
            and backward, the state cache for inference; any ``chunk_size`` runs as 64-token
            chunks; on CPU tensors under ``TRITON_INTERPRET=1``).

    Returns:
        ``y [Bt, T, H, P]`` in x's dtype, or ``(y, final_states)``, ``(y, varlen_states)``,
        ``(y, final_states, varlen_states)`` as mamba_ssm orders them; the chunk states last.

    Example:
        >>> import torch, recurscan
        >>> x, dt = torch.randn(1, 100, 4, 8), torch.randn(1, 100, 4)
        >>> B, C = torch.randn(1, 100, 1, 16), torch.randn(1, 100, 1, 16)
        >>> y, h = recurscan.mamba_chunk_scan_combined(x, dt, -torch.rand(4), B, C, chunk_size=64,
        ...                                            dt_softplus=True, return_final_states=True)
        >>> y.shape, h.shape
        (torch.Size([1, 100, 4, 8]), torch.Size([1, 4, 8, 16]))
    """
    if return_varlen_states and cu_seqlens is None:
        raise ValueError("return_varlen_states: needs cu_seqlens [N + 1] (as mamba_ssm)")
    if torch.compiler.is_compiling() and state is None and not return_chunk_states and chunk_indices is None:
        # Being traced (torch.compile, torch.export): one scan node with a packed result (ops/scan.py).
        check_dt_softplus(dt_softplus)  # the node takes it as a bool: checked before it is made one
        from .scan import traced_ssd
        y, final = traced_ssd(x, dt, A, B, C, chunk_size=chunk_size, D=D, z=z, dt_bias=dt_bias,
                              initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens,
                              dt_softplus=dt_softplus, dt_limit=dt_limit)
        extra = (final,) * (int(bool(return_final_states)) + int(bool(return_varlen_states)))
        return (y, *extra) if extra else y
    y, final, *chunks = _run_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                                 dt_softplus, dt_limit, state, state_indices, chunk_indices, chunk_offsets,
                                 return_chunk_states, backend,
                                 final_states=bool(return_final_states or return_varlen_states))
    extra = (final,) if return_final_states else ()
    extra += (final,) if return_varlen_states else ()
    extra += tuple(chunks)
    return (y, *extra) if extra else y


def _run_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_limit,
             state, state_indices, chunk_indices, chunk_offsets, return_chunk_states, backend, out=None,
             final_states=True):
    """``(y, final states [N, H, P, Nstate], *chunk states)`` of :func:`mamba_chunk_scan_combined`'s
    untraced call: validate, plan, run the backend. ``out``: ``(y, final)`` views the Triton
    forward writes into (the traced scan's packed result, ops/scan.py: y ``[Bt, T, H, P]``, final
    in the kernel's ``[N, H, Nstate, P]``); the other paths ignore it. ``final_states`` False: the
    caller discards them, so the Triton inference path neither stores nor transposes them (final
    None there; a state cache is written all the same)."""
    seq_idx, cu_seqlens, state_indices, chunk_indices, chunk_offsets = contiguous_indices(
        seq_idx, cu_seqlens, state_indices, chunk_indices, chunk_offsets)
    if return_chunk_states and seq_idx is not None and cu_seqlens is None:
        raise ValueError("return_chunk_states: chunk states are per sequence; with seq_idx pass cu_seqlens too")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected an int >= 1, got {chunk_size!r}")
    problem = ssd_problem(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
                          initial_state=initial_states, cu_seqlens=cu_seqlens, state=state,
                          state_indices=state_indices, seq_idx=seq_idx, chunk_indices=chunk_indices,
                          chunk_offsets=chunk_offsets)
    schedule = plan("ssd", problem, x.device, "chunked", backend)
    grad = needs_grad(x, dt, A, B, C, D, z, dt_bias, initial_states)
    if return_chunk_states and grad:
        raise NotImplementedError("mamba_chunk_scan_combined: return_chunk_states is inference-only; call under "
                                  "torch.no_grad()")
    if state is not None and (grad or needs_grad(state)):  # on every backend: the cache is written in place
        raise NotImplementedError("mamba_chunk_scan_combined: a state cache (state, state_indices) is "
                                  "inference-only; train with initial_states / return_final_states, or call "
                                  "under torch.no_grad()")
    resets = None if seq_idx is None or cu_seqlens is not None else sequence_resets(seq_idx)
    run = _BACKENDS[schedule.backend]
    extra = dict(out=out, final_states=final_states) if run is _ssd_triton else {}
    return run(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, cu_seqlens, state,
               state_indices, chunk_size, schedule.launch, resets, (chunk_indices, chunk_offsets), return_chunk_states,
               **extra)


def sequence_resets(seq_idx: torch.Tensor) -> torch.Tensor:
    """``[Bt, T]`` float32 log decays to add per token: -inf where seq_idx changes from the token
    before (the state resets there), 0 elsewhere; computed on the device."""
    resets = torch.zeros(seq_idx.shape, dtype=torch.float32, device=seq_idx.device)
    resets[:, 1:].masked_fill_(seq_idx[:, 1:] != seq_idx[:, :-1], float("-inf"))
    return resets


def _ssd_torch_packed(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, resets, chunk_size):
    """seq_idx on the PyTorch form: each row's sequences as cu_seqlens (read on the host), the
    row's initial state entering its first sequence; the final state is its last sequence's."""
    ys, finals = [], []
    for b in range(x.shape[0]):
        starts = torch.nonzero(torch.isinf(resets[b])).flatten().tolist()
        cu = torch.tensor([0, *starts, x.shape[1]], device=x.device)
        H, P, N = x.shape[2], x.shape[3], B.shape[3]
        h0 = None
        if initial_states is not None:
            h0 = torch.cat([initial_states[b:b + 1], initial_states.new_zeros(len(starts), H, P, N)])
        row = lambda t: None if t is None else t[b:b + 1]  # noqa: E731
        y, final = ref.ssd_chunked(row(x), row(dt), A, row(B), row(C), D=D, z=row(z), dt_bias=dt_bias,
                                   dt_softplus=dt_softplus, dt_limit=tuple(dt_limit), initial_state=h0,
                                   cu_seqlens=cu, chunk_size=chunk_size)
        ys.append(y)
        finals.append(final[-1:])
    return torch.cat(ys), torch.cat(finals)


def _ssd_torch(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, cu_seqlens, state,
               state_indices, chunk_size, launch=None, resets=None, descriptors=None, return_chunk_states=False):
    """The oracle's chunked form, with the cache gathered before and scattered after (chunk states
    every 64 tokens: the window is 64 then)."""
    if resets is not None:
        y, final = _ssd_torch_packed(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, resets,
                                     chunk_size)
        return y.to(x.dtype), final
    S0 = initial_states
    if state is not None:
        S0 = _cache.gather(state, state_indices, torch.float64 if x.dtype == torch.float64 else torch.float32)
    y, final, *chunks = ref.ssd_chunked(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                        dt_limit=tuple(dt_limit), initial_state=S0, cu_seqlens=cu_seqlens,
                                        chunk_size=CHUNK_SIZE if return_chunk_states else chunk_size,
                                        return_chunk_states=return_chunk_states)
    if state is not None:
        y = y.masked_fill(_cache.padding_token_mask(state_indices, y.shape[0], y.shape[1], cu_seqlens)
                          [..., None, None], 0)
        _cache.scatter(state, state_indices, final)
        final = state
    return (y.to(x.dtype), final, *chunks)


def _ssd_triton(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, cu_seqlens, state,
                state_indices, chunk_size, launch, resets=None, descriptors=(None, None), return_chunk_states=False,
                out=None, final_states=True):
    """SSD as gated linear attention on the GLA kernel, its prologue and epilogue in the kernel:
    q = C, k = B (the groups as GVA), v = dt x, log decay dt A, scale 1, y = (o + D x) silu(z);
    states transposed to [N, H, Nstate, P]. ``out``: as :func:`_run_ssd`'s (inference; the final
    state then comes back as the transposed view of ``out[1]``); ``final_states``: as its."""
    if needs_grad(x, dt, A, B, C, D, z, dt_bias, initial_states):
        # (a state cache with grad is refused by _run_ssd, on either backend)
        return _ssd_triton_with_grad(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, cu_seqlens,
                                     launch, resets, descriptors, final_read=final_states)
    from ..launch.gla import SsdPrologue, chunk_simple_gla_fwd
    from .gla import chunk_rows
    rows = chunk_indices = chunk_offsets = prep_rows = None
    if return_chunk_states or launch.split:
        rows, chunk_indices, chunk_offsets = chunk_rows(x.shape[0], x.shape[1], cu_seqlens, *descriptors, x.device)
        rows, prep_rows = (rows if return_chunk_states else None), (rows if launch.split else None)
    elif cu_seqlens is not None:  # given ones; the sweep forms any missing on the device (launch/gla.py)
        chunk_indices = descriptors[0]
    kernel_dtype = torch.float32 if x.dtype == torch.float64 else x.dtype
    prologue = SsdPrologue(dt, A, dt_bias, D, z, bool(dt_softplus), tuple(dt_limit))
    # mamba's states [., H, P, Nstate] are the kernel's [., HV, V, K]: read (and the cache written)
    # through their strides.
    y, final, *chunks = chunk_simple_gla_fwd(
        C.to(kernel_dtype), B.to(kernel_dtype), x.to(kernel_dtype), resets, scale=1.0, initial_state=initial_states,
        output_final_state=final_states or out is not None, cu_seqlens=cu_seqlens, shape=launch, ssd=prologue,
        state=state, state_indices=state_indices, state_v_first=True, chunk_state_rows=rows,
        chunk_offsets=chunk_offsets, prep_rows=prep_rows, chunk_indices=chunk_indices, out_views=out)
    if state is not None:
        final = state
    elif out is not None and final is out[1]:
        final = final.transpose(-1, -2)  # the caller's own view, written in place
    elif final is not None:
        final = final.transpose(-1, -2).contiguous()
    return (y.to(x.dtype), final, *(c.transpose(-1, -2).contiguous() for c in chunks))


def _ssd_triton_with_grad(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, cu_seqlens, launch,
                          resets=None, descriptors=(None, None), final_read=True):
    """Training on the Triton path: the step sizes in PyTorch (autograd takes their chain rule;
    ``[B, T, H]``), then autograd/ssd.py's SsdChunkScan: v = dt x, the log decay, the recurrence on
    the GLA kernels (forward and backward in Triton) and the skip and gate (one elementwise kernel
    each way). Not fused into the recurrence as the inference path is."""
    from ..autograd.ssd import SsdChunkScan
    kernel_dtype = torch.float32 if x.dtype == torch.float64 else x.dtype
    step = ref.discretize_dt(dt.float(), None if dt_bias is None else dt_bias.float(), dt_softplus, dt_limit)
    chunk_indices, chunk_offsets = descriptors
    if cu_seqlens is not None and (chunk_indices is None or chunk_offsets is None):  # one host read
        from ..descriptors import descriptors_for_call
        built = descriptors_for_call(cu_seqlens, device=x.device, op="mamba_chunk_scan_combined")
        chunk_indices, chunk_offsets = built.chunk_indices, built.chunk_offsets
    options = dict(kernel_dtype=kernel_dtype, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
                   chunk_offsets=chunk_offsets, shape=launch, final_read=final_read)
    h0 = None if initial_states is None else initial_states.transpose(-1, -2)
    y, final = SsdChunkScan.apply(x, step, A, C.to(kernel_dtype), B.to(kernel_dtype), D, z, h0, resets, options)
    return y.to(x.dtype), final.transpose(-1, -2)


#: The backends the planner can choose for the chunked SSD (plan/__init__.py RULES).
_BACKENDS = {"torch": _ssd_torch, "triton": _ssd_triton}
