"""Benchmark-only variants of the chunked delta rule's launches (recurscan/launch/delta.py), which
the library no longer takes as options (issue 18): a stage run alone (``only_stage``, was
``chunk_delta_fwd(stages="prep" | "sweep")``) and a kernel's constants changed (``with_constants``,
e.g. ``INV_FP16=False`` on the prep: was ``inverse_fp16=False``), and the launch that ranks a
varlen batch's sequences for a sweep run alone (``sequence_order_kernel``).

Each takes a :class:`recurscan.launch.delta.DeltaLaunches` (``build_delta_launches``) and returns a
new one to run with ``run_delta_launches``; the one given is never changed. Imports triton.

    launches = build_delta_launches(q, k, v, g, beta, shape, output_final_state=True)
    sweep = only_stage(launches, "sweep")          # the sweep alone, on whatever scratch is there
    tf32 = with_constants(launches, "prep", INV_FP16=False)  # the WY inverse on tf32 everywhere

:func:`variant_launches` and :func:`variant_fwd` take the former keyword style in one call
(``stage=``, ``inverse_fp16=``, the launch shape's fields as keywords).
"""
from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from recurscan.kernels.delta.common import RANK_BLOCK, _rank_sequences
from recurscan.kernels.delta.fixup import chunk_delta_fixup_kernel
from recurscan.kernels.delta.prep import chunk_delta_prep_kernel
from recurscan.kernels.delta.sweep import chunk_delta_sweep_kernel
from recurscan.launch.delta import (CALL_NAMES, TEST_SHAPE, DeltaInputs, DeltaLaunches, Step, build_delta_launches,
                                    run_delta_launches)
from recurscan.plan import DeltaShape
from recurscan.runtime.launcher import CallArg


@triton.jit(do_not_specialize=["N"])
def sequence_order_kernel(cu_seqlens, order, N, BLOCK: tl.constexpr):
    """Grid (ceil(N / BLOCK),): ``order`` = the sequences by length, longest first, ties in index
    order (:func:`_rank_sequences`). The prep kernel does this ranking itself (its first programs);
    this launch serves a sweep run alone (benchmarks) and the tests.

    Why the varlen sweep wants it: each sweep program walks its sequence's chunks one after
    another and programs start in launch order, so a long sequence launched last adds the whole of
    its walk to the end (list scheduling; longest first is the classic remedy). H200, the
    16-sequence varlen workload packed shortest first: 1.096 -> 0.940 ms with the ranking in the
    prep (docs/kernels-chunk-delta.md)."""
    _rank_sequences(cu_seqlens, order, N, tl.program_id(0), BLOCK, 16)


#: The stage names ``only_stage`` and ``with_constants`` take, and their kernels.
KERNELS = {"prep": chunk_delta_prep_kernel, "sweep": chunk_delta_sweep_kernel, "fixup": chunk_delta_fixup_kernel}


def _kernel(kernel):
    if isinstance(kernel, str):
        if kernel not in KERNELS:
            raise ValueError(f"kernel: expected a kernel or one of {sorted(KERNELS)}, got {kernel!r}")
        return KERNELS[kernel]
    return kernel


def _name(kernel) -> str:
    return getattr(getattr(kernel, "fn", kernel), "__name__", repr(kernel))


def _copy(launches: DeltaLaunches, steps: list) -> DeltaLaunches:
    """A new DeltaLaunches of ``steps`` (fresh: compiled and launched again on its first run), with
    the buffers its steps and outputs use."""
    outputs = tuple(None if i is None else CALL_NAMES[i] for i in launches.outputs)
    used = {str(a) for s in steps for a in s.kwargs.values() if isinstance(a, CallArg)} | set(outputs)
    buffers = {n: b for n, b in launches.buffers.items() if n in used}
    return DeltaLaunches(buffers, steps, outputs, launches.device)


def _fresh(step: Step) -> Step:  # a copy of its own (the run sets ``direct`` on it)
    return dataclasses.replace(step, kwargs=dict(step.kwargs), options=dict(step.options), direct=None)


def only_stage(launches: DeltaLaunches, stage: str) -> DeltaLaunches:
    """A copy of ``launches`` that runs one stage alone (benchmarks time each; the stage reads the
    scratch an earlier run left, or poison):

    - "prep": the prep kernel's launch;
    - "sweep": every launch but the prep (the sweep, the segments' passes and fix-up, the replay),
      after a launch of :func:`sequence_order_kernel` for a varlen batch (the prep writes the
      ``sequence_order`` buffer the varlen sweep reads).

    The phased and chained schedules interleave the two stages (each phase's prep beside the
    previous phase's sweep; the prep beside the sweep chunk by chunk), so a stage alone is not a part
    of them: build the launches with ``phases=1`` and ``chained=False``, as ``chunk_delta_fwd(stages=...)``
    did (it ignored ``phases``)."""
    if stage not in ("prep", "sweep"):
        raise ValueError(f"stage: expected 'prep' or 'sweep', got {stage!r}")
    preps = [s for s in launches.steps if s.kernel is chunk_delta_prep_kernel]
    if len(preps) > 1 or launches.chained >= 0 or any(s.kwargs.get("PASS") == 3 for s in launches.steps):
        raise ValueError("only_stage: phased or chained launches run their stages interleaved; build them with "
                         "phases=1 and chained=False")
    if stage == "prep":
        steps = [_fresh(s) for s in preps]
    else:
        steps = [_fresh(s) for s in launches.steps if s.kernel is not chunk_delta_prep_kernel]
        if "sequence_order" in launches.buffers:  # varlen, N > 0: the sweep's order of sequences
            (n,), _, _ = launches.buffers["sequence_order"]
            steps.insert(0, Step(sequence_order_kernel, (triton.cdiv(n, RANK_BLOCK.value),),
                                 dict(cu_seqlens=CallArg("cu_seqlens"), order=CallArg("sequence_order"), N=n,
                                      BLOCK=RANK_BLOCK.value), dict(num_warps=4)))
    return _copy(launches, steps)


def with_constants(launches: DeltaLaunches, kernel, **constants) -> DeltaLaunches:
    """A copy of ``launches`` whose launches of ``kernel`` (the kernel, or "prep", "sweep",
    "fixup") take ``constants`` in place of their own arguments of those names, e.g.
    ``with_constants(launches, "prep", INV_FP16=False)``: the WY inverse on tf32 operands in every
    chunk (16-bit inputs take fp16 operands where every step contracts; benchmarks/gpu_prep_variants.py
    measures both)."""
    kernel = _kernel(kernel)
    mine = [s for s in launches.steps if s.kernel is kernel]
    if not mine:
        raise ValueError(f"with_constants: no launch of {_name(kernel)} in these launches")
    for step in mine:
        unknown = [n for n in constants if n not in step.kwargs]
        if unknown:
            raise ValueError(f"with_constants: {_name(kernel)} takes no argument {unknown}")
    steps = [dataclasses.replace(s, kwargs=dict(s.kwargs, **(constants if s.kernel is kernel else {})),
                                 options=dict(s.options), direct=None) for s in launches.steps]
    return _copy(launches, steps)


#: The keyword arguments of :func:`variant_launches` that are fields of the launch shape.
SHAPE_FIELDS = frozenset(f.name for f in dataclasses.fields(DeltaShape))


def variant_launches(q, k, v, g, beta, *, stage: str = "both", inverse_fp16: bool | None = None,
                     shape: DeltaShape | None = None, **kw) -> DeltaLaunches:
    """``build_delta_launches`` with the switches the former ``plan_chunk_delta`` took:

    - ``stage``: "both", or "prep" / "sweep" alone (:func:`only_stage` of the unphased, unchained
      launches: ``phases`` and ``chained`` apply to "both" only);
    - ``inverse_fp16``: None keeps the launches' choice (fp16 operands for the WY inverse where
      every step contracts, for 16-bit inputs); True / False sets the prep's ``INV_FP16``;
    - ``shape`` (default ``TEST_SHAPE``, chunk_delta_fwd's) with the DeltaShape fields among
      ``kw`` (block_v, num_warps, segments, ...) replaced; the rest of ``kw`` as
      ``build_delta_launches``."""
    fields = {name: kw.pop(name) for name in list(kw) if name in SHAPE_FIELDS}
    if stage != "both":
        fields.update(phases=1, chained=False)
    launches = build_delta_launches(q, k, v, g, beta, dataclasses.replace(shape or TEST_SHAPE, **fields), **kw)
    if inverse_fp16 is not None:
        launches = with_constants(launches, "prep", INV_FP16=bool(inverse_fp16))
    return launches if stage == "both" else only_stage(launches, stage)


def variant_fwd(q, k, v, g, beta, **kw) -> tuple:
    """:func:`variant_launches` and run, in one go (as ``chunk_delta_fwd``): ``(o, final state or
    None[, chunk states])``."""
    names = DeltaInputs._fields[5:]
    inputs = DeltaInputs(q, k, v, g, beta, *(kw.get(name) for name in names))
    return run_delta_launches(variant_launches(q, k, v, g, beta, **kw), inputs)
