"""The ``recurscan`` command: a short workload of every family on the best device present, each
checked against the oracle's token loop (float64, CPU), printed as a table.

    recurscan [--device cpu|cuda] [--family NAME ...] [--tokens T] [--repeats R]

Exit status 1 if any family misses its tolerance.
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
from .reference import delta, diagonal, gla, ssd


@dataclass
class Workload:
    family: str
    shape: str
    tokens: int
    make: Callable[[int], dict]  # tokens -> float32 CPU inputs
    run: Callable[[dict], tuple]  # the public op -> (output, final state)
    oracle: Callable[[dict], tuple]  # the token loop -> (output, final state)


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
                beta=torch.rand(1, T * M, H), num_householder=M, cu_seqlens=torch.tensor([0, 1, T // 3, T]))


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


def workloads(tokens: int) -> list[Workload]:
    l2 = dict(use_qk_l2norm_in_kernel=True)
    return [
        Workload("gdn", "B1 H4 HV8 K64 V64", tokens, _gdn,
                 lambda x: ops.chunk_gated_delta_rule(**x, output_final_state=True, **l2),
                 lambda x: delta.gated_delta_rule_naive(**_f64(x), **l2)),
        Workload("gdp (M=2)", "3 seqs H4 K64 V64", tokens, _gdp,
                 lambda x: ops.chunk_gated_delta_product_varlen(**x, output_final_state=True, **l2),
                 lambda x: delta.gated_delta_product_naive(**_f64(x), **l2)),
        Workload("ssd", "B1 H8 P64 G2 N64", tokens, _ssd,
                 lambda x: ops.mamba_chunk_scan_combined(**x, chunk_size=64, return_final_states=True),
                 lambda x: ssd.ssd_naive(**_f64(x))),
        Workload("gla scalar", "B1 H4 K64 V64", tokens, lambda T: _gla(T, False),
                 lambda x: ops.chunk_simple_gla(**x, output_final_state=True),
                 lambda x: gla.gla_naive(**_f64(x))),
        Workload("gla per-key", "B1 H4 K64 V64", tokens, lambda T: _gla(T, True),
                 lambda x: ops.chunk_gla(**x, output_final_state=True),
                 lambda x: gla.gla_naive(**_f64(x))),
        Workload("diagonal", "B2 D256", tokens, _diag,
                 lambda x: ops.diagonal_scan(**x, output_final_state=True),
                 lambda x: diagonal.diagonal_naive(**_f64(x))),
        Workload("gdn decode", "32 requests x 1 token, HV8", 32, _decode,
                 lambda x: ops.fused_recurrent_gated_delta_rule(**x, output_final_state=True, **l2),
                 lambda x: delta.gated_delta_rule_naive(**_f64(x), **l2)),
    ]


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
    return dict(family=work.family, shape=f"T{work.tokens} {work.shape}" if work.tokens != 32 else work.shape,
                time=seconds, tokens_per_s=tokens / seconds, error=err)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="recurscan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the public ops run (default: the best present)")
    parser.add_argument("--family", action="append", help="run only these families (repeatable)")
    parser.add_argument("--tokens", type=int, default=1024, help="sequence length of the prefill workloads")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per workload (median reported)")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="max error relative to the oracle's largest magnitude (float32 vs float64)")
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error("--tokens: expected a positive integer")
    device = torch.device(args.device)
    todo = [w for w in workloads(args.tokens) if not args.family or any(f in w.family for f in args.family)]
    if not todo:
        parser.error(f"--family: none of {args.family} is a family; choose from "
                     f"{', '.join(w.family for w in workloads(1))}")

    from tqdm import tqdm

    rows = []
    for work in tqdm(todo, desc=f"recurscan on {device}", unit="family", file=sys.stderr):
        rows.append(check(work, device, args.repeats))
    print(f"\nrecurscan on {device} (torch {torch.__version__}); error = max |op - oracle| / max |oracle|,"
          f" oracle = token loop in float64")
    header = f"{'family':<12} {'shape':<32} {'time':>10} {'tokens/s':>12} {'max error':>10}  check"
    print(header)
    print("-" * len(header))
    failed = False
    for r in rows:
        ok = r["error"] <= args.tolerance
        failed |= not ok
        print(f"{r['family']:<12} {r['shape']:<32} {r['time'] * 1e3:>8.2f}ms {r['tokens_per_s']:>12,.0f} "
              f"{r['error']:>10.2e}  {'ok' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
