"""Same-process A/B of recurscan against an older commit's package, on every registered workload
named, eager (L2 flushed) and graph replay: the check that a change left the figures of record
unchanged. The older package is imported as ``recurscan_prev`` from a folder holding it:

    git archive OLD recurscan | tar -x -C build/prev && mv build/prev/recurscan build/prev/recurscan_prev
    RECURSCAN_COMMIT=NEW python -m benchmarks.ab_prev --prev build/prev --label OLD \\
        --workload gdn_b1_t16384_h16_hv32 --workload gdn_decode_256 --out benchmarks/results/ab.json

Each row: the workload, the timing mode, both medians and ``ratio_prev_over_ours`` (> 1: ours is
faster), and the agreement of the two outputs. Order alternates per workload so that neither
version always runs on a warmer GPU.
"""
from __future__ import annotations

import argparse
import sys

import torch

from . import registry, runner


def packages_with(prev: str | None) -> list[str]:
    """``["recurscan"]`` and, with ``prev`` (a folder holding other commits' packages as
    ``recurscan_NAME``), those packages' names, importable once the folder is on the path."""
    import os
    import sys
    packages = ["recurscan"]
    if prev:
        sys.path.insert(0, prev)
        packages += sorted(p for p in os.listdir(prev) if p.startswith("recurscan_"))
    return packages


def prev_impl(path: str, label: str) -> runner.Impl:
    """The older package as a peer: runner's own loader for ours, importing ``recurscan_prev``."""
    sys.path.insert(0, path)

    def load(w):
        real = runner._import
        runner._import = lambda m: real("recurscan_prev" if m == "recurscan" else m)
        try:
            return runner._ours(w)
        finally:
            runner._import = real

    return runner.Impl("recurscan_prev", "peer", load, f"recurscan at {label}", lambda: label)


COLD = """
import sys, time, torch
sys.path.insert(0, {prev!r})
from benchmarks import registry, runner
real = runner._import
runner._import = lambda m: real({module!r} if m == "recurscan" else m)
w = registry.get({workload!r})
x = w.make_inputs("cuda", 0)
fn = runner._ours(w)
torch.cuda.synchronize()
t0 = time.perf_counter()
with torch.no_grad():
    fn(x)
torch.cuda.synchronize()
print(time.perf_counter() - t0)
"""


def cold_first_call(prev: str, module: str, workload: str) -> float:
    """Seconds of the first call in a fresh process with an empty Triton cache (compiles included)."""
    import os
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run([sys.executable, "-c", COLD.format(prev=prev, module=module, workload=workload)],
                             env=dict(os.environ, TRITON_CACHE_DIR=cache), capture_output=True, text=True,
                             check=True)
    return float(out.stdout.split()[-1])


def kernel_times(impl: runner.Impl, workload: str, calls: int = 20) -> dict[str, float]:
    """Mean device microseconds per call of each kernel (torch.profiler over ``calls`` eager calls)."""
    from torch.profiler import ProfilerActivity, profile
    w = registry.get(workload)
    x = w.make_inputs("cuda", 0)
    fn = impl.load(w)
    with torch.no_grad():
        for _ in range(3):
            fn(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(x)
            torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.count:
            out[e.key] = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0)) / calls
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ab_prev", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prev", required=True, help="folder holding the older package as recurscan_prev/")
    ap.add_argument("--label", required=True, help="the older commit, recorded in the rows")
    ap.add_argument("--workload", action="append", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rep-ms", type=int, default=500)
    ap.add_argument("--cold", type=int, default=0, help="cold first calls per version, alternating (fresh processes)")
    ap.add_argument("--kernels", action="store_true", help="also each kernel's device time (torch.profiler)")
    ap.add_argument("--plan", action="append", default=[], metavar="NAME=VALUE",
                    help="set recurscan.plan.delta.NAME (a Python literal) for ours before the first call: a "
                         "planner decision against the older package, e.g. PREP_SPLIT_INVERSE=32")
    args = ap.parse_args(argv)
    runner.set_plan(args.plan)
    prev = prev_impl(args.prev, args.label)
    device = torch.device("cuda")
    rows = []
    for name in args.workload:
        for graph in (False, True):
            rec = runner.run_workload(name, impls=["recurscan"], extra_impls=[prev], cuda_graph=graph,
                                      rep_ms=args.rep_ms)
            res = {r["name"]: r for r in rec["results"]}
            ours, old = res.get("recurscan", {}), res.get("recurscan_prev", {})
            row = dict(workload=name, mode="graph" if graph else "eager",
                       ours_ms=ours.get("time_s", {}).get("median", float("nan")) * 1e3,
                       prev_ms=old.get("time_s", {}).get("median", float("nan")) * 1e3,
                       ours_first_call_s=ours.get("first_call_s"), prev_first_call_s=old.get("first_call_s"),
                       ratio_prev_over_ours=old.get("ratio_peer_over_ours"), agreement=old.get("agreement"),
                       status=(ours.get("status"), old.get("status"), ours.get("detail"), old.get("detail")))
            rows.append(row)
            print(f"{name:<28} {row['mode']:<6} ours {row['ours_ms']:.4f} ms  prev {row['prev_ms']:.4f} ms  "
                  f"prev/ours {row['ratio_prev_over_ours']}", flush=True)
            for who, r in (("ours", ours), ("prev", old)):
                if r.get("status") != "ok":
                    print(f"  {who}: {r.get('status')}: {r.get('detail')}", flush=True)
            runner.save_rows(rows, args.out, device)  # after every row: a run cut short keeps what it measured
        if args.kernels:
            ours_k, prev_k = kernel_times(runner.IMPLS[0], name), kernel_times(prev, name)
            rows.append(dict(workload=name, mode="kernels", ours_us=ours_k, prev_us=prev_k))
            for kname in sorted(set(ours_k) | set(prev_k)):
                print(f"  {kname[:60]:<60} ours {ours_k.get(kname, 0):8.1f} us  prev {prev_k.get(kname, 0):8.1f} us",
                      flush=True)
    for i in range(args.cold):  # alternating, so that neither version always runs second
        for module in (("recurscan", "recurscan_prev") if i % 2 == 0 else ("recurscan_prev", "recurscan")):
            secs = cold_first_call(args.prev, module, args.workload[0])
            rows.append(dict(workload=args.workload[0], mode="cold first call", version=module, seconds=secs))
            print(f"cold first call {module:<15} {secs:.2f} s", flush=True)
            runner.save_rows(rows, args.out, device)
    runner.save_rows(rows, args.out, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
