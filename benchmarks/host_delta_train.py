"""Host time of one forward + backward of the chunked delta rule (issue 19): GDN B1 T64 H16 HV32
(the GPU's work shorter than the host's) and B4 T4096, back to back with no synchronisation, then
the B1 T64 step under cProfile (the functions with the most own time, and the most time below them).

    python -m benchmarks.host_delta_train --out benchmarks/results/host_delta_train.json
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats

import torch

from benchmarks import registry
from benchmarks.gpu_decode import host_time
from benchmarks.gpu_delta_train import step_calls


def profile(fn, n=200, top=25) -> str:
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = {}
    for name, w in (("b1_t64", registry.Workload("gdn_b1_t64_h16_hv32", "gdn", (64,), heads=16, value_heads=32)),
                    ("b4_t4096", registry.get("gdn_b4_t4096_h16"))):
        step, forward, _, _ = step_calls(w)
        n = 500 if name == "b1_t64" else 100
        for label, fn in (("fwd_bwd", step), ("fwd", forward)):
            t = host_time(fn, n)
            rows[f"{name}_{label}_host_us"] = t["host_per_call_s"] * 1e6
            rows[f"{name}_{label}_wall_us"] = t["wall_per_call_s"] * 1e6
            print(f"{name} {label}: host {rows[f'{name}_{label}_host_us']:.1f} us, "
                  f"wall {rows[f'{name}_{label}_wall_us']:.1f} us a call", flush=True)
        if name == "b1_t64":
            rows["b1_t64_profile"] = profile(step)
            print(rows["b1_t64_profile"], flush=True)
    if args.out:
        json.dump(rows, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
