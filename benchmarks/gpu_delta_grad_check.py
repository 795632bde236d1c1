"""Every gradient of the Triton backward against the float64 chunkwise reference, on the GPU, over
cases and the backward's launch shapes: relative RMS per gradient, one line per (case, shape).
The correctness sweep behind issue 19's "right on Triton 3.6 on Hopper" (tests/gpu holds the
assertions; this prints the numbers, and runs launch shapes the planner does not choose).

    CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=$PWD python benchmarks/gpu_delta_grad_check.py [--shape BV:sweep:grads ...]
"""
from __future__ import annotations

import argparse
import json

import torch

from recurscan.descriptors import build_chunk_descriptors
from recurscan.launch.delta_backward import chunk_delta_bwd, chunk_delta_product_bwd
from benchmarks.gpu_delta_train import parse_backward_shape
from recurscan.reference.delta_backward import (gated_delta_product_chunked_backward,
                                                gated_delta_rule_chunked_backward)

NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
CASES = {
    "dense B2 T1000 H4 HV8": dict(B=2, T=1000, H=4, HV=8, cu=None, M=1),
    "dense B1 T4096 H16 HV16": dict(B=1, T=4096, H=16, HV=16, cu=None, M=1),
    "varlen 1/299/700 H4 HV8": dict(B=1, T=1000, H=4, HV=8, cu=[0, 1, 300, 1000], M=1),
    "GDP M2 varlen 1/249/350 H2 HV4": dict(B=1, T=600, H=2, HV=4, cu=[0, 1, 250, 600], M=2),
}


def rel(a, b):
    return ((a.double() - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def run(case, shape, dtype=torch.bfloat16):
    c = CASES[case]
    gen = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, HV, M, K = c["B"], c["T"], c["H"], c["HV"], c["M"], 128
    cu = None if c["cu"] is None else torch.tensor(c["cu"], device="cuda")
    N = B if cu is None else len(c["cu"]) - 1
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q, k, v = rn(B, T, H, K).to(dtype), rn(B, T * M, H, K).to(dtype), rn(B, T * M, HV, K).to(dtype)
    g = torch.nn.functional.logsigmoid(rn(B, T, HV) + 3)
    beta = torch.rand(B, T * M, HV, device="cuda", generator=gen).to(dtype)
    h0, do, dht = rn(N, HV, K, K) * 0.1, rn(B, T, HV, K).to(dtype), rn(N, HV, K, K)
    args = dict(initial_state=h0, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    d64 = lambda x: x.double()  # noqa: E731
    if M == 1:
        desc = {} if cu is None else (lambda d: dict(chunk_indices=d.chunk_indices, chunk_offsets=d.chunk_offsets))(
            build_chunk_descriptors(cu, device="cuda"))
        got = chunk_delta_bwd(q, k, v, g, beta, do, dht, backward_shape=shape, **args, **desc)
        want = gated_delta_rule_chunked_backward(*map(d64, (q, k, v, g, beta, do, dht)),
                                                 **dict(args, initial_state=d64(h0)))
    else:
        got = chunk_delta_product_bwd(q, k, v, g, beta, M, do, dht, backward_shape=shape, **args)
        want = gated_delta_product_chunked_backward(*map(d64, (q, k, v, g, beta)), M, d64(do), d64(dht),
                                                    **dict(args, initial_state=d64(h0)))
    torch.cuda.synchronize()
    return {n: (rel(a, b) if torch.isfinite(a).all() else float("nan")) for n, a, b in zip(NAMES, got, want)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", help="a backward launch shape as gpu_delta_train.py's "
                                                    "--backward-shape takes it (repeatable)")
    ap.add_argument("--case", action="append")
    ap.add_argument("--out")
    args = ap.parse_args()
    shapes = [("planned", None)] + [(s, parse_backward_shape(s)) for s in args.shape or []]
    rows = []
    for case in args.case or CASES:
        for tag, shape in shapes:
            try:
                r = run(case, shape)
                print(f"{case:<34} {tag:<10} " + "  ".join(f"{n} {x:.1e}" for n, x in r.items()), flush=True)
            except Exception as exc:  # recorded: an illegal address ends the process anyway
                r = dict(error=f"{type(exc).__name__}: {exc}")
                print(f"{case:<34} {tag:<10} {r['error']}", flush=True)
            rows.append(dict(case=case, shape=tag, **r))
    if args.out:
        json.dump(dict(torch=torch.__version__, triton=__import__("triton").__version__,
                       device=torch.cuda.get_device_name(), rows=rows), open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
