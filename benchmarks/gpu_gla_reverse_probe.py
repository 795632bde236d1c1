"""What bounds SSD training's reverse sweep (the backward's Gluon twin, kernels/gluon/
gla_backward_sweep.py): its GPU time in SSD forward + backward at B1 T16384 and B4 T4096 (80 heads x
64, one group, dstate 128: benchmarks/gpu_gla.py's inputs), as planned and under its timing probes,
each in a process of its own (RECURSCAN_REVERSE_PROBE: 1 the loads and the chain, the chunk's outputs
off; 2 the loads and the outputs, the chain's product off). Per row: the reverse sweep's
microseconds and a chunk's microseconds a program (the sweep over the sequence's chunks and its
waves of one program an SM: B4's 320 programs run in three). If the chain alone takes much less
than the whole, the outputs on warpgroups of their own would pay, as they did in the forward
(docs/kernels-gla-plan.md, "The next GPU session", 2c). Probes 1 and 2 compute wrong gradients.

    PYTHONPATH=$PWD python benchmarks/gpu_gla_reverse_probe.py --out benchmarks/results/gpu_gla_reverse_probe_<commit>.json
"""
from __future__ import annotations

import argparse
import json
import os

from benchmarks import probe_processes

#: (batch, tokens) of the rows: SSD training's B1 and B4 rows of record.
SHAPES = ((1, 16384), (4, 4096))
KERNEL = "gluon_gla_bwd_sweep_kernel"


def rows() -> list:
    """This process's rows (its RECURSCAN_REVERSE_PROBE as set when it started)."""
    import torch

    from benchmarks.gpu_delta_train import kernel_times
    from benchmarks.gpu_gla import SSD_GRADS, ssd_inputs, train_step
    import recurscan
    probe = os.environ.get("RECURSCAN_REVERSE_PROBE", "0")
    out = []
    for Bt, T in SHAPES:
        a, kw = ssd_inputs(Bt, T)
        dy = torch.randn_like(a[0])
        us = kernel_times(lambda: train_step(recurscan.mamba_chunk_scan_combined, a, kw, SSD_GRADS, dy))
        sweep = sum(t for name, t in us.items() if name.startswith(KERNEL))
        programs = Bt * a[0].shape[2] * (a[0].shape[3] // 64)  # (sequence, head, 64 value columns)
        waves = -(-programs // torch.cuda.get_device_properties(0).multi_processor_count)  # one an SM
        chunk = sweep / (T // 64) / waves
        print(f"probe {probe} B{Bt} T{T}: reverse sweep {sweep:7.1f} us, {chunk:.2f} us a chunk a program",
              flush=True)
        out.append(dict(probe=int(probe), batch=Bt, tokens=T, sweep_us=sweep, us_a_chunk=chunk, kernels_us=us))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # a probe's process: its rows to this file
    args = ap.parse_args()
    if args.child:
        json.dump(rows(), open(args.child, "w"))
        return
    results = probe_processes.rows_by_probe(__file__, "RECURSCAN_REVERSE_PROBE", ("0", "1", "2"), ())
    if args.out:
        probe_processes.save(args.out, results)


if __name__ == "__main__":
    main()
