"""Issue 21's row "GDP M = 2 B4 T4096 varlen without descriptors, eager" (target <= 0.60 ms): the
op derives the varlen descriptors itself (one host read of cu_seqlens, then numpy), against the
same call with descriptors built once; inference mode, eager, L2 flushed (``triton.testing.do_bench``).
With ``--prev DIR`` an older package (``recurscan_NAME`` in DIR, benchmarks/ab_prev.py) runs in the
same process, the two alternating.

    PYTHONPATH=$PWD python benchmarks/gpu_varlen_without_descriptors.py [--prev build/prev] --out benchmarks/results/gpu_varlen_without_descriptors.json
"""
from __future__ import annotations

import argparse
import importlib

import torch
import triton.testing as tt

from benchmarks import runner
from benchmarks.ab_prev import packages_with

TARGET_MS = 0.60


def inputs(T=4096, N=4, H=16, M=2, K=128):
    gen = torch.Generator(device="cuda").manual_seed(0)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    return dict(q=rn(1, T * N, H, K).bfloat16(), k=rn(1, T * N * M, H, K).bfloat16(),
                v=rn(1, T * N * M, H, K).bfloat16(), g=torch.nn.functional.logsigmoid(rn(1, T * N, H)),
                beta=torch.rand(1, T * N * M, H, device="cuda", generator=gen).bfloat16(), M=M,
                cu=torch.arange(N + 1, device="cuda", dtype=torch.int32) * T)


def measure(package: str, x: dict) -> dict:
    mod = importlib.import_module(package)
    desc = mod.build_chunk_descriptors(x["cu"], x["M"], device="cuda").as_kwargs()

    def call(**kw):
        return mod.chunk_gated_delta_product_varlen(x["q"], x["k"], x["v"], x["g"], x["beta"], x["M"], x["cu"],
                                                    use_qk_l2norm_in_kernel=True, output_final_state=True, **kw)

    out = {}
    with torch.inference_mode():
        for name, kw in (("with_descriptors_ms", desc), ("without_descriptors_ms", {})):
            call(**kw)
            torch.cuda.synchronize()
            out[name] = tt.do_bench(lambda: call(**kw), rep=300, return_mode="median")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prev", help="a folder holding another commit's package as recurscan_NAME")
    ap.add_argument("--out")
    args = ap.parse_args()
    packages = packages_with(args.prev)
    x = inputs()
    rows = []
    for round_ in range(2):  # alternating, so that neither package always runs on a warmer GPU
        for package in packages if round_ == 0 else packages[::-1]:
            r = dict(workload="gdp_m2_b4_t4096_h16_varlen", impl=package, round=round_, target_ms=TARGET_MS,
                     **measure(package, x))
            rows.append(r)
            print(f"{package:<16} round {round_}: with descriptors {r['with_descriptors_ms']:.3f} ms, without "
                  f"{r['without_descriptors_ms']:.3f} ms (target {TARGET_MS})", flush=True)
    if args.out:
        runner.save_rows(rows, args.out, torch.device("cuda"))


if __name__ == "__main__":
    main()
