"""The planner: from a validated problem and a device, a Schedule (data, never a launch).

The rules are a table read top to bottom; the first rule whose condition holds decides. Each row
says why. Later issues add the Triton rows (chunked prefill, streaming decode) above the
fallback; the planner never launches anything and never autotunes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .reference.common import CHUNK_SIZE


@dataclass(frozen=True)
class Schedule:
    backend: str  # "torch": the oracle's chunked form in PyTorch; "triton": the GPU kernels
    algorithm: str  # "chunked" or "recurrent"
    chunk_size: int
    reason: str


@dataclass(frozen=True)
class Rule:
    reason: str
    applies: Callable[[str, object, torch.device], bool]
    backend: str


RULES: list[Rule] = [
    Rule("a CPU tensor runs the PyTorch oracle's chunked form",
         lambda family, problem, device: device.type == "cpu", "torch"),
    Rule("no Triton kernel for this family on this device yet: the PyTorch form runs there too",
         lambda family, problem, device: True, "torch"),
]


def plan(family: str, problem, device: torch.device, algorithm: str = "chunked") -> Schedule:
    """Pick the backend and launch shape for ``problem`` of ``family`` on ``device``.

    ``algorithm`` is "chunked" for prefill/training ops and "recurrent" for the token-by-token
    (decode) ops, whose per-token order of operations the chunked form would not reproduce.
    """
    for rule in RULES:
        if rule.applies(family, problem, device):
            return Schedule(backend=rule.backend, algorithm=algorithm, chunk_size=CHUNK_SIZE, reason=rule.reason)
    raise AssertionError("the last rule always applies")
