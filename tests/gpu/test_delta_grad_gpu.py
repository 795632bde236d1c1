"""Gradients through the Triton path on the GPU at the models' head sizes, bf16 inputs: every
gradient against autograd through the float64 oracle on the same (bf16-rounded) inputs, within the
16-bit band (relative RMS 1e-2, as the property test's bf16 cases)."""
import pytest
import torch

import recurscan
from recurscan.reference.delta import gated_delta_rule_naive
from tests.helpers.tolerances import relative_rms

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cu", [None, [0, 1, 300, 1000]])
def test_gdn_gradients_bf16(cu):
    gen = torch.Generator().manual_seed(0)
    T, H, HV, K, V = 1000, 4, 8, 128, 128
    N = 1 if cu is None else len(cu) - 1
    x = dict(q=torch.randn(1, T, H, K, generator=gen), k=torch.randn(1, T, H, K, generator=gen),
             v=torch.randn(1, T, HV, V, generator=gen),
             g=torch.nn.functional.logsigmoid(torch.randn(1, T, HV, generator=gen) + 3),
             beta=torch.rand(1, T, HV, generator=gen), h0=torch.randn(N, HV, K, V, generator=gen) * 0.1)
    x = {n: (t.bfloat16() if n in ("q", "k", "v", "beta") else t) for n, t in x.items()}
    do = torch.randn(1, T, HV, V, generator=gen)
    dht = torch.randn(N, HV, K, V, generator=gen)
    cu_t = None if cu is None else torch.tensor(cu)

    def grads(device, dtype_of, op):
        leaves = [t.to(device=device, dtype=dtype_of(t)).requires_grad_() for t in x.values()]
        o, S = op(*leaves[:5], initial_state=leaves[5], use_qk_l2norm_in_kernel=True,
                  cu_seqlens=None if cu_t is None else cu_t.to(device))
        return torch.autograd.grad((o, S), leaves, (do.to(device, o.dtype), dht.to(device, S.dtype)))

    got = grads("cuda", lambda t: t.dtype, lambda *a, **kw: recurscan.chunk_gated_delta_rule(
        *a, output_final_state=True, **kw))
    want = grads("cpu", lambda t: torch.float64, gated_delta_rule_naive)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want):
        assert torch.isfinite(a).all(), name
        assert relative_rms(a.double().cpu(), b) < 1e-2, f"{name}: relative RMS {relative_rms(a.double().cpu(), b):.2e}"


def test_gdp_gradients_bf16():
    """Gated Delta Product M = 2 on the GPU, varlen with a one-token sequence, against the float64
    token loop: the expanded stream's backward and the gathers back onto the token stream."""
    from recurscan.reference.delta import gated_delta_product_naive
    gen = torch.Generator().manual_seed(1)
    T, M, H, HV, K, V = 600, 2, 2, 4, 128, 128
    cu = torch.tensor([0, 1, 250, 600])
    N = len(cu) - 1
    x = dict(q=torch.randn(1, T, H, K, generator=gen), k=torch.randn(1, T * M, H, K, generator=gen),
             v=torch.randn(1, T * M, HV, V, generator=gen),
             g=torch.nn.functional.logsigmoid(torch.randn(1, T, HV, generator=gen) + 3),
             beta=torch.rand(1, T * M, HV, generator=gen), h0=torch.randn(N, HV, K, V, generator=gen) * 0.1)
    x = {n: (t.bfloat16() if n in ("q", "k", "v", "beta") else t) for n, t in x.items()}
    do = torch.randn(1, T, HV, V, generator=gen)
    dht = torch.randn(N, HV, K, V, generator=gen)

    def grads(device, dtype_of, op):
        leaves = [t.to(device=device, dtype=dtype_of(t)).requires_grad_() for t in x.values()]
        o, S = op(*leaves[:5], M, initial_state=leaves[5], use_qk_l2norm_in_kernel=True,
                  cu_seqlens=cu.to(device), output_final_state=True)
        return torch.autograd.grad((o, S), leaves, (do.to(device, o.dtype), dht.to(device, S.dtype)))

    got = grads("cuda", lambda t: t.dtype, recurscan.chunk_gated_delta_product_varlen)
    want = grads("cpu", lambda t: torch.float64,
                 lambda *a, output_final_state, **kw: gated_delta_product_naive(*a, **kw))
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want):
        assert torch.isfinite(a).all(), name
        assert relative_rms(a.double().cpu(), b) < 1e-2, f"{name}: relative RMS {relative_rms(a.double().cpu(), b):.2e}"
