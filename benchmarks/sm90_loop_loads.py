"""Which loads inside a kernel's loops Triton's software pipeliner left synchronous, from the TTGIR
compiled for sm_90 with no GPU (tests/helpers/sm90.py builds the launches as the launch layer
does: bf16, K = V = 128).

A load the pipeliner stages becomes an asynchronous copy issued stages ahead; one it leaves is a
global latency on every iteration, and on a sweep's chunk chain that is the chain's time. Triton
3.6 leaves a load read in both branches of an ``if`` (the calm tests) and a load that feeds no
product (the re-loads that keep a pipelined operand to one use; docs/kernels-delta-backward.md).
Until 86febb9 the GLA reverse sweep on the group prep's gates lost its key and score tiles that
way (887 us after against 1079 before at SSD B1 T16384), and until 492e11a the GLA dg launch its
per-head re-loads (now loaded a head ahead by hand: 1234 us against 1420). Not every one costs:
staging the SSD forward sweep's V^T and the delta dq/dk's S . dS loads measured slower
(docs/perf-history.md, 2026-12-04). The forward sweep's calm gates still have some
(docs/kernels-gla-plan.md).

    python -m benchmarks.sm90_loop_loads delta-backward | ssd-forward | gla-backward
"""
from __future__ import annotations

import re
import sys

from tests.helpers import sm90


def loop_loads(ttgir: str) -> list[str]:
    """The ``tt.load`` operations nested in an ``scf.for`` (by indentation), shortened."""
    found, loops = [], []
    for line in ttgir.splitlines():
        indent = len(line) - len(line.lstrip())
        while loops and indent <= loops[-1]:
            loops.pop()
        if "= scf.for" in line:
            loops.append(indent)
        elif " = tt.load" in line and loops:
            found.append(re.sub(r"\s*loc\(.*", "", line.strip())[:110])
    return found


def report(step, names, values, describe=None) -> str:
    """tests/helpers/sm90.compiled_line's stand-in: one line per launch, its loops' synchronous loads
    under it."""
    compiled = sm90.compile_for_sm90(step, names, values)
    name = getattr(step.kernel, "fn", step.kernel).__name__
    flags = ", ".join(f"{k}={step.kwargs[k]}" for k in ("PART", "SIDE", "REPLAY", "GATE_SCORES", "CALM_GATES")
                      if step.kwargs.get(k) not in (None, False, 0))
    ir = compiled.asm["ttgir"]
    loads = loop_loads(ir)
    print(f"{name} [{flags}]: {ir.count('async_copy_global_to_local')} asynchronous copies, "
          f"{len(loads)} loads in loops left synchronous")
    for load in loads:
        print("    " + load)
    return name


def main(what: str) -> None:
    sm90.compiled_line = report
    if what == "delta-backward":
        for case in sm90.CASES:
            sm90.compile_case(case, "planned row 0")
    elif what == "ssd-forward":
        for shape in ("group prep", "group prep, calm gates", "one pass"):
            print(f"-- {shape}")
            sm90.compile_ssd_benchmark(sm90.SWEEP_SHAPES[shape])
    elif what == "gla-backward":
        sm90.compile_gla_backward("GDN dense, H = HV", on_sweep=True, group_prep=True, group_grads=True,
                                  grads_sides=True)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
