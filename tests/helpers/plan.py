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


def grads_serial_and_corun(monkeypatch, op, inputs, cotangent) -> dict:
    """``{corun: (gradients of op(*inputs)[0] for cotangent(o), the backward launches' corun)}`` for
    corun False and True (the recompute after the reverse sweep, or beside it: forced, the
    signature caches cleared for each)."""
    import torch

    from recurscan.launch.delta_backward import BACKWARD_LAUNCHES
    from recurscan.runtime.cache import clear_caches
    out = {}
    for corun in (False, True):
        clear_caches()
        force_backward_shape(monkeypatch, corun=corun)
        leaves = [t.clone().requires_grad_() for t in inputs]
        o = op(*leaves)[0]
        grads = torch.autograd.grad(o, leaves, cotangent(o))
        (launches,) = BACKWARD_LAUNCHES.values()
        out[corun] = (grads, launches.corun)
    return out
