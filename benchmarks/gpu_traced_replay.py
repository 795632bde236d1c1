"""Issue 22's replay row: CUDA-graph replay of a compiled prefill (``torch.compile(fullgraph=True)``:
the public op traced to its one scan node, ops/scan.py) against CUDA-graph replay of the same
prefill run eagerly, inference mode, bf16, one process. Rows: GDN B1 T16384 H16 HV32 K = V = 128
(the op alone, and in a layer: projections, the op, the out projection); Mamba2 B1 T16384 80 heads
x 64, dstate 128 (the op alone with D, dt_bias, softplus and z, and in the mixer); each compiled
output against the eager one (relative RMS). ``--profile ROW``: that row's GPU time by kernel,
eager and compiled (one call each, outside the graphs).

    PYTHONPATH=$PWD python benchmarks/gpu_traced_replay.py --out benchmarks/results/gpu_traced_replay.json
"""
from __future__ import annotations

import argparse

import torch
import triton.testing as tt

import recurscan
from benchmarks import runner
from tests.helpers.layers import GdnLayer, Mamba2Mixer

T = 16384


def gdn_op():
    gen = torch.Generator(device="cuda").manual_seed(0)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q, k, v = rn(1, T, 16, 128).bfloat16(), rn(1, T, 16, 128).bfloat16(), rn(1, T, 32, 128).bfloat16()
    g, beta = torch.nn.functional.logsigmoid(rn(1, T, 32) + 4), torch.rand(1, T, 32, device="cuda").bfloat16()

    def fn(q, k, v, g, beta):
        return recurscan.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,
                                                output_final_state=True)
    return fn, (q, k, v, g, beta)


def ssd_op():
    from benchmarks.gpu_gla import ssd_inputs
    (x, dt, A, B, C), kw = ssd_inputs(1, T)
    z = torch.randn_like(x)

    def fn(x, dt, A, B, C, z):
        return recurscan.mamba_chunk_scan_combined(x, dt, A, B, C, z=z, **kw)
    return fn, (x, dt, A, B, C, z)


def layer(make, dim):
    torch.manual_seed(0)
    model = make().cuda().bfloat16()
    return model, (torch.randn(1, T, dim, device="cuda").bfloat16(),)


ROWS = {
    "gdn op B1 T16384 H16 HV32": gdn_op,
    "gdn layer dim 2048, 16 heads x 128": lambda: layer(lambda: GdnLayer(dim=2048, heads=16, head_dim=128), 2048),
    "ssd op B1 T16384 80 x 64 dstate 128": ssd_op,
    "mamba2 mixer dim 2560, 80 heads x 64": lambda: layer(lambda: Mamba2Mixer(dim=2560, heads=80, head_dim=64,
                                                                              state=128), 2560),
}


def first(out):
    return out[0] if isinstance(out, tuple) else out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--profile", action="append", default=[], metavar="ROW",
                    help="also GPU time by kernel of this row's eager and compiled calls (repeatable)")
    ap.add_argument("--only", action="append", default=[], metavar="ROW", help="this row alone (repeatable)")
    args = ap.parse_args()
    rows = []
    for name, make in ROWS.items():
        if args.only and name not in args.only:
            continue
        fn, inputs = make()
        compiled = torch.compile(fn, fullgraph=True)
        times, outs = {}, {}
        try:
            with torch.inference_mode():
                for form, call in (("eager", fn), ("compiled", compiled)):
                    outs[form] = first(call(*inputs)).float()
                    torch.cuda.synchronize()
                    times[form] = tt.do_bench_cudagraph(lambda: call(*inputs), rep=200, return_mode="median")
        except Exception as exc:  # recorded, never hidden
            rows.append(dict(shape=name, status=f"{type(exc).__name__}: {exc}", measured=times))
            print(f"{name:<40} {rows[-1]['status'][:300]} (measured: {times})", flush=True)
            continue
        err = ((outs["compiled"] - outs["eager"]).pow(2).mean().sqrt() / outs["eager"].pow(2).mean().sqrt()).item()
        rows.append(dict(shape=name, eager_graph_ms=times["eager"], compiled_graph_ms=times["compiled"],
                         compiled_over_eager=times["compiled"] / times["eager"], rel_rms_compiled_vs_eager=err))
        if name in args.profile:
            from benchmarks.gpu_delta_train import kernel_times
            with torch.inference_mode():
                for form, call in (("eager", fn), ("compiled", compiled)):
                    print(f"{name}, {form}: GPU time by kernel", flush=True)
                    rows[-1][f"{form}_kernels_us"] = kernel_times(lambda: call(*inputs), top=16)
        print(f"{name:<40} eager graph {times['eager']:.3f} ms, compiled graph {times['compiled']:.3f} ms "
              f"({times['compiled'] / times['eager']:.2f}x), rel RMS {err:.1e}", flush=True)
    if args.out:
        runner.save_rows(rows, args.out, torch.device("cuda"))


if __name__ == "__main__":
    main()
