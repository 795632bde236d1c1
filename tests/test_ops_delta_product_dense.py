"""fla's dense ``chunk_gated_delta_product`` signature: a dense batch equals its sequences run one
by one through the varlen op (and the float64 token loop), gradients included; varlen passes
through; bad input is refused before anything runs."""
import pytest
import torch

import recurscan
from recurscan.reference.delta import gated_delta_product_naive
from tests.helpers.inputs import gdp_inputs
from tests.helpers.tolerances import relative_rms


def _batch(B, T, M, seed=0):
    parts = [gdp_inputs(T, M, 1, 2, 8, 8, seed=seed + b) for b in range(B)]
    return [torch.cat(x) for x in zip(*parts)]  # q, k, v, g, beta with batch B


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("B, T, M", [(1, 5, 2), (3, 70, 2), (2, 65, 3)])
def test_dense_batch_equals_the_token_loop(backend, B, T, M):
    q, k, v, g, beta = _batch(B, T, M)
    S0 = torch.randn(B, 2, 8, 8, dtype=torch.float64)
    f32 = (lambda x: x.float()) if backend == "triton" else (lambda x: x)  # noqa: E731
    o, S = recurscan.chunk_gated_delta_product(*map(f32, (q, k, v, g, beta)), M, initial_state=f32(S0),
                                               output_final_state=True, use_qk_l2norm_in_kernel=True, backend=backend)
    want_o, want_S = gated_delta_product_naive(q, k, v, g, beta, M, initial_state=S0, use_qk_l2norm_in_kernel=True)
    assert o.shape == want_o.shape and S.shape == want_S.shape
    tol = 1e-5 if backend == "triton" else 1e-10
    assert relative_rms(o.double(), want_o) < tol and relative_rms(S.double(), want_S) < tol


def test_dense_gradients_equal_the_token_loop():
    B, T, M = 2, 40, 2
    x = [t.float().requires_grad_() for t in _batch(B, T, M, seed=3)]
    o, _ = recurscan.chunk_gated_delta_product(*x, M, use_qk_l2norm_in_kernel=True, backend="triton")
    do = torch.randn_like(o)
    got = torch.autograd.grad(o, x, do)
    y = [t.detach().double().requires_grad_() for t in x]
    want = torch.autograd.grad(gated_delta_product_naive(*y, M, use_qk_l2norm_in_kernel=True)[0], y, do.double())
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), got, want):
        assert relative_rms(a.double(), b) < 1e-5, name


def test_varlen_passes_through_with_host_boundaries():
    T, M = 70, 2
    q, k, v, g, beta = gdp_inputs(T, M, 1, 2, 8, 8, seed=5)
    cu = torch.tensor([0, 1, 30, 70])
    a = recurscan.chunk_gated_delta_product(q, k, v, g, beta, M, cu_seqlens=cu, cu_seqlens_cpu=cu,
                                            output_final_state=True)
    b = recurscan.chunk_gated_delta_product_varlen(q, k, v, g, beta, M, cu, output_final_state=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("bad, error, match", [
    (dict(num_householder=0), ValueError, "num_householder"),
    (dict(k=torch.zeros(2, 7, 1, 8, dtype=torch.float64)), ValueError, "k"),
    (dict(q=torch.zeros(2, 5, 8, dtype=torch.float64)), ValueError, "q"),
])
def test_bad_input_is_refused(bad, error, match):
    q, k, v, g, beta = _batch(2, 5, 2)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, num_householder=2)
    args.update(bad)
    with pytest.raises(error, match=match):
        recurscan.chunk_gated_delta_product(**args)
