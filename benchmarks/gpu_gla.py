"""The scalar-decay GLA forward on the GPU (issue 20's first kernel): ``chunk_simple_gla`` through
recurscan's Triton kernel, recurscan's PyTorch form, and fla-core's ``chunk_simple_gla`` where it
imports, in one process, eager with the L2 flushed (``triton.testing.do_bench``), bf16; each
output against the float32 PyTorch form (relative RMS). Two shapes: fla's (B4 T4096 H16 K=V=128)
and SSD's core (B1 T16384, one key group, 80 value heads x 64, K = dstate 128, scale 1).

    PYTHONPATH=$PWD python benchmarks/gpu_gla.py --out benchmarks/results/gpu_gla.json

And Mamba2 SSD itself (``mamba_chunk_scan_combined``: B1 T16384 and B4 T4096, 80 heads x 64,
dstate 128, one group, chunk 256, D, dt_softplus), recurscan's Triton path against mamba_ssm's
(``MAMBA_SSM_SRC``: an unpacked mamba-ssm 2.3.2.post1 source tree, benchmarks/README.md), the
forward alone and the forward + backward (every input's gradient, one fixed dY); the simple
GLA's forward + backward against fla's; chunk_gla (a decay per key dimension) forward against fla's. ``--cold``: the first SSD forward + backward (B1 T16384, then B4 T4096) in a fresh
process with an empty Triton cache (issue 20: <= 10 s). ``--gla-shape BV:warps[:split]`` (repeatable):
the recurscan rows again in that launch shape of the GLA kernels (the planner's is plan/gla.py's;
``split``: the prep, then the sweep with PER_KEY). ``--profile``: each recurscan row also records its
GPU time by kernel (one call, torch.profiler).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

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

#: ``--profile``: every row, peers' too, records GPU time by kernel (torch.profiler, one call).
PROFILE = False


def profiled(row, fn):
    """``row`` with the GPU time by kernel of one call of ``fn`` (microseconds, the largest first)
    and of each launch in order (``launches_us``) where ``--profile`` asks for it: recurscan's rows
    and the peers', to compare stage by stage."""
    if PROFILE:
        from benchmarks.gpu_delta_train import kernel_times, launch_times
        row["kernels_us"] = kernel_times(fn)
        row["launches_us"] = launch_times(fn)
    return row


def time_impls(name, impls, want):
    """One row per implementation: its time (eager, L2 flushed) and its relative RMS error against
    ``want``; an implementation that raises is recorded, never hidden."""
    rows = []
    for impl, fn in impls.items():
        try:
            with torch.no_grad():
                out = fn()
                err = ((out.float() - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()
                ms = tt.do_bench(fn, rep=200, return_mode="median")
            print(f"{name:<26} {impl:<17} {ms:8.3f} ms  rel RMS {err:.1e}", flush=True)
            with torch.no_grad():
                rows.append(profiled(dict(shape=name, impl=impl, ms=ms, rel_rms_vs_torch_fp32=err), fn))
        except Exception as exc:  # recorded, never hidden
            rows.append(dict(shape=name, impl=impl, status=f"{type(exc).__name__}: {exc}"))
            print(f"{name:<26} {impl:<17} {rows[-1]['status']}", flush=True)
    return rows


def ssd_inputs(Bt, T, H=80, P=64, G=1, N=128, seed=1):
    """mamba_chunk_scan_combined's (x, dt, A, B, C) in bf16 / fp32 as Mamba2 passes them, and its
    keyword arguments (chunk 256, D per head, dt_bias, dt_softplus)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rn = lambda *sh: torch.randn(*sh, device="cuda", generator=gen)  # noqa: E731
    x, dt = rn(Bt, T, H, P).bfloat16(), rn(Bt, T, H)
    A, D, dt_bias = -torch.rand(H, device="cuda", generator=gen), rn(H), rn(H)
    B, C = rn(Bt, T, G, N).bfloat16(), rn(Bt, T, G, N).bfloat16()
    return (x, dt, A, B, C), dict(chunk_size=256, D=D, dt_bias=dt_bias, dt_softplus=True)


def train_step(op, args, kw, grad_names, dy):
    """op's forward + backward: the gradients of the leaves named in grad_names (positional
    indices or keyword names), dy fixed."""
    leaves = [a.detach().requires_grad_() if i in grad_names else a for i, a in enumerate(args)]
    kws = {k: (v.detach().requires_grad_() if k in grad_names else v) for k, v in kw.items()}
    wrt = [leaves[i] for i in grad_names if isinstance(i, int)] + [kws[k] for k in grad_names if isinstance(k, str)]
    out = op(*leaves, **kws)
    return torch.autograd.grad(out, wrt, dy)


SSD_GRADS = (0, 1, 2, 3, 4, "D", "dt_bias")


def time_train(name, impls):
    """One row per implementation: forward + backward, eager, L2 flushed."""
    rows = []
    for impl, fn in impls.items():
        try:
            fn()
            ms = tt.do_bench(fn, rep=200, return_mode="median")
            print(f"{name:<26} {impl:<17} {ms:8.3f} ms  forward + backward", flush=True)
            rows.append(profiled(dict(shape=name, impl=impl, pass_="forward+backward", ms=ms), fn))
        except Exception as exc:  # recorded, never hidden
            rows.append(dict(shape=name, impl=impl, pass_="forward+backward", status=f"{type(exc).__name__}: {exc}"))
            print(f"{name:<26} {impl:<17} forward + backward: {rows[-1]['status']}", flush=True)
    return rows


def ssd_rows():
    from benchmarks.runner import NotInstalled, load_mamba
    rows = []
    for name, (Bt, T) in SSD_SHAPES.items():
        args, kw = ssd_inputs(Bt, T)
        want = recurscan.mamba_chunk_scan_combined(*(t.float() for t in args), **kw, backend="torch")
        ours = lambda *a, **k: recurscan.mamba_chunk_scan_combined(*a, **k, backend="triton")  # noqa: E731
        ops = {"recurscan triton": ours}
        try:
            ops["mamba_ssm"] = load_mamba("ssd_combined", "mamba_chunk_scan_combined")
        except NotInstalled as exc:
            rows.append(dict(shape=name, impl="mamba_ssm", status=f"not installed: {exc}"))
        rows += time_impls(name, {impl: (lambda op=op: op(*args, **kw)) for impl, op in ops.items()}, want)
        dy = torch.randn_like(args[0])
        rows += time_train(name, {impl: (lambda op=op: train_step(op, args, kw, SSD_GRADS, dy)) for impl, op in ops.items()})
    return rows


def per_key_rows(train=True, calm_passes=()):
    """chunk_gla (a decay per key dimension) at fla's shape: the forward through recurscan's
    per-key prep and the delta sweep (planned: the prep's calm pass, then its general steps; the
    general steps alone; and the calm pass as each of ``calm_passes``, ``(keys a step, warps,
    register cap)``), the per-key prep and the fused GLA kernel, and fla's; forward + backward (q,
    k, v, g) through the planned form (fla's backward refuses on Triton 3.6 without TileLang).
    Each against the float32 PyTorch form."""
    from recurscan.plan import gla as plan_gla
    name = "gla_per_key_b4_t4096_h16"
    s = SHAPES["simple_gla_b4_t4096_h16"]
    q, k, v, _ = inputs(s)
    gen = torch.Generator(device="cuda").manual_seed(5)
    gk = torch.nn.functional.logsigmoid(torch.randn(s["B"], s["T"], s["HV"], s["K"], device="cuda", generator=gen)) / 16
    want = recurscan.chunk_gla(*(x.float() for x in (q, k, v)), gk, backend="torch")[0]

    def with_plan(name, value):
        def call():
            planned = getattr(plan_gla, name)
            setattr(plan_gla, name, value)
            try:
                return recurscan.chunk_gla(q, k, v, gk)[0]
            finally:
                setattr(plan_gla, name, planned)
        return call

    impls = {"recurscan triton": lambda: recurscan.chunk_gla(q, k, v, gk)[0]}
    rows = []
    try:  # the peer second, so that a time limit takes the variants' rows before its
        from fla.ops.gla import chunk_gla as fla_chunk_gla
        impls["fla"] = lambda: fla_chunk_gla(q, k, v, gk)[0]
    except Exception as exc:  # recorded, never hidden
        rows.append(dict(shape=name, impl="fla", status=f"not installed: {exc}"))
    impls["recurscan triton, the prep's general steps alone"] = with_plan("PER_KEY_CALM_PASS", None)
    impls["recurscan triton, fused"] = with_plan("PER_KEY_ON_SWEEP", False)
    for block, warps, maxnreg in calm_passes:
        impls[f"recurscan triton, calm pass {block} keys a step on {warps} warps (regs {maxnreg})"] = \
            with_plan("PER_KEY_CALM_PASS", (block, warps, maxnreg))
    rows += time_impls(name, impls, want)
    do = torch.randn_like(v)
    if not train:
        return rows
    train = {"recurscan triton": lambda: train_step(lambda *a: recurscan.chunk_gla(*a)[0], (q, k, v, gk), {},
                                                    (0, 1, 2, 3), do)}
    return rows + time_train(name, train)


def gla_train_rows(name, s, q, k, v, g, keep=lambda impls: impls):
    impls = {"recurscan triton": lambda *a: recurscan.chunk_simple_gla(*a, scale=s["scale"], backend="triton")[0]}
    try:
        from fla.ops.simple_gla import chunk_simple_gla as fla_gla
        if s["H"] == s["HV"]:
            impls["fla"] = lambda *a: fla_gla(*a, scale=s["scale"])[0]
    except Exception:  # already recorded by the forward rows
        pass
    dy = torch.randn_like(v)
    return time_train(name, {impl: (lambda op=op: train_step(op, (q, k, v, g), {}, (0, 1, 2, 3), dy))
                             for impl, op in keep(impls).items()})


COLD = """
import sys, time, torch
t0 = time.perf_counter()
import recurscan
from benchmarks.gpu_gla import SSD_GRADS, ssd_inputs, train_step
args, kw = ssd_inputs(int(sys.argv[1]), int(sys.argv[2]))
dy = torch.randn_like(args[0])
torch.cuda.synchronize(); t1 = time.perf_counter()
train_step(lambda *a, **k: recurscan.mamba_chunk_scan_combined(*a, **k, backend="triton"), args, kw, SSD_GRADS, dy)
torch.cuda.synchronize(); t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def cold(Bt=1, T=16384):
    """(import and inputs, first forward + backward) seconds in a fresh process, empty Triton cache:
    SSD B``Bt`` T``T`` (80 heads x 64, dstate 128)."""
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run([sys.executable, "-c", COLD, str(Bt), str(T)], capture_output=True, text=True,
                             env=dict(os.environ, TRITON_CACHE_DIR=cache), check=True)
    setup, first = map(float, out.stdout.split()[-2:])
    name = f"ssd_b{Bt}_t{T}_h80"
    print(f"{name} cold: import + inputs {setup:.1f} s, first forward + backward {first:.1f} s", flush=True)
    return dict(shape=name, impl="recurscan triton", cold_import_s=setup, cold_first_call_s=first)


def recurscan_only(impls):
    return {n: f for n, f in impls.items() if n == "recurscan triton"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--cold-only", action="store_true", help="the cold first call alone")
    ap.add_argument("--gla-shape", action="append", default=[], help="BV:warps[:split]: the recurscan rows again "
                                                                       "in this launch shape of the GLA kernels (repeatable)")
    ap.add_argument("--only-shapes", action="store_true", help="the --gla-shape rows (and the planner's) alone")
    ap.add_argument("--profile", action="store_true", help="GPU time by kernel of one call of each row")
    ap.add_argument("--only-per-key", action="store_true", help="the chunk_gla rows alone")
    ap.add_argument("--forward-only", action="store_true", help="with --only-per-key: no forward + backward row")
    ap.add_argument("--calm-pass", action="append", default=[],
                    help="KEYS:WARPS[:MAXNREG]: the per-key row again with this calm pass (repeatable)")
    args = ap.parse_args()
    global PROFILE
    PROFILE = args.profile
    from recurscan.plan import gla as plan_gla
    planned = plan_gla.GLA_LAUNCH
    rows = [cold(), cold(4, 4096)] if args.cold_only else (per_key_rows(not args.forward_only, [
        (int(t[0]), int(t[1]), int(t[2]) if len(t) > 2 else None) for t in (a.split(":") for a in args.calm_pass)])
                                             if args.only_per_key else [])
    if args.cold_only or args.only_per_key:
        if args.out:
            json.dump(dict(torch=torch.__version__, device=torch.cuda.get_device_name(), rows=rows),
                      open(args.out, "w"), indent=1)
        return
    for text in (["planned"] + args.gla_shape) if args.gla_shape else []:
        if text == "planned":
            shape = planned
        else:
            parts = text.split(":")
            shape = plan_gla.GlaShape(int(parts[0]), int(parts[1]), "benchmark variant", split="split" in parts[2:])
        plan_gla.GLA_LAUNCH = shape
        tag = f" {shape.block_v}:{shape.num_warps}" + (":split" if shape.split else "")
        for name, s in SHAPES.items():
            q, k, v, g = inputs(s)
            want = recurscan.chunk_simple_gla(*(x.float() for x in (q, k, v)), g, scale=s["scale"], backend="torch")[0]
            fwd = {"recurscan triton": lambda: recurscan.chunk_simple_gla(q, k, v, g, scale=s["scale"])[0]}
            rows += time_impls(name + tag, fwd, want)
            rows += gla_train_rows(name + tag, s, q, k, v, g, recurscan_only)
        for name, (Bt, T) in SSD_SHAPES.items():
            a, kw = ssd_inputs(Bt, T)
            want = recurscan.mamba_chunk_scan_combined(*(t.float() for t in a), **kw, backend="torch")
            rows += time_impls(name + tag, {"recurscan triton": lambda: recurscan.mamba_chunk_scan_combined(*a, **kw)},
                               want)
            dy = torch.randn_like(a[0])
            rows += time_train(name + tag, {"recurscan triton": lambda: train_step(
                recurscan.mamba_chunk_scan_combined, a, kw, SSD_GRADS, dy)})
    plan_gla.GLA_LAUNCH = planned
    if args.only_shapes:
        if args.out:
            json.dump(dict(torch=torch.__version__, device=torch.cuda.get_device_name(), rows=rows),
                      open(args.out, "w"), indent=1)
        return
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
        rows += gla_train_rows(name, s, q, k, v, g)
    rows += per_key_rows()
    rows += ssd_rows()
    if args.cold:
        rows += [cold(), cold(4, 4096)]
    if args.out:
        json.dump(dict(torch=torch.__version__, device=torch.cuda.get_device_name(), rows=rows), open(args.out, "w"),
                  indent=1)


if __name__ == "__main__":
    main()
