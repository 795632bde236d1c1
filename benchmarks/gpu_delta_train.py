"""Forward + backward of the chunked delta rule on the GPU (issue 19's table): recurscan, and the
peers that import here (fla-core; FlashQLA 0.1.3, whose wheels install in two calls:
benchmarks/README.md), in one process, eager with the L2 flushed
(``triton.testing.do_bench``), bf16 inputs, l2norm in the kernel.

Per workload: the median of forward + backward (gradients of q, k, v, g, beta), the forward alone,
the first call in a fresh process with an empty Triton cache (``--cold``), and the bytes the
autograd graph holds between forward and backward (allocated after the forward, minus before it,
outputs excluded), against the bytes of q, k, v, g and beta.

    PYTHONPATH=$PWD python benchmarks/gpu_delta_train.py --out benchmarks/results/gpu_delta_train.json [--cold]
"""
from __future__ import annotations

import argparse
import functools
import gc
import importlib
import os
import subprocess
import sys
import tempfile

import torch
import triton.testing as tt

from benchmarks import registry, runner

WORKLOADS = ["gdn_b4_t4096_h16", "gdn_b1_t16384_h16_hv32", "gdp_m2_b4_t4096_h16"]
TARGETS_MS = {"gdn_b4_t4096_h16": 0.90, "gdn_b1_t16384_h16_hv32": 1.30, "gdp_m2_b4_t4096_h16": 1.8}


#: The bf16 matmul ceiling measured on the H200 (shared/DESIGN.md: 8192^3), TFLOP/s.
MATMUL_CEILING_TFLOPS = 782.0


def stage_flops(w) -> int:
    """FLOPs the forward + backward compute as the stages do, per 64-row chunk of the expanded
    stream and value head (docs/perf-history.md, issue 19): the forward (the registry's count), the
    recompute's prep and states (K K^T, the inverse, K S, winv X, K^T U), the reverse sweep
    (aqk^T dO, K dS, winv^T dU, Q^T dO, K^T dv) and the parallel stage (dO S^T, U dS^T, dY S^T,
    dO U^T, dY U^T, Q K^T, K K^T and the four dq / dk products)."""
    K, V, C = w.head_k, w.head_v, w.chunk_size
    mm = lambda m, n, k: 2 * m * n * k  # noqa: E731
    per_chunk = (mm(C, C, K) + C * (C * C - 1) // 3 + mm(C, K, V) + mm(C, C, V) + mm(C, K, V)  # recompute
                 + 2 * mm(C, C, V) + mm(C, K, V) + 2 * mm(K, C, V)  # reverse sweep
                 + 3 * mm(C, K, V) + 2 * mm(C, C, V) + 6 * mm(C, C, K))  # parallel stage
    chunks = sum(-(-L * w.num_householder // C) for L in w.seqlens)
    return w.flops() + per_chunk * chunks * w.value_heads


def leaves(w, seed=0):
    x = w.make_inputs("cuda", seed)
    out = {n: x[n].detach().requires_grad_() for n in ("q", "k", "v", "g", "beta")}
    return out, x


def recurscan_step(w, x, t, package="recurscan"):
    recurscan = importlib.import_module(package)
    M = w.num_householder
    if M == 1 and x["cu_seqlens"] is None:
        o, _ = recurscan.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], use_qk_l2norm_in_kernel=True)
    else:
        B, T = t["q"].shape[:2]
        if ("descriptors", package) not in x:  # built once, as a training loop would per batch shape
            cu = torch.arange(B + 1, device="cuda", dtype=torch.int32) * T
            x["descriptors", package] = cu, recurscan.build_chunk_descriptors(cu, M, device="cuda").as_kwargs()
        cu, desc = x["descriptors", package]
        flat = {n: v.reshape(1, -1, *v.shape[2:]) for n, v in t.items()}
        o, _ = recurscan.chunk_gated_delta_product_varlen(flat["q"], flat["k"], flat["v"], flat["g"], flat["beta"], M,
                                                          cu, use_qk_l2norm_in_kernel=True, **desc)
    return o


def fla_step(w, x, t):
    if w.num_householder != 1:
        raise runner.Unsupported("fla's chunk_gated_delta_product takes another layout; not wired")
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    o, _ = chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], use_qk_l2norm_in_kernel=True)
    return o


def flashqla_step(w, x, t):
    if w.num_householder != 1:
        raise runner.Unsupported("FlashQLA has no Gated Delta Product")
    from flash_qla import chunk_gated_delta_rule
    o, _ = chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], use_qk_l2norm_in_kernel=True)
    return o


PEERS = {"recurscan": recurscan_step, "fla": fla_step, "flashqla": flashqla_step}


def step_calls(w, step=recurscan_step):
    """``(fwd_bwd, fwd, t, x)``: a forward + backward of ``step`` (gradients of q, k, v, g, beta for
    one fixed dO) and a no-grad forward on workload ``w``'s inputs, with the leaves ``t`` and the
    inputs ``x`` they read."""
    t, x = leaves(w)
    do = torch.randn(w.batch, w.seqlen, w.value_heads, w.head_v, device="cuda", dtype=t["v"].dtype)

    def fwd_bwd():
        o = step(w, x, t)
        torch.autograd.grad(o.reshape(do.shape), list(t.values()), do)

    def fwd():
        with torch.no_grad():
            step(w, x, t)
    return fwd_bwd, fwd, t, x


def measure(name, step, w):
    fwd_bwd, fwd, t, x = step_calls(w, step)
    fwd_bwd()
    torch.cuda.synchronize()
    storages = {}  # every tensor the graph saves, by storage (the inputs count: they are kept alive)

    def pack(x):
        storages[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x

    # Garbage (an earlier variant's tensors in reference cycles) collected first, so that a collection
    # inside the forward cannot free it there and make the difference below negative (one candidate
    # cause of the -122 MiB read for GDP on the H200 at ecf0925; not confirmed).
    gc.collect()
    before = torch.cuda.memory_allocated()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        o = step(w, x, t)
    held = torch.cuda.memory_allocated() - before - o.numel() * o.element_size()
    del o
    saved = sum(storages.values())
    inputs = sum(v.numel() * v.element_size() for v in t.values())
    res = dict(impl=name, fwd_bwd_ms=tt.do_bench(fwd_bwd, rep=300, return_mode="median"),
               fwd_ms=tt.do_bench(fwd, rep=200, return_mode="median"), saved_bytes=saved,
               held_beyond_inputs_bytes=held, input_bytes=inputs, saved_over_inputs=saved / inputs)
    res["fwd_bwd_flops"] = stage_flops(w)  # recurscan's stages' count, for every implementation alike
    res["fwd_bwd_tflops"] = res["fwd_bwd_flops"] / res["fwd_bwd_ms"] / 1e9
    res["pct_of_matmul_ceiling"] = 100 * res["fwd_bwd_tflops"] / MATMUL_CEILING_TFLOPS
    print(f"{w.name:<26} {name:<10} fwd+bwd {res['fwd_bwd_ms']:.3f} ms ({res['fwd_bwd_tflops']:.0f} TFLOP/s, "
          f"{res['pct_of_matmul_ceiling']:.0f}% of {MATMUL_CEILING_TFLOPS:.0f})  fwd {res['fwd_ms']:.3f} ms  "
          f"saved {saved / 2**20:.1f} MiB = {res['saved_over_inputs']:.2f}x inputs (+{held / 2**20:.1f} MiB allocated "
          f"beyond them)", flush=True)
    if PROFILE:
        res["kernels_us"] = kernel_times(fwd_bwd)
    return res


PROFILE = False
PLANNED = None


def parse_backward_shape(text):
    """``BV:sweep warps:dq-dk warps[:its BV[:scores warps:its BV]][+group][+sN][+corun][+one][/BV:warps:stages:phases:segments]``
    -> a DeltaBackwardShape: ``+group``, GVA groups summed in the dq, dk kernels; ``+sN``, the
    reverse sweep's loop pipelined N stages deep; ``+corun``, the recompute on a side stream beside
    the reverse sweep; ``+one``, dk and dq in one launch; after the slash, the recompute's prep and sweep
    (V as a product operand from 64 columns, as the forward's table has it)."""
    from recurscan.plan.delta import DeltaBackwardShape, DeltaShape
    stages, _, recompute = text.partition("/")
    stages, *flags = stages.split("+")
    group = "group" in flags
    corun = "corun" in flags
    one = "one" in flags
    rtwin = "rtwin" in flags
    sweep_stages = [int(f[1:]) for f in flags if f[:1] == "s" and f[1:].isdigit()]
    parts, rparts = stages.split(":"), recompute.split(":") if recompute else []
    if len(parts) not in (3, 4, 6) or len(rparts) not in (0, 5) or not all(x.isdigit() for x in parts + rparts) \
            or len(flags) != group + corun + one + rtwin + len(sweep_stages):
        raise ValueError("backward shape: expected BV:sweep warps:dq-dk warps[:its BV[:scores warps:its BV]][+group]"
                         f"[+sN][+corun][+one][+rtwin][/BV:warps:stages:phases:segments], got {text!r}")
    if rparts:
        bv, warps, n_stages, phases, segments = map(int, rparts)
        recompute = DeltaShape(bv, warps, n_stages, 4, "variant", segments=segments, phases=phases,
                               v_product=bv >= 64)
    extra = dict(sweep_stages=sweep_stages[0]) if sweep_stages else {}
    return DeltaBackwardShape(*map(int, parts[:3]), "variant", *map(int, parts[3:]), recompute=recompute or None,
                              group_in_kernel=group, corun=corun, dqdk_one_launch=one, recompute_twin=rtwin, **extra)


def set_backward_shape(text):
    """The planner's backward launch table, or one shape for every problem (``text`` as
    :func:`parse_backward_shape` takes it)."""
    from recurscan.plan import delta as plan_delta
    global PLANNED
    PLANNED = PLANNED or plan_delta.DELTA_BACKWARD_LAUNCH
    plan_delta.DELTA_BACKWARD_LAUNCH = PLANNED if text is None else [(lambda *_: True, parse_backward_shape(text))]


PLANNED_CHECKPOINTS = None
PLANNED_GLUON = None
PLANNED_DQDK_STAGES = None


def set_dqdk_stages(stages: int | None):
    """The planner's ring of dq and dk's Gluon twin (None), or ``stages`` stages at every M
    (``plan.delta.GLUON_DQDK_STAGES``)."""
    from recurscan.plan import delta as plan_delta
    global PLANNED_DQDK_STAGES
    PLANNED_DQDK_STAGES = PLANNED_DQDK_STAGES or plan_delta.GLUON_DQDK_STAGES
    plan_delta.GLUON_DQDK_STAGES = PLANNED_DQDK_STAGES if stages is None else {1: stages, 2: stages}


def set_gluon(twins: str | None):
    """The planner's Gluon twins as planned (None), or exactly those named in ``twins`` on and the
    others off (``+``-separated fields of ``plan.delta.GLUON_BACKWARD_TWINS``, e.g. ``gluon_sweep+gluon_dqdk``,
    ``forward_sweep`` for ``plan.delta.GLUON_FORWARD_SWEEP``, ``gdp_sweep`` for
    ``plan.delta.GLUON_GDP_REVERSE_SWEEP``, ``gdp_dqdk`` for ``plan.delta.GLUON_GDP_DQDK`` (these two
    at every key size of their scope, not only their planner rows' key sizes, so too ``gluon_dqdk``) and
    ``gdp_scores`` for ``plan.delta.GLUON_GDP_SCORES``; ``none``: all off)."""
    import dataclasses
    from recurscan.plan import delta as plan_delta
    global PLANNED_GLUON
    PLANNED_GLUON = PLANNED_GLUON or (plan_delta.GLUON_BACKWARD_TWINS, plan_delta.GLUON_FORWARD_SWEEP,
                                      plan_delta.GLUON_GDP_REVERSE_SWEEP, plan_delta.GLUON_GDP_DQDK,
                                      plan_delta.GLUON_GDP_REVERSE_SWEEP_KEY_DIMS, plan_delta.GLUON_DQDK_KEY_DIMS,
                                      plan_delta.GLUON_GDP_SCORES)
    backward, forward, gdp, gdp_dqdk, _, _, gdp_scores = PLANNED_GLUON
    if twins is None:
        (plan_delta.GLUON_BACKWARD_TWINS, plan_delta.GLUON_FORWARD_SWEEP, plan_delta.GLUON_GDP_REVERSE_SWEEP,
         plan_delta.GLUON_GDP_DQDK, plan_delta.GLUON_GDP_REVERSE_SWEEP_KEY_DIMS,
         plan_delta.GLUON_DQDK_KEY_DIMS, plan_delta.GLUON_GDP_SCORES) = PLANNED_GLUON
        return
    names = set(twins.split("+")) - {"none"}
    others = ["forward_sweep", "gdp_sweep", "gdp_dqdk", "gdp_scores"]
    if not names <= set(backward) | set(others):
        raise ValueError(f"--gluon: expected +-separated names of {sorted(backward) + others} or none, got {twins!r}")
    plan_delta.GLUON_BACKWARD_TWINS = {n: dataclasses.replace(row, on=n in names) for n, row in backward.items()}
    plan_delta.GLUON_FORWARD_SWEEP = dataclasses.replace(forward, on="forward_sweep" in names)
    plan_delta.GLUON_GDP_REVERSE_SWEEP = dataclasses.replace(gdp, on="gdp_sweep" in names)
    plan_delta.GLUON_GDP_DQDK = dataclasses.replace(gdp_dqdk, on="gdp_dqdk" in names)
    plan_delta.GLUON_GDP_SCORES = dataclasses.replace(gdp_scores, on="gdp_scores" in names)
    plan_delta.GLUON_GDP_REVERSE_SWEEP_KEY_DIMS = plan_delta.GLUON_DQDK_KEY_DIMS = (64, 128)


def set_checkpoint_chunks(every):
    """The planner's checkpoint rule (``plan.delta.checkpoint_chunks_for_backward``), or E for
    every dense GDN problem (0: none)."""
    from recurscan.plan import delta as plan_delta
    global PLANNED_CHECKPOINTS
    PLANNED_CHECKPOINTS = PLANNED_CHECKPOINTS or plan_delta.checkpoint_chunks_for_backward
    plan_delta.checkpoint_chunks_for_backward = PLANNED_CHECKPOINTS if every is None else \
        (lambda problem, device: 0 if problem.varlen or problem.householder > 1 else every)


def kernel_times(fn, top=12):
    """GPU time by kernel over one call (torch.profiler), microseconds, the largest first."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            times[e.name[:60]] = times.get(e.name[:60], 0.0) + e.device_time
    rows = sorted(times.items(), key=lambda kv: -kv[1])[:top]
    for n, us in rows:
        print(f"    {us:9.1f} us  {n}", flush=True)
    return dict(rows)


def launch_times(fn) -> list:
    """GPU time of every kernel launch of one call (torch.profiler), in launch order: ``[name, us]``
    pairs, so that launches of one kernel in different stages (a forward and its recompute, dq's,
    dk's and dg's launches of one parallel-stage kernel) are told apart."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    launches = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    return [[e.name[:60], round(e.device_time, 1)] for e in launches]


COLD = """
import torch
if {torch_import_first}:  # torch's own import on a first autograd.grad given grad_outputs (sympy, ~2 s)
    import torch.fx.experimental.symbolic_shapes
if not {checkpoints}:
    from recurscan.plan import delta as plan_delta
    plan_delta.checkpoint_chunks_for_backward = lambda problem, device: 0
from benchmarks import registry
from benchmarks.gpu_delta_train import leaves, recurscan_step
import time
w = registry.get({name!r})
t, x = leaves(w)
do = torch.randn(w.batch, w.seqlen, w.value_heads, w.head_v, device="cuda", dtype=t["v"].dtype)
torch.cuda.synchronize(); t0 = time.perf_counter()
o = recurscan_step(w, x, t)
if {scalar_loss}:  # a training step's backward: a scalar loss, gradients into the leaves' .grad
    (o.reshape(do.shape).float() * do).sum().backward()
else:
    torch.autograd.grad(o.reshape(do.shape), list(t.values()), do)
torch.cuda.synchronize(); print(time.perf_counter() - t0)
"""


def cold(name, checkpoints=True, torch_import_first=False, scalar_loss=False):
    """Seconds of the first forward + backward of workload ``name`` in a fresh process with an
    empty Triton cache; ``checkpoints=False``: with the planner's checkpoints switched off.

    The backward is ``torch.autograd.grad`` given dO, whose first call in a process imports
    torch.fx's symbolic shapes, and with them sympy (2.0-2.5 s on an H100 machine lent,
    results/cold_sympy_ab_h100_94411ab.txt): torch's cost, not the op's, and one that
    ``loss.backward()`` on a scalar does not pay there. ``torch_import_first``: that import done
    before the clock starts, so the time is the op's first call alone. ``scalar_loss``: the backward
    as a training step takes it, ``(o * dO).sum().backward()`` (the same gradients, into ``.grad``)."""
    with tempfile.TemporaryDirectory() as cache:
        code = COLD.format(name=name, checkpoints=checkpoints, torch_import_first=torch_import_first,
                           scalar_loss=scalar_loss)
        out = subprocess.run([sys.executable, "-c", code],
                             capture_output=True, text=True, env=dict(os.environ, TRITON_CACHE_DIR=cache), check=True)
    return float(out.stdout.split()[-1])


def main():
    from recurscan.runtime.cache import clear_caches
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--workload", action="append")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--impl", action="append", help="limit the implementations (recurscan, fla, "
                                                                    "flashqla, prev or another --prev package's NAME)")
    ap.add_argument("--profile", action="store_true", help="GPU time by kernel of one forward + backward")
    ap.add_argument("--prev", action="append", help="a folder holding another commit's package as recurscan_NAME "
                                                    "(benchmarks/ab_prev.py says how; recurscan_prev for an older "
                                                    "one): measured as NAME in the same process (repeatable)")
    ap.add_argument("--backward-shape", action="append", help="BV:sweep warps:dq-dk warps[:its BV[:scores warps:"
                                                               "its BV]][@E]: recurscan again in this backward "
                                                               "launch shape (@E: with E as --checkpoint-chunks; "
                                                               "repeatable)")
    ap.add_argument("--checkpoint-chunks", type=int, action="append", help="recurscan again with the forward "
                                                                           "keeping every Nth chunk's state for "
                                                                           "the backward (0: none; repeatable)")
    ap.add_argument("--gluon", action="append", help="recurscan again with exactly these Gluon twins on where their "
                                                     "scope allows (+-separated plan.delta.GLUON_BACKWARD_TWINS "
                                                     "names, forward_sweep, gdp_sweep, gdp_dqdk, gdp_scores or "
                                                     "none; repeatable)")
    ap.add_argument("--dqdk-stages", type=int, action="append", help="recurscan again with dq and dk's Gluon "
                                                                     "twin on a ring of this many stages "
                                                                     "(plan.delta.GLUON_DQDK_STAGES; repeatable)")
    ap.add_argument("--plan", action="append", default=[], metavar="NAME=VALUE",
                    help="set recurscan.plan.delta.NAME (a Python literal) for recurscan before the first call, "
                         "e.g. PREP_SPLIT_INVERSE=0 (another --prev package keeps its own plan)")
    args = ap.parse_args()
    runner.set_plan(args.plan)
    global PROFILE
    PROFILE = args.profile
    rows = []
    for name in args.workload or WORKLOADS:
        w = registry.get(name)
        peers = dict(PEERS)
        for folder in args.prev or []:
            sys.path.insert(0, folder)
            for package in sorted(p for p in os.listdir(folder) if p.startswith("recurscan_")):
                peers[package[len("recurscan_"):]] = functools.partial(recurscan_step, package=package)
        variants = [(impl, step, None, None, None, None) for impl, step in peers.items()] + \
            [("recurscan", recurscan_step, bs, int(e) if e else None, None, None)
             for bs, _, e in (text.partition("@") for text in args.backward_shape or [])] + \
            [("recurscan", recurscan_step, None, e, None, None) for e in args.checkpoint_chunks or []] + \
            [("recurscan", recurscan_step, None, None, twins, None) for twins in args.gluon or []] + \
            [("recurscan", recurscan_step, None, None, None, n) for n in args.dqdk_stages or []]
        for impl, step, bshape, every, gluon, stages in variants:
            if args.impl and impl not in args.impl:
                continue
            set_backward_shape(bshape)
            set_checkpoint_chunks(every)
            set_gluon(gluon)
            set_dqdk_stages(stages)
            clear_caches()  # the forward's launches are kept by signature: planned again for this variant
            impl = impl if bshape is None else f"{impl} {bshape}"
            impl = impl if every is None else f"{impl} checkpoints {every}"
            impl = f"{impl} gluon {gluon}" if gluon else impl
            impl = impl if stages is None else f"{impl} dq/dk stages {stages}"
            try:
                rows.append(dict(workload=name, target_ms=TARGETS_MS.get(name), **measure(impl, step, w)))
            except Exception as exc:  # recorded, never hidden
                rows.append(dict(workload=name, impl=impl, status=f"{type(exc).__name__}: {exc}"))
                print(f"{name:<26} {impl:<10} {rows[-1]['status']}", flush=True)
        if args.cold:
            rows.append(dict(workload=name, impl="recurscan", cold_first_call_s=cold(name)))
            print(f"{name:<26} recurscan  cold first call {rows[-1]['cold_first_call_s']:.1f} s", flush=True)
    if args.out:
        runner.save_rows(rows, args.out, torch.device("cuda"))


if __name__ == "__main__":
    main()
