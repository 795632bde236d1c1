"""The planner: from a validated problem and a device, a Schedule (data, never a launch).

Two tables, each read top to bottom; the first row whose condition holds decides, and each row
says why. ``RULES`` picks the backend; ``DELTA_LAUNCH`` picks the Triton launch shape of the
delta-rule chunked kernels from the shape and the device. The planner never launches anything and
never autotunes: the same problem on the same device always gets the same schedule.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch

from .reference.common import CHUNK_SIZE

BACKENDS = ("torch", "triton")


@dataclass(frozen=True)
class Launch:
    """Launch shape of the delta-rule chunked kernels (recurscan/kernels/chunk_delta.py)."""

    block_v: int  # BV: value columns per sweep program
    num_warps: int  # sweep kernel
    num_stages: int  # software-pipelining depth of the sweep's chunk loop
    prep_warps: int  # prep (WY) kernel
    reason: str
    # Sweep segments per sequence (dense batches; kernels/chunk_delta.py, chunk_delta_fwd's
    # ``segments``): 1 = one program walks the whole sequence; P > 1 = two parallel passes over
    # P segments with a sequential fix-up between (chosen by the rows below, from H200 measurements).
    segments: int = 1
    # The sweep forms V^T wy^T as its own product, so V is pipelined through shared memory
    # (chunk_delta_fwd's ``v_product``); False keeps V in registers, 16 KB less shared memory.
    v_product: bool = True
    # Output tiles by bulk tensor stores (chunk_delta_fwd's ``tma_store``; M = 1 only, the kernel
    # keeps the masked store elsewhere): 8 barriers per chunk instead of 15 at BV 64.
    tma_store: bool = False
    # Phases of the single pass (dense; chunk_delta_fwd's ``phases``): the prep of each phase's
    # chunks runs beside the sweep of the phase before, on the SMs that few sweep programs leave free.
    phases: int = 1
    # A register cap on the prep (a compile option; None: none), which sets how many of its programs
    # share a multiprocessor (chunk_delta_fwd's ``prep_maxnreg``). 168: three 4-warp programs a
    # multiprocessor instead of two, for 48-88 B of spills (sm_90); prep alone, H200, graph replay:
    # B1 T16384 0.266 -> 0.244 ms, B4 T8192 HV64 1.032 -> 0.962, GDP M2 0.270 -> 0.249; 128 (four
    # a multiprocessor, 400 B of spills) was slower than none (gpu_prep_ab_regs.json).
    prep_maxnreg: int | None = 168


@dataclass(frozen=True)
class Schedule:
    backend: str  # "torch": the oracle's chunked form in PyTorch; "triton": the GPU kernels
    algorithm: str  # "chunked" or "recurrent"
    chunk_size: int
    reason: str
    launch: Launch | None = None  # the Triton launch shape; None for the torch backend


@dataclass(frozen=True)
class Rule:
    reason: str
    applies: Callable[[str, object, torch.device, str], bool]  # (family, problem, device, algorithm)
    backend: str


def interpreter_off_reason() -> str | None:
    """Why Triton's interpreter cannot run kernels on CPU tensors in this process, or None if it can.

    Asking for it is ``TRITON_INTERPRET=1`` in the environment. Triton also reads that variable
    when its ``@triton.jit`` decorators run: for its own library functions (``triton.language``)
    when triton is first imported, and for recurscan's kernels when ``recurscan.kernels.*`` is
    first imported. A function decorated while the variable was unset is built for the GPU
    compiler and fails inside the interpreter ("Cannot call @triton.jit'd outside of the scope of
    a kernel"), so the variable set only after that import is not enough: this looks at what
    the decorators already built.
    """
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return "TRITON_INTERPRET is not 1 in the environment"
    if "triton" not in sys.modules:
        return None  # the decorators will run under the interpreter
    try:
        from triton.runtime.interpreter import InterpretedFunction
        import triton.language.standard as triton_standard
    except ImportError:  # a Triton without these modules: trust the environment
        return None
    if not isinstance(triton_standard.cdiv, InterpretedFunction):
        return "TRITON_INTERPRET=1 was set after triton was imported (triton's functions were built for the GPU)"
    for name in ("recurscan.kernels.chunk_delta", "recurscan.kernels.recurrent"):
        module = sys.modules.get(name)
        jitted = [f for f in vars(module).values() if type(f).__name__ == "JITFunction"] if module else []
        if jitted:
            return f"TRITON_INTERPRET=1 was set after {name} was imported (its kernels were built for the GPU)"
    return None


def interpreter_on() -> bool:
    """Triton's interpreter runs kernels on CPU tensors here (see :func:`interpreter_off_reason`)."""
    return interpreter_off_reason() is None


def check_triton_device(device: torch.device) -> None:
    """``backend="triton"`` can run on ``device``: CUDA, or CPU under a working interpreter."""
    if device.type == "cuda":
        return
    if device.type != "cpu":
        raise ValueError(f"backend='triton': no Triton kernels for device {device}")
    why = interpreter_off_reason()
    if why is not None:
        raise ValueError(f"backend='triton' on CPU tensors runs under Triton's interpreter, but {why}: set "
                         "TRITON_INTERPRET=1 in the environment before triton is first imported")


def triton_delta_unsupported(problem) -> str | None:
    """Why the delta-rule Triton kernels cannot take this problem, or None if they can."""
    if problem.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"inputs in {problem.dtype}: the kernels take float16, bfloat16 or float32"
    if problem.beta_per_value:
        return "a beta per value column needs one triangular system per column; the kernels take beta per head"
    if problem.key_dim > 256:
        return f"K = {problem.key_dim} > 256: the sweep holds a [K, BV] state tile on chip"
    return None


def _triton_chunked_delta(family, problem, device, algorithm) -> bool:
    return (family == "delta_rule" and algorithm == "chunked" and device.type == "cuda"
            and triton_delta_unsupported(problem) is None)


RULES: list[Rule] = [
    Rule("a recurrent (decode / streaming) call on a CUDA device runs the streaming Triton kernel "
         "(kernels/recurrent.py; its launch shape is stream_config's rule table there)",
         lambda family, problem, device, algorithm: family == "stream" and device.type == "cuda", "triton"),
    Rule("a CPU tensor runs the PyTorch oracle's chunked form",
         lambda family, problem, device, algorithm: device.type == "cpu", "torch"),
    Rule("chunked delta-rule prefill on a CUDA device runs the Triton kernels (prep + sweep)",
         _triton_chunked_delta, "triton"),
    Rule("no Triton kernel for this family on this device yet: the PyTorch form runs there too",
         lambda family, problem, device, algorithm: True, "torch"),
]


@lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (1 for any other device), read once per device. The launch
    rules here and the streaming kernel's (kernels/recurrent.py ``stream_config``) size grids by it."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


# Delta-rule launch shapes. ``pairs`` = sequences x value heads (independent state sweeps);
# ``sms`` = multiprocessors. Each sweep program runs its sequence's chunks one after another;
# more value blocks give more programs but re-read q, k, wy and aqk once per block. BV 64 runs the
# sweep's products on wgmma (one warpgroup), BV 128 on two; BV 16 / 32 on mma.sync. Shared memory
# decides programs per SM: BV 64 with V in registers and two stages is 101 KB (two per SM); with V
# as a product operand (v_product) 117 KB (one per SM), three stages 176 KB; BV 128 / 8 warps with
# three stages 203 KB. The bulk output store (tma_store) builds a descriptor per program: it pays
# over long sequences and cost 5% at B4 T4096 (64 chunks per program, one program per SM).
# Measured on the H200 (graph replay, prep + sweep, ms; shape = BV/warps/stages/segments/v_product
# [/tma]; benchmarks/results/gpu_chunk_variants_24e39f1.json, then _unmasked_2775e77.json):
#   B1 T16384 HV32 (32 pairs):  64/4/3/1/vp/tma 0.685, 64/4/3/1/vp 0.695, 64/4/2/P3/reg/tma 0.697, 64/4/2/P3/reg 0.699
#   B1 T65536 HV32 (32 pairs):  64/4/3/1/vp/tma 2.736, 64/4/2/P3/reg/tma 2.736, 64/4/2/P3/reg 2.744, 64/4/3/1/vp 2.785
#     (31a8e14, gpu_chunk_variants_seg_vp_tma_31a8e14.json: 64/4/3/P3/vp/tma 0.698 at T16384, 2.734 at T65536)
#   B1 T16384 H8 HV16 (16):     64/4/3/P3/vp/tma 0.373, 64/4/2/P3/reg 0.510, 64/4/3/1/vp/tma 0.537 (31a8e14)
#   B4 T4096 H=HV=16 (64):      64/4/3/1/vp 0.253, 64/4/3/1/vp/tma 0.265 (24e39f1: 64/4/2/1/reg 0.340, 128/8/3/1/vp 0.346)
#   GDP M2 B4 T4096 (64):       64/4/3/1/vp 0.493 (24e39f1: 64/4/2/1/reg 0.685, 128/8/3/1/vp 0.703; no bulk store at M > 1)
#   B4 T8192 HV64 (256 pairs):  128/8/3/1/vp/tma 1.778, 128/8/3/1/vp 1.814 (24e39f1: 64/4/2/1/reg 2.017, 64/4/3/1/vp 2.176)
#   varlen 16 x HV32 (512):     128/8/3/1/vp/tma 0.921, 128/8/3/1/vp 0.943 (24e39f1: 64/4/2/1/reg 1.051, 64/4/3/1/vp 1.256)
# Phases (chunk_delta_fwd's ``phases``; gpu_chunk_variants_phases_r08.json, _ph_*.json; the one-pass
# row's shape, ratio 0.8 between phases): B1 T16384 HV32 one phase 0.674, 2: 0.576, 3: 0.548,
# 4: 0.537-0.542, 6: 0.536-0.540, 8: 0.550; T65536 one phase 2.653, 4: 2.028, 6: 1.981, 8: 1.966,
# 12: 1.966, 16: 1.987; ratio 0.7 / 0.9 slower (T16384 4 phases 0.553 / 0.549). Only where the
# sweep leaves half the SMs or more to the prep (B1 HV32: 64 programs); not measured in between.
# With the prep at three programs a SM (b9e5cd0; gpu_chunk_variants_ratio_*.json), ratio 0.9 is
# best: T16384 4 / 6 / 8 phases 0.519 / 0.519 / 0.527 (0.8: 0.528 / 0.524 / 0.534; 0.85, 0.95 and
# 1.0 slower), T65536 8 / 12 phases 1.905 / 1.905 (0.8: 1.951 / 1.957).
# The switch from one pass to segments sits between 32 programs (B1 HV16: segments 1.44x faster)
# and 64 (B1 HV32: a tie); where exactly is not measured. BV 16 / 32 rows: from the measurements
# of 5941d22 (32 pairs: BV 32 1.08 ms, 16 1.11), V in registers as then.
@dataclass(frozen=True)
class LaunchShape:
    """What the launch rows read: independent (sequence, head) sweeps, multiprocessors, V, the
    expanded-stream length of one sequence (varlen: of the whole batch), whether the batch is
    varlen, and its number of sequences."""

    pairs: int
    sms: int
    value_dim: int
    tokens: int
    varlen: bool
    sequences: int = 1

    @property
    def programs_64(self) -> int:  # sweep programs at 64 value columns each
        return self.pairs * triton_cdiv(self.value_dim, 64)

    @property
    def mean_tokens(self) -> float:  # expanded tokens per sequence
        return self.tokens / max(self.sequences, 1) if self.varlen else self.tokens


DELTA_LAUNCH: list[tuple[Callable[[LaunchShape], bool], Launch]] = [
    (lambda s: s.programs_64 > s.sms and s.mean_tokens >= 2048,
     Launch(128, 8, 3, 4, "more 64-column programs than SMs, long sequences: 128 columns on two warpgroups, "
                          "three stages, output tiles by bulk tensor stores", tma_store=True)),
    (lambda s: s.programs_64 > s.sms,
     Launch(128, 8, 3, 4, "more 64-column programs than SMs: 128 columns on two warpgroups, three stages "
                          "(one program per SM; q, k, wy, aqk tiles shared by both)")),
    (lambda s: not s.varlen and s.tokens >= 32768 and 3 * s.programs_64 >= s.sms and 2 * s.programs_64 <= s.sms,
     Launch(64, 4, 3, 4, "a third to half of the SMs in 64-column programs over a long dense sequence: one pass "
                         "in 8 phases (each phase's prep beside the previous phase's sweep), three stages, V as a "
                         "product operand, output tiles by bulk tensor stores", tma_store=True, phases=8)),
    (lambda s: not s.varlen and s.tokens >= 16384 and 3 * s.programs_64 >= s.sms and 2 * s.programs_64 <= s.sms,
     Launch(64, 4, 3, 4, "a third to half of the SMs in 64-column programs over a dense sequence of 16k-32k "
                         "tokens: one pass in 6 phases, three stages, V as a product operand, bulk stores",
                         tma_store=True, phases=6)),
    (lambda s: not s.varlen and s.tokens >= 16384 and 3 * s.programs_64 >= s.sms,
     Launch(64, 4, 3, 4, "half the SMs or more in 64-column programs over a long dense sequence: one pass, "
                         "three stages, V as a product operand, output tiles by bulk tensor stores", tma_store=True)),
    (lambda s: not s.varlen and s.tokens >= 16384,
     Launch(64, 4, 3, 4, "few pairs over a long dense sequence: 3 segments at BV 64, three stages, V as a product "
                         "operand, output tiles by bulk tensor stores", segments=3, tma_store=True)),
    (lambda s: 2 * s.programs_64 >= s.sms,
     Launch(64, 4, 3, 4, "at most one 64-column program per SM: three stages, V as a product operand")),
    (lambda s: 2 * s.pairs * triton_cdiv(s.value_dim, 32) >= s.sms,
     Launch(32, 4, 2, 4, "few (sequence, head) pairs: 32-column blocks double the programs", v_product=False)),
    (lambda s: True,
     Launch(16, 4, 2, 4, "very few pairs: 16-column blocks for the most programs", v_product=False)),
]


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def delta_launch(problem, device: torch.device) -> Launch:
    shape = LaunchShape(pairs=problem.sequences * problem.value_heads, sms=sm_count(device),
                        value_dim=problem.value_dim, tokens=problem.tokens * problem.householder,
                        varlen=problem.varlen, sequences=problem.sequences)
    for applies, launch in DELTA_LAUNCH:
        if applies(shape):
            return launch
    raise AssertionError("the last launch row always applies")


def plan(family: str, problem, device: torch.device, algorithm: str = "chunked",
         backend: str | None = None) -> Schedule:
    """Pick the backend and launch shape for ``problem`` of ``family`` on ``device``.

    ``algorithm`` is "chunked" for prefill/training ops and "recurrent" for the token-by-token
    (decode) ops, whose per-token order of operations the chunked form would not reproduce.
    ``backend`` forces "torch" or "triton" (e.g. the Triton kernels on CPU tensors under
    ``TRITON_INTERPRET=1``); None lets the rules decide.
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS} or None, got {backend!r}")
    if backend == "torch":
        return Schedule("torch", algorithm, CHUNK_SIZE, "backend='torch' was asked for")
    if backend == "triton":
        if family != "delta_rule" or algorithm != "chunked":
            raise ValueError(f"backend='triton': no Triton kernel for {family} ({algorithm}) yet")
        why = triton_delta_unsupported(problem)
        if why is not None:
            raise ValueError(f"backend='triton': {why}")
        check_triton_device(device)
        return Schedule("triton", algorithm, CHUNK_SIZE, "backend='triton' was asked for",
                        delta_launch(problem, device))
    for rule in RULES:
        if rule.applies(family, problem, device, algorithm):
            launch = delta_launch(problem, device) if rule.backend == "triton" and family == "delta_rule" else None
            return Schedule(backend=rule.backend, algorithm=algorithm, chunk_size=CHUNK_SIZE, reason=rule.reason,
                            launch=launch)
    raise AssertionError("the last rule always applies")
