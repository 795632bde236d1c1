"""The chained schedule (DeltaShape.chained) against the planned phases on issue 21's phased rows,
graph replay and eager, in one process, with the outputs' bits compared (the same arithmetic: the
single pass's bits).

Why: the phased rows lose ~0.15 ms to their schedule (the first phase's prep alone on the machine,
each boundary's launch, state reload and ring refill: docs/kernels-chunk-delta.md, "What bounds
the speed"); chained per chunk, the prep runs beside the sweep from the first chunk to the last.

    python -m benchmarks.gpu_chained --out benchmarks/results/gpu_chained.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from . import runner
from .gpu_chunk_delta import kernel_inputs

WORKLOADS = ("gdn_b1_t16384_h16_hv32", "gdn_b1_t65536_h16_hv32", "gdn_b2_t16384_h8_hv16")
#: The forms beside the planned shape, as DeltaShape fields: unchained (the phases) and chained, and
#: chained with the prep capped at 128 registers (four programs an SM instead of three, on the SMs
#: the sweep leaves the prep, which bounds the chained row), and chained with a lead (the first
#: chunks' prep on every SM before the sweep starts: by SM-time ~0.17 at B1 T16384, ~0.15 at T65536).
FORMS = {"chained": dict(chained=True, chained_lead=0.0), "unchained": dict(chained=False),
         "chained, prep at 128 registers": dict(chained=True, chained_lead=0.0, prep_maxnreg=128),
         **{f"chained, lead {x}": dict(chained=True, chained_lead=x) for x in (0.1, 0.15, 0.2, 0.25, 0.3)},
         "chained, lead 0.2, prep at 128 registers": dict(chained=True, chained_lead=0.2, prep_maxnreg=128)}


def timing(rep_ms, workloads=WORKLOADS, forms=tuple(FORMS)):
    import triton.testing as tt
    from recurscan.launch.delta import run_delta_launches
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem

    from .delta_variants import variant_launches
    rows = []
    for name in workloads:
        (q, k, v, g, beta), M, cu, kw = kernel_inputs(name)
        planned = delta_shape(delta_problem(q, k, v, g, beta, num_householder=M, cu_seqlens=cu), torch.device("cuda"))
        inputs = (q, k, v, g, beta, None, None, None, kw.get("cu_seqlens"), kw.get("chunk_indices_dp"), None)
        ref = None
        for form, shape in (("planned", planned),) + tuple((f, dataclasses.replace(planned, **FORMS[f]))
                                                           for f in forms):
            launches = variant_launches(q, k, v, g, beta, num_householder=M, use_qk_l2norm_in_kernel=True,
                                        output_final_state=True, shape=shape, **kw)
            kernels = [getattr(s.kernel, "fn", s.kernel).__name__ for s in launches.steps]
            with torch.no_grad():
                out = [t.clone() for t in run_delta_launches(launches, inputs)]
                graph = tt.do_bench_cudagraph(lambda: run_delta_launches(launches, inputs), rep=rep_ms,
                                              quantiles=[0.5, 0.2, 0.8])
                eager = tt.do_bench(lambda: run_delta_launches(launches, inputs), rep=rep_ms,
                                    quantiles=[0.5, 0.2, 0.8])
                again = [t.clone() for t in run_delta_launches(launches, inputs)]
            ref = ref or out
            row = dict(workload=name, form=form, phases=shape.phases, chained=launches.chained >= 0,
                       prep_maxnreg=shape.prep_maxnreg, chained_lead=shape.chained_lead,
                       kernels=kernels, graph_median_ms=graph[0], graph_p20_ms=graph[1], graph_p80_ms=graph[2],
                       eager_median_ms=eager[0], eager_p20_ms=eager[1], eager_p80_ms=eager[2],
                       same_bits_as_first=all(torch.equal(a, b) for a, b in zip(out, ref)),
                       same_bits_after_replays=all(torch.equal(a, b) for a, b in zip(again, ref)))
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_chained")
    ap.add_argument("--out", default="benchmarks/results/gpu_chained.json")
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--workload", action="append", help="a workload of WORKLOADS (default: all)")
    ap.add_argument("--form", action="append", help="a form of FORMS (default: all)")
    args = ap.parse_args(argv)
    res = {"environment": runner.environment(torch.device("cuda")),
           "timing": timing(args.rep_ms, tuple(args.workload or WORKLOADS), tuple(args.form or FORMS))}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
