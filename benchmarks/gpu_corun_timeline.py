"""When the backward's recompute and reverse sweep run, on the GPU's clock: one GDN or GDP forward +
backward under torch's profiler with ``plan.delta.CORESIDENT_RECOMPUTE`` off and on, and each
kernel's start and end (us from the reverse sweep's start), its stream, for the recompute's sweep
and the reverse sweep. Overlapping spans mean the two shared the GPU; a recompute starting at the
reverse sweep's end means it waited for SMs.

    python benchmarks/gpu_corun_timeline.py --workload gdn_b4_t4096_h16 --out results/gpu_corun_timeline.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import torch

import recurscan
from recurscan.plan import delta as plan_delta
from recurscan.runtime.cache import clear_caches

SHAPES = {"gdn_b4_t4096_h16": (1, 4, 4096, 16), "gdp_m2_b4_t2048_h16": (2, 4, 2048, 16)}  # (M, B, T tokens, H)
WATCHED = ("gluon_bwd_sweep_kernel", "chunk_delta_sweep_kernel")


def step(M, B, T, H):
    gen = torch.Generator(device="cuda").manual_seed(0)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    x = [rn(B, T, H, 128).bfloat16(), rn(B, T * M, H, 128).bfloat16(), rn(B, T * M, H, 128).bfloat16(),
         torch.nn.functional.logsigmoid(rn(B, T, H) + 3), torch.rand(B, T * M, H, device="cuda").bfloat16()]
    leaves = [t.requires_grad_() for t in x]
    do = rn(B, T, H, 128).bfloat16()

    def run():
        o, _ = (recurscan.chunk_gated_delta_rule(*leaves, use_qk_l2norm_in_kernel=True) if M == 1 else
                recurscan.chunk_gated_delta_product(*leaves, M, use_qk_l2norm_in_kernel=True))
        return torch.autograd.grad(o, leaves, do)
    return run


def timeline(run) -> list[dict]:
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
              and e.name.startswith(WATCHED)]
    events.sort(key=lambda e: e.time_range.start)
    t0 = next(e.time_range.start for e in events if e.name.startswith("gluon_bwd_sweep"))
    return [dict(kernel=e.name.split("(")[0], stream=getattr(e, "device_resource_id", None),
                 start_us=round(e.time_range.start - t0, 1), end_us=round(e.time_range.end - t0, 1)) for e in events]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append", choices=sorted(SHAPES))
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for name in args.workload or sorted(SHAPES):
        for on in (False, True):
            clear_caches()
            plan_delta.CORESIDENT_RECOMPUTE = dataclasses.replace(plan_delta.CORESIDENT_RECOMPUTE, on=on)
            spans = timeline(step(*SHAPES[name]))
            rows.append(dict(workload=name, coresident=on, spans=spans))
            print(name, "coresident" if on else "serial")
            for s in spans:
                print(f"  {s['kernel']:28s} stream {s['stream']}  {s['start_us']:8.1f} .. {s['end_us']:8.1f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
