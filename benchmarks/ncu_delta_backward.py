"""One forward + backward of the chunked delta rule after a first one that compiles, for Nsight
Compute: the second call's launches are the ones to profile.

    ncu --clock-control none --set detailed --import-source yes -k regex:bwd_sweep --launch-skip 1 \
        --launch-count 1 -o prof python -m benchmarks.ncu_delta_backward gdn_b4_t4096_h16
    ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv   # stalls per instruction
    python -m benchmarks.ncu_stalls sass.csv

A second argument names the Gluon twins to run (``benchmarks/gpu_delta_train.py --gluon``'s form,
e.g. ``gluon_sweep+gluon_dqdk``; default: as planned).

The backward's kernels run on the autograd engine's thread, so an NVTX range pushed here does not
cover them (``--nvtx-include`` would find only the forward's); ``--launch-skip 1`` skips the first
call's launch of the kernel instead. The argument is a workload of benchmarks/gpu_delta_train.py
(the planner's launch shapes).
"""
from __future__ import annotations

import sys

import torch

from benchmarks import registry
from benchmarks.gpu_delta_train import step_calls


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 1:
        from benchmarks.gpu_delta_train import set_gluon
        set_gluon(argv[1])
    call = step_calls(registry.get(argv[0]))[0]
    for _ in range(2):
        call()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
