"""The first forward + backward in a fresh process with an empty Triton cache (issue 19's cold row),
repeated in fresh processes, with the planner's checkpoints and without them, interleaved so that
neither always runs on a warmer machine: the cold time varies by a second or more from process to
process, so one sample says little.

    PYTHONPATH=$PWD python benchmarks/gpu_delta_cold.py [--workload NAME] [--runs 4] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CODE = """
import time
import torch
from recurscan.plan import delta as plan_delta
if {off}:
    plan_delta.checkpoint_chunks_for_backward = lambda problem, device: 0
from benchmarks import registry
from benchmarks.gpu_delta_train import leaves, recurscan_step
w = registry.get({name!r})
t, x = leaves(w)
do = torch.randn(w.batch, w.seqlen, w.value_heads, w.head_v, device="cuda", dtype=t["v"].dtype)
torch.cuda.synchronize(); t0 = time.perf_counter()
o = recurscan_step(w, x, t)
torch.autograd.grad(o.reshape(do.shape), list(t.values()), do)
torch.cuda.synchronize(); print(time.perf_counter() - t0)
"""


def cold(name: str, checkpoints: bool) -> float:
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run([sys.executable, "-c", CODE.format(name=name, off=not checkpoints)], capture_output=True,
                             text=True, env=dict(os.environ, TRITON_CACHE_DIR=cache), check=True)
    return float(out.stdout.split()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="gdn_b1_t16384_h16_hv32")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--out")
    args = ap.parse_args()
    seconds = {"on": [], "off": []}
    for i in range(args.runs):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            seconds[mode].append(round(cold(args.workload, mode == "on"), 2))
            print(f"{args.workload} checkpoints {mode}: cold first call {seconds[mode][-1]:.2f} s", flush=True)
    if args.out:
        json.dump(dict(workload=args.workload, commit=os.environ.get("RECURSCAN_COMMIT"), seconds=seconds),
                  open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
