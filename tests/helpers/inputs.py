"""Input builders of the delta-rule tests (the oracle's, the ops' and the kernels'): float64 by
default, seeded, with a reset (decay exactly 0) and a decay exactly 1 where the sequence is long
enough."""
import torch

F64 = torch.float64


def gdn_inputs(B, T, H, HV, K, V, *, beta_per_value=False, resets=True, dtype=F64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    k = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    v = torch.randn(B, T, HV, V, generator=gen, dtype=dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, generator=gen, dtype=dtype) + 2)
    if resets and T > 3:
        g[:, T // 2, 0] = float("-inf")  # decay exactly 0: a reset mid-sequence
        g[:, 1] = 0.0  # decay exactly 1
    shape = (B, T, HV, V) if beta_per_value else (B, T, HV)
    beta = torch.rand(*shape, generator=gen, dtype=dtype)
    S0 = torch.randn(B, HV, K, V, generator=gen, dtype=dtype)
    return q, k, v, g, beta, S0


def gdp_inputs(T, M, H, HV, K, V, seed=1, beta_per_value=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, H, K, generator=gen, dtype=F64)
    k = torch.randn(1, T * M, H, K, generator=gen, dtype=F64)
    v = torch.randn(1, T * M, HV, V, generator=gen, dtype=F64)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, generator=gen, dtype=F64) + 2)
    if T > 3:
        g[:, 2] = float("-inf")
        g[:, 3] = 0.0
    beta = torch.rand(1, T * M, HV, *((V,) if beta_per_value else ()), generator=gen, dtype=F64)
    return q, k, v, g, beta
