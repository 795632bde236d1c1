"""What the query's part of the delta-rule prep costs (issue 21): the prep alone as planned (QUERY 2),
with QUERY 1 (the q tile loaded for its norms alone: no Q K^T, no aqk stored) and with QUERY 0 (no q
tile, no Q Q^T for its norms: the lam rq column takes the scale alone), under graph replay, as each
workload's planned shape launches it in one launch over every chunk (phases off; where the fused
prefill is planned, HV64, the prep of the row's unfused form).

Why: the B1 rows are bound by the prep's SM-time (docs/kernels-chunk-delta.md, "What bounds the
speed": the targets need it cut by about a third). The warp-specialised sweep's outputs warpgroups
already form a chunk's scores from the ring's q and k tiles for simple GLA (SWEEP_SCORES); doing so
for the delta rule would take the query's part out of the prep. This measures that part. QUERY
below 2 writes no aqk, so its outputs are not the op's: a timing, not a form (what was measured, and
the form built from it: docs/perf-history.md, 2026-12-07).

    python -m benchmarks.gpu_prep_query_share --out benchmarks/results/gpu_prep_query_share.json

``--rows`` times the B1 rows whole instead (graph replay, the planned shape and other phase counts
and ratios, each with the prep at QUERY 2, 1 and 0), and their sweep alone in one pass: how far the
row would fall with the query's part out of the prep and costing nothing elsewhere (an upper bound
on what moving it can gain).
"""
from __future__ import annotations

import argparse
import json

import torch

from . import runner
from .gpu_chunk_delta import kernel_inputs

WORKLOADS = ["gdn_b1_t16384_h16_hv32", "gdn_b1_t65536_h16_hv32", "gdn_b4_t8192_h16_hv64", "gdn_b4_t4096_h16"]


def timing(names, rep_ms):
    import dataclasses

    import triton.testing as tt
    from recurscan.launch.delta import run_delta_launches
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem

    from .delta_variants import variant_launches, with_constants
    rows = []
    for name in names:
        (q, k, v, g, beta), M, cu, kw = kernel_inputs(name)
        L = delta_shape(delta_problem(q, k, v, g, beta, num_householder=M, cu_seqlens=cu), torch.device("cuda"))
        # The prep alone as the planner's shape launches it (one launch over every chunk: phases 1).
        prep = variant_launches(q, k, v, g, beta, num_householder=M, use_qk_l2norm_in_kernel=True,
                                output_final_state=True, shape=dataclasses.replace(L, phases=1, fused=False), stage="prep", **kw)
        inputs = (q, k, v, g, beta, None, None, None, kw.get("cu_seqlens"), kw.get("chunk_indices_dp"), None)
        for form, launches in (("planned", prep), ("q norms only", with_constants(prep, "prep", QUERY=1)),
                               ("no query", with_constants(prep, "prep", QUERY=0))):
            with torch.no_grad():
                run_delta_launches(launches, inputs)
                ms = tt.do_bench_cudagraph(lambda: run_delta_launches(launches, inputs), rep=rep_ms,
                                           quantiles=[0.5, 0.2, 0.8])
            row = dict(workload=name, form=form, prep_maxnreg=L.prep_maxnreg, median_ms=ms[0], p20_ms=ms[1],
                       p80_ms=ms[2])
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


#: (workload, (phases, ratio) shapes beside the planned one) for ``--rows``
ROW_SHAPES = [("gdn_b1_t16384_h16_hv32", [(4, 0.85), (6, 1.0)]),
              ("gdn_b1_t65536_h16_hv32", [(6, 0.9)])]


def row_timing(rep_ms, grid=ROW_SHAPES):
    import dataclasses

    import triton.testing as tt
    from recurscan.launch.delta import run_delta_launches
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem

    from .delta_variants import only_stage, variant_launches, with_constants
    rows = []
    for name, others in grid:
        (q, k, v, g, beta), M, cu, kw = kernel_inputs(name)
        planned = delta_shape(delta_problem(q, k, v, g, beta, num_householder=M, cu_seqlens=cu), torch.device("cuda"))
        inputs = (q, k, v, g, beta, None, None, None, kw.get("cu_seqlens"), kw.get("chunk_indices_dp"), None)
        one_pass = variant_launches(q, k, v, g, beta, num_householder=M, use_qk_l2norm_in_kernel=True,
                                    output_final_state=True, shape=dataclasses.replace(planned, phases=1, chained=False),
                                    **kw)
        forms = [("sweep alone, one pass", 1, None, only_stage(one_pass, "sweep"))]
        for phases, ratio in [(planned.phases, planned.phase_ratio)] + others:
            launches = variant_launches(q, k, v, g, beta, num_householder=M, use_qk_l2norm_in_kernel=True,
                                        output_final_state=True,
                                        shape=dataclasses.replace(planned, phases=phases, phase_ratio=ratio,
                                                                  chained=False), **kw)
            for query in (2, 1, 0):
                forms.append((f"QUERY {query}", phases, ratio,
                              launches if query == 2 else with_constants(launches, "prep", QUERY=query)))
        for form, phases, ratio, launches in forms:
            with torch.no_grad():
                run_delta_launches(launches, inputs)
                run_delta_launches(launches, inputs)  # the second run launches directly (programmatic dependents)
                ms = tt.do_bench_cudagraph(lambda: run_delta_launches(launches, inputs), rep=rep_ms,
                                           quantiles=[0.5, 0.2, 0.8])
            row = dict(workload=name, form=form, phases=phases, phase_ratio=ratio, specialized=planned.specialized,
                       planned=not planned.chained and (phases, ratio) == (planned.phases, planned.phase_ratio),
                       median_ms=ms[0],
                       p20_ms=ms[1], p80_ms=ms[2])
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_prep_query_share")
    ap.add_argument("--out", default="benchmarks/results/gpu_prep_query_share.json")
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--workload", action="append")
    ap.add_argument("--rows", action="store_true", help="the B1 rows whole, with the prep at each QUERY")
    args = ap.parse_args(argv)
    if args.rows:
        rows = row_timing(args.rep_ms, [r for r in ROW_SHAPES if not args.workload or r[0] in args.workload])
    else:
        rows = timing(args.workload or WORKLOADS, args.rep_ms)
    res = {"environment": runner.environment(torch.device("cuda")), "timing": rows}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
