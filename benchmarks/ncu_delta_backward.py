"""One forward + backward of the chunked delta rule inside an NVTX range, for Nsight Compute.

    ncu --clock-control none --nvtx --nvtx-include "profiled/" --set detailed -k regex:bwd_sweep \\
        --import-source yes -o prof python -m benchmarks.ncu_delta_backward gdn_b4_t4096_h16
    ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv   # stalls per instruction
    python -m benchmarks.ncu_stalls sass.csv

The argument is a workload of benchmarks/gpu_delta_train.py (the planner's launch shapes). A first
call outside the range compiles the kernels, so only the second call's launches are profiled.
"""
from __future__ import annotations

import sys

import torch

from benchmarks import registry
from benchmarks.gpu_delta_train import leaves, recurscan_step


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    w = registry.get(argv[0])
    t, x = leaves(w)
    do = torch.randn(w.batch, w.seqlen, w.value_heads, w.head_v, device="cuda", dtype=t["v"].dtype)

    def call():
        o = recurscan_step(w, x, t)
        torch.autograd.grad(o.reshape(do.shape), list(t.values()), do)

    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profiled")
    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
