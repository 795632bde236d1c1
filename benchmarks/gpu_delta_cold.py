"""The first forward + backward in a fresh process with an empty Triton cache (issue 19's cold row),
repeated in fresh processes, with the planner's checkpoints and without them, interleaved so that
neither always runs on a warmer machine: the cold time varies by a second or more from process to
process, so one sample says little.

    PYTHONPATH=$PWD python benchmarks/gpu_delta_cold.py [--workload NAME] [--runs 4] [--torch-import-first]
        [--scalar-loss] [--out FILE]

``--torch-import-first``: torch's own import on the first ``autograd.grad`` given grad_outputs (sympy,
~2 s) done before the clock starts (``gpu_delta_train.cold``'s docstring says why). ``--scalar-loss``:
the backward as a training step takes it, ``loss.backward()`` on a scalar loss.
"""
from __future__ import annotations

import argparse
import json
import os

from benchmarks.gpu_delta_train import cold


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="gdn_b1_t16384_h16_hv32")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--torch-import-first", action="store_true")
    ap.add_argument("--scalar-loss", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    seconds = {"on": [], "off": []}
    for i in range(args.runs):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            seconds[mode].append(round(cold(args.workload, checkpoints=mode == "on",
                                            torch_import_first=args.torch_import_first,
                                            scalar_loss=args.scalar_loss), 2))
            print(f"{args.workload} checkpoints {mode}: cold first call {seconds[mode][-1]:.2f} s", flush=True)
    if args.out:
        json.dump(dict(workload=args.workload, commit=os.environ.get("RECURSCAN_COMMIT"), seconds=seconds,
                       torch_import_first=args.torch_import_first, scalar_loss=args.scalar_loss),
                  open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
