"""Varlen GDN prefill with few (sequence, value head) pairs, each sequence cut into P segments of
its own length (DeltaShape.segments on varlen input, kernels/delta/sweep.py) against the single
pass (P = 1: the launch table's first row without segments; P > 1: BV 64, bulk stores); a dense
batch of the same sequences beside (the planner's dense rows). CUDA-graph replay (device time)
and eager (L2 flushed), inference, bf16, l2norm in the kernel, descriptors built once outside
timing.

    PYTHONPATH=$PWD python benchmarks/gpu_varlen_segments.py --out benchmarks/results/gpu_varlen_segments.json
"""
from __future__ import annotations

import argparse
import dataclasses

import torch
import triton.testing as tt

import recurscan
from benchmarks import runner
import recurscan.plan as plan
from recurscan.runtime.cache import clear_caches

#: (sequences, tokens each, q/k heads, value heads)
WORKLOADS = [(2, 16384, 8, 8), (2, 32768, 8, 8), (4, 8192, 4, 4)]
SEGMENTS = [1, 2, 3, 4, 6]
FEW_PAIRS = plan.DeltaShape(64, 4, 3, 4, "benchmark: the dense few-pairs row's shape", tma_store=True)


def inputs(N, L, H, HV, K=128):
    gen = torch.Generator(device="cuda").manual_seed(0)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    T = N * L
    return dict(q=rn(1, T, H, K).bfloat16(), k=rn(1, T, H, K).bfloat16(), v=rn(1, T, HV, K).bfloat16(),
                g=torch.nn.functional.logsigmoid(rn(1, T, HV) + 4), beta=torch.rand(1, T, HV, device="cuda").bfloat16(),
                cu=torch.arange(N + 1, device="cuda", dtype=torch.int32) * L)


def one_pass(problem, device):
    """The launch table's first row without segments that holds for ``problem``."""
    sizes = plan.DeltaSizes(pairs=problem.sequences * problem.value_heads, sms=plan.sm_count(device),
                            value_dim=problem.value_dim, tokens=problem.tokens * problem.householder,
                            varlen=problem.varlen, sequences=problem.sequences)
    return next(shape for applies, shape in plan.DELTA_LAUNCH if applies(sizes) and shape.segments == 1)


def timed(call):
    with torch.inference_mode():
        out = call()
        torch.cuda.synchronize()
        return (out, tt.do_bench_cudagraph(call, rep=200, return_mode="median"),
                tt.do_bench(call, rep=200, return_mode="median"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--dense-segments", type=int, action="append", default=[],
                    help="the dense batch again in P segments at BV 64 (repeatable)")
    ap.add_argument("--skip-varlen", action="store_true", help="the dense rows alone")
    args = ap.parse_args()
    planned = plan.delta_shape  # the name the planner calls
    rows = []
    for N, L, H, HV in WORKLOADS:
        x = inputs(N, L, H, HV)
        d = recurscan.build_chunk_descriptors(x["cu"], 1, device="cuda")
        name = f"gdn_varlen{N}x{L}_h{H}_hv{HV}"
        base = None
        for P in [] if args.skip_varlen else SEGMENTS:
            # P = 1: the table's first row without segments; P > 1: BV 64, bulk stores, in P segments.
            plan.delta_shape = (lambda problem, device: one_pass(problem, device)) if P == 1 else (
                lambda problem, device, P=P: dataclasses.replace(FEW_PAIRS, segments=P))
            clear_caches()
            call = lambda: recurscan.chunk_gated_delta_rule(  # noqa: E731
                x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=x["cu"], chunk_indices=d.chunk_indices,
                chunk_offsets=d.chunk_offsets, use_qk_l2norm_in_kernel=True, output_final_state=True)
            (o, S), graph_ms, eager_ms = timed(call)
            base = base if base is not None else (o.float(), S)
            diff = max((o.float() - base[0]).abs().max().item(), (S - base[1]).abs().max().item())
            rows.append(dict(workload=name, segments=P, graph_ms=graph_ms, eager_ms=eager_ms,
                             max_abs_difference_vs_one_pass=diff))
            print(f"{name:<28} segments {P}: graph {graph_ms:.3f} ms, eager {eager_ms:.3f} ms, "
                  f"max |difference| against one pass {diff:.1e}", flush=True)
        plan.delta_shape = planned
        clear_caches()
        dense = {k_: x[k_].view(N, L, *x[k_].shape[2:]) for k_ in ("q", "k", "v", "g", "beta")}
        call = lambda: recurscan.chunk_gated_delta_rule(  # noqa: E731
            *dense.values(), use_qk_l2norm_in_kernel=True, output_final_state=True)
        _, graph_ms, eager_ms = timed(call)
        shape = planned(type("P", (), dict(sequences=N, value_heads=HV, value_dim=128, tokens=L, householder=1,
                                           varlen=False))(), torch.device("cuda"))
        rows.append(dict(workload=name.replace("varlen", "dense"), segments=shape.segments, phases=shape.phases,
                         graph_ms=graph_ms, eager_ms=eager_ms))
        print(f"{name.replace('varlen', 'dense'):<28} planned ({shape.segments} segments, {shape.phases} phases): "
              f"graph {graph_ms:.3f} ms, eager {eager_ms:.3f} ms", flush=True)
        for P in args.dense_segments:
            plan.delta_shape = lambda problem, device, P=P: dataclasses.replace(FEW_PAIRS, segments=P)
            clear_caches()
            _, graph_ms, eager_ms = timed(call)
            rows.append(dict(workload=name.replace("varlen", "dense"), segments=P, phases=1, graph_ms=graph_ms,
                             eager_ms=eager_ms))
            print(f"{name.replace('varlen', 'dense'):<28} {P} segments at BV 64: graph {graph_ms:.3f} ms, "
                  f"eager {eager_ms:.3f} ms", flush=True)
        plan.delta_shape = planned
    if args.out:
        runner.save_rows(rows, args.out, torch.device("cuda"))


if __name__ == "__main__":
    main()
