"""What the planner decided for the calls of a block of code, as data (recurscan.plan.Schedule)."""
from __future__ import annotations

import contextlib
from typing import NamedTuple

from .. import plan as _plan
from ..runtime.cache import clear_caches


class Recorded(NamedTuple):
    """One planned call: its family, its validated problem and the schedule the planner chose."""

    family: str
    problem: object
    schedule: _plan.Schedule

    def __str__(self) -> str:
        p = self.problem
        sizes = ", ".join(f"{name} {getattr(p, name)}" for name in ("batch", "tokens", "heads", "value_heads",
                                                                     "key_dim", "value_dim", "sequences")
                          if hasattr(p, name))
        return f"{self.family} ({sizes}): {self.schedule.describe()}"


@contextlib.contextmanager
def record_schedules():
    """Record every schedule the planner chooses inside the block: a list of :class:`Recorded`
    (family, problem, :class:`recurscan.plan.Schedule`), each printable. The ops keep a call
    signature's plan, so the signature caches are cleared on entry: each signature the block calls
    is planned, and recorded, once.

    Example:
        >>> import torch, recurscan
        >>> q, k, v = torch.randn(1, 100, 2, 16), torch.randn(1, 100, 2, 16), torch.randn(1, 100, 2, 16)
        >>> with recurscan.record_schedules() as log:
        ...     _ = recurscan.chunk_gated_delta_rule(q, k, v, -torch.rand(1, 100, 2), torch.rand(1, 100, 2))
        >>> [(r.family, r.schedule.backend, r.schedule.algorithm) for r in log]
        [('delta_rule', 'torch', 'chunked')]
        >>> print(log[0].schedule.describe())
        chunked on torch, chunks of 64: a CPU tensor runs the PyTorch oracle
    """
    if _plan.RECORDER is not None:
        raise RuntimeError("record_schedules: already recording (the blocks do not nest)")
    log: list = []
    clear_caches()
    _plan.RECORDER = log
    recorded: list = []
    try:
        yield recorded
    finally:
        _plan.RECORDER = None
        recorded.extend(Recorded(*entry) for entry in log)
