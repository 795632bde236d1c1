"""Where the host time of one eager call goes: GDN decode of one request (issue 4) and chunked
GDN prefill of B1 T64 HV32 (issue 3), each op's pieces timed alone in a loop (no synchronisation
inside the loop; the GPU work of these calls is shorter than their host time).

    python -m benchmarks.host_breakdown --out benchmarks/results/host_breakdown.json
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from .gpu_decode import host_time


def per_call(fn, n=3000):
    """Host microseconds per call, back to back (gpu_decode's host_time)."""
    return host_time(fn, n)["host_per_call_s"] * 1e6


def decode_pieces():
    import recurscan
    from recurscan.ops import decode as D
    from recurscan.runtime import launch_key, launcher
    N, H, HV, K, V = 1, 16, 32, 128, 128
    dev = "cuda"
    q, k = torch.randn(N, 1, H, K, device=dev).bfloat16(), torch.randn(N, 1, H, K, device=dev).bfloat16()
    v = torch.randn(N, 1, HV, V, device=dev).bfloat16()
    g, beta = -torch.rand(N, 1, HV, device=dev), torch.rand(N, 1, HV, device=dev).bfloat16()
    state = torch.zeros(4, HV, K, V, device=dev)
    slots = torch.tensor([2], dtype=torch.int32, device=dev)

    def op():
        recurscan.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, state=state, state_indices=slots,
                                                         use_qk_l2norm_in_kernel=True)
    op()
    (prep,) = [p for p in D.PREPARED.values()]
    tensors = (q, k, v, g, beta, None, None, None, None, None, state, state, slots, None, None, None)
    keyed = (q, k, v, g, beta, None, None, state, slots, None, None)
    out = torch.empty(N, 1, HV, V, dtype=q.dtype, device=dev)
    tensors = tensors[:5] + (out,) + tensors[6:]
    values = tuple(out if t is None else t for t in tensors) + (K ** -0.5,)
    direct = prep.launches.direct
    res = {"driver path (cuLaunchKernel on a parameter block)": direct.driver is not None,
           "kernel parameters": None if direct.driver is None else len(direct.driver.storage)}
    if direct.driver is not None:
        res["parameters packed in one buffer (extra)"] = direct.driver.tail[1] is not None
        res["driver call alone"] = per_call(lambda: direct.driver(values))
        # the other parameter passing: a pointer array where the driver packs, else packed
        packed = direct.driver.tail[1] is not None
        real_layout = launcher._param_layout
        launcher._param_layout = (lambda function, count: None) if packed else real_layout
        try:
            other = launcher._DriverCall(direct.compiled, direct.grid, direct.template,
                                         dict(zip(direct.positions, direct.sources)))
        finally:
            launcher._param_layout = real_layout
        label = "packed buffer" if other.tail[1] is not None else "pointer array"
        res[f"driver call alone, {label}"] = per_call(lambda: other(values))
        res["driver error"] = launcher.DRIVER_ERROR
    else:
        try:
            launcher._DriverCall(direct.compiled, direct.grid, direct.template,
                                 dict(zip(direct.positions, direct.sources)))
        except Exception as exc:
            res["why no driver path"] = f"{type(exc).__name__}: {exc}"
    tiny = torch.zeros(1, device=dev)
    res["a torch launch for comparison (x.add_(1), 1 element)"] = per_call(lambda: tiny.add_(1))
    res.update({
        "op (eager, host per call)": per_call(op),
        "launch_key of 11 arguments": per_call(lambda: launch_key(keyed)),
        "output allocation (torch.empty)": per_call(lambda: torch.empty(N, 1, HV, V, dtype=q.dtype, device=dev)),
        "output allocation (torch.empty_like(v), the op's)": per_call(lambda: torch.empty_like(v)),
        "direct launch alone": per_call(lambda: prep.launches.direct(values)),
        "current stream lookup": per_call(launcher._current_stream),
    })
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            op()
    torch.cuda.current_stream().wait_stream(side)
    res["op (eager, host per call) after a CUDA-graph capture"] = per_call(op)
    return res


def prefill_pieces():
    import recurscan
    from recurscan.launch.delta import run_delta_launches
    from recurscan.ops import delta_rule as DR
    T, H, HV, K, V = 64, 16, 32, 128, 128
    dev = "cuda"
    q, k = torch.randn(1, T, H, K, device=dev).bfloat16(), torch.randn(1, T, H, K, device=dev).bfloat16()
    v = torch.randn(1, T, HV, V, device=dev).bfloat16()
    g, beta = -torch.rand(1, T, HV, device=dev), torch.rand(1, T, HV, device=dev).bfloat16()

    def op():
        recurscan.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    with torch.no_grad():
        op()
        (plan_,) = list(DR.LAUNCHES.values())
        inputs = (q, k, v, g, beta, None, None, None, None, None, None)
        res = {"op (eager, host per call)": per_call(op),
               "run_delta_launches alone (allocations + launches)":
                   per_call(lambda: run_delta_launches(plan_, inputs))}
        t = []
        for _ in range(200):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            op()
            torch.cuda.synchronize()
            t.append(time.perf_counter() - t0)
        res["op + synchronize, median"] = sorted(t)[len(t) // 2] * 1e6
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.host_breakdown")
    ap.add_argument("--out", default="benchmarks/results/host_breakdown.json")
    args = ap.parse_args(argv)
    res = {"unit": "us per call", "decode_1_request": decode_pieces(), "prefill_b1_t64_hv32": prefill_pieces()}
    print(json.dumps(res, indent=1))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
