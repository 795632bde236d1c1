"""The scalar-decay GLA forward on the GPU (issue 20's first kernel): ``chunk_simple_gla`` through
recurscan's Triton kernel, recurscan's PyTorch form, and fla-core's ``chunk_simple_gla`` where it
imports, in one process, eager with the L2 flushed (``triton.testing.do_bench``), bf16; each
output against the float32 PyTorch form (relative RMS). Two shapes: fla's (B4 T4096 H16 K=V=128)
and SSD's core (B1 T16384, one key group, 80 value heads x 64, K = dstate 128, scale 1).

    PYTHONPATH=$PWD python benchmarks/gpu_gla.py --out benchmarks/results/gpu_gla.json

And Mamba2 SSD itself (``mamba_chunk_scan_combined``: B1 T16384 and B4 T4096, 80 heads x 64,
dstate 128, one group, chunk 256, D, dt_softplus), recurscan's Triton path against mamba_ssm's
(``MAMBA_SSM_SRC``: an unpacked mamba-ssm 2.3.2.post1 source tree, benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import json

import torch
import triton.testing as tt

import recurscan

SHAPES = {"simple_gla_b4_t4096_h16": dict(B=4, T=4096, H=16, HV=16, K=128, V=128, scale=None),
          "ssd_core_b1_t16384_hv80": dict(B=1, T=16384, H=1, HV=80, K=128, V=64, scale=1.0)}


def inputs(s, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rn = lambda *sh: torch.randn(*sh, device="cuda", generator=gen)  # noqa: E731
    q, k = rn(s["B"], s["T"], s["H"], s["K"]).bfloat16(), rn(s["B"], s["T"], s["H"], s["K"]).bfloat16()
    v = rn(s["B"], s["T"], s["HV"], s["V"]).bfloat16()
    g = torch.nn.functional.logsigmoid(rn(s["B"], s["T"], s["HV"]) + 4)
    return q, k, v, g


SSD_SHAPES = {"ssd_b1_t16384_h80": (1, 16384), "ssd_b4_t4096_h80": (4, 4096)}


def time_impls(name, impls, want):
    """One row per implementation: its time (eager, L2 flushed) and its relative RMS error against
    ``want``; an implementation that raises is recorded, never hidden."""
    rows = []
    for impl, fn in impls.items():
        try:
            with torch.no_grad():
                out = fn()
                err = ((out.float() - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()
                ms = tt.do_bench(fn, rep=200)
            rows.append(dict(shape=name, impl=impl, ms=ms, rel_rms_vs_torch_fp32=err))
            print(f"{name:<26} {impl:<17} {ms:8.3f} ms  rel RMS {err:.1e}", flush=True)
        except Exception as exc:  # recorded, never hidden
            rows.append(dict(shape=name, impl=impl, status=f"{type(exc).__name__}: {exc}"))
            print(f"{name:<26} {impl:<17} {rows[-1]['status']}", flush=True)
    return rows


def ssd_rows():
    from benchmarks.runner import NotInstalled, load_mamba
    rows = []
    for name, (Bt, T) in SSD_SHAPES.items():
        gen = torch.Generator(device="cuda").manual_seed(1)
        rn = lambda *sh: torch.randn(*sh, device="cuda", generator=gen)  # noqa: E731
        H, P, G, N = 80, 64, 1, 128
        x, dt = rn(Bt, T, H, P).bfloat16(), rn(Bt, T, H)
        A, D, dt_bias = -torch.rand(H, device="cuda", generator=gen), rn(H), rn(H)
        B, C = rn(Bt, T, G, N).bfloat16(), rn(Bt, T, G, N).bfloat16()
        args = (x, dt, A, B, C)
        kw = dict(chunk_size=256, D=D, dt_bias=dt_bias, dt_softplus=True)
        want = recurscan.mamba_chunk_scan_combined(*(t.float() for t in args), **kw, backend="torch")
        impls = {"recurscan triton": lambda: recurscan.mamba_chunk_scan_combined(*args, **kw, backend="triton")}
        try:
            mamba = load_mamba("ssd_combined", "mamba_chunk_scan_combined")
            impls["mamba_ssm"] = lambda: mamba(*args, **kw)
        except NotInstalled as exc:
            rows.append(dict(shape=name, impl="mamba_ssm", status=f"not installed: {exc}"))
        rows += time_impls(name, impls, want)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for name, s in SHAPES.items():
        q, k, v, g = inputs(s)
        want = recurscan.chunk_simple_gla(*(x.float() for x in (q, k, v)), g, scale=s["scale"], backend="torch")[0]
        impls = {"recurscan triton": lambda: recurscan.chunk_simple_gla(q, k, v, g, scale=s["scale"], backend="triton")[0],
                 "recurscan torch": lambda: recurscan.chunk_simple_gla(q, k, v, g, scale=s["scale"], backend="torch")[0]}
        try:
            from fla.ops.simple_gla import chunk_simple_gla as fla_gla
            if s["H"] == s["HV"]:
                impls["fla"] = lambda: fla_gla(q, k, v, g, scale=s["scale"])[0]
        except Exception as exc:  # recorded, never hidden
            rows.append(dict(shape=name, impl="fla", status=f"not installed: {exc}"))
        rows += time_impls(name, impls, want)
    rows += ssd_rows()
    if args.out:
        json.dump(dict(torch=torch.__version__, device=torch.cuda.get_device_name(), rows=rows), open(args.out, "w"),
                  indent=1)


if __name__ == "__main__":
    main()
