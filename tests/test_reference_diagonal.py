"""The diagonal-recurrence oracle: chunked form (a Hillis-Steele scan per window) against the
token loop.

Tolerances (as in test_reference_gla.py):
- float64, same inputs: max abs error <= 1e-10 * (1 + max|ref|); the scan only regroups the
  affine maps (products of at most 64 decays with |a| <= 1.05), ~1e-14 relative in float64.
- float32 chunked against float64 naive: relative RMS < 1e-6. Each state is a sum of at most
  ~T products of <= 64 factors, each rounded to ~6e-8 relative; |a| <= 1.05 keeps the terms
  bounded. Measured at T = 200: 4-6e-8 for the chunked form, 3-4e-8 for the float32 loop itself.
"""
from __future__ import annotations

import pytest
import torch

from recurscan.reference.common import chunk_offsets, sequences
from recurscan.reference.diagonal import diagonal_chunk, diagonal_chunked, diagonal_naive
from tests.helpers.tolerances import assert_reassociation_close, relative_rms

F64 = torch.float64
CU = [0, 1, 2, 66, 67, 200]


def make_inputs(B=2, T=65, D=20, N=None, dtype=F64, seed=0):
    """Decays in [-1.05, 1.05] with exact 0 (reset), 1 (keep) and -1 (flip) at some tokens, and
    a nonzero initial state."""
    gen = torch.Generator().manual_seed(seed)
    a = (torch.rand(B, T, D, generator=gen, dtype=F64) * 2 - 1) * 1.05
    a[:, ::7, :5] = 0.0
    a[:, 1::3, 5:10] = 1.0
    a[:, 2::5, 10:12] = -1.0
    b = torch.randn(B, T, D, generator=gen, dtype=F64)
    s0 = torch.randn(B if N is None else N, D, generator=gen, dtype=F64)
    return [t.to(dtype) for t in (a, b, s0)]


@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_chunked_matches_naive_float64(T, chunk_size):
    a, b, s0 = make_inputs(T=T)
    ref = diagonal_naive(a, b, initial_state=s0, chunk_size=chunk_size, return_chunk_states=True)
    got = diagonal_chunked(a, b, initial_state=s0, chunk_size=chunk_size, return_chunk_states=True)
    assert ref[2].shape == (2 * -(-T // chunk_size), 20)
    for name, x, y in zip(["h", "final", "chunk_states"], got, ref):
        assert x.dtype == F64
        assert_reassociation_close(x, y, name)


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_varlen_matches_each_sequence_alone(chunk_size):
    cu = torch.tensor(CU, dtype=torch.int32)
    a, b, s0 = make_inputs(B=1, T=CU[-1], N=len(CU) - 1)
    ref = diagonal_naive(a, b, initial_state=s0, cu_seqlens=cu, chunk_size=chunk_size, return_chunk_states=True)
    got = diagonal_chunked(a, b, initial_state=s0, cu_seqlens=cu, chunk_size=chunk_size, return_chunk_states=True)
    for name, x, y in zip(["h", "final", "chunk_states"], got, ref):
        assert_reassociation_close(x, y, f"varlen {name}")

    offsets = chunk_offsets(sequences(1, CU[-1], cu), chunk_size)
    assert got[2].shape[0] == offsets[-1] == sum(-(-(e - s) // chunk_size) for s, e in zip(CU[:-1], CU[1:]))
    for n, (s, e) in enumerate(zip(CU[:-1], CU[1:])):
        for fn in (diagonal_naive, diagonal_chunked):
            h, fin, cs = fn(a[:, s:e], b[:, s:e], initial_state=s0[n : n + 1], chunk_size=chunk_size,
                            return_chunk_states=True)
            assert_reassociation_close(got[0][:, s:e], h, f"seq {n} h ({fn.__name__})")
            assert_reassociation_close(got[1][n : n + 1], fin, f"seq {n} final ({fn.__name__})")
            assert_reassociation_close(got[2][offsets[n] : offsets[n + 1]], cs, f"seq {n} chunk states ({fn.__name__})")


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_float32_chunked_against_float64_naive(chunk_size):
    a, b, s0 = make_inputs(T=200, dtype=torch.float32)
    ref = diagonal_naive(a.to(F64), b.to(F64), initial_state=s0.to(F64), chunk_size=chunk_size,
                         return_chunk_states=True)
    got = diagonal_chunked(a, b, initial_state=s0, chunk_size=chunk_size, return_chunk_states=True)
    for name, x, y in zip(["h", "final", "chunk_states"], got, ref):
        assert x.dtype == torch.float32
        assert relative_rms(x, y) < 1e-6, f"{name}: rel RMS {relative_rms(x, y):.2e}"


@pytest.mark.parametrize("L", [1, 2, 3, 7, 8, 64, 65])
def test_chunk_folds_the_incoming_state_into_the_first_step(L):
    """One window of any length (scan rounds: ceil(log2 L)) from a nonzero state."""
    a, b, s0 = make_inputs(T=L)
    h, out = diagonal_chunk(a, b, s0)
    ref, _ = diagonal_naive(a, b, initial_state=s0)
    assert_reassociation_close(h, ref)
    assert_reassociation_close(out, ref[:, -1])


@pytest.mark.parametrize("fn", [diagonal_naive, diagonal_chunked])
def test_closed_forms_decay_one_and_zero(fn):
    _, b, s0 = make_inputs(T=70)
    h, fin = fn(torch.ones_like(b), b, initial_state=s0, chunk_size=16)
    assert_reassociation_close(h, s0[:, None] + torch.cumsum(b, dim=1), "a = 1 is a running sum")
    h, fin = fn(torch.zeros_like(b), b, initial_state=s0, chunk_size=16)
    assert_reassociation_close(h, b, "a = 0 forgets everything")
    assert_reassociation_close(fin, b[:, -1])


def test_chunk_states_are_states_after_prefixes():
    a, b, s0 = make_inputs(T=70)
    for fn in (diagonal_naive, diagonal_chunked):
        _, _, cs = fn(a, b, initial_state=s0, chunk_size=16, return_chunk_states=True)
        assert_reassociation_close(cs[0::5], s0, "row c = 0 is the initial state")
        for c in range(1, 5):
            _, fin = diagonal_naive(a[:, : 16 * c], b[:, : 16 * c], initial_state=s0)
            assert_reassociation_close(cs[c::5], fin, f"{fn.__name__} chunk {c}")


def test_dtypes_defaults_and_inputs_untouched():
    a, b, s0 = make_inputs(T=70, dtype=torch.bfloat16)
    s0_copy = s0.clone()
    h, fin, cs = diagonal_chunked(a, b, initial_state=s0, return_chunk_states=True)
    assert h.dtype == fin.dtype == cs.dtype == torch.float32
    assert cs.shape == (2 * 2, 20)  # default chunk_size 64
    assert torch.equal(s0, s0_copy)
    h, fin = diagonal_naive(a.float(), b.to(F64))  # any float64 input promotes; zero initial state
    assert h.dtype == fin.dtype == F64
    assert_reassociation_close(h[:, 0], b[:, 0].to(F64), "h_1 = b_1 from a zero state")


def test_bad_shapes_are_refused():
    a, b, s0 = make_inputs(T=10)
    with pytest.raises(ValueError, match="a and b"):
        diagonal_naive(a, b[..., :3])
    with pytest.raises(ValueError, match="batch must be 1"):
        diagonal_chunked(a, b, cu_seqlens=torch.tensor([0, 5, 10]))
    with pytest.raises(ValueError, match="initial_state"):
        diagonal_chunked(a, b, initial_state=s0[:, :3])


def test_gradients_of_chunked_match_naive():
    """The chunked form under autograd (scan, state folding, window writes) has the token loop's
    gradients, with decays of exactly 0, 1 and -1 in the sequence."""
    inputs = make_inputs(T=40)

    def grads(fn):
        leaves = [x.clone().requires_grad_(True) for x in inputs]
        a, b, s0 = leaves
        out = fn(a, b, initial_state=s0, chunk_size=16, return_chunk_states=True)
        gen = torch.Generator().manual_seed(1)
        loss = sum((o * torch.randn(o.shape, generator=gen, dtype=F64)).sum() for o in out)
        return torch.autograd.grad(loss, leaves)

    for name, x, y in zip(["da", "db", "ds0"], grads(diagonal_chunked), grads(diagonal_naive)):
        assert_reassociation_close(x, y, name)
