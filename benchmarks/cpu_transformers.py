"""CPU: recurscan's chunked Gated DeltaNet against transformers' pure-PyTorch one, same inputs, one process.

    python -m benchmarks.cpu_transformers [--out benchmarks/results/cpu_gdn_vs_transformers.json]

Workload ``cpu_gdn_b1_t4096_h16``: B1 T4096 H = HV = 16, K = V = 128, float32, L2 norm of q and k
in the op, no initial state, final state returned; g = logsigmoid(N(3, 1)) (natural-log decays,
about -0.07), beta = sigmoid(N(0, 1)). torch uses every core this process may run on.

transformers' ``torch_chunk_gated_delta_rule`` (transformers.models.qwen3_next.modeling_qwen3_next)
takes the same layout and conventions as recurscan/fla: q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``,
g and beta ``[B, T, HV]``, g a natural-log decay, initial/final state ``[B, HV, K, V]`` in float32,
returns ``(o [B, T, HV, V] in q's dtype, final_state or None)``; L2 norm (x * rsqrt(sum x^2 + 1e-6))
only when ``use_qk_l2norm_in_kernel``; scale fixed at K ** -0.5: it has no scale parameter and
its ``**kwargs`` swallows ``scale=`` silently (checked: scale=0.5 gives the identical output), so
only the default scale can be compared. It is taken unwrapped from its hub/fla dispatch decorator, so
the PyTorch code runs even where fla is installed.

Agreement gate: the relative RMS of the output difference and of the final-state difference must
be below 1e-4 (float32 reassociation gives ~1e-6), on the workload and on small convention checks
(grouped value heads, an initial state, T not a multiple of 64, strong decays, no L2 norm, B > 1);
otherwise this exits 1 and says so.
"""
from __future__ import annotations

import argparse
import sys

from . import runner

WORKLOAD = "cpu_gdn_b1_t4096_h16"
DEFAULT_OUT = "benchmarks/results/cpu_gdn_vs_transformers.json"
REL_RMS_LIMIT = 1e-4


def convention_checks(seed: int = 1) -> list[dict]:
    """Small cases that would expose a convention difference between the two: grouped value heads
    (HV = 2H), an initial state, T not a multiple of 64, strong decays, no L2 norm, B > 1. Each
    reports the relative RMS of the output and final-state differences."""
    import torch

    import recurscan

    f = runner.transformers_torch_chunk_gdn()
    cases = [
        dict(name="gva_hv2h", B=1, T=200, H=2, HV=4, l2=True, h0=False, gmean=3.0),
        dict(name="initial_state", B=2, T=130, H=2, HV=2, l2=True, h0=True, gmean=3.0),
        dict(name="strong_decay", B=1, T=150, H=2, HV=2, l2=True, h0=True, gmean=-1.0),
        dict(name="no_l2norm_T63", B=1, T=63, H=2, HV=2, l2=False, h0=False, gmean=3.0),
    ]
    out = []
    for c in cases:
        gen = torch.Generator().manual_seed(seed)
        B, T, H, HV, D = c["B"], c["T"], c["H"], c["HV"], 32
        q, k = torch.randn(B, T, H, D, generator=gen), torch.randn(B, T, H, D, generator=gen)
        if not c["l2"]:  # unnormalised keys need beta ||k||^2 < 2 to stay stable
            q, k = q / D**0.5, k / D**0.5
        v = torch.randn(B, T, HV, D, generator=gen)
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, generator=gen) + c["gmean"])
        beta = torch.rand(B, T, HV, generator=gen)
        h0 = torch.randn(B, HV, D, D, generator=gen) * 0.1 if c["h0"] else None
        o1, s1 = recurscan.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                  use_qk_l2norm_in_kernel=c["l2"])
        o2, s2 = f(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=c["l2"])
        rel = lambda a, b: ((a - b).pow(2).mean().sqrt() / a.pow(2).mean().sqrt()).item()  # noqa: E731
        out.append(dict(c, output_rel_rms=rel(o1, o2), final_state_rel_rms=rel(s1, s2),
                        passed=max(rel(o1, o2), rel(s1, s2)) < REL_RMS_LIMIT))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cpu_transformers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, help="torch threads (default: all cores available)")
    ap.add_argument("--workload", default=WORKLOAD, help=f"a CPU GDN workload (default {WORKLOAD})")
    args = ap.parse_args(argv)

    rec = runner.run_workload(args.workload, device="cpu", impls=["recurscan", "transformers"],
                              warmup=args.warmup, repeats=args.repeats, threads=args.threads)
    print(runner.format_table(rec))
    by = {r["name"]: r for r in rec["results"]}
    ours, peer = by["recurscan"], by["transformers"]
    check = {"rel_rms_limit": REL_RMS_LIMIT, "passed": None}
    status = 0
    if ours["status"] != "ok" or peer["status"] != "ok":
        for r in (ours, peer):
            if r["status"] != "ok":
                print(f"{r['name']}: {r['status']}: {r['detail']}")
        check["detail"] = "not compared: an implementation did not run"
        status = 0 if peer["status"] == "not installed" and ours["status"] == "ok" else 1
    else:
        ag = peer["agreement"]
        for label in ("output", "final_state"):
            a = ag[label]
            print(f"{label:<12} max |recurscan - transformers| = {a['max_abs_diff']:.3e} "
                  f"(max |recurscan| {a['max_abs_ref']:.3e}), rel RMS = {a['rel_rms']:.3e}")
        check["passed"] = all(ag[k]["rel_rms"] < REL_RMS_LIMIT for k in ("output", "final_state"))
        print(f"transformers_time / recurscan_time = {peer['ratio_peer_over_ours']:.3f} "
              f"({runner._fmt_time(peer['time_s']['median'])} / {runner._fmt_time(ours['time_s']['median'])}, "
              f"{rec['environment']['torch_threads']} torch threads)")
        if not check["passed"]:
            print(f"DISAGREEMENT: rel RMS above {REL_RMS_LIMIT}: a convention difference or a bug; investigate")
            status = 1
    if peer["status"] == "ok":
        rec["convention_checks"] = convention_checks()
        for c in rec["convention_checks"]:
            print(f"convention check {c['name']:<14} rel RMS output {c['output_rel_rms']:.2e}, "
                  f"final state {c['final_state_rel_rms']:.2e}")
        if not all(c["passed"] for c in rec["convention_checks"]):
            print(f"DISAGREEMENT in a convention check (rel RMS >= {REL_RMS_LIMIT}); investigate")
            check["passed"] = False
            status = 1
    rec["check"] = check
    runner.save([rec], args.out)
    print(f"saved {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
