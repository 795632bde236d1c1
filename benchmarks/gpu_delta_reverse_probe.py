"""What bounds the delta rule's reverse sweep (the backward's Gluon twin, kernels/gluon/
delta_backward_sweep.py): its GPU time in issue 19's three training rows (GDN B4 T4096 H=HV=16, B1
T16384 H16 HV32, GDP M = 2 B4 T4096 H16; forward + backward as planned), as planned and under its
timing probes, each in a process of its own (RECURSCAN_DELTA_REVERSE_PROBE: 1 the loads and the
chain alone, without dO^T aqk, (lam rq o dO^T) Q or the stores of dS, dY and dv; 3 all but those
stores; 6 their staging buffers written, no store issued). Per row:
the reverse sweep's microseconds and a chunk's microseconds a program (the sweep over the
sequence's chunks, on the expanded stream for GDP, and its waves of one program an SM). If the
chain alone takes much less than the whole, the rest on warpgroups of its own would pay, as it did
for the GLA engine's reverse sweep (benchmarks/gpu_gla_reverse_probe.py). Probes 1, 3 and 6
compute wrong gradients.

    PYTHONPATH=$PWD python benchmarks/gpu_delta_reverse_probe.py --out benchmarks/results/gpu_delta_reverse_probe_<commit>.json
"""
from __future__ import annotations

import os

from benchmarks import probe_processes

#: Issue 19's training rows (benchmarks/registry.py).
WORKLOADS = ("gdn_b4_t4096_h16", "gdn_b1_t16384_h16_hv32", "gdp_m2_b4_t4096_h16")
KERNEL = "gluon_bwd_sweep_kernel"
PROBES = ("0", "1", "3", "6")


def rows(workloads=WORKLOADS) -> list:
    """This process's rows (its RECURSCAN_DELTA_REVERSE_PROBE as set when it started)."""
    import torch

    from benchmarks import registry
    from benchmarks.gpu_delta_train import kernel_times, step_calls
    probe = os.environ.get("RECURSCAN_DELTA_REVERSE_PROBE", "0")
    out = []
    for name in workloads:
        w = registry.get(name)
        fwd_bwd, _, _, _ = step_calls(w)
        us = kernel_times(fwd_bwd)
        sweep = sum(t for kernel, t in us.items() if kernel.startswith(KERNEL))
        programs = w.num_sequences * w.value_heads * (w.head_v // 64)  # (sequence, value head, 64 columns)
        waves = -(-programs // torch.cuda.get_device_properties(0).multi_processor_count)  # one an SM
        chunks = -(-w.seqlens[0] * w.num_householder // 64)  # a sequence's (the rows' are of one length)
        chunk = sweep / chunks / waves
        print(f"probe {probe} {name}: reverse sweep {sweep:7.1f} us, {chunk:.2f} us a chunk a program", flush=True)
        out.append(dict(probe=int(probe), workload=name, sweep_us=sweep, us_a_chunk=chunk, kernels_us=us))
    return out


if __name__ == "__main__":
    probe_processes.main(__file__, __doc__, "RECURSCAN_DELTA_REVERSE_PROBE", PROBES, WORKLOADS, rows)
