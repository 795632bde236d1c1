"""GPU benchmarks of the streaming kernel (issue 4): decode against a state cache, one-request
latency (CUDA graph and eager), speculative decode, the launch-shape sweep behind the rules, and
streaming prefill from 1K to 64K tokens. Peers (fla-core, mamba_ssm) run in the same process.

    python -m benchmarks.gpu_decode --out benchmarks/results/gpu_decode.json

Timing: ``triton.testing.do_bench`` (it zeroes a 256 MB buffer before every call: L2 flushed) for
bandwidth figures; ``do_bench_cudagraph`` for graph replay (no flush; a rotated-buffer graph of
64 calls over 64 distinct state pools is reported beside it); host time of an eager call as the
wall time of 2000 back-to-back calls divided by 2000 (the GPU work per call is smaller, so the
host is the bottleneck). Bytes are the minimum traffic (benchmarks/registry.py) and % are of the
measured 4.27 TB/s device copy.

fla 0.6's ``fused_recurrent_gated_delta_rule`` takes ``(q, k, v, g, gk, gv, beta, ...)``, so it
is called with keywords here (a positional beta would land on gk).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

from . import registry, runner

BW = 4.27e12


def _fla_decode(w: registry.Workload):
    mod = runner._import("fla.ops.gated_delta_rule")

    def fn(x):  # the pool in slot order is fla's initial_state; it returns a new final state
        if w.state_layout == "vk":  # fla's state_v_first: the [N, HV, V, K] tensor itself
            o, final = mod.fused_recurrent_gated_delta_rule(
                x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], initial_state=x["state"].transpose(-1, -2),
                output_final_state=True, use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"], state_v_first=True)
            return o, final.transpose(-1, -2)
        return mod.fused_recurrent_gated_delta_rule(
            x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], initial_state=x["state"], output_final_state=True,
            use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"])
    return fn


def _ours_dense(w: registry.Workload):
    """Our op called as fla is here: the pool as initial_state, a new final state (no cache indices)."""
    import recurscan

    def fn(x):
        return recurscan.fused_recurrent_gated_delta_rule_update(
            x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["state"], output_final_state=True,
            use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"])
    return fn


OURS_DENSE = runner.Impl("recurscan dense", "variant", _ours_dense,
                         "recurscan op with initial_state / output_final_state (fla's call: no cache indices)",
                         lambda: None)
FLA = runner.Impl("fla", "peer", _fla_decode, "fla-core fused_recurrent_gated_delta_rule (keyword call)",
                  lambda: runner._dist_version("fla-core"))


def bench(fn, rep=300):
    import triton.testing as tt
    ms = tt.do_bench(fn, warmup=50, rep=rep, quantiles=[0.5, 0.2, 0.8])
    return {"median": ms[0] / 1e3, "p20": ms[1] / 1e3, "p80": ms[2] / 1e3}


def bench_graph(fn, rep=300):
    import triton.testing as tt
    ms = tt.do_bench_cudagraph(fn, rep=rep, quantiles=[0.5, 0.2, 0.8])
    return {"median": ms[0] / 1e3, "p20": ms[1] / 1e3, "p80": ms[2] / 1e3}


def host_time(fn, n=2000):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"host_per_call_s": (t1 - t0) / n, "wall_per_call_s": (t2 - t0) / n, "calls": n}


def rotated_graph(make_call, copies=64, replays=20):
    """Per-call time of a CUDA graph of ``copies`` calls, each on its own buffers (L2 cold-ish)."""
    calls = [make_call(i) for i in range(copies)]
    for c in calls:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / copies)
    times.sort()
    return {"median": times[len(times) // 2], "min": times[0], "copies": copies}


def pct(nbytes, t):
    return {"bytes": nbytes, "time_s": t, "TB_per_s": nbytes / t / 1e12, "pct_of_4.27TBps": 100 * nbytes / t / BW}


# ---- sections ---------------------------------------------------------------------------------------


def registered(out):
    wls = ["gdn_decode_256", "gdn_decode_1024"]
    for name in wls:
        out["workloads"].append(runner.run_workload(name, impls=["recurscan"], extra_impls=[FLA], rep_ms=300))
        print(runner.format_table(out["workloads"][-1]), flush=True)
    for n in (256, 1024):  # the cache in the key-contiguous layout [S, HV, V, K] (vLLM, SGLang, FlashInfer)
        vk = registry.Workload(f"gdn_decode_{n}_vk", "gdn_decode", (1,) * n, heads=16, value_heads=32,
                               state_layout="vk", note=f"{n} requests, fp32 cache laid out [S, HV, V, K], passed "
                                                   "as its transposed view; fla with state_v_first=True")
        out["workloads"].append(runner.run_workload(vk, impls=["recurscan"], extra_impls=[OURS_DENSE, FLA],
                                                    rep_ms=300))
        print(runner.format_table(out["workloads"][-1]), flush=True)
    bf16 = registry.Workload("gdn_decode_256_bf16_state", "gdn_decode", (1,) * 256, heads=16, value_heads=32,
                             state_dtype="bfloat16", note="256 requests, bf16 state cache (accumulated in fp32)")
    out["workloads"].append(runner.run_workload(bf16, impls=["recurscan"], rep_ms=300))
    print(runner.format_table(out["workloads"][-1]), flush=True)
    out["workloads"].append(runner.run_workload("ssd_decode_256", impls=["recurscan", "mamba_ssm"], rep_ms=300))
    print(runner.format_table(out["workloads"][-1]), flush=True)


def one_request(out):
    import recurscan
    w = registry.Workload("gdn_decode_1", "gdn_decode", (1,), heads=16, value_heads=32)
    x = w.make_inputs("cuda")
    ours = lambda: recurscan.fused_recurrent_gated_delta_rule_update(  # noqa: E731
        x["q"], x["k"], x["v"], x["g"], x["beta"], state=x["state"], state_indices=x["state_indices"],
        use_qk_l2norm_in_kernel=True)
    ours()
    torch.cuda.synchronize()
    res = {"bytes": w.hbm_bytes(), "ours": {}, "fla": {}}
    res["ours"]["graph_replay"] = bench_graph(ours)
    res["ours"]["eager"] = host_time(ours)
    # the same call through Triton's JIT dispatch (the op's cache bypassed) and the bare launcher
    from recurscan.launch import stream as R
    from recurscan.ops import decode as D

    def jit_path():  # the op's per-signature cache dropped: validation, planning and Triton's JIT launch
        D.PREPARED.clear()
        ours()
    res["ours"]["eager_without_signature_cache"] = host_time(jit_path, n=300)
    res["ours"]["direct_launch_error"] = R.DIRECT_LAUNCH_ERROR

    def make(i):
        y = w.make_inputs("cuda", seed=i)
        return lambda: recurscan.fused_recurrent_gated_delta_rule_update(
            y["q"], y["k"], y["v"], y["g"], y["beta"], state=y["state"], state_indices=y["state_indices"],
            use_qk_l2norm_in_kernel=True)
    res["ours"]["graph_rotated_64"] = rotated_graph(make)
    try:
        fla = _fla_decode(w)
        f = lambda: fla(x)  # noqa: E731
        f()
        res["fla"]["graph_replay"] = bench_graph(f)
        res["fla"]["eager"] = host_time(f, n=500)

        def makef(i):
            y = w.make_inputs("cuda", seed=i)
            return lambda: fla(y)
        res["fla"]["graph_rotated_64"] = rotated_graph(makef)
    except Exception as exc:
        res["fla"] = {"status": f"{type(exc).__name__}: {exc}"}
    out["one_request"] = res
    print(json.dumps(res, indent=1), flush=True)


def speculative(out):
    import recurscan
    N, D, H, HV, K, V = 256, 4, 16, 32, 128, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen, device="cuda")  # noqa: E731
    q, k, v = r(N, D, H, K).bfloat16(), r(N, D, H, K).bfloat16(), r(N, D, HV, V).bfloat16()
    g, beta = torch.nn.functional.logsigmoid(r(N, D, HV) + 3), torch.sigmoid(r(N, D, HV)).bfloat16()
    state = 0.1 * r(N, HV, K, V)
    snaps = torch.zeros(N, D, HV, K, V, device="cuda")
    slots = torch.arange(N, device="cuda", dtype=torch.int32)
    acc = torch.randint(1, D + 1, (N,), generator=gen, device="cuda", dtype=torch.int32)
    fn = lambda: recurscan.fused_recurrent_gated_delta_rule_update(  # noqa: E731
        q, k, v, g, beta, use_qk_l2norm_in_kernel=True, state=state, state_indices=slots,
        intermediate_states=snaps, steps_per_token=1, num_accepted_tokens=acc)
    t = bench(fn)
    sb = N * HV * K * V * 4
    act = N * D * (2 * H * K * 2 + HV * V * 2 * 2 + HV * 4 + HV * 2)
    nbytes = sb * (1 + 1 + D) + act  # state read, final written, D snapshots written
    out["speculative_256x4"] = {"time": t, **pct(nbytes, t["median"]),
                                "note": "256 requests x 4 draft tokens, fp32 state, a snapshot per token, "
                                        "num_accepted_tokens restart; bytes = state read + final + 4 snapshots"}
    print("speculative", out["speculative_256x4"], flush=True)


def _ssd_decode_fn(x, cfg):
    """The streaming kernel as mamba's selective_state_update on the ssd_decode_256 inputs ``x``
    (dt, A, D, dt_bias per head), with launch shape ``cfg``."""
    from recurscan.launch import stream as R
    N, Hs, P, Ns = x["state"].shape
    y = torch.empty(N, 1, Hs, P, device="cuda", dtype=x["x"].dtype)
    dt = x["dt"][:, None, :]  # [N, 1, H]: tied over headdim
    return lambda: R.streaming_recurrence(
        x["C"][:, None], x["B"][:, None], x["x"][:, None], y, scale=1.0, delta=False, gate="ssd", g=dt,
        initial=x["state"], final=x["state"], final_by_slot=True, vk_layout=True, A=x["A"],
        dt_bias=x["dt_bias"][:, None].expand(Hs, P), D=x["D"][:, None].expand(Hs, P), dt_tied=True,
        dt_softplus=True, num_sequences=N, shape=cfg)


def sweep(out):
    """Launch shapes around the rule's choice (the data behind the rows of plan/stream.py's stream_shape)."""
    from recurscan.launch import stream as R
    from recurscan.plan import StreamShape
    res = []
    EF = "evict_first"
    for name, n, state_dtype, cfgs in (
            ("gdn_decode_256", 256, "float32", [(32, 1, ""), (32, 1, EF), (16, 1, EF)]),
            ("gdn_decode_1024", 1024, "float32", [(32, 1, ""), (32, 1, EF)]),
            ("gdn_decode_256", 256, "bfloat16", [(32, 1, ""), (32, 1, EF), (64, 2, "")])):
        w = registry.Workload(name, "gdn_decode", (1,) * n, heads=16, value_heads=32, state_dtype=state_dtype)
        x = w.make_inputs("cuda")
        o = torch.empty_like(x["v"])
        for BV, nw, ev in cfgs:
            cfg = StreamShape(128, BV, nw, 1, "sweep", evict=ev)
            fn = lambda: R.streaming_recurrence(  # noqa: E731
                x["q"], x["k"], x["v"], o, scale=128 ** -0.5, delta=True, gate="scalar", g=x["g"], beta=x["beta"],
                beta_mode="head", l2norm=True, initial=x["state"], final=x["state"], final_by_slot=True,
                slots=x["state_indices"], num_sequences=n, shape=cfg)
            t = bench(fn, rep=200)
            res.append({"workload": name, "state_dtype": state_dtype, "BV": BV, "num_warps": nw, "evict": ev,
                        **pct(w.hbm_bytes(), t["median"])})
            print(res[-1], flush=True)
    w = registry.get("ssd_decode_256")
    x = w.make_inputs("cuda")
    for BV, nw, ev in [(64, 8, ""), (64, 8, EF)]:
        t = bench(_ssd_decode_fn(x, StreamShape(128, BV, nw, 1, "sweep", evict=ev)), rep=200)
        res.append({"workload": "ssd_decode_256", "BV": BV, "num_warps": nw, "evict": ev,
                    **pct(w.hbm_bytes(), t["median"])})
        print(res[-1], flush=True)
    # streaming prefill at T = 4096, one sequence, 32 value heads
    T = 4096
    q, k, v, g, beta, S0 = prefill_inputs(T)
    o = torch.empty_like(v)
    fin = torch.empty_like(S0)
    for BV, nw in [(4, 1)]:
        cfg = StreamShape(128, BV, nw, 1, "sweep")
        fn = lambda: R.streaming_recurrence(  # noqa: E731
            q, k, v, o, scale=128 ** -0.5, delta=True, gate="scalar", g=g, beta=beta, beta_mode="head", l2norm=True,
            initial=S0, final=fin, num_sequences=1, shape=cfg)
        t = bench(fn, rep=200)
        res.append({"workload": "prefill_T4096_hv32", "BV": BV, "num_warps": nw, "time_s": t["median"],
                    "us_per_token": t["median"] / T * 1e6})
        print(res[-1], flush=True)
    # one request (32 heads): CUDA-graph replay per launch shape
    w = registry.Workload("gdn_decode_1", "gdn_decode", (1,), heads=16, value_heads=32)
    x = w.make_inputs("cuda")
    o = torch.empty_like(x["v"])
    for BV, nw in [(8, 1), (16, 1), (32, 1)]:
        cfg = StreamShape(128, BV, nw, 1, "sweep")
        fn = lambda: R.streaming_recurrence(  # noqa: E731
            x["q"], x["k"], x["v"], o, scale=128 ** -0.5, delta=True, gate="scalar", g=x["g"], beta=x["beta"],
            beta_mode="head", l2norm=True, initial=x["state"], final=x["state"], final_by_slot=True,
            slots=x["state_indices"], num_sequences=1, shape=cfg)
        fn()
        t = bench_graph(fn, rep=100)
        res.append({"workload": "gdn_decode_1_graph_replay", "BV": BV, "num_warps": nw, "time_s": t["median"]})
        print(res[-1], flush=True)
    out["launch_sweep"] = res


def _gdn_decode_config(w, x, cfg, start, reference):
    """One launch shape of the GDN decode kernel on workload ``w`` (inputs ``x``): run from the
    state ``start``, compared with ``reference`` (o, state) when given, and timed (do_bench).
    Returns (row, (o, state))."""
    from recurscan.launch import stream as R
    o = torch.empty_like(x["v"])
    fn = lambda: R.streaming_recurrence(  # noqa: E731
        x["q"], x["k"], x["v"], o, scale=128 ** -0.5, delta=True, gate="scalar", g=x["g"], beta=x["beta"],
        beta_mode="head", l2norm=True, initial=x["state"], final=x["state"], final_by_slot=True,
        slots=x["state_indices"], num_sequences=w.num_sequences, shape=cfg)
    x["state"].copy_(start)
    fn()
    torch.cuda.synchronize()
    got = (o.float().clone(), x["state"].float().clone())
    reference = reference or got
    hit = [h for key, h in R.LAUNCHES.items() if cfg in key][0]
    compiled = hit.direct.compiled if hit.direct is not None else None
    row = {"workload": w.name, "BV": cfg.BV, "num_warps": cfg.num_warps, "maxnreg": cfg.maxnreg,
           "n_regs": getattr(compiled, "n_regs", None), "n_spills": getattr(compiled, "n_spills", None),
           "o_max_abs_diff": (got[0] - reference[0]).abs().max().item(),
           "state_max_abs_diff": (got[1] - reference[1]).abs().max().item(),
           **pct(w.hbm_bytes(), bench(fn, rep=200)["median"])}
    print(row, flush=True)
    return row, got


def register_cap(out):
    """The one-warp [K, V] decode tile (BV 32) with a cap on registers per thread: 255 registers
    allow 8 resident warps an SM (128 KB of state in flight); 216 / 200 / 184 / 168 allow 9 / 10 /
    11 / 12, if the tile still fits without spilling. Outputs and states compared with the uncapped run."""
    from recurscan.plan import StreamShape
    res = []
    for name, n in (("gdn_decode_256", 256), ("gdn_decode_1024", 1024)):
        w = registry.Workload(name, "gdn_decode", (1,) * n, heads=16, value_heads=32)
        x = w.make_inputs("cuda")
        start, reference = x["state"].clone(), None
        for cap in (None, 232, 216, 200, 184, 168):
            row, got = _gdn_decode_config(w, x, StreamShape(128, 32, 1, 1, "sweep", maxnreg=cap), start, reference)
            reference = reference or got
            res.append(row)
    out["register_cap"] = res


def vk_sweep(out):
    """Launch shapes for key-contiguous states (a [S, HV, V, K] GDN cache passed as its transposed
    view, and mamba's [S, H, P, N]): tile rows of BV value rows x 128 keys, on 1-8 warps."""
    from recurscan.plan import StreamShape
    res = []
    shapes = [(8, 1), (16, 1), (32, 1), (16, 2), (32, 2), (32, 4), (64, 4), (64, 8)]
    for name, n, state_dtype in (("gdn_decode_256_vk", 256, "float32"), ("gdn_decode_1024_vk", 1024, "float32"),
                                 ("gdn_decode_256_vk_bf16", 256, "bfloat16")):
        w = registry.Workload(name, "gdn_decode", (1,) * n, heads=16, value_heads=32, state_dtype=state_dtype,
                              state_layout="vk")
        x = w.make_inputs("cuda")
        start, reference = x["state"].clone(), None
        for BV, nw in shapes:
            row, got = _gdn_decode_config(w, x, StreamShape(128, BV, nw, 1, "sweep"), start, reference)
            reference = reference or got
            res.append(row)
    w = registry.get("ssd_decode_256")
    x = w.make_inputs("cuda")
    for BV, nw in shapes:
        fn = _ssd_decode_fn(x, StreamShape(128, BV, nw, 1, "sweep"))
        row = {"workload": "ssd_decode_256", "BV": BV, "num_warps": nw,
               **pct(w.hbm_bytes(), bench(fn, rep=200)["median"])}
        res.append(row)
        print(row, flush=True)
    out["vk_sweep"] = res


def flush_effect(out):
    """How the L2 flush between timed calls bears on a bandwidth figure. do_bench flushes by
    zeroing 256 MB, which leaves L2 full of dirty lines that the timed kernel must write back while
    it streams. Timed four ways, for the 256-request decode and for a device copy of the same size
    (the ceiling's kind of kernel): do_bench (dirty flush), a read-only flush of 256 MB (L2 left
    clean), no flush (L2 warm with the previous call's data), and a CUDA graph over 8 state pools
    (each call's data cold; the previous call's writes dirty, as in serving)."""
    res = {}
    w = registry.Workload("gdn_decode_256", "gdn_decode", (1,) * 256, heads=16, value_heads=32)
    pools = [w.make_inputs("cuda", seed=i) for i in range(8)]
    x = pools[0]

    def call(y):
        return lambda: recurscan.fused_recurrent_gated_delta_rule_update(
            y["q"], y["k"], y["v"], y["g"], y["beta"], state=y["state"], state_indices=y["state_indices"],
            use_qk_l2norm_in_kernel=True)
    import recurscan
    src = torch.empty(w.hbm_bytes() // 8, dtype=torch.float32, device="cuda")  # copy: bytes read + written
    dst = torch.empty_like(src)
    copy_bytes = 2 * src.numel() * 4
    scratch = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    for label, fn, nbytes in (("gdn_decode_256", call(x), w.hbm_bytes()),
                              ("device_copy_same_bytes", lambda: dst.copy_(src), copy_bytes)):
        fn()
        torch.cuda.synchronize()
        row = {"bytes": nbytes}
        row["do_bench_dirty_flush"] = pct(nbytes, bench(fn, rep=200)["median"])
        times = []
        for _ in range(60):
            scratch.sum()  # read-only flush: evicts L2 without leaving dirty lines
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        row["clean_flush_events"] = pct(nbytes, sorted(times)[len(times) // 2])
        row["no_flush_graph"] = pct(nbytes, bench_graph(fn, rep=200)["median"])
        res[label] = row
        print(label, json.dumps(row), flush=True)
    over_pools = rotated_graph(lambda i: call(pools[i]), copies=len(pools))
    res["gdn_decode_256"]["graph_over_8_pools"] = pct(w.hbm_bytes(), over_pools["median"])
    print("graph over 8 pools", res["gdn_decode_256"]["graph_over_8_pools"], flush=True)
    out["flush_effect"] = res


def prefill_inputs(T, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, device="cuda")  # noqa: E731
    q, k, v = r(1, T, 16, 128).bfloat16(), r(1, T, 16, 128).bfloat16(), r(1, T, 32, 128).bfloat16()
    g = torch.nn.functional.logsigmoid(r(1, T, 32) + 3)
    beta = torch.sigmoid(r(1, T, 32)).bfloat16()
    return q, k, v, g, beta, 0.1 * r(1, 32, 128, 128)


def prefill(out, Ts=(1024, 4096, 16384, 65536)):
    import recurscan
    fla = None
    try:
        fla = runner._import("fla.ops.gated_delta_rule").fused_recurrent_gated_delta_rule
    except Exception as exc:
        out["prefill_fla_status"] = str(exc)
    rows = []
    for T in Ts:
        q, k, v, g, beta, S0 = prefill_inputs(T)
        ours = lambda: recurscan.fused_recurrent_gated_delta_rule_update(  # noqa: E731
            q, k, v, g, beta, initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        row = {"T": T, "ours": bench(ours, rep=400)}
        o1, s1 = ours()
        if fla is not None:
            f = lambda: fla(q, k, v, g=g, beta=beta, initial_state=S0, output_final_state=True,  # noqa: E731
                            use_qk_l2norm_in_kernel=True)
            row["fla"] = bench(f, rep=400)
            o2, s2 = f()
            row["agreement_rel_rms"] = {"o": ((o1.float() - o2.float()).pow(2).mean().sqrt()
                                              / o2.float().pow(2).mean().sqrt()).item(),
                                        "state": ((s1 - s2).pow(2).mean().sqrt() / s2.pow(2).mean().sqrt()).item()}
        rows.append(row)
        print(row, flush=True)
    fit = {}
    for who in ("ours", "fla"):
        pts = [(r["T"], r[who]["median"]) for r in rows if who in r]
        if len(pts) >= 2:
            n = len(pts)
            mx, my = sum(p[0] for p in pts) / n, sum(p[1] for p in pts) / n
            sxx = sum((p[0] - mx) ** 2 for p in pts)
            slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
            icpt = my - slope * mx
            ss_res = sum((p[1] - (icpt + slope * p[0])) ** 2 for p in pts)
            ss_tot = sum((p[1] - my) ** 2 for p in pts)
            fit[who] = {"slope_us_per_token": slope * 1e6, "intercept_us": icpt * 1e6, "r2": 1 - ss_res / ss_tot,
                        "us_per_token_at_each_T": [p[1] / p[0] * 1e6 for p in pts]}
    out["prefill"] = {"shape": "B1 H16 HV32 K=V=128, bf16 inputs, fp32 initial and final state, l2norm",
                      "rows": rows, "linear_fit": fit}
    print(json.dumps(fit, indent=1), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/gpu_decode.json")
    ap.add_argument("--sections", default="registered,one_request,speculative,sweep,prefill")
    args = ap.parse_args(argv)
    out = {"environment": runner.environment(torch.device("cuda")), "ceiling_bytes_per_s": BW,
           "command": "python -m benchmarks.gpu_decode " + " ".join(argv or sys.argv[1:]), "workloads": []}
    for sec in args.sections.split(","):
        t0 = time.perf_counter()
        try:
            globals()[sec](out)
        except Exception:
            out.setdefault("errors", {})[sec] = traceback.format_exc()
            print(out["errors"][sec], flush=True)
        out.setdefault("section_seconds", {})[sec] = time.perf_counter() - t0
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
    print("saved", args.out)


if __name__ == "__main__":
    main()
