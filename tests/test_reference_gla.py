"""The GLA oracle: chunked form against the token loop, on the hostile cases.

Tolerances:
- float64, same inputs: max abs error <= 1e-10 * (1 + max|ref|). The two forms differ only by
  reassociation (sums of at most a few hundred products), whose float64 error is ~1e-14 relative;
  1e-10 leaves a wide margin yet catches any wrong decay, which is an O(1) error.
- float32 chunked against float64 naive: relative RMS error < 1e-6 (output, final and chunk
  states). float32 rounds each product and sum to ~6e-8 relative; decays are <= 1, so errors do
  not grow along the sequence, and an output sums ~C + K terms. Measured at T = 200: 0.7-1.3e-7
  for the chunked form, 1.0-1.4e-7 for the float32 token loop itself; 1e-6 is ~8x the worst and
  still 6 orders of magnitude below the O(1) error of a wrong decay.
"""
from __future__ import annotations

import pytest
import torch

from recurscan.reference.common import chunk_offsets, sequences
from recurscan.reference.common import sequence_blocks
from recurscan.reference.gla import gla_chunked, gla_naive
from tests.helpers.tolerances import assert_reassociation_close, relative_rms

F64 = torch.float64
INF = float("inf")
CU = [0, 1, 2, 66, 67, 200]  # one-token sequences at both ends of a 64-token one


def make_inputs(B=2, T=65, H=2, HV=4, K=24, V=40, per_key=False, N=None, dtype=F64, seed=0):
    """GVA (HV = 2H), head dims not powers of two, nonzero initial state, and decays of exactly 1
    (g = 0) and exactly 0 (g = -inf) somewhere in the sequence."""
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    q, k, v = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, HV, V)
    gshape = (B, T, HV, K) if per_key else (B, T, HV)
    g = torch.nn.functional.logsigmoid(rnd(*gshape) + 3)  # decays mostly in (0.7, 1)
    if HV >= 4:
        g[:, ::5, 0] = 0.0  # head 0: decay exactly 1 every fifth token
        g[:, 2::17, 1] = -INF  # head 1: resets
        g[:, 0, 2] = -INF  # head 2: reset at the very first token (kills the initial state)
        if per_key:
            g[:, 1::3, 3, :5] = -INF  # some key rows reset, the others keep decaying
            g[:, ::2, 3, 5:9] = 0.0
    N = B if N is None else N
    s0 = rnd(N, HV, K, V)
    return [t.to(dtype) for t in (q, k, v, g, s0)]


@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per_key"])
@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_chunked_matches_naive_float64(T, per_key, chunk_size):
    q, k, v, g, s0 = make_inputs(T=T, per_key=per_key)
    ref = gla_naive(q, k, v, g, initial_state=s0, chunk_size=chunk_size, return_chunk_states=True)
    got = gla_chunked(q, k, v, g, initial_state=s0, chunk_size=chunk_size, return_chunk_states=True)
    assert ref[2].shape[0] == 2 * -(-T // chunk_size)
    for name, a, b in zip(["o", "final", "chunk_states"], got, ref):
        assert a.dtype == F64
        assert_reassociation_close(a, b, name)


@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per_key"])
def test_varlen_matches_each_sequence_alone(per_key, chunk_size):
    cu = torch.tensor(CU, dtype=torch.int32)
    q, k, v, g, s0 = make_inputs(B=1, T=CU[-1], per_key=per_key, N=len(CU) - 1)
    ref = gla_naive(q, k, v, g, initial_state=s0, cu_seqlens=cu, chunk_size=chunk_size, return_chunk_states=True)
    got = gla_chunked(q, k, v, g, initial_state=s0, cu_seqlens=cu, chunk_size=chunk_size, return_chunk_states=True)
    for name, a, b in zip(["o", "final", "chunk_states"], got, ref):
        assert_reassociation_close(a, b, f"varlen {name}")

    offsets = chunk_offsets(sequences(1, CU[-1], cu), chunk_size)
    assert got[2].shape[0] == offsets[-1] == sum(-(-(e - s) // chunk_size) for s, e in zip(CU[:-1], CU[1:]))
    for n, (s, e) in enumerate(zip(CU[:-1], CU[1:])):
        one = [x[:, s:e] for x in (q, k, v, g)]
        for fn in (gla_naive, gla_chunked):
            o, fin, cs = fn(*one, initial_state=s0[n : n + 1], chunk_size=chunk_size, return_chunk_states=True)
            assert_reassociation_close(got[0][:, s:e], o, f"seq {n} o ({fn.__name__})")
            assert_reassociation_close(got[1][n : n + 1], fin, f"seq {n} final ({fn.__name__})")
            assert_reassociation_close(got[2][offsets[n] : offsets[n + 1]], cs, f"seq {n} chunk states ({fn.__name__})")


@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per_key"])
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_float32_chunked_against_float64_naive(per_key, chunk_size):
    q, k, v, g, s0 = make_inputs(T=200, per_key=per_key, dtype=torch.float32)
    ref = gla_naive(*(x.to(F64) for x in (q, k, v, g)), initial_state=s0.to(F64), return_chunk_states=True,
                    chunk_size=chunk_size)
    got = gla_chunked(q, k, v, g, initial_state=s0, return_chunk_states=True, chunk_size=chunk_size)
    for name, a, b in zip(["o", "final", "chunk_states"], got, ref):
        assert a.dtype == torch.float32
        assert torch.isfinite(a).all()
        assert relative_rms(a, b) < 1e-6, f"{name}: rel RMS {relative_rms(a, b):.2e}"


def test_chunk_states_are_states_after_prefixes():
    """Row c of the chunk states is the final state of the first c * chunk_size tokens."""
    q, k, v, g, s0 = make_inputs(T=70, per_key=True)
    for fn in (gla_naive, gla_chunked):
        _, _, cs = fn(q, k, v, g, initial_state=s0, chunk_size=16, return_chunk_states=True)
        assert cs.shape[0] == 2 * 5
        assert_reassociation_close(cs[0::5], s0, "row c = 0 is the initial state")
        for c in range(1, 5):
            _, fin = gla_naive(*(x[:, : 16 * c] for x in (q, k, v, g)), initial_state=s0)
            assert_reassociation_close(cs[c::5], fin, f"{fn.__name__} chunk {c}")


@pytest.mark.parametrize("fn", [gla_naive, gla_chunked])
def test_decay_one_is_plain_linear_attention(fn):
    q, k, v, _, s0 = make_inputs(B=1, T=65, H=1, HV=1, K=5, V=3)
    g = torch.zeros(1, 65, 1, dtype=F64)
    o, fin = fn(q, k, v, g, scale=0.5, initial_state=s0, chunk_size=16)
    S = s0[:, None] + torch.cumsum(k[..., :, None] * v[..., None, :], dim=1)  # [1, T, 1, K, V]
    assert_reassociation_close(o, 0.5 * torch.einsum("bthk,bthkv->bthv", q, S), "o")
    assert_reassociation_close(fin, S[:, -1], "final")


@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per_key"])
@pytest.mark.parametrize("fn", [gla_naive, gla_chunked])
def test_decay_zero_resets_every_token(fn, per_key):
    q, k, v, _, s0 = make_inputs(B=1, T=40, H=1, HV=2, K=5, V=3, per_key=per_key)
    g = torch.full((1, 40, 2, 5) if per_key else (1, 40, 2), -INF, dtype=F64)
    o, fin = fn(q, k, v, g, scale=1.0, initial_state=s0, chunk_size=16)
    kk = k.expand(1, 40, 2, 5)
    qq = q.expand(1, 40, 2, 5)
    assert_reassociation_close(o, (qq * kk).sum(-1, keepdim=True) * v, "o")
    assert_reassociation_close(fin, kk[:, -1, :, :, None] * v[:, -1, :, None, :], "final")


def test_scalar_decay_equals_per_key_broadcast():
    q, k, v, g, s0 = make_inputs(T=65)
    g_k = g.unsqueeze(-1).expand(*g.shape, q.shape[-1])
    for fn in (gla_naive, gla_chunked):
        a = fn(q, k, v, g, initial_state=s0, chunk_size=16, return_chunk_states=True)
        b = fn(q, k, v, g_k, initial_state=s0, chunk_size=16, return_chunk_states=True)
        for x, y in zip(a, b):
            assert_reassociation_close(x, y, fn.__name__)


def test_defaults_scale_zero_state_and_chunk_size():
    q, k, v, g, _ = make_inputs(T=70)
    K = q.shape[-1]
    a = gla_chunked(q, k, v, g, return_chunk_states=True)
    b = gla_naive(q, k, v, g, scale=K**-0.5, initial_state=torch.zeros(2, 4, K, 40, dtype=F64), chunk_size=64,
                  return_chunk_states=True)
    assert a[2].shape[0] == 2 * 2
    for x, y in zip(a, b):
        assert_reassociation_close(x, y)


def test_gva_head_mapping():
    """Value head hv reads q/k head hv // (HV // H): equal to repeating q and k by hand."""
    q, k, v, g, s0 = make_inputs(T=20, H=2, HV=6)
    rep = lambda x: x.repeat_interleave(3, dim=2)  # noqa: E731
    for fn in (gla_naive, gla_chunked):
        a = fn(q, k, v, g, initial_state=s0, chunk_size=16)
        b = gla_naive(rep(q), rep(k), v, g, scale=q.shape[-1] ** -0.5, initial_state=s0)
        for x, y in zip(a, b):
            assert_reassociation_close(x, y, fn.__name__)


def test_dtypes_and_inputs_untouched():
    q, k, v, g, s0 = make_inputs(T=10, dtype=torch.bfloat16)
    s0_copy = s0.clone()
    o, fin = gla_chunked(q, k, v, g, initial_state=s0)
    assert o.dtype == fin.dtype == torch.float32  # never below float32
    assert torch.equal(s0, s0_copy)
    o, fin = gla_naive(q.float(), k.float(), v.float(), g.float(), initial_state=s0.to(F64))
    assert o.dtype == fin.dtype == F64  # any float64 input promotes


def test_sequence_blocks():
    assert sequence_blocks(3, 7, None) == [(slice(0, 3), slice(0, 3), 0, 7)]
    blocks = sequence_blocks(1, 200, torch.tensor(CU))
    assert [(list(b.sequence_numbers), b.start, b.end) for b in blocks] == [
        ([0], 0, 1), ([1], 1, 2), ([2], 2, 66), ([3], 66, 67), ([4], 67, 200)]


def test_bad_shapes_are_refused():
    q, k, v, g, s0 = make_inputs(T=10)
    with pytest.raises(ValueError, match="multiple"):
        gla_chunked(q, k, v[:, :, :3], g[:, :, :3])
    with pytest.raises(ValueError, match="g must be"):
        gla_chunked(q, k, v, g[..., :2])
    with pytest.raises(ValueError, match="batch must be 1"):
        gla_naive(q, k, v, g, cu_seqlens=torch.tensor([0, 4, 10]))
    with pytest.raises(ValueError, match="initial_state"):
        gla_naive(q, k, v, g, initial_state=s0[:1])


@pytest.mark.parametrize("per_key", [False, True], ids=["scalar", "per_key"])
def test_gradients_of_chunked_match_naive(per_key):
    """The public CPU path is the chunked form under autograd: its gradients (through the
    in-place window writes and segsum, with decays of exactly 1 and 0) equal the token loop's."""
    inputs = make_inputs(T=40, per_key=per_key)
    cot = [torch.randn(s, generator=torch.Generator().manual_seed(1), dtype=F64)
           for s in [(2, 40, 4, 40), (2, 4, 24, 40), (6, 4, 24, 40)]]

    def grads(fn):
        leaves = [x.clone().requires_grad_(True) for x in inputs]
        q, k, v, g, s0 = leaves
        out = fn(q, k, v, g, initial_state=s0, chunk_size=16, return_chunk_states=True)
        return torch.autograd.grad(sum((o * c).sum() for o, c in zip(out, cot)), leaves)

    for name, a, b in zip(["dq", "dk", "dv", "dg", "ds0"], grads(gla_chunked), grads(gla_naive)):
        assert_reassociation_close(a, b, name)
