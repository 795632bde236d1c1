"""The launches of the streaming kernel (kernels/stream/recurrence.py), built from the planner's
StreamShape: the argument list (strides, family flags), the grid, and the splits of a sequence
longer than the device's bound on one dispatch (the state handed on through a float32 buffer).
No decisions here. The design is in docs/kernels-decode.md.

The ops build a call signature's launches once and keep them; :func:`run_stream` runs them on each
call's tensors, directly through the driver after the first (JIT) launch (runtime/launcher.py).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton

from ..kernels.stream.recurrence import streaming_recurrence_kernel
from ..plan.stream import DISPATCH_STEP_BOUND, StreamShape, StreamSizes, stream_shape
from ..problem import key_contiguous
from ..runtime.cache import SignatureCache, launch_key
from ..runtime.launcher import CallArg, jit_launch, resolve


class StreamTensors(NamedTuple):
    """The per-call tensors of a streaming launch (None where absent), named as the kernel's arguments:
    q, k ``[B, T, H, K]``; v, o ``[B, T, HV, V]``; g, beta, A, dt_bias, D, z (the family's);
    h0 the state read (``[rows, HV, K, V]``), ht the state written, slots ``[N]``, snaps
    ``[S, n_snap, HV, K, V]``, accepted ``[N]``, cu_seqlens ``[N + 1]``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor | None
    beta: torch.Tensor | None
    o: torch.Tensor
    A: torch.Tensor | None = None
    dt_bias: torch.Tensor | None = None
    D: torch.Tensor | None = None
    z: torch.Tensor | None = None
    h0: torch.Tensor | None = None
    ht: torch.Tensor | None = None
    slots: torch.Tensor | None = None
    snaps: torch.Tensor | None = None
    accepted: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None


_GATES = {None: 0, "scalar": 1, "per_key": 2, "ssd": 3}
_BETAS = {None: 0, "head": 1, "value": 2}


def _s(t: torch.Tensor | None, dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(t.stride(d) for d in dims) if t is not None else (0,) * len(dims)


def _state_strides(t: torch.Tensor | None, vk: bool, lead: int = 2) -> tuple[int, ...]:
    """(row, [token,] head, key, value) strides of a state tensor [rows, (tokens,) heads, ., .]."""
    if t is None:
        return (0,) * (lead + 2)
    n = t.dim()
    kd, vd = (n - 1, n - 2) if vk else (n - 2, n - 1)
    return tuple(t.stride(d) for d in range(lead)) + (t.stride(kd), t.stride(vd))


def streaming_recurrence(q, k, v, o, *, scale: float, delta: bool, gate: str | None = None, g=None,
                         beta=None, beta_mode: str | None = None, l2norm: bool = False, cu_seqlens=None,
                         initial=None, final=None, final_by_slot: bool = False, slots=None, snaps=None,
                         steps_per_token: int = 1, accepted=None, vk_layout: bool = False,
                         A=None, dt_bias=None, D=None, z=None, dt_tied: bool = False, A_tied: bool = True,
                         dt_softplus: bool = False, shape: StreamShape | None = None, num_sequences: int,
                         ) -> None:
    """Launch the streaming kernel (results written into ``o``, ``final``, ``snaps``).

    Shapes (strided views are fine; q/k must be contiguous along their last dim):
        q, k ``[B, T, H, K]``; v, o ``[B, T, HV, V]``; g ``[B, T, HV]`` (scalar gate / SSD dt
        tied), ``[B, T, HV, K]`` (per key) or ``[B, T, HV, V]`` (SSD dt per column); beta
        ``[B, T, HV]`` or ``[B, T, HV, V]``; z ``[B, T, HV, V]``; A ``[HV]`` or ``[HV, V, K]``;
        dt_bias, D ``[HV, V]`` (stride 0 where tied).
        initial ``[rows, HV, K, V]`` (``vk_layout``: ``[rows, HV, V, K]``), read at ``slots[n]``
        (or n); final: written at ``slots[n]`` when ``final_by_slot`` else at n; snaps
        ``[S, n_snap, HV, K, V]`` (same layout) at ``slots[n]``.

    Host cost. A call whose tensors have the shapes, strides, dtypes, devices and 16-byte
    alignments of an earlier call (everything Triton specializes on) reuses that call's launch
    arguments and compiled kernel: a key, a list and the driver launch, no re-planning.
    """
    tensors = StreamTensors(q, k, v, g, beta, o, A, dt_bias, D, z, initial, final, slots, snaps, accepted,
                            cu_seqlens)
    bound = DISPATCH_STEP_BOUND.get(q.device.type)
    key = (launch_key(tensors), delta, gate, beta_mode, l2norm, final_by_slot, steps_per_token, vk_layout, dt_tied,
           A_tied, dt_softplus, shape, num_sequences, bound)
    hit = LAUNCHES.get(key)
    if hit is None:
        if shape is None:
            state = initial if initial is not None else final
            sbytes = state.element_size() if state is not None else 4
            shape = stream_shape(StreamSizes(num_sequences * v.shape[2], q.shape[3], v.shape[3], q.shape[1], sbytes,
                                             vk_layout or key_contiguous(state)), q.device)
        hit = LAUNCHES.put(key, build_stream_launches(
            tensors, shape, scale=scale, delta=delta, gate=gate, beta_mode=beta_mode, l2norm=l2norm,
            final_by_slot=final_by_slot, steps_per_token=steps_per_token, vk_layout=vk_layout, dt_tied=dt_tied,
            A_tied=A_tied, dt_softplus=dt_softplus, num_sequences=num_sequences))
    run_stream(hit, tensors, scale)


def run_stream(hit: "StreamLaunches", tensors: "StreamTensors", scale: float) -> None:
    """Launch ``hit`` on ``tensors`` (a StreamTensors, or a plain tuple in its order; they must match
    the tensors it was built for, in :func:`launch_key`)."""
    global DIRECT_LAUNCH_ERROR
    values = tensors + (float(scale),)  # absent tensors are never read: the launch points them at o
    if hit.direct is not None:
        try:
            hit.direct(values)
            return
        except Exception as exc:  # never silently: recorded here, asserted None by the GPU tests
            DIRECT_LAUNCH_ERROR = f"{type(exc).__name__}: {exc}"
            hit.direct = None
    direct = _launch_jit(hit, tensors, values)
    hit.direct = direct if DIRECT_LAUNCH_ERROR is None else None


#: Set if a cached direct launch ever failed (the JIT path is then used for good); None is expected.
DIRECT_LAUNCH_ERROR: str | None = None


class StreamLaunches:
    """The launch arguments of one call signature: grid, the kernel's arguments (per-call values
    as ``CallArg``), the number of launches, and the direct launch once compiled."""

    __slots__ = ("grid", "kwargs", "launches", "bound", "handoff_shape", "direct", "vk_layout", "final_by_slot",
                 "options")


def build_stream_launches(tensors: StreamTensors, shape: StreamShape, *, scale, delta, gate=None, beta_mode=None,
                          l2norm=False, final_by_slot=False, steps_per_token=1, vk_layout=False, dt_tied=False,
                          A_tied=True, dt_softplus=False, num_sequences) -> StreamLaunches:
    """The launch (argument list, grid, splits) of one call signature in the launch ``shape``,
    from the tensors' shapes and strides; keeps no tensor. Arguments as :func:`streaming_recurrence`."""
    (q, k, v, g, beta, o, A, dt_bias, D, z, initial, final, slots, snaps, accepted, cu_seqlens) = tensors
    bound = DISPATCH_STEP_BOUND.get(q.device.type)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    steps = int(snaps is not None) and steps_per_token
    gate_dims = (0, 1, 2, 3) if (g is not None and g.dim() == 4) else (0, 1, 2)
    sg = _s(g, gate_dims) + ((0,) if len(gate_dims) == 3 else ())
    sb = _s(beta, (0, 1, 2)) + ((beta.stride(3),) if beta is not None and beta.dim() == 4 else (0,))
    sA = ((A.stride(0),) + ((A.stride(2), A.stride(1)) if A.dim() == 3 else (0, 0))) if A is not None else (0, 0, 0)
    strides = (_s(q, (0, 1, 2)) + _s(k, (0, 1, 2)) + _s(v, (0, 1, 2, 3)) + sg + sb + _s(o, (0, 1, 2))
               + _s(z, (0, 1, 2, 3)) + sA + _s(dt_bias, (0, 1)) + _s(D, (0, 1))
               + _state_strides(initial, vk_layout) + _state_strides(final, vk_layout)
               + _state_strides(snaps, vk_layout, lead=3))
    flags = dict(H=H, HV=HV, K=K, V=V, BK=shape.BK, BV=shape.BV, DELTA=bool(delta), GATE=_GATES[gate],
                 BETA=_BETAS[beta_mode], L2NORM=bool(l2norm), DT_TIED=bool(dt_tied), A_TIED=bool(A_tied),
                 DT_SOFTPLUS=bool(dt_softplus), HAS_DT_BIAS=dt_bias is not None, HAS_D=D is not None,
                 HAS_Z=z is not None, USE_H0=initial is not None, STORE_HT=final is not None,
                 HT_BY_SLOT=bool(final_by_slot), HAS_SLOTS=slots is not None, STEPS=steps,
                 HAS_ACCEPTED=accepted is not None, VARLEN=cu_seqlens is not None, HANDOFF=False,
                 PREFETCH=T > 1, EVICT=shape.evict, FLAGGED=False)
    # Slots index the cache, its snapshots and (by slot) the final state: bounded by the fewest rows.
    n_slots = min([t.shape[0] for t in (initial, final if final_by_slot else None, snaps) if t is not None],
                  default=0)
    kw = dict(zip(_STRIDE_NAMES, strides), **flags, scale=CallArg("scale"), T=T, t_begin=0, t_end=T,
              n_snap=snaps.shape[1] if snaps is not None else 0, n_slots=n_slots)
    for name, t in zip(_TENSOR_NAMES, tensors):
        kw[name] = CallArg(name if t is not None else "o")  # an absent pointer: o (its flag keeps it unread)
    kw["hin"] = CallArg("o")  # the hand-off input of split launches; unread by a single launch
    kw["flags"] = CallArg("o")  # FLAGGED's (launch/delta.py's fused prefill); unread here
    hit = StreamLaunches()
    hit.grid = (num_sequences * HV * triton.cdiv(V, shape.BV),)
    hit.kwargs = kw
    hit.launches = 1 if bound is None or T <= bound else triton.cdiv(T, bound)
    hit.bound = bound
    hit.handoff_shape = (num_sequences, HV, K, V)
    hit.direct = None
    hit.vk_layout, hit.final_by_slot = vk_layout, final_by_slot
    hit.options = dict(num_warps=shape.num_warps, num_stages=shape.num_stages)
    if shape.maxnreg is not None:
        hit.options["maxnreg"] = shape.maxnreg
    return hit


def _launch_jit(hit: StreamLaunches, tensors: StreamTensors, values):
    """Launch through Triton's JIT (compiles on first use); returns the direct launch when one
    launch covers the call (the cached fast path), else None."""
    if hit.launches == 1:
        return jit_launch(streaming_recurrence_kernel, hit.grid, hit.kwargs, hit.options, _CALL_NAMES, values)
    # Launch splits: each launch covers [t_begin, t_end) of every sequence; the state is handed on
    # through a float32 buffer indexed by sequence; only the last launch writes ``final``.
    kw = resolve(hit.kwargs, _CALL_NAMES, values)
    final = tensors[_HT]
    handoff = torch.empty(hit.handoff_shape, dtype=torch.float32, device=tensors[0].device)
    for i in range(hit.launches):
        last = i == hit.launches - 1
        out = final if last else handoff
        kw.update(t_begin=i * hit.bound, t_end=(i + 1) * hit.bound, hin=handoff, HANDOFF=i > 0,
                  ht=out if out is not None else kw["o"], STORE_HT=out is not None,
                  HT_BY_SLOT=hit.final_by_slot if last else False)
        kw.update(zip(("s1_n", "s1_h", "s1_k", "s1_v"),
                      _state_strides(out, hit.vk_layout if last else False)))
        streaming_recurrence_kernel[hit.grid](**kw, **hit.options)
    return None


_STRIDE_NAMES = (
    "sq_b sq_t sq_h sk_b sk_t sk_h sv_b sv_t sv_h sv_d sg_b sg_t sg_h sg_d sb_b sb_t sb_h sb_d so_b so_t so_h "
    "sz_b sz_t sz_h sz_v sA_h sA_k sA_v sdb_h sdb_v sD_h sD_v s0_n s0_h s0_k s0_v "
    "s1_n s1_h s1_k s1_v ss_n ss_t ss_h ss_k ss_v").split()
_TENSOR_NAMES = StreamTensors._fields
_HT = _TENSOR_NAMES.index("ht")
_CALL_NAMES = _TENSOR_NAMES + ("scale",)  # the per-call values of a direct launch, in order
#: streaming_recurrence's launches by call signature.
LAUNCHES = SignatureCache("stream launches")
