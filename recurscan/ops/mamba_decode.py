"""Mamba2 decode: ``selective_state_update``, compatible with mamba_ssm's, on the streaming kernel.

mamba_ssm's call and shapes (``mamba_ssm/ops/triton/selective_state_update.py``)::

    state [S, nheads, dim, dstate]   x, dt, z [batch, nheads, dim]   A [nheads, dim, dstate]
    B, C [batch, ngroups, dstate]    D, dt_bias [nheads, dim]        state_batch_indices [batch]

(in a Mamba2 layer dt, A, D and dt_bias are per-head numbers broadcast over dim / dstate by
stride-0 views; the kernel sees those strides and loads one number). The no-heads forms (state
``[S, dim, dstate]``, x ``[batch, dim]``, A ``[dim, dstate]``, B ``[batch, dstate]``, D ``[dim]``)
are accepted as in mamba_ssm. Beyond mamba_ssm: a draft-token dimension (x, dt, z
``[batch, T, nheads, dim]``, B, C ``[batch, T, ngroups, dstate]``), ``intermediate_states
[S, T, nheads, dim, dstate]`` (the state after every token, at the request's slot) and
``num_accepted_tokens`` (each request restarts from its last accepted snapshot).

Per head, token and state element (p, n)::

    dt  = softplus(dt + dt_bias) (if dt_softplus)
    h   = exp(A[p, n] dt[p]) h + dt[p] x[p] B[n]
    y   = sum_n h[p, n] C[n] + D[p] x[p];   y *= silu(z[p])   (if z)

:func:`selective_state_update_reference` is that token step written out in PyTorch: the CPU
backend, and the reference of the general (per-element A, per-column dt) form, which is wider
than the oracle's scalar-A SSD (``reference/ssd.py``; the tests tie the two together where they
overlap). Padding: a ``state_batch_indices`` entry of -1 gives a zero output and leaves every
slot untouched.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..plan import DISPATCH_STEP_BOUND, plan
from ..problem import check_dt_softplus, contiguous_indices, needs_grad, ssd_decode_problem
from ..runtime.cache import SignatureCache, launch_key
from .decode import _launch


class _Prepared:
    """A validated call signature: its schedule, and its launches once built (CUDA tensors)."""

    __slots__ = ("schedule", "launches")

    def __init__(self, schedule):
        self.schedule, self.launches = schedule, None


#: CUDA call signature -> its _Prepared.
PREPARED = SignatureCache("selective_state_update")


def _canonical(state, x, dt, A, B, C, D, z, dt_bias, intermediate_states):
    """Views in the with-heads, with-tokens form: state [S, H, P, N], x/dt/z [b, T, H, P],
    A [H, P, N], B/C [b, T, G, N], D/dt_bias [H, P], snapshots [S, T, H, P, N]."""
    heads = state.dim() == 4
    tokens = x.dim() == 4
    if not heads:  # mamba's no-heads form: one head
        state = state.unsqueeze(1)
        x, dt = x.unsqueeze(1), dt.unsqueeze(1)
        z = None if z is None else z.unsqueeze(1)
        A = A.unsqueeze(0)
        B, C = B.unsqueeze(1), C.unsqueeze(1)
        D = None if D is None else D.unsqueeze(0)
        dt_bias = None if dt_bias is None else dt_bias.unsqueeze(0)
        if intermediate_states is not None:
            intermediate_states = intermediate_states.unsqueeze(2)
    if not tokens:
        x, dt = x.unsqueeze(1), dt.unsqueeze(1)
        z = None if z is None else z.unsqueeze(1)
        B, C = B.unsqueeze(1), C.unsqueeze(1)
    return state, x, dt, A, B, C, D, z, dt_bias, intermediate_states, heads, tokens


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, *, intermediate_states=None, num_accepted_tokens=None,
                           backend=None):
    """Mamba2's decode step against a state cache, in place; returns the output (x's shape and dtype).

    Args:
        state: ``[S, nheads, dim, dstate]`` (or ``[S, dim, dstate]``) cache, float32, bfloat16 or
            float64, updated in place (bf16 accumulates in float32). Inference-only: with an argument
            that requires grad (the cache included), a NotImplementedError on every backend.
        x, dt, z: ``[batch, nheads, dim]`` (or ``[batch, dim]``, or ``[batch, T, nheads, dim]`` for T
            draft tokens); z optional (``y * silu(z)``).
        A: ``[nheads, dim, dstate]`` (or ``[dim, dstate]``); usually a stride-0 broadcast of ``[nheads]``.
        B, C: ``[batch, ngroups, dstate]`` (``[batch, dstate]``; ``[batch, T, ngroups, dstate]``).
        D, dt_bias: ``[nheads, dim]`` (or ``[dim]``) or None.
        dt_softplus: ``dt = softplus(dt + dt_bias)`` (threshold 20, as torch and mamba).
        state_batch_indices: ``[batch]`` int slots, -1 for padding (zero output, no state access);
            None: request i uses slot i.
        intermediate_states: ``[S, T, nheads, dim, dstate]``: ``[slot, t]`` receives the state after
            token t (speculative decoding); padding writes nothing.
        num_accepted_tokens: ``[batch]`` int: request i starts from ``intermediate_states[slot,
            a - 1]`` for ``a = num_accepted_tokens[i] > 0``, else from ``state[slot]``. Each value
            must lie in ``[0, T]`` (T: the snapshots a request holds): on CPU tensors anything
            else is a ValueError; on CUDA tensors (not read on the host) the kernel reads a value
            below 0 as 0 and one above T as T, never outside the buffer.
        backend: None (CUDA: the Triton kernel; CPU: the PyTorch token step), "torch" or "triton".

    Returns:
        ``out`` shaped like x, in x's dtype.

    Example:
        >>> import torch, recurscan
        >>> state = torch.zeros(4, 2, 3, 5)
        >>> x, dt = torch.randn(2, 2, 3), torch.rand(2, 2, 3)
        >>> A = -torch.ones(2)[:, None, None].expand(2, 3, 5)
        >>> B, C = torch.randn(2, 1, 5), torch.randn(2, 1, 5)
        >>> y = recurscan.selective_state_update(state, x, dt, A, B, C, state_batch_indices=torch.tensor([3, -1]))
        >>> y.shape, bool(y[1].eq(0).all()), bool(state[:3].eq(0).all())
        (torch.Size([2, 2, 3]), True, True)
    """
    on_gpu = isinstance(x, torch.Tensor) and x.is_cuda
    prep = None
    state_batch_indices, num_accepted_tokens = contiguous_indices(state_batch_indices, num_accepted_tokens)
    if on_gpu:  # the hot path: one key over every argument, validated and planned once per key
        key = (launch_key((state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices, intermediate_states,
                     num_accepted_tokens)), bool(dt_softplus), backend, DISPATCH_STEP_BOUND["cuda"])
        prep = PREPARED.get(key)
        if prep is not None:
            check_dt_softplus(dt_softplus)  # the key holds bool(dt_softplus): "no" would find True's entry
    if prep is None:
        problem = ssd_decode_problem(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                     state_batch_indices=state_batch_indices,
                                     intermediate_states=intermediate_states,
                                     num_accepted_tokens=num_accepted_tokens)
        prep = _Prepared(plan("ssd", problem, x.device, "recurrent", backend))
        if on_gpu:
            PREPARED.put(key, prep)
    if needs_grad(state, x, dt, A, B, C, D, z, dt_bias, intermediate_states):
        raise NotImplementedError(
            "selective_state_update: inference-only on every backend (the state cache is written in place, and "
            "the Triton kernel is forward-only): train through mamba_chunk_scan_combined, or call under "
            "torch.no_grad()")
    out_shape = x.shape
    (state4, x4, dt4, A3, B4, C4, D2, z4, db2, snaps, _, _) = _canonical(state, x, dt, A, B, C, D, z, dt_bias,
                                                                         intermediate_states)
    if prep.schedule.backend == "torch":
        y = selective_state_update_reference(state4, x4, dt4, A3, B4, C4, D2, z4, db2, dt_softplus,
                                             state_batch_indices, intermediate_states=snaps,
                                             num_accepted_tokens=num_accepted_tokens)
        return y.reshape(out_shape)
    b, T, H, P = x4.shape
    y = torch.empty(b, T, H, P, dtype=x.dtype, device=x.device)
    # mamba's per-head numbers come as stride-0 broadcasts: load one number instead of a row
    dt_tied = dt4.stride(3) == 0 and (db2 is None or db2.stride(1) == 0)
    A_tied = A3.stride(1) == 0 and A3.stride(2) == 0
    if C4.stride(-1) != 1:
        C4 = C4.contiguous()
    if B4.stride(-1) != 1:
        B4 = B4.contiguous()
    L_ = _launch()
    # launch/stream.StreamTensors' fields, as a plain tuple (its constructor costs 0.4 us a call)
    tensors = (C4, B4, x4, dt4[..., 0] if dt_tied else dt4, None, y, A3[:, 0, 0] if A_tied else A3, db2, D2, z4,
               state4, state4, state_batch_indices, snaps, num_accepted_tokens, None)
    if prep.launches is None:
        prep.launches = L_.build_stream_launches(
            tensors, prep.schedule.launch, scale=1.0, delta=False, gate="ssd", final_by_slot=True, steps_per_token=1,
            vk_layout=True, dt_tied=dt_tied, A_tied=A_tied, dt_softplus=bool(dt_softplus), num_sequences=b)
    L_.run_stream(prep.launches, tensors, 1.0)
    return y.reshape(out_shape)


def selective_state_update_reference(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                     state_batch_indices=None, *, intermediate_states=None,
                                     num_accepted_tokens=None):
    """The Mamba2 decode step, token by token, in PyTorch (the canonical with-heads, with-tokens form).

    state ``[S, H, P, N]`` (in place); x, dt, z ``[b, T, H, P]``; A ``[H, P, N]``; B, C
    ``[b, T, G, N]``; D, dt_bias ``[H, P]``; state_batch_indices ``[b]`` (-1: padding);
    intermediate_states ``[S, T, H, P, N]``; num_accepted_tokens ``[b]``. Computes in float32
    (float64 if the state or x is float64); returns y ``[b, T, H, P]`` in x's dtype.
    """
    cd = torch.float64 if torch.float64 in (state.dtype, x.dtype) else torch.float32
    b, T, H, P = x.shape
    G = B.shape[2]
    slots = torch.arange(b, device=x.device) if state_batch_indices is None else state_batch_indices.long()
    live = slots >= 0
    rows = slots.clamp(min=0)
    h = state[rows].to(cd)  # [b, H, P, N]
    if num_accepted_tokens is not None:
        a = num_accepted_tokens.long().clamp(max=intermediate_states.shape[1])
        snap = intermediate_states[rows, (a - 1).clamp(min=0)].to(cd)
        h = torch.where((a > 0).view(-1, 1, 1, 1), snap, h)
    A = A.to(cd)
    y = torch.zeros(b, T, H, P, dtype=cd, device=x.device)
    for t in range(T):
        x_t, dt_t = x[:, t].to(cd), dt[:, t].to(cd)  # [b, H, P]
        if dt_bias is not None:
            dt_t = dt_t + dt_bias.to(cd)
        if dt_softplus:
            dt_t = F.softplus(dt_t)
        B_t = B[:, t].to(cd).repeat_interleave(H // G, dim=1)  # [b, H, N]
        C_t = C[:, t].to(cd).repeat_interleave(H // G, dim=1)
        h = torch.exp(A * dt_t[..., None]) * h + (dt_t * x_t)[..., None] * B_t[:, :, None, :]
        y_t = torch.einsum("bhpn,bhn->bhp", h, C_t)
        if D is not None:
            y_t = y_t + D.to(cd) * x_t
        if z is not None:
            y_t = y_t * F.silu(z[:, t].to(cd))
        y[:, t] = y_t
        if intermediate_states is not None:
            intermediate_states[rows[live], t] = h[live].to(intermediate_states.dtype)
    state[rows[live]] = h[live].to(state.dtype)
    y = y.masked_fill(~live.view(-1, 1, 1, 1), 0)
    return y.to(x.dtype)
