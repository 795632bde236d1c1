"""The prep (WY) kernel's variants on the H200: warps per program and the inverse's operand type
(tf32, or fp16: the same 10-bit mantissa, a narrower range), timed alone and with the sweep under
CUDA-graph replay, and their accuracy against the float64 oracle with strongly correlated keys
(the hard case for the triangular inverse).

    python -m benchmarks.gpu_prep_variants --out benchmarks/results/gpu_prep_variants.json
    python -m benchmarks.gpu_prep_variants --variant 4:1 --variant 4:0 --workload gdn_b1_t16384_h16_hv32
    python -m benchmarks.gpu_prep_variants --variant 4:1 --no-accuracy --workload gdp_m2_b4_t4096_h16

A variant is ``warps:fp16[:maxnreg]`` (fp16 0 or 1; maxnreg a register cap on the prep, which
sets how many of its programs share a multiprocessor). The JSON records the commit (RECURSCAN_COMMIT), so two
commits can be compared by running this in both checkouts within one session on the GPU.
"""
from __future__ import annotations

import argparse
import json

import torch

from . import runner
from .gpu_chunk_delta import kernel_inputs

VARIANTS = [dict(prep_warps=4, inverse_fp16=False), dict(prep_warps=8, inverse_fp16=False),
            dict(prep_warps=4, inverse_fp16=True), dict(prep_warps=8, inverse_fp16=True)]
WORKLOADS = ["gdn_b1_t16384_h16_hv32", "gdn_b4_t8192_h16_hv64"]


def parse_variant(text):
    """``warps:fp16[:maxnreg]`` (maxnreg 0 or absent: no register cap)."""
    warps, fp16, maxnreg = (tuple(int(x) for x in text.split(":")) + (0,))[:3]
    return dict(prep_warps=warps, inverse_fp16=bool(fp16), prep_maxnreg=maxnreg or None)


def timing(names, rep_ms, variants=VARIANTS):
    import triton.testing as tt
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem

    from .delta_variants import variant_fwd
    rows = []
    for name in names:
        (q, k, v, g, beta), M, cu, extra = kernel_inputs(name)
        L = delta_shape(delta_problem(q, k, v, g, beta, num_householder=M, cu_seqlens=cu), torch.device("cuda"))
        for var in variants:
            for stage in ("prep", "both"):
                def run():
                    return variant_fwd(q, k, v, g, beta, num_householder=M, use_qk_l2norm_in_kernel=True,
                                       output_final_state=True, block_v=L.block_v, num_warps=L.num_warps,
                                       num_stages=L.num_stages, segments=L.segments, v_product=L.v_product,
                                       tma_store=L.tma_store,
                                       stage=stage, **extra, **var)
                with torch.no_grad():
                    run()
                    ms = tt.do_bench_cudagraph(run, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
                row = dict(workload=name, stage=stage, **var, median_ms=ms[0], p20_ms=ms[1], p80_ms=ms[2])
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def accuracy(variants=VARIANTS):
    from recurscan.reference.delta import gated_delta_rule_chunked

    from .delta_variants import variant_fwd
    T, H, HV, K, V = 4096, 16, 32, 128, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    rn = lambda *s: torch.randn(*s, generator=gen, device="cuda")  # noqa: E731
    q, v = rn(1, T, H, K), rn(1, T, HV, V)
    k = rn(1, T, H, K) + 1.5 * rn(1, 1, H, K)  # keys of a head share a direction: WY systems far from I
    g = torch.nn.functional.logsigmoid(rn(1, T, HV) + 4.0)
    beta = torch.sigmoid(rn(1, T, HV) + 2.0)
    q, k, v, beta = (t.bfloat16() for t in (q, k, v, beta))
    want_o, want_s = gated_delta_rule_chunked(q.double(), k.double(), v.double(), g.double(), beta.double(),
                                              initial_state=torch.zeros(1, HV, K, V, dtype=torch.float64,
                                                                        device="cuda"),
                                              use_qk_l2norm_in_kernel=True)
    rows = []
    for var in variants:
        with torch.no_grad():
            o, s = variant_fwd(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True,
                               block_v=32, **var)
        rel = lambda a, b: ((a.double() - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()  # noqa: E731
        row = dict(**var, o_rel_rms=rel(o, want_o), state_rel_rms=rel(s, want_s),
                   o_max_abs_err=(o.double() - want_o).abs().max().item(), finite=bool(torch.isfinite(o).all()))
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_prep_variants")
    ap.add_argument("--out", default="benchmarks/results/gpu_prep_variants.json")
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--variant", action="append", help="warps:fp16 (repeatable)")
    ap.add_argument("--workload", action="append")
    ap.add_argument("--no-accuracy", action="store_true", help="timing only")
    args = ap.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant] if args.variant else VARIANTS
    res = {"environment": runner.environment(torch.device("cuda")),
           "accuracy_bf16_correlated_T4096": [] if args.no_accuracy else accuracy(variants),
           "timing": timing(args.workload or WORKLOADS, args.rep_ms, variants)}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
