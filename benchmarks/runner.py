"""Time recurscan and its peers on a registered workload; print a table and save a JSON record.

    python -m benchmarks.runner --list
    python -m benchmarks.runner --workload cpu_gdn_b1_t4096_h16 --out benchmarks/results/FILE.json
    python -m benchmarks.runner --workload gdn_b1_t16384_h16_hv32 --workload gdn_decode_256   # GPU

Timing. CUDA: ``triton.testing.do_bench`` (it zeroes a 256 MB buffer before every call, so L2 is
flushed), quantiles 0.5 / 0.2 / 0.8 of the per-call times; ``--cuda-graph`` uses
``do_bench_cudagraph`` instead (no host overhead, no L2 flush). CPU: ``time.perf_counter`` around
each call after warm-up calls, median / p20 / p80 (linear interpolation, as numpy's default).
Every implementation runs in this process on the same inputs; each one's first call (compile,
autotune, lazy imports) is timed separately. Each implementation's output and final state are
compared with ours (max abs diff and relative RMS, in float32).

A peer that cannot be imported is reported as "not installed" with the import error; one that
cannot take the workload (e.g. no cu_seqlens) as "unsupported"; one that raises as "error".
Nothing is ever substituted for a missing implementation.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import importlib.metadata
import inspect
import json
import os
import platform
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from . import registry

# Measured ceilings (shared/DESIGN.md, "Figures measured on the GPU machine"): the % columns divide
# by these. Matched by substring of the CUDA device name; on CPU no ceiling is claimed.
CEILINGS = {
    "H200": {"flops_per_s": 782e12, "bytes_per_s": 4.27e12,
             "source": "DESIGN.md: bf16 matmul 8192^3 782 TFLOP/s; device-to-device copy 4.27 TB/s "
                       "(bytes read + written)"},
}

REPO = Path(__file__).resolve().parent.parent


class NotInstalled(Exception):
    """The implementation's package cannot be imported here."""


class Unsupported(Exception):
    """The implementation exists but cannot run this workload (said why)."""


@dataclass
class Impl:
    """An implementation: ``load(workload)`` returns ``fn(inputs) -> (o, final_state or None)``,
    or raises NotInstalled / Unsupported."""

    name: str
    role: str  # "ours" or "peer"
    load: Callable[[registry.Workload], Callable[[dict], tuple]]
    description: str = ""
    version: Callable[[], str | None] = lambda: None


def _dist_version(*names: str) -> str | None:
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _import(module: str):
    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or a package whose import fails on this machine
        raise NotInstalled(f"import {module} failed ({type(exc).__name__}: {exc})") from None


# ---- ours -----------------------------------------------------------------------------------------

def _ours_delta(w: registry.Workload):
    rs = _import("recurscan")
    if w.family == "gdn":
        def fn(x):
            # Varlen: the descriptors are built once per step (here: on the warm-up call), as a
            # server does; given them, the op never synchronises with the host.
            desc = {}
            if x["cu_seqlens"] is not None:
                if "_descriptors" not in x:
                    from recurscan.descriptors import build_chunk_descriptors
                    x["_descriptors"] = build_chunk_descriptors(x["cu_seqlens"], device=x["q"].device)
                desc = dict(chunk_indices=x["_descriptors"].chunk_indices,
                            chunk_offsets=x["_descriptors"].chunk_offsets)
            return rs.chunk_gated_delta_rule(
                x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                output_final_state=x["output_final_state"], use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"],
                cu_seqlens=x["cu_seqlens"], **desc)[:2]
        return fn
    if w.family == "gdp":
        M = w.num_householder
        op = getattr(rs, "chunk_gated_delta_product_varlen", None)
        if op is None:
            raise Unsupported("recurscan has no chunk_gated_delta_product_varlen")

        def fn(x):
            q, k, v, g, beta = x["q"], x["k"], x["v"], x["g"], x["beta"]
            B, T = q.shape[:2]
            cu = x["cu_seqlens"]
            if cu is None:  # a fixed-length batch is B equal sequences packed as B = 1 (views)
                cu = torch.arange(B + 1, device=q.device, dtype=torch.int64) * T
                q, k, v, g, beta = (t.reshape(1, -1, *t.shape[2:]) for t in (q, k, v, g, beta))
            o, S = op(q, k, v, g, beta, M, cu, initial_state=x["initial_state"],
                      output_final_state=x["output_final_state"],
                      use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"])[:2]
            return o.reshape(B, T, *o.shape[2:]), S
        return fn
    if w.family == "gdn_decode":
        def fn(x):
            o, _ = rs.fused_recurrent_gated_delta_rule_update(
                x["q"], x["k"], x["v"], x["g"], x["beta"], state=x["state"], state_indices=x["state_indices"],
                use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"])
            return o, x["state"]
        return fn
    raise Unsupported(f"no recurscan op for family {w.family!r}")


def _ours_ssd_decode(w: registry.Workload):
    rs = _import("recurscan")
    op = getattr(rs, "selective_state_update", None)
    if op is None:
        raise Unsupported("recurscan has no selective_state_update (SSD decode) op yet")
    return _ssd_update_fn(op)


def _ours(w: registry.Workload):
    return _ours_ssd_decode(w) if w.family == "ssd_decode" else _ours_delta(w)


# ---- peers ----------------------------------------------------------------------------------------

def _fla(w: registry.Workload):
    if w.family == "gdn":
        mod = _import("fla.ops.gated_delta_rule")

        def fn(x):
            return mod.chunk_gated_delta_rule(
                x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                output_final_state=x["output_final_state"], use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"],
                cu_seqlens=x["cu_seqlens"])
        return fn
    if w.family == "gdp":
        if w.heads != w.value_heads:
            raise Unsupported("fla's chunk_gated_delta_product needs H == HV")
        mod = _import("fla.ops.gated_delta_product")

        def fn(x):
            return mod.chunk_gated_delta_product(
                x["q"], x["k"], x["v"], x["g"], x["beta"], w.num_householder, initial_state=x["initial_state"],
                output_final_state=x["output_final_state"], cu_seqlens=x["cu_seqlens"],
                use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"])
        return fn
    if w.family == "gdn_decode":
        mod = _import("fla.ops.gated_delta_rule")

        def fn(x):  # the pool in slot order is fla's initial_state; it writes a new final state
            # Keywords: in fla 0.6.0 the fifth positional argument is gk (a per-key decay), not beta.
            return mod.fused_recurrent_gated_delta_rule(
                x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], initial_state=x["state"], output_final_state=True,
                use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"])
        return fn
    raise Unsupported(f"no fla op for family {w.family!r}")


def transformers_torch_chunk_gdn():
    """transformers' pure-PyTorch ``torch_chunk_gated_delta_rule`` (Qwen3-Next), unwrapped from its
    hub/fla dispatch decorator so that it is the PyTorch code even where fla is installed."""
    mod = _import("transformers.models.qwen3_next.modeling_qwen3_next")
    fn = inspect.unwrap(mod.torch_chunk_gated_delta_rule)
    if getattr(getattr(fn, "__code__", None), "co_name", None) != "torch_chunk_gated_delta_rule":
        raise Unsupported(f"could not reach the pure-PyTorch function (got {fn!r})")
    return fn


def _transformers(w: registry.Workload):
    if w.family != "gdn":
        raise Unsupported(f"transformers has no pure-PyTorch op for family {w.family!r}")
    if w.varlen:
        raise Unsupported("the pure-PyTorch path takes no cu_seqlens (it needs fla for packed input)")
    f = transformers_torch_chunk_gdn()

    def fn(x):
        # Its scale is always K ** -0.5 (no scale argument; our default too); l2norm eps 1e-6 like ours.
        return f(x["q"], x["k"], x["v"], x["g"], x["beta"], chunk_size=w.chunk_size,
                 initial_state=x["initial_state"], output_final_state=x["output_final_state"],
                 use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"])
    return fn


def load_mamba(module: str, attr: str):
    """``attr`` of mamba_ssm's Triton module ``module`` (e.g. ``selective_state_update``). Its
    package ``__init__`` imports CUDA extensions, so when a plain import fails and
    ``MAMBA_SSM_SRC`` names an unpacked source tree (the folder holding ``mamba_ssm/``), only
    ``mamba_ssm/ops/triton`` and ``mamba_ssm/utils`` are loaded under stub parent packages
    (DESIGN.md, Benchmarks)."""
    name = f"mamba_ssm.ops.triton.{module}"
    try:
        return getattr(importlib.import_module(name), attr)
    except Exception as exc:
        first = exc
    src = os.environ.get("MAMBA_SSM_SRC")
    if not src or not (Path(src) / "mamba_ssm").is_dir():
        raise NotInstalled(f"import {name} failed ({type(first).__name__}: {first}); "
                           "set MAMBA_SSM_SRC to an unpacked mamba-ssm source tree to load its Triton ops")
    for pkg in ("mamba_ssm", "mamba_ssm.ops"):  # stubs: no __init__ code runs
        sys.modules.pop(pkg, None)
        stub = types.ModuleType(pkg)
        stub.__path__ = [str(Path(src, *pkg.split(".")))]
        sys.modules[pkg] = stub
    try:
        return getattr(importlib.import_module(name), attr)
    except Exception as exc:
        raise NotInstalled(f"{name} from MAMBA_SSM_SRC={src} failed ({type(exc).__name__}: {exc})") \
            from None


def load_mamba_selective_state_update():
    """mamba_ssm's Triton ``selective_state_update`` (:func:`load_mamba`)."""
    return load_mamba("selective_state_update", "selective_state_update")


def _ssd_update_fn(op):
    def fn(x):
        N, Hs, P, Ns = x["state"].shape
        # Mamba2's decode call: per-head dt, A, D, dt_bias tied over headdim (and A over dstate) by
        # stride-0 views, which its kernel detects (TIE_HDIM).
        dt = x["dt"][:, :, None].expand(N, Hs, P)
        A = x["A"][:, None, None].expand(Hs, P, Ns)
        D = x["D"][:, None].expand(Hs, P)
        dt_bias = x["dt_bias"][:, None].expand(Hs, P)
        y = op(x["state"], x["x"], dt, A, x["B"], x["C"], D=D, z=None, dt_bias=dt_bias,
               dt_softplus=x["dt_softplus"])
        return y, x["state"]
    return fn


def _mamba(w: registry.Workload):
    if w.family != "ssd_decode":
        raise Unsupported(f"no mamba_ssm op wired for family {w.family!r}")
    return _ssd_update_fn(load_mamba_selective_state_update())


IMPLS = [
    Impl("recurscan", "ours", _ours, "recurscan public op", lambda: _dist_version("recurscan")),
    Impl("fla", "peer", _fla, "flash-linear-attention (fla-core)", lambda: _dist_version("fla-core", "flash-linear-attention")),
    Impl("transformers", "peer", _transformers, "transformers torch_chunk_gated_delta_rule (pure PyTorch)",
         lambda: _dist_version("transformers")),
    Impl("mamba_ssm", "peer", _mamba, "mamba_ssm Triton selective_state_update", lambda: _dist_version("mamba-ssm")),
]


def applicable_impls(w: registry.Workload, names: list[str] | None = None) -> list[Impl]:
    """The implementations to try for ``w``: ours, then every peer that has an op for its family."""
    families = {"recurscan": {"gdn", "gdp", "gdn_decode", "ssd_decode"}, "fla": {"gdn", "gdp", "gdn_decode"},
                "transformers": {"gdn"}, "mamba_ssm": {"ssd_decode"}}
    chosen = [i for i in IMPLS if w.family in families.get(i.name, {w.family})]
    if names:
        unknown = set(names) - {i.name for i in IMPLS}
        if unknown:
            raise ValueError(f"unknown implementation(s) {sorted(unknown)}; known: {[i.name for i in IMPLS]}")
        chosen = [i for i in IMPLS if i.name in names]
    return chosen


# ---- environment ------------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def git_commit() -> dict[str, Any]:
    """HEAD and whether tracked files differ from it. $RECURSCAN_COMMIT, when set, wins: the GPU
    machine's copy of the tree may carry a stale .git of its own (runs at ed71d2d recorded
    006bb40+dirty from it). ``source`` says which."""
    if os.environ.get("RECURSCAN_COMMIT"):
        return {"commit": os.environ["RECURSCAN_COMMIT"], "dirty": None, "source": "RECURSCAN_COMMIT"}

    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode == 0:
            dirty = git("status", "--porcelain", "--untracked-files=no")
            return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip()), "source": "git"}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"commit": None, "dirty": None, "source": None}


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "device_type": device.type,
        "cpu_model": cpu_model(),
        "cpu_cores": cpu_cores(),
        "torch_threads": torch.get_num_threads(),
        "git": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _dist_version("triton"),
        "numpy": _dist_version("numpy"),
        "platform": platform.platform(),
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        env["loadavg_1_5_15min"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    if PLAN_SET:
        env["plan_set"] = list(PLAN_SET)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   compute_capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda,
                   gpu_count=torch.cuda.device_count())
    else:
        env["device_name"] = f"{env['cpu_model']} ({env['cpu_cores']} cores, {env['torch_threads']} torch threads)"
    return env


def ceilings_for(device: torch.device) -> dict[str, Any] | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, c in CEILINGS.items():
        if key in name:
            return dict(c, matched=key)
    return None


# ---- timing ---------------------------------------------------------------------------------------------

def quantile(xs: list[float], p: float) -> float:
    """Linear-interpolation quantile (numpy's default method)."""
    s = sorted(xs)
    pos = p * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _busy_cpu_seconds() -> float | None:
    """CPU seconds all processes have spent busy (not idle/iowait), from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        ticks = [int(f) for f in fields]
        busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
        return busy / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def time_cpu(fn: Callable[[], Any], warmup: int, repeats: int) -> dict[str, Any]:
    """perf_counter around each call after ``warmup`` calls. Also reports ``other_processes_cpu``:
    CPU-seconds per second that other processes used meanwhile (0 on a quiet machine; near the
    core count means the figures are contended and should be re-run)."""
    for _ in range(warmup):
        fn()
    times = []
    busy0, own0, wall0 = _busy_cpu_seconds(), os.times(), time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    busy1, own1, wall1 = _busy_cpu_seconds(), os.times(), time.perf_counter()
    other = None
    if busy0 is not None and busy1 is not None:
        own = (own1.user - own0.user) + (own1.system - own0.system)
        other = round(max(0.0, (busy1 - busy0) - own) / (wall1 - wall0), 3)
    return {"median": quantile(times, 0.5), "p20": quantile(times, 0.2), "p80": quantile(times, 0.8),
            "samples": times, "other_processes_cpu": other}


def time_cuda(fn: Callable[[], Any], warmup_ms: int, rep_ms: int, cuda_graph: bool) -> dict[str, Any]:
    import triton.testing as tt
    q = [0.5, 0.2, 0.8]
    if cuda_graph:
        ms = tt.do_bench_cudagraph(fn, rep=rep_ms, quantiles=q)
    else:
        ms = tt.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=q)
    return {"median": ms[0] / 1e3, "p20": ms[1] / 1e3, "p80": ms[2] / 1e3}


def _agreement(ours: tuple, theirs: tuple) -> dict[str, Any]:
    """max |diff| and RMS(diff) / RMS(ours) of the output and of the final state, in float32."""
    out = {}
    for label, a, b in (("output", ours[0], theirs[0]), ("final_state", ours[1], theirs[1])):
        if a is None or b is None:
            out[label] = None
            continue
        a, b = a.float(), b.float()
        if a.shape != b.shape:
            out[label] = {"shape_mismatch": [list(a.shape), list(b.shape)]}
            continue
        d = a - b
        ref_rms = a.pow(2).mean().sqrt().item()
        out[label] = {"max_abs_diff": d.abs().max().item(), "rel_rms": d.pow(2).mean().sqrt().item() / max(ref_rms, 1e-30),
                      "max_abs_ref": a.abs().max().item()}
    return out


def _clone_inputs(x: dict) -> dict:
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in x.items()}


def _detach(res) -> tuple:
    o, S = (tuple(res) + (None, None))[:2]
    return (o.detach().clone() if isinstance(o, torch.Tensor) else None,
            S.detach().clone() if isinstance(S, torch.Tensor) else None)


def run_workload(workload: registry.Workload | str, *, device: str | torch.device | None = None,
                 impls: list[str] | None = None, extra_impls: list[Impl] | None = None, seed: int = 0,
                 warmup: int = 2, repeats: int = 9, warmup_ms: int = 100, rep_ms: int = 500,
                 cuda_graph: bool = False, threads: int | None = None) -> dict[str, Any]:
    """Time every implementation on one workload; return the JSON record (see README.md)."""
    w = registry.get(workload) if isinstance(workload, str) else workload
    dev = torch.device(device or ("cuda" if w.device == "cuda" and torch.cuda.is_available() else "cpu"))
    if dev.type == "cpu":
        torch.set_num_threads(threads or cpu_cores())
    env = environment(dev)
    ceilings = ceilings_for(dev)
    inputs = w.make_inputs(dev, seed)
    record: dict[str, Any] = {
        "schema": 1,
        "workload": w.describe(),
        "environment": env,
        "timing": ({"method": "triton.testing.do_bench_cudagraph" if cuda_graph else "triton.testing.do_bench",
                    "l2_flushed": not cuda_graph, "warmup_ms": warmup_ms, "rep_ms": rep_ms,
                    "quantiles": [0.5, 0.2, 0.8]} if dev.type == "cuda" else
                   {"method": "time.perf_counter", "warmup_calls": warmup, "repeats": repeats,
                    "quantiles": [0.5, 0.2, 0.8], "torch_threads": torch.get_num_threads()}),
        "seed": seed,
        "ceilings": ceilings,
        "results": [],
    }
    candidates = applicable_impls(w, impls) + list(extra_impls or [])
    candidates.sort(key=lambda i: i.role != "ours")  # ours first: the reference for agreement
    reference = None  # (name, outputs) of ours, or of the first implementation that ran
    for impl in candidates:
        res: dict[str, Any] = {"name": impl.name, "role": impl.role, "description": impl.description}
        try:
            res["version"] = impl.version()
        except Exception:
            res["version"] = None
        try:
            fn = impl.load(w)
        except NotInstalled as exc:
            res.update(status="not installed", detail=str(exc))
            record["results"].append(res)
            continue
        except Unsupported as exc:
            res.update(status="unsupported", detail=str(exc))
            record["results"].append(res)
            continue
        # Decode ops update their state cache in place: each implementation gets its own copy.
        x = _clone_inputs(inputs) if w.is_decode else inputs
        try:
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            _sync(dev)
            t0 = time.perf_counter()
            with torch.no_grad():
                outputs = _detach(fn(x))
            _sync(dev)
            res["first_call_s"] = time.perf_counter() - t0
            if w.is_decode:  # compare the first call's results: restore the state before timing
                x = _clone_inputs(inputs)
                # do_bench_cudagraph calls fn first on a stream of its own, which does not wait for
                # these copies: unsynchronised, that call read a cache and slots still being copied.
                _sync(dev)
            with torch.no_grad():
                call = lambda: fn(x)  # noqa: E731
                t = time_cuda(call, warmup_ms, rep_ms, cuda_graph) if dev.type == "cuda" else \
                    time_cpu(call, warmup, repeats)
            if dev.type == "cuda":
                res["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 3)
        except Exception as exc:  # recorded, never hidden
            res.update(status="error", detail=f"{type(exc).__name__}: {exc}")
            record["results"].append(res)
            continue
        med = t["median"]
        res.update(status="ok", time_s=t, tokens_per_s=w.tokens / med, flops_per_s=w.flops() / med,
                   bytes_per_s=w.hbm_bytes() / med)
        if ceilings:
            res["pct_peak_flops"] = 100 * res["flops_per_s"] / ceilings["flops_per_s"]
            res["pct_peak_bytes"] = 100 * res["bytes_per_s"] / ceilings["bytes_per_s"]
        if reference is None:  # ours when it ran (it is tried first), else the first that ran
            reference = (impl.name, outputs)
        if reference is not None and reference[0] != impl.name:
            res["agreement_vs"] = reference[0]
            res["agreement"] = _agreement(reference[1], outputs)
        record["results"].append(res)
    ours = next((r for r in record["results"] if r["role"] == "ours" and r["status"] == "ok"), None)
    for r in record["results"]:
        if r["role"] != "ours" and r["status"] == "ok":
            r["ratio_peer_over_ours"] = r["time_s"]["median"] / ours["time_s"]["median"] if ours else None
    return record


# ---- output ---------------------------------------------------------------------------------------------

def _fmt_time(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.3f} s"


def format_table(record: dict[str, Any]) -> str:
    w, env = record["workload"], record["environment"]
    lines = [f"{w['name']}: {w['tokens']} tokens, {w['flops'] / 1e9:.2f} GFLOP, {w['hbm_bytes'] / 1e6:.1f} MB min "
             f"| {env['device_name']} | commit {str(env['git']['commit'])[:10]}{'+dirty' if env['git']['dirty'] else ''}"]
    head = f"{'impl':<14}{'median':>12}{'p20':>12}{'p80':>12}{'Mtok/s':>10}{'TFLOP/s':>9}{'GB/s':>9}"
    if record["ceilings"]:
        head += f"{'%FLOP':>7}{'%BW':>7}"
    head += f"{'peer/ours':>11}  agreement (rel RMS o / state)"
    lines.append(head)
    for r in record["results"]:
        if r["status"] != "ok":
            lines.append(f"{r['name']:<14}{r['status']}: {r['detail']}")
            continue
        t = r["time_s"]
        row = (f"{r['name']:<14}{_fmt_time(t['median']):>12}{_fmt_time(t['p20']):>12}{_fmt_time(t['p80']):>12}"
               f"{r['tokens_per_s'] / 1e6:>10.3f}{r['flops_per_s'] / 1e12:>9.3f}{r['bytes_per_s'] / 1e9:>9.1f}")
        if record["ceilings"]:
            row += f"{r['pct_peak_flops']:>7.1f}{r['pct_peak_bytes']:>7.1f}"
        ratio = r.get("ratio_peer_over_ours")
        row += f"{(f'{ratio:.3f}' if ratio is not None else '-'):>11}"
        ag = r.get("agreement")
        if ag:
            o, s = ag.get("output"), ag.get("final_state")
            row += "  " + " / ".join(f"{v['rel_rms']:.2e}" if v and "rel_rms" in v else "-" for v in (o, s))
        lines.append(row)
        other = t.get("other_processes_cpu")
        if other is not None and other > 0.2:
            lines.append(f"{'':<14}warning: other processes used {other:.2f} CPU-s per second while this was timed")
    return "\n".join(lines)


def save(records: list[dict[str, Any]], path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"records": records}, indent=2) + "\n")


#: The planner values set_plan changed in this process (recorded by environment()).
PLAN_SET: list[str] = []


def set_plan(assignments: list[str]) -> None:
    """``NAME=VALUE`` assignments to ``recurscan.plan.delta`` (each NAME one it has), or
    ``NAME.FIELD=VALUE`` to a field of a dataclass row there (``GLUON_FORWARD_SPECIALIZED.on=True``)."""
    import ast
    import dataclasses

    from recurscan.plan import delta as plan_delta
    for text in assignments:
        name, _, value = text.partition("=")
        name, _, field = name.partition(".")
        if not hasattr(plan_delta, name):
            raise SystemExit(f"--plan: recurscan.plan.delta has no {name!r}")
        new = ast.literal_eval(value)
        if field:
            new = dataclasses.replace(getattr(plan_delta, name), **{field: new})
        setattr(plan_delta, name, new)
        PLAN_SET.append(text)
        print(f"recurscan.plan.delta.{name} = {getattr(plan_delta, name)!r}", flush=True)


def save_rows(rows: list[dict[str, Any]], path: str | os.PathLike, device: torch.device) -> None:
    """A benchmark's rows with the environment they were measured in, as JSON at ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": environment(device), "rows": rows}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.runner", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append", help="registered workload name (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the registered workloads and exit")
    ap.add_argument("--out", help="save the JSON here ({'records': [...]})")
    ap.add_argument("--impl", action="append", help="only these implementations (repeatable): "
                    + ", ".join(i.name for i in IMPLS))
    ap.add_argument("--device", help="cuda or cpu (default: the workload's intended device if present)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=2, help="CPU: untimed calls before timing")
    ap.add_argument("--repeats", type=int, default=9, help="CPU: timed calls")
    ap.add_argument("--warmup-ms", type=int, default=100, help="CUDA: do_bench warmup")
    ap.add_argument("--rep-ms", type=int, default=500, help="CUDA: do_bench measurement time")
    ap.add_argument("--cuda-graph", action="store_true", help="CUDA: do_bench_cudagraph (no L2 flush)")
    ap.add_argument("--threads", type=int, help="CPU: torch threads (default: all cores available)")
    args = ap.parse_args(argv)
    if args.list:
        for name, w in registry.REGISTRY.items():
            print(f"{name:<28}{w.family:<12}{w.device:<6}{w.tokens:>8} tok  {w.flops() / 1e9:>9.2f} GFLOP  "
                  f"{w.hbm_bytes() / 1e6:>9.1f} MB  {w.note}")
        return 0
    if not args.workload:
        ap.error("--workload NAME is required (or --list)")
    records = []
    for name in args.workload:
        w = registry.get(name)
        if w.device == "cuda" and not torch.cuda.is_available() and args.device != "cpu":
            print(f"{name}: a GPU workload and no CUDA device here (pass --device cpu to run it on the CPU anyway)")
            continue
        rec = run_workload(w, device=args.device, impls=args.impl, seed=args.seed, warmup=args.warmup,
                           repeats=args.repeats, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                           cuda_graph=args.cuda_graph, threads=args.threads)
        print(format_table(rec))
        records.append(rec)
    if args.out and records:
        save(records, args.out)
        print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
