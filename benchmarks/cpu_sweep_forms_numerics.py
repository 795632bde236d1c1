"""Numerics of two forms of the chunked sweep's state chain (design evidence for issue 3; CPU).

The chunked GDN sweep carries the state across chunks of 64 tokens. Today's kernel form (three
dependent products per chunk, docs/kernels-chunk-delta.md)::

    X = V - lam o (K S);   U = wy X;   S <- lam_last S + K^T (gam o U)

and the transition form (one dependent product per chunk)::

    S <- lam_last S - C S + B V,   C = K^T diag(gam) wy diag(lam) K,   B = K^T diag(gam) wy

Both are simulated on one value head with the kernel's roundings (bf16 operands, float32
accumulation and state; ``lam_last S`` in float32), C and B rounded to bf16 or to tf32's 10-bit
mantissa, and compared with the float64 recurrence: relative RMS error of the state after every
chunk. Keys are L2-normalised, as in the benchmarks' workloads (``use_qk_l2norm_in_kernel``).

    python -m benchmarks.cpu_sweep_forms_numerics --out benchmarks/results/cpu_sweep_forms_numerics.json
"""
from __future__ import annotations

import argparse
import json

import torch

BT = 64


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def tf32(x):
    """Round float32 to tf32's 10 explicit mantissa bits (round to nearest even on the bit pattern)."""
    i = x.to(torch.float32).contiguous().view(torch.int32)
    rounded = (i + 0x0FFF + ((i >> 13) & 1)) & ~0x1FFF
    return rounded.view(torch.float32)


def chunk_terms(k, g, beta):
    """Float64 per-chunk terms: lam [C], gam [C], lam_last, wy [C, C] (U = wy (V - lam o K S))."""
    C = k.shape[0]
    cs = torch.cumsum(g, 0)
    diff = cs[:, None] - cs[None, :]
    tril = torch.tril(torch.ones(C, C, dtype=torch.bool))
    Gam = torch.where(tril, diff, torch.full_like(diff, float("-inf"))).exp()
    lam = cs.exp()
    gam = (cs[-1] - cs).exp()
    A = (k @ k.T) * Gam * torch.tril(torch.ones(C, C, dtype=torch.bool), -1)
    Tinv = torch.linalg.inv(torch.eye(C, dtype=k.dtype) + beta[:, None] * A)
    return lam, gam, lam[-1], Tinv * beta[None, :]


def simulate(T, K, V, seed, decay_shift):
    gen = torch.Generator().manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(T, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(T, V, generator=gen, dtype=torch.float64)
    g = torch.nn.functional.logsigmoid(torch.randn(T, generator=gen, dtype=torch.float64) + decay_shift)
    beta = torch.sigmoid(torch.randn(T, generator=gen, dtype=torch.float64))
    k, v, beta = bf16(k).double(), bf16(v).double(), bf16(beta).double()  # bf16 inputs, as the workloads
    S64 = torch.zeros(K, V, dtype=torch.float64)
    S_now = torch.zeros(K, V)  # today's form, float32 state
    S_c16 = torch.zeros(K, V)  # transition form, C and B in bf16
    S_c32 = torch.zeros(K, V)  # transition form, C and B at tf32 precision, S operand tf32
    errs = {"today": [], "transition_bf16": [], "transition_tf32": []}
    for c0 in range(0, T, BT):
        kc, vc, gc, bc = k[c0:c0 + BT], v[c0:c0 + BT], g[c0:c0 + BT], beta[c0:c0 + BT]
        lam, gam, lam_last, wy = chunk_terms(kc, gc, bc)
        # float64 truth
        U = wy @ (vc - lam[:, None] * (kc @ S64))
        S64 = lam_last * S64 + kc.T @ (gam[:, None] * U)
        # today's kernel form: bf16 operands, float32 accumulation, float32 state
        k32, v32, lam32, gam32 = kc.float(), vc.float(), lam.float(), gam.float()
        wy16 = bf16(wy.float())
        X = v32 - lam32[:, None] * (k32 @ bf16(S_now))
        U32 = wy16 @ bf16(X)
        S_now = float(lam_last) * S_now + k32.T @ bf16(gam32[:, None] * U32)
        # transition form: C, B made once per chunk (float64 here, then rounded), S <- lam_last S - C S + B V
        Cm = kc.T @ (gam[:, None] * wy) @ (lam[:, None] * kc)
        Bm = kc.T @ (gam[:, None] * wy)
        S_c16 = float(lam_last) * S_c16 - bf16(Cm.float()) @ bf16(S_c16) + bf16(Bm.float()) @ v32
        S_c32 = float(lam_last) * S_c32 - tf32(Cm.float()) @ tf32(S_c32) + tf32(Bm.float()) @ v32
        ref = S64.float()
        scale = ref.pow(2).mean().sqrt()
        for name, S in (("today", S_now), ("transition_bf16", S_c16), ("transition_tf32", S_c32)):
            errs[name].append(((S - ref).pow(2).mean().sqrt() / scale).item())
    return {name: {"final": e[-1], "max_over_chunks": max(e), "mean_over_chunks": sum(e) / len(e)}
            for name, e in errs.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cpu_sweep_forms_numerics")
    ap.add_argument("--out", default="benchmarks/results/cpu_sweep_forms_numerics.json")
    ap.add_argument("--T", type=int, default=16384)
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = []
    # decay_shift 3: mean log decay ~ -0.05 (the benchmarks' workloads); 8: long memory (~ -3e-4)
    for decay_shift in (3.0, 8.0):
        for seed in (0, 1):
            r = simulate(args.T, 128, 128, seed, decay_shift)
            rows.append({"T": args.T, "K": 128, "V": 128, "seed": seed, "decay_shift": decay_shift,
                         "state_rel_rms_vs_float64": r})
            print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump({"command": "python -m benchmarks.cpu_sweep_forms_numerics", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
