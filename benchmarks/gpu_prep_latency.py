"""How long one program of the delta-rule prep takes, alone on an SM and sharing it (issue 21).

A fused, warp-specialised forward (the prep of chunk c + 1 on warps of its own while the chain
runs chunk c, FlashInfer's SM90 kernel's structure: docs/kernels-chunk-delta.md) reaches the HV64
row only if one (chunk, value head)'s prep takes no longer than a chain step (~2.6 us at BV 128).
This measures the Triton prep's program latency as it is: GDN forwards (inference mode, bf16,
l2norm, K = V = 128, H = HV = 1, ``backend="triton"``: the chunked kernels, not the streaming one
the planner would take at one chunk a sequence) of B sequences of one chunk each, so that the prep's grid is B
programs, with B = SMs x {1, 2, 3} (one wave: 1, 2 or 3 programs an SM, all resident) and
SMs x 12 (four waves at three an SM). Each row: the prep kernel's GPU time (torch.profiler, the
median of five calls) and that time over the waves: one program's latency at that sharing.

    python benchmarks/gpu_prep_latency.py --out benchmarks/results/gpu_prep_latency.json
"""
from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.runner import save_rows

PREP = "chunk_delta_prep_kernel"


def prep_us(fn) -> float:
    """The prep kernel's GPU time in one call of ``fn`` (us), by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.device_time for e in prof.events() if e.device_type.name == "CUDA" and e.name.startswith(PREP))


def main():
    import recurscan
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows = []
    for per_sm, waves in ((1, 1), (2, 1), (3, 1), (3, 4)):
        B = sms * per_sm * waves
        gen = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(B, 64, 1, 128, device=dev, generator=gen).bfloat16() for _ in range(3))
        g = -torch.rand(B, 64, 1, device=dev, generator=gen) * 0.1
        beta = torch.rand(B, 64, 1, device=dev, generator=gen).bfloat16()

        def fn():
            with torch.inference_mode():
                recurscan.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, backend="triton")

        fn()
        torch.cuda.synchronize()
        us = statistics.median(prep_us(fn) for _ in range(5))
        row = dict(programs=B, programs_per_sm=per_sm, waves=waves, prep_us=us, program_latency_us=us / waves,
                   sm_us_per_program=us * sms / B)
        print(f"{B:6d} programs ({per_sm} an SM, {waves} wave(s)): prep {us:7.1f} us, a program's latency "
              f"{us / waves:6.2f} us, SM-time a program {us * sms / B:5.2f} us", flush=True)
        rows.append(row)
    if args.out:
        save_rows(rows, args.out, dev)


if __name__ == "__main__":
    main()
