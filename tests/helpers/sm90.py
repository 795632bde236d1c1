"""Compile every launch of the delta-rule backward (its forward recompute included), and the GLA
forward's, for sm_90 with no GPU, exactly as the launch layer builds them. Run as a module in a process without
TRITON_INTERPRET (tests/test_sm90_compile.py does): under the interpreter the kernels are not
compilable objects.

    python -m tests.helpers.sm90 "GDP M 2 varlen" split
    python -m tests.helpers.sm90 "GDN dense, H = HV" "Gluon scores" 64   # K = V = 64
    python -m tests.helpers.sm90 "GDN varlen, H = HV" "Gluon dq and dk, warp-specialised" 64 128   # K 64, V 128
    python -m tests.helpers.sm90 gla "GDN varlen, GVA"
    python -m tests.helpers.sm90 gluon-prep-proto-sass   # benchmarks/gluon_prep_proto.py's SASS by part
    python -m tests.helpers.sm90 prep-query-sass   # the delta prep's SASS with its QUERY switch at 2, 1, 0
    python -m tests.helpers.sm90 fused-prefill   # the fused prefill's launches (kernels/gluon/delta_fused.py)
    RECURSCAN_FUSED_PROBE=2 python -m tests.helpers.sm90 fused-prefill-forms   # its forms under a probe
"""
import dataclasses
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from recurscan.descriptors import build_chunk_descriptors
from recurscan.launch.delta import CALL_NAMES, DeltaInputs, DeltaShape
from recurscan.launch.delta_backward import NAMES, RECOMPUTED, build_delta_backward, expanded_chunk_offsets
from recurscan.plan import gla as plan_gla
from recurscan.plan.delta import DELTA_BACKWARD_LAUNCH, DeltaBackwardShape
from recurscan.runtime.launcher import CallArg

H200_SHARED = 227 * 1024
PLANNED_FORWARD = DeltaShape(64, 4, 3, 4, "tests: a planner row (BV 64, 4 warps, 3 stages)")
#: The forward (and the backward's recompute) with its sweep as the Gluon twin, by backward shape.
GLUON_FORWARD = {"Gluon forward sweep": dataclasses.replace(PLANNED_FORWARD, tma_store=True, gluon_sweep=True),
                 "Gluon forward sweep, checkpoints": dataclasses.replace(PLANNED_FORWARD, gluon_sweep=True),
                 "Gluon recompute, warp-specialised": dataclasses.replace(PLANNED_FORWARD, tma_store=True),
                 "Gluon recompute, warp-specialised, phases": dataclasses.replace(
                     PLANNED_FORWARD, tma_store=True, phases=6, gluon_sweep=True, specialized=True,
                     phase_ratio=0.8)}
SHAPES = {
    **{f"planned row {i}": shape for i, (_, shape) in enumerate(DELTA_BACKWARD_LAUNCH)},
    "4 warps": DeltaBackwardShape(32, 8, 4, "tests: the parallel stage on 4 warps"),
    "GVA in the kernel": DeltaBackwardShape(32, 8, 4, "tests: GVA summed in the dq, dk launches", grads_block_v=16,
                                            scores_warps=4, scores_block_v=64, group_in_kernel=True),
    "Gluon reverse sweep": DeltaBackwardShape(64, 4, 4, "tests: the reverse sweep as its Gluon twin", grads_block_v=32,
                                              scores_warps=4, scores_block_v=128, group_in_kernel=True,
                                              gluon_sweep=True, sweep_stages=3),
    "Gluon dq and dk": DeltaBackwardShape(64, 4, 4, "tests: dq and dk as their Gluon twin", grads_block_v=32,
                                          scores_warps=4, scores_block_v=128, group_in_kernel=True, gluon_dqdk=True),
    "Gluon dq and dk, four stages": DeltaBackwardShape(64, 4, 4, "tests: dq and dk as their Gluon twin, four stages",
                                                       grads_block_v=32, scores_warps=4, scores_block_v=128,
                                                       group_in_kernel=True, gluon_dqdk=True, gluon_dqdk_stages=4),
    "Gluon dq and dk, warp-specialised": DeltaBackwardShape(
        64, 4, 4, "tests: dq and dk as their Gluon twin, warp-specialised", grads_block_v=32, scores_warps=4,
        scores_block_v=128, group_in_kernel=True, gluon_dqdk=True, gluon_dqdk_specialized=True),
    "Gluon scores": DeltaBackwardShape(64, 4, 4, "tests: the scores kernel warp-specialised in Gluon", grads_block_v=32,
                                       scores_warps=4, scores_block_v=128, group_in_kernel=True, gluon_scores=True),
    # The recompute as the forward sweep's Gluon twin (GLUON_FORWARD): from the sequence's start,
    # and from the forward's checkpoints (a second pass over segments of 4 chunks).
    "Gluon forward sweep": dataclasses.replace(DELTA_BACKWARD_LAUNCH[1][1], recompute_twin=True),
    "Gluon forward sweep, checkpoints": dataclasses.replace(DELTA_BACKWARD_LAUNCH[1][1], recompute_twin=True),
    # The recompute's sweep warp-specialised (STORE_U): after a single-pass Triton forward, and
    # after a phased forward on the warp-specialised twin (its phases kept).
    "Gluon recompute, warp-specialised": dataclasses.replace(DELTA_BACKWARD_LAUNCH[1][1],
                                                              recompute_specialized=True),
    "Gluon recompute, warp-specialised, phases": dataclasses.replace(DELTA_BACKWARD_LAUNCH[1][1], recompute_twin=True,
                                                                      recompute_specialized=True),
}
#: Token chunks between checkpoints, by backward shape (none where absent).
CHECKPOINTS = {"Gluon forward sweep, checkpoints": 4}
CASES = {"GDN dense, H = HV": (1, None), "GDN varlen, GVA": (1, [0, 1, 300, 1000]),
         "GDP M 2 varlen": (2, [0, 1, 300, 1000])}
_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32",
          torch.int8: "*i8", torch.int64: "*i64"}


def compile_for_sm90(step, names, values):
    """Compile one launch record (kernel, its kwargs with CallArgs, options) for sm_90; a KeyError
    names an argument the launch leaves to its default."""
    index = {n: i for i, n in enumerate(names)}
    sig, const = {}, {}
    for p in step.kernel.params:
        a = step.kwargs[p.name]
        a = values[index[a]] if isinstance(a, CallArg) else a
        if p.is_constexpr:
            const[p.name] = a
        elif isinstance(a, torch.Tensor):
            sig[p.name] = _TYPES[a.dtype]
        elif isinstance(a, bool):
            sig[p.name] = "i1"
        elif isinstance(a, int):
            sig[p.name] = "i32" if -2**31 <= a < 2**31 else "i64"
        else:
            sig[p.name] = "fp32"
    arg_names = step.kernel.arg_names
    sig.update({k: "constexpr" for k in const})
    attrs = {(arg_names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items() if t.startswith("*")}
    source = ASTSource
    if type(step.kernel).__name__ == "GluonJITFunction":
        from triton.experimental.gluon._runtime import GluonASTSource as source
    src = source(step.kernel, sig, constexprs={(arg_names.index(k),): v for k, v in const.items()}, attrs=attrs)
    options = {k: v for k, v in step.options.items() if k in ("num_warps", "num_stages", "maxnreg")}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def stack_bytes(compiled) -> int:
    """Bytes of stack (spilled registers) of a compiled kernel, by Triton's bundled cuobjdump."""
    import os
    import re
    import subprocess
    import tempfile
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    return int(re.search(r"STACK:(\d+)", usage).group(1))


#: Gluon kernels whose wgmmas ptxas serialises (a wait after each product: its C7512-C7515
#: "Potential Performance Loss") in the forms whose launch kwargs the predicate accepts, each with
#: why that stands; any other Gluon kernel or form so compiled fails :func:`compiled_line`, and so
#: does one of these that no longer is (the entry is stale).
WGMMA_SERIALIZED = {
    "gluon_fused_prefill_kernel": (
        "insufficient register resources: its chains at 160 registers a thread; plan.delta.FUSED_PIPELINED's "
        "split (184 / 120, the prep in its PIPELINED form) pipelines them, not yet measured",
        lambda kwargs: not kwargs.get("PIPELINED", False)),
}


def wgmma_serialization(compiled) -> str | None:
    """Why ptxas serialises the compiled kernel's wgmmas (its PTX assembled again for sm_90a with
    ``-v``, Triton's bundled ptxas), or None where it pipelines them."""
    import os
    import re
    import subprocess
    import tempfile
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile(suffix=".ptx", mode="w") as f:
        f.write(compiled.asm["ptx"])
        f.flush()
        run = subprocess.run([tool, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
    found = re.search(r"wgmma\.mma_async instructions are serialized due to ([^\n]*)", run.stdout + run.stderr)
    return found.group(1).strip() if found else None


def compiled_line(step, names, values, describe=None) -> str:
    """Compile one launch record for sm_90 (:func:`compile_for_sm90`) and return its line (the
    kernel's name and shared memory, and ``describe(compiled)`` where given); raises where it does
    not fit the H200's shared memory."""
    compiled = compile_for_sm90(step, names, values)
    fn = getattr(step.kernel, "fn", step.kernel).__name__
    if compiled.metadata.shared > H200_SHARED:
        raise AssertionError(f"{fn}: {compiled.metadata.shared} B of shared memory")
    # The launch's registers: its threads (a warp-specialised kernel's, padded to warpgroups) under
    # the cap must fit an SM's 64 K, or the launch fails with "out of resource: threads".
    threads = 32 * compiled.metadata.num_warps
    if "maxnreg" in step.options and threads * step.options["maxnreg"] > 65536:
        raise AssertionError(f"{fn}: {threads} threads x maxnreg {step.options['maxnreg']} > 65536 registers")
    if type(step.kernel).__name__ == "GluonJITFunction":  # the Gluon rules: no spills; wgmmas pipelined
        if stack_bytes(compiled):
            raise AssertionError(f"{fn}: {stack_bytes(compiled)} B of stack (spills)")
        why = wgmma_serialization(compiled)
        allowed = fn in WGMMA_SERIALIZED and WGMMA_SERIALIZED[fn][1](step.kwargs)
        if why and not allowed:
            raise AssertionError(f"{fn}: ptxas serialises its wgmmas ({why})")
        if not why and allowed:
            raise AssertionError(f"{fn}: ptxas pipelines its wgmmas now: take this form out of WGMMA_SERIALIZED")
    return f"{fn}: shared {compiled.metadata.shared} B" + (f"; {describe(compiled)}" if describe else "")


#: Cases of the backward alone, beside :data:`CASES`: one value head a q/k head, varlen (GDN, GDP)
#: and dense (GDP).
BACKWARD_CASES = {"GDN varlen, H = HV": (1, [0, 1, 300, 1000]), "GDP M 2 varlen, H = HV": (2, [0, 1, 300, 1000]),
                  "GDP M 2 dense, H = HV": (2, None)}


def _delta_case(case: str, key_dim: int = 128, value_dim: int | None = None):
    """(M, cu_seqlens as a list or None, (q, k, v, g, beta, h0)) of a case of :data:`CASES` or
    :data:`BACKWARD_CASES`: zeros of its shapes, bf16 inputs, K = ``key_dim``, V = ``value_dim``
    (None: K), the expanded stream T M long."""
    M, cu = CASES[case] if case in CASES else BACKWARD_CASES[case]
    B, T, H, HV = (1, 1000, 2, 2 if case in BACKWARD_CASES else 4) if cu is not None else (2, 300, 2, 2)
    K, V = key_dim, value_dim or key_dim
    bf = dict(dtype=torch.bfloat16)
    N = B if cu is None else len(cu) - 1
    return M, cu, (torch.zeros(B, T, H, K, **bf), torch.zeros(B, T * M, H, K, **bf),
                   torch.zeros(B, T * M, HV, V, **bf), torch.zeros(B, T, HV), torch.zeros(B, T * M, HV, **bf),
                   torch.zeros(N, HV, K, V))


def compile_case(case: str, shape: str, key_dim: int = 128, value_dim: int | None = None) -> list[str]:
    """One line per compiled kernel: its name and shared memory; raises where one does not compile
    or does not fit."""
    return [compiled_line(step, names, values) for step, names, values in case_launches(case, shape, key_dim,
                                                                                        value_dim)]


def case_launches(case: str, shape: str, key_dim: int = 128, value_dim: int | None = None) -> list:
    """``(launch record, names, values)`` of every launch of the backward (its forward recompute
    first) for a case of :data:`CASES` or :data:`BACKWARD_CASES` in the backward shape
    :data:`SHAPES` ``[shape]``, K = ``key_dim``, V = ``value_dim`` (None: K): what
    :func:`compile_for_sm90` takes."""
    M, cu, (q, k, v, g, beta, h0) = _delta_case(case, key_dim, value_dim)
    bf = dict(dtype=torch.bfloat16)
    B, T, HV, K = q.shape[0], q.shape[1], v.shape[2], q.shape[3]
    dht = torch.zeros(h0.shape)
    do = torch.zeros(B, T, HV, v.shape[3], **bf)
    desc, cu_t = dict(chunk_indices=None, chunk_offsets=None), None
    if cu is not None:
        cu_t = torch.tensor(cu, dtype=torch.int32)
        desc = dict(chunk_indices=build_chunk_descriptors(cu_t, M).chunk_indices_dp,
                    chunk_offsets=expanded_chunk_offsets(cu_t, M))
    launches = build_delta_backward(q, k, v, g, beta, do, dht, scale=K ** -0.5, initial_state=h0,
                                    use_qk_l2norm_in_kernel=True, cu_seqlens=cu_t,
                                    shape=GLUON_FORWARD.get(shape, PLANNED_FORWARD), backward_shape=SHAPES[shape],
                                    num_householder=M, checkpoint_chunks=CHECKPOINTS.get(shape, 0), **desc)
    # The recompute's launches take the forward's call values, the stages NAMES'; only the
    # values' dtypes and alignment matter to a compile.
    inputs = DeltaInputs(q, k, v, g, beta, h0, None, None, cu_t, desc["chunk_indices"], desc["chunk_offsets"])
    made = {n: torch.zeros(1, dtype=spec[1]) for n, spec in launches.forward.buffers.items()}
    forward_values = tuple(x if x is not None else torch.zeros(1) for x in
                           tuple(inputs) + tuple(made.get(n) for n in CALL_NAMES[len(inputs):]))
    # The recompute's outputs in the dtypes it writes them (as _compile_stages passes them).
    recomputed = {n: torch.zeros(1, dtype=launches.forward.buffers[b][1]) for n, b in RECOMPUTED}
    stage = dict(q=q, k=k, v=v, g=g, beta=beta, do=do, dht=dht, cu_seqlens=cu_t, **desc, **recomputed,
                 **{n: torch.zeros(1, dtype=spec[1]) for n, spec in launches.buffers.items()})
    stage_values = tuple(stage.get(n) if stage.get(n) is not None else torch.zeros(1) for n in NAMES)
    return [(s, CALL_NAMES, forward_values) for s in launches.forward.steps] + \
        [(s, NAMES, stage_values) for s in launches.steps]


def compile_delta_forward(case: str, shape: DeltaShape, describe=None, serving: bool = False,
                          chunk_states: bool = True, chunk_states_dtype: torch.dtype = torch.float32) -> list[str]:
    """The delta-rule forward's launches (launch/delta.py: the prep, the sweep, a segmented
    sweep's fix-up) for a case of :data:`CASES` in ``shape``, bf16, K = V = 128, one line each
    (``describe``: as :func:`compile_gla`'s). ``serving``: with a bf16 state cache in the
    transposed ``[S, HV, V, K]`` layout and chunk states (``chunk_states``, in ``chunk_states_dtype``), in
    place of h0 and the final state."""
    from recurscan.launch.delta import build_delta_launches
    M, cu, (q, k, v, g, beta, h0) = _delta_case(case)
    K = q.shape[3]
    cu_t = indices = offsets = state = slots = None
    if cu is not None:
        cu_t = torch.tensor(cu, dtype=torch.int32)
        d = build_chunk_descriptors(cu_t, M)
        indices, offsets = d.chunk_indices_dp, d.chunk_offsets
    serve = {}
    if serving:
        state = torch.zeros(8, h0.shape[1], K, K, dtype=torch.bfloat16).transpose(-1, -2)
        slots, h0 = torch.zeros(h0.shape[0], dtype=torch.int32), None
        serve = dict(state=state, state_indices=slots, return_chunk_states=chunk_states, chunk_offsets=offsets,
                     num_chunk_rows=40 if cu is not None and chunk_states else None,
                     chunk_states_dtype=chunk_states_dtype)
    launches = build_delta_launches(q, k, v, g, beta, shape, scale=K ** -0.5, initial_state=h0,
                                    output_final_state=not serving, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_t,
                                    chunk_indices_dp=indices, num_householder=M, **serve)
    inputs = DeltaInputs(q, k, v, g, beta, h0, state, slots, cu_t, indices, offsets if serving else None)
    made = {n: torch.zeros(1, dtype=spec[1]) for n, spec in launches.buffers.items()}
    values = tuple(x if x is not None else torch.zeros(1) for x in
                   tuple(inputs) + tuple(made.get(n) for n in CALL_NAMES[len(inputs):]))
    return [compiled_line(step, CALL_NAMES, values, describe) for step in launches.steps]


def compile_gla(case: str, ssd: bool = False, cache: bool = False, seq_idx: bool = False,
                chunk_states: bool = False, per_key: bool = False, split: bool = False, describe=None) -> list[str]:
    """The scalar-decay GLA forward's launch (launch/gla.py) for a case of :data:`CASES` (M = 1
    ones; bf16, the plan's shape); ``ssd``: as Mamba2 SSD runs it (every prologue and epilogue
    part on: dt_bias, softplus, dt_limit, D per channel, z); ``cache``: with a state cache in
    mamba's [S, H, P, Nstate] layout; ``seq_idx``: SSD with mamba's seq_idx (per-token resets);
    ``chunk_states``: with the serving chunk states (float32, beside the outputs); ``per_key``: a
    decay per key dimension (chunk_gla: the prep, then the sweep); ``split``: a scalar decay (or SSD)
    through the prep and the sweep too (plan.gla.GlaShape.split). ``describe``: a function of the
    compiled kernel whose text is added to its line (benchmarks/sm90_resources.py's resources)."""
    from recurscan.launch.gla import NAMES as GLA_NAMES
    from recurscan.launch.gla import SsdPrologue, build_gla_forward
    from recurscan.plan.gla import GLA_LAUNCH
    _, cu = CASES[case]
    B, T, H, HV, K = (1, 1000, 2, 4, 128) if cu is not None else (2, 300, 2, 2, 128)
    bf = dict(dtype=torch.bfloat16)
    q, k, v = torch.zeros(B, T, H, K, **bf), torch.zeros(B, T, H, K, **bf), torch.zeros(B, T, HV, 64, **bf)
    g, h0 = torch.zeros(B, T, HV), torch.zeros(B if cu is None else len(cu) - 1, HV, K, 64)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    prologue = None
    if ssd:
        prologue = SsdPrologue(torch.zeros(B, T, HV), torch.zeros(HV), torch.zeros(HV), torch.zeros(HV, 64),
                               torch.zeros(B, T, HV, 64, **bf), True, (0.1, 5.0))
        g = torch.zeros(B, T) if seq_idx else None
    slots = None
    if cache:
        h0, slots = torch.zeros(8, HV, 64, K), torch.zeros(h0.shape[0], dtype=torch.int32)
    prepped = per_key or split
    offsets = None if cu is None or not (chunk_states or prepped) else torch.zeros(len(cu), dtype=torch.int32)
    indices = None if cu is None or not prepped else torch.zeros(40, 2, dtype=torch.int32)
    if per_key:
        g = torch.zeros(B, T, HV, K)
    launch = build_gla_forward(q, k, v, g, h0, cu_t, scale=K ** -0.5, output_final_state=True, shape=GLA_LAUNCH,
                               ssd=prologue, state_indices=slots, state_v_first=cache, chunk_offsets=offsets,
                               num_chunk_rows=40 if chunk_states else None, chunk_states_dtype=torch.float32,
                               prep_rows=40 if prepped else None)
    values = dict(q=q, k=k, v=v, g=g if g is not None else torch.zeros(1), h0=h0,
                  cu_seqlens=cu_t if cu_t is not None else torch.zeros(1), state_indices=slots,
                  chunk_offsets=offsets if offsets is not None else torch.zeros(1),
                  chunk_indices=indices if indices is not None else torch.zeros(1, dtype=torch.int32),
                  **({} if prologue is None else dict(zip(("dt", "A", "dt_bias", "D", "z"), prologue.tensors()))),
                  **{n: torch.zeros(1, dtype=spec[1]) for n, spec in launch.buffers.items()})
    values = {n: values.get(n, torch.zeros(1)) for n in GLA_NAMES}
    lines = []
    for step in (*launch.preps, launch.step):
        lines.append(compiled_line(step, GLA_NAMES, tuple(values[n] for n in GLA_NAMES), describe))
    return lines


SWEEP_SHAPES = {
    "one pass": DeltaShape(64, 4, 3, 4, "tests: BV 64, 4 warps, 3 stages, bulk stores", tma_store=True),
    "segments": DeltaShape(64, 4, 3, 4, "tests: 3 segments", segments=3, tma_store=True),
    "phases": DeltaShape(64, 4, 3, 4, "tests: 6 phases", phases=6, tma_store=True),
    "two warpgroups": DeltaShape(128, 8, 3, 4, "tests: BV 128 on 8 warps", tma_store=True),
    "narrow": DeltaShape(32, 4, 2, 4, "tests: BV 32, V as no product operand", v_product=False),
    "prep over heads": DeltaShape(64, 4, 3, 4, "tests: up to 4 value heads a prep program", prep_heads=4),
    "group prep": DeltaShape(64, 4, 3, 4, "tests: the group prep, the sweep gating the scores", tma_store=True,
                             group_prep=True),
    "group prep, phases": DeltaShape(64, 4, 3, 4, "tests: the group prep in 6 phases", tma_store=True, phases=6,
                                     group_prep=True),
    "group prep, calm gates": DeltaShape(64, 4, 2, 4, "tests: the group prep's calm gates, 2 stages", tma_store=True,
                                         group_prep=True, calm_gates=True),
    "group prep, scores in the sweep": DeltaShape(64, 4, 3, 4, "tests: the group prep's coef alone, the sweep "
                                                  "forming the scores", tma_store=True, group_prep=True,
                                                  sweep_scores=True),
}


#: The forward sweep's Gluon twin in each pass it takes (a segmented sweep's first pass is the
#: Triton kernel's): the single pass, phases, the second pass of segments.
GLUON_SWEEP_SHAPES = {name: dataclasses.replace(SWEEP_SHAPES[name], gluon_sweep=True)
                      for name in ("one pass", "phases", "segments")}
#: The warp-specialised sweep forming the scores itself, at three stages (simple GLA's form).
SPECIALIZED_SCORES_SHAPE = dataclasses.replace(SWEEP_SHAPES["group prep, scores in the sweep"], gluon_sweep=True,
                                               specialized=True)


def compile_gluon_forward() -> list[str]:
    """The delta-rule forward with the sweep's Gluon twin: every shape of :data:`GLUON_SWEEP_SHAPES`
    (phases dense only), dense and varlen, and the single pass serving a cache with chunk states."""
    lines = []
    for name, shape in GLUON_SWEEP_SHAPES.items():
        for case in ("GDN dense, H = HV",) + (() if name == "phases" else ("GDN varlen, GVA",)):
            lines += [f"{name}, {case}: {line}" for line in compile_delta_forward(case, shape)]
    for case in ("GDN dense, H = HV", "GDN varlen, GVA"):
        lines += [f"serving, {case}: {line}" for line in
                  compile_delta_forward(case, GLUON_SWEEP_SHAPES["one pass"], serving=True)]
    # warp-specialised with the WY step (the delta rule): one pass, phases, serving a cache with
    # chunk states in the inputs' dtype
    for name in ("one pass", "phases"):
        for case in ("GDN dense, H = HV",) + (() if name == "phases" else ("GDN varlen, GVA",)):
            lines += [f"WY warp-specialised {name}, {case}: {line}" for line in
                      compile_delta_forward(case, dataclasses.replace(GLUON_SWEEP_SHAPES[name], specialized=True))]
    # chained: the sweep waiting on the prep's ready flags, the prep raising them
    lines += [f"WY warp-specialised chained, GDN dense, H = HV: {line}" for line in
              compile_delta_forward("GDN dense, H = HV", dataclasses.replace(GLUON_SWEEP_SHAPES["phases"],
                                                                             specialized=True, chained=True))]
    lines += [f"WY warp-specialised serving, GDN varlen, GVA: {line}" for line in
              compile_delta_forward("GDN varlen, GVA", dataclasses.replace(GLUON_SWEEP_SHAPES["one pass"],
                                                                           specialized=True),
                                    serving=True, chunk_states_dtype=torch.bfloat16)]
    # The WY step off: SSD without z (D per head and per channel), simple GLA dense and varlen.
    for name in ("one pass", "phases"):
        for per_channel in (False, True):
            lines += [f"SSD {name}, D per {'channel' if per_channel else 'head'}: {line}" for line in
                      compile_ssd_benchmark(GLUON_SWEEP_SHAPES[name], per_channel=per_channel)]
    for case in ("GDN dense, H = HV", "GDN varlen, GVA"):
        lines += [f"GLA one pass, {case}: {line}" for line in compile_gla_sweep(case, "Gluon one pass", ssd=False)]
    for stages in (2, 3):  # on the group prep's scores (GATE_SCORES)
        shape = dataclasses.replace(SWEEP_SHAPES["group prep"], num_stages=stages, gluon_sweep=True)
        lines += [f"SSD group prep, {stages} stages: {line}" for line in compile_ssd_benchmark(shape)]
    shape = dataclasses.replace(SWEEP_SHAPES["group prep"], num_stages=2, gluon_sweep=True, segments=2)
    lines += [f"SSD group prep, segments: {line}" for line in compile_ssd_benchmark(shape)]
    shape = plan_gla.GLA_SWEEP_LAUNCH[0][1]  # the planned row: warp-specialised, its stages (the most memory)
    assert shape.specialized and shape.group_prep
    for per_channel in (False, True):  # warp-specialised (kernels/gluon/gla_sweep_specialized.py)
        lines += [f"SSD group prep, warp-specialised, D per {'channel' if per_channel else 'head'}: {line}"
                  for line in compile_ssd_benchmark(shape, per_channel=per_channel)]
    lines += [f"SSD group prep, warp-specialised, 10 groups, dstate 64: {line}"  # the prep's blocks of 8 heads
              for line in compile_ssd_benchmark(shape, groups=10, state_dim=64)]
    lines += [f"SSD group prep, warp-specialised, in phases: {line}"
              for line in compile_ssd_benchmark(dataclasses.replace(shape, phases=3))]
    lines += [f"SSD warp-specialised, scores in the sweep: {line}"
              for line in compile_ssd_benchmark(SPECIALIZED_SCORES_SHAPE)]
    for case in ("GDN dense, H = HV", "GDN varlen, GVA"):
        lines += [f"GLA warp-specialised, scores in the sweep, {case}: {line}"
                  for line in compile_gla_sweep(case, "Gluon warp-specialised, scores in the sweep", ssd=False)]
    # The same keeping the chunk states for the backward (bf16, from the chain's hand-over buffer).
    for name, form in (("", shape), (", in phases", dataclasses.replace(shape, phases=3)),
                       (", scores in the sweep", SPECIALIZED_SCORES_SHAPE)):
        lines += [f"SSD warp-specialised{name}, chunk states: {line}"
                  for line in compile_ssd_benchmark(form, chunk_states=True)]
    lines += [f"GLA warp-specialised, scores in the sweep, GDN varlen, GVA, chunk states: {line}"
              for line in compile_gla_sweep("GDN varlen, GVA", "Gluon warp-specialised, scores in the sweep",
                                            ssd=False, chunk_states=True)]
    return lines


def compile_gla_sweep(case: str, shape: str, ssd: bool, describe=None, per_key: bool = False,
                      chunk_states: bool = False) -> list[str]:
    """A scalar-decay GLA (or, ``ssd``, Mamba2 SSD with every prologue and epilogue part on, mamba's
    seq_idx and a state cache in its [S, H, P, Nstate] layout; or, ``per_key``, a decay per key
    through the per-key prep and the sweep's KEY_DECAY, in the shape as the planner adapts it)
    forward on the delta rule's prep and sweep with the WY step off (launch/delta.py,
    ``wy=False``), in a shape of :data:`SWEEP_SHAPES`, for an M = 1 case of :data:`CASES` (bf16);
    ``chunk_states``: also the chunk states in bf16, as the training forward keeps them
    (GlaShape.forward_states)."""
    from recurscan.plan.gla import per_key_shape_of
    from recurscan.launch.delta import build_delta_launches
    from recurscan.launch.gla import SsdPrologue
    _, cu = CASES[case]
    B, T, H, HV, K = (1, 1000, 2, 4, 128) if cu is not None else (2, 300, 2, 2, 128)
    bf = dict(dtype=torch.bfloat16)
    q, k, v = torch.zeros(B, T, H, K, **bf), torch.zeros(B, T, H, K, **bf), torch.zeros(B, T, HV, 64, **bf)
    N = B if cu is None else len(cu) - 1
    g, h0, slots, state, prologue = torch.zeros(B, T, HV), torch.zeros(N, HV, K, 64), None, None, None
    if per_key:
        g = torch.zeros(B, T, HV, K)
    if ssd:
        prologue = SsdPrologue(torch.zeros(B, T, HV), torch.zeros(HV), torch.zeros(HV), torch.zeros(HV, 64),
                               torch.zeros(B, T, HV, 64, **bf), True, (0.1, 5.0))
        g, h0 = torch.zeros(B, T), None
        state, slots = torch.zeros(8, HV, 64, K).transpose(-1, -2), torch.zeros(N, dtype=torch.int32)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    descriptors = None if cu is None else build_chunk_descriptors(cu_t, 1)
    indices = None if cu is None else descriptors.chunk_indices
    offsets = None if cu is None or not chunk_states else descriptors.chunk_offsets
    sweep_shape = {**SWEEP_SHAPES, **{f"Gluon {k}": v for k, v in GLUON_SWEEP_SHAPES.items()},
                   "Gluon warp-specialised, scores in the sweep": SPECIALIZED_SCORES_SHAPE}[shape]
    group = HV // H
    sweep_shape = dataclasses.replace(sweep_shape, prep_heads=max(d for d in range(1, min(sweep_shape.prep_heads,
                                                                                          group) + 1) if group % d == 0))
    if per_key:  # the planner's adaptation of a row (plan/gla.py)
        sweep_shape = per_key_shape_of(sweep_shape)
    launches = build_delta_launches(q, k, v, g, None, sweep_shape, scale=K ** -0.5, initial_state=h0,
                                    output_final_state=True, cu_seqlens=cu_t, chunk_indices_dp=indices,
                                    state=state, state_indices=slots, wy=False, ssd=prologue, key_decay=per_key,
                                    return_chunk_states=chunk_states, chunk_states_dtype=torch.bfloat16,
                                    chunk_offsets=offsets, num_chunk_rows=None if indices is None else len(indices))
    inputs = DeltaInputs(q, k, v, g, None, h0, state, slots, cu_t, indices, offsets,
                         *((None,) * 5 if prologue is None else prologue.tensors()))
    made = {n: torch.zeros(1, dtype=spec[1]) for n, spec in launches.buffers.items()}
    names = DeltaInputs._fields
    values = tuple(x if x is not None else torch.zeros(1) for x in
                   tuple(inputs) + tuple(made.get(n) for n in CALL_NAMES[len(names):]))
    return [compiled_line(step, CALL_NAMES, values, describe) for step in launches.steps]


def compile_ssd_benchmark(shape: DeltaShape, describe=None, per_channel: bool = False,
                          chunk_states: bool = False, groups: int = 1, state_dim: int = 128) -> list[str]:
    """The SSD forward's launches (launch/delta.py, WY off) in ``shape`` as the benchmark calls them
    (benchmarks/gpu_gla.py's ssd_inputs: 80 heads x 64, one group, dstate 128, D per head (or per
    channel), dt_bias, softplus, no z, bf16), one line each; ``chunk_states``: also the chunk states
    in bf16, as the training forward keeps them (GlaShape.forward_states); ``groups`` and
    ``state_dim`` in place of one group and dstate 128."""
    from recurscan.launch.delta import build_delta_launches
    from recurscan.launch.gla import SsdPrologue
    B, T, H, HV, K, V = 1, 4096, groups, 80, state_dim, 64
    bf = dict(dtype=torch.bfloat16)
    q, k, v = torch.zeros(B, T, H, K, **bf), torch.zeros(B, T, H, K, **bf), torch.zeros(B, T, HV, V, **bf)
    prologue = SsdPrologue(torch.zeros(B, T, HV), torch.zeros(HV), torch.zeros(HV),
                           torch.zeros(HV, V) if per_channel else torch.zeros(HV), None, True, (0.0, float("inf")))
    launches = build_delta_launches(q, k, v, None, None, shape, scale=1.0, output_final_state=True, wy=False,
                                    ssd=prologue, return_chunk_states=chunk_states,
                                    chunk_states_dtype=torch.bfloat16)
    inputs = DeltaInputs(q, k, v, None, None, None, None, None, None, None, None, *prologue.tensors())
    made = {n: torch.zeros(1, dtype=spec[1]) for n, spec in launches.buffers.items()}
    values = tuple(x if x is not None else torch.zeros(1) for x in
                   tuple(inputs) + tuple(made.get(n) for n in CALL_NAMES[len(DeltaInputs._fields):]))
    return [compiled_line(step, CALL_NAMES, values, describe) for step in launches.steps]


def compile_ssd_gate() -> list[str]:
    """The SSD training path's elementwise kernels (autograd/ssd.py): the gate both ways; x's, dt's
    and D's gradients, both D forms, z on; v = dt x; bf16."""
    from recurscan.autograd.ssd import ROWS_PER_PROGRAM
    from recurscan.kernels.gla.ssd_gate import (ssd_gate_bwd_kernel, ssd_gate_fwd_kernel, ssd_step_bwd_kernel,
                                                ssd_value_kernel)
    from recurscan.launch.delta import Step
    bf, f32 = torch.zeros(1, dtype=torch.bfloat16), torch.zeros(1)
    blocks = dict(H=80, P=64, BR=ROWS_PER_PROGRAM, BP=64)
    lines = []
    for kernel, names in ((ssd_gate_fwd_kernel, ("u", "z", "y")), (ssd_gate_bwd_kernel, ("dy", "u", "z", "du", "dz"))):
        step = Step(kernel, (1, 80), dict({n: CallArg(n) for n in names}, n_rows=16384, **blocks), dict(num_warps=4))
        lines.append(compiled_line(step, names, (bf,) * len(names)))
    names = ("dv", "x", "step", "dy", "z", "D", "dg", "A", "dx", "dstep", "dD_part")
    for per_channel in (False, True):
        flags = dict(blocks, HAS_D=True, D_PER_CHANNEL=per_channel, HAS_Z=True)
        values = tuple(f32 if n in ("D", "dD_part", "dv", "step", "dg", "A", "dstep") else bf for n in names)
        step = Step(ssd_step_bwd_kernel, (1, 80), dict({n: CallArg(n) for n in names}, n_rows=16384, **flags),
                    dict(num_warps=4))
        lines.append(compiled_line(step, names, values))
    names = ("x", "step", "v")
    step = Step(ssd_value_kernel, (1, 80), dict({n: CallArg(n) for n in names}, n_rows=16384, **blocks),
                dict(num_warps=4))
    return lines + [compiled_line(step, names, (bf, f32, bf))]


def compile_gla_backward(case: str, describe=None, per_key: bool = False, on_sweep: bool = False,
                         group_prep: bool = False, group_grads: bool = False, grads_sides: bool = False,
                         recompute_twin: bool = False, reverse_specialized: bool = False,
                         dg_specialized: bool = False, ssd_grads: str | None = None,
                         states_given: bool = False) -> list[str]:
    """The GLA backward's launches (launch/gla.py: the forward for the chunk states, the reverse
    sweep, the parallel stage) for a case of :data:`CASES` (M = 1 ones; bf16); ``per_key``: a decay
    per key dimension (the prep runs with the recompute; the stages' PER_KEY forms); ``on_sweep``:
    the recompute on the delta sweep (a scalar decay's planned form, ``GlaShape.sweep``);
    ``group_prep``: there on the group prep, whose scores and gates the reverse sweep reads;
    ``group_grads``: SSD's form, 16 value heads of one query/key head summed in the parallel
    stage's programs (plan.gla.grads_heads); ``grads_sides``: there dq and dk in launches of their
    own (plan.gla.GROUP_GRADS_SIDES, 4 warps); ``recompute_twin``: the recompute's sweep as the
    forward sweep's Gluon twin with its outputs off (GlaShape.recompute_twin), the reverse sweep
    as its Gluon twin (GlaShape.reverse_twin) and, with ``group_grads``, the dg launch as its
    Gluon twin (GlaShape.dg_twin); ``reverse_specialized``: with ``recompute_twin``, the reverse
    sweep's twin warp-specialised (GlaShape.reverse_specialized); ``dg_specialized``: with
    ``recompute_twin`` and ``group_grads``, the dg twin warp-specialised (GlaShape.dg_specialized);
    ``ssd_grads`` ("D per head", "D per channel" or "no D"): the reverse sweep forming SSD's x, dt
    and D gradients (launch.gla.SsdGrads, SSD_GRADS); ``states_given``: the chunk states kept by the
    forward (with ``on_sweep``: the recompute's group prep alone, or nothing), and with
    ``ssd_grads`` and ``group_grads`` the parallel stage forming v = dt x itself (V_FROM_X)."""
    from recurscan.launch.gla import BWD_NAMES, NAMES as GLA_NAMES, SsdGrads, build_gla_backward
    from recurscan.plan.gla import GLA_LAUNCH
    _, cu = CASES[case]
    B, T, H, HV, K = (1, 1000, 2, 4, 128) if cu is not None else (2, 300, 2, 2, 128)
    if group_grads:
        H, HV = 1, 16
        assert plan_gla.grads_heads(B * 16, H, HV, K, 64, per_key, 1) > 1
    bf = dict(dtype=torch.bfloat16)
    q, k, v = torch.zeros(B, T, H, K, **bf), torch.zeros(B, T, H, K, **bf), torch.zeros(B, T, HV, 64, **bf)
    N = B if cu is None else len(cu) - 1
    g, h0, do, dht = torch.zeros(B, T, HV), torch.zeros(N, HV, K, 64), torch.zeros(B, T, HV, 64, **bf), \
        torch.zeros(N, HV, K, 64)
    if per_key:
        g = torch.zeros(B, T, HV, K)
    cu_t = ci = co = None
    if cu is not None:
        cu_t = torch.tensor(cu, dtype=torch.int32)
        d = build_chunk_descriptors(cu_t)
        ci, co = d.chunk_indices, d.chunk_offsets
    sweep = SWEEP_SHAPES["group prep" if group_prep else "one pass"]
    shape = dataclasses.replace(GLA_LAUNCH, sweep=sweep, recompute_on_sweep=True, recompute_twin=recompute_twin,
                                reverse_twin=recompute_twin, dg_twin=recompute_twin,
                                reverse_specialized=reverse_specialized,
                                dg_specialized=dg_specialized) if on_sweep else GLA_LAUNCH
    sides = plan_gla.GROUP_GRADS_SIDES
    plan_gla.GROUP_GRADS_SIDES = 4 if grads_sides else None
    flags = None if ssd_grads is None else SsdGrads(ssd_grads != "no D", ssd_grads == "D per channel")
    try:
        launches = build_gla_backward(q, k, v, g, do, dht, h0, cu_t, ci, co, scale=K ** -0.5, shape=shape,
                                      ssd_grads=flags, states_given=states_given)
    finally:
        plan_gla.GROUP_GRADS_SIDES = sides
    z = torch.zeros(1)
    made = {} if launches.forward is None else \
        {n: torch.zeros(1, dtype=spec[1]) for n, spec in launches.forward.buffers.items()}
    fwd = dict(q=q, k=k, v=v, g=g, h0=h0, cu_seqlens=cu_t, chunk_offsets=co, chunk_indices=ci, **made)
    bwd = dict(q=q, k=k, v=v, g=g, do=do, dht=dht, h0=h0, cu_seqlens=cu_t, chunk_indices=ci, chunk_offsets=co,
               states=torch.zeros(1, **bf), x=torch.zeros(1, **bf), D=torch.zeros(1), step=torch.zeros(1),
               **{n: made[n] for n in ("qg", "kg", "aqk", "dl", "scores", "coef") if n in made},
               **{n: torch.zeros(1, dtype=spec[1]) for n, spec in launches.buffers.items()})
    lines = []
    if on_sweep:  # the delta sweep's launches, with their own call values
        inputs = tuple(DeltaInputs(q, k, v, g, None, h0, None, None, cu_t, ci, co))
        delta_values = tuple(x if x is not None else z for x in inputs + tuple(made.get(n) for n in
                                                                               CALL_NAMES[len(inputs):]))
        lines += [compiled_line(st, CALL_NAMES, delta_values, describe)
                  for st in (launches.forward.steps if launches.forward is not None else [])]
        recompute = []
    else:
        recompute = [(st, GLA_NAMES, fwd) for st in [*launches.forward.preps, launches.forward.step]]
    for step, names, values in recompute + [(st, BWD_NAMES, bwd) for st in launches.steps]:
        lines.append(compiled_line(step, names, tuple(values.get(n) if values.get(n) is not None else z
                                                      for n in names), describe))
    return lines


def compile_descriptors() -> list[str]:
    """The device-side descriptor kernel (launch/descriptors.py's arguments), M = 1 and M = 2, int32
    and int64 boundaries."""
    from types import SimpleNamespace

    from recurscan.kernels.descriptors import chunk_descriptors_kernel
    from recurscan.launch.descriptors import _NAMES, BLOCK_N, BLOCK_R
    lines = []
    for M in (1, 2):
        for dtype in (torch.int32, torch.int64):
            values = (torch.zeros(5, dtype=dtype),) + (torch.zeros(8, dtype=torch.int32),) * 3
            kwargs = dict(zip(_NAMES, map(CallArg, _NAMES)), N=4, R=70, R_DP=130, M=M, CHUNK=64, BLOCK_R=BLOCK_R,
                          BLOCK_N=BLOCK_N)
            step = SimpleNamespace(kernel=chunk_descriptors_kernel, kwargs=kwargs, options=dict(num_warps=4))
            compiled = compile_for_sm90(step, _NAMES, values)
            lines.append(f"chunk_descriptors_kernel M {M} {dtype}: shared {compiled.metadata.shared} B")
    return lines


def _compile_gluon_benchmark_kernel(kernel, sig: dict, const: dict, options: dict):
    """A benchmark's Gluon kernel (its arguments' types ``sig``, constexprs ``const``) compiled for
    sm_90 with ``options``; raises where it does not fit the H200's shared memory, or (with a
    register cap) an SM's register file."""
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = dict(sig, **{n: "constexpr" for n in const})
    names = kernel.arg_names
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items() if t.startswith("*")}
    src = GluonASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in const.items()}, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    fn = kernel.fn.__name__
    if compiled.metadata.shared > H200_SHARED:
        raise AssertionError(f"{fn}: {compiled.metadata.shared} B of shared memory")
    if "maxnreg" in options and 32 * compiled.metadata.num_warps * options["maxnreg"] > 65536:
        raise AssertionError(f"{fn}: {compiled.metadata.num_warps} warps x {options['maxnreg']} registers")
    return compiled


def _gluon_prep_proto(cap, vectors: int = 0, part: int = 0):
    """benchmarks/gluon_prep_proto.py's kernel (GDN dense, H16 HV32, K 128, bf16) compiled for sm_90
    under register cap ``cap`` (None: none) in its VECTORS form and PART."""
    from benchmarks import gluon_prep_proto
    sig = dict(q="*bf16", k="*bf16", g="*fp32", beta="*bf16", wy="*bf16", aqk="*bf16", coef="*fp32", scale="fp32",
               T="i32")
    return _compile_gluon_benchmark_kernel(gluon_prep_proto.gluon_prep_kernel, sig,
                                           dict(H=16, HV=32, K=128, BT=64, VECTORS=vectors, PART=part),
                                           dict(num_warps=4, **({"maxnreg": cap} if cap else {})))


def compile_gluon_prep_proto() -> list[str]:
    """The prototype with no register cap and at the Triton prep's (168), in its VECTORS forms 0, 1
    and 2: a line each with its registers and stack."""
    from benchmarks.sm90_resources import resources
    return [f"gluon_prep_kernel, maxnreg {cap or '-'}, vectors {vectors}: {resources(_gluon_prep_proto(cap, vectors))}"
            for cap, vectors in ((None, 0), (168, 0), (None, 1), (168, 1), (None, 2), (168, 2))]


def compile_fused_prefill(pipelined: bool = False) -> list[str]:
    """The fused prefill's launches (launch/delta_fused.py: the chunk vectors' pass, the fused
    kernel, the flagged token loop) as the launch layer builds them for the planner's row with
    ``fused`` set, dense and varlen with GVA, an initial state and the final state: a line each, the
    fused kernel's with its registers, stack and loops (no stack: compiled_line's Gluon rule).
    ``pipelined``: with ``plan.delta.FUSED_PIPELINED`` on."""
    from benchmarks.sm90_resources import resources
    from recurscan.plan import delta as plan_delta
    from recurscan.plan.delta import DELTA_LAUNCH
    shape = dataclasses.replace(DELTA_LAUNCH[0][1], fused=True)
    planned, plan_delta.FUSED_PIPELINED = plan_delta.FUSED_PIPELINED, pipelined
    try:
        return [f"fused{form}, {case}: {line}" for case in ("GDN dense, H = HV", "GDN varlen, GVA")
                for form, serving in (("", False), (" serving", True))
                for line in compile_delta_forward(case, shape, describe=resources, serving=serving,
                                                  chunk_states=False)]
    finally:
        plan_delta.FUSED_PIPELINED = planned


def compile_fused_prefill_forms() -> list[str]:
    """The fused prefill's kernel (dense, H = HV, an initial and final state) with
    ``plan.delta.FUSED_DIAGONAL_FROM_PASS`` on (then the chunk vectors' pass too) and off, under this
    process's RECURSCAN_FUSED_PROBE: a line each with its registers, stack and its three partitions'
    loops, not held to the planned kernel's no-stack rule (the timing probes; the planned form's is
    :func:`compile_fused_prefill`'s)."""
    from benchmarks.sm90_resources import resources
    from recurscan.kernels.delta.chunk_vectors import chunk_vectors_kernel
    from recurscan.kernels.gluon.delta_fused import PROBE, gluon_fused_prefill_kernel
    from recurscan.launch.delta import build_delta_launches
    from recurscan.plan import delta as plan_delta
    from recurscan.plan.delta import DELTA_LAUNCH
    shape = dataclasses.replace(DELTA_LAUNCH[0][1], fused=True)
    M, cu, (q, k, v, g, beta, h0) = _delta_case("GDN dense, H = HV")
    planned, lines = plan_delta.FUSED_DIAGONAL_FROM_PASS, []
    try:
        for d_pass in (True, False):
            plan_delta.FUSED_DIAGONAL_FROM_PASS = d_pass
            launches = build_delta_launches(q, k, v, g, beta, shape, scale=0.1, initial_state=h0,
                                            output_final_state=True, use_qk_l2norm_in_kernel=True)
            made = {n: torch.zeros(1, dtype=spec[1]) for n, spec in launches.buffers.items()}
            inputs = DeltaInputs(q, k, v, g, beta, h0, None, None, None, None, None)
            values = tuple(x if x is not None else torch.zeros(1) for x in
                           tuple(inputs) + tuple(made.get(n) for n in CALL_NAMES[len(inputs):]))
            form = f"D_FROM_PASS {d_pass}, probe {PROBE.value}"
            for step in launches.steps:
                if step.kernel is gluon_fused_prefill_kernel or (d_pass and step.kernel is chunk_vectors_kernel):
                    ck = compile_for_sm90(step, CALL_NAMES, values)
                    name = getattr(step.kernel, "fn", step.kernel).__name__
                    lines.append(f"fused {form}: {name}: {resources(ck, loops=3)}")
    finally:
        plan_delta.FUSED_DIAGONAL_FROM_PASS = planned
    return lines


def sass_counts(compiled) -> str:
    """Static SASS counts of a compiled kernel (Triton's bundled cuobjdump): its instructions, and of
    them barriers, shuffles, shared-memory accesses, tensor-core instructions and MUFU."""
    import os
    import re
    import subprocess
    import tempfile
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    kinds = {"BAR": ("BAR",), "SHFL": ("SHFL",), "LDS/STS": ("LDS", "STS"), "HGMMA/HMMA": ("HGMMA", "HMMA"),
             "MUFU": ("MUFU",)}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    ops = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass)]
    counts = ", ".join(f"{k} {sum(o.startswith(p) for o in ops)}" for k, p in kinds.items())
    return f"{len(ops)} instructions, {counts}"


def gluon_prep_proto_sass() -> list[str]:
    """Where the prototype's instructions go, by PART (2 the loads and three products, 1 with the
    gates to aqk, 0 the whole prep) and VECTORS form, at 168 registers: :func:`sass_counts` of the
    whole kernel (its path is straight-line)."""
    return [f"gluon_prep_kernel, vectors {vectors}, part {part}: {sass_counts(_gluon_prep_proto(168, vectors, part))}"
            for vectors in (0, 1, 2) for part in (2, 1, 0)]


def prep_query_sass() -> list[str]:
    """The delta prep as planned (GDN dense, bf16, K = V = 128, l2norm, 4 warps at the planner's
    register cap) with its QUERY switch at 2 (the package's), 1 and 0
    (benchmarks/gpu_prep_query_share.py times the same three): :func:`sass_counts` and its stack."""
    from benchmarks.delta_variants import with_constants
    from recurscan.kernels.delta.prep import chunk_delta_prep_kernel
    from recurscan.launch.delta import build_delta_launches
    M, cu, (q, k, v, g, beta, h0) = _delta_case("GDN dense, H = HV")
    launches = build_delta_launches(q, k, v, g, beta, PLANNED_FORWARD, scale=q.shape[3] ** -0.5, initial_state=h0,
                                    output_final_state=True, use_qk_l2norm_in_kernel=True)
    inputs = DeltaInputs(q, k, v, g, beta, h0, None, None, None, None, None)
    made = {n: torch.zeros(1, dtype=spec[1]) for n, spec in launches.buffers.items()}
    values = tuple(x if x is not None else torch.zeros(1) for x in
                   tuple(inputs) + tuple(made.get(n) for n in CALL_NAMES[len(inputs):]))
    lines = []
    for query in (2, 1, 0):
        (step,) = [s for s in with_constants(launches, "prep", QUERY=query).steps
                   if s.kernel is chunk_delta_prep_kernel]
        compiled = compile_for_sm90(step, CALL_NAMES, values)
        lines.append(f"chunk_delta_prep_kernel, QUERY {query}, maxnreg {step.options.get('maxnreg', '-')}: "
                     f"{sass_counts(compiled)}, stack {stack_bytes(compiled)} B")
    return lines


def lines_for(argv: list[str]) -> list[str]:
    """The compiled lines of one command line of this module (its docstring's forms)."""
    if argv[0] == "gluon-forward":
        return compile_gluon_forward()
    if argv[0] == "gluon-prep-proto":
        return compile_gluon_prep_proto()
    if argv[0] in ("fused-prefill", "fused-prefill-pipelined"):
        return compile_fused_prefill(pipelined=argv[0] == "fused-prefill-pipelined")
    if argv[0] == "fused-prefill-forms":
        return compile_fused_prefill_forms()
    if argv[0] == "gluon-prep-proto-sass":
        return gluon_prep_proto_sass()
    if argv[0] == "prep-query-sass":
        return prep_query_sass()
    if argv[0] == "ssd-gate":
        return compile_ssd_gate()
    if argv[0] in ("gla-sweep", "ssd-sweep", "gla-per-key-sweep"):
        return compile_gla_sweep(argv[1], argv[2], ssd=argv[0] == "ssd-sweep", per_key=argv[0] == "gla-per-key-sweep")
    if argv[0] == "descriptors":
        return compile_descriptors()
    if argv[0] in ("gla-backward", "gla-per-key-backward", "gla-sweep-backward", "gla-group-sweep-backward",
                   "gla-group-sweep-twin-backward", "ssd-group-grads-backward", "ssd-group-grads-sides-backward",
                   "ssd-group-grads-twin-backward"):
        ssd_group = argv[0].startswith("ssd-group-grads")
        twin = argv[0] in ("gla-group-sweep-twin-backward", "ssd-group-grads-twin-backward")
        return compile_gla_backward(argv[1], per_key=argv[0] == "gla-per-key-backward",
                                    on_sweep=argv[0].endswith("sweep-backward") or ssd_group or twin,
                                    group_prep=argv[0] == "gla-group-sweep-backward" or ssd_group or twin,
                                    group_grads=ssd_group, grads_sides=argv[0] == "ssd-group-grads-sides-backward",
                                    recompute_twin=twin)
    if argv[0] in ("gla", "gla-chunk-states", "gla-per-key", "gla-split", "ssd", "ssd-cache", "ssd-seq-idx",
                   "ssd-split"):
        return compile_gla(argv[1], ssd=argv[0].startswith("ssd"), cache=argv[0] == "ssd-cache",
                           seq_idx=argv[0] in ("ssd-seq-idx", "ssd-split"), chunk_states=argv[0] == "gla-chunk-states",
                           per_key=argv[0] == "gla-per-key", split=argv[0].endswith("split"))
    return compile_case(argv[0], argv[1], *map(int, argv[2:4]))


#: What starts each answer line of :func:`serve` (anything else a compile prints is not one).
ANSWER = "@@sm90@@ "


def serve() -> None:
    """Compile one command line per line of stdin (a JSON list of its arguments) and answer each with
    one line, :data:`ANSWER` and the JSON of ``{"returncode", "stdout", "stderr"}``: one process
    (its imports once, ~4 s) for every case a test process asks for (tests/test_sm90_compile.py)."""
    import contextlib
    import json
    import traceback
    answers = sys.stdout
    for line in sys.stdin:
        try:
            with contextlib.redirect_stdout(sys.stderr):
                lines = lines_for(json.loads(line))
            answer = dict(returncode=0, stdout="\n".join(lines) + "\n", stderr="")
        except BaseException:  # noqa: BLE001 - the asking test reports it
            answer = dict(returncode=1, stdout="", stderr=traceback.format_exc())
        answers.write(ANSWER + json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        print("\n".join(lines_for(sys.argv[1:])))
