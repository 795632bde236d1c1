"""The ``recurscan`` command: a short workload of every family on the best device present, each
checked against the oracle's token loop (float64, CPU), printed as a table.

    recurscan [--device cpu|cuda[:N]] [--family NAME ...] [--tokens T] [--repeats R]

Each op runs the backend it chooses for its device (on a CUDA device the delta-rule chunked
prefill and decode run the Triton kernels, the other families the PyTorch form); the header
names the device and, per workload, the backend that ran.

Exit status 1 if any family misses its tolerance; 2, with one line on stderr, for a usage mistake.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from . import ops
from .plan import Schedule, plan
from .problem import delta_problem, diagonal_problem, gla_problem, ssd_problem
from .reference import delta, diagonal, gla, ssd


@dataclass
class Workload:
    family: str  # as the table shows it
    name: str  # as --family takes it
    shape: str
    tokens: int  # the prefill length (decode: the number of requests, one token each)
    make: Callable[[int], dict]  # tokens -> float32 CPU inputs
    run: Callable[[dict], tuple]  # the public op -> (output, final state)
    oracle: Callable[[dict], tuple]  # the token loop -> (output, final state)
    schedule: Callable[[dict, torch.device], Schedule]  # what the op plans for these inputs on a device
    prefill: bool = True


def _randn(*shape):
    return torch.randn(*shape)


def _log_decay(*shape):
    return torch.nn.functional.logsigmoid(torch.randn(*shape) + 3)


def _gdn(T):
    H, HV, K, V = 4, 8, 64, 64
    return dict(q=_randn(1, T, H, K), k=_randn(1, T, H, K), v=_randn(1, T, HV, V), g=_log_decay(1, T, HV),
                beta=torch.rand(1, T, HV))


def _gdp(T):
    M, H, K, V = 2, 4, 64, 64
    return dict(q=_randn(1, T, H, K), k=_randn(1, T * M, H, K), v=_randn(1, T * M, H, V), g=_log_decay(1, T, H),
                beta=torch.rand(1, T * M, H), num_householder=M, cu_seqlens=_three_sequences(T))


def _three_sequences(T):
    """Boundaries of three packed sequences, a one-token one first: ``[0, 1, T // 3, T]``, kept
    non-decreasing for T < 3 (then the later sequences are empty, as padding entries are)."""
    first = min(1, T)
    return torch.tensor([0, first, max(first, T // 3), T])


def _ssd(T):
    H, P, G, N = 8, 64, 2, 64
    return dict(x=_randn(1, T, H, P), dt=_randn(1, T, H), A=-torch.rand(H) * 4, B=_randn(1, T, G, N),
                C=_randn(1, T, G, N), D=torch.randn(H), dt_bias=torch.randn(H) - 2, dt_softplus=True)


def _gla(T, per_key):
    H, K, V = 4, 64, 64
    g = _log_decay(1, T, H, K) if per_key else _log_decay(1, T, H)
    return dict(q=_randn(1, T, H, K), k=_randn(1, T, H, K), v=_randn(1, T, H, V), g=g)


def _diag(T):
    return dict(a=torch.rand(2, T, 256), b=_randn(2, T, 256))


def _decode(T):
    n, H, HV, K, V = 32, 4, 8, 64, 64
    return dict(q=_randn(n, 1, H, K), k=_randn(n, 1, H, K), v=_randn(n, 1, HV, V), g=_log_decay(n, 1, HV),
                beta=torch.rand(n, 1, HV), initial_state=_randn(n, HV, K, V))


def _f64(inputs):
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}


# What each op plans (recurscan/plan/) for the workload's inputs: the CLI reports the backend
# that ran from the same call the op makes.
def _plan_delta(x, device):
    problem = delta_problem(x["q"], x["k"], x["v"], x["g"], x["beta"], num_householder=x.get("num_householder", 1),
                            initial_state=x.get("initial_state"), cu_seqlens=x.get("cu_seqlens"))
    return plan("delta_rule", problem, device)


def _plan_decode(x, device):
    problem = delta_problem(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"])
    return plan("delta_rule", problem, device, "recurrent")


def _plan_ssd(x, device):
    return plan("ssd", ssd_problem(x["x"], x["dt"], x["A"], x["B"], x["C"], D=x["D"], dt_bias=x["dt_bias"]), device)


def _plan_gla(per_key):
    return lambda x, device: plan("gla", gla_problem(x["q"], x["k"], x["v"], x["g"], per_key_decay=per_key), device)


def _plan_diagonal(x, device):
    return plan("diagonal", diagonal_problem(x["a"], x["b"]), device)


def workloads(tokens: int) -> list[Workload]:
    l2 = dict(use_qk_l2norm_in_kernel=True)
    return [
        Workload("gdn", "gdn", "B1 H4 HV8 K64 V64", tokens, _gdn,
                 lambda x: ops.chunk_gated_delta_rule(**x, output_final_state=True, **l2),
                 lambda x: delta.gated_delta_rule_naive(**_f64(x), **l2), _plan_delta),
        Workload("gdp (M=2)", "gdp", "3 seqs H4 K64 V64", tokens, _gdp,
                 lambda x: ops.chunk_gated_delta_product_varlen(**x, output_final_state=True, **l2),
                 lambda x: delta.gated_delta_product_naive(**_f64(x), **l2), _plan_delta),
        Workload("ssd", "ssd", "B1 H8 P64 G2 N64", tokens, _ssd,
                 lambda x: ops.mamba_chunk_scan_combined(**x, chunk_size=64, return_final_states=True),
                 lambda x: ssd.ssd_naive(**_f64(x)), _plan_ssd),
        Workload("gla scalar", "gla-scalar", "B1 H4 K64 V64", tokens, lambda T: _gla(T, False),
                 lambda x: ops.chunk_simple_gla(**x, output_final_state=True),
                 lambda x: gla.gla_naive(**_f64(x)), _plan_gla(False)),
        Workload("gla per-key", "gla-per-key", "B1 H4 K64 V64", tokens, lambda T: _gla(T, True),
                 lambda x: ops.chunk_gla(**x, output_final_state=True),
                 lambda x: gla.gla_naive(**_f64(x)), _plan_gla(True)),
        Workload("diagonal", "diagonal", "B2 D256", tokens, _diag,
                 lambda x: ops.diagonal_scan(**x, output_final_state=True),
                 lambda x: diagonal.diagonal_naive(**_f64(x)), _plan_diagonal),
        Workload("gdn decode", "gdn-decode", "32 requests x 1 token, HV8", 32, _decode,
                 lambda x: ops.fused_recurrent_gated_delta_rule(**x, output_final_state=True, **l2),
                 lambda x: delta.gated_delta_rule_naive(**_f64(x), **l2), _plan_decode, prefill=False),
    ]


FAMILY_NAMES = tuple(w.name for w in workloads(1))


def _backend(schedule: Schedule) -> str:
    """The backend of a schedule in words."""
    if schedule.backend == "triton":
        return "triton"
    form = "token loop" if schedule.algorithm == "recurrent" else "chunked form"
    return f"torch (PyTorch oracle, {form})"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def _to(inputs, device):
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def check(work: Workload, device: torch.device, repeats: int) -> dict:
    """Time the public op on ``device`` and compare output and final state with the token loop."""
    torch.manual_seed(0)
    inputs = work.make(work.tokens)
    on_device = _to(inputs, device)
    schedule = work.schedule(on_device, device)
    work.run(on_device)  # warm-up (compilation, caches)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        out, final = work.run(on_device)[:2]
        _sync(device)
        times.append(time.perf_counter() - start)
    want_out, want_final = work.oracle(inputs)[:2]
    # Relative to the oracle's scale: the op runs in float32 (the oracle in float64).
    err = max(((got.double().cpu() - want).abs().max() / want.abs().max().clamp(min=1e-30)).item()
              for got, want in ((out, want_out), (final, want_final)))
    seconds = statistics.median(times)
    tokens = out.shape[0] * out.shape[1]
    return dict(family=work.family, shape=f"T{work.tokens} {work.shape}" if work.prefill else work.shape,
                time=seconds, tokens_per_s=tokens / seconds, error=err, backend=_backend(schedule),
                backend_short=schedule.backend)


class _Parser(argparse.ArgumentParser):
    """Usage mistakes: one line on stderr and exit status 2 (argparse's status), no usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _device(text: str) -> torch.device:
    """cpu or cuda[:N], a CUDA device only where one is present."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu or cuda[:N], got {text!r}")
    if device.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: no CUDA GPU is available here (torch {torch.__version__}); "
                                         f"use --device cpu")
    index = torch.cuda.current_device() if device.index is None else device.index
    count = torch.cuda.device_count()
    if index >= count:
        raise argparse.ArgumentTypeError(f"{text!r}: no such device; this machine's CUDA devices are "
                                         f"{', '.join(f'cuda:{i}' for i in range(count))}")
    return torch.device("cuda", index)


def _family(text: str) -> str:
    by_name = {w.name: w.name for w in workloads(1)} | {w.family: w.name for w in workloads(1)}
    if text not in by_name:
        raise argparse.ArgumentTypeError(f"{text!r} is not a family; choose from {', '.join(FAMILY_NAMES)}")
    return by_name[text]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plan"]:  # recurscan plan ...: the schedules and the cost model (cli_plan.py)
        from .cli_plan import main as plan_main
        return plan_main(argv[1:])
    parser = _Parser(prog="recurscan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", type=_device, default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the public ops run: cpu or cuda[:N] (default: the best present)")
    parser.add_argument("--family", action="append", type=_family,
                        help=f"run only this family (repeatable): one of {', '.join(FAMILY_NAMES)}")
    parser.add_argument("--tokens", type=_at_least_one, default=1024,
                        help="sequence length of the prefill workloads (>= 1)")
    parser.add_argument("--repeats", type=_at_least_one, default=3,
                        help="timed calls per workload, median reported (>= 1)")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="max error relative to the oracle's largest magnitude (float32 vs float64)")
    args = parser.parse_args(argv)
    device = args.device
    todo = [w for w in workloads(args.tokens) if not args.family or w.name in args.family]

    from tqdm import tqdm

    rows = []
    for work in tqdm(todo, desc=f"recurscan on {device}", unit="family", file=sys.stderr):
        rows.append(check(work, device, args.repeats))
    print(f"\nrecurscan on {_device_name(device)} (torch {torch.__version__}); "
          f"error = max |op - oracle| / max |oracle|, oracle = token loop in float64")
    by_backend: dict[str, list[str]] = {}
    for r in rows:
        by_backend.setdefault(r["backend"], []).append(r["family"])
    for backend, families in by_backend.items():
        print(f"backend {backend} on {_device_name(device)}: {', '.join(families)}")
    header = f"{'family':<12} {'shape':<32} {'backend':<8} {'time':>10} {'tokens/s':>12} {'max error':>10}  check"
    print(header)
    print("-" * len(header))
    failed = False
    for r in rows:
        ok = r["error"] <= args.tolerance
        failed |= not ok
        print(f"{r['family']:<12} {r['shape']:<32} {r['backend_short']:<8} {r['time'] * 1e3:>8.2f}ms "
              f"{r['tokens_per_s']:>12,.0f} {r['error']:>10.2e}  {'ok' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
