"""What the sweep's output products cost on its chain (H200, graph replay).

    python -m benchmarks.gpu_sweep_chain --out benchmarks/results/gpu_sweep_chain.json

Per chunk the sweep forms the state's chain (K S, U = wy X, S <- lam_last S + K^T (gam U)) and,
beside it, the outputs (Q S, aqk U and the store). Nothing in the outputs feeds the next chunk,
but Triton 3.6 waits on every tensor-core product before the next instruction (sm_90 SASS:
``WARPGROUP.DEPBAR.LE gsb0, 0x0`` after each of the loop's product groups), so within a program
they run one after another with the chain. This times, per workload and at the planner's launch
shape, the sweep alone (the single pass, PASS 0) and the same kernel without outputs (PASS 1 of a
two-segment plan: segment 0's chain, no q, no aqk, no output products or stores), each per chunk
step of one program. Their difference is what a sweep that ran the outputs asynchronously, beside
the chain (a warp-specialised or async-wgmma kernel), could take off each chunk step at most.

The scratch the sweep reads (wy, aqk, coef) is left as allocated: the timings do not depend on
its values.
"""
from __future__ import annotations

import argparse
import json

import torch

WORKLOADS = ["gdn_b1_t16384_h16_hv32", "gdn_b4_t8192_h16_hv64"]


def measure(name: str, rep_ms: int) -> dict:
    import triton
    import triton.testing as tt

    from recurscan.launch.delta import run_delta_launches
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem

    from .delta_variants import variant_launches
    from .gpu_chunk_delta import kernel_inputs

    (q, k, v, g, beta), M, cu, kw = kernel_inputs(name)
    L = delta_shape(delta_problem(q, k, v, g, beta, num_householder=M, cu_seqlens=cu), torch.device("cuda"))
    shape = dict(block_v=L.block_v, num_warps=L.num_warps, num_stages=L.num_stages, v_product=L.v_product)
    inputs = (q, k, v, g, beta, None, None, None, kw.get("cu_seqlens"), kw.get("chunk_indices_dp"), None)

    def plan(**extra):
        return variant_launches(q, k, v, g, beta, num_householder=M, use_qk_l2norm_in_kernel=True,
                                output_final_state=True, stage="sweep", **shape, **extra, **kw)

    sweep = plan(tma_store=L.tma_store)
    chain = plan(segments=2)
    if chain.steps[0].kwargs.get("PASS") != 1:  # the plan's order is what this measures
        raise RuntimeError(f"{name}: the two-segment plan does not start with pass 1")
    chain.steps = chain.steps[:1]  # pass 1 alone (of this copy): segment 0's chain, no outputs
    n_chunks = triton.cdiv(q.shape[1], 64)
    row = {"workload": name, "launch": {**shape, "tma_store": L.tma_store}, "chunks_per_program": n_chunks,
           "chain_chunks_per_program": triton.cdiv(n_chunks, 2)}
    with torch.no_grad():
        for key, p, chunks in (("sweep", sweep, n_chunks), ("chain", chain, triton.cdiv(n_chunks, 2))):
            run_delta_launches(p, inputs)  # first call through Triton's JIT; then direct launches
            ms = tt.do_bench_cudagraph(lambda: run_delta_launches(p, inputs), rep=rep_ms,
                                       quantiles=[0.5, 0.2, 0.8])
            row[key] = {"median_ms": ms[0], "p20_ms": ms[1], "p80_ms": ms[2], "us_per_chunk": ms[0] * 1e3 / chunks}
    row["outputs_share_of_chunk_step"] = 1 - row["chain"]["us_per_chunk"] / row["sweep"]["us_per_chunk"]
    print(json.dumps(row), flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_sweep_chain")
    ap.add_argument("--workload", action="append", help=f"default: {' '.join(WORKLOADS)}")
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    from .runner import save_rows
    rows = [measure(n, args.rep_ms) for n in args.workload or WORKLOADS]
    if args.out:
        save_rows(rows, args.out, torch.device("cuda"))


if __name__ == "__main__":
    main()
