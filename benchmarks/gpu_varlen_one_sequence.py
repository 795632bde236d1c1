"""Issue 21's rows "one varlen sequence, T16384 / T65536, eager: within 5% of the dense row": GDN
B1 H16 HV32 K=V=128 bf16, l2norm in the kernel, inference mode, eager with the L2 flushed
(``triton.testing.do_bench``). The same tensors go in twice: dense (B = 1), and as one varlen
sequence (``cu_seqlens = [0, T]``, descriptors built once outside timing, as a serving engine
does per step). With ``--prev DIR`` an older package (``recurscan_NAME`` in DIR,
benchmarks/ab_prev.py) runs in the same process, the packages alternating; ``--fla`` adds fla-core's
varlen call where it imports.

    PYTHONPATH=$PWD python benchmarks/gpu_varlen_one_sequence.py [--prev build/prev] [--fla] --out benchmarks/results/gpu_varlen_one_sequence.json
"""
from __future__ import annotations

import argparse
import importlib

import torch
import triton.testing as tt

from benchmarks import runner
from benchmarks.ab_prev import packages_with

TOLERANCE = 0.05  # the varlen row may be at most 5% slower than the dense one


def inputs(T: int, H=16, HV=32, K=128):
    gen = torch.Generator(device="cuda").manual_seed(0)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    return dict(q=rn(1, T, H, K).bfloat16(), k=rn(1, T, H, K).bfloat16(), v=rn(1, T, HV, K).bfloat16(),
                g=torch.nn.functional.logsigmoid(rn(1, T, HV)),
                beta=torch.rand(1, T, HV, device="cuda", generator=gen).bfloat16(),
                cu=torch.tensor([0, T], device="cuda", dtype=torch.int32))


def measure(package: str, x: dict) -> dict:
    mod = importlib.import_module(package)
    built = mod.build_chunk_descriptors(x["cu"], 1, device="cuda")
    desc = dict(chunk_indices=built.chunk_indices, chunk_offsets=built.chunk_offsets)  # GDN's descriptors

    def call(**kw):
        return mod.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], use_qk_l2norm_in_kernel=True,
                                          output_final_state=True, **kw)

    out = {}
    with torch.inference_mode():
        for name, kw in (("dense_ms", {}), ("varlen_ms", dict(cu_seqlens=x["cu"], **desc))):
            o = call(**kw)[0]
            torch.cuda.synchronize()
            out[name] = tt.do_bench(lambda: call(**kw), rep=300, return_mode="median")
            out.setdefault("outputs", []).append(o.float())
    dense, varlen = out.pop("outputs")
    out["max_abs_difference"] = (dense - varlen).abs().max().item()
    return out


def measure_fla(x: dict) -> dict | None:
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    with torch.inference_mode():
        call = lambda: chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=x["cu"],  # noqa: E731
                                              use_qk_l2norm_in_kernel=True, output_final_state=True)
        call()
        torch.cuda.synchronize()
        return dict(varlen_ms=tt.do_bench(call, rep=300, return_mode="median"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prev", help="a folder holding another commit's package as recurscan_NAME")
    ap.add_argument("--fla", action="store_true")
    ap.add_argument("--tokens", type=int, action="append", help="default: 16384 and 65536")
    ap.add_argument("--out")
    ap.add_argument("--plan", action="append", default=[], metavar="NAME=VALUE",
                    help="set recurscan.plan.delta.NAME (a Python literal) before the first call (runner.set_plan)")
    args = ap.parse_args()
    runner.set_plan(args.plan)
    packages = packages_with(args.prev)
    rows = []
    for T in args.tokens or [16384, 65536]:
        x = inputs(T)
        workload = f"gdn_b1_t{T}_h16_hv32_one_varlen_sequence"
        for round_ in range(2):  # alternating, so that neither package always runs on a warmer GPU
            for package in packages if round_ == 0 else packages[::-1]:
                r = measure(package, x)
                ratio = r["varlen_ms"] / r["dense_ms"]
                rows.append(dict(workload=workload, impl=package, round=round_, varlen_over_dense=ratio,
                                 within_target=ratio <= 1 + TOLERANCE, **r))
                print(f"T{T:<6} {package:<16} round {round_}: dense {r['dense_ms']:.3f} ms, one varlen sequence "
                      f"{r['varlen_ms']:.3f} ms ({ratio:.3f}x; target <= {1 + TOLERANCE:.2f}x), "
                      f"max |dense - varlen| {r['max_abs_difference']:.2e}", flush=True)
        if args.fla:
            r = measure_fla(x)
            if r is not None:
                rows.append(dict(workload=workload, impl="fla", **r))
                print(f"T{T:<6} fla              varlen {r['varlen_ms']:.3f} ms", flush=True)
        del x
        torch.cuda.empty_cache()
    if args.out:
        runner.save_rows(rows, args.out, torch.device("cuda"))


if __name__ == "__main__":
    main()
