"""The fused prefill (kernels/gluon/delta_fused.py) against its twin, the planned prep and sweep,
in one process: both built from the shape the planner chose for the problem (``fused`` on and
off), their outputs compared with each other, each timed by graph replay (and eagerly through
the op); GDN, bf16, l2norm, K = V = 128, the final state out. The rows sweep the (sequence, value
head) pairs around the planner's bound (``plan.delta.FUSED_MIN_PAIRS_PER_SM``), two varlen
batches (one of even lengths, one whose longest sequence holds most of the tokens) and a serving
batch that reads and writes a float32 state cache in place (vLLM's layout, [slots, HV, V, K]).

    python benchmarks/gpu_fused_prefill.py --out benchmarks/results/gpu_fused_prefill_<card>_<commit>.json

Each row also has the bytes the fused path moves (q, k, v read once, the outputs written, the
pre-pass's reads and writes) and its share of the H200's measured HBM bandwidth (DESIGN.md).
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

#: (name, B, T, H, HV, varlen lengths or None, serving from a state cache)
ROWS = [
    ("B2 T8192 H16 HV64 (128 pairs)", 2, 8192, 16, 64, None, False),
    ("B3 T8192 H16 HV64 (192 pairs)", 3, 8192, 16, 64, None, False),
    ("B4 T8192 H16 HV64 (256 pairs)", 4, 8192, 16, 64, None, False),
    ("B8 T8192 H16 HV32 (256 pairs)", 8, 8192, 16, 32, None, False),
    ("B8 T4096 H16 HV64 (512 pairs)", 8, 4096, 16, 64, None, False),
    ("B4 T4096 H16 HV16 (64 pairs, not planned)", 4, 4096, 16, 16, None, False),
    ("varlen 16 x 2048 H16 HV32 (512 pairs)", 1, 32768, 16, 32, [2048] * 16, False),
    ("varlen one of 24576 and 16 x 512 H16 HV32 (544 pairs)", 1, 32768, 16, 32, [24576] + [512] * 16, False),
    ("serving 32 x 1024 H16 HV32 from a float32 cache (1024 pairs)", 1, 32768, 16, 32, [1024] * 32, True),
]
HBM_GBPS = 4040.0  # the H200's measured copy bandwidth (DESIGN.md); the H100's is lower


def make(B, T, H, HV, lengths, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=gen, device="cuda")  # noqa: E731
    x = [rn(B, T, H, 128).bfloat16(), rn(B, T, H, 128).bfloat16(), rn(B, T, HV, 128).bfloat16(),
         torch.nn.functional.logsigmoid(rn(B, T, HV) + 3.0), torch.sigmoid(rn(B, T, HV)).bfloat16()]
    cu = None if lengths is None else torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device="cuda",
                                                   dtype=torch.int32)
    return x, cu


def measure(name, B, T, H, HV, lengths, serving, rep_ms):
    import triton.testing as tt

    import recurscan
    from recurscan.descriptors import build_chunk_descriptors
    from recurscan.kernels.gluon.delta_fused import gluon_fused_prefill_kernel
    from recurscan.launch.delta import DeltaInputs, build_delta_launches, run_delta_launches
    from recurscan.plan.delta import delta_shape
    from recurscan.problem import delta_problem
    from tests.helpers.tolerances import relative_rms

    x, cu = make(B, T, H, HV, lengths)
    q, k, v, g, beta = x
    ci = None if cu is None else build_chunk_descriptors(cu.cpu(), device="cuda").chunk_indices
    cache = slots = None
    if serving:  # every other slot of a cache twice the batch, stored [slots, HV, V, K]
        N = len(lengths)
        cache0 = (torch.randn(2 * N, HV, 128, 128, device="cuda") * 0.1).transpose(-1, -2).contiguous().transpose(-1, -2)
        slots = torch.arange(N, device="cuda", dtype=torch.int32).flip(0) * 2
    shape = delta_shape(delta_problem(q, k, v, g, beta, cu_seqlens=cu, state=cache0 if serving else None,
                                      state_indices=slots), q.device)
    row = dict(workload=name, planned_fused=shape.fused, row=shape.reason)
    runs = {}
    for fused in (True, False):
        if serving:
            cache = cache0.clone()
        launches = build_delta_launches(q, k, v, g, beta, dataclasses.replace(shape, fused=fused),
                                        output_final_state=not serving, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                        chunk_indices_dp=ci, state=cache, state_indices=slots)
        assert any(s.kernel is gluon_fused_prefill_kernel for s in launches.steps) == fused
        inp = DeltaInputs(q, k, v, g, beta, None, cache, slots, cu, ci)
        runs[fused] = run_delta_launches(launches, inp)
        if serving:
            runs[fused] = runs[fused][0], cache.clone()
        torch.cuda.synchronize()
        key = "fused" if fused else "twin"
        row[f"{key}_ms"] = tt.do_bench_cudagraph(lambda: run_delta_launches(launches, inp), rep=rep_ms)
    row["o_rel_rms_fused_vs_twin"] = relative_rms(runs[True][0], runs[False][0])
    row["state_rel_rms_fused_vs_twin"] = relative_rms(runs[True][1], runs[False][1])
    row["speedup"] = row["twin_ms"] / row["fused_ms"]
    if serving:  # the op serving its cache in place: each call moves the slots on
        op = lambda: recurscan.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,  # noqa: E731
                                                      cu_seqlens=cu, state=cache, state_indices=slots)
    else:
        op = lambda: recurscan.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,  # noqa: E731
                                                      output_final_state=True, cu_seqlens=cu)
    op()
    row["op_eager_ms"] = tt.do_bench(op, rep=rep_ms)
    tokens, N = B * T, (B if cu is None else len(lengths))
    moved = tokens * (2 * H * 128 * 2 + 2 * HV * 128 * 2 + HV * (4 + 2)) + tokens * HV * 4 * 4 * 2 \
        + N * HV * 128 * 128 * 4 * (2 if serving else 1)
    row["fused_bytes"] = moved
    row["fused_hbm_fraction_h200"] = moved / (row["fused_ms"] * 1e-3) / (HBM_GBPS * 1e9)
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
