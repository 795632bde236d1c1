"""How the fused prefill's chunk period follows its prep's path (kernels/gluon/delta_fused.py):
the fused kernel's GPU time in issue 21's fused rows (GDN B4 T8192 H16 HV64, the varlen batch of
16 sequences at HV32; a forward as planned), as planned and under its timing probes, each in a
process of its own (RECURSCAN_FUSED_PROBE: 1 the inverse's diagonal blocks neither inverted nor
copied; 2 no inverse; 3 no aqk; 4 no prep work; 5 no chain work). Per row: the fused kernel's
microseconds and, dense, a chunk's microseconds a program (its waves of one program an SM). The
prep's loop by probe, offline (sm_90), with the planned diagonal blocks from the pass (d5f3551's
prep): 736 instructions (0 and 5), 854 (1: A masked, G beta's fp16 copy), 607 (2), 555 (3); with
the prep inverting them itself (1280 at 0) the probes 0-4 were run on an H100 at
35f37ce (results/gpu_fused_probe_h100_35f37ce.json): 4.02 us a chunk at HV64 as planned then, 3.44
(1), 3.17 (2), 3.84 (3), 2.76 (4). Probes 1-5 compute wrong outputs.

    PYTHONPATH=$PWD python benchmarks/gpu_fused_probe.py --out benchmarks/results/gpu_fused_probe_<card>_<commit>.json
"""
from __future__ import annotations

import os

from benchmarks import probe_processes

#: Issue 21's rows that run the fused kernel (benchmarks/registry.py).
WORKLOADS = ("gdn_b4_t8192_h16_hv64", "gdn_varlen16_32976_hv32")
KERNEL = "gluon_fused_prefill_kernel"
PROBES = ("0", "1", "2", "3", "4", "5")


def rows(workloads=WORKLOADS) -> list:
    """This process's rows (its RECURSCAN_FUSED_PROBE as set when it started)."""
    import torch

    from benchmarks import registry, runner
    from benchmarks.gpu_delta_train import kernel_times
    probe = os.environ.get("RECURSCAN_FUSED_PROBE", "0")
    out = []
    for name in workloads:
        w = registry.get(name)
        op, x = runner._ours_delta(w), w.make_inputs("cuda")
        us = kernel_times(lambda: op(x))
        fused = sum(t for kernel, t in us.items() if kernel.startswith(KERNEL))
        if not fused:
            raise SystemExit(f"{name}: the fused kernel did not run ({sorted(us)})")
        row = dict(probe=int(probe), workload=name, fused_us=fused, kernels_us=us)
        if len(set(w.seqlens)) == 1:  # dense: every program walks the same chunks
            waves = -(-w.num_sequences * w.value_heads // torch.cuda.get_device_properties(0).multi_processor_count)
            row["us_a_chunk"] = fused / (-(-w.seqlens[0] // 64)) / waves
        print(f"probe {probe} {name}: fused kernel {fused:7.1f} us"
              + (f", {row['us_a_chunk']:.2f} us a chunk a program" if "us_a_chunk" in row else ""), flush=True)
        out.append(row)
    return out


if __name__ == "__main__":
    probe_processes.main(__file__, __doc__, "RECURSCAN_FUSED_PROBE", PROBES, WORKLOADS, rows)
