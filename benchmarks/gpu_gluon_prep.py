"""The warp-specialised Gluon prep (kernels/gluon/delta_prep.py, with its pre-pass) against the
Triton prep it would replace, in one process on one GPU: both from the planner's row for the
problem with one phase and one segment (so that the prep is one launch before the sweep), their
outputs compared (wy, aqk, coef, and the sweep's outputs and final state from each), each timed by
graph replay alone and with the sweep; the planned row as it runs (phases and all) beside them.
GDN, bf16, l2norm, K = V = 128, dense.

    python benchmarks/gpu_gluon_prep.py --out benchmarks/results/gpu_gluon_prep_<card>_<commit>.json

``prep_sm_us_per_chunk``: each prep's SM-time a (chunk, value head), its time times the SMs over
the (chunk, value head) pairs: what a phase schedule can hide beside the sweep.
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

#: (name, B, T, H, HV)
ROWS = [
    ("B1 T16384 H16 HV32", 1, 16384, 16, 32),
    ("B4 T8192 H16 HV64", 4, 8192, 16, 64),
    ("B4 T4096 H16 HV16", 4, 4096, 16, 16),
    ("B1 T65536 H16 HV32", 1, 65536, 16, 32),
    ("B2 T1000 H4 HV8 (partial chunks)", 2, 1000, 4, 8),
]


def measure(name, B, T, H, HV, rep_ms):
    import triton
    import triton.testing as tt

    import recurscan
    from recurscan.kernels.delta.prep import chunk_delta_prep_kernel
    from recurscan.launch.delta import (BUFFER_NAMES, INPUT_NAMES, Step, allocate_buffers, build_delta_launches,
                                        is_sweep_step, launch_steps)
    from recurscan.launch.delta_prep import gluon_prep_call_ok, gluon_prep_steps
    from recurscan.plan.delta import delta_shape
    from recurscan.plan.device import sm_count
    from recurscan.problem import delta_problem
    from tests.helpers.tolerances import relative_rms

    gen = torch.Generator(device="cuda").manual_seed(0)
    rn = lambda *s: torch.randn(*s, generator=gen, device="cuda")  # noqa: E731
    q, k, v = rn(B, T, H, 128).bfloat16(), rn(B, T, H, 128).bfloat16(), rn(B, T, HV, 128).bfloat16()
    g = torch.nn.functional.logsigmoid(rn(B, T, HV) + 3.0)
    beta = torch.sigmoid(rn(B, T, HV)).bfloat16()
    assert gluon_prep_call_ok(q, k, HV)
    planned = delta_shape(delta_problem(q, k, v, g, beta, output_final_state=True), q.device)
    shape = dataclasses.replace(planned, phases=1, segments=1, fused=False)
    launches = build_delta_launches(q, k, v, g, beta, shape, output_final_state=True, use_qk_l2norm_in_kernel=True)
    prep_steps = [s for s in launches.steps if s.kernel is chunk_delta_prep_kernel]
    sweep_steps = [s for s in launches.steps if is_sweep_step(s)]
    assert len(prep_steps) == 1 and len(launches.steps) == len(prep_steps) + len(sweep_steps), launches.steps
    scale = 128 ** -0.5
    vec_buffers, gluon_steps = gluon_prep_steps(Step, B=B, T=T, H=H, HV=HV, K=128, scale=scale, has_g=True,
                                                beta_name="beta")
    inputs = (q, k, v, g, beta) + (None,) * (len(INPUT_NAMES) - 5)
    runs = {}
    for form, steps in (("triton", prep_steps), ("gluon", gluon_steps)):
        made = allocate_buffers(dataclasses.replace(launches, buffers=dict(launches.buffers, **vec_buffers)))
        for n in ("wy", "aqk", "coef"):
            made[n].fill_(float("nan"))
        values = inputs + tuple(made.get(n) for n in BUFFER_NAMES)
        launch_steps(steps, values)
        launch_steps(sweep_steps, values)
        torch.cuda.synchronize()
        runs[form] = dict(made=made, values=values, steps=steps)
    a, b = runs["triton"]["made"], runs["gluon"]["made"]
    row = dict(workload=name, row=planned.reason)
    row["wy_rel_rms"] = relative_rms(b["wy"].float(), a["wy"].float())
    row["aqk_rel_rms"] = relative_rms(b["aqk"].float(), a["aqk"].float())
    NT = triton.cdiv(T, 64)
    slots = torch.cat([torch.arange(NT, device="cuda") + (n * T) // 64 + n for n in range(B)])  # _chunk_slot
    rows_in = torch.minimum(torch.full((B, NT), 64, device="cuda"),
                            T - 64 * torch.arange(NT, device="cuda")).reshape(-1)
    cmask = torch.arange(64, device="cuda")[None, :] < rows_in[:, None]
    ca, cb = a["coef"][slots], b["coef"][slots]
    row["coef_rel_rms"] = relative_rms(cb[..., :3].permute(0, 2, 1, 3)[cmask].float(),
                                       ca[..., :3].permute(0, 2, 1, 3)[cmask].float())
    row["lam_last_equal"] = bool(torch.equal(cb[:, :, 0, 3], ca[:, :, 0, 3]))
    row["o_rel_rms"] = relative_rms(b["o"].float(), a["o"].float())
    row["final_rel_rms"] = relative_rms(b["final"].float(), a["final"].float())
    pairs = B * NT * HV
    for form in ("triton", "gluon"):
        values, steps = runs[form]["values"], runs[form]["steps"]
        row[f"{form}_prep_ms"] = tt.do_bench_cudagraph(lambda: launch_steps(steps, values), rep=rep_ms)
        row[f"{form}_prep_and_sweep_ms"] = tt.do_bench_cudagraph(
            lambda: (launch_steps(steps, values), launch_steps(sweep_steps, values)), rep=rep_ms)
        if form == "gluon":
            row["gluon_prep_alone_ms"] = tt.do_bench_cudagraph(lambda: launch_steps(steps[1:], values), rep=rep_ms)
            row["gluon_vectors_ms"] = tt.do_bench_cudagraph(lambda: launch_steps(steps[:1], values), rep=rep_ms)
        row[f"{form}_prep_sm_us_per_chunk"] = row[f"{form}_prep_ms"] * 1e3 * sm_count(q.device) / pairs
    row["sweep_ms"] = tt.do_bench_cudagraph(lambda: launch_steps(sweep_steps, runs["triton"]["values"]), rep=rep_ms)
    op = lambda: recurscan.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,  # noqa: E731
                                                  output_final_state=True)
    op()
    row["planned_ms"] = tt.do_bench_cudagraph(op, rep=rep_ms)
    print(row, flush=True)
    return row


def main():
    from benchmarks.runner import save_rows
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--only", action="append", help="rows whose name starts with this")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = [measure(*r, args.rep_ms) for r in ROWS if not args.only or any(r[0].startswith(o) for o in args.only)]
    if args.out:
        save_rows(rows, args.out, torch.device("cuda"))


if __name__ == "__main__":
    main()
