"""The written-out backward of Gated DeltaNet's chunkwise algorithm (reference/delta_backward.py)
against autograd through the token loop, in float64: every gradient, every element, over the
hostile cases (lengths around the window, GVA, varlen with one-token sequences, initial states and
a gradient into the final state, decays exactly 1 and 0, beta per value column, the L2 norm)."""
import pytest
import torch

from recurscan.reference.delta import gated_delta_rule_naive
from recurscan.reference.delta_backward import gated_delta_rule_chunked_backward
from tests.helpers.inputs import gdn_inputs
from tests.helpers.tolerances import relative_rms

NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def check(q, k, v, g, beta, S0, *, cu_seqlens=None, l2norm=True, scale=None, with_dht=True, seed=0):
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, S0)]
    o, S = gated_delta_rule_naive(*leaves[:5], scale=scale, initial_state=leaves[5],
                                  use_qk_l2norm_in_kernel=l2norm, cu_seqlens=cu_seqlens)
    gen = torch.Generator().manual_seed(seed + 100)
    do = torch.randn(o.shape, generator=gen, dtype=o.dtype)
    dht = torch.randn(S.shape, generator=gen, dtype=S.dtype) if with_dht else None
    want = torch.autograd.grad((o, S), leaves, (do, torch.zeros_like(S) if dht is None else dht))
    got = gated_delta_rule_chunked_backward(q, k, v, g, beta, do, dht, scale=scale, initial_state=S0,
                                            use_qk_l2norm_in_kernel=l2norm, cu_seqlens=cu_seqlens)
    for name, a, b in zip(NAMES, got, want):
        assert torch.isfinite(b).all(), f"{name}: autograd through the token loop is not finite"
        assert a.shape == b.shape, f"{name}: shape {tuple(a.shape)} against {tuple(b.shape)}"
        err = relative_rms(a, b)
        assert err < 1e-10, f"{name}: relative RMS {err:.2e} against autograd"


@pytest.mark.parametrize("T", [1, 63, 64, 65, 130, 300])
def test_lengths_around_the_window(T):
    check(*gdn_inputs(2, T, 2, 2, 8, 6, resets=True, seed=T))


def test_gva_and_odd_head_sizes():
    check(*gdn_inputs(1, 150, 2, 6, 12, 10, seed=1), scale=0.3)


def test_beta_per_value_column():
    check(*gdn_inputs(1, 100, 1, 2, 8, 5, beta_per_value=True, seed=2))


def test_no_l2norm_and_no_dht():
    check(*gdn_inputs(2, 90, 2, 4, 8, 6, seed=3), l2norm=False, with_dht=False)


def test_varlen_with_one_token_sequences():
    q, k, v, g, beta, _ = gdn_inputs(1, 200, 2, 4, 8, 6, seed=4)
    cu = torch.tensor([0, 1, 2, 66, 67, 200])
    S0 = torch.randn(5, 4, 8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    check(q, k, v, g, beta, S0, cu_seqlens=cu)


def test_reset_and_unit_decay_rows():
    q, k, v, g, beta, S0 = gdn_inputs(1, 130, 1, 2, 8, 6, seed=6)
    g[:, 0] = float("-inf")  # the first token forgets the initial state
    g[:, 64] = float("-inf")  # a reset on a window's first row
    g[:, 100:110] = 0.0
    check(q, k, v, g, beta, S0)
    got = gated_delta_rule_chunked_backward(q, k, v, g, beta, torch.ones(1, 130, 2, 6, dtype=torch.float64),
                                            initial_state=S0)
    assert got[5].abs().max() == 0, "the initial state is forgotten at token 0: its gradient is exactly 0"


@pytest.mark.parametrize("M, cu", [(2, None), (3, [0, 1, 40, 41, 90])])
def test_gated_delta_product(M, cu):
    """GDP's backward is GDN's on the expanded stream, dq and dg read back from its copies."""
    from recurscan.reference.delta import gated_delta_product_naive
    from recurscan.reference.delta_backward import gated_delta_product_chunked_backward
    from tests.helpers.inputs import gdp_inputs
    T = 90
    q, k, v, g, beta = gdp_inputs(T, M, 2, 4, 8, 6, seed=M)[:5]
    cu_t = None if cu is None else torch.tensor(cu)
    N = 1 if cu is None else len(cu) - 1
    S0 = torch.randn(N, 4, 8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, S0)]
    o, S = gated_delta_product_naive(*leaves[:5], M, initial_state=leaves[5], use_qk_l2norm_in_kernel=True,
                                     cu_seqlens=cu_t)
    gen = torch.Generator().manual_seed(10)
    do, dht = torch.randn(o.shape, generator=gen, dtype=o.dtype), torch.randn(S.shape, generator=gen, dtype=S.dtype)
    want = torch.autograd.grad((o, S), leaves, (do, dht))
    got = gated_delta_product_chunked_backward(q, k, v, g, beta, M, do, dht, initial_state=S0,
                                               use_qk_l2norm_in_kernel=True, cu_seqlens=cu_t)
    for name, a, b in zip(NAMES, got, want):
        assert relative_rms(a, b) < 1e-10, f"{name}: relative RMS {relative_rms(a, b):.2e}"


def test_gradcheck_of_the_cpu_path():
    """torch.autograd.gradcheck in float64 through the public op on CPU tensors (the oracle)."""
    import recurscan
    q, k, v, g, beta, S0 = (x.requires_grad_() for x in gdn_inputs(1, 10, 1, 2, 4, 3, resets=False, seed=20))

    def op(q, k, v, g, beta, S0):
        return recurscan.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=S0, output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)

    assert torch.autograd.gradcheck(op, (q, k, v, g, beta, S0))
