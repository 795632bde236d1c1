"""How much would running the prep and the sweep at the same time save? An upper bound, measured.

The chunked forward runs the prep (WY) kernel, then the sweep. Both are latency-bound and leave
most of each SM idle, so a sweep that consumed each chunk's WY block as soon as it is written
(ready flags, or blocks of chunks on two streams) would cost less than the sum. Before building
that, this times the two kernels launched on two streams with no dependency at all (the sweep
reads the scratch of an earlier call): the makespan of that is what any dependent overlap could
at best reach, since a dependent one also waits for its inputs.

Per workload, graph replay (``do_bench_cudagraph``) of: prep alone, sweep alone, both in series,
both on two streams with no dependency (each capture order); and eager (``do_bench``, host time
included) of the series and of the two-stream launch with the sweep's stream at high priority
(graph replay ignores stream priorities unless instantiated for them).

    python -m benchmarks.gpu_corun --out benchmarks/results/gpu_corun.json
"""
from __future__ import annotations

import argparse
import json

import torch

from .gpu_chunk_delta import kernel_inputs

WORKLOADS = ["gdn_b1_t16384_h16_hv32", "gdn_b4_t4096_h16", "gdp_m2_b4_t4096_h16", "gdn_b4_t8192_h16_hv64",
             "gdn_varlen16_32976_hv32"]


def stage_plans(name):
    from recurscan.launch.delta import run_delta_launches
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem

    from .delta_variants import variant_launches

    (q, k, v, g, beta), M, cu, kw = kernel_inputs(name)
    L = delta_shape(delta_problem(q, k, v, g, beta, num_householder=M, cu_seqlens=cu), torch.device("cuda"))
    inputs = (q, k, v, g, beta, None, None, None, cu, kw.get("chunk_indices_dp"), None)

    def runner(stage):
        plan = variant_launches(q, k, v, g, beta, num_householder=M, use_qk_l2norm_in_kernel=True,
                                output_final_state=True, block_v=L.block_v, num_warps=L.num_warps,
                                num_stages=L.num_stages, segments=L.segments, v_product=L.v_product,
                                stage=stage, **kw)
        return lambda: run_delta_launches(plan, inputs)
    return runner("prep"), runner("sweep"), runner("both"), L


def main(argv=None):
    import triton.testing as tt
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", action="append")
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    rows = []
    low, high = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-1)
    side = torch.cuda.Stream()
    for name in a.workload or WORKLOADS:
        prep, sweep, both, L = stage_plans(name)

        def corun(first, second, s=side):
            cur = torch.cuda.current_stream()
            s.wait_stream(cur)
            with torch.cuda.stream(s):
                first()
            second()
            cur.wait_stream(s)

        def corun_priority():  # prep on a low-priority stream, the sweep on a high-priority one
            cur = torch.cuda.current_stream()
            low.wait_stream(cur)
            high.wait_stream(cur)
            with torch.cuda.stream(low):
                prep()
            with torch.cuda.stream(high):
                sweep()
            cur.wait_stream(low)
            cur.wait_stream(high)

        cases = {"prep": prep, "sweep": sweep, "series": both,
                 "corun_prep_captured_first": lambda: corun(prep, sweep),
                 "corun_sweep_captured_first": lambda: corun(sweep, prep)}
        row = dict(workload=name, launch=dict(block_v=L.block_v, num_warps=L.num_warps, num_stages=L.num_stages,
                                              segments=L.segments, v_product=L.v_product))
        with torch.no_grad():
            for f in list(cases.values()) + [corun_priority]:
                f()
            torch.cuda.synchronize()
            for case, f in cases.items():
                row["graph_" + case + "_ms"] = tt.do_bench_cudagraph(f, rep=a.rep_ms, return_mode="median")
            for case, f in (("series", both), ("corun_sweep_high_priority", corun_priority)):
                row["eager_" + case + "_ms"] = tt.do_bench(f, rep=a.rep_ms, return_mode="median")
        g = row
        g["graph_best_corun_over_series"] = min(g["graph_corun_prep_captured_first_ms"],
                                                g["graph_corun_sweep_captured_first_ms"]) / g["graph_series_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    if a.out:
        from .runner import save_rows
        save_rows(rows, a.out, torch.device("cuda"))


if __name__ == "__main__":
    main()
