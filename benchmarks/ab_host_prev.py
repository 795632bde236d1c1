"""Host time a call, recurscan against an older package as ``recurscan_prev`` (build/prev, see
ab_prev.py), same process, alternating: calls small enough that the host is the bound (one decode
request; a 64-token prefill). Per call: N calls back to back without a sync, then one sync; median
of the rounds.

    PYTHONPATH=$PWD python benchmarks/ab_host_prev.py [--prev build/prev] [--out FILE]
"""
import argparse
import json
import statistics
import sys
import time

import torch

import recurscan


def cases(mod):
    gen = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s, dt=torch.bfloat16: torch.randn(*s, device="cuda", generator=gen).to(dt)  # noqa: E731
    H, HV, K = 16, 32, 128
    cache = torch.zeros(8, HV, K, K, device="cuda")
    slots = torch.tensor([3], device="cuda")
    q, k, v = r(1, 1, H, K), r(1, 1, H, K), r(1, 1, HV, K)
    g, beta = -torch.rand(1, 1, HV, device="cuda"), torch.rand(1, 1, HV, device="cuda").bfloat16()
    qp, kp, vp = r(1, 64, H, K), r(1, 64, H, K), r(1, 64, HV, K)
    gp, bp = -torch.rand(1, 64, HV, device="cuda"), torch.rand(1, 64, HV, device="cuda").bfloat16()
    Hs, P, N = 80, 64, 128
    ssd_cache = torch.zeros(4, Hs, P, N, device="cuda")
    x, dt = r(1, Hs, P), torch.rand(1, Hs, P, device="cuda").bfloat16()
    A = -torch.rand(Hs, device="cuda")[:, None, None].expand(Hs, P, N)
    B, C = r(1, 1, N), r(1, 1, N)
    return {
        "gdn decode, 1 request": lambda: mod.fused_recurrent_gated_delta_rule_update(
            q, k, v, g, beta, state=cache, state_indices=slots, use_qk_l2norm_in_kernel=True),
        "gdn prefill, 64 tokens": lambda: mod.chunk_gated_delta_rule(
            qp, kp, vp, gp, bp, use_qk_l2norm_in_kernel=True, output_final_state=True),
        "ssd decode, 1 request": lambda: mod.selective_state_update(ssd_cache, x, dt, A, B, C,
                                                                     state_batch_indices=slots % 4),
    }


def per_call_us(fn, calls=2000):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prev", default="build/prev", help="folder holding the older package as recurscan_prev/")
    args = ap.parse_args()
    sys.path.insert(0, args.prev)
    import recurscan_prev
    mods = {"ours": recurscan, "prev": recurscan_prev}
    fns = {name: cases(mod) for name, mod in mods.items()}
    rows = []
    with torch.no_grad():
        for case in fns["ours"]:
            times = {"ours": [], "prev": []}
            for who in mods:  # warm: compile and plan
                for _ in range(3):
                    fns[who][case]()
            for i in range(args.rounds):
                for who in (("ours", "prev") if i % 2 == 0 else ("prev", "ours")):
                    times[who].append(per_call_us(fns[who][case]))
            row = dict(case=case, ours_us=statistics.median(times["ours"]), prev_us=statistics.median(times["prev"]),
                       rounds=times)
            rows.append(row)
            print(f"{case:<26} ours {row['ours_us']:.2f} us  prev {row['prev_us']:.2f} us a call", flush=True)
    if args.out:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, prev=args.prev, rows=rows),
                  open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
