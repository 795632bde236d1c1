"""The planner forced in a test: the backward's launch shape with some fields replaced."""
from __future__ import annotations

import dataclasses

from recurscan.plan import delta as plan_delta

#: The planner's own rule, taken before any test patches it.
PLANNED_BACKWARD_SHAPE = plan_delta.delta_backward_shape


def force_backward_shape(monkeypatch, **fields) -> None:
    """Every problem's backward launch shape is the planner's with ``fields`` replaced
    (``plan.delta.delta_backward_shape`` patched for the test); clear the signature caches after
    it so that launches already built are planned again."""
    monkeypatch.setattr(plan_delta, "delta_backward_shape",
                        lambda *a: dataclasses.replace(PLANNED_BACKWARD_SHAPE(*a), **fields))
