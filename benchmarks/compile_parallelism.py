"""How a cold first call's compiles scale with parallel workers: the kernels of GDN's forward and
backward as planned on Hopper (the Triton prep and sweeps, the Gluon twins) compiled for sm_90, one
after another, in threads (as the launch layer's compile pools run them) and in forked processes,
each form into an empty Triton cache. Needs no GPU; meaningful on a host with a CPU a kernel.

    PYTHONPATH=$PWD python benchmarks/compile_parallelism.py [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def kernels() -> list:
    """(launch record, names, values) of each distinct kernel a cold GDN forward + backward compiles
    on Hopper as planned, by tests.helpers.sm90's cases."""
    from tests.helpers.sm90 import case_launches
    picked, seen = [], set()
    for shape in ("Gluon scores", "Gluon dq and dk", "Gluon reverse sweep", "Gluon forward sweep"):
        for item in case_launches("GDN dense, H = HV", shape):
            name = getattr(item[0].kernel, "fn", item[0].kernel).__name__
            key = (name, tuple(sorted(item[0].options.items())))
            if key not in seen:
                seen.add(key)
                picked.append(item)
    return picked


def run(mode: str) -> dict:
    """One form in a fresh process-wide cache; seconds until every kernel is compiled (for forked
    processes, then loaded from the cache by this process, as the launch would)."""
    from tests.helpers.sm90 import compile_for_sm90
    items = kernels()
    t0 = time.perf_counter()
    loaded = None
    if mode == "serial":
        for item in items:
            compile_for_sm90(*item)
    elif mode == "threads":
        with ThreadPoolExecutor(len(items)) as pool:
            list(pool.map(lambda item: compile_for_sm90(*item), items))
    else:
        pids = []
        for item in items:
            pid = os.fork()
            if pid == 0:
                try:
                    compile_for_sm90(*item)
                finally:
                    os._exit(0)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        t1 = time.perf_counter()
        for item in items:
            compile_for_sm90(*item)
        loaded = time.perf_counter() - t1
    return dict(mode=mode, kernels=len(items), seconds=round(time.perf_counter() - t0, 2),
                load_from_cache_s=None if loaded is None else round(loaded, 2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", action="append", help="serial, threads or fork (default: all, each in a process)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.mode and len(args.mode) == 1:  # the child: one form in this process
        print(json.dumps(run(args.mode[0])))
        return
    import subprocess
    rows = []
    for mode in args.mode or ("serial", "threads", "fork", "threads", "fork"):
        env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp())
        env.pop("TRITON_INTERPRET", None)
        out = subprocess.run([sys.executable, __file__, "--mode", mode], env=env, capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(out.stderr[-3000:])
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    if args.out:
        json.dump(dict(cpus=os.cpu_count(), commit=os.environ.get("RECURSCAN_COMMIT"), rows=rows), open(args.out, "w"),
                  indent=1)


if __name__ == "__main__":
    main()
