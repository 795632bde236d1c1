"""Chunked GDN / GDP prefill on the GPU: recurscan's Triton kernels against fla-core in one process.

    python -m benchmarks.gpu_chunk_delta --out benchmarks/results/gpu_chunk_delta.json
    python -m benchmarks.gpu_chunk_delta --only variants          # launch-shape sweep, ours only

Sections (each saved in the JSON, a table printed last):

- ``workloads``: the issue's six prefill workloads (benchmarks/registry.py), through
  ``benchmarks.runner.run_workload`` twice: eager (``do_bench``, host time included, L2 flushed)
  and CUDA-graph replay (``do_bench_cudagraph``, device time). Ours gets the varlen descriptors
  built once outside the timed region (as a serving engine does per step), so it captures.
- ``host``: one eager call of GDN B1 T64 H16 HV32 (host time included): median of N calls, each
  timed with perf_counter around call + synchronize.
- ``variants``: our launch shapes (BV, warps, stages) under graph replay, and the two kernels
  alone (prep, sweep: benchmarks/delta_variants.py), for the rule table in recurscan/plan/delta.py
  and the "what bounds it" notes.
- ``cold``: the first call in a fresh process with an empty Triton cache (compile included).

Counts: FLOPs are the registry's (the fused chunk form, useful work); HBM bytes both the
registry's minimum (inputs once, outputs once) and our kernels' design traffic (their scratch
``wy``/``aqk`` written and read back, q/k read by both kernels), per token and value head.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from . import registry, runner

WORKLOADS = ["gdn_b1_t16384_h16_hv32", "gdn_b1_t65536_h16_hv32", "gdn_b4_t4096_h16", "gdn_b4_t8192_h16_hv64",
             "gdn_varlen16_32976_hv32", "gdp_m2_b4_t4096_h16"]
TARGETS_MS = {"gdn_b1_t16384_h16_hv32": 0.45, "gdn_b1_t65536_h16_hv32": 1.8, "gdn_b4_t4096_h16": 0.45,
              "gdn_b4_t8192_h16_hv64": 0.80, "gdn_varlen16_32976_hv32": 0.95, "gdp_m2_b4_t4096_h16": 0.45}


def our_bytes_per_token_head(w: registry.Workload) -> float:
    """HBM traffic of our two kernels per token (of the token stream) and value head, counting each
    buffer once per pass (q, k once per q/k head and pass; GVA groups share them through L2)."""
    e, M, G, K, V = 2, w.num_householder, w.value_heads // w.heads, w.head_k, w.head_v
    qk = (K * e + M * K * e) / G  # q on the token stream, k on the expanded stream
    prep = qk + M * (4 + e) + M * (2 * 64 * e + 8)  # g, beta in; wy, aqk, norm factors out
    sweep = qk + M * V * e + M * (2 * 64 * e + 8) + 4 + V * e  # v, wy, aqk, norms, g in; o out
    return prep + sweep


def fused_bytes_per_token_head(w: registry.Workload) -> float:
    """The same for the fused prefill (kernels/gluon/delta_fused.py, GDN): the chunk vectors' pass
    (q and k once per q/k head, g and beta in, four float32 rows out) and the fused kernel (q, k and
    each value head's vectors in, v in, o out; no scratch between prep and chain)."""
    e, G, K, V = 2, w.value_heads // w.heads, w.head_k, w.head_v
    vectors = 2 * K * e / G + (4 + e) + 16
    fused = 2 * K * e / G + 16 + V * e + V * e
    return vectors + fused


def planned_fused(w: registry.Workload) -> bool:
    """Whether the planner takes the fused prefill for the workload on this GPU."""
    from recurscan.plan.delta import delta_shape
    from recurscan.problem import delta_problem
    x = w.make_inputs("cuda", 0)
    if w.family != "gdn":
        return False
    problem = delta_problem(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=x["cu_seqlens"])
    return delta_shape(problem, x["q"].device).fused


def _ours_loader(w: registry.Workload):
    """recurscan with the varlen descriptors built once (outside timing)."""
    import recurscan
    from recurscan.descriptors import build_chunk_descriptors

    M = w.num_householder
    cache: dict = {}

    def descriptors(cu):
        key = (cu.data_ptr(), cu.shape[0])
        if key not in cache:
            cache[key] = build_chunk_descriptors(cu.cpu(), M, device=cu.device)
        return cache[key]

    if w.family == "gdn":
        def fn(x):
            cu = x["cu_seqlens"]
            kw = {}
            if cu is not None:
                d = descriptors(cu)
                kw = dict(chunk_indices=d.chunk_indices, chunk_offsets=d.chunk_offsets)
            return recurscan.chunk_gated_delta_rule(
                x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                output_final_state=x["output_final_state"], use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"],
                cu_seqlens=cu, **kw)[:2]
        return fn
    if w.family == "gdp":
        cu_dense: dict = {}

        def fn(x):
            q, k, v, g, beta = x["q"], x["k"], x["v"], x["g"], x["beta"]
            B, T = q.shape[:2]
            cu = x["cu_seqlens"]
            if cu is None:  # B equal sequences packed as B = 1 (views, no copies)
                if B not in cu_dense:
                    cu_dense[B] = torch.arange(B + 1, device=q.device, dtype=torch.int64) * T
                cu = cu_dense[B]
                q, k, v, g, beta = (t.reshape(1, -1, *t.shape[2:]) for t in (q, k, v, g, beta))
            o, S = recurscan.chunk_gated_delta_product_varlen(
                q, k, v, g, beta, M, cu, initial_state=x["initial_state"], output_final_state=x["output_final_state"],
                use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"], **descriptors(cu).as_kwargs())[:2]
            return o.reshape(B, T, *o.shape[2:]), S
        return fn
    raise runner.Unsupported(w.family)


OURS = runner.Impl("recurscan", "ours", _ours_loader, "recurscan chunked Triton kernels (descriptors prebuilt)",
                   lambda: runner._dist_version("recurscan"))


def _forward_twin_loader(on: bool):
    """A loader of ours with the forward sweep's Gluon twin row (``plan.delta.GLUON_FORWARD_SWEEP``)
    set to ``on`` for its calls: switched (and the signature caches cleared, so the planner decides
    again) on the first call after the other setting ran."""
    import dataclasses

    from recurscan.plan import delta as plan_delta
    from recurscan.runtime.cache import clear_caches

    def load(w):
        fn = _ours_loader(w)

        def call(x):
            if plan_delta.GLUON_FORWARD_SWEEP.on != on:
                plan_delta.GLUON_FORWARD_SWEEP = dataclasses.replace(plan_delta.GLUON_FORWARD_SWEEP, on=on)
                clear_caches()
            return fn(x)
        return call
    return load


#: ``plan.delta.GLUON_FORWARD_SWEEP.on`` as the planner has it (read before any variant switched it).
PLANNED_FORWARD_TWIN: list = []


def forward_twin_impls() -> list:
    """Ours as planned, and ours with the forward sweep's Gluon twin row the other way (a variant
    in the same process, timed after ours)."""
    from recurscan.plan import delta as plan_delta
    if not PLANNED_FORWARD_TWIN:
        PLANNED_FORWARD_TWIN.append(plan_delta.GLUON_FORWARD_SWEEP.on)
    planned = PLANNED_FORWARD_TWIN[0]
    name = "recurscan, sweep " + ("Triton" if planned else "Gluon")
    return [runner.Impl("recurscan", "ours", _forward_twin_loader(planned), OURS.description, OURS.version),
            runner.Impl(name, "variant", _forward_twin_loader(not planned),
                        f"recurscan with plan.delta.GLUON_FORWARD_SWEEP on={not planned}", OURS.version)]


def bench_workloads(names, impls, rep_ms, out=None, save=lambda: None, ours=(OURS,)):
    out = [] if out is None else out
    for name in names:
        w = registry.get(name)
        for graph in (True, False):
            rec = runner.run_workload(w, impls=impls, extra_impls=list(ours), cuda_graph=graph, rep_ms=rep_ms)
            fused = planned_fused(w)
            rec["ours_planned_fused"] = fused
            rec["ours_bytes_per_token_head"] = fused_bytes_per_token_head(w) if fused else our_bytes_per_token_head(w)
            rec["min_bytes_per_token_head"] = w.hbm_bytes() / (w.tokens * w.value_heads)
            rec["target_ms"] = TARGETS_MS.get(name)
            print(runner.format_table(rec), flush=True)
            out.append(rec)
            save()
    return out


def bench_host(impl_names, calls=50):
    """One eager call of GDN B1 T64 H16 HV32, host time included."""
    w = registry.Workload("gdn_b1_t64_h16_hv32", "gdn", (64,), heads=16, value_heads=32)
    x = w.make_inputs("cuda", 0)
    fns = {"recurscan": _ours_loader(w)}
    if "fla" in impl_names:
        try:
            fns["fla"] = runner._fla(w)
        except (runner.NotInstalled, runner.Unsupported) as exc:
            print(f"host: fla {exc}")
    res = {}
    for name, fn in fns.items():
        with torch.no_grad():
            for _ in range(5):
                fn(x)
            torch.cuda.synchronize()
            ts = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn(x)
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
        res[name] = {"median_s": statistics.median(ts), "p20_s": sorted(ts)[calls // 5],
                     "p80_s": sorted(ts)[4 * calls // 5]}
        print(f"host-bound call gdn B1 T64 HV32 {name:<10} median {res[name]['median_s'] * 1e3:.3f} ms", flush=True)
    return {"workload": w.describe(), "calls": calls, "results": res}


def kernel_inputs(name):
    """A workload's inputs as ``chunk_delta_fwd`` takes them: ``((q, k, v, g, beta), M, cu_seqlens,
    descriptor kwargs)``; GDP goes in as a varlen batch (its public op is varlen-only)."""
    from recurscan.descriptors import build_chunk_descriptors

    w = registry.get(name)
    x = w.make_inputs("cuda", 0)
    q, k, v, g, beta, cu = x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"]
    M = w.num_householder
    if w.family == "gdp" and cu is None:
        B, T = q.shape[:2]
        cu = torch.arange(B + 1, device="cuda", dtype=torch.int64) * T
        q, k, v, g, beta = (t.reshape(1, -1, *t.shape[2:]) for t in (q, k, v, g, beta))
    kw = {}
    if cu is not None:
        d = build_chunk_descriptors(cu.cpu(), M, device="cuda")
        kw = dict(cu_seqlens=cu, chunk_indices_dp=d.chunk_indices_dp)
    return (q, k, v, g, beta), M, cu, kw


def bench_variants(names, rep_ms, shapes=None):
    """Our kernels at several launch shapes under graph replay, each variant's output compared with
    the planner's choice (relative RMS; the planner's choice is the one the GPU tests check against
    the oracle); and the planner's launch with one kernel alone (prep, sweep)."""
    import triton.testing as tt
    from recurscan.launch.delta import run_delta_launches
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem

    from .delta_variants import variant_launches

    # Launch shapes (BV, num_warps, num_stages, segments, v_product, tma_store, phases, prep_maxnreg);
    # v_product defaults to 1, tma_store to 0, phases to 1, prep_maxnreg to 0 (no cap; the planner
    # asks 168, so the planned shape is compared under its own cap). num_stages=1 is left out: on
    # Triton 3.6 / H200 it raised an illegal memory access (2026-11-29). Segments apply to dense GDN only (varlen input, GDP here, runs the
    # single sweep whatever is asked); tma_store to M = 1.
    shapes = [tuple(s_) + (1, 0, 1, 0)[len(s_) - 4:] for s_ in shapes or
              [(16, 4, 2, 1), (32, 4, 2, 1), (64, 4, 2, 1), (64, 8, 2, 1), (128, 8, 2, 1)]]
    out = []
    for name in names:
        (q, k, v, g, beta), M, cu, kw = kernel_inputs(name)
        L = delta_shape(delta_problem(q, k, v, g, beta, num_householder=M, cu_seqlens=cu), torch.device("cuda"))
        planned = (L.block_v, L.num_warps, L.num_stages, L.segments, int(L.v_product), int(L.tma_store), L.phases,
                   L.prep_maxnreg or 0)

        plans = {}

        def run(BV, warps, stages, P, vp, tma, ph, maxnreg, stage="both"):
            # One set of launches per launch shape, kept as the public ops keep theirs: after its
            # first call (through Triton's JIT) it launches directly, programmatic launches included.
            key = (BV, warps, stages, P, vp, tma, ph, maxnreg, stage)
            if key not in plans:
                plans[key] = variant_launches(q, k, v, g, beta, num_householder=M, use_qk_l2norm_in_kernel=True,
                                              output_final_state=True, block_v=BV, num_warps=warps,
                                              num_stages=stages, segments=P, v_product=bool(vp), tma_store=bool(tma),
                                              phases=ph, prep_maxnreg=maxnreg or None, stage=stage, **kw)
            return run_delta_launches(plans[key], (q, k, v, g, beta, None, None, None, kw.get("cu_seqlens"),
                                                   kw.get("chunk_indices_dp"), None))
        with torch.no_grad():
            ref = [t.float().clone() for t in run(*planned)]
        todo = [(planned, "prep"), (planned, "sweep")] + [(s_, "both") for s_ in shapes]
        for shape, stage in todo:
            BV, warps, stages, P, vp, tma, ph, maxnreg = shape
            row = {"workload": name, "block_v": BV, "num_warps": warps, "num_stages": stages, "segments": P,
                   "v_product": vp, "tma_store": tma, "phases": ph, "prep_maxnreg": maxnreg, "stage": stage,
                   "planned": shape == planned}
            try:
                with torch.no_grad():
                    res = run(*shape, stage)
                    if stage == "both":
                        row["rel_rms_vs_planned"] = [
                            ((a.float() - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()
                            for a, b in zip(res, ref)]
                    ms = tt.do_bench_cudagraph(lambda: run(*shape, stage), rep=rep_ms,
                                               quantiles=[0.5, 0.2, 0.8])
                row.update(median_ms=ms[0], p20_ms=ms[1], p80_ms=ms[2])
            except Exception as exc:  # recorded, never hidden
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                print("variant", json.dumps(row), flush=True)
                out.append(row)
                return out  # a CUDA error poisons the context: stop here
            print("variant", json.dumps(row), flush=True)
            out.append(row)
    return out


COLD = r"""
import time, os, sys
t0 = time.perf_counter()
import torch, recurscan
sys.path.insert(0, os.getcwd())
from benchmarks import registry
w = registry.get("gdn_b1_t16384_h16_hv32")
x = w.make_inputs("cuda", 0)
torch.cuda.synchronize()
t1 = time.perf_counter()
with torch.no_grad():
    recurscan.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True,
                                     use_qk_l2norm_in_kernel=True)
torch.cuda.synchronize()
t2 = time.perf_counter()
print("COLD", t1 - t0, t2 - t1, t2 - t0)
"""


def bench_cold():
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, TRITON_CACHE_DIR=cache_dir)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", COLD], env=env, capture_output=True, text=True, cwd=runner.REPO)
        wall = time.perf_counter() - t0
    line = next((l for l in p.stdout.splitlines() if l.startswith("COLD")), None)
    if line is None:
        return {"error": (p.stderr or p.stdout)[-2000:]}
    imp, first, total = map(float, line.split()[1:])
    res = {"import_and_inputs_s": imp, "first_call_s": first, "process_total_s": total, "wall_s": wall,
           "workload": "gdn_b1_t16384_h16_hv32", "triton_cache": "empty (fresh TRITON_CACHE_DIR)"}
    print(f"cold start: first call {first:.2f} s (import + inputs {imp:.2f} s; process {wall:.2f} s)", flush=True)
    return res


def summary(records):
    """One line per workload: ours vs fla, graph replay and eager."""
    rows = {}
    for rec in records:
        name = rec["workload"]["name"]
        mode = "graph" if "cudagraph" in rec["timing"]["method"] else "eager"
        for r in rec["results"]:
            if r.get("status") == "ok":
                rows.setdefault(name, {})[(r["name"], mode)] = r
    lines = [f"{'workload':<26}{'ours graph':>11}{'ours eager':>11}{'fla graph':>10}{'fla eager':>10}"
             f"{'fla/ours':>9}{'target':>8}{'TFLOP/s':>8}{'%peak':>6}{'Mtok/s':>8}{'B/tok-hd':>9}{'relRMS o':>10}"]
    for rec in records:
        if "cudagraph" not in rec["timing"]["method"]:
            continue
        name = rec["workload"]["name"]
        r = rows.get(name, {})
        og, oe = r.get(("recurscan", "graph")), r.get(("recurscan", "eager"))
        fg, fe = r.get(("fla", "graph")), r.get(("fla", "eager"))
        ms = lambda z: f"{z['time_s']['median'] * 1e3:.3f}" if z else "-"  # noqa: E731
        ratio = f"{fg['time_s']['median'] / og['time_s']['median']:.2f}" if fg and og else "-"
        agree = fg.get("agreement", {}).get("output") if fg else None
        lines.append(f"{name:<26}{ms(og):>11}{ms(oe):>11}{ms(fg):>10}{ms(fe):>10}{ratio:>9}"
                     f"{rec.get('target_ms') or '-':>8}"
                     f"{(og['flops_per_s'] / 1e12 if og else 0):>8.1f}{(og.get('pct_peak_flops', float('nan')) if og else 0):>6.1f}"
                     f"{(og['tokens_per_s'] / 1e6 if og else 0):>8.1f}{rec['ours_bytes_per_token_head']:>9.0f}"
                     f"{(agree['rel_rms'] if agree else float('nan')):>10.2e}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_chunk_delta")
    ap.add_argument("--out", default="benchmarks/results/gpu_chunk_delta.json")
    ap.add_argument("--only", action="append", choices=["workloads", "host", "variants", "cold"])
    ap.add_argument("--workload", action="append", help="subset of the six workloads")
    ap.add_argument("--variant-workload", action="append")
    ap.add_argument("--variant-shape", action="append",
                    help="BV:num_warps:num_stages:segments[:v_product[:tma_store[:phases[:prep_maxnreg]]]] launch shapes for --only variants "
                         "(repeatable)")
    ap.add_argument("--phase-ratio", type=float,
                    help="recurscan.launch.delta.PHASE_RATIO for this run (phased variants)")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--fla-workload", action="append",
                    help="run fla only on these workloads (its first call compiles and autotunes: 10-80 s each)")
    ap.add_argument("--rep-ms", type=int, default=300)
    ap.add_argument("--forward-twin", action="store_true",
                    help="also ours with the forward sweep's Gluon twin row the other way, in the same process")
    ap.add_argument("--plan", action="append", default=[], metavar="NAME=VALUE",
                    help="set recurscan.plan.delta.NAME (a Python literal) before the first call (runner.set_plan)")
    args = ap.parse_args(argv)
    runner.set_plan(args.plan)
    from recurscan.launch import delta as launch_delta
    if args.phase_ratio is not None:
        launch_delta.PHASE_RATIO = args.phase_ratio
    sections = args.only or ["cold", "workloads", "host", "variants"]
    # With --no-fla, name an implementation that declines every prefill workload at once
    # (recorded as "unsupported"), so that only ours (passed as an extra implementation) runs.
    impls = ["fla"] if not args.no_fla else ["mamba_ssm"]
    result = {"environment": runner.environment(torch.device("cuda")), "sections": sections,
              "phase_ratio": launch_delta.PHASE_RATIO}
    # The benchmark writes as it goes: a section that fails leaves the earlier ones saved.
    def save():
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
    if "cold" in sections:  # first: a fresh process before this one has compiled anything
        result["cold"] = bench_cold()
        save()
    if "workloads" in sections:
        result["workloads"] = []
        fla_for = set(args.fla_workload or WORKLOADS)
        for name in args.workload or WORKLOADS:
            bench_workloads([name], impls if name in fla_for else ["mamba_ssm"], args.rep_ms,
                            result["workloads"], save, ours=forward_twin_impls() if args.forward_twin else (OURS,))
    if "host" in sections:
        result["host"] = bench_host(impls)
        save()
    if "variants" in sections:
        result["variants"] = bench_variants(args.variant_workload or
                                            ["gdn_b1_t16384_h16_hv32", "gdn_b4_t8192_h16_hv64", "gdp_m2_b4_t4096_h16"],
                                            args.rep_ms,
                                            [tuple(map(int, v.split(":"))) for v in args.variant_shape or []])
        save()
    if "workloads" in sections:
        print(summary(result["workloads"]))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
