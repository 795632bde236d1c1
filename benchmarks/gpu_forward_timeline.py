"""Where a prefill's time goes, on the GPU's clock: one forward of a registered delta-rule workload
(graph-free, after warm-up) under torch's profiler, every kernel's start and end (us from the first
kernel's start) and stream, and the gaps in which no kernel of the call ran. For the phased rows it
shows how long the first phase's prep runs alone, each phase's sweep and the preps beside it.

    python -m benchmarks.gpu_forward_timeline --workload gdn_b1_t16384_h16_hv32 --out results/gpu_forward_timeline.json
"""
from __future__ import annotations

import argparse
import json

import torch

from benchmarks import registry
from benchmarks.gpu_chunk_delta import WORKLOADS, _ours_loader


def timeline(run) -> list[dict]:
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    t0 = events[0].time_range.start
    return [dict(kernel=e.name.split("(")[0][:48], stream=e.device_resource_id,
                 start_us=round(e.time_range.start - t0, 1), end_us=round(e.time_range.end - t0, 1)) for e in events]


def idle_gaps(spans: list[dict]) -> float:
    """Microseconds between the first start and the last end in which no kernel ran."""
    idle, reach = 0.0, spans[0]["start_us"]
    for s in spans:
        idle += max(0.0, s["start_us"] - reach)
        reach = max(reach, s["end_us"])
    return round(idle, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append", choices=WORKLOADS)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for name in args.workload or ["gdn_b1_t16384_h16_hv32"]:
        w = registry.get(name)
        x, fn = w.make_inputs("cuda", 0), _ours_loader(w)
        with torch.inference_mode():
            spans = timeline(lambda: fn(x))
        rows.append(dict(workload=name, spans=spans, idle_us=idle_gaps(spans)))
        print(name, f"span {spans[-1]['end_us']:.1f} us, idle {rows[-1]['idle_us']} us")
        for s in spans:
            print(f"  {s['kernel']:48s} stream {s['stream']:3d} {s['start_us']:8.1f} .. {s['end_us']:8.1f}"
                  f"  ({s['end_us'] - s['start_us']:.1f})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
