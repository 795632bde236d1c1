"""The delta-rule oracle specifies itself: the chunked form equals the token loop.

Tolerances. Both forms in float64 differ only by reassociation: max abs error
<= 1e-10 * (1 + max |reference|). The float32 chunked form against the float64 token loop: RMS
error / RMS of the reference <= 2e-5 (float32 rounds at 6e-8 per operation; a 64-token window
chains about a hundred dependent operations and the triangular solve amplifies by its
conditioning, which stays small for beta in (0, 1) and L2-normalised keys).
"""
import pytest
import torch

from recurscan.reference.common import chunk_offsets, sequences
from recurscan.reference.delta import (
    gated_delta_product_chunked,
    gated_delta_product_naive,
    gated_delta_rule_chunked,
    gated_delta_rule_naive,
)
from tests.helpers.inputs import gdn_inputs, gdp_inputs
from tests.helpers.tolerances import assert_reassociation_close, assert_rms_close

F64 = torch.float64


@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
@pytest.mark.parametrize("beta_per_value", [False, True])
def test_gdn_chunked_equals_token_loop(T, beta_per_value):
    q, k, v, g, beta, S0 = gdn_inputs(2, T, 2, 4, 24, 40, beta_per_value=beta_per_value)
    kw = dict(initial_state=S0, use_qk_l2norm_in_kernel=True, return_chunk_states=True)
    want = gated_delta_rule_naive(q, k, v, g, beta, **kw)
    got = gated_delta_rule_chunked(q, k, v, g, beta, **kw)
    assert got[2].shape[0] == 2 * -(-T // 64)
    for a, b in zip(got, want):
        assert_reassociation_close(a, b)


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_gdn_chunk_size_is_free(chunk_size):
    q, k, v, g, beta, S0 = gdn_inputs(1, 100, 1, 1, 16, 16)
    want = gated_delta_rule_naive(q, k, v, g, beta, initial_state=S0[:1], use_qk_l2norm_in_kernel=True)
    got = gated_delta_rule_chunked(q, k, v, g, beta, initial_state=S0[:1], use_qk_l2norm_in_kernel=True,
                                   chunk_size=chunk_size)
    for a, b in zip(got, want):
        assert_reassociation_close(a, b)


def test_gdn_without_gate_or_beta_or_l2norm():
    q, k, v, _, _, _ = gdn_inputs(1, 70, 2, 2, 8, 8)
    k = torch.nn.functional.normalize(k, dim=-1)  # unit keys keep the ungated delta rule bounded
    for a, b in zip(gated_delta_rule_chunked(q, k, v), gated_delta_rule_naive(q, k, v)):
        assert_reassociation_close(a, b)


CU = [0, 1, 2, 66, 67, 200]  # one-token sequences beside ones that cross chunk boundaries


def test_gdn_varlen_equals_each_sequence_alone():
    q, k, v, g, beta, S0 = gdn_inputs(1, 200, 2, 4, 24, 40)
    cu = torch.tensor(CU)
    N = len(CU) - 1
    S0 = torch.randn(N, 4, 24, 40, dtype=F64)
    o, S, chunks = gated_delta_rule_chunked(q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True,
                                            cu_seqlens=cu, return_chunk_states=True)
    want = gated_delta_rule_naive(q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True,
                                  cu_seqlens=cu, return_chunk_states=True)
    for a, b in zip((o, S, chunks), want):
        assert_reassociation_close(a, b)
    offsets = chunk_offsets(sequences(1, 200, cu))
    for n, (a, b) in enumerate(zip(CU, CU[1:])):
        sl = slice(a, b)
        o_n, S_n, c_n = gated_delta_rule_naive(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl],
                                               initial_state=S0[n : n + 1], use_qk_l2norm_in_kernel=True,
                                               return_chunk_states=True)
        assert_reassociation_close(o[:, sl], o_n)
        assert_reassociation_close(S[n : n + 1], S_n)
        assert_reassociation_close(chunks[offsets[n] : offsets[n + 1]], c_n)


def test_gdn_float32_chunked_against_float64_loop():
    q, k, v, g, beta, S0 = gdn_inputs(2, 200, 2, 4, 32, 32)
    want = gated_delta_rule_naive(q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True)
    got = gated_delta_rule_chunked(*(x.float() for x in (q, k, v, g, beta)), initial_state=S0.float(),
                                   use_qk_l2norm_in_kernel=True)
    assert got[0].dtype == torch.float32
    for a, b in zip(got, want):
        assert_rms_close(a, b, rel=2e-5)


def test_reset_forgets_everything_before_it():
    q, k, v, g, beta, S0 = gdn_inputs(1, 130, 1, 1, 8, 8, resets=False)
    g[:, 70] = float("-inf")
    full = gated_delta_rule_chunked(q, k, v, g, beta, initial_state=S0[:1])
    # After the reset the state is exactly what the tail alone builds from zero.
    tail = gated_delta_rule_chunked(q[:, 70:], k[:, 70:], v[:, 70:], g[:, 70:], beta[:, 70:])
    assert_reassociation_close(full[0][:, 70:], tail[0])
    assert_reassociation_close(full[1], tail[1])


@pytest.mark.parametrize("M", [1, 2, 3])
@pytest.mark.parametrize("cu", [[0, 1], [0, 63], [0, 64], [0, 65], [0, 1, 2, 66, 67, 200], [0, 21, 43, 200]])
def test_gdp_chunked_equals_token_loop(M, cu):
    T = cu[-1]
    q, k, v, g, beta = gdp_inputs(T, M, 2, 4, 24, 40)
    S0 = torch.randn(len(cu) - 1, 4, 24, 40, dtype=F64)
    kw = dict(initial_state=S0, use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor(cu),
              return_chunk_states=True)
    want = gated_delta_product_naive(q, k, v, g, beta, M, **kw)
    got = gated_delta_product_chunked(q, k, v, g, beta, M, **kw)
    # Chunk states are per 64 tokens of the token stream, whatever M is.
    assert got[2].shape[0] == sum(-(-(b - a) // 64) for a, b in zip(cu, cu[1:]))
    for a, b in zip(got, want):
        assert_reassociation_close(a, b)


def test_gdp_beta_per_value_and_gva():
    q, k, v, g, beta = gdp_inputs(100, 2, 1, 3, 12, 20, beta_per_value=True)
    want = gated_delta_product_naive(q, k, v, g, beta, 2, return_chunk_states=True)
    got = gated_delta_product_chunked(q, k, v, g, beta, 2, return_chunk_states=True)
    for a, b in zip(got, want):
        assert_reassociation_close(a, b)


def test_gdp_with_one_copy_is_gdn():
    q, k, v, g, beta = gdp_inputs(130, 1, 2, 4, 16, 16)
    cu = torch.tensor([0, 1, 65, 130])
    gdp = gated_delta_product_naive(q, k, v, g, beta, 1, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                    return_chunk_states=True)
    gdn = gated_delta_rule_naive(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                 return_chunk_states=True)
    for a, b in zip(gdp, gdn):
        assert_reassociation_close(a, b)


def test_gdp_is_gdn_on_the_expanded_stream():
    """Folding the copies into the sequence (the decode path of seed 002) gives the same answer."""
    M, T = 3, 40
    q, k, v, g, beta = gdp_inputs(T, M, 2, 2, 16, 16)
    o, S = gated_delta_product_naive(q, k, v, g, beta, M)
    q_exp = torch.zeros(1, T * M, 2, 16, dtype=F64)
    q_exp[:, M - 1 :: M] = q
    g_exp = torch.zeros(1, T * M, 2, dtype=F64)
    g_exp[:, ::M] = g
    o_exp, S_exp = gated_delta_rule_naive(q_exp, k, v, g_exp, beta)
    assert_reassociation_close(o, o_exp[:, M - 1 :: M])
    assert_reassociation_close(S, S_exp)


def test_per_key_decay_with_equal_rows_is_the_scalar_decay():
    q, k, v, g, beta, S0 = gdn_inputs(1, 70, 2, 4, 8, 8)
    per_key = g[..., None].expand(*g.shape, 8)
    scalar = gated_delta_rule_naive(q, k, v, g, beta, initial_state=S0[:1])
    keyed = gated_delta_rule_naive(q, k, v, per_key, beta, initial_state=S0[:1])
    for a, b in zip(keyed, scalar):
        assert_reassociation_close(a, b)
    with pytest.raises(ValueError, match="g: a decay per key"):
        gated_delta_rule_chunked(q, k, v, per_key, beta)
