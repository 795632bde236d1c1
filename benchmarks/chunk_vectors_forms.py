"""Forms of the chunk vectors' pass (kernels/delta/chunk_vectors.py), dense only, timed alone by graph
replay on the GPU: the package's kernel at 2, 4 and 8 warps, and a looped form in this file whose
program takes CHUNKS consecutive chunks of one q/k head (the head still fastest across programs),
its loads pipelined NUM_STAGES deep by Triton (``tl.range``), so that each program has the next
chunk's q and k in flight while it reduces this one's. Every form's vectors are compared with the
package's (NaN where both are NaN counts as equal). The looped kernel repeats the package kernel's
arithmetic (without its diagonal inverses), so that the package's kernel stays as it is: measured on
an H100 at 35f37ce, the looped forms took ~3x the package kernel's time
(results/chunk_vectors_forms_h100_35f37ce.json), so the loop was not folded into the package.

    python -m benchmarks.chunk_vectors_forms --out benchmarks/results/chunk_vectors_forms_<card>_<commit>.json
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from benchmarks.ab_chunk_vectors import pass_inputs
from recurscan.kernels.delta.chunk_vectors import chunk_vectors_grid, chunk_vectors_kernel
from recurscan.kernels.delta.common import _chunk_slot

ROWS = [("B4 T8192 H16 HV64", 4, 8192, 16, 64), ("B1 T32768 H16 HV32", 1, 32768, 16, 32),
        ("B4 T4096 H16 HV16", 4, 4096, 16, 16)]


@triton.jit
def chunk_vectors_looped_kernel(q, k, g, beta, vec, T, n_chunks, H: tl.constexpr, HV: tl.constexpr,
                                K: tl.constexpr, BT: tl.constexpr, CHUNKS: tl.constexpr, NUM_STAGES: tl.constexpr):
    """The package's pass (dense, with a decay) over CHUNKS chunks a program: program -> (chunks
    [b CHUNKS, (b + 1) CHUNKS) of the stream, q/k head pid % H)."""
    pid = tl.program_id(0).to(tl.int64)
    i_h = (pid % H).to(tl.int32)
    GROUP: tl.constexpr = HV // H
    GP: tl.constexpr = triton.next_power_of_2(GROUP)
    NT = tl.cdiv(T, BT)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_g = tl.arange(0, GP)
    for i in tl.range(0, CHUNKS, num_stages=NUM_STAGES):
        i_c = (pid // H) * CHUNKS + i
        i_n = i_c // NT
        i_t = i_c % NT
        bos = i_n * T
        rows = bos + i_t * BT + o_t
        live = (rows < bos + T) & (i_c < n_chunks)
        m_g = live[:, None] & (o_g < GROUP)[None, :]
        p_hv = rows[:, None] * HV + i_h * GROUP + o_g[None, :]
        b_k = tl.load(k + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        b_q = tl.load(q + (rows * H + i_h)[:, None] * K + o_k[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        b_g = tl.load(g + p_hv, mask=m_g, other=0.0).to(tl.float32)
        b_beta = tl.load(beta + p_hv, mask=m_g, other=0.0).to(tl.float32)
        k_sq = tl.sum(b_k * b_k, axis=1)
        rq = tl.rsqrt(tl.sum(b_q * b_q, axis=1) + 1e-6)
        rk = tl.rsqrt(k_sq + 1e-6)
        bad = (k_sq * 0.0 != 0.0)[:, None] | (b_g * 0.0 != 0.0) | (b_beta * 0.0 != 0.0) | (b_beta < 0.0) | \
            (b_beta * (k_sq * rk * rk)[:, None] > 2.0)
        gc = tl.cumsum(b_g, axis=0) * 1.4426950408889634
        gc = tl.where((tl.max(bad.to(tl.int32), axis=0) != 0)[None, :], float("nan"), gc)
        slot = _chunk_slot(bos, i_t, i_n, BT)
        p = vec + ((slot * HV + i_h * GROUP + o_g) * (4 * BT))[None, :] + o_t[:, None]
        m_v = (o_g < GROUP)[None, :] & (o_t >= 0)[:, None] & (i_c < n_chunks)
        tl.store(p, gc, mask=m_v)
        tl.store(p + BT, b_beta, mask=m_v)
        tl.store(p + 2 * BT, tl.zeros([BT, GP], tl.float32) + rk[:, None], mask=m_v)
        tl.store(p + 3 * BT, tl.zeros([BT, GP], tl.float32) + rq[:, None], mask=m_v)


def forms(q, k, g, beta, vec, B, T, H, HV):
    n = B * T // 64
    out = {}
    for warps in (2, 4, 8):
        out[f"package, {warps} warps"] = lambda w=warps: chunk_vectors_kernel[chunk_vectors_grid(n, H)](
            q, k, g, beta, vec, q, q, T, 0, H=H, HV=HV, K=128, BT=64, IS_VARLEN=False, HAS_G=True, num_warps=w)
    for chunks, stages, warps in ((2, 2, 4), (4, 2, 4), (4, 3, 4), (8, 2, 4), (4, 2, 8)):
        out[f"looped, {chunks} chunks, {stages} stages, {warps} warps"] = \
            lambda c=chunks, s=stages, w=warps: chunk_vectors_looped_kernel[(triton.cdiv(n, c) * H,)](
                q, k, g, beta, vec, T, n, H=H, HV=HV, K=128, BT=64, CHUNKS=c, NUM_STAGES=s, num_warps=w)
    return out


def main():
    import triton.testing as tt
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for name, B, T, H, HV in ROWS:
        q, k, g, beta = pass_inputs(B, T, H, HV)
        want = None
        moved = 2 * B * T * H * 128 * 2 + B * T * HV * (4 + 2) + (B * T // 64 + B) * HV * 4 * 64 * 4
        for form, run in forms(q, k, g, beta, None, B, T, H, HV).items():
            vec = torch.full(((B * T) // 64 + B, HV, 4, 64), -7.0, device="cuda")
            call = forms(q, k, g, beta, vec, B, T, H, HV)[form]
            call()
            torch.cuda.synchronize()
            want = vec.clone() if want is None else want
            diff = (vec - want).nan_to_num(0.0).abs().max().item()
            ms = tt.do_bench_cudagraph(call, rep=200)
            rows.append(dict(workload=name, form=form, ms=ms, tb_per_s=moved / ms / 1e9, max_abs_diff=diff))
            print(f"{name:22s} {form:40s} {ms * 1e3:7.1f} us  {moved / ms / 1e9:.2f} TB/s  diff {diff}", flush=True)
    if args.out:
        json.dump(rows, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
