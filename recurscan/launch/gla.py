"""The launch of the scalar-decay GLA forward (kernels/gla/forward.py): one kernel, built once per
call signature (:func:`build_gla_forward`, kept in :data:`GLA_LAUNCHES`) and then launched
directly. Decides nothing: the launch shape is the plan's."""
from __future__ import annotations

import contextlib
import dataclasses

import torch
import triton
import triton.language as tl

from ..descriptors import CHUNK_SIZE
from ..kernels.gla.forward import chunk_simple_gla_fwd_kernel
from ..kernels.group_sum import group_sum_kernel
from ..plan import gla as plan_gla
from ..plan.device import sm_count
from ..plan.gla import GlaShape
from ..runtime.cache import SignatureCache, launch_key
from ..runtime.launcher import CallArg, compile_in_background
from ..runtime.streams import fork_side_stream
from .delta import (CALL_NAMES, INTERPRET, DeltaInputs, DeltaLaunches, Step, _empty, allocate_buffers,
                    build_delta_launches, is_sweep_step, launch_steps, per_key_prep_steps, run_delta_launches)
from .delta_backward import GROUP_SUM_ROWS

#: The per-call tensors of the launch, by name (its CallArgs).
NAMES = ("q", "k", "v", "g", "h0", "cu_seqlens", "o", "ht", "dt", "A", "dt_bias", "D", "z", "chunk_states",
         "chunk_offsets", "state_indices", "qg", "kg", "aqk", "dl", "chunk_indices", "calm_flags")


def call_values(**named) -> tuple:
    """A forward call's tensors in the order of :data:`NAMES` (None where not given)."""
    return tuple(named.get(n) for n in NAMES)


@dataclasses.dataclass(frozen=True)
class SsdPrologue:
    """Mamba2 SSD on the kernel: raw step sizes ``dt [B, T, HV]``, rates ``A [HV]``, ``dt_bias
    [HV]`` or None, skip ``D [HV]`` / ``[HV, V]`` or None, gate ``z [B, T, HV, V]`` or None, and
    the step-size options (the clamp where ``dt_limit`` is not (0, inf))."""

    dt: torch.Tensor
    A: torch.Tensor
    dt_bias: torch.Tensor | None
    D: torch.Tensor | None
    z: torch.Tensor | None
    dt_softplus: bool
    dt_limit: tuple

    def tensors(self):
        return (self.dt, self.A, self.dt_bias, self.D, self.z)

    @property
    def clamps(self) -> bool:
        return tuple(self.dt_limit) != (0.0, float("inf"))

def contiguous_prologue(ssd: SsdPrologue | None):
    """``(ssd with its tensors contiguous, those tensors in call order)``; ``(None, five Nones)``
    without SSD."""
    if ssd is None:
        return None, (None,) * 5
    extra = tuple(None if t is None else t.contiguous() for t in ssd.tensors())
    return dataclasses.replace(ssd, **dict(zip(("dt", "A", "dt_bias", "D", "z"), extra))), extra


#: Signature -> :class:`GlaForward`.
GLA_LAUNCHES = SignatureCache("chunked GLA forward")
#: Signature -> the delta sweep's launches (launch/delta.py's DeltaLaunches) of a scalar decay.
GLA_SWEEP_LAUNCHES = SignatureCache("chunked GLA forward on the delta sweep")


@dataclasses.dataclass
class GlaForward:
    """The launch of one call signature and the buffers it writes (name -> (shape, dtype));
    ``preps``: the per-key decay's prep (kernels/gla/prep.py; its calm pass, then its general
    steps, where planned), launched first."""

    step: Step
    buffers: dict
    preps: tuple = ()


def build_gla_forward(q, k, v, g, h0, cu_seqlens, *, scale, output_final_state, shape: GlaShape,
                      ssd: SsdPrologue | None = None, chunk_offsets=None, num_chunk_rows=None,
                      state_indices=None, state_v_first=False, outputs=True,
                      chunk_states_dtype=None, prep_rows=None) -> GlaForward:
    """What :func:`chunk_simple_gla_fwd` launches for these tensors' signature (none is kept).
    ``num_chunk_rows``: also the state entering every chunk, in q's dtype (the backward's
    recompute; varlen needs ``chunk_offsets``). ``h0``: the initial states ``[N, HV, K, V]``, or
    with ``state_indices`` a state cache ``[S, HV, K, V]``; ``state_v_first``: either is laid out
    ``[., HV, V, K]`` (mamba's [., H, P, Nstate]); read and written through its strides.
    ``outputs=False``: the states alone (the recompute; ``o`` is then a one-element placeholder).
    ``chunk_states_dtype``: the chunk states' dtype (default q's). ``prep_rows``: the prep
    (kernels/gla/prep.py) runs first, one program per chunk (this many: dense ``B * ceil(T / 64)``,
    varlen ``len(chunk_indices)``) and value head, and the sweep takes its gates (PER_KEY): always
    for g ``[B, T, HV, K]`` (a decay per key dimension); for a scalar decay or SSD, the split
    launch (``GlaShape.split``)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    varlen = cu_seqlens is not None
    N = cu_seqlens.shape[0] - 1 if varlen else B
    dt = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[q.dtype]
    dt = tl.float32 if INTERPRET and dt == tl.bfloat16 else dt  # the interpreter multiplies bf16 tiles wrongly
    BV = min(shape.block_v, max(16, triton.next_power_of_2(V)))
    buffers = {"o": ((B, T, HV, V) if outputs else (1,), v.dtype if ssd is not None else q.dtype)}
    if output_final_state:
        buffers["ht"] = ((N, HV, K, V), torch.float32)
    cache = state_indices is not None
    if cache:
        buffers.pop("ht", None)  # the final states go back into the cache
    if h0 is not None:
        s0 = h0.stride()
        s0_n, s0_h, s0_k, s0_v = (s0[0], s0[1], s0[3], s0[2]) if state_v_first else s0
    else:
        s0_n = s0_h = s0_k = s0_v = 0
    states = num_chunk_rows is not None
    if states:
        buffers["chunk_states"] = ((num_chunk_rows, HV, K, V), chunk_states_dtype or q.dtype)
    per_key = prep_rows is not None  # the sweep takes its gates from the prep
    scalar = g is None or g.dim() == 3  # one decay a head and token (or SSD's dt A)
    preps = ()
    if per_key:
        # A in float32: the sweep rounds it to its product operand once.
        buffers.update(qg=((B, T, HV, K), q.dtype), kg=((B, T, HV, K), q.dtype),
                       aqk=((B, T, HV, CHUNK_SIZE), torch.float32), dl=((prep_rows, HV, K), torch.float32))
    arg = lambda name, present=True: CallArg(name if present else "o")  # noqa: E731 (absent: a placeholder)
    BK = max(16, triton.next_power_of_2(K))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if per_key:
        prep = dict(
            q=arg("q"), k=arg("k"), g=arg("g", g is not None), qg=arg("qg"), kg=arg("kg"), aqk=arg("aqk"),
            dl=arg("dl"), cu_seqlens=arg("cu_seqlens", varlen), chunk_indices=arg("chunk_indices", varlen),
            chunk_offsets=arg("chunk_offsets", varlen), dt=arg("dt", ssd is not None), A=arg("A", ssd is not None),
            dt_bias=arg("dt_bias", ssd is not None and ssd.dt_bias is not None), T=T, n_seq=N, scale=float(scale),
            n_cs_rows=prep_rows, dt_min=float(ssd.dt_limit[0]) if ssd is not None and ssd.clamps else 0.0,
            dt_max=float(ssd.dt_limit[1]) if ssd is not None and ssd.clamps else 0.0, coef=arg("o"),
            sequence_order=arg("o"), H=H, HV=HV, K=K, BT=CHUNK_SIZE, BK=BK, IS_VARLEN=varlen, DT=dt,
            DOT_PRECISION=precision,
            HAS_G=g is not None, SCALAR=scalar and ssd is None, SSD=ssd is not None,
            HAS_DT_BIAS=ssd is not None and ssd.dt_bias is not None, DT_SOFTPLUS=ssd is not None and ssd.dt_softplus,
            DT_LIMIT=ssd is not None and ssd.clamps, FOR_SWEEP=False, BKB=0)
        calm = plan_gla.PER_KEY_CALM_PASS if g is not None and g.dim() == 4 else None
        if calm is not None:
            buffers["calm_flags"] = ((prep_rows * HV,), torch.int8)
        preps = tuple(per_key_prep_steps(prep, (prep_rows * HV,), calm, BK, dict(num_warps=8), arg("calm_flags")))
    step = Step(chunk_simple_gla_fwd_kernel, (N * HV * triton.cdiv(V, BV),), dict(
        q=arg("q"), k=arg("k"), v=arg("v"), g=arg("g", g is not None), o=arg("o"), h0=arg("h0", h0 is not None),
        ht=arg("ht", output_final_state and not cache), cu_seqlens=arg("cu_seqlens", varlen),
        dt=arg("dt", ssd is not None), A=arg("A", ssd is not None),
        dt_bias=arg("dt_bias", ssd is not None and ssd.dt_bias is not None),
        D=arg("D", ssd is not None and ssd.D is not None), z=arg("z", ssd is not None and ssd.z is not None),
        chunk_states=arg("chunk_states", states), chunk_offsets=arg("chunk_offsets", (states or per_key) and varlen),
        state_indices=arg("state_indices", cache), qg=arg("qg", per_key), kg=arg("kg", per_key),
        aqk=arg("aqk", per_key), dl=arg("dl", per_key), s0_n=s0_n, s0_h=s0_h, s0_k=s0_k, s0_v=s0_v,
        n_slots=h0.shape[0] if cache else 0,
        n_cs_rows=num_chunk_rows if states else (prep_rows if per_key else 0),
        T=T, scale=float(scale), dt_min=float(ssd.dt_limit[0]) if ssd is not None and ssd.clamps else 0.0,
        dt_max=float(ssd.dt_limit[1]) if ssd is not None and ssd.clamps else 0.0,
        H=H, HV=HV, K=K, V=V, BT=CHUNK_SIZE, BK=BK, BV=BV, IS_VARLEN=varlen,
        HAS_G=g is not None and not per_key, HAS_H0=h0 is not None, STORE_FINAL=output_final_state and not cache,
        DOT_PRECISION=precision, DT=dt,
        SSD=ssd is not None, HAS_DT_BIAS=ssd is not None and ssd.dt_bias is not None,
        DT_SOFTPLUS=ssd is not None and ssd.dt_softplus, DT_LIMIT=ssd is not None and ssd.clamps,
        HAS_D=ssd is not None and ssd.D is not None, D_PER_CHANNEL=ssd is not None and ssd.D is not None
        and ssd.D.dim() == 2, HAS_Z=ssd is not None and ssd.z is not None, STORE_CHUNK_STATES=states,
        USE_CACHE=cache, OUTPUTS=outputs, PER_KEY=per_key),
        dict(num_warps=shape.num_warps))
    return GlaForward(step, buffers, preps)


def _launch(launch: GlaForward, values: tuple) -> None:
    launch_steps([*launch.preps, launch.step], values, NAMES)


def chunk_simple_gla_fwd(q, k, v, g, *, scale, initial_state=None, output_final_state=False, cu_seqlens=None,
                         backward=None, chunk_state_rows=None, chunk_offsets=None, prep_rows=None,
                         chunk_indices=None, states_for_backward=False,
                         shape: GlaShape, ssd: SsdPrologue | None = None, state=None, state_indices=None,
                         state_v_first=False, out_views=None):
    """``(o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] float32 or None)`` of
    ``S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t`` (g ``[B, T, HV]`` or None).
    With ``ssd``: Mamba2 SSD, ``v`` holding x (:class:`SsdPrologue`), ``g`` None or ``[B, T]``
    (a log decay added per token: mamba's seq_idx as -inf resets), the output ``y`` in x's
    dtype. ``state, state_indices``: an in-place state cache in place of initial / final states
    (the final state returned is ``state``); ``state_v_first``: the initial states or the cache are
    laid out ``[., HV, V, K]``. Strided q, k, v, g (and the SSD tensors) are copied to the dense
    layout the kernel indexes; states are read through their strides. ``backward`` (a forward under
    autograd: its ``chunk_indices`` and ``chunk_offsets``): on the signature's first call the
    backward's kernels start compiling beside this one (:func:`compile_gla_backward_early`; with
    ``ssd``, the backward of autograd/ssd.py's SsdChunkScan, which takes x's signature for v and
    the step sizes' for g).
    ``chunk_state_rows``: also return the state entering every chunk, ``[rows, HV, K, V]`` float32
    (row ``chunk_offsets[n] + c``, dense ``n * ceil(T / 64) + c``; varlen rows past the last
    offset are zeros); returned third. ``states_for_backward`` (with ``chunk_state_rows``, on the
    delta sweep): the chunk states as the backward takes them (:func:`forward_states_rows`), in q's
    dtype and not zero-filled first (every row a chunk of the descriptors names is written, and the
    backward reads no other). ``prep_rows``: through the prep (:func:`build_gla_forward`;
    g ``[B, T, HV, K]``, a decay per key dimension, needs it); varlen then needs ``chunk_indices``
    and ``chunk_offsets``. A shape with ``sweep`` runs a scalar decay, SSD and a decay per key on
    the delta rule's prep (for a decay per key, kernels/gla/prep.py's) and sweep
    (:func:`_gla_on_sweep`); ``prep_rows`` then only says that the decay is per key.
    ``out_views``: ``(o, final)`` views the sweep writes into (launch/delta.py's ``out_views``;
    final in the kernel's ``[N, HV, K, V]``), returned as the outputs; the fused kernel ignores
    them. No host synchronisation."""
    if shape.sweep is not None and (prep_rows is None or (g is not None and g.dim() == 4)):
        return _gla_on_sweep(q, k, v, g, scale=scale, initial_state=initial_state,
                             output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                             chunk_state_rows=chunk_state_rows, chunk_offsets=chunk_offsets,
                             chunk_indices=chunk_indices, shape=shape, ssd=ssd, state=state,
                             state_indices=state_indices, state_v_first=state_v_first, backward=backward,
                             out_views=out_views, states_for_backward=states_for_backward)
    if states_for_backward:
        raise ValueError("chunk_simple_gla_fwd: states_for_backward runs on the delta sweep (a scalar decay with "
                         "GlaShape.sweep)")
    q, k, v = (x.contiguous() for x in (q, k, v))
    g = None if g is None else g.contiguous()
    h0 = state if state is not None else (None if initial_state is None else initial_state.float())
    ssd, extra = contiguous_prologue(ssd)
    options = None if ssd is None else (ssd.dt_softplus, tuple(ssd.dt_limit))
    key = (launch_key((q, k, v, g, h0, cu_seqlens, state_indices, chunk_offsets, chunk_indices) + extra),
           float(scale), output_final_state, shape, options, state_v_first, chunk_state_rows, prep_rows)
    launch = GLA_LAUNCHES.get(key)
    if launch is None:
        launch = GLA_LAUNCHES.put(key, build_gla_forward(q, k, v, g, h0, cu_seqlens, scale=scale,
                                                         output_final_state=output_final_state, shape=shape,
                                                         ssd=ssd, state_indices=state_indices,
                                                         state_v_first=state_v_first, chunk_offsets=chunk_offsets,
                                                         num_chunk_rows=chunk_state_rows,
                                                         chunk_states_dtype=torch.float32,
                                                         prep_rows=prep_rows))
        if backward is not None and prep_rows is None and not INTERPRET:
            compile_gla_backward_early(q, k, v, _backward_decay(g, ssd), h0, cu_seqlens, scale=scale, shape=shape,
                                       out=launch.buffers["o"], final=launch.buffers.get("ht"), **backward)
    made = {n: _empty(*s, dtype=d, device=q.device) for n, (s, d) in launch.buffers.items()}
    if chunk_state_rows is not None and (cu_seqlens is not None or state_indices is not None):  # padding rows stay zero
        made["chunk_states"] = made["chunk_states"].zero_()
    values = call_values(q=q, k=k, v=v, g=g, h0=h0, cu_seqlens=cu_seqlens,
                         **dict(zip(("dt", "A", "dt_bias", "D", "z"), extra)), chunk_offsets=chunk_offsets,
                         state_indices=state_indices, chunk_indices=chunk_indices, **made)
    _launch(launch, values)
    final = state if state is not None else made.get("ht")
    return (made["o"], final) if chunk_state_rows is None else (made["o"], final, made["chunk_states"])


def _gla_on_sweep(q, k, v, g, *, scale, initial_state, output_final_state, cu_seqlens, chunk_state_rows,
                  chunk_offsets, chunk_indices, shape: GlaShape, ssd, state, state_indices, state_v_first,
                  backward=None, out_views=None, states_for_backward=False):
    """:func:`chunk_simple_gla_fwd` of a scalar decay (or SSD) on the delta rule's prep and sweep
    with the WY step off, launched in ``shape.sweep`` (launch/delta.py builds the launches; varlen
    without ``chunk_indices`` forms them on the device, no sync); a decay per key (g ``[B, T, HV,
    K]``) through the per-key prep and the sweep's KEY_DECAY. Returns as
    :func:`chunk_simple_gla_fwd`."""
    key_decay = g is not None and g.dim() == 4
    if cu_seqlens is not None and chunk_indices is None:  # the prep's grid
        from .descriptors import device_descriptors
        chunk_indices = device_descriptors(cu_seqlens, 1, tokens=q.shape[1]).chunk_indices
    # The states [., HV, V, K] seen as [., HV, K, V]: the sweep reads and writes them through their strides.
    h0 = None if initial_state is None else initial_state.float()
    if state_v_first:
        h0 = None if h0 is None else h0.transpose(-1, -2)
        state = None if state is None else state.transpose(-1, -2)
    ssd, extra = contiguous_prologue(ssd)
    options = None if ssd is None else (ssd.dt_softplus, tuple(ssd.dt_limit))
    key = (launch_key((q, k, v, g, h0, state, state_indices, cu_seqlens, chunk_indices, chunk_offsets) + extra +
                      (out_views or ())), float(scale), output_final_state, shape, options, chunk_state_rows,
           states_for_backward)
    launches = GLA_SWEEP_LAUNCHES.get(key)
    if launches is None:
        launches = build_delta_launches(
            q, k, v, g, None, shape.sweep, scale=scale, initial_state=h0, output_final_state=output_final_state,
            cu_seqlens=cu_seqlens, chunk_indices_dp=chunk_indices, chunk_offsets=chunk_offsets,
            num_chunk_rows=chunk_state_rows, state=state, state_indices=state_indices,
            return_chunk_states=chunk_state_rows is not None, wy=False, ssd=ssd, key_decay=key_decay,
            out_views=out_views, chunk_states_dtype=q.dtype if states_for_backward else torch.float32)
        if states_for_backward:  # every row the backward reads is written: no fill
            launches.buffers["chunk_states"] = launches.buffers["chunk_states"][:2] + (None,)
        GLA_SWEEP_LAUNCHES.put(key, launches)
        if backward is not None and not key_decay and not INTERPRET:
            N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
            compile_gla_backward_early(q, k, v, _backward_decay(g, ssd), h0, cu_seqlens, scale=scale, shape=shape,
                                       out=launches.buffers["o"][:2], final=((N,) + h0_shape(q, v), torch.float32)
                                       if output_final_state else None, states_given=states_for_backward,
                                       **backward)
    given = None if out_views is None else {"o": out_views[0], "final": out_views[1]}
    out = run_delta_launches(launches, DeltaInputs(q, k, v, g, None, h0, state, state_indices, cu_seqlens,
                                                   chunk_indices, chunk_offsets, *extra), given)
    o, final = out[0], out[1]
    if state is not None:
        final = state.transpose(-1, -2) if state_v_first else state
    return (o, final) if chunk_state_rows is None else (o, final, out[2])


def _backward_decay(g, ssd: SsdPrologue | None):
    """A forward's log decay as its backward takes it: SSD's training forward (the step sizes
    given as ``ssd.dt``, float32 ``[B, T, HV]``) is differentiated as GLA with g = dt A (plus the
    resets), a tensor of the step sizes' signature; anything else's is ``g`` itself."""
    return g if ssd is None else ssd.dt


def h0_shape(q, v) -> tuple:
    """(HV, K, V) of a state of these inputs."""
    return v.shape[2], q.shape[3], v.shape[3]


#: The per-call tensors of the backward's two stages, by name.
BWD_NAMES = ("q", "k", "v", "g", "do", "dht", "h0", "cu_seqlens", "chunk_indices", "chunk_offsets", "states",
             "dstates", "dh0", "dv", "dq", "dk", "dg", "scratch", "dq_sum", "dk_sum", "qg", "kg", "aqk", "dl",
             "scores", "coef", "x", "step", "D", "dstep", "dD")

#: Signature -> :class:`GlaBackward`.
GLA_BACKWARD_LAUNCHES = SignatureCache("chunked GLA backward")


@dataclasses.dataclass
class GlaBackward:
    """A backward call's launches for one signature: the forward again for the chunk states, then
    ``steps`` (the reverse sweep and the parallel stage, per-call tensors by :data:`BWD_NAMES`) on
    ``buffers`` (name -> (shape, dtype)); where the parallel stage leaves dq and dk in shares (a
    value head's, or a few value heads', ``gva``) two more steps sum each query/key head's shares
    into ``dq_sum`` and ``dk_sum`` (kernels/group_sum.py; plan.gla.grads_heads). ``forward``:
    the GLA kernels' recompute, or for a scalar decay planned on the delta sweep
    (``GlaShape.sweep``) that sweep's launches for the states alone (:func:`_recompute_on_sweep`);
    where the forward kept the chunk states (``states_given``, :func:`forward_states_rows`) its
    group prep alone (the reverse sweep's scores and gates), or nothing without the group prep."""

    forward: GlaForward | DeltaLaunches | None
    steps: list
    buffers: dict
    gva: bool
    pending: object = None  # waits for the compiles a forward started (compile_gla_backward_early), or None
    # The recompute's sweep on a side stream beside the reverse sweep, after its group prep (GlaShape.corun).
    corun: bool = False
    # The parallel stage reads x as v, forming v = dt x in its factors (V_FROM_X): no v is formed.
    v_from_x: bool = False


@dataclasses.dataclass(frozen=True)
class SsdGrads:
    """Mamba2 SSD's elementwise gradients formed in the reverse sweep (its SSD_GRADS, kernels/gla/
    backward.py), where the backward's v is dt x and dO is dy (no gate z): the skip D per head or
    per channel, or none. The per-call tensors (x, the step sizes dt ``[B, T, HV]`` float32, D) are
    the backward's ``x``, ``step`` and ``D``."""

    has_d: bool
    d_per_channel: bool


def build_gla_backward(q, k, v, g, do, dht, h0, cu_seqlens, chunk_indices, chunk_offsets, *, scale,
                       shape: GlaShape, states_given: bool = False, ssd_grads: SsdGrads | None = None,
                       narrow: tuple = ()) -> GlaBackward:
    """What :func:`chunk_simple_gla_bwd` launches for these tensors' signature (none is kept). A
    decay per key dimension (g ``[B, T, HV, K]``) runs the prep again with the recompute, whose
    outputs (qg, kg, aqk, dl) the reverse sweep takes, and the parallel stage's per-key form.
    ``states_given``: the forward kept the chunk states (a scalar decay recomputed on the sweep,
    :func:`forward_states_rows`), so the recompute keeps only its group prep, where it has one.
    ``ssd_grads``: the reverse sweep writes x's gradient (in ``dv``'s place and q's dtype), dt's
    share through v (``dstep [B, T, HV, NV]``, a value block's sum each) and D's sums (``dD [2, N,
    HV, V]``) rather than dV (:class:`SsdGrads`). ``narrow``: the gradients among dq, dk and dv the
    caller takes in the inputs' dtypes, which the stages then store so (the same single rounding as
    a cast after, without a float32 copy written and read again): dq and dk (or, summed over a
    group's shares, their sums), dv where the Triton reverse sweep writes it (the Gluon twins write
    it in float32)."""
    from ..kernels.gla.backward import chunk_simple_gla_bwd_grads_kernel, chunk_simple_gla_bwd_sweep_kernel
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    varlen = cu_seqlens is not None
    N = cu_seqlens.shape[0] - 1 if varlen else B
    BT = CHUNK_SIZE
    rows = chunk_indices.shape[0] if varlen else B * triton.cdiv(T, BT)
    per_key = g is not None and g.dim() == 4
    group = False  # the reverse sweep reads the recompute's group prep (its scores and gates)
    if states_given and not on_sweep_recompute(shape, g):
        raise ValueError("build_gla_backward: chunk states from the forward replace a recompute on the delta sweep "
                         "(a scalar decay with GlaShape.sweep and recompute_on_sweep)")
    if on_sweep_recompute(shape, g):
        forward = _recompute_on_sweep(q, k, v, g, h0, cu_seqlens, chunk_indices, chunk_offsets, rows, scale=scale,
                                      shape=shape)
        group = "scores" in forward.buffers
        if states_given:
            forward = _group_prep_alone(forward) if group else None
    else:
        forward = build_gla_forward(q, k, v, g, h0, cu_seqlens, scale=scale, output_final_state=False, shape=shape,
                                    chunk_offsets=chunk_offsets, num_chunk_rows=rows, outputs=False,
                                    prep_rows=rows if per_key else None)
    # The stages' product operands and precision, as the forward's.
    dt = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[q.dtype]
    dt = tl.float32 if INTERPRET and dt == tl.bfloat16 else dt
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    BK, BV = max(16, triton.next_power_of_2(K)), min(32, max(16, triton.next_power_of_2(V)))
    f32 = torch.float32
    # The parallel stage's programs: HEADS value heads each, SPLIT per query/key head, whose shares
    # of dq and dk two more steps sum where SPLIT > 1.
    heads = plan_gla.grads_heads(rows, H, HV, K, V, per_key, sm_count(q.device))
    split = HV // H // heads
    # SSD's v = dt x formed in the parallel stage's factors where the plan says so and nothing else
    # reads v: the group form (a group's heads summed) with the chunk states kept by the forward (no
    # recompute's sweep)
    v_from_x = shape.v_from_x and ssd_grads is not None and states_given and heads > 1 and g is not None
    shares = split > 1  # dq and dk in value-head shares, summed after in float32
    buffers = dict(dstates=((rows, HV, K, V), q.dtype), dv=((B, T, HV, V), q.dtype if ssd_grads else f32),
                   dq=((B, T, H * split, K), q.dtype if "dq" in narrow and not shares else f32),
                   dk=((B, T, H * split, K), k.dtype if "dk" in narrow and not shares else f32),
                   scratch=((rows * H * split, BT, BT), q.dtype))
    has_d = ssd_grads is not None and ssd_grads.has_d
    if has_d:
        buffers["dD"] = ((2, N, HV, V), f32)
    if g is not None:
        buffers["dg"] = ((B, T, HV, K) if per_key else (B, T, HV), f32)
    if h0 is not None:
        buffers["dh0"] = ((N, HV, K, V), f32)
    arg = lambda name, present=True: CallArg(name if present else "dv")  # noqa: E731 (absent: a placeholder)
    common = dict(cu_seqlens=arg("cu_seqlens", varlen), chunk_offsets=arg("chunk_offsets", varlen), T=T,
                  scale=float(scale), n_cs_rows=rows, H=H, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, IS_VARLEN=varlen,
                  HAS_G=g is not None, DOT_PRECISION=precision, DT=dt)
    sweep_bv, sweep_warps = plan_gla.REVERSE_SWEEP
    sweep_bv = min(sweep_bv, max(16, triton.next_power_of_2(V)))
    sweep = Step(chunk_simple_gla_bwd_sweep_kernel, (N * HV * triton.cdiv(V, sweep_bv),), dict(
        common, BV=sweep_bv, q=arg("q"), k=arg("k"), g=arg("g", g is not None), do=arg("do"), dstates=arg("dstates"),
        dht=arg("dht", dht is not None), dh0=arg("dh0", h0 is not None), dv=arg("dv"), HAS_DHT=dht is not None,
        STORE_DH0=h0 is not None, qg=arg("qg", per_key), kg=arg("kg", per_key),
        aqk=arg("scores") if group else arg("aqk", per_key), dl=arg("dl", per_key), PER_KEY=per_key,
        coef=arg("coef", group), GATE_SCORES=group, x=arg("x", ssd_grads is not None),
        step=arg("step", ssd_grads is not None), D=arg("D", has_d), dx=arg("dv"),
        dstep=arg("dstep", ssd_grads is not None), dD=arg("dD", has_d), SSD_GRADS=ssd_grads is not None,
        HAS_D=has_d, D_PER_CHANNEL=has_d and ssd_grads.d_per_channel), dict(num_warps=sweep_warps))
    sweep = _reverse_sweep_twin(sweep, shape, q, k, do, group=group, per_key=per_key, rows=rows,
                                ssd_grads=ssd_grads is not None)
    if ssd_grads is not None:  # dt's share through v, a value block's sum each (the kernel chosen's blocks)
        buffers["dstep"] = ((B, T, HV, triton.cdiv(V, sweep.kwargs["BV"])), f32)
    elif "dv" in narrow and sweep.kernel is chunk_simple_gla_bwd_sweep_kernel:
        buffers["dv"] = (buffers["dv"][0], v.dtype)
    grouped = heads > 1
    dg_launch = plan_gla.grads_dg_launch(HV // H) if grouped and g is not None else None
    # PART 0: dq, dk and dg in one launch (one value head a program, or dg not apart); 1: dq and dk alone
    part = 1 if grouped and (g is None or dg_launch is not None) else 0
    grads_args = dict(
        common, q=arg("q"), k=arg("k"), v=arg("v"), g=arg("g", g is not None), do=arg("do"), states=arg("states"),
        dstates=arg("dstates"), dq=arg("dq"), dk=arg("dk"), dg=arg("dg", g is not None), scratch=arg("scratch"),
        chunk_indices=arg("chunk_indices", varlen), n_seq=N, PER_KEY=per_key, HEADS=heads,
        BV=max(16, triton.next_power_of_2(V)) if grouped else BV,
        PART=part, SIDE=0, step=arg("step", v_from_x), V_FROM_X=v_from_x)
    grads = Step(chunk_simple_gla_bwd_grads_kernel, (rows * H * split,), grads_args,
                 dict(num_warps=8, num_stages=plan_gla.GROUP_GRADS_STAGES if part == 1 else 1)
                 if grouped else dict(num_warps=8))
    steps = [sweep, grads]
    if part == 1 and plan_gla.GROUP_GRADS_SIDES is not None:  # dq, then dk, each alone
        options = dict(num_warps=plan_gla.GROUP_GRADS_SIDES, num_stages=plan_gla.GROUP_GRADS_STAGES)
        steps[1:] = [dataclasses.replace(grads, kwargs=dict(grads_args, SIDE=side), options=options) for side in (1, 2)]
    if dg_launch is not None:  # dg apart (PART 2), dg_heads value heads a program
        dg_heads, dg_warps = dg_launch
        steps.append(_dg_twin(Step(chunk_simple_gla_bwd_grads_kernel, (rows * HV // dg_heads,),
                                   dict(grads_args, HEADS=dg_heads, PART=2),
                                   dict(num_warps=dg_warps, num_stages=plan_gla.GROUP_GRADS_STAGES)),
                              shape, q, k, v, do, rows=rows))
    if shares:  # the programs' shares of dq and dk -> per q/k head
        buffers.update(dq_sum=((B, T, H, K), q.dtype if "dq" in narrow else f32),
                       dk_sum=((B, T, H, K), k.dtype if "dk" in narrow else f32))
        for name in ("dq", "dk"):
            steps.append(Step(group_sum_kernel, (triton.cdiv(B * T * H, GROUP_SUM_ROWS),), dict(
                x=arg(name), out=arg(name + "_sum"), rows=B * T * H, GROUP=split, K=K, BK=BK, BR=GROUP_SUM_ROWS),
                dict(num_warps=4)))
    return GlaBackward(forward, steps, buffers, shares, corun=group and shape.corun and not states_given,
                       v_from_x=v_from_x)


def _reverse_sweep_twin(sweep: Step, shape: GlaShape, q, k, do, *, group: bool, per_key: bool, rows: int,
                        ssd_grads: bool = False) -> Step:
    """The reverse sweep's launch: ``sweep`` (the Triton kernel at plan.gla.REVERSE_SWEEP), or with
    ``shape.reverse_twin`` its Gluon twin (kernels/gluon/gla_backward_sweep.py: the same arguments,
    64 value columns on one warpgroup; with ``shape.reverse_specialized`` warp-specialised,
    kernels/gluon/gla_backward_sweep_specialized.py) where the call allows it: the group prep's scores, a scalar
    decay, the twin's scope (plan.delta.gluon_sweep_scope), q, k and dO 16-byte aligned in one
    dtype, and chunk-state coordinates within int32; ``ssd_grads`` (SSD_GRADS) only on the
    warp-specialised form, one value block a program (V 64)."""
    from ..plan.delta import gluon_sweep_scope
    HV, K, V = do.shape[2], q.shape[3], do.shape[3]
    if ssd_grads and not (shape.reverse_specialized and V == 64):
        return sweep
    if not (shape.reverse_twin and group and not per_key and do.dtype == q.dtype
            and gluon_sweep_scope(householder=1, dtype=q.dtype, key_dim=K, value_dim=V)
            and all(x.data_ptr() % 16 == 0 for x in (q, k, do)) and (rows + 1) * HV * K < 2 ** 31):
        return sweep
    programs = sweep.grid[0] // triton.cdiv(V, sweep.kwargs["BV"]) * (V // 64)  # N * HV * V / 64
    if shape.reverse_specialized:
        from ..kernels.gluon.gla_backward_sweep_specialized import gluon_gla_bwd_sweep_specialized_kernel
        from .delta import SPECIALIZED_MAXNREG
        return Step(gluon_gla_bwd_sweep_specialized_kernel, (programs,),
                    dict(sweep.kwargs, BV=64, NUM_STAGES=plan_gla.GLUON_GLA_REVERSE_SPECIALIZED_STAGES),
                    dict(num_warps=4, maxnreg=SPECIALIZED_MAXNREG))
    from ..kernels.gluon.gla_backward_sweep import gluon_gla_bwd_sweep_kernel
    return Step(gluon_gla_bwd_sweep_kernel, (programs,),
                dict(sweep.kwargs, BV=64, NUM_STAGES=plan_gla.GLUON_GLA_REVERSE_STAGES), dict(num_warps=4))


def _dg_twin(dg: Step, shape: GlaShape, q, k, v, do, *, rows: int) -> Step:
    """The dg launch: ``dg`` (the Triton kernel's PART 2), or with ``shape.dg_twin`` its Gluon twin
    (kernels/gluon/gla_backward_dg.py: the same arguments, persistent programs of eight warps, one
    an SM; with ``shape.dg_specialized`` its warp-specialised form, kernels/gluon/
    gla_backward_dg_specialized.py, on four warps and two partitions under a register cap, for a
    group of at least plan.gla.GLUON_GLA_DG_SPECIALIZED_MIN_GROUP) where
    the call allows it (plan.gla.gluon_dg_scope; q, k, v and dO in one dtype and 16-byte aligned;
    chunk-state rows within int32)."""
    H, HV, K, V = q.shape[2], v.shape[2], q.shape[3], v.shape[3]
    if not (shape.dg_twin and do.dtype == v.dtype == q.dtype == k.dtype
            and plan_gla.gluon_dg_scope(dtype=q.dtype, key_dim=K, value_dim=V, group=HV // H)
            and all(x.data_ptr() % 16 == 0 for x in (q, k, v, do)) and (rows + 1) * HV * K < 2 ** 31):
        return dg
    grid = (min(sm_count(q.device), rows * H),)
    kwargs = dict(dg.kwargs, NUM_STAGES=plan_gla.GLUON_GLA_DG_STAGES)
    if shape.dg_specialized and HV // H >= plan_gla.GLUON_GLA_DG_SPECIALIZED_MIN_GROUP:
        from ..kernels.gluon.gla_backward_dg_specialized import gluon_gla_bwd_dg_specialized_kernel
        return Step(gluon_gla_bwd_dg_specialized_kernel, grid, kwargs,
                    dict(num_warps=4, maxnreg=DG_SPECIALIZED_MAXNREG))
    from ..kernels.gluon.gla_backward_dg import gluon_gla_bwd_dg_kernel
    return Step(gluon_gla_bwd_dg_kernel, grid, kwargs, dict(num_warps=8))


#: Registers a thread under the warp-specialised dg launch's cap: its two heads warpgroups and the
#: load warp launch as 12 warps (the load warp padded to its warpgroup), 384 threads x 168 within
#: the 64 K registers of an SM; setmaxnreg then moves them between the partitions
#: (kernels/gluon/gla_backward_dg_specialized.py's HEADS_REGS and LOAD_REGS).
DG_SPECIALIZED_MAXNREG = 168


def _recompute_on_sweep(q, k, v, g, h0, cu_seqlens, chunk_indices, chunk_offsets, rows, *, scale, shape):
    """The states entering every chunk (``chunk_states [rows, HV, K, V]`` in q's dtype, the rows
    of the GLA forward's) from the delta rule's prep (or the group prep) and sweep with the WY step
    off, the sweep forming no outputs (one product a chunk), in one pass
    (plan.gla.recompute_sweep_shape). With the group prep the call also returns its ``scores`` and
    ``coef`` (with the calm gates' column factors), which the reverse sweep reads (GATE_SCORES)."""
    sweep = plan_gla.recompute_sweep_shape(shape.sweep, q.shape[2], v.shape[2], twin=shape.recompute_twin)
    launches = build_delta_launches(q, k, v, g, None, sweep,
                                    scale=scale, initial_state=h0, cu_seqlens=cu_seqlens,
                                    chunk_indices_dp=chunk_indices, chunk_offsets=chunk_offsets,
                                    num_chunk_rows=rows, return_chunk_states=True, chunk_states_dtype=q.dtype,
                                    wy=False, states_only=True)
    # Every chunk state the stages read is written (a padding chunk's program reads none): no
    # fill; the output is never written, one element carries its dtype.
    buffers = dict(launches.buffers, o=((1,),) + launches.buffers["o"][1:],
                   chunk_states=launches.buffers["chunk_states"][:2] + (None,))
    outputs = ("chunk_states", "scores", "coef") if sweep.group_prep else ("chunk_states",)
    return dataclasses.replace(launches, buffers=buffers, outputs=outputs)


def on_sweep_recompute(shape: GlaShape, g) -> bool:
    """Whether the backward recomputes the chunk states on the delta sweep (a scalar decay, or
    none, with ``shape.sweep`` and ``shape.recompute_on_sweep``), the recompute that chunk states
    kept by the forward replace."""
    return shape.sweep is not None and shape.recompute_on_sweep and not (g is not None and g.dim() == 4)


def forward_states_rows(shape: GlaShape, q, g, cu_seqlens, chunk_indices) -> int | None:
    """The chunk-state rows a training forward keeps for its backward (``chunk_simple_gla_fwd``'s
    ``states_for_backward``), or None where it keeps none: with ``shape.forward_states`` where the
    backward would recompute them on the delta sweep (:func:`on_sweep_recompute`); dense ``B *
    ceil(T / 64)``, varlen one a row of ``chunk_indices``. They take q's dtype: B1 T16384 with 80
    value heads of 64 columns and K 128 keeps 335 MB in bf16, twice x's bytes."""
    if not (shape.forward_states and on_sweep_recompute(shape, g)):
        return None
    return chunk_indices.shape[0] if cu_seqlens is not None else q.shape[0] * triton.cdiv(q.shape[1], CHUNK_SIZE)


def _group_prep_alone(recompute: DeltaLaunches) -> DeltaLaunches:
    """The recompute's launches without its sweep: the group prep's scores and gates, which the
    reverse sweep reads, where the forward kept the chunk states."""
    buffers = {n: spec for n, spec in recompute.buffers.items() if n != "chunk_states"}
    return dataclasses.replace(recompute, buffers=buffers, steps=[s for s in recompute.steps if not is_sweep_step(s)],
                               outputs=("scores", "coef"))


def _gla_backward(q, k, v, g, do, dht, h0, cu_seqlens, chunk_indices, chunk_offsets, *, scale, shape,
                  states_given=False, ssd_grads=None, narrow=()):
    """The tensors as the stages index them, and the launches of their signature (built on its
    first call); ``ssd_grads``: SSD's ``(x, step, D)`` for the reverse sweep's SSD_GRADS, or None."""
    q, k, v, do = (x.contiguous() for x in (q, k, v, do))
    g = None if g is None else g.contiguous()
    h0 = None if h0 is None else h0.float().contiguous()
    dht = None if dht is None else dht.float().contiguous()
    tensors = (q, k, v, g, do, dht, h0, cu_seqlens, chunk_indices, chunk_offsets)
    flags = None
    if ssd_grads is not None:
        x, step, D = ssd_grads
        ssd_grads = (x.contiguous(), step.contiguous(), None if D is None else D.contiguous())
        flags = SsdGrads(D is not None, D is not None and D.dim() == 2)
    key = (launch_key(tensors + (ssd_grads or ())), float(scale), shape, states_given, flags, tuple(narrow))
    launches = GLA_BACKWARD_LAUNCHES.get(key)
    if launches is None:
        launches = GLA_BACKWARD_LAUNCHES.put(key, build_gla_backward(*tensors, scale=scale, shape=shape,
                                                                     states_given=states_given, ssd_grads=flags,
                                                                     narrow=tuple(narrow)))
    return launches, tensors, ssd_grads


def compile_gla_backward_early(q, k, v, g, h0, cu_seqlens, *, scale, shape, out, final, chunk_indices=None,
                               chunk_offsets=None, states_given=False, ssd_grads=None, final_read=True, narrow=()):
    """From a forward signature's first call under autograd (``out``, ``final``: its outputs'
    (shape, dtype), which dO and dht take; ``states_given``: it keeps the chunk states for the
    backward; ``ssd_grads``: SSD's ``(x, step, D)`` where its backward forms x's gradient in the
    reverse sweep; ``final_read``: the caller receives the final state, else dht is None; ``narrow``:
    as :func:`chunk_simple_gla_bwd` takes it): build the backward's launches and start compiling
    their kernels (the forward again for the chunk states, or what of it is left, the sweep, the
    parallel stage) on background threads, beside the forward's compile; the backward's first call
    waits for them."""
    device = q.device
    stand_in = lambda spec: torch.empty(16, dtype=spec[1], device=device)  # noqa: E731 (dtype and alignment)
    do = torch.empty(out[0], dtype=out[1], device=device)
    dht = None if final is None or not final_read else torch.empty(final[0], dtype=final[1], device=device)
    launches, (q, k, v, g, do, dht, h0, cu, ci, co), ssd_grads = _gla_backward(
        q, k, v, g, do, dht, h0, cu_seqlens, chunk_indices, chunk_offsets, scale=scale, shape=shape,
        states_given=states_given, ssd_grads=ssd_grads, narrow=narrow)
    if launches.pending is not None or launches.steps[0].direct is not None:
        return
    recompute = launches.forward
    if recompute is None:  # the forward kept the chunk states and the reverse sweep reads no group prep
        fwd_steps, fwd_names, fwd_values = [], CALL_NAMES, ()
    elif isinstance(recompute, DeltaLaunches):  # the delta sweep's prep and sweep (_recompute_on_sweep)
        inputs = tuple(DeltaInputs(q, k, v, g, None, h0, None, None, cu, ci, co))
        made_fwd = {n: stand_in(spec) for n, spec in recompute.buffers.items()}
        fwd_steps, fwd_names = recompute.steps, CALL_NAMES
        fwd_values = inputs + tuple(made_fwd.get(n) for n in CALL_NAMES[len(inputs):])
    else:
        fwd_steps, fwd_names = [*recompute.preps, recompute.step], NAMES
        fwd_values = call_values(q=q, k=k, v=v, g=g, h0=h0, cu_seqlens=cu, chunk_offsets=co, chunk_indices=ci,
                                 **{n: stand_in(spec) for n, spec in recompute.buffers.items()})
    kept = {} if recompute is None else recompute.buffers
    given = dict(q=q, k=k, v=v, g=g, do=do, dht=dht, h0=h0, cu_seqlens=cu, chunk_indices=ci, chunk_offsets=co,
                 states=stand_in(kept.get("chunk_states", (None, q.dtype))),
                 **{n: stand_in(kept[n]) for n in ("scores", "coef") if n in kept},
                 **dict(zip(("x", "step", "D"), ssd_grads or ())))
    made = {n: stand_in(spec) for n, spec in launches.buffers.items()}
    waits = [compile_in_background([(st.kernel, st.grid, st.kwargs, st.options) for st in fwd_steps], fwd_names,
                                   fwd_values, device)] if fwd_steps else []
    waits.append(compile_in_background([(st.kernel, st.grid, st.kwargs, st.options) for st in launches.steps],
                                       BWD_NAMES, tuple(given[n] if n in given else made.get(n) for n in BWD_NAMES),
                                       device))
    launches.pending = lambda: [w() for w in waits]


def chunk_simple_gla_bwd(q, k, v, g, do, dht, *, scale, initial_state=None, cu_seqlens=None, chunk_indices=None,
                         chunk_offsets=None, shape: GlaShape, chunk_states=None, ssd_grads=None, narrow=()):
    """Gradients ``(dq, dk, dv, dg, dh0)`` of :func:`chunk_simple_gla_fwd`'s ``(o, final_state)``
    (no SSD prologue) given ``do [B, T, HV, V]`` and ``dht [N, HV, K, V]`` (None: zeros); float32
    (those named in ``narrow``, of "dq", "dk", "dv", in q's, k's and v's dtypes where the stages
    can store them so: :func:`build_gla_backward`), None where the input was None; g ``[B, T, HV]``
    or, a decay per key dimension, ``[B, T, HV, K]`` (dg of its shape). The states entering every
    chunk are recomputed for the states alone (``OUTPUTS=False``; in q's dtype): a scalar decay
    planned on the delta sweep by that sweep, else by the GLA forward kernel; varlen needs
    ``chunk_indices`` and ``chunk_offsets``
    (:func:`recurscan.build_chunk_descriptors`). ``chunk_states``: those states as the forward kept
    them (``chunk_simple_gla_fwd``'s ``states_for_backward``, :func:`forward_states_rows`), in
    place of the recompute's sweep. ``ssd_grads``: Mamba2 SSD's ``(x, step, D)`` (v = step x, do =
    dy: no gate z; x in q's dtype, step float32 ``[B, T, HV]``, D ``[HV]``, ``[HV, V]`` or None),
    whose elementwise gradients the reverse sweep forms in dV's place (:class:`SsdGrads`): the
    return is then ``(dq, dk, dx, dg, dh0, dstep, dD)``, dx in x's dtype, dstep ``[B, T, HV, NV]``
    float32 (dt's gradient through v, in value-block shares to be summed; dg A is not in it), dD
    ``[2, N, HV, V]`` float32 shares (None without D); ``v`` may then be a callable forming v, called
    only where a stage reads v (the parallel stage forms v = dt x in its factors where it can:
    ``GlaBackward.v_from_x``), the launches keyed by x's signature. No host synchronisation."""
    form_v = callable(v)
    if form_v and ssd_grads is None:
        raise TypeError("chunk_simple_gla_bwd: v is a tensor, or with ssd_grads a callable forming one")
    # The launches are keyed by v, or where a callable forms it by x (its signature, as the
    # forward's early compile keys them); the stages then read v, or x where they form v themselves.
    launches, (q, k, keyed_v, g, do, dht, h0, cu_seqlens, chunk_indices, chunk_offsets), ssd_grads = _gla_backward(
        q, k, ssd_grads[0] if form_v else v, g, do, dht, initial_state, cu_seqlens, chunk_indices, chunk_offsets,
        scale=scale, shape=shape, states_given=chunk_states is not None, ssd_grads=ssd_grads, narrow=narrow)
    v = keyed_v if not form_v or launches.v_from_x else v().contiguous()
    if launches.pending is not None:  # compiling since the forward
        launches.pending()
        launches.pending = None
    # 1. The states entering every chunk (with corun: the group prep alone, its sweep beside step 2;
    # given: the group prep alone, or nothing).
    recompute = DeltaInputs(q, k, v, g, None, h0, None, None, cu_seqlens, chunk_indices, chunk_offsets)
    if chunk_states is not None:
        fwd = {"chunk_states": chunk_states}
        if launches.forward is not None:
            fwd.update(zip(("scores", "coef"), run_delta_launches(launches.forward, recompute)))
    elif launches.corun:
        recompute_buffers = allocate_buffers(launches.forward)  # on this stream: the join orders their reuse
        sweep_from = next(i for i, s in enumerate(launches.forward.steps) if is_sweep_step(s))
        fwd = dict(zip(("chunk_states", "scores", "coef"), run_delta_launches(
            launches.forward, recompute, given=recompute_buffers, steps=slice(0, sweep_from))))
    elif isinstance(launches.forward, DeltaLaunches):
        fwd = dict(zip(("chunk_states", "scores", "coef"), run_delta_launches(launches.forward, recompute)))
    else:
        fwd = {n: _empty(*s, dtype=d, device=q.device) for n, (s, d) in launches.forward.buffers.items()}
        _launch(launches.forward, call_values(q=q, k=k, v=v, g=g, h0=h0, cu_seqlens=cu_seqlens,
                                              chunk_offsets=chunk_offsets, chunk_indices=chunk_indices, **fwd))
    # 2-3. The reverse sweep, then the parallel stage.
    made = {n: _empty(*s, dtype=d, device=q.device) for n, (s, d) in launches.buffers.items()}
    given = dict(q=q, k=k, v=v, g=g, do=do, dht=dht, h0=h0, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
                 chunk_offsets=chunk_offsets, states=fwd["chunk_states"],
                 **{n: fwd[n] for n in ("qg", "kg", "aqk", "dl", "scores", "coef") if n in fwd},
                 **dict(zip(("x", "step", "D"), ssd_grads or ())))
    values = tuple(given[n] if n in given else made.get(n) for n in BWD_NAMES)
    if launches.corun:  # the reverse sweep, and the recompute's sweep beside it; the stage after both
        side = fork_side_stream(q.device)  # before the reverse sweep's launch, which it must not wait for
        launch_steps(launches.steps[:1], values, BWD_NAMES)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            run_delta_launches(launches.forward, recompute, given=recompute_buffers, steps=slice(sweep_from, None))
        if side is not None:
            torch.cuda.current_stream(q.device).wait_stream(side)
        launch_steps(launches.steps[1:], values, BWD_NAMES)
    else:
        launch_steps(launches.steps, values, BWD_NAMES)
    dq, dk = (made["dq_sum"], made["dk_sum"]) if launches.gva else (made["dq"], made["dk"])
    if ssd_grads is not None:
        return dq, dk, made["dv"], made.get("dg"), made.get("dh0"), made["dstep"], made.get("dD")
    return dq, dk, made["dv"], made.get("dg"), made.get("dh0")
