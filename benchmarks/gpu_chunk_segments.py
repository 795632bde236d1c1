"""The segment-parallel sweep of the chunked delta-rule kernels on the GPU: segments x BV.

    python -m benchmarks.gpu_chunk_segments --out benchmarks/results/gpu_chunk_segments.json

For each workload (bf16, K = V = 128, L2 norm in the kernel, float32 final state) it times
``recurscan.launch.delta.chunk_delta_fwd`` (prep + sweep; with segments P > 1 the sweep is
pass 1 + fix-up + pass 2) at ``segments`` in {1, 2, 3, 4, 8} and several value blocks BV, by
CUDA-graph replay (``triton.testing.do_bench_cudagraph``, median), plus the prep kernel alone once per
workload (so sweep = total - prep). Every variant's output and final state are compared with the
P = 1 run at the planner's launch (relative RMS; P = 1 at the planner's launch is what the GPU
tests hold to the float64 oracle). GDP runs as a dense batch ``[B, T*M, ...]`` here (the kernels
take it; the public GDP op is varlen-only, where segments are not used yet).

Nothing but the repository and the machine's torch/triton is imported. Each variant is wrapped:
an exception is recorded in its row; if the CUDA context is lost afterwards the run stops, and
the JSON (written after every row, to ``--out`` and to ``$OUT/`` when set) keeps what was measured.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

from . import registry, runner

# (workload, [(BV, num_warps)]): BV 16/32/64 on the B1 HV32 shapes (32 pairs; the T65536 run reuses
# the T16384 compiles); BV 64 (the planner's choice, 64 pairs) on the B4 shapes, to keep the run
# short: each (shape, BV) costs three compiles (~2.5 s each). --bv overrides the lists.
PLAN = [
    ("gdn_b1_t16384_h16_hv32", [(16, 4), (32, 4), (64, 4)]),
    ("gdn_b1_t65536_h16_hv32", [(16, 4), (32, 4), (64, 4)]),
    ("gdn_b4_t4096_h16", [(64, 4)]),
    ("gdp_m2_b4_t4096_h16", [(64, 4)]),
]
SEGMENTS = (1, 2, 3, 4, 8)  # 3: at B1 HV32 BV 64 both passes fit one wave of 2 programs per SM
DEVICE = "cuda"


def rel_rms(a, b):
    a, b = a.float(), b.float()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def context_alive() -> bool:
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device=DEVICE).add_(1).item()
        return True
    except Exception:  # noqa: BLE001 - a sticky CUDA error: nothing more can run in this process
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_chunk_segments")
    ap.add_argument("--out", default="benchmarks/results/gpu_chunk_segments.json")
    ap.add_argument("--rep-ms", type=int, default=40, help="do_bench_cudagraph rep (ms of replays per graph)")
    ap.add_argument("--workload", action="append", help="subset of the workloads")
    ap.add_argument("--segments", type=int, nargs="+", default=list(SEGMENTS))
    ap.add_argument("--bv", type=int, nargs="+", help="value blocks for every workload (4 warps)")
    args = ap.parse_args(argv)
    plan_ = [(name, [(bv, 4) for bv in args.bv] if args.bv else shapes) for name, shapes in PLAN]

    import triton.testing as tt

    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem

    from .delta_variants import variant_fwd

    result = {"environment": runner.environment(torch.device("cuda")), "rep_ms": args.rep_ms,
              "method": "do_bench_cudagraph median (device time), prep + sweep", "rows": []}
    outs = [args.out] + ([os.path.join(os.environ["OUT"], "gpu_chunk_segments.json")] if os.environ.get("OUT") else [])

    def save():
        for path in outs:
            try:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                with open(path, "w") as f:
                    json.dump(result, f, indent=1, default=str)
            except OSError as exc:
                print(f"could not save {path}: {exc}", flush=True)

    t_start = time.perf_counter()
    alive = True
    for name, shapes in plan_:
        if args.workload and name not in args.workload:
            continue
        if not alive:
            break
        w = registry.get(name)
        try:
            x = w.make_inputs(DEVICE, 0)
            q, k, v, g, beta = x["q"], x["k"], x["v"], x["g"], x["beta"]
            M = w.num_householder
            L = delta_shape(delta_problem(q, k, v, g, beta, num_householder=M), torch.device("cuda"))
            planned = (L.block_v, L.num_warps)

            def run(BV, warps, P, stage="both"):
                return variant_fwd(q, k, v, g, beta, num_householder=M, use_qk_l2norm_in_kernel=True,
                                   output_final_state=True, block_v=BV, num_warps=warps, num_stages=2,
                                   segments=P, stage=stage)

            with torch.no_grad():
                ref = [t.float().clone() for t in run(*planned, 1)]
        except Exception as exc:  # noqa: BLE001
            result["rows"].append({"workload": name, "error": f"setup: {type(exc).__name__}: {exc}"[:400]})
            print(name, "setup failed:", exc, flush=True)
            save()
            alive = context_alive()
            continue
        todo = [(planned, 1, "prep")] + [(s, P, "both") for s in shapes for P in args.segments]
        for (BV, warps), P, stage in todo:
            row = {"workload": name, "block_v": BV, "num_warps": warps, "segments": P, "stage": stage,
                   "planned_launch": list(planned)}
            t0 = time.perf_counter()
            try:
                with torch.no_grad():
                    res = run(BV, warps, P, stage)
                    torch.cuda.synchronize()
                    row["first_call_s"] = time.perf_counter() - t0  # compile included the first time
                    if stage == "both":
                        row["rel_rms_o_vs_p1"] = rel_rms(res[0], ref[0])
                        row["rel_rms_state_vs_p1"] = rel_rms(res[1], ref[1])
                        row["finite"] = bool(torch.isfinite(res[0]).all() and torch.isfinite(res[1]).all())
                    del res
                    ms = tt.do_bench_cudagraph(lambda: run(BV, warps, P, stage), rep=args.rep_ms,
                                               quantiles=[0.5, 0.2, 0.8])
                row.update(median_ms=ms[0], p20_ms=ms[1], p80_ms=ms[2])
            except Exception as exc:  # noqa: BLE001 - recorded, never hidden
                row["error"] = f"{type(exc).__name__}: {exc}"[:400]
                row["traceback"] = traceback.format_exc()[-1500:]
            print("row", json.dumps({k_: v_ for k_, v_ in row.items() if k_ != "traceback"}), flush=True)
            result["rows"].append(row)
            save()
            if "error" in row and not context_alive():
                print("CUDA context lost: stopping", flush=True)
                alive = False
                break
    result["wall_s"] = time.perf_counter() - t_start
    save()

    # Compact table: one line per (workload, BV): the time at each P, and the worst agreement.
    print()
    print(f"{'workload':<24}{'BV/w':>6}" + "".join(f"{'P=' + str(P):>9}" for P in args.segments)
          + f"{'prep':>8}{'max rRMS o':>11}{'max rRMS S':>11}")
    for name, shapes in plan_:
        rows = [r for r in result["rows"] if r.get("workload") == name]
        if not rows:
            continue
        prep = next((r.get("median_ms") for r in rows if r.get("stage") == "prep"), None)
        for BV, warps in shapes:
            cells, eo, es = [], 0.0, 0.0
            for P in args.segments:
                r = next((r for r in rows if r.get("stage") == "both" and r["block_v"] == BV
                          and r["num_warps"] == warps and r["segments"] == P), None)
                cells.append(f"{r['median_ms']:9.3f}" if r and "median_ms" in r else f"{'err' if r else '-':>9}")
                if r:
                    eo = max(eo, r.get("rel_rms_o_vs_p1", 0.0))
                    es = max(es, r.get("rel_rms_state_vs_p1", 0.0))
            print(f"{name:<24}{f'{BV}/{warps}':>6}" + "".join(cells)
                  + (f"{prep:8.3f}" if prep else f"{'-':>8}") + f"{eo:11.2e}{es:11.2e}")
    print(f"wall {result['wall_s']:.1f} s; saved {', '.join(outs)}")
    return 0 if alive else 1


if __name__ == "__main__":
    sys.exit(main())
