"""The timing probes' process loop, shared by the probe benchmarks (gpu_gla_reverse_probe.py,
gpu_delta_reverse_probe.py): a kernel module reads its probe variable once, when it is imported,
so each probe runs in a process of its own, the script again with ``--child FILE``, writing its
rows there as JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile


def rows_by_probe(script: str, variable: str, probes, child_args=()) -> list:
    """The rows of ``script --child FILE *child_args`` run once per probe with ``variable`` set to
    it in the environment, in the order of ``probes``."""
    rows = []
    for probe in probes:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            env = dict(os.environ, **{variable: probe})
            subprocess.run([sys.executable, script, "--child", f.name, *child_args], env=env, check=True)
            rows += json.load(open(f.name))
    return rows


def save(path: str, rows: list) -> None:
    """``rows`` as JSON at ``path``, with the torch version, the GPU's name and RECURSCAN_COMMIT."""
    import torch
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    json.dump(dict(torch=torch.__version__, device=device,
                   commit=os.environ.get("RECURSCAN_COMMIT", "unknown"), rows=rows), open(path, "w"), indent=1)


def main(script: str, doc: str, variable: str, probes, workloads, rows) -> None:
    """A probe benchmark's command line: ``--probe`` (repeatable; default: every one of ``probes``),
    ``--workload`` (of ``workloads``; default: all), ``--plan NAME=VALUE`` (repeatable: planner
    values set in each probe's process, as benchmarks/runner.py's set_plan) and ``--out``; each
    probe in a process of its own (``script --child FILE``), whose ``rows(workloads)`` go to FILE."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--probe", action="append", choices=probes, help="a probe to run (default: all)")
    ap.add_argument("--workload", action="append", help="a workload of WORKLOADS (default: all)")
    ap.add_argument("--plan", action="append", default=[], metavar="NAME=VALUE",
                    help="set recurscan.plan.delta.NAME in each probe's process, e.g. FUSED_PIPELINED=True")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # a probe's process: its rows to this file
    args = ap.parse_args()
    if args.child:
        if args.plan:
            from benchmarks import runner
            runner.set_plan(args.plan)
        json.dump(rows(tuple(args.workload or workloads)), open(args.child, "w"))
        return
    chosen = [a for w in args.workload or () for a in ("--workload", w)] + \
        [a for p in args.plan for a in ("--plan", p)]
    results = rows_by_probe(script, variable, args.probe or probes, chosen)
    if args.out:
        save(args.out, results)
