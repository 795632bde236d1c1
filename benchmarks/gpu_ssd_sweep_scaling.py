"""What bounds SSD's forward sweep on the group prep's scores: the sweep's GPU time as the number of
its programs grows (one program per value head at B1 T16384, one group, dstate 128, 64 value columns,
chunk 256, D per head, dt_bias, softplus), on the Gluon twin in its planned shape and, with ``--ws``,
warp-specialised. Per row: the sweep's microseconds, a chunk's microseconds per program (the sweep
over its 256 chunks, where every program runs at once), and the bytes its programs bring into shared
memory per second (k, q, v and the float32 scores: 56 KB a program and chunk; k, q and the scores are
the group's, read by every value head's program).

If a program's chunk time stays put as programs are added, a program is bound by its own SM; if it
grows with them, by something they share (the L2's bandwidth). ``--probe P`` (repeatable) times the
warp-specialised form again with its timing probe P in a process of its own
(kernels/gluon/gla_sweep_specialized.py's PROBE: 1 the ring of loads alone, 2 with the chain, 3
with the outputs), which splits a chunk's time between the loads, the chain and the outputs.

    PYTHONPATH=$PWD python benchmarks/gpu_ssd_sweep_scaling.py --out benchmarks/results/gpu_ssd_sweep_scaling_<commit>.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import triton.testing as tt

import recurscan
from benchmarks.gpu_delta_train import kernel_times
from benchmarks.gpu_gla import ssd_inputs
from benchmarks.gpu_gla_sweep import parse_sweep
from recurscan.plan import gla as plan_gla
from recurscan.runtime.cache import clear_caches

#: Bytes a sweep program's ring brings in per chunk: k and q [64, 128] bf16, v [64, 64] bf16, the
#: scores [64, 64] float32.
BYTES_A_CHUNK = 2 * 64 * 128 * 2 + 64 * 64 * 2 + 64 * 64 * 4


def rows(heads, form):
    shape = parse_sweep(form)
    plan_gla.gla_sweep_shape = lambda problem, device, gluon=True: shape
    out = []
    for H in heads:
        a, kw = ssd_inputs(1, 16384, H=H)
        clear_caches()
        fn = lambda: recurscan.mamba_chunk_scan_combined(*a, **kw)  # noqa: E731
        with torch.no_grad():
            fn()
            ms = tt.do_bench(fn, rep=100, return_mode="median")
            us = {name: t for name, t in kernel_times(fn).items() if "sweep" in name}
        sweep = max(us.values())
        chunk = sweep / 256
        rate = H * 256 * BYTES_A_CHUNK / (sweep * 1e-6) / 1e12
        probe = os.environ.get("RECURSCAN_SWEEP_PROBE", "0")
        print(f"{form:<26}{'' if probe == '0' else f' probe {probe}'} H {H:4d}: {ms:.3f} ms, sweep {sweep:7.1f} us, {chunk:.2f} us a chunk a program, "
              f"{rate:.2f} TB/s into shared memory", flush=True)
        out.append(dict(form=form, heads=H, ms=ms, sweep_us=sweep, us_a_chunk=chunk, tb_per_s=rate, kernels_us=us))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--ws", action="store_true", help="also the warp-specialised twin (DeltaShape.specialized)")
    ap.add_argument("--heads", type=int, nargs="*", default=[20, 40, 80, 132])
    ap.add_argument("--probe", type=int, action="append", default=[], choices=[1, 2, 3],
                    help="also the warp-specialised form under its timing probe P (1, 2 or 3), in a process of its own")
    ap.add_argument("--ws-only", action="store_true", help="the warp-specialised form alone")
    ap.add_argument("--form", action="append", default=[],
                    help="also a sweep form of gpu_gla_sweep.py's --sweep (e.g. 64:4:3:tma:grp:gluon:ws, three stages)")
    args = ap.parse_args()
    got = [] if args.ws_only else rows(args.heads, "64:4:2:tma:grp:gluon")
    if args.ws or args.ws_only:
        got += rows(args.heads, "64:4:2:tma:grp:gluon:ws")
    for form in ([] if args.ws_only else args.form):
        got += rows(args.heads, form)
    for probe in args.probe:  # the probe is read when the kernel's module is imported
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows.json")
            subprocess.run([sys.executable, "-m", "benchmarks.gpu_ssd_sweep_scaling", "--ws-only", "--out", out,
                            "--heads", *map(str, args.heads)], check=True,
                           env=dict(os.environ, RECURSCAN_SWEEP_PROBE=str(probe)))
            got += [dict(row, probe=probe) for row in json.load(open(out))["rows"]]
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(dict(torch=torch.__version__, device=torch.cuda.get_device_name(),
                           commit=os.environ.get("RECURSCAN_COMMIT", "unknown"), rows=got), f, indent=1)


if __name__ == "__main__":
    main()
