"""The planner: the only place that decides. From a validated problem and a device, a Schedule
(data, never a launch): the backend, the algorithm, and the Triton launch shape.

``RULES`` picks the backend, read top to bottom, the first row whose condition holds decides,
each with its reason; the launch shapes come from the rule tables of :mod:`.delta` (chunked
delta rule) and :mod:`.stream` (the streaming kernel). Never autotunes: the same problem on the
same device always gets the same schedule.

    >>> import torch
    >>> from recurscan.plan import plan
    >>> from recurscan.problem import delta_problem
    >>> q = k = torch.randn(1, 100, 2, 32); v = torch.randn(1, 100, 2, 32)
    >>> plan("delta_rule", delta_problem(q, k, v, None, None), torch.device("cpu")).backend
    'torch'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..descriptors import CHUNK_SIZE
from .delta import DELTA_LAUNCH, DeltaShape, DeltaSizes, delta_shape, triton_delta_unsupported
from .gla import GLA_LAUNCH, GlaShape, gla_shape, triton_gla_unsupported, triton_ssd_unsupported
from .device import check_triton_device, interpreter_off_reason, interpreter_on, sm_count
from .stream import (DISPATCH_STEP_BOUND, StateColumnTooLarge, StreamShape, StreamSizes, check_column_fits,
                     stream_shape)

__all__ = ["plan", "Schedule", "Rule", "RULES", "BACKENDS", "DeltaShape", "DeltaSizes", "DELTA_LAUNCH",
           "delta_shape", "StreamShape", "StreamSizes", "stream_shape", "DISPATCH_STEP_BOUND",
           "StateColumnTooLarge", "check_column_fits", "sm_count", "interpreter_off_reason", "interpreter_on",
           "check_triton_device", "triton_delta_unsupported", "GlaShape", "GLA_LAUNCH", "triton_gla_unsupported"]

BACKENDS = ("torch", "triton")


@dataclass(frozen=True)
class Schedule:
    backend: str  # "torch": the oracle's form in PyTorch; "triton": the kernels
    algorithm: str  # "chunked" (prefill, training) or "recurrent" (token by token: decode)
    chunk_size: int
    reason: str
    # The Triton launch shape: DeltaShape (chunked delta rule), GlaShape (chunked GLA), StreamShape
    # (recurrent); None for torch.
    launch: DeltaShape | GlaShape | StreamShape | None = None

    def describe(self) -> str:
        """The schedule as printable lines: algorithm, backend, why, and every launch field.

        Example:
            >>> import torch
            >>> from recurscan.plan import plan
            >>> from recurscan.problem import delta_problem
            >>> x = torch.randn(1, 64, 2, 16)
            >>> print(plan("delta_rule", delta_problem(x, x, x, None, None), torch.device("cpu")).describe())
            chunked on torch, chunks of 64: a CPU tensor runs the PyTorch oracle
        """
        lines = [f"{self.algorithm} on {self.backend}, chunks of {self.chunk_size}: {self.reason}"]
        if self.launch is not None:
            import dataclasses
            fields = [f"{f.name} {getattr(self.launch, f.name)}" for f in dataclasses.fields(self.launch)
                      if f.name != "reason"]
            lines += [f"  launch: {', '.join(fields)}", f"  launch row: {self.launch.reason}"]
        return "\n".join(lines)


@dataclass(frozen=True)
class Rule:
    reason: str
    applies: Callable[[str, object, torch.device, str], bool]  # (family, problem, device, algorithm)
    backend: str


def _triton_chunked_delta(family, problem, device, algorithm) -> bool:
    return (family == "delta_rule" and algorithm == "chunked" and device.type == "cuda"
            and triton_delta_unsupported(problem) is None)


def _triton_chunked_gla(family, problem, device, algorithm) -> bool:
    if family not in ("gla", "ssd") or algorithm != "chunked" or device.type != "cuda":
        return False
    return (triton_gla_unsupported if family == "gla" else triton_ssd_unsupported)(problem) is None


#: The families the streaming kernel runs token by token (flags on one kernel).
STREAM_FAMILIES = ("delta_rule", "ssd")

RULES: list[Rule] = [
    Rule("a recurrent (decode / streaming) call on a CUDA device runs the streaming Triton kernel "
         "(kernels/stream/recurrence.py; its launch shape is plan/stream.py's rule table)",
         lambda family, problem, device, algorithm: (algorithm == "recurrent" and family in STREAM_FAMILIES
                                                     and device.type == "cuda"), "triton"),
    Rule("a CPU tensor runs the PyTorch oracle",
         lambda family, problem, device, algorithm: device.type == "cpu", "torch"),
    Rule("chunked delta-rule prefill on a CUDA device runs the Triton kernels (prep + sweep)",
         _triton_chunked_delta, "triton"),
    Rule("chunked GLA with a scalar decay, and SSD on it, on a CUDA device run the delta rule's prep and sweep with "
         "the WY step off (plan/gla.py): on the H200 at 6dc10bf, chunk_simple_gla B4 T4096 H16 0.151 ms (the fused "
         "GLA kernel 0.493, the PyTorch form 51.4 at fa89d4d), mamba_chunk_scan_combined B1 T16384 (80 heads x 64, "
         "dstate 128) 0.830 ms in one pass, 0.712 in 6 phases (fused 2.103; 198 for the PyTorch form's recurrence at "
         "fa89d4d) "
         "(benchmarks/results/gpu_gla_sweep_6dc10bf.json); the backward runs the GLA kernels (kernels/gla/); "
         "with a decay per key dimension (chunk_gla: the per-key prep, then the delta sweep with KEY_DECAY) "
         "B4 T4096 H16 K=V=128 1.255 ms (the fused kernel 2.51, the PyTorch form 100; gpu_call_863b5e5.log), "
         "forward + backward 18.2 against 425 (gpu_gla_per_key_5ff53ea.json)",
         _triton_chunked_gla, "triton"),
    Rule("no Triton kernel measured for this problem on this device: the PyTorch form runs there too "
         "(float64 inputs; the diagonal scans have none)",
         lambda family, problem, device, algorithm: True, "torch"),
]


def stream_sizes(family: str, problem) -> StreamSizes:
    """The streaming rule table's view of a recurrent problem (DeltaProblem or SsdDecodeProblem)."""
    if family == "ssd":  # mamba's state [S, H, P, N]: the key (dstate) rows are contiguous
        return StreamSizes(problem.batch * problem.heads, problem.state_dim, problem.head_dim, problem.tokens,
                           problem.state_bytes, key_contiguous=True)
    return StreamSizes(problem.sequences * problem.value_heads, problem.key_dim, problem.value_dim,
                       problem.tokens * problem.householder, problem.state_bytes, problem.state_key_contiguous)


def _triton_launch(family, problem, device, algorithm, gluon=True):
    """The launch shape; ``gluon`` False (``backend="triton"``): no stage as a Gluon twin."""
    if algorithm == "recurrent":
        return stream_shape(stream_sizes(family, problem), device)
    if family in ("gla", "ssd"):
        return gla_shape(problem, device, gluon=gluon)
    return delta_shape(problem, device, gluon=gluon)


#: Where :func:`plan` appends ``(family, problem, schedule)`` while a caller records them
#: (``recurscan.record_schedules``, ops/schedules.py); None: not recording.
RECORDER: list | None = None


def plan(family: str, problem, device: torch.device, algorithm: str = "chunked",
         backend: str | None = None) -> Schedule:
    """Pick the backend and launch shape for ``problem`` of ``family`` on ``device``.

    ``family``: "delta_rule", "ssd", "gla" or "diagonal". ``algorithm``: "chunked" for the
    prefill/training ops, "recurrent" for the token-by-token (decode) ops, whose per-token order of
    operations the chunked form would not reproduce. ``backend`` forces "torch" or "triton" (the
    Triton kernels on CPU tensors run under ``TRITON_INTERPRET=1``); None lets the rules decide.
    A forced backend that cannot run is a ValueError that says why.
    """
    schedule = _plan(family, problem, device, algorithm, backend)
    if RECORDER is not None:
        RECORDER.append((family, problem, schedule))
    return schedule


def _plan(family: str, problem, device: torch.device, algorithm: str = "chunked",
          backend: str | None = None) -> Schedule:
    """The rules behind :func:`plan`."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend: expected None, 'torch' or 'triton', got {backend!r}")
    if backend == "torch":
        return Schedule("torch", algorithm, CHUNK_SIZE, "backend='torch' was asked for")
    if backend == "triton":
        if algorithm == "recurrent" and family not in STREAM_FAMILIES or \
                algorithm == "chunked" and family not in ("delta_rule", "gla", "ssd"):
            raise ValueError(f"backend='triton': no Triton kernel for {family} ({algorithm}) yet")
        why = None
        if algorithm == "chunked":
            why = {"delta_rule": triton_delta_unsupported, "gla": triton_gla_unsupported,
                   "ssd": triton_ssd_unsupported}[family](problem)
        if why is not None:
            raise ValueError(f"backend='triton': {why}")
        check_triton_device(device)
        return Schedule("triton", algorithm, CHUNK_SIZE, "backend='triton' was asked for",
                        _triton_launch(family, problem, device, algorithm, gluon=False))
    for rule in RULES:
        if rule.applies(family, problem, device, algorithm):
            launch = _triton_launch(family, problem, device, algorithm) if rule.backend == "triton" else None
            return Schedule(rule.backend, algorithm, CHUNK_SIZE, rule.reason, launch)
    raise AssertionError("the last rule always applies")
