"""The phased rows of issue 21 at other phase counts and ratios (graph replay), each against the
planned shape in the same process, with the outputs' bits compared (phases change the schedule, not
the arithmetic: every count gives the single pass's bits).

Why: the counts (6 phases at T16384, 8 at T65536) were chosen for the Triton sweep and the ratio
(0.8) for the Gluon twin; the warp-specialised sweep planned since has a shorter chain step, so the
preps beside it have less time and each phase boundary costs a larger share.

    python -m benchmarks.gpu_phase_counts --out benchmarks/results/gpu_phase_counts.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from . import runner
from .gpu_chunk_delta import kernel_inputs

#: (workload, phase counts, ratios)
GRID = [("gdn_b1_t16384_h16_hv32", (4, 5, 6, 7, 8), (0.75, 0.8, 0.85)),
        ("gdn_b1_t65536_h16_hv32", (6, 8, 10, 12), (0.8, 0.85, 0.9))]


def timing(rep_ms, grid=GRID):
    import triton.testing as tt
    from recurscan.launch.delta import run_delta_launches
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem

    from .delta_variants import variant_launches
    rows = []
    for name, counts, ratios in grid:
        (q, k, v, g, beta), M, cu, kw = kernel_inputs(name)
        planned = delta_shape(delta_problem(q, k, v, g, beta, num_householder=M, cu_seqlens=cu), torch.device("cuda"))
        inputs = (q, k, v, g, beta, None, None, None, kw.get("cu_seqlens"), kw.get("chunk_indices_dp"), None)
        ref = None
        # The phases unchained (the planned row may be chained, which runs no phases).
        shapes = [planned] + [dataclasses.replace(planned, phases=p, phase_ratio=r, chained=False)
                              for p in counts for r in ratios
                              if (p, r) != (planned.phases, planned.phase_ratio) or planned.chained]
        for shape in shapes:
            launches = variant_launches(q, k, v, g, beta, num_householder=M, use_qk_l2norm_in_kernel=True,
                                        output_final_state=True, shape=shape, **kw)
            with torch.no_grad():
                out = [t.clone() for t in run_delta_launches(launches, inputs)]
                ms = tt.do_bench_cudagraph(lambda: run_delta_launches(launches, inputs), rep=rep_ms,
                                           quantiles=[0.5, 0.2, 0.8])
            ref = ref or out
            row = dict(workload=name, phases=shape.phases, phase_ratio=shape.phase_ratio, planned=shape is planned,
                       chained=shape.chained,
                       specialized=shape.specialized, median_ms=ms[0], p20_ms=ms[1], p80_ms=ms[2],
                       same_bits_as_planned=all(torch.equal(a, b) for a, b in zip(out, ref)))
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_phase_counts")
    ap.add_argument("--out", default="benchmarks/results/gpu_phase_counts.json")
    ap.add_argument("--rep-ms", type=int, default=200)
    args = ap.parse_args(argv)
    res = {"environment": runner.environment(torch.device("cuda")), "timing": timing(args.rep_ms)}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
