"""Issue 22's table: over T from 1 to 64K tokens a sequence and N from 1 to 1024 sequences
(N x T at most 2^20 tokens), GDN H16 HV32 K=V=128 bf16, the chunked op and the streaming op
(``chunk_gated_delta_rule``, ``fused_recurrent_gated_delta_rule``; varlen for N > 1), each timed
by CUDA-graph replay, beside the cost model's predictions (recurscan/plan/cost.py) and its choice:
whether the choice is within 10% of the faster measured, and each prediction within 2x.
``--from FILE``: no GPU; the measured times of a stored table judged against the current cost
model (the predictions are pure functions of the sizes and the ceilings).

    PYTHONPATH=$PWD python benchmarks/gpu_plan_table.py --out benchmarks/results/gpu_plan_table.json
    PYTHONPATH=$PWD python benchmarks/gpu_plan_table.py --from benchmarks/results/gpu_plan_table_cdc4e1d.json \
        --out benchmarks/results/plan_table_model.json
"""
from __future__ import annotations

import argparse

import torch
import triton.testing as tt

import recurscan
from benchmarks import runner
from recurscan.plan.cost import ceilings_for, predict_chunked, predict_streaming

TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536]
SEQUENCES = [1, 8, 64, 256, 1024]
H, HV, D = 16, 32, 128


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--max-tokens", type=int, default=1 << 20, help="N x T at most")
    ap.add_argument("--from", dest="stored", help="judge a stored table's measured times (no GPU)")
    args = ap.parse_args()
    if args.stored:
        return from_stored(args.stored, args.out)
    ceilings = ceilings_for(torch.cuda.get_device_name())
    rows = []
    for N in SEQUENCES:
        for T in TOKENS:
            total = N * T
            if total > args.max_tokens:
                continue
            gen = torch.Generator(device="cuda").manual_seed(0)
            rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
            q, k, v = rn(1, total, H, D).bfloat16(), rn(1, total, H, D).bfloat16(), rn(1, total, HV, D).bfloat16()
            g = torch.nn.functional.logsigmoid(rn(1, total, HV) + 4)
            beta = torch.rand(1, total, HV, device="cuda").bfloat16()
            kw = dict(use_qk_l2norm_in_kernel=True, output_final_state=True)
            if N > 1:
                cu = torch.arange(N + 1, device="cuda", dtype=torch.int32) * T
                d = recurscan.build_chunk_descriptors(cu, 1, device="cuda")
                chunked_kw = dict(kw, cu_seqlens=cu, chunk_indices=d.chunk_indices, chunk_offsets=d.chunk_offsets)
                stream_kw = dict(kw, cu_seqlens=cu)
            else:
                chunked_kw = stream_kw = kw
            measured = {}
            with torch.inference_mode():
                calls = {"chunked": lambda: recurscan.chunk_gated_delta_rule(q, k, v, g, beta, backend="triton",
                                                                     **chunked_kw),
                         "streaming": lambda: recurscan.fused_recurrent_gated_delta_rule(q, k, v, g, beta, **stream_kw)}
                for name, call in calls.items():
                    call()
                    torch.cuda.synchronize()
                    measured[name] = tt.do_bench_cudagraph(call, rep=100, return_mode="median") * 1e-3
            rows.append(judge(N, T, measured, ceilings))
    summarise(rows)
    if args.out:
        runner.save_rows(rows, args.out, torch.device("cuda"))


def judge(N, T, measured, ceilings) -> dict:
    """One row of the table: the model's predictions for N sequences of T tokens, its choice, and
    both against ``measured`` (seconds by schedule)."""
    total = N * T
    predicted = {"chunked": predict_chunked(total, N, H, HV, D, D, ceilings).seconds,
                 "streaming": predict_streaming(total, N, H, HV, D, D, ceilings).seconds}
    choice = min(predicted, key=predicted.get)
    row = dict(sequences=N, tokens_each=T, measured_s=measured, predicted_s=predicted, choice=choice,
               choice_within_10_percent=measured[choice] <= 1.1 * min(measured.values()),
               predicted_over_measured={a: predicted[a] / measured[a] for a in measured})
    row["predictions_within_2x"] = {a: 0.5 <= r <= 2 for a, r in row["predicted_over_measured"].items()}
    print(f"N {N:5d} T {T:6d}: chunked {measured['chunked'] * 1e3:8.3f} ms (predicted "
          f"{predicted['chunked'] * 1e3:8.3f}), streaming {measured['streaming'] * 1e3:8.3f} ms (predicted "
          f"{predicted['streaming'] * 1e3:8.3f}); choice {choice} "
          f"{'ok' if row['choice_within_10_percent'] else 'MISS'}", flush=True)
    return row


def summarise(rows) -> None:
    ratios = [r for row in rows for r in row["predicted_over_measured"].values()]
    print(f"{len(rows)} rows: choice within 10% of the faster in {sum(r['choice_within_10_percent'] for r in rows)}; "
          f"predictions within 2x: {sum(0.5 <= r <= 2 for r in ratios)} of {len(ratios)} "
          f"(predicted / measured {min(ratios):.2f} to {max(ratios):.2f})")


def from_stored(path: str, out: str | None) -> None:
    """The measured times of a stored table judged against the current model (the H200's ceilings)."""
    import json
    from recurscan.plan.cost import CEILINGS
    stored = json.load(open(path))
    rows = [judge(r["sequences"], r["tokens_each"], r["measured_s"], CEILINGS["H200"]) for r in stored["rows"]]
    summarise(rows)
    if out:
        with open(out, "w") as f:
            json.dump(dict(environment=stored["environment"], measured_in=path, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
