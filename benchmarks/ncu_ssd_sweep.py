"""One SSD forward (benchmarks/gpu_gla.py's inputs: 80 heads x 64, one group, dstate 128) inside an
NVTX range, its sweep in a launch form of ``benchmarks/gpu_gla_sweep.py --sweep``, for Nsight Compute:
what a sweep program's chunk waits on (1.5 us a chunk whatever the form and the number of programs:
docs/kernels-gla-plan.md, "What bounds the forward sweep").

    ncu --clock-control none --nvtx --nvtx-include "profiled/" --set detailed --import-source yes \\
        -k regex:sweep -o prof python -m benchmarks.ncu_ssd_sweep 1 16384 64:4:2:tma:grp:gluon:ws
    ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv   # stalls per instruction
    python -m benchmarks.ncu_stalls sass.csv

Arguments: batch, tokens, the sweep's form. A first call outside the range compiles the kernels, so
only the second call's launches are profiled.
"""
from __future__ import annotations

import sys

import torch


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    Bt, T, form = int(argv[0]), int(argv[1]), argv[2]
    import recurscan
    from recurscan.plan import gla as plan_gla

    from .gpu_gla import ssd_inputs
    from .gpu_gla_sweep import parse_sweep

    shape = parse_sweep(form)
    plan_gla.gla_sweep_shape = lambda problem, device, gluon=True: shape
    a, kw = ssd_inputs(Bt, T)
    with torch.no_grad():
        recurscan.mamba_chunk_scan_combined(*a, **kw)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("profiled")
        recurscan.mamba_chunk_scan_combined(*a, **kw)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
