"""Same-process A/B of the chunk vectors' pre-pass (kernels/delta/chunk_vectors.py) against an older
package's, imported as ``recurscan_prev`` from ``--prev`` (benchmarks/ab_prev.py says how to make
it): graph replay of the kernel alone at the fused prefill's rows, and the largest difference of
their vectors (NaN where both are NaN counts as equal). ``--dinv``: both with the WY matrix's
diagonal inverses (DINV, as the fused launch plans them), and the largest difference of those too;
``--maxnreg N``, ``--num-warps N`` (repeatable): this package's kernel again under each register
cap and at each warp count. Every ``recurscan_*`` package in ``--prev`` is timed (a form each,
named by the suffix); differences are taken against ``recurscan_prev``.

    python benchmarks/ab_chunk_vectors.py --prev build/prev [--dinv] [--maxnreg 80] \
        --out benchmarks/results/ab_chunk_vectors_<card>_<commit>.json
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import torch

ROWS = [("B1 T16384 H16 HV32", 1, 16384, 16, 32), ("B4 T8192 H16 HV64", 4, 8192, 16, 64),
        ("B8 T4096 H16 HV64", 8, 4096, 16, 64), ("B4 T4096 H16 HV16", 4, 4096, 16, 16)]


def pass_inputs(B, T, H, HV):
    """q, k [B, T, H, 128] bf16, g (log decays) and beta [B, T, HV] on the GPU, seeded."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(B, T, H, 128, device="cuda", generator=gen).bfloat16() for _ in range(2))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, device="cuda", generator=gen) + 3)
    beta = torch.sigmoid(torch.randn(B, T, HV, device="cuda", generator=gen)).bfloat16()
    return q, k, g, beta


def main():
    import triton.testing as tt
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prev", required=True)
    ap.add_argument("--dinv", action="store_true")
    ap.add_argument("--maxnreg", type=int, action="append", default=[])
    ap.add_argument("--num-warps", type=int, action="append", default=[])
    ap.add_argument("--out")
    args = ap.parse_args()
    import triton.language as tl
    sys.path.insert(0, args.prev)
    olds = sorted(p for p in os.listdir(args.prev) if p.startswith("recurscan_"))
    olds.insert(0, olds.pop(olds.index("recurscan_prev")))
    now = importlib.import_module("recurscan.kernels.delta.chunk_vectors")
    forms = {p[len("recurscan_"):]: (importlib.import_module(f"{p}.kernels.delta.chunk_vectors"), {}) for p in olds}
    forms.update({"now": (now, {}), **{f"now, maxnreg {r}": (now, dict(maxnreg=r)) for r in args.maxnreg},
                  **{f"now, {w} warps": (now, dict(num_warps=w)) for w in args.num_warps}})
    extra = lambda dinv: dict(DINV=True, dinv=dinv, KK_DT=tl.bfloat16) if args.dinv else {}  # noqa: E731
    rows = []
    for name, B, T, H, HV in ROWS:
        q, k, g, beta = pass_inputs(B, T, H, HV)
        out = {}
        for form, (mod, options) in forms.items():
            vec = torch.full(((B * T) // 64 + B, HV, 4, 64), -7.0, device="cuda")
            dinv = torch.full(((B * T) // 64 + B, HV, 64, 16), -7.0, device="cuda", dtype=torch.float16)
            grid = getattr(mod, "chunk_vectors_grid", lambda n, h: (n, h))(B * T // 64, H)  # older: (chunks, H)
            run = lambda: mod.chunk_vectors_kernel[grid](  # noqa: E731
                q, k, g, beta, vec, q, q, T, 0, H=H, HV=HV, K=128, BT=64, IS_VARLEN=False, HAS_G=True,
                **extra(dinv), **(dict(num_warps=4) | options))
            run()
            torch.cuda.synchronize()
            out[form] = (vec, dinv)
            ms = tt.do_bench_cudagraph(run, rep=200)
            moved = 2 * B * T * H * 128 * 2 + vec.numel() * 4 + (dinv.numel() * 2 if args.dinv else 0)
            row = dict(workload=name, form=form, dinv=args.dinv, ms=ms, gb_per_s=moved / ms / 1e6)
            row["max_abs_diff_vs_prev"] = (vec - out["prev"][0]).nan_to_num(0.0).abs().max().item()
            if args.dinv:
                row["dinv_max_abs_diff_vs_prev"] = (dinv.float() - out["prev"][1].float()).abs().max().item()
            rows.append(row)
        print(name, {r["form"]: (round(r["ms"] * 1e3, 1), r["max_abs_diff_vs_prev"], r.get("dinv_max_abs_diff_vs_prev"))
                     for r in rows[-len(forms):]}, flush=True)
    if args.out:
        json.dump(rows, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
