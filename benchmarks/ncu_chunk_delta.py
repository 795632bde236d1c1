"""One call of the chunked delta-rule kernels inside an NVTX range, for Nsight Compute.

    ncu --clock-control none --nvtx --nvtx-include "profiled/" --set detailed \\
        --import-source yes -o prof python -m benchmarks.ncu_chunk_delta gdn_b1_t16384_h16_hv32 64 4 2 3
    ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv   # stalls per instruction

Arguments: workload (benchmarks/registry.py), then the launch: BV, num_warps, num_stages, segments
and optionally v_product (1, default, or 0); or ``planned``: the public op as the planner launches it
(the fused prefill at HV64, the Gluon forms where planned), e.g.

    ncu --clock-control none --nvtx --nvtx-include "profiled/" --set detailed --import-source yes \
        -k regex:fused_prefill -o prof python -m benchmarks.ncu_chunk_delta gdn_b4_t8192_h16_hv64 planned

A first call outside the range compiles the kernels, so only the second call's launches are profiled.
``planned`` leaves the chained schedule (``plan.delta.GLUON_FORWARD_CHAINED``) out: Nsight Compute
runs each kernel alone, so a chained sweep would spin on ready flags its prep cannot raise until
its waits ran out, and the replay launch would redo it; the rows then run their phases.
"""
from __future__ import annotations

import sys

import torch


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0]
    if argv[1] == "planned":
        import dataclasses

        from recurscan.plan import delta as plan_delta

        from . import registry
        from .gpu_chunk_delta import _ours_loader

        plan_delta.GLUON_FORWARD_CHAINED = dataclasses.replace(plan_delta.GLUON_FORWARD_CHAINED, on=False)

        w = registry.get(name)
        x, fn = w.make_inputs("cuda", 0), _ours_loader(w)

        def call():
            return fn(x)
    else:
        BV, warps, stages, P = (int(a) for a in argv[1:5])
        v_product = bool(int(argv[5])) if len(argv) > 5 else True
        from recurscan.launch.delta import chunk_delta_fwd

        from .gpu_chunk_delta import kernel_inputs

        (q, k, v, g, beta), M, _, kw = kernel_inputs(name)

        def call():
            return chunk_delta_fwd(q, k, v, g, beta, num_householder=M, use_qk_l2norm_in_kernel=True,
                                   output_final_state=True, block_v=BV, num_warps=warps, num_stages=stages,
                                   segments=P, v_product=v_product, **kw)

    with torch.no_grad():
        call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("profiled")
        call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    print("profiled", *argv)


if __name__ == "__main__":
    main()
