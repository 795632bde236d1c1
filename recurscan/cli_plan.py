"""``recurscan plan``: the planner's two schedules of a Gated DeltaNet prefill (the chunked kernels,
and the streaming kernel the decode ops run), the cost model's predicted time of each
(plan/cost.py, with the measured ceilings of the device, or of ``--ceilings``), the choice the
cost model makes, and on a GPU each one's measured time beside its prediction.

    recurscan plan --family gdn --tokens 65536 --sequences 1 --heads 16 --value-heads 32 --head-dim 128

``--family``: gdn, the one family with both schedules and a calibrated cost model so far.
"""
from __future__ import annotations

import statistics

import torch


def _problem(args, device):
    from .problem import delta_problem
    T = args.tokens // args.sequences * args.sequences  # equal sequences
    m = lambda *s, dtype=torch.bfloat16: torch.empty(*s, device=device, dtype=dtype)  # noqa: E731
    H, HV, D = args.heads, args.value_heads, args.head_dim
    cu = None if args.sequences == 1 else torch.arange(args.sequences + 1, device=device) * (T // args.sequences)
    tensors = (m(1, T, H, D), m(1, T, H, D), m(1, T, HV, D), m(1, T, HV, dtype=torch.float32), m(1, T, HV))
    return T, cu, delta_problem(*tensors, cu_seqlens=cu)


def _measure(op, repeats: int) -> float:
    """Median seconds of ``op()`` by CUDA events, after a warm-up call."""
    op()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        op()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from .cli import _at_least_one, _device, _Parser
    from .plan import plan
    from .plan.cost import CEILINGS, ceilings_for, predict_chunked, predict_streaming
    from .plan.device import device_name
    parser = _Parser(prog="recurscan plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=["gdn"], default="gdn",
                        help="the scan family (gdn: Gated DeltaNet; the others have no cost model yet)")
    parser.add_argument("--tokens", type=_at_least_one, default=16384, help="tokens in all (>= 1)")
    parser.add_argument("--sequences", type=_at_least_one, default=1, help="equal sequences they make (>= 1)")
    parser.add_argument("--heads", type=_at_least_one, default=16, help="q/k heads")
    parser.add_argument("--value-heads", type=_at_least_one, default=32, help="value heads (a multiple of --heads)")
    parser.add_argument("--head-dim", type=_at_least_one, default=128, help="K = V")
    parser.add_argument("--device", type=_device, default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--ceilings", choices=sorted(CEILINGS), help="predict with this device's measured ceilings "
                                                                       "(default: the device's own, else H200)")
    parser.add_argument("--repeats", type=_at_least_one, default=10, help="timed calls on a GPU, median reported")
    args = parser.parse_args(argv)
    if args.value_heads % args.heads:
        parser.error(f"--value-heads {args.value_heads} is not a multiple of --heads {args.heads}")
    if args.tokens < args.sequences:
        parser.error(f"--tokens {args.tokens} is fewer than --sequences {args.sequences}")
    device = args.device
    name = device_name(device)
    ceilings = CEILINGS[args.ceilings] if args.ceilings else (ceilings_for(name) or CEILINGS["H200"])
    T, cu, problem = _problem(args, "meta")
    H, HV, D, N = args.heads, args.value_heads, args.head_dim, args.sequences
    print(f"recurscan plan: Gated DeltaNet, {T} tokens in {N} sequence(s), H {H}, HV {HV}, K = V = {D}, on {name}; "
          f"predictions with the {ceilings.name}'s measured ceilings ({ceilings.source})")
    predicted = {"chunked": predict_chunked(T, N, H, HV, D, D, ceilings),
                 "streaming": predict_streaming(T, N, H, HV, D, D, ceilings)}
    schedules = {"chunked": plan("delta_rule", problem, device, "chunked"),
                 "streaming": plan("delta_rule", problem, device, "recurrent")}
    measured = {}
    if device.type == "cuda":
        import recurscan
        gen = torch.Generator(device=device).manual_seed(0)
        rn = lambda *s: torch.randn(*s, device=device, generator=gen)  # noqa: E731
        q, k, v = rn(1, T, H, D).bfloat16(), rn(1, T, H, D).bfloat16(), rn(1, T, HV, D).bfloat16()
        g, beta = torch.nn.functional.logsigmoid(rn(1, T, HV) + 4), torch.rand(1, T, HV, device=device).bfloat16()
        cu_d = None if cu is None else cu.to(device=device, dtype=torch.int32)
        kw = dict(cu_seqlens=cu_d, use_qk_l2norm_in_kernel=True, output_final_state=True)
        with torch.inference_mode():
            measured["chunked"] = _measure(lambda: recurscan.chunk_gated_delta_rule(q, k, v, g, beta, **kw),
                                           args.repeats)
            measured["streaming"] = _measure(
                lambda: recurscan.fused_recurrent_gated_delta_rule(q, k, v, g, beta, **kw), args.repeats)
    for algorithm in ("chunked", "streaming"):
        print(f"\n{algorithm}: {schedules[algorithm].describe()}")
        line = f"  predicted {predicted[algorithm]}"
        if algorithm in measured:
            line += f"; measured {measured[algorithm] * 1e3:.3f} ms " \
                    f"(predicted / measured {predicted[algorithm].seconds / measured[algorithm]:.2f})"
        print(line)
    choice = min(predicted, key=lambda a: predicted[a].seconds)
    print(f"\nthe cost model's choice: {choice}" +
          (f"; the faster measured: {min(measured, key=measured.get)}" if measured else ""))
    return 0
