"""Launch shapes of the GLA engine (kernels/gla/; chunked SSD runs on it too): one row for now
(docs/kernels-gla-plan.md; the H200 figures in docs/perf-history.md)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..descriptors import CHUNK_SIZE
from ..problem import SsdProblem
from .delta import DELTA_LAUNCH, DeltaShape, DeltaSizes, GluonTwinRow, gluon_sweep_scope
from .device import gluon_usable, sm_count


@dataclass(frozen=True)
class GlaShape:
    block_v: int  # value columns a program carries
    num_warps: int
    reason: str
    # A scalar decay (and SSD) through the prep and the sweep with PER_KEY, as a decay per key
    # runs (kernels/gla/prep.py): the chunk's A and gates parallel over chunks, the sweep's loop
    # the state's chain alone; False: one fused kernel. Slower on the H200 (chunk_simple_gla B4
    # T4096 forward 1.87 against 0.50 ms, SSD B1 T16384 9.05 against 1.96:
    # gpu_gla_split_shapes_357d748.json), as the per-key path itself is (chunk_gla 2.49 ms, fla
    # 0.72); kept to run a scalar decay through that path in its tests.
    split: bool = False
    # A scalar decay (and SSD) on the delta rule's prep and sweep with their WY step off
    # (kernels/delta/, WY=False): the chunk's gates and A parallel over chunks in the prep, the
    # sweep's chain one product a chunk, and the sweep's segments, phases and bulk stores; this
    # shape says how they launch. None: the fused kernel above.
    sweep: DeltaShape | None = None
    # With ``sweep``: the backward recomputes the chunk states on that sweep too (its states alone,
    # 376 instructions and 18 barriers a chunk offline for sm_90, against the fused kernel's 949
    # and 19, plus the prep's parallel pass); False: on the fused kernel.
    recompute_on_sweep: bool = False
    # With ``recompute_on_sweep``: that recompute's sweep as its Gluon twin (:data:`GLUON_GLA_RECOMPUTE_SWEEP`).
    recompute_twin: bool = False
    # The backward's reverse sweep on the group prep's scores as its Gluon twin (:data:`GLUON_GLA_REVERSE_SWEEP`).
    reverse_twin: bool = False
    # With reverse_twin: that twin warp-specialised (:data:`GLUON_GLA_REVERSE_SPECIALIZED`).
    reverse_specialized: bool = False
    # The parallel stage's dg launch as its Gluon twin (:data:`GLUON_GLA_DG`).
    dg_twin: bool = False
    # With dg_twin: that twin warp-specialised (:data:`GLUON_GLA_DG_SPECIALIZED`).
    dg_specialized: bool = False
    # The recompute's sweep on a stream of its own beside the reverse sweep, where the recompute runs
    # the group prep, which the reverse sweep reads (:data:`GLA_BACKWARD_CORUN`).
    corun: bool = False
    # With ``recompute_on_sweep``: a training forward keeps the chunk states (in the inputs' dtype),
    # and the backward reads them in place of its recompute's sweep (:data:`GLA_FORWARD_STATES`).
    forward_states: bool = False
    # SSD without a gate z: the reverse sweep forms x's and dt's gradients and D's sums in place of
    # dV (its SSD_GRADS), so no elementwise pass reads dV (:data:`GLA_REVERSE_SSD_GRADS`).
    reverse_ssd_grads: bool = False
    # With forward_states and reverse_ssd_grads: the parallel stage reads x and forms v = dt x in
    # its factors (V_FROM_X) rather than reading v formed by a pass of its own (:data:`GLA_PARALLEL_V_FROM_X`).
    v_from_x: bool = False


GLA_LAUNCH = GlaShape(64, 8, "64 value columns on 8 warps: offline for sm_90 the chunk loop spills 40 local "
                              "loads and stores against 193 on 4 warps; on the H200 chunk_simple_gla B4 T4096 "
                              "0.49 ms forward (fla 0.24), SSD B1 T16384 2.1 (mamba_ssm 0.70; "
                              "gpu_gla_cold_357d748.json). The backward's recompute on the delta sweep: forward "
                              "+ backward chunk_simple_gla 1.256 ms against 1.313 on this kernel, SSD B1 5.112 "
                              "against 5.389 (gpu_call_7188cb0.log), B4 4.75 against 4.83 "
                              "(gpu_gla_sweep_cdc4e1d.json)", recompute_on_sweep=True)


def gla_shape(problem, device, gluon: bool = True) -> GlaShape:
    """The GLA kernels' launch shape for ``problem`` (a GlaProblem or SsdProblem) on ``device``:
    :data:`GLA_LAUNCH`, and for a scalar decay (and SSD) the delta sweep's launch shape
    (:func:`gla_sweep_shape`) where :data:`SCALAR_ON_SWEEP`; ``gluon`` False (``backend="triton"``):
    no Gluon twin."""
    if getattr(problem, "per_key_decay", False):
        return replace(GLA_LAUNCH, sweep=per_key_sweep_shape(problem, device)) if PER_KEY_ON_SWEEP else GLA_LAUNCH
    if not SCALAR_ON_SWEEP or GLA_LAUNCH.split:
        return GLA_LAUNCH
    sweep = gla_sweep_shape(problem, device, gluon=gluon)
    group_recompute = GLA_LAUNCH.recompute_on_sweep and GROUP_PREP_MIN_HEADS is not None and \
        _group(problem) >= GROUP_PREP_MIN_HEADS  # the recompute on the group prep (recompute_sweep_shape)
    reverse_twin = group_recompute and GLUON_GLA_REVERSE_SWEEP.on and \
        _twin_usable(replace(sweep, block_v=64, num_warps=4), problem, device, gluon)
    return replace(GLA_LAUNCH, sweep=sweep,
                   recompute_twin=group_recompute and GLUON_GLA_RECOMPUTE_SWEEP.on and
                   _twin_usable(sweep, problem, device, gluon),
                   reverse_twin=reverse_twin, reverse_specialized=reverse_twin and GLUON_GLA_REVERSE_SPECIALIZED.on,
                   dg_twin=GLUON_GLA_DG.on and gluon and gluon_usable(device),
                   dg_specialized=GLUON_GLA_DG.on and GLUON_GLA_DG_SPECIALIZED.on and gluon and gluon_usable(device),
                   corun=_corun(problem, device),
                   forward_states=GLA_FORWARD_STATES and GLA_LAUNCH.recompute_on_sweep and forward_states_fit(problem),
                   reverse_ssd_grads=GLA_REVERSE_SSD_GRADS, v_from_x=GLA_PARALLEL_V_FROM_X)


#: Whether a training forward of a scalar decay (and SSD) keeps the state entering every chunk, in
#: the inputs' dtype, for its backward, which then skips its recompute's sweep (and, without the
#: group prep, the whole recompute): the warp-specialised forward sweep stores them from its
#: hand-over buffer (one bulk store a chunk off the chain's critical path), the other sweeps from
#: registers. Memory for time, within :data:`GLA_FORWARD_STATES_MAX_RATIO`. Forward + backward,
#: eager, bf16, same process (gpu_gla_train_7a865ad.json, GPU time): SSD B1 T16384 (80 heads x 64,
#: dstate 128) 2252 us against 2684 (the recompute's sweep, 414 us, gone; the forward sweep 355
#: against 328; the reverse sweep 383 against 460, no longer beside the recompute), B4 T4096 2142
#: against 2251; chunk_simple_gla B4 T4096 H16 1052 against 1164. SSD B1 keeps 335 MB in bf16.
GLA_FORWARD_STATES = True
#: The most bytes the kept chunk states (:data:`GLA_FORWARD_STATES`) may take, as a multiple of the
#: inputs' (q, k, v; SSD: x, B, C): larger states are recomputed by the backward. The delta rule's
#: training issue sets the same budget for all the bytes a forward saves. SSD at dstate 128 and
#: head dim 64 keeps 1.9x (its states K V a head a chunk of 64 tokens against x's 64 V), at dstate
#: 256 3.8x (recomputed); simple GLA at K = V = 128, 0.67x.
GLA_FORWARD_STATES_MAX_RATIO = 2.0


def forward_states_fit(problem) -> bool:
    """Whether the chunk states of ``problem`` (a GlaProblem or SsdProblem) fit
    :data:`GLA_FORWARD_STATES_MAX_RATIO` times its inputs' bytes."""
    if isinstance(problem, SsdProblem):
        key, value, heads = problem.state_dim, problem.head_dim, problem.heads
        inputs = heads * value + 2 * problem.groups * key
    else:
        key, value, heads = problem.key_dim, problem.value_dim, problem.value_heads
        inputs = 2 * problem.heads * key + heads * value
    return heads * key * value <= GLA_FORWARD_STATES_MAX_RATIO * CHUNK_SIZE * inputs


#: Whether SSD's training backward (no gate z, x in the kernels' dtype) forms x's gradient, dt's
#: through v = dt x, and D's sums in the reverse sweep (SSD_GRADS; the warp-specialised form where
#: it runs, with V 64) rather than writing dV for an elementwise pass (autograd/ssd.py's
#: step_backward). The sweep reads x's tiles instead and writes dx in x's dtype, half dV's bytes.
#: Forward + backward, eager, bf16, same process (gpu_gla_train_7a865ad.json, GPU time): SSD B1
#: T16384 2581 us against 2684 (step_backward's 235 us gone, the reverse sweep 533 against 460: its
#: outputs warpgroups take the extra work and bound it), B4 T4096 2088 against 2251.
GLA_REVERSE_SSD_GRADS = True

#: Whether, with the chunk states kept (:data:`GLA_FORWARD_STATES`) and x's gradient from the reverse
#: sweep (:data:`GLA_REVERSE_SSD_GRADS`), nothing reading v but the parallel stage, that stage reads x
#: and forms v = dt x in its factors (V_FROM_X) rather than a pass forming v for it. Slower on the
#: H200 (gpu_gla_train_7a865ad.json, SSD B1 T16384, GPU time): the dq/dk launch 524 us against 371 and
#: the warp-specialised dg 506 against 471, for the 94 us of the pass forming v.
GLA_PARALLEL_V_FROM_X = False


#: The backward's recompute of the chunk states (its sweep, after the group prep) on a stream of its
#: own beside the reverse sweep, which reads the group prep's scores and gates and none of the
#: sweep's outputs, where the reverse sweep's programs (sequences x value heads x 64-column blocks)
#: are at most this share of the SMs: their idle SMs take the recompute's programs. None: never.
#: SSD forward + backward, eager, same process (gpu_gla_sweep_fe4bb86.json): B1 T16384 (80
#: programs on 132 SMs) 2.688 ms against 2.904 on one stream; B4 T4096 (320 programs) 2.517 at a
#: share of 3.0 against 2.544, within the noise, so the share stops below it (the delta rule's
#: corun, plan.delta.DELTA_BACKWARD_LAUNCH, likewise gained where SMs were idle).
GLA_BACKWARD_CORUN: float | None = 1.0


def _corun(problem, device) -> bool:
    """Whether the backward runs its recompute's sweep beside its reverse sweep
    (:data:`GLA_BACKWARD_CORUN`)."""
    if GLA_BACKWARD_CORUN is None:
        return False
    value_heads = getattr(problem, "value_heads", None) or problem.heads
    value_dim = getattr(problem, "value_dim", None) or problem.head_dim
    return problem.sequences * value_heads * -(-value_dim // 64) <= GLA_BACKWARD_CORUN * sm_count(device)


#: Whether a scalar decay runs on the delta rule's prep and sweep (WY off) rather than the fused kernel.
SCALAR_ON_SWEEP = True
#: Whether a decay per key runs on the per-key prep and the delta sweep (KEY_DECAY) rather than
#: the per-key prep and the fused kernel (PER_KEY).
PER_KEY_ON_SWEEP = True


def per_key_sweep_shape(problem, device) -> DeltaShape:
    """The delta sweep's launch shape for a decay per key: the scalar decay's row
    (:func:`gla_sweep_shape`) as :func:`per_key_shape_of` adapts it."""
    return per_key_shape_of(gla_sweep_shape(problem, device))


def per_key_shape_of(shape: DeltaShape) -> DeltaShape:
    """``shape`` without phases (the per-key prep has no phase range) and with the per-key prep's
    launch: one value head a program; its calm pass first where :data:`PER_KEY_CALM_PASS` (then the
    general steps for the other chunks, 8 warps), else the general steps alone on 8 warps with no
    register cap."""
    shape = replace(shape, phases=1, prep_heads=1, prep_warps=8, prep_maxnreg=None, gluon_sweep=False,
                    sweep_scores=False)
    if PER_KEY_CALM_PASS is None:
        return shape
    block, warps, maxnreg = PER_KEY_CALM_PASS
    return replace(shape, key_calm_pass=True, prep_key_block=block, prep_warps=warps, prep_maxnreg=maxnreg)


#: The per-key prep's calm pass (kernels/gla/prep.py, CALM_PASS): keys a step, warps, register
#: cap; it writes every chunk whose decays are calm in a few whole-chunk steps, and the general
#: steps then do the others. None: the general steps alone. H200, chunk_gla B4 T4096 H16 K = V =
#: 128, GLA's decays: 0.278 ms (the prep 186 us, the sweep 86; fla 0.732 in the same process);
#: 32 keys on 4 warps uncapped 0.289, 16 on 4 capped at 128 0.301, 16 on 4 0.365, all keys on 8
#: warps 0.380, 32 on 8 0.425; without the calm pass 0.985 (A's diagonal blocks in the prep) and
#: 1.281 (A's diagonal blocks in small programs of their own, a kernel since retired)
#: (gpu_gla_per_key_5e37baa.json).
PER_KEY_CALM_PASS: tuple[int, int, int | None] | None = (32, 4, 168)


#: Launch shapes of a scalar decay (and SSD) on the delta sweep (WY off), read top to bottom as
#: the delta rule's table; a problem no row covers takes the delta rule's row (not measured for
#: GLA). H200, eager, bf16, forward ms (benchmarks/gpu_gla_sweep.py, gpu_gla_sweep_6dc10bf.json):
#: SSD is 80 heads x 64, dstate 128; simple GLA H16 K = V = 128.
#: A row whose shape names the Gluon twin (``gluon_sweep``) applies only where the twin may run
#: (:func:`gla_sweep_shape`).
GLA_SWEEP_LAUNCH: list[tuple[Callable[[DeltaSizes], bool], DeltaShape]] = [
    (lambda s: GROUP_PREP_MIN_HEADS is not None and s.group >= GROUP_PREP_MIN_HEADS and 3 * s.programs_64 >= s.sms,
     DeltaShape(64, 4, 3, 8, "query/key heads shared by many value heads, a third of the SMs or more in 64-column "
                         "programs: the group prep in one pass on 8 warps without a register cap, the sweep its "
                         "Gluon twin gating the scores, warp-specialised (the chain, two outputs warpgroups, the "
                         "loads), three stages, bulk stores (SSD B4 T4096: 0.376 ms, two stages 0.379, the twin on "
                         "one warpgroup 0.421, the Triton sweep (the next rows) 0.598; B1 T16384 0.429, two stages "
                         "0.434, the twin 0.490, the delta prep in 6 phases with the twin 0.606; mamba_ssm 0.700 and "
                         "0.735 in that process: gpu_gla_sweep_ws2_4ac0362.json, gpu_gla_sweep_78bb842.json. The "
                         "prep's form, GPU us at B1 / B4: 8 warps uncapped 28.4 / 27.4, 4 warps at 168 registers "
                         "29.0 / 29.1, 32 value heads a program 32.0 / 31.8: gpu_gla_sweep_d529156.json; 27.6 "
                         "against 29.7 at B1 in gpu_gla_sweep_70e9ece.json)",
                tma_store=True, group_prep=True, gluon_sweep=True, specialized=True, prep_maxnreg=None)),
    (lambda s: not s.varlen and s.tokens >= 16384 and 3 * s.programs_64 >= s.sms and s.programs_64 <= s.sms,
     DeltaShape(64, 4, 3, 4, "a long dense sequence over a third of the SMs or more in 64-column programs: one "
                         "pass in 6 phases (each phase's prep beside the previous phase's sweep), bulk stores (SSD "
                         "B1 T16384: 0.712 ms; 8 phases 0.719, one pass 0.820, 3 segments 0.769, 2 segments 0.929, "
                         "16 heads a prep program 1.168, the group prep with its calm gates in 6 phases 1.176, "
                         "in 2 segments 0.844; mamba_ssm 0.798: gpu_gla_sweep_cdc4e1d.json, "
                         "gpu_gla_sweep_8916489.json)",
                tma_store=True, phases=6)),
    (lambda s: s.group == 1 and 3 * s.programs_64 >= s.sms,
     DeltaShape(64, 4, 3, 4, "a query/key head a value head (simple GLA), a third of the SMs or more in 64-column "
                         "programs: the group prep's coef alone, the sweep forming the scores from its tiles, warp-"
                         "specialised, three stages, bulk stores (simple GLA B4 T4096 H16: 118 us of GPU time, four "
                         "stages 120, on the Triton sweep 202, the group prep's scores 154, the delta prep and the "
                         "Triton sweep (the last row) 153; B8 233 against 352; fla 204 and 429: "
                         "gpu_gla_sweep_qk1.json)",
                tma_store=True, group_prep=True, sweep_scores=True, gluon_sweep=True, specialized=True)),
    (lambda s: GROUP_PREP_MIN_HEADS is not None and s.group >= GROUP_PREP_MIN_HEADS and s.programs_64 > s.sms,
     DeltaShape(64, 4, 2, 4, "more 64-column programs than SMs, query/key heads shared by many value heads: the "
                         "group prep, two stages (two programs an SM), bulk stores (SSD B4 T4096: 0.592 ms; three "
                         "stages 0.718, 8 warps 0.828, the delta prep (the next row) 0.721, with the calm gates 0.638; "
                         "mamba_ssm 0.834: gpu_gla_sweep_0021590.json, gpu_gla_sweep_8916489.json)", tma_store=True,
                group_prep=True)),
    (lambda s: s.programs_64 > s.sms,
     DeltaShape(64, 4, 3, 4, "more 64-column programs than SMs: 64 columns on 4 warps, bulk stores (SSD B4 T4096: "
                         "0.725 ms; 64 on 8 warps 0.862, 32 columns 0.858, 2 segments 0.742; mamba_ssm 0.851)",
                tma_store=True)),
    (lambda s: 2 * s.programs_64 >= s.sms,
     DeltaShape(64, 4, 3, 4, "at most one 64-column program per SM: masked stores (simple GLA B4 T4096: 0.151 ms; "
                         "bulk stores 0.179, 64 on 8 warps 0.197, 32 columns 0.227, 2 segments 0.215; fla 0.592)")),
]


def gla_sweep_shape(problem, device, gluon: bool = True) -> DeltaShape:
    """The delta sweep's launch shape for a scalar-decay GLA or SSD ``problem``: the first row of
    :data:`GLA_SWEEP_LAUNCH` that holds for its sizes, else the delta rule's (plan/delta.py), its
    sweep given to the Gluon twin where :func:`gluon_gla_forward_sweep` allows (``gluon``); a row
    naming the twin holds where :data:`GLUON_GLA_GROUP_SWEEP` is on, the twin may run and SSD has
    no gate z; a varlen batch is one whose sequences are not its batch rows."""
    value_heads = getattr(problem, "value_heads", None) or problem.heads  # SsdProblem: heads
    value_dim = getattr(problem, "value_dim", None) or problem.head_dim
    varlen = problem.sequences != problem.batch
    sizes = DeltaSizes(pairs=problem.sequences * value_heads, sms=sm_count(device), value_dim=value_dim,
                       tokens=problem.tokens, varlen=varlen, sequences=problem.sequences, group=_group(problem))
    # A gate z would run the Triton sweep (launch/delta.py), which on the group prep in one pass
    # loses to the delta prep's phases at SSD B1 (0.887 ms against 0.709; gpu_gla_sweep_0021590.json).
    twin_rows = GLUON_GLA_GROUP_SWEEP.on and not getattr(problem, "gated", False)
    shape = next(shape for applies, shape in GLA_SWEEP_LAUNCH + DELTA_LAUNCH if applies(sizes) and
                 (not shape.gluon_sweep or twin_rows and _twin_usable(shape, problem, device, gluon)))
    return gluon_gla_forward_sweep(shape if shape.group_prep else with_prep_heads(shape, problem), problem, device,
                                   gluon)


#: The forward sweep's Gluon twin with the WY step off (kernels/gluon/delta_sweep.py: U = V, SSD's
#: skip D x; no gate z), taken by :func:`gluon_gla_forward_sweep` on phased rows.
GLUON_GLA_FORWARD_SWEEP = GluonTwinRow(True, "SSD B1 T16384 (80 heads x 64, dstate 128) forward in 6 phases, eager, "
                                             "same process (gpu_gla_sweep_twin_0c2f6c8.json): 0.510 ms at the phases' "
                                             "ratio 0.8 (0.541 at none; the sweep 384 us) against the Triton sweep's "
                                             "0.709 (619 us); mamba_ssm 0.938 there. In one pass it lost for simple "
                                             "GLA B4 T4096 (0.196 against the planned 0.164) and won within noise for "
                                             "SSD B4 T4096 on the delta prep (0.577 against the group prep's 0.591), "
                                             "so only phased rows take it. The Triton sweep's bits "
                                             "(tests/gpu/test_gluon_gla_sweep_gpu.py)")
#: The same twin on the group prep's scores (GATE_SCORES: each value head's gate tile formed in
#: the sweep, beside its products): :data:`GLA_SWEEP_LAUNCH`'s first row, which names it.
GLUON_GLA_GROUP_SWEEP = GluonTwinRow(True, "SSD forward, eager, same process (gpu_gla_sweep_78bb842.json): B4 T4096 "
                                           "0.420 ms against the Triton sweep's 0.598 on the same group prep (the "
                                           "sweep 312 us against 491); B1 T16384 in one pass 0.490 against the delta "
                                           "prep's 6 phases with the twin, 0.606 (the sweep 394 us beside the group "
                                           "prep's 80, against 382 beside 437); mamba_ssm 0.707 / 0.718. The Triton "
                                           "sweep's bits (tests/gpu/test_gluon_gla_sweep_gpu.py)")
#: The phases' ratio (DeltaShape.phase_ratio) where the GLA sweep runs as its Gluon twin (SSD B1
#: T16384: 0.510 ms at 0.8 against 0.541 without; gpu_gla_sweep_twin_0c2f6c8.json).
GLUON_GLA_SWEEP_PHASE_RATIO = 0.8


def gluon_gla_forward_sweep(shape: DeltaShape, problem, device, gluon: bool = True) -> DeltaShape:
    """``shape`` with its sweep given to the Gluon twin, its phases falling off by
    :data:`GLUON_GLA_SWEEP_PHASE_RATIO`, where :data:`GLUON_GLA_FORWARD_SWEEP` is on,
    the twin runs here (``plan.device.gluon_usable``), the row is phased and of the twin's kind
    (64 value columns on one warpgroup, the delta prep) and the problem is in
    ``plan.delta.gluon_sweep_scope``; ``shape`` as it is otherwise and where ``gluon`` is False
    (a row that names the twin is never reached then). A call the twin cannot take (a gate z,
    unaligned inputs, strided outputs; launch/delta.py checks) runs the Triton sweep."""
    if not _twin_usable(shape, problem, device, gluon):
        return shape
    if GLUON_GLA_FORWARD_SWEEP.on and shape.phases > 1 and not shape.group_prep:
        return replace(shape, gluon_sweep=True, phase_ratio=GLUON_GLA_SWEEP_PHASE_RATIO)
    return shape


def _twin_usable(shape: DeltaShape, problem, device, gluon: bool) -> bool:
    """Whether ``shape``'s sweep may run as its Gluon twin for ``problem`` on ``device``: ``gluon``
    (not ``backend="triton"``), the twin runs here (``plan.device.gluon_usable``), the row is of the
    twin's kind (64 value columns on one warpgroup) and the problem in ``plan.delta.gluon_sweep_scope``."""
    key_dim = getattr(problem, "key_dim", None) or problem.state_dim  # SsdProblem: dstate
    value_dim = getattr(problem, "value_dim", None) or problem.head_dim
    return (gluon and gluon_usable(device) and shape.block_v == 64 and shape.num_warps == 4 and
            gluon_sweep_scope(householder=1, dtype=problem.dtype, key_dim=key_dim, value_dim=value_dim))


#: The backward's recompute of the chunk states (no outputs: one product a chunk) on the forward
#: sweep's Gluon twin (kernels/gluon/delta_sweep.py, OUTPUTS off) rather than the Triton sweep,
#: taken by :func:`gla_shape` where the twin may run (the forward's row of 64 value columns on
#: one warpgroup) and the recompute runs the group prep (measured there only: SSD's groups).
GLUON_GLA_RECOMPUTE_SWEEP = GluonTwinRow(True, "SSD forward + backward, eager, same process "
                                               "(gpu_gla_sweep_5d25e3f.json): B1 T16384 3.384 ms against 3.468 on the "
                                               "Triton sweep (the recompute's sweep ~244 us against 331), B4 T4096 "
                                               "2.925 against 2.926 (~160 us against 171). The Triton sweep's "
                                               "gradients bit for bit (tests/gpu/test_gluon_gla_sweep_gpu.py)")


#: The backward's reverse sweep on the group prep's scores (GATE_SCORES, its calm gates) as its
#: Gluon twin (kernels/gluon/gla_backward_sweep.py: 64 value columns on one warpgroup, the tiles by
#: bulk copies into a ring, (K dS')^T and the next dS' as two products at once) rather than the
#: Triton kernel at :data:`REVERSE_SWEEP`, taken by :func:`gla_shape` where the twin may run and the
#: recompute runs the group prep (measured there only: SSD's groups).
GLUON_GLA_REVERSE_SWEEP = GluonTwinRow(True, "SSD forward + backward, eager, same process "
                                             "(gpu_gla_sweep_train_9702617.json): B1 T16384 3.080 ms against 3.368 on "
                                             "the Triton kernel (the reverse sweep 573 us against 898), B4 T4096 2.713 "
                                             "against 2.918 (381 against 624). The Triton kernel's gradients bit for "
                                             "bit (tests/gpu/test_gluon_gla_reverse_sweep_gpu.py, "
                                             "test_gluon_gla_sweep_gpu.py)")
#: The reverse sweep's Gluon twin's pipeline stages (each 48 KB at K 128: k, q, dO and the scores).
GLUON_GLA_REVERSE_STAGES = 2
#: The reverse sweep's twin warp-specialised (kernels/gluon/gla_backward_sweep_specialized.py: the
#: chain on one warpgroup, the outputs on two taking alternate chunks, the loads on one warp), where
#: :data:`GLUON_GLA_REVERSE_SWEEP` gives the reverse sweep to the twin: the twin's outputs took 2.34
#: of its 2.55 us a chunk (SSD B1 T16384, results/gpu_gla_reverse_probe_4c4f11f.json).
GLUON_GLA_REVERSE_SPECIALIZED = GluonTwinRow(True, "SSD forward + backward, eager, same process, medians "
                                                   "(gpu_gla_sweep_2c61664.json): B1 T16384 2.372 ms (2680 us of "
                                                   "GPU time) against 2.536 (2848) on the twin, B4 T4096 2.302 "
                                                   "(2250) against 2.391 (2331). The twin's gradients bit for bit "
                                                   "(tests/gpu/test_gluon_gla_sweep_gpu.py, "
                                                   "test_gluon_gla_reverse_sweep_gpu.py)")
#: Its ring's stages: two (48 KB each at K 128, beside two dS' hand-over buffers of 16 KB, two gate
#: tiles of 8 KB, two dV stagings of 16 KB and the layout conversions' scratch: 188 KB); three
#: come to 237676 B, past the H200's 232448.
GLUON_GLA_REVERSE_SPECIALIZED_STAGES = 2

#: The parallel stage's dg launch (PART 2, a group's value heads summed in the dq and dk launches)
#: as its Gluon twin (kernels/gluon/gla_backward_dg.py: persistent programs of eight warps, each
#: step a value head's tiles by bulk copies into a ring, its four products issued together) rather
#: than the Triton kernel at :data:`GROUP_GRADS_DG`, taken by :func:`gla_shape` where Gluon may run;
#: launch.gla checks its scope (:func:`gluon_dg_scope`).
GLUON_GLA_DG = GluonTwinRow(True, "SSD forward + backward, eager, same process (gpu_gla_sweep_train_0ca9708.json): "
                                  "B1 T16384 2.894 ms against 3.087 on the Triton kernel (the dg launch 673 us against "
                                  "~866), B4 T4096 2.535 against 2.721 (675 against ~866). dg within float32 rounding "
                                  "of the Triton kernel's, the gradients of training too "
                                  "(tests/gpu/test_gluon_gla_dg_gpu.py)")
#: The dg twin's pipeline stages (48 KB each at K 128: dO, V, S and dS' of one value head).
GLUON_GLA_DG_STAGES = 3
#: The dg twin warp-specialised (kernels/gluon/gla_backward_dg_specialized.py: two warpgroups
#: taking alternate value heads, each its products and its epilogue, a load warp filling the
#: ring), where :data:`GLUON_GLA_DG` gives the dg launch to the twin.
GLUON_GLA_DG_SPECIALIZED = GluonTwinRow(True, "forward + backward, eager, bf16, same process "
                                              "(gpu_gla_train_7a865ad.json, GPU time): SSD B1 T16384 2480 us against "
                                              "2684 (the dg launch 471 us against the twin's 653), B4 T4096 2045 "
                                              "against 2251. dg within float32 rounding of the Triton kernel's, "
                                              "SSD training's gradients too (tests/gpu/test_gluon_gla_dg_gpu.py)")
#: The smallest group (value heads a query/key head) the warp-specialised dg takes; smaller ones
#: run the twin (offline for sm_90 a group of 3 at K 128 spills 8 B; 4 to 8 and 80, and K 64, none).
GLUON_GLA_DG_SPECIALIZED_MIN_GROUP = 4


def gluon_dg_scope(*, dtype: torch.dtype, key_dim: int, value_dim: int, group: int) -> bool:
    """What the dg launch's Gluon twin takes: 16-bit inputs, K 64 or 128, V 64 and a group of at
    least :data:`GLUON_GLA_DG_STAGES` value heads a query/key head."""
    return dtype in (torch.bfloat16, torch.float16) and key_dim in (64, 128) and value_dim == 64 and \
        group >= GLUON_GLA_DG_STAGES


#: A scalar decay (and SSD) whose query/key heads each serve at least this many value heads may
#: run the group prep (DeltaShape.group_prep: the scores once per query/key head, the gates of all
#: its value heads in one program; the sweep gates the scores per value head): where
#: :data:`GLA_SWEEP_LAUNCH`'s row says so, and always for the backward's recompute
#: (:func:`recompute_sweep_shape`). None: never.
GROUP_PREP_MIN_HEADS: int | None = 8


def recompute_sweep_shape(sweep: DeltaShape, heads: int, value_heads: int, twin: bool = False) -> DeltaShape:
    """The delta sweep's launch for the backward's recompute of the chunk states (no outputs): the
    forward's ``sweep`` in one pass (no segments or phases), with the group prep wherever a
    query/key head serves :data:`GROUP_PREP_MIN_HEADS` value heads or more (without outputs the
    sweep forms no gate tile; SSD B1 T16384: the delta prep took ~300 us of the recompute,
    gpu_gla_sweep_0021590.json), and wherever the forward's has it with its scores; there with its
    calm gates, whose scores and column factors the backward's reverse sweep reads (GATE_SCORES), at two
    stages at most (the calm gates' limit, launch/delta.py's check_shape). ``twin``: the sweep as its
    Gluon twin (GlaShape.recompute_twin)."""
    # The forward's group prep without its scores (sweep_scores: simple GLA) is not a reason: there the
    # calm recompute on the Triton sweep and the reverse sweep on the scores (50 + 260 + 217 us at
    # simple GLA B4 T4096) lost to the delta prep's (69 + 75 + 303; gpu_gla_sweep_qk2.json).
    group = (sweep.group_prep and not sweep.sweep_scores) or (GROUP_PREP_MIN_HEADS is not None and
                                                              value_heads // heads >= GROUP_PREP_MIN_HEADS)
    return replace(sweep, segments=1, phases=1, group_prep=group, calm_gates=group, gluon_sweep=twin,
                   specialized=False, sweep_scores=False,
                   num_stages=min(sweep.num_stages, 2) if group else sweep.num_stages,
                   prep_heads=1 if group else sweep.prep_heads)


def _group(problem) -> int:
    """Value heads one query/key head (SSD: one group) serves."""
    value_heads = getattr(problem, "value_heads", None) or problem.heads
    return value_heads // (problem.groups if hasattr(problem, "groups") else problem.heads)


def with_prep_heads(shape: DeltaShape, problem) -> DeltaShape:
    """``shape`` with its prep's value heads per program cut to the largest divisor of the value
    heads one query/key head (SSD: one group) serves, so that a program's heads share q and k."""
    group = _group(problem)
    heads = max(d for d in range(1, min(shape.prep_heads, group) + 1) if group % d == 0)
    return shape if heads == shape.prep_heads else replace(shape, prep_heads=heads)


def triton_gla_unsupported(problem) -> str | None:
    """Why the GLA Triton kernel cannot take this problem, or None if it can."""
    import torch
    if problem.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"inputs in {problem.dtype}: the kernel takes float16, bfloat16 or float32"
    if problem.key_dim > 256:
        return f"K = {problem.key_dim} > 256: a program holds a [BV, K] state tile on chip"
    return None


def triton_ssd_unsupported(problem) -> str | None:
    """Why the chunked SSD cannot run on the GLA kernel (q = C, k = B, v = dt x), or None."""
    import torch
    if problem.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"inputs in {problem.dtype}: the kernel takes float16, bfloat16 or float32"
    if problem.state_dim > 256:
        return f"dstate = {problem.state_dim} > 256: a program holds a [BV, dstate] state tile on chip"
    return None


#: The backward's parallel stage (kernels/gla/backward.py) sums the value heads of a query/key
#: head (SSD: a group) in one program where one serves at least this many value heads, with a
#: scalar decay and K, V <= 128 (a program holds [64, K] float32 sums of dq and dk and [K, V] tiles
#: of S and dS'): no per-head dq or dk crosses memory, and Q K^T is formed once per group. None:
#: one value head a program, the heads summed after (kernels/group_sum.py).
GROUP_GRADS_MIN_HEADS: int | None = 8
#: Programs per multiprocessor the summing programs aim at: each query/key head's value heads are
#: split into the fewest shares that give this many (one program of 8 warps an SM runs at a time).
#: H200, SSD 80 heads a group, forward + backward: B1 T16384 4.344 ms at 2 (2 shares of 40 heads),
#: 4.383 at 4, 4.395 at 8; B4 T4096 3.888, 3.928, 3.930 (gpu_gla_train_d0132da.json).
GROUP_GRADS_WAVES = 2
#: The summing programs' pipeline stages where dg has a launch of its own (each stage holds S and
#: dS' twice or three times, and V^T: 50-100 KB at K 128, V 64); with dg in the same programs one
#: (two would take 279 KB of shared memory).
GROUP_GRADS_STAGES = 2


def grads_heads(chunks: int, heads: int, value_heads: int, key_dim: int, value_dim: int, per_key: bool,
                sms: int) -> int:
    """Value heads one program of the backward's parallel stage sums (1: one value head a program):
    over ``chunks`` chunk rows, ``heads`` query/key heads, ``value_heads``, on ``sms`` multiprocessors;
    the group split into the fewest shares (a divisor of it) that reach :data:`GROUP_GRADS_WAVES`
    programs an SM."""
    group = value_heads // heads
    if (GROUP_GRADS_MIN_HEADS is None or per_key or group < GROUP_GRADS_MIN_HEADS or key_dim > 128
            or value_dim > 128):
        return 1
    for split in range(1, group + 1):
        if group % split == 0 and chunks * heads * split >= GROUP_GRADS_WAVES * sms:
            return group // split
    return 1


#: Where the parallel stage sums a group's heads and forms dg apart: dq and dk in launches of their
#: own too (SIDE 1 and 2: one [64, K] float32 sum a program), on this many warps; None: both in
#: one launch on 8 warps. Offline sm_90 at 4 warps, dq's launch takes 255 registers and 66 KB of
#: shared memory (two programs an SM) where both sums in one program hold one program an SM.
#: H200, SSD 80 heads a group, forward + backward B1 T16384 / B4 T4096: 4.084 / 3.532 ms against
#: 4.105 / 3.564 in one launch (the stage's kernels 1468 / 1465 us against 1491 / 1493;
#: gpu_gla_sweep_67924c5.json).
GROUP_GRADS_SIDES: int | None = 4


#: Where the parallel stage sums a group's heads: dg in a launch of its own (PART 2), each program
#: taking this many value heads (a divisor of the group) on this many warps; the dq and dk launch
#: (PART 1) then forms no dg. None: dg in the same programs as dq and dk (PART 0: one pipeline
#: stage, spilling 248 B offline). H200, SSD 80 heads a group, forward + backward, B1 T16384 /
#: B4 T4096: 4.383 / 3.928 ms at (4, 8), 4.368 / 3.893 at (2, 8), 4.376 / 3.903 at (8, 8), 4.509 /
#: 4.040 with PART 0 (gpu_gla_train_d0132da.json).
GROUP_GRADS_DG: tuple[int, int] | None = (4, 8)


def grads_dg_launch(group: int) -> tuple[int, int] | None:
    """(value heads a program, warps) of the parallel stage's dg launch for a group of ``group``
    value heads summed in its programs, or None (:data:`GROUP_GRADS_DG`)."""
    if GROUP_GRADS_DG is None:
        return None
    heads, warps = GROUP_GRADS_DG
    return max(d for d in range(1, min(heads, group) + 1) if group % d == 0), warps


#: The backward's reverse sweep (kernels/gla/backward.py, chunk_simple_gla_bwd_sweep_kernel): value
#: columns a program (at most V) and warps. Each program walks its sequence's chunks carrying dS'^T
#: [columns, K]. H200, SSD forward + backward B1 T16384 / B4 T4096, the sweep's kernel time: (32, 4)
#: 887 / 597 us, (16, 4) 1172 / 685, (32, 8) 1103 / 665 (gpu_gla_train_86febb9.json).
REVERSE_SWEEP = (32, 4)
