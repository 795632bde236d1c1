"""The GPU's clocks and power while issue 21's B1 rows run (any card): the prep alone, the sweep alone
and the planned (chained) row, each replayed from a CUDA graph for a few seconds while ``nvidia-smi``
samples the SM clock, the memory clock, the power draw, the temperature and the active clock-event
(throttle) reasons.

Why: on the GPU's clock the chained row's prep runs ~9% slower beside the sweep than its share of
the SMs says (docs/kernels-chunk-delta.md, Schedules, "Chained": 440 us on 68 SMs against 405 from
its SM-time alone). If the SM clock falls when both run (a power or thermal cap), no change to
either kernel's schedule takes that back, and the prep's arithmetic is what to cut; if it does not,
they contend for something on the chip (memory, L2), which the kernels' bytes decide. ``--train``
adds issue 19's forward + backward steps (eager), to see whether training runs at the cap too.

    python -m benchmarks.gpu_clocks --out benchmarks/results/gpu_clocks.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import time

import torch

from . import runner
from .gpu_chunk_delta import kernel_inputs

WORKLOADS = ("gdn_b1_t16384_h16_hv32", "gdn_b1_t65536_h16_hv32")
FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")


def reasons_field() -> str:
    """The clock-event reasons' query name this nvidia-smi takes (renamed from the throttle reasons)."""
    for name in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        if subprocess.run(["nvidia-smi", f"--query-gpu={name}", "--format=csv,noheader"],
                          capture_output=True).returncode == 0:
            return name
    return ""


def sampled(run, seconds: float, interval_ms: int = 50) -> tuple[list[list[str]], int]:
    """nvidia-smi's samples (one list of FIELDS, then the reasons, per sample) while ``run()`` is called
    again and again for ``seconds``, and the number of calls (each synchronised at the end only)."""
    reasons = reasons_field()
    query = ",".join(FIELDS + ((reasons,) if reasons else ()))
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits",
                            "-lms", str(interval_ms)], stdout=subprocess.PIPE, text=True)
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        run()
        calls += 1
        if calls % 16 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    smi.terminate()
    out, _ = smi.communicate()
    rows = [[x.strip() for x in line.split(",")] for line in out.splitlines() if line.strip()]
    return rows, calls


def summary(rows: list[list[str]]) -> dict:
    """Medians and extremes of the samples, the first and last fifth dropped (ramp up, drain)."""
    n = len(rows)
    body = rows[n // 5: n - n // 5] or rows

    def column(i):
        values = []
        for r in body:
            try:
                values.append(float(r[i]))
            except (ValueError, IndexError):
                pass
        return values
    sm, mem, power, temp = (column(i) for i in range(4))
    return dict(samples=len(body), sm_clock_mhz_median=statistics.median(sm) if sm else None,
                sm_clock_mhz_min=min(sm) if sm else None, mem_clock_mhz_median=statistics.median(mem) if mem else None,
                power_w_median=statistics.median(power) if power else None, power_w_max=max(power) if power else None,
                temperature_c_max=max(temp) if temp else None,
                clock_event_reasons=sorted({r[4] for r in body if len(r) > 4}))


def forms(name):
    """(form, launches, inputs) for the prep alone, the sweep alone (one pass each, unchained) and the
    planned row."""
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem

    from .delta_variants import variant_launches
    (q, k, v, g, beta), M, cu, kw = kernel_inputs(name)
    planned = delta_shape(delta_problem(q, k, v, g, beta, num_householder=M, cu_seqlens=cu), torch.device("cuda"))
    inputs = (q, k, v, g, beta, None, None, None, kw.get("cu_seqlens"), kw.get("chunk_indices_dp"), None)
    common = dict(num_householder=M, use_qk_l2norm_in_kernel=True, output_final_state=True, **kw)
    one_pass = dataclasses.replace(planned, phases=1, chained=False)
    return [("prep alone", variant_launches(q, k, v, g, beta, shape=one_pass, stage="prep", **common), inputs),
            ("sweep alone", variant_launches(q, k, v, g, beta, shape=one_pass, stage="sweep", **common), inputs),
            ("planned", variant_launches(q, k, v, g, beta, shape=planned, **common), inputs)]


def timed(workload: str, form: str, run, seconds: float, per_run: int = 1) -> dict:
    """A row: ``run()`` (``per_run`` calls of the form) again and again for ``seconds`` while sampled."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    samples, calls = sampled(run, seconds)
    end.record()
    torch.cuda.synchronize()
    row = dict(workload=workload, form=form, ms_per_call=start.elapsed_time(end) / (calls * per_run),
               **summary(samples))
    print(json.dumps(row), flush=True)
    return row


def measure(names, seconds: float, per_graph: int = 8):
    from recurscan.launch.delta import run_delta_launches
    rows = []
    for name in names:
        for form, launches, inputs in forms(name):
            with torch.no_grad():
                for _ in range(3):  # the JIT's call, then direct (programmatic) launches
                    run_delta_launches(launches, inputs)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(per_graph):
                        run_delta_launches(launches, inputs)
                graph.replay()
                torch.cuda.synchronize()
                rows.append(timed(name, form, graph.replay, seconds, per_graph))
    return rows


#: Issue 19's training rows (``--train``): forward + backward through the op, eager.
TRAIN_WORKLOADS = ("gdn_b4_t4096_h16", "gdn_b1_t16384_h16_hv32")


def measure_training(names, seconds: float):
    """Forward + backward steps (benchmarks/gpu_delta_train.py's, eager: the host keeps ahead of the
    GPU at these sizes) run back to back while sampled."""
    from benchmarks import registry
    from benchmarks.gpu_delta_train import step_calls
    rows = []
    for name in names:
        fwd_bwd = step_calls(registry.get(name))[0]
        for _ in range(3):  # compiles, then direct launches
            fwd_bwd()
        torch.cuda.synchronize()
        rows.append(timed(name, "forward + backward", fwd_bwd, seconds))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_clocks")
    ap.add_argument("--out", default="benchmarks/results/gpu_clocks.json")
    ap.add_argument("--seconds", type=float, default=3.0, help="how long each form runs while sampled")
    ap.add_argument("--workload", action="append", help="a workload of WORKLOADS (default: both)")
    ap.add_argument("--train", action="store_true", help="also issue 19's training rows (TRAIN_WORKLOADS)")
    args = ap.parse_args(argv)
    rows = measure(tuple(args.workload or WORKLOADS), args.seconds)
    if args.train:
        rows += measure_training(TRAIN_WORKLOADS, args.seconds)
    res = {"environment": runner.environment(torch.device("cuda")), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
