"""Launch shapes of the chunked delta-rule kernels (kernels/delta/): a rule table read top to
bottom, the first row whose condition holds decides, each row with its reason. No autotuning: the
same problem on the same device always gets the same shape. The measurements behind the rows are
in docs/perf-history.md ("the delta launch-shape table")."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..descriptors import CHUNK_SIZE
from .device import gluon_usable, sm_count


@dataclass(frozen=True)
class DeltaShape:
    """How the prep and sweep kernels launch (launch/delta.py builds the launches from it)."""

    block_v: int  # BV: value columns per sweep program
    num_warps: int  # sweep
    num_stages: int  # software-pipelining depth of the sweep's chunk loop
    prep_warps: int
    reason: str
    # 1: one program walks a whole sequence; P > 1: two parallel passes over P segments of each
    # sequence (varlen: each cut by its own length) with a sequential fix-up between.
    segments: int = 1
    # V pipelined through shared memory as a product operand; False keeps it in registers
    # (16 KB less shared memory a program).
    v_product: bool = True
    # Output tiles by bulk tensor stores (M = 1; elsewhere the masked store).
    tma_store: bool = False
    # Phases of the single pass (dense): each phase's prep runs beside the previous phase's sweep,
    # on the SMs that few sweep programs leave free.
    phases: int = 1
    # A register cap on the prep (a compile option), which sets how many of its programs share a
    # multiprocessor: 168 gives three instead of two. None: the compiler's choice.
    prep_maxnreg: int | None = 168
    # Gated linear attention (the prep's WY off): value heads per prep program, sharing their
    # q/k tiles and Q K^T (a divisor of HV / H); the delta rule's prep takes one.
    prep_heads: int = 1
    # With group_prep: the most value heads a group prep program takes (a power of two, 2 to 64;
    # launch.delta._group_prep_blocks): the [64, heads] tile of its gates. 16: blocks of 32 were
    # 3-5 us slower at SSD B1 and B4 (benchmarks/results/gpu_gla_sweep_d529156.json).
    group_prep_heads: int = 16
    # A decay per key: the keys the per-key prep takes a step of its loop over key blocks (0: all).
    prep_key_block: int = 0
    # A decay per key: the per-key prep in two launches, the first writing every chunk whose decays
    # are calm in a few whole-chunk steps (prep_warps, prep_key_block), the second (8 warps, all
    # keys at once) the others.
    key_calm_pass: bool = False
    # A scalar decay (WY off, M = 1) whose query/key heads serve several value heads (SSD's
    # groups): the group prep (kernels/gla/group_prep.py), one program per (chunk, query/key head)
    # forming the scores once and every value head's gates, and the sweep gating the scores per
    # value head (GATE_SCORES); prep_heads is then unread.
    group_prep: bool = False
    # With group_prep: the gates of a calm chunk (one segment, no bad row, its decays spanning at
    # most 2^126) factored, the scores scaled by a column factor and the product's output by a row
    # factor, instead of a [BT, BT] tile of exp2 a value head and chunk (CALM_GATES).
    calm_gates: bool = False
    # With group_prep, without calm_gates: the sweep forms each chunk's scores Q K^T from the q and
    # k tiles it holds (one more product a chunk), and the group prep writes only the coef rows.
    # For query/key heads that serve one value head (simple GLA), whose scores would be as many
    # bytes as the value heads' gated tiles.
    sweep_scores: bool = False
    # The sweep (its single pass, phases and second passes) as its Gluon twin
    # (kernels/gluon/delta_sweep.py; block_v 64 on one warpgroup, num_stages its ring of tile
    # stages): :func:`gluon_forward_sweep` decides.
    gluon_sweep: bool = False
    # With gluon_sweep, the group prep or the WY step, and the single pass or phases: the twin
    # warp-specialised (kernels/gluon/gla_sweep_specialized.py: the state's chain, the outputs and
    # the loads on partitions of their own), where the call has outputs, no checkpoints and no
    # float32 chunk states; unread without gluon_sweep (the Triton sweep).
    specialized: bool = False
    # Each phase's length as a fraction of the one before (launch/delta.py's phase_bounds); None:
    # launch.delta.PHASE_RATIO. A faster sweep covers more chunks while the next phase's prep runs
    # beside it, so the twin's phases fall off faster (GLUON_FORWARD_SWEEP).
    phase_ratio: float | None = None
    # The prep beside the chain in one warp-specialised Gluon program per (sequence, value head)
    # (kernels/gluon/delta_fused.py), after the chunk vectors' pass; the row's other fields are the
    # launch of a call the fused kernel cannot take (launch/delta_fused.py's fused_call_ok, and no
    # l2norm, chunk states or training). :func:`fused_prefill` decides.
    fused: bool = False
    # The prep and the sweep chained per chunk instead of per phase (dense, the delta rule, M = 1,
    # with outputs, on the warp-specialised sweep): the sweep launched first, the whole prep as its
    # programmatic dependent on the SMs it leaves free, each prep program raising its (chunk, value
    # head)'s ready flag, on which the sweep's load warp waits before the chunk's copies. A call it
    # cannot take runs the row's phases. :func:`gluon_forward_sweep` decides.
    chained: bool = False
    # With chained: the fraction of the chunks whose prep runs before the sweep starts, on every SM
    # (a launch of its own, the sweep its programmatic dependent), so that the prep, which is slower
    # on the SMs the sweep leaves it than the chain it feeds, starts ahead. 0: the whole prep beside
    # the sweep. :data:`CHAINED_LEAD` is the planned value.
    chained_lead: float = 0.0


@dataclass(frozen=True)
class DeltaSizes:
    """What the rows read: independent (sequence, value head) sweeps, multiprocessors, V, the
    expanded-stream length of one sequence (varlen: of the whole batch), whether the batch is
    varlen, and its number of sequences."""

    pairs: int
    sms: int
    value_dim: int
    tokens: int
    varlen: bool
    sequences: int = 1
    group: int = 1  # value heads one query/key head serves (SSD: a group's heads)

    @property
    def programs_64(self) -> int:  # sweep programs at 64 value columns each
        return self.pairs * -(-self.value_dim // 64)

    @property
    def mean_tokens(self) -> float:  # expanded tokens per sequence
        return self.tokens / max(self.sequences, 1) if self.varlen else self.tokens


# BV 64 runs the sweep's products on wgmma (one warpgroup), BV 128 on two, BV 16 / 32 on mma.sync;
# shared memory decides the programs a multiprocessor holds (BV 64, V as an operand, 3 stages:
# one; BV 64, V in registers, 2 stages: two).
DELTA_LAUNCH: list[tuple[Callable[[DeltaSizes], bool], DeltaShape]] = [
    (lambda s: s.programs_64 > s.sms and s.mean_tokens >= 2048,
     DeltaShape(128, 8, 3, 4, "more 64-column programs than SMs, long sequences: 128 columns on two warpgroups, "
                          "three stages, output tiles by bulk tensor stores", tma_store=True)),
    (lambda s: s.programs_64 > s.sms,
     DeltaShape(128, 8, 3, 4, "more 64-column programs than SMs: 128 columns on two warpgroups, three stages "
                          "(one program per SM; q, k, wy, aqk tiles shared by both)")),
    (lambda s: not s.varlen and s.tokens >= 32768 and 3 * s.programs_64 >= s.sms and 2 * s.programs_64 <= s.sms,
     DeltaShape(64, 4, 3, 4, "a third to half of the SMs in 64-column programs over a long dense sequence: one pass "
                         "in 8 phases (each phase's prep beside the previous phase's sweep), three stages, V as a "
                         "product operand, output tiles by bulk tensor stores", tma_store=True, phases=8)),
    (lambda s: not s.varlen and s.tokens >= 16384 and 3 * s.programs_64 >= s.sms and 2 * s.programs_64 <= s.sms,
     DeltaShape(64, 4, 3, 4, "a third to half of the SMs in 64-column programs over a dense sequence of 16k-32k "
                         "tokens: one pass in 6 phases, three stages, V as a product operand, bulk stores",
                         tma_store=True, phases=6)),
    (lambda s: not s.varlen and s.tokens >= 16384 and 3 * s.programs_64 >= s.sms,
     DeltaShape(64, 4, 3, 4, "half the SMs or more in 64-column programs over a long dense sequence: one pass, "
                         "three stages, V as a product operand, output tiles by bulk tensor stores", tma_store=True)),
    (lambda s: not s.varlen and s.tokens >= 8192 and (s.tokens >= 16384 or 4 * s.programs_64 <= s.sms),
     DeltaShape(64, 4, 3, 4, "few pairs over a long dense sequence: 4 segments at BV 64, three stages, V as a product "
                         "operand, output tiles by bulk tensor stores (H200, graph replay: 2 x 16384 HV8 0.346 ms "
                         "against 0.365 in 3 segments, 2 x 32768 0.669 against 0.695, 4 x 8192 HV4 0.188 against "
                         "0.318 in one pass; gpu_dense_segments_cdc4e1d.json)", segments=4, tma_store=True)),
    (lambda s: s.varlen and s.mean_tokens >= 8192 and 4 * s.programs_64 <= s.sms,
     DeltaShape(64, 4, 3, 4, "few pairs over long varlen sequences: each sequence in 4 segments of its own length "
                         "at BV 64, bulk stores (H200: 2 x 16384 tokens HV8 0.347 ms against 0.622 in one pass, "
                         "2 x 32768 0.665 against 1.222, 4 x 8192 HV4 0.188 against 0.319; "
                         "gpu_varlen_segments_ca14896.json)", segments=4, tma_store=True)),
    (lambda s: 2 * s.programs_64 >= s.sms,
     DeltaShape(64, 4, 3, 4, "at most one 64-column program per SM: three stages, V as a product operand")),
    (lambda s: 2 * s.pairs * -(-s.value_dim // 32) >= s.sms,
     DeltaShape(32, 4, 2, 4, "few (sequence, head) pairs: 32-column blocks double the programs", v_product=False)),
    (lambda s: True,
     DeltaShape(16, 4, 2, 4, "very few pairs: 16-column blocks for the most programs", v_product=False)),
]



def varlen_as_dense(sequences: int, householder: int, return_chunk_states: bool) -> bool:
    """Whether a GDN varlen batch runs as the dense batch it equals: one sequence (``cu_seqlens``
    is ``[0, T]`` by the ops' contract, checked on the host for CPU tensors) is the dense batch of
    one, and the dense launches cut it into segments or phases, which the varlen launches do not
    (issue 21: B1 T16384 as one varlen sequence 0.843 ms against 0.534 dense at b47c7e4). Not with
    chunk states: the varlen call returns the descriptors' padded row count, the dense one its
    own. GDP's dense batches run as varlen ones (chunk_gated_delta_product), so M > 1 stays."""
    return sequences == 1 and householder == 1 and not return_chunk_states


def delta_shape(problem, device: torch.device, gluon: bool = True) -> DeltaShape:
    """The first row of :data:`DELTA_LAUNCH` that holds for ``problem`` (a DeltaProblem) on
    ``device``, its sweep given to the Gluon twin where :func:`gluon_forward_sweep` allows
    (``gluon`` False, as for ``backend="triton"``: never)."""
    sizes = DeltaSizes(pairs=problem.sequences * problem.value_heads, sms=sm_count(device),
                       value_dim=problem.value_dim, tokens=problem.tokens * problem.householder,
                       varlen=problem.varlen, sequences=problem.sequences)
    for applies, shape in DELTA_LAUNCH:
        if applies(sizes):
            shape = gluon_forward_sweep(shape, householder=problem.householder, dtype=problem.dtype,
                                        key_dim=problem.key_dim, value_dim=problem.value_dim, device=device,
                                        twin_only=not gluon)
            return fused_prefill(shape, problem, sizes, device, twin_only=not gluon)
    raise AssertionError("the last launch row always applies")


@dataclass(frozen=True)
class DeltaBackwardShape:
    """How the backward's stages launch (launch/delta_backward.py): the reverse sweep, then the
    parallel stage (the scores kernel, then dk and dq, one launch each)."""

    block_v: int  # value columns a reverse-sweep program carries
    sweep_warps: int
    grads_warps: int  # the parallel stage's dq, dk kernel's (and the scores kernel's, unless scores_warps)
    reason: str
    grads_block_v: int = 16  # the dq, dk kernel's step over V
    scores_warps: int | None = None  # the scores kernel's (None: grads_warps)
    scores_block_v: int | None = None  # the scores kernel's step over V (None: grads_block_v)
    # The recompute's prep and sweep (the chunk states, U, lam o (K S)); None: the forward's shape,
    # its phases kept, in one segment (B1 T16384 HV32, whose forward runs in 6 phases: 3.66 against
    # 3.75 ms in one pass; BV 32 in one pass or in phases, 3.90; gpu_delta_train_variants_3650ad7_*.json).
    recompute: DeltaShape | None = None
    sweep_stages: int = 3  # software-pipelining depth of the reverse sweep's chunk loop
    # GVA: a dq, dk program sums its group's value heads into one accumulator and writes dq and dk
    # per q/k head in the inputs' dtypes (no float32 per-value-head gradients, no group sum
    # launch). B1 T16384 HV32: dq, dk 0.803 ms against 1.007 + 0.197 (group sum), forward + backward
    # 3.02 against 3.42 (gpu_delta_train_sweep_63b9ddd_b1.json).
    group_in_kernel: bool = False
    # The recompute's sweep on a stream of its own beside the reverse sweep (which reads none of
    # its outputs), launched after it, when the forward kept its prep (else the prep's G o Tinv,
    # which the reverse sweep reads, would come first). On the CPU and under the interpreter the
    # two run in that order on one stream.
    corun: bool = False
    # dk, then dq, in one launch (DQDK_BOTH): the second pass reads q, k and the state tiles again
    # from L2 rather than from memory in a launch of its own.
    dqdk_one_launch: bool = False
    # The reverse sweep as its Gluon twin (kernels/gluon/delta_backward_sweep.py; block_v 64, one
    # warpgroup, sweep_stages its ring of tile stages): :func:`gluon_twins` decides.
    gluon_sweep: bool = False
    # dq and dk in one launch of their Gluon twin (kernels/gluon/delta_backward_dqdk.py): the same;
    # its persistent programs' ring of tile stages of 32 value columns (three: 172 KB of shared
    # memory, one program of eight warps an SM).
    gluon_dqdk: bool = False
    gluon_dqdk_stages: int = 3  # the planner's: gluon_dqdk_stages()
    # With gluon_dqdk and at most GLUON_DQDK_SPECIALIZED_GROUP value heads a q/k head: that twin
    # warp-specialised (kernels/gluon/delta_backward_dqdk_specialized.py: the sums' warpgroup beside
    # the epilogue's, a load warp; GLUON_DQDK_SPECIALIZED_STAGES stages): :func:`gluon_twins` decides.
    gluon_dqdk_specialized: bool = False
    # The scores kernel warp-specialised in Gluon (kernels/gluon/delta_backward_scores_specialized.py:
    # two warpgroups taking items in turn, a load warp; GLUON_SCORES_STAGES stages of 64 value
    # columns): :func:`gluon_twins` decides.
    gluon_scores: bool = False
    # The recompute's sweep (no outputs; U and lam o K S stored) on the forward sweep's Gluon twin
    # where the forward's shape has it (DeltaShape.gluon_sweep); False: the Triton sweep, in the
    # Triton sweep's phases (launch.delta.PHASE_RATIO).
    recompute_twin: bool = False
    # The recompute's sweep warp-specialised (kernels/gluon/gla_sweep_specialized.py with WY and
    # STORE_U: the chain on one warpgroup, the stores of the chunk states, U and lam o K S on two,
    # the loads on a warp), from the sequence's start (not from checkpoints), GDN, where the
    # forward's row is of the twin's kind (64 value columns on one warpgroup, V a product operand):
    # :func:`gluon_twins`.
    recompute_specialized: bool = False


# The parallel stage's rows share their shape: the scores kernel steps 128 value columns on 4 warps
# (B4 T4096: 0.211 ms against 0.234 at 64 columns, B1 HV32 0.439 against 0.454, GDP M2 0.416 both;
# every gradient's error as at 64: gpu_delta_train_variants_c637f3b.json, gpu_delta_grad_check_c637f3b.json;
# 8 warps at 64 columns: 0.320), and dq, dk run as two launches of their kernel (one [BT, K]
# accumulator a program), 32 columns on 4 warps, a GVA group summed in their kernel. Forward +
# backward in one process (gpu_delta_dk_race_wip.log): B4 T4096 1.251 ms at 32 columns against
# 1.336 at 16, B1 HV32 2.546 against 2.693; every gradient as at 16 against the float64 oracle
# (gpu_delta_grad_check_dqdk32_wip.json) and the same bits run after run.
_STAGE = dict(grads_block_v=32, scores_warps=4, scores_block_v=128, group_in_kernel=True)

_REVERSE_SWEEP = ("the reverse sweep: 64 value columns on one warpgroup (wgmma), dS^T in registers, three stages: "
                  "0.218 ms at B4 T4096 (32 columns on 8 warps 0.364, 64 on 8 0.274, 16 on 4 0.366, 64 on 4 at two "
                  "stages 0.261), 0.676 at B1 T16384 HV32 (16 on 4 0.721, 32 on 8 0.759, 64 on 8 1.155), 0.507 at "
                  "GDP M2 B4 (32 on 8 0.762, 64 on 8 0.643): gpu_delta_train_sweep_63b9ddd_*.json. Fewer pairs than "
                  "measured here would have more programs at 16 columns; not measured")

#: The backward's launch shape: the first row whose condition holds on (sequence x value head
#: pairs, V, SMs, value heads per q/k head) decides. Measured in
#: benchmarks/results/gpu_delta_train_*.json (docs/perf-history.md).
DELTA_BACKWARD_LAUNCH: list[tuple[Callable[[int, int, int, int], bool], DeltaBackwardShape]] = [
    (lambda pairs, v, sms, group: 2 * pairs * -(-v // 64) <= sms,
     DeltaBackwardShape(64, 4, 4, "half the SMs or more idle under the reverse sweep's programs: the recompute "
                        "beside it on a side stream, from the sequence's start (no checkpoints): B1 T16384 HV32 "
                        "2.613 ms against 2.758 with the recompute from checkpoints after it (2.675 with "
                        "checkpoints beside it). Where the SMs are full it loses: B4 T4096 1.305 against "
                        "1.268, GDP M2 2.610 against 2.526 (gpu_delta_train_corun_wip.json). With the 32-column dq/dk step: "
                        "B1 2.540 against 60f978f's 2.755 (gpu_delta_train_c2ee13b.json). Where the forward's sweep "
                        "is the Gluon twin (its phases), the recompute is too: B1 2.340 ms against 2.355 with the "
                        "Triton recompute (gpu_delta_train_forward_twin_fe0cd93.json)", corun=True, recompute_twin=True,
                        **_STAGE)),
    (lambda pairs, v, sms, group: group == 1,
     DeltaBackwardShape(64, 4, 4, _REVERSE_SWEEP + ". One value head a q/k head: dk, then dq, in one launch (the "
                        "second pass reads q, k and S from L2): B4 T4096 1.228 / 1.232 ms against 1.252 / 1.256 "
                        "(dq/dk 404 / 406 us against 423 / 434), GDP M2 B4 2.489 against 2.487 "
                        "(gpu_delta_train_one_launch_*_0b2f518.json, gpu_delta_train_stage_occupancy_*_737ac7d.json)",
                        dqdk_one_launch=True, **_STAGE)),
    (lambda pairs, v, sms, group: True,
     DeltaBackwardShape(64, 4, 4, _REVERSE_SWEEP + ". Under GVA dk and dq in two launches: one launch lost at B1 "
                        "T16384 HV32 (2.579 ms against 2.515: gpu_delta_train_one_launch_*_0b2f518.json)", **_STAGE)),
]


def delta_backward_shape(pairs: int, value_dim: int, device: torch.device, group: int = 1) -> DeltaBackwardShape:
    """The first row of :data:`DELTA_BACKWARD_LAUNCH` that holds for ``pairs`` (sequences x value
    heads) independent reverse sweeps over V = ``value_dim`` columns on ``device``, ``group`` value
    heads to a q/k head."""
    sms = sm_count(device)
    shape = next(shape for applies, shape in DELTA_BACKWARD_LAUNCH if applies(pairs, value_dim, sms, group))
    if not shape.dqdk_one_launch and value_dim < DQ_LAUNCH_MIN_V32:
        shape = replace(shape, grads_block_v=16)
    return shape


#: The least V at which dq's launch of its own (DQDK_DQ, the rows without ``dqdk_one_launch``) steps
#: 32 value columns; below it 16. On the H200 with Triton 3.6, at V = 64 (two steps of 32) that launch
#: gave other dq and dg bits from run to run (B1 T8192 H4 HV8 K = V = 64: up to 3315 dq elements of 2.1 M
#: over four runs), at 16 columns the same bits every run, as at 32 columns with V = 128 and 256
#: (tests/gpu/test_delta_grad_gpu.py); dk then dq in one launch repeated its bits at V = 64 and 32
#: columns (diag_k64_4d1f570.log). Cause not isolated (Triton's software pipelining of a two-step loop).
DQ_LAUNCH_MIN_V32 = 128


#: Tile stages of the Gluon reverse sweep's ring (shared memory: 56 KB a stage at K = 128, plus
#: 32 KB of store staging; three fit in the 227 KB a program may take).
GLUON_SWEEP_STAGES = 3


@dataclass(frozen=True)
class GluonTwinRow:
    """Whether a backward stage runs as its Gluon twin (recurscan/kernels/gluon) where the twin's
    scope allows: ``on`` only once it was measured faster than its Triton twin (``reason``)."""

    on: bool
    reason: str


#: The backward's Gluon twins, by the DeltaBackwardShape field that selects each.
GLUON_BACKWARD_TWINS = {
    "gluon_sweep": GluonTwinRow(True, "the reverse sweep (kernels/gluon/delta_backward_sweep.py), forward + backward, "
                                      "eager, bf16, l2norm, same process (gpu_delta_train_gluon_sweep_4433529.json, "
                                      "gpu_delta_train_gluon_dqdk_f8847d1.json): 173 us against the Triton twin's 219 "
                                      "at B4 T4096 H=HV=16 (the step 1.181 ms against 1.227), 654 against 775 at B1 "
                                      "T16384 H16 HV32 (2.411 ms against 2.519); the Triton kernel's bits (the GPU "
                                      "tests)"),
    "gluon_dqdk": GluonTwinRow(True, "dq and dk (kernels/gluon/delta_backward_dqdk.py), persistent, one program of "
                                     "eight warps an SM: 352 us against the Triton kernel's 401 at B4 T4096 "
                                     "H=HV=16, the step 1.129 ms against 1.182 (gpu_delta_train_b6ece07.json; "
                                     "one program an item on one warpgroup was slower, 422 against 399-405: "
                                     "gpu_delta_train_gluon_dqdk_f8847d1.json); dq, dk within one bf16 rounding "
                                     "of the Triton kernel's, dg float32's (the GPU suite, 25 passed with both "
                                     "twins planned: gpu_tests_delta_grad_b6ece07.log). Summing a GVA group: "
                                     "682 us against the Triton kernel's two launches' 729 at B1 T16384 H16 HV32, "
                                     "the step 2.373 ms against 2.425 (gpu_delta_train_twins_8826c83.json; "
                                     "36 GPU tests passed: gpu_tests_delta_grad_8826c83.log)"),
    "gluon_dqdk_specialized": GluonTwinRow(False, "dq and dk's twin warp-specialised, at most "
                                                  "GLUON_DQDK_SPECIALIZED_GROUP value heads a q/k head "
                                                  "(kernels/gluon/delta_backward_dqdk_specialized.py): slower "
                                                  "than the twin on an H100 in one process, 405 us against 386 at "
                                                  "B4 T4096 H=HV=16, 743 against 733 at B1 T16384 H16 HV32 "
                                                  "(gpu_delta_train_specialised_b{4,1}_h100_4a5bb0f.json); its 11 "
                                                  "GPU tests pass (gpu_tests_unproven_dqdk_h100_4a5bb0f.log)"),
    "gluon_scores": GluonTwinRow(True, "the scores kernel warp-specialised "
                                       "(kernels/gluon/delta_backward_scores_specialized.py), forward + backward, "
                                       "eager, bf16, l2norm, same process, on an H100: 221-223 us against the "
                                       "Triton kernel's 230-232 at B4 T4096 H=HV=16 (the step 1.266 ms against "
                                       "1.271), 380-381 against 474-483 at B1 T16384 H16 HV32 (2.475 ms against "
                                       "2.538; gpu_delta_train_specialised_b{4,1}_h100_4981221.json); its 18 "
                                       "GPU tests passed there (gpu_tests_unproven_{scores,both}_h100_4981221.log)"),
    "recompute_specialized": GluonTwinRow(False, "the recompute's sweep warp-specialised "
                                                 "(kernels/gluon/gla_sweep_specialized.py, STORE_U): the same "
                                                 "gradients, bit for bit (its GPU tests, H100, gpu_tests_unproven_"
                                                 "recompute{,_b1}_h100_6e59861.log), and slower there in one "
                                                 "process: B4 T4096 H=HV=16 1.259 ms against 1.243, B1 T16384 H16 "
                                                 "HV32 2.450 against 2.384 (its kernel beside the reverse sweep "
                                                 "953 us with the forward's, the twin's recompute 608 alone; "
                                                 "gpu_delta_train_recompute_specialised_b{4,1}_h100_6e59861.json)"),
}


def gluon_sweep_scope(*, householder: int, dtype: torch.dtype, key_dim: int, value_dim: int) -> bool:
    """What the Gluon twin of the forward sweep takes (and, with Gated Delta Product as well, the
    backward's twins): GDN (M = 1), 16-bit inputs, K 64 or 128, V a multiple of their 64 value
    columns."""
    return householder == 1 and dtype in (torch.bfloat16, torch.float16) and key_dim in (64, 128) and \
        value_dim % 64 == 0


def gluon_scores_scope(*, householder: int, dtype: torch.dtype, key_dim: int, value_dim: int) -> bool:
    """What the warp-specialised scores kernel takes: :func:`gluon_sweep_scope`'s problems, and
    Gated Delta Product at M = 2 (a chunk's rows copy-major, the query's copy first)."""
    return householder in (1, 2) and \
        gluon_sweep_scope(householder=1, dtype=dtype, key_dim=key_dim, value_dim=value_dim)


def gluon_reverse_sweep_scope(*, householder: int, dtype: torch.dtype, key_dim: int, value_dim: int) -> bool:
    """What the reverse sweep's Gluon twin takes: :func:`gluon_sweep_scope`'s problems, and Gated
    Delta Product at M = 2, its query-side products over a chunk's 32 query rows (M = 4's 16 would
    be a product's reduction too; not built)."""
    return householder in (1, 2) and \
        gluon_sweep_scope(householder=1, dtype=dtype, key_dim=key_dim, value_dim=value_dim)


#: The reverse sweep's Gluon twin for Gated Delta Product (M = 2), apart from GDN's row
#: (``GLUON_BACKWARD_TWINS["gluon_sweep"]``, which it also needs): another kernel's form (the query
#: rows by token), measured on its own.
GLUON_GDP_REVERSE_SWEEP = GluonTwinRow(True, "GDP M = 2 B4 T4096 H16 forward + backward, eager, bf16, l2norm, same "
                                             "process, on an H100: the reverse sweep 362 us against the Triton "
                                             "kernel's 579, the step 2.629 ms against 2.837 "
                                             "(gpu_delta_train_specialised_gdp_h100_4a5bb0f.json); every gradient "
                                             "within 7e-5 (relative RMS) of the Triton sweep's and within the "
                                             "oracle's band of the float64 token loop "
                                             "(gpu_tests_unproven_gdp_sweep_h100_4a5bb0f.log), the GDP GPU tests "
                                             "with it planned (gpu_tests_gdp_planned_h100_4a5bb0f.log)")

#: The key sizes at which the GDP form of the reverse sweep's twin was measured faster than the
#: Triton sweep: GDP M = 2 B4 T4096 H16 at K = 64, V = 128, forward + backward, on an H100 in one
#: process, 292 us against 396 (the step 1.995 ms against 2.098;
#: gpu_delta_train_gdp_k64_h100_03a6666.json).
GLUON_GDP_REVERSE_SWEEP_KEY_DIMS = (64, 128)

#: The key sizes at which dq and dk's twin was measured faster than the Triton kernel (GDN and GDP).
#: At K = 64, V = 128 it was slower: GDN B4 T4096 H=HV=16 on the H200, 284-288 us against 274
#: (gpu_delta_train_gdn_k64_ecf0925.json; the reverse sweep's and the scores kernel's twins were
#: faster there, 141 against 167 and 166-170 against 206-209), GDP M = 2 B4 on an H100, 596 against
#: 555 (gpu_delta_train_gdp_k64_h100_03a6666.json).
GLUON_DQDK_KEY_DIMS = (128,)


#: dq and dk's Gluon twin for Gated Delta Product (M = 2: q, dO and (dscores o G)'s query rows by
#: token, first in their tiles), apart from GDN's row (``GLUON_BACKWARD_TWINS["gluon_dqdk"]``, which
#: it also needs): measured on its own.
GLUON_GDP_DQDK = GluonTwinRow(True, "GDP M = 2 B4 T4096 H16 forward + backward, eager, bf16, l2norm, same process, "
                                    "on an H100: dq and dk 737 us against the Triton kernel's 935, the step 2.429 ms "
                                    "against 2.632 (gpu_delta_train_gdp_dqdk_h100_7abbdb8.json; at K = 64 slower: "
                                    "GLUON_DQDK_KEY_DIMS); dq, dk within "
                                    "5.3e-5 (relative RMS) of the Triton kernel's, dg 2.6e-7, the other gradients "
                                    "their bits, dense, a partial last chunk, varlen with a one-token sequence, no "
                                    "l2norm, K 64, and within the oracle's band of the float64 token loop "
                                    "(gpu_tests_unproven_gdp_dqdk_h100_7abbdb8.log)")


#: The warp-specialised scores kernel for Gated Delta Product (M = 2: a chunk's rows copy-major, the
#: query's copy first), apart from GDN's row (``GLUON_BACKWARD_TWINS["gluon_scores"]``, which it
#: also needs): measured on its own.
GLUON_GDP_SCORES = GluonTwinRow(True, "GDP M = 2 B4 T4096 H16 forward + backward, eager, bf16, l2norm, same "
                                      "process, on an H100: the scores kernel 369 us against the Triton kernel's "
                                      "456, the step 2.354 ms against 2.434 (gpu_delta_train_gdp_scores_h100_"
                                      "2859963.json); dq and dk within one bf16 rounding of the Triton kernel's, "
                                      "dbeta and dg float32's, dv and dh0 their bits, dense, a partial last chunk, "
                                      "varlen with a one-token sequence, no l2norm, no decay, GVA, K 64, and within "
                                      "the oracle's band of the float64 token loop; a NaN in one sequence stays in "
                                      "it (gpu_tests_unproven_gdp_scores_h100_2859963.log). At K = 64 (V = 128) "
                                      "331-334 us against 439, the step 1.906-1.910 ms against 2.002 "
                                      "(gpu_delta_train_gdp_scores_k64_h100_242f63d.json)")


#: The prep's WY inverse on fp16 operands (every chunk whose steps are contractions) with its
#: doubling levels up to blocks of this many rows (16 or 32; 0: none) on the diagonal blocks as a
#: batch (``_wy_inverse``'s SPLIT: small products on mma.sync instead of [64, 64] ones that are zero
#: outside those blocks). On an H100 at 6166af2 against the whole-tile form (7302e8b) in one process,
#: graph replay (ab_split_inverse_h100_6166af2.json, ab_split_inverse_more_h100_6166af2.json): the
#: prep 10-13% faster (GDP M2 B4 218 us against 251, B4 T4096 122 against 136, varlen HV32 445 against
#: 505, HV64 887 against 940; B1 T16384's phased prep 2%), the rows HV64 1.608 ms against 1.717, GDP
#: 0.435 against 0.470, varlen 0.854 against 0.917, B4 0.247 against 0.258, B1 0.531 against 0.534;
#: GDN B4 training step 1.229 against 1.241 (its prep 133 us against 151). Offline (sm_90) at 32 rows
#: it has more barriers and spills (92, 112 B against 16's 79, 48 B), so 16. Not yet on the H200.
PREP_SPLIT_INVERSE = 16


#: The phases' ratio (DeltaShape.phase_ratio) where the sweep runs as its Gluon twin: B1 T16384 H16
#: HV32 in 6 phases, graph replay, 0.505 ms at 0.8 against 0.513 at 0.75 and 0.525 at 0.9 (the Triton
#: sweep: 0.529 at 0.9, 0.543 at 0.8; gpu_chunk_delta_forward_twin_*.json).
GLUON_SWEEP_PHASE_RATIO = 0.8

#: The forward sweep's Gluon twin (kernels/gluon/delta_sweep.py), taken by :func:`gluon_forward_sweep`.
GLUON_FORWARD_SWEEP = GluonTwinRow(True, "the forward sweep (kernels/gluon/delta_sweep.py) in phases, graph "
                                         "replay, bf16, l2norm, same process (gpu_chunk_delta_forward_twin_*.json): "
                                         "B1 T16384 H16 HV32 0.504 ms against the Triton sweep's 0.529 (eager 0.518 "
                                         "against 0.539), B1 T65536 1.814 against 1.953 (eager 1.808 against 1.964); "
                                         "training B1 T16384 2.340 ms against 2.373 (gpu_delta_train_forward_twin_"
                                         "314afa0.json). In one pass it gained within noise (B4 T4096 0.242 against "
                                         "0.244) and the B4 training step lost (1.217 against 1.156), so only phased "
                                         "rows take it. The Triton sweep's bits (tests/gpu/test_gluon_sweep_gpu.py)")


#: The forward sweep's warp-specialised form with the WY step (kernels/gluon/gla_sweep_specialized.py:
#: the chain on one warpgroup, the outputs on two, the loads on a warp), where the twin is planned.
#: At GLUON_SWEEP_PHASE_RATIO 0.7 it gained less (B1 T16384 graph 0.509 against 0.522), so the ratio stays.
GLUON_FORWARD_SPECIALIZED = GluonTwinRow(True, "the twin's bits, faster on the phased rows (H100, one process, "
                                               "ab_forward_specialised_h100_2295218.json): B1 T16384 H16 HV32 "
                                               "graph 0.497 ms against the twin's 0.522 (eager 0.509 against "
                                               "0.540), B1 T65536 1.806 against 1.854 (eager 1.784 against 1.871)")


#: The same warp-specialised form on the single-pass rows of the twin's kind (B4 T4096 H16: one
#: 64-column program an SM), where the twin alone gained within noise (GLUON_FORWARD_SWEEP's reason).
GLUON_FORWARD_SPECIALIZED_ONE_PASS = GluonTwinRow(False, "slower in one pass (H100, one process, against the "
                                                         "package without it, ab_forward_specialised_one_pass_h100_"
                                                         "6e59861.json): B4 T4096 H16 graph 0.253 ms against 0.244, "
                                                         "K = V = 64 0.209 against 0.208; the B4 training step "
                                                         "1.248 against 1.246 (gpu_delta_train_one_pass_h100_"
                                                         "6e59861.json)")


#: The chained schedule (DeltaShape.chained) on the phased rows the warp-specialised sweep takes.
GLUON_FORWARD_CHAINED = GluonTwinRow(True, "the single pass's bits, faster than the phases (H100, one process, graph "
                                           "replay, no lead; `git show 71fba68:benchmarks/results/gpu_chained_h100_"
                                           "0d7116d.json`): B1 T16384 H16 HV32 0.440 ms against 0.492 (eager 0.437 "
                                           "against 0.509), B1 T65536 1.711 against 1.765 (eager 1.685 against "
                                           "1.803), B2 T16384 H8 HV16 0.435 against 0.492; the GPU suite with it "
                                           "planned: `git show b281a51:benchmarks/results/gpu_tests_h100_0d7116d.log`")


#: The chained schedule's lead (DeltaShape.chained_lead): the fraction of the chunks prepared on every
#: SM before the sweep starts. Three H100 runs, one process each, every form the same bits
#: (`git show 71fba68:benchmarks/results/gpu_chained_h100_0d7116d.json`; d0c9d6a's in parentheses),
#: graph / eager ms, at 0.1 against none:
#: B1 T16384 H16 HV32 0.417 / 0.422 (0.426 / 0.424) against 0.440 / 0.437 (0.439 / 0.438); T65536
#: 1.663 / 1.624 (1.686 / 1.637) against 1.711 / 1.685 (1.719 / 1.686); B2 T16384 H8 HV16 0.416 /
#: 0.419 against 0.435 / 0.435; the third (gpu_chained_h100_ce5ae1d.json) 0.421 / 0.424 against
#: 0.439 / 0.438, 1.670 / 1.605 against 1.717 / 1.687, 0.420 / 0.422 against 0.436 / 0.445. 0.15
#: within noise of 0.1; 0.2 and over slower. By SM-time (the prep's
#: 27.5 SM-ms, the chain's 0.334 ms on 64 SMs) ~0.17 would have ended both together at ~0.37 ms:
#: beside the sweep the prep runs slower than its SM share (440 us on the GPU's clock against 405).
CHAINED_LEAD = 0.1


def gluon_forward_sweep(shape: DeltaShape, *, householder: int, dtype: torch.dtype, key_dim: int, value_dim: int,
                        device: torch.device, twin_only: bool = False) -> DeltaShape:
    """``shape`` with its sweep given to the Gluon twin, its phases falling off by
    :data:`GLUON_SWEEP_PHASE_RATIO`, where the twin runs here (``plan.device.gluon_usable``), the row
    is phased and of the twin's kind (64 value columns on one warpgroup, V as a product operand), the
    problem is within :func:`gluon_sweep_scope` and :data:`GLUON_FORWARD_SWEEP` is on; warp-specialised
    (``specialized``) where :data:`GLUON_FORWARD_SPECIALIZED` is on too; a single-pass row of that kind
    warp-specialised where :data:`GLUON_FORWARD_SPECIALIZED_ONE_PASS` is on; ``shape`` as it is otherwise,
    and where the caller forced the Triton kernels (``twin_only``). A call the twin cannot take
    (unaligned inputs, strided outputs; launch/delta.py checks) runs the Triton sweep, one the
    warp-specialised form cannot (float32 chunk states, checkpoints, no outputs) the twin."""
    if twin_only or not GLUON_FORWARD_SWEEP.on or not gluon_usable(device):
        return shape
    if not (shape.block_v == 64 and shape.num_warps == 4 and shape.v_product and not shape.group_prep and
            gluon_sweep_scope(householder=householder, dtype=dtype, key_dim=key_dim, value_dim=value_dim)):
        return shape
    if shape.phases > 1:
        chained = GLUON_FORWARD_SPECIALIZED.on and GLUON_FORWARD_CHAINED.on
        return replace(shape, gluon_sweep=True, phase_ratio=GLUON_SWEEP_PHASE_RATIO,
                       specialized=GLUON_FORWARD_SPECIALIZED.on, chained=chained,
                       chained_lead=CHAINED_LEAD if chained else 0.0)
    if shape.segments == 1 and GLUON_FORWARD_SPECIALIZED_ONE_PASS.on:
        return replace(shape, gluon_sweep=True, specialized=True)
    return shape


#: The fused prefill (kernels/gluon/delta_fused.py), taken by :func:`fused_prefill` where at least
#: FUSED_MIN_PAIRS_PER_SM (sequence, value head) pairs an SM keep the SMs in its programs (one an SM:
#: 13 warps, 203 KB of shared memory). Varlen too: the planner cannot see a batch's lengths, and
#: where one sequence holds most tokens its pairs' chain is the fused kernel's critical path, 11%
#: longer than the twin's (below); batches of even lengths gain as dense ones.
FUSED_PREFILL = GluonTwinRow(True, "the fused prefill against the planned prep and sweep in one process, graph replay, "
                                   "bf16, l2norm, H100 at 1d915c3 (gpu_fused_prefill_h100_1d915c3.json): B2 T8192 H16 "
                                   "HV64 (128 pairs) 0.617 ms against 0.794, B3 (192) 1.156 against 1.302, B4 (256) "
                                   "1.226 against 1.585, B8 HV32 (256) 1.359 against 1.637, B8 T4096 HV64 (512) 1.254 "
                                   "against 1.609, varlen 16 x 2048 HV32 0.696 against 0.847; slower at B4 T4096 HV16 "
                                   "(64 pairs: 0.313 against 0.246) and varlen 24576 + 16 x 512 HV32 (1.634 against "
                                   "1.452)")
FUSED_MIN_PAIRS_PER_SM = 0.95
#: The fused prefill serving a state cache in place (its slots read and written by the kernel).
FUSED_PREFILL_CACHE = GluonTwinRow(True, "the fused prefill with a state cache: its GPU tests (float32 and bf16 "
                                         "caches, both layouts, a padding request, an empty one, a NaN key) and "
                                         "the GPU suite with it planned passed on an H100 (1d915c3 with f5d1a88's "
                                         "test fix)")


#: The fused prefill's prep given the WY inverse's four diagonal 16 x 16 blocks by the chunk vectors'
#: pass (kernels/delta/chunk_vectors.py's DINV, kernels/gluon/delta_fused.py's D_FROM_PASS: 2 KB a
#: chunk and value head, copied with the chunk's k and q) instead of inverting them: the prep's loop
#: 736 instructions against 1280 (offline, sm_90); not the other form's bits (the pass forms K K^T's
#: blocks with its own products, wy is formed in float32), within the oracle's tolerance of the twin
#: (the fused GPU tests, both forms: results/gpu_tests_fused_h100_55c8293.log). On an H100, against
#: the form inverting the blocks (a872be8's package, 35f37ce): the fused kernel 886 us against 1007
#: at B4 T8192 HV64, the rows HV64 eager 1.071-1.087 ms against 1.125-1.126
#: (results/ab_fused_diagonal_pass{,_repeat}_h100_35f37ce.json); as the pass and the prep are now,
#: the pass 132 us and the fused kernel 872 at HV64, eager 1.044 ms, graph 1.099
#: (results/ab_fused_keys_once_h100_a4ba5b6.json, ab_fused_prep_path_h100_55c8293.json; perf-history
#: 2026-12-07 and 2026-12-08).
FUSED_DIAGONAL_FROM_PASS = True

#: The fused prefill with its chains at 184 registers a thread and its prep at 120, in the prep's
#: form that fits them (kernels/gluon/delta_fused.py, PIPELINED; with FUSED_DIAGONAL_FROM_PASS):
#: there ptxas pipelines the kernel's wgmmas, which at 160 / 168 it serialises, a wait after every
#: 64x64x16 product (C7512; every fused figure so far was taken so). Off: not yet measured.
FUSED_PIPELINED = False


def fused_prefill_scope(problem) -> bool:
    """The fused prefill's problems (kernels/gluon/delta_fused.py): GDN (M = 1), 16-bit inputs,
    K = V = 128, beta per head; an initial state and a final state, or a state cache where
    :data:`FUSED_PREFILL_CACHE` is on."""
    return (problem.householder == 1 and problem.dtype in (torch.bfloat16, torch.float16)
            and problem.key_dim == 128 and problem.value_dim == 128 and not problem.beta_per_value
            and (not problem.uses_cache or FUSED_PREFILL_CACHE.on))


def fused_prefill(shape: DeltaShape, problem, sizes: DeltaSizes, device: torch.device,
                  twin_only: bool = False) -> DeltaShape:
    """``shape`` with ``fused`` set where the fused prefill runs here (``plan.device.gluon_usable``),
    :data:`FUSED_PREFILL` is on, the problem is within :func:`fused_prefill_scope` and its pairs fill
    the SMs (:data:`FUSED_MIN_PAIRS_PER_SM`); ``shape`` otherwise and where the caller forced the
    Triton kernels (``twin_only``)."""
    if twin_only or not FUSED_PREFILL.on or not gluon_usable(device) or not fused_prefill_scope(problem):
        return shape
    if sizes.pairs >= FUSED_MIN_PAIRS_PER_SM * sizes.sms:
        return replace(shape, fused=True)
    return shape


#: Tile stages of the warp-specialised dq, dk kernel's ring (32 value columns a stage, 28 KB at K =
#: 128; beside them the epilogue's slot, 80 KB, and the sums' hand-over, 64 KB: two stages take
#: 200 KB of the 227 a program may).
GLUON_DQDK_SPECIALIZED_STAGES = 2

#: The largest GVA group the warp-specialised dq, dk kernel sums (its slot holds every value head's
#: score tiles, 16 KB each: two heads take 226 KB of the 227); a larger group runs the twin.
GLUON_DQDK_SPECIALIZED_GROUP = 2

#: Tile stages of the warp-specialised scores kernel's ring (five [64, 64] tiles a stage, 40 KB in
#: 16 bits; beside them each scores warpgroup's slot of q and k, 32 KB at K = 128).
GLUON_SCORES_STAGES = 3


#: The largest GVA group dq and dk's Gluon twin sums (its value heads are unrolled in the program).
GLUON_DQDK_GROUP = 4

#: Tile stages of dq and dk's Gluon twin's ring by M (32 value columns a stage, 28 KB at K = 128:
#: three take 172 KB of shared memory, four 200 KB, offline without spills). At four every step of
#: the next item (V = 128) is issued under this item's epilogue; at three its fourth waits for its
#: first to be read. Forward + backward on an H100 in one process, two runs each
#: (gpu_delta_train_dqdk_stages_h100_{6fcfbc0,2859963}.json): GDN B4 T4096 dq and dk 381.1 / 376.7 us
#: at four against 384.4 / 386.6 at three, B1 T16384 HV32 747.4 / 749.6 against 756.2 / 756.2; GDP
#: M = 2 B4 732.0 / 743.4 against 730.9 / 737.1, so it keeps three.
GLUON_DQDK_STAGES = {1: 4, 2: 3}


def gluon_dqdk_stages(householder: int, value_dim: int) -> int:
    """dq and dk's twin's ring for this problem: :data:`GLUON_DQDK_STAGES`'s for M, fewer where V has
    fewer 32-column steps, three at least (the twin's scope wants three steps)."""
    return max(3, min(GLUON_DQDK_STAGES.get(householder, 3), value_dim // 32))


def gluon_dqdk_scope(*, householder: int, heads: int, value_heads: int, dtype: torch.dtype, key_dim: int,
                     value_dim: int, stages: int) -> bool:
    """What dq and dk's Gluon twin takes: GDN, one value head a q/k head or a GVA group of at most
    :data:`GLUON_DQDK_GROUP` (summed in the kernel); Gated Delta Product at M = 2 with one value head
    a q/k head (a chunk's 32 query rows first in its query-side tiles); 16-bit inputs, K 64 or 128,
    V a multiple of 32 with at least ``stages`` steps of 32 (its ring fills within one value head)."""
    group = value_heads // heads
    return (householder == 1 or (householder == 2 and group == 1)) and group * heads == value_heads and \
        group <= GLUON_DQDK_GROUP and \
        dtype in (torch.bfloat16, torch.float16) and key_dim in (64, 128) and value_dim % 32 == 0 and \
        value_dim // 32 >= stages


def gluon_twins(shape: DeltaBackwardShape, *, householder: int, heads: int, value_heads: int, key_dim: int,
                value_dim: int, dtype: torch.dtype, device: torch.device, twin_only: bool = False
                ) -> DeltaBackwardShape:
    """``shape`` with each backward stage whose Gluon twin runs here, is within its scope
    (:func:`gluon_reverse_sweep_scope`, :func:`gluon_dqdk_scope`, :func:`gluon_scores_scope`) and is
    on in :data:`GLUON_BACKWARD_TWINS` (measured faster) given to that twin; ``shape`` as it is on other devices
    (``plan.device.gluon_usable``), or when the caller forced the Triton kernels
    (``backend="triton"``: ``twin_only``). The recompute's sweep warp-specialised
    (``recompute_specialized``) takes GDN in :func:`gluon_sweep_scope`; the launch layer takes it
    where the forward's row is of the twin's kind and no checkpoints were kept. The reverse sweep's
    twin runs 64 value columns on one warpgroup, :data:`GLUON_SWEEP_STAGES` tile stages; Gated Delta
    Product's also needs :data:`GLUON_GDP_REVERSE_SWEEP` on and K in
    :data:`GLUON_GDP_REVERSE_SWEEP_KEY_DIMS`, and its dq and dk's twin :data:`GLUON_GDP_DQDK` on, its
    scores kernel's :data:`GLUON_GDP_SCORES`. dq and dk's twin takes K in :data:`GLUON_DQDK_KEY_DIMS`.

    The launch layer also needs q, k and dO 16-byte aligned (the twins' bulk copies) and falls back
    to the Triton kernels otherwise."""
    if twin_only or not gluon_usable(device):
        return shape
    gdp_sweep = GLUON_GDP_REVERSE_SWEEP.on and key_dim in GLUON_GDP_REVERSE_SWEEP_KEY_DIMS
    gdp_dqdk = GLUON_GDP_DQDK.on
    if GLUON_BACKWARD_TWINS["gluon_sweep"].on and (householder == 1 or gdp_sweep) and \
            gluon_reverse_sweep_scope(householder=householder, dtype=dtype, key_dim=key_dim, value_dim=value_dim):
        shape = replace(shape, gluon_sweep=True, block_v=64, sweep_warps=4, sweep_stages=GLUON_SWEEP_STAGES)
    if GLUON_BACKWARD_TWINS["gluon_dqdk"].on and (heads == value_heads or shape.group_in_kernel) and \
            (householder == 1 or gdp_dqdk) and key_dim in GLUON_DQDK_KEY_DIMS and \
            gluon_dqdk_scope(householder=householder, heads=heads, value_heads=value_heads, dtype=dtype,
                             key_dim=key_dim, value_dim=value_dim,
                             stages=gluon_dqdk_stages(householder, value_dim)):
        specialized = GLUON_BACKWARD_TWINS["gluon_dqdk_specialized"].on and householder == 1 and \
            value_heads // heads <= GLUON_DQDK_SPECIALIZED_GROUP
        shape = replace(shape, gluon_dqdk=True, gluon_dqdk_stages=gluon_dqdk_stages(householder, value_dim),
                        gluon_dqdk_specialized=specialized)
    if GLUON_BACKWARD_TWINS["gluon_scores"].on and (householder == 1 or GLUON_GDP_SCORES.on) and \
            gluon_scores_scope(householder=householder, dtype=dtype, key_dim=key_dim, value_dim=value_dim):
        shape = replace(shape, gluon_scores=True)
    if GLUON_BACKWARD_TWINS["recompute_specialized"].on and \
            gluon_sweep_scope(householder=householder, dtype=dtype, key_dim=key_dim, value_dim=value_dim):
        shape = replace(shape, recompute_specialized=True)
    return shape


def keep_prep_for_backward(problem) -> bool:
    """Whether a forward under autograd keeps its prep's outputs for the backward, which then skips
    the recompute's prep: when they take at most the bytes of q, k and v, so that what the backward
    keeps stays within twice the inputs (issue 19's bound). Per expanded row and value head they are
    wy, G o Tinv and aqk (64 elements each, in the inputs' dtype) and coef (4 float32): 0.52x q, k, v
    at K = V = 128, H = HV; 1.04x at K = V = 64, kept no more. Forward + backward 1.47 / 3.42 /
    2.80 ms kept, 1.59 / 3.53 / 3.04 recomputed, at GDN B4 T4096, B1 T16384 HV32, GDP M2 B4
    (gpu_delta_train_58a8062.json, gpu_delta_train_2e9b1fa_*.json); 1.52x / 1.77x / 1.62x the
    inputs kept for the backward."""
    qkv, prep = _qkv_and_prep_bytes(problem)
    return prep <= qkv


#: Token chunks between the states a forward under autograd keeps for the backward's recompute,
#: the fewest that fit first (checkpoint_chunks_for_backward).
CHECKPOINT_CHUNKS = (4, 8, 16, 32, 64)


def _qkv_and_prep_bytes(problem) -> tuple[int, int]:
    """The bytes of q, k and v, and of the prep's outputs (wy, G o Tinv, aqk, coef) per call."""
    size = problem.dtype.itemsize
    rows = problem.batch * problem.tokens * problem.householder
    prep = rows * problem.value_heads * (3 * CHUNK_SIZE * size + 4 * 4)
    qkv = problem.batch * problem.tokens * size * (problem.heads * problem.key_dim * (1 + problem.householder)
                                                   + problem.householder * problem.value_heads * problem.value_dim)
    return qkv, prep


def checkpoint_chunks_for_backward(problem, device: torch.device) -> int:
    """E > 0: a forward under autograd keeps the float32 state entering every E-th token chunk, and
    the backward recomputes the chunk states from them, every segment of E chunks at once (one
    launch) rather than each sequence's chunks one after another. 0: none kept.

    Taken for dense GDN batches whose single pass (one program per sequence, value head and 64
    value columns) leaves half the SMs or more idle and whose forward does not keep its prep (where
    it does, the recompute runs beside the reverse sweep instead: :data:`DELTA_BACKWARD_LAUNCH`'s
    first row, faster without checkpoints), with the smallest E of :data:`CHECKPOINT_CHUNKS`
    whose checkpoints fit in the bytes of q, k and v (the backward's memory stays within twice the
    inputs, issue 19's bound).

    Measured on the H200 (gpu_delta_train_checkpoints_dd04c30.json, gpu_delta_train_eba2139.json):
    B1 T16384 H16 HV32 (64 programs) forward + backward 2.753 ms at E = 16 (1.90x the inputs kept)
    against 2.976 without (1.77x), E = 4 2.768; B4 T4096 H = HV = 16 (128 programs, the SMs
    filled) 1.315 at E = 4 and 1.287 at E = 16 against 1.257 without."""
    if problem.varlen or problem.householder > 1 or keep_prep_for_backward(problem):
        return 0
    programs = problem.sequences * problem.value_heads * -(-problem.value_dim // 64)
    if 2 * programs > sm_count(device):
        return 0
    budget, _ = _qkv_and_prep_bytes(problem)
    chunks = -(-problem.tokens // CHUNK_SIZE)
    per_row = problem.sequences * problem.value_heads * problem.key_dim * problem.value_dim * 4
    for every in CHECKPOINT_CHUNKS:
        rows = -(-chunks // every)
        if rows >= 2 and rows * per_row <= budget:
            return every
    return 0


def triton_delta_unsupported(problem) -> str | None:
    """Why the delta-rule Triton kernels cannot take this problem, or None if they can."""
    if problem.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"inputs in {problem.dtype}: the kernels take float16, bfloat16 or float32"
    if problem.beta_per_value:
        return "a beta per value column needs one triangular system per column; the kernels take beta per head"
    if problem.key_dim > 256:
        return f"K = {problem.key_dim} > 256: the sweep holds a [K, BV] state tile on chip"
    return None
