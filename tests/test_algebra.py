"""Specification of recurscan.algebra, the scan algebra of seed 001.

Every figure quoted from the seed is checked here: the combine counts at T = 1000, the float32
product of 0.9 that sticks, the cancellation of long cumulative log sums, the balance of the
chunk cost. Gradients are checked against autograd and finite differences in float64.
"""
from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
import torch

import recurscan.algebra as algebra
from recurscan.algebra import (
    ChunkCost,
    blelloch_scan,
    chunk_cost,
    chunked_gla,
    compose,
    compose_all,
    hillis_steele_scan,
    linear_attention_backward,
    linear_recurrence_backward,
    parallel_linear_scan,
    segsum,
    sequential_scan,
    step_time,
)

F64 = torch.float64
# float64 comparisons of two exact algorithms that only regroup the same arithmetic: their
# rounding differences are ~1e-15 relative, so 1e-10 leaves room without hiding a wrong term.
TOL = dict(rtol=1e-10, atol=1e-10)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rand(*shape, seed=0, low=-1.0, high=1.0):
    return low + (high - low) * torch.rand(*shape, generator=gen(seed), dtype=F64)


# ---------------------------------------------------------------------------------------------
# Ground truths written out as plain loops, independent of the module.

def loop_states(a, b, h0=None):
    """h_t = a_t * h_{t-1} + b_t (elementwise), or A_t @ h_{t-1} + b_t when a is one dim more."""
    dense = a.dim() == b.dim() + 1
    h = torch.zeros_like(b[0]) if h0 is None else h0
    out = []
    for t in range(b.shape[0]):
        h = (a[t] @ h if dense else a[t] * h) + b[t]
        out.append(h)
    return torch.stack(out)


def loop_linear_attention(Q, K, V, log_a, S0=None):
    """S_t = a_t S_{t-1} + k_t v_t^T, o_t = S_t^T q_t, one token at a time."""
    S = Q.new_zeros(Q.shape[-1], V.shape[-1]) if S0 is None else S0
    out = []
    for t in range(Q.shape[0]):
        S = log_a[t].exp() * S + torch.outer(K[t], V[t])
        out.append(S.T @ Q[t])
    return (torch.stack(out) if out else V[:0].clone()), S


# ---------------------------------------------------------------------------------------------
# Affine maps.

def test_compose_seed_example_and_identity():
    # Seed 001: "multiply by 0.5 and add 1" then "multiply by 0.5 and add 0" is (0.25, 0.5).
    a, b = compose((0.5, 1.0), (0.5, 0.0))
    assert (float(a), float(b)) == (0.25, 0.5)
    a, b = compose((1.0, 0.0), (0.7, 0.3))  # (1, 0) is the identity
    assert (float(a), float(b)) == (0.7, 0.3)


def dense_maps(n, seed=0):
    return [(rand(3, 3, seed=seed + 2 * i), rand(3, seed=seed + 2 * i + 1)) for i in range(n)]


def test_compose_dense_is_associative_but_not_commutative():
    p1, p2, p3 = dense_maps(3)
    left = compose(compose(p1, p2), p3)
    right = compose(p1, compose(p2, p3))
    for x, y in zip(left, right):
        torch.testing.assert_close(x, y, **TOL)
    # Steps may be regrouped, never reordered.
    a12, b12 = compose(p1, p2)
    a21, b21 = compose(p2, p1)
    assert not torch.allclose(a12, a21) and not torch.allclose(b12, b21)


def test_compose_means_first_then_second_with_later_matrix_on_the_left():
    p1, p2 = dense_maps(2, seed=10)
    h = rand(3, seed=99)
    a, b = compose(p1, p2)
    torch.testing.assert_close(a @ h + b, p2[0] @ (p1[0] @ h + p1[1]) + p2[1], **TOL)
    torch.testing.assert_close(a, p2[0] @ p1[0], **TOL)


def test_compose_diagonal_is_elementwise():
    a1, b1, a2, b2 = (rand(4, seed=s) for s in range(4))
    a, b = compose((a1, b1), (a2, b2))
    torch.testing.assert_close(a, a1 * a2, **TOL)
    torch.testing.assert_close(b, a2 * b1 + b2, **TOL)


def test_compose_all_applies_maps_in_order():
    maps = dense_maps(6, seed=20)
    a, b = compose_all(maps)
    h0 = rand(3, seed=98)
    h = h0
    for A, c in maps:
        h = A @ h + c
    torch.testing.assert_close(a @ h0 + b, h, **TOL)
    assert [float(x) for x in compose_all([(0.5, 1.0)])] == [0.5, 1.0]  # one map is itself
    with pytest.raises(ValueError):
        compose_all([])


# ---------------------------------------------------------------------------------------------
# Scans.

SCANS = [sequential_scan, hillis_steele_scan, blelloch_scan]


@pytest.mark.parametrize("scan", SCANS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("T", [1, 2, 3, 5, 8, 17, 1000])
@pytest.mark.parametrize("shape", [(), (4,)], ids=["scalar", "diagonal"])
def test_scans_agree_with_the_loop(scan, T, shape):
    a = rand(T, *shape, seed=1, low=0.5, high=1.0)
    b = rand(T, *shape, seed=2)
    A, B = scan(a, b)
    torch.testing.assert_close(B, loop_states(a, b), **TOL)  # B_t is h_t from h_0 = 0
    torch.testing.assert_close(A, torch.cumprod(a, 0), **TOL)  # A_t is the product a_1..a_t


@pytest.mark.parametrize("scan", SCANS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("T", [1, 6, 13])
def test_scans_with_dense_matrix_steps(scan, T):
    # The seed's cell: matrix-affine elements, where the order inside each combine matters.
    a, b = rand(T, 3, 3, seed=3), rand(T, 3, seed=4)
    A, B = scan(a, b)
    torch.testing.assert_close(B, loop_states(a, b), **TOL)
    h0 = rand(3, seed=5)
    torch.testing.assert_close((A @ h0.unsqueeze(-1)).squeeze(-1) + B, loop_states(a, b, h0), **TOL)


def test_seed_combine_counts_at_T_1000():
    # Seed 001: the loop 999, Hillis-Steele 8977 (sum of 1000 - d over d = 1..512), Blelloch
    # 3046 = 1023 up + 1023 down + 1000 to turn the exclusive scan inclusive.
    a, b = rand(1000, 2, seed=6, low=0.5, high=1.0), rand(1000, 2, seed=7)
    assert sequential_scan(a, b, return_count=True)[2] == 999
    assert hillis_steele_scan(a, b, return_count=True)[2] == 8977
    assert hillis_steele_scan(a, b, return_count=True)[2] == sum(1000 - 2**k for k in range(10))
    assert blelloch_scan(a, b, return_count=True)[2] == 3046


@pytest.mark.parametrize(
    "T, loop, hs, blelloch", [(1, 0, 0, 1), (2, 1, 1, 4), (1024, 1023, 9217, 3070)]
)
def test_combine_counts_at_the_edges(T, loop, hs, blelloch):
    a, b = torch.full((T,), 0.9, dtype=F64), torch.ones(T, dtype=F64)
    counts = [scan(a, b, return_count=True)[2] for scan in SCANS]
    assert counts == [loop, hs, blelloch]


def test_parallel_linear_scan_folds_h0_into_the_first_step():
    # Seed 001: h0 = 2 and first step (0.5, 1) fold into the input 1 + 0.5 * 2 = 2 = h_1.
    assert parallel_linear_scan([0.5], [1.0], h0=2.0).tolist() == [2.0]
    for T in [1, 7, 100]:
        a, b, h0 = rand(T, 5, seed=8, low=0.5, high=1.0), rand(T, 5, seed=9), rand(5, seed=10)
        torch.testing.assert_close(parallel_linear_scan(a, b, h0), loop_states(a, b, h0), **TOL)
        torch.testing.assert_close(parallel_linear_scan(a, b), loop_states(a, b), **TOL)
    h, count = parallel_linear_scan(a, b, h0, return_count=True)
    assert count == 127 + 127 + 100  # the Blelloch scan underneath


def test_parallel_linear_scan_in_pieces_continues_from_the_last_state():
    a, b = rand(50, 3, seed=11, low=0.5, high=1.0), rand(50, 3, seed=12)
    first = parallel_linear_scan(a[:20], b[:20])
    second = parallel_linear_scan(a[20:], b[20:], h0=first[-1])
    torch.testing.assert_close(torch.cat([first, second]), loop_states(a, b), **TOL)


# ---------------------------------------------------------------------------------------------
# Long products and segment sums.

def test_float32_product_of_0_9_sticks_while_segsum_stays_right():
    # Seed 001: a running float32 product of 0.9 goes subnormal at step 829 and from step 964 on
    # rounds back to the same 5.6e-45, so P_1100 == P_1000 and the ratio "a_{1100:1000}" is 1.0.
    P = np.cumprod(np.full(1100, 0.9, dtype=np.float32))  # one float32 multiply per step
    assert P[1099] == P[999] and P[999] > 0
    assert P[1099] / P[999] == 1.0  # true value 0.9**100 = 2.66e-5
    assert int(np.argmax(P < np.finfo(np.float32).tiny)) + 1 == 829
    # torch's CPU cumprod rounds a double product instead; by step 1000 that is 0, and 0/0 = NaN.
    Pt = torch.cumprod(torch.full((1100,), 0.9), 0)
    assert not math.isclose(float(Pt[1099] / Pt[999]), 0.9**100, rel_tol=0.5)

    log_a = torch.log(torch.full((1100,), 0.9))  # float32
    seg = segsum(log_a)
    exact = segsum(log_a.double())  # the same float32 decays, summed in float64
    got = seg[1099, 999].exp()
    assert got.dtype == torch.float32
    # 100 float32 additions of magnitude <= 11: rounding ~1e-6 relative; 1e-5 is the seed's bar.
    assert abs(float(got) / float(exact[1099, 999].exp()) - 1) < 1e-5
    # The whole 1100-step product underflows to 0, which is harmless: the truth (5e-51) is
    # below float32's range too. Its log, built from its own terms, is still accurate.
    assert seg[1099, 0].exp() == 0
    assert abs(float(seg[1099, 0]) / float(exact[1099, 0]) - 1) < 1e-6


def test_segsum_never_subtracts_long_cumulative_sums():
    # Seed 001: after 100,000 steps the cumulative float32 log is about -10,600, where neighbours
    # are 2**-10 apart, so S_t - S_s over 20 steps is off by a few thousandths; summing only the
    # segment's own 20 logs is accurate to float32's precision.
    T, L = 100_000, 20
    log_a = np.log(np.full(T, 0.9, dtype=np.float32))
    S = np.cumsum(log_a)  # float32, one addition at a time, as a kernel would
    assert S.dtype == np.float32 and -10_600 < S[-1] < -10_500
    truth = math.exp(L * float(log_a[0]))  # the same float32 log, multiplied out in float64
    by_difference = math.exp(float(S[-1] - S[-1 - L]))
    seg = segsum(torch.from_numpy(log_a[-L - 1 :]))  # the window s..t; entry [L, 0] = steps s+1..t
    by_segsum = float(seg[L, 0].exp())
    err_difference = abs(by_difference / truth - 1)
    err_segsum = abs(by_segsum / truth - 1)
    assert err_difference > 1e-3  # the seed's run: 3e-3
    assert err_segsum < 1e-6  # 20 additions of magnitude <= 2.1: ~1e-7
    assert seg.dtype == torch.float32


def test_segsum_reset_gives_zero_never_nan():
    log_a = torch.log(torch.tensor([0.5, 0.5, 0.0, 0.5, 0.5]))  # a_3 = 0: log is -inf
    assert torch.isneginf(log_a[2])
    P = segsum(log_a).exp()
    assert not torch.isnan(P).any()
    assert P[3, 1] == 0 and P[4, 0] == 0  # segments that cross the reset
    assert P[1, 0] == 0.5 and P[4, 2] == 0.25 and P[2, 2] == 1  # segments that do not
    # The subtraction of cumulative sums it replaces gives NaN exactly there.
    C = torch.cumsum(log_a, 0)
    assert torch.isnan(C[4] - C[2])


def test_segsum_definition_and_shape():
    log_a = rand(2, 7, seed=13, low=-2.0, high=0.0)
    seg = segsum(log_a)
    assert seg.shape == (2, 7, 7)
    for i in range(7):
        for j in range(7):
            above = torch.full((2,), -math.inf, dtype=F64)
            want = log_a[:, j + 1 : i + 1].sum(-1) if i >= j else above
            torch.testing.assert_close(seg[:, i, j], want, **TOL)


# ---------------------------------------------------------------------------------------------
# Backward passes.

def finite_difference(f, x, index, eps=1e-6):
    """Central difference of the scalar f at one entry of x (float64)."""
    xp, xm = x.clone(), x.clone()
    xp[index] += eps
    xm[index] -= eps
    return (f(xp) - f(xm)) / (2 * eps)


def recurrence_loss(a, b, h0, g):
    return (g * loop_states(a, b, h0)).sum()


def test_linear_recurrence_backward_matches_autograd():
    T, N = 50, 4
    a = rand(T, N, seed=14, low=0.5, high=1.0).requires_grad_()
    b = rand(T, N, seed=15).requires_grad_()
    h0 = rand(N, seed=16).requires_grad_()
    g = rand(T, N, seed=17)
    recurrence_loss(a, b, h0, g).backward()
    da, db, dh0 = linear_recurrence_backward(a.detach(), b.detach(), h0.detach(), g)
    torch.testing.assert_close(da, a.grad, **TOL)
    torch.testing.assert_close(db, b.grad, **TOL)
    torch.testing.assert_close(dh0, h0.grad, **TOL)


def test_linear_recurrence_backward_matches_finite_differences():
    T, N = 50, 3
    a, b = rand(T, N, seed=18, low=0.5, high=1.0), rand(T, N, seed=19)
    h0, g = rand(N, seed=20), rand(T, N, seed=21)
    da, db, dh0 = linear_recurrence_backward(a, b, h0, g)
    # Central differences with eps = 1e-6 in float64: truncation ~eps^2, rounding ~1e-16/eps, so
    # agreement to ~1e-9 is what they can show.
    fd = dict(rtol=1e-7, atol=1e-8)
    for idx in [(0, 0), (7, 1), (49, 2)]:
        want_da = finite_difference(lambda x: recurrence_loss(x, b, h0, g), a, idx)
        want_db = finite_difference(lambda x: recurrence_loss(a, x, h0, g), b, idx)
        torch.testing.assert_close(da[idx], want_da, **fd)
        torch.testing.assert_close(db[idx], want_db, **fd)
    for i in range(N):
        want = finite_difference(lambda x: recurrence_loss(a, b, x, g), h0, i)
        torch.testing.assert_close(dh0[i], want, **fd)


def test_linear_recurrence_backward_small_example_by_hand():
    # h1 = 0.5*1 + 1 = 1.5, h2 = 0.5*h1 + 1 = 1.75, L = h2: hbar = (0.5, 1).
    da, db, dh0 = linear_recurrence_backward([0.5, 0.5], [1.0, 1.0], 1.0, [0.0, 1.0])
    assert da.tolist() == [0.5, 1.5] and db.tolist() == [0.5, 1.0] and float(dh0) == 0.25


def attention_inputs(T, d_k, d_v, log_a, seed=0):
    Q, K = rand(T, d_k, seed=seed), rand(T, d_k, seed=seed + 1)
    V, dO = rand(T, d_v, seed=seed + 2), rand(T, d_v, seed=seed + 3)
    return Q, K, V, torch.as_tensor(log_a, dtype=F64), dO


DECAYS = {
    "no_decay": lambda T: torch.zeros(T, dtype=F64),  # log a = 0: plain causal linear attention
    "mixed": lambda T: rand(T, seed=40, low=-1.0, high=0.0),
    "strong": lambda T: rand(T, seed=41, low=-8.0, high=-4.0),  # a between 3e-4 and 2e-2
}


@pytest.mark.parametrize("decay", DECAYS, ids=str)
@pytest.mark.parametrize("T", [1, 2, 37])
def test_linear_attention_backward_matches_autograd(decay, T):
    Q, K, V, log_a, dO = attention_inputs(T, 5, 3, DECAYS[decay](T))
    leaves = [x.clone().requires_grad_() for x in (Q, K, V, log_a)]
    O, _ = loop_linear_attention(*leaves)
    (O * dO).sum().backward()
    got = linear_attention_backward(Q, K, V, log_a, dO)
    for name, g, leaf in zip(["dQ", "dK", "dV", "dlog_a"], got, leaves):
        torch.testing.assert_close(g, leaf.grad, **TOL, msg=lambda m: f"{name}: {m}")


def test_linear_attention_backward_matches_finite_differences():
    T = 12
    Q, K, V, log_a, dO = attention_inputs(T, 4, 3, DECAYS["mixed"](T), seed=50)
    got = dict(zip(["Q", "K", "V", "log_a"], linear_attention_backward(Q, K, V, log_a, dO)))
    inputs = dict(Q=Q, K=K, V=V, log_a=log_a)

    def loss(name, x):
        args = dict(inputs, **{name: x})
        return (loop_linear_attention(args["Q"], args["K"], args["V"], args["log_a"])[0] * dO).sum()

    # Central differences, eps = 1e-6, float64: agreement to ~1e-9 (see the recurrence test).
    fd = dict(rtol=1e-7, atol=1e-8)
    for name in inputs:
        for idx in ([(0,), (5,), (11,)] if name == "log_a" else [(0, 0), (5, 1), (11, 2)]):
            want = finite_difference(lambda x: loss(name, x), inputs[name], idx)
            torch.testing.assert_close(got[name][idx], want, **fd)


def test_linear_attention_backward_with_a_reset():
    T = 9
    log_a = DECAYS["mixed"](T)
    log_a[4] = -math.inf  # a_5 = 0 wipes the state
    Q, K, V, _, dO = attention_inputs(T, 3, 2, log_a, seed=60)
    leaves = [x.clone().requires_grad_() for x in (Q, K, V)]
    O, _ = loop_linear_attention(*leaves, log_a)
    (O * dO).sum().backward()
    dQ, dK, dV, dlog_a = linear_attention_backward(Q, K, V, log_a, dO)
    for g, leaf in zip((dQ, dK, dV), leaves):
        torch.testing.assert_close(g, leaf.grad, **TOL)
    # No path crosses a reset, so its decay gradient is 0 up to rounding; never NaN.
    assert torch.isfinite(dlog_a).all() and abs(float(dlog_a[4])) < 1e-12


def test_linear_attention_backward_batched():
    B, H, T = 2, 3, 10
    Q, K = rand(B, H, T, 4, seed=70), rand(B, H, T, 4, seed=71)
    V, dO = rand(B, H, T, 2, seed=72), rand(B, H, T, 2, seed=73)
    log_a = rand(B, H, T, seed=74, low=-1.0, high=0.0)
    got = linear_attention_backward(Q, K, V, log_a, dO)
    for b in range(B):
        for h in range(H):
            want = linear_attention_backward(Q[b, h], K[b, h], V[b, h], log_a[b, h], dO[b, h])
            for x, y in zip(got, want):
                torch.testing.assert_close(x[b, h], y, **TOL)


# ---------------------------------------------------------------------------------------------
# The chunkwise algorithm.

@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
@pytest.mark.parametrize("T_c", [1, 16, 64, "T"])
@pytest.mark.parametrize("with_S0", [False, True], ids=["S0=0", "S0"])
def test_chunked_gla_matches_the_token_loop(T, T_c, with_S0):
    T_c = T if T_c == "T" else T_c
    Q, K, V, log_a, _ = attention_inputs(T, 5, 3, rand(T, seed=80, low=-0.5, high=0.0), seed=81)
    S0 = rand(5, 3, seed=85) if with_S0 else None
    O, S = chunked_gla(Q, K, V, log_a, T_c, S0)
    O_ref, S_ref = loop_linear_attention(Q, K, V, log_a, S0)
    torch.testing.assert_close(O, O_ref, **TOL)
    torch.testing.assert_close(S, S_ref, **TOL)


def test_chunked_gla_with_resets_and_unit_decays():
    T = 70
    log_a = rand(T, seed=90, low=-0.3, high=0.0)
    log_a[[0, 16, 33, 63, 64]] = -math.inf  # resets at chunk starts, inside, at a chunk's end
    log_a[40:50] = 0.0  # a = 1 exactly
    Q, K, V, _, _ = attention_inputs(T, 4, 4, log_a, seed=91)
    S0 = rand(4, 4, seed=92)
    O, S = chunked_gla(Q, K, V, log_a, 16, S0)
    O_ref, S_ref = loop_linear_attention(Q, K, V, log_a, S0)
    assert not torch.isnan(O).any()
    torch.testing.assert_close(O, O_ref, **TOL)
    torch.testing.assert_close(S, S_ref, **TOL)


def test_chunked_gla_batched_and_float32():
    B, H, T = 2, 2, 50
    Q, K = rand(B, H, T, 8, seed=93).float(), rand(B, H, T, 8, seed=94).float()
    V = rand(B, H, T, 4, seed=95).float()
    log_a = rand(B, H, T, seed=96, low=-0.2, high=0.0).float()
    O, S = chunked_gla(Q, K, V, log_a, 16)
    assert O.dtype == S.dtype == torch.float32
    assert O.shape == (B, H, T, 4) and S.shape == (B, H, 8, 4)
    for b in range(B):
        for h in range(H):
            one = (x[b, h].double() for x in (Q, K, V, log_a))
            O_ref, S_ref = loop_linear_attention(*one)
            # float32 against a float64 loop: ~1e-6 relative per operation, sums of ~50 terms.
            torch.testing.assert_close(O[b, h].double(), O_ref, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(S[b, h].double(), S_ref, rtol=1e-5, atol=1e-5)


def test_chunked_gla_four_token_example():
    # a = 1/2 everywhere, scalar q = k = v = 1, T_c = 2: o_t = sum_{s<=t} 2^-(t-s).
    ones = torch.ones(4, 1, dtype=F64)
    O, S = chunked_gla(ones, ones, ones, torch.full((4,), math.log(0.5), dtype=F64), 2)
    torch.testing.assert_close(O.squeeze(-1), torch.tensor([1, 1.5, 1.75, 1.875], dtype=F64), **TOL)
    torch.testing.assert_close(S, torch.tensor([[1.875]], dtype=F64), **TOL)


# ---------------------------------------------------------------------------------------------
# Cost model.

def test_chunk_cost_exact_chunks():
    # Per chunk of 64 at d = 64: 2*64^2*(64+64) + 4*64*64*64 = 1048576 + 1048576.
    want = ChunkCost(flops=4_194_304, sequential_steps=2, state_numbers=2 * 64 * 64)
    assert chunk_cost(128, 64, 64, 64) == want


def test_chunk_cost_short_last_chunk_uses_the_ceiling():
    # T = 65, T_c = 64: one chunk of 64 (2*64^2*5 + 4*64*6 = 42496) and one of 1 (10 + 24 = 34).
    assert chunk_cost(65, 64, 2, 3) == ChunkCost(flops=42_530, sequential_steps=2, state_numbers=12)
    assert chunk_cost(1, 64, 2, 3) == ChunkCost(flops=34, sequential_steps=1, state_numbers=6)
    assert chunk_cost(0, 64, 2, 3) == ChunkCost(0, 0, 0)
    with pytest.raises(ValueError):
        chunk_cost(10, 0, 2, 3)


def test_chunk_cost_seed_figures():
    # Seed 001: at d_k = d_v = 32, T_c = 1024 does 29 times the FLOPs of T_c = 4.
    ratio = chunk_cost(4096, 1024, 32, 32).flops / chunk_cost(4096, 4, 32, 32).flops
    assert 29 < ratio < 30
    # At the balance point T_c* = 2 d_k d_v / (d_k + d_v) = 32 the quadratic part equals the
    # linear part, so the total is twice the unavoidable 4 T d_k d_v.
    assert chunk_cost(4096, 32, 32, 32).flops == 2 * 4 * 4096 * 32 * 32
    # T_c = 1 is the recurrence: T steps; T_c = T is one step.
    assert chunk_cost(1000, 1, 8, 8).sequential_steps == 1000
    assert chunk_cost(1000, 1000, 8, 8).sequential_steps == 1


def test_step_time_hand_computed():
    # 2 chunks of 64 at d = 64: 4194304 FLOPs per head at 1e12 FLOP/s = 4.194304 us; scalar work
    # 2 * (64^2 + 64*128 + 64^2) = 32768 ops at 1e11 op/s = 0.32768 us, overlapped, so the head
    # is matmul-bound. Two heads: 8.388608 us; two sequential steps of 1 us: 10.388608 us.
    got = step_time(128, 64, 64, 64, 2, 1e12, 1e11, 1e-6)
    assert got == pytest.approx(10.388608e-6, rel=1e-12)
    # Scalar-bound when the elementwise units are slow enough: 32768 ops at 1e9 op/s = 32.768 us.
    assert step_time(128, 64, 64, 64, 1, 1e12, 1e9, 0.0) == pytest.approx(32.768e-6, rel=1e-12)


def test_step_time_is_monotone():
    # The seed's H100 figures: 989 TFLOP/s on the tensor cores, 67 TFLOP/s elsewhere.
    base = dict(T=4096, T_c=64, d_k=128, d_v=128, heads=16,
                peak_matmul=989e12, peak_scalar=67e12, latency=1e-6)
    t0 = step_time(**base)
    assert step_time(**dict(base, T=8192)) > t0
    assert step_time(**dict(base, heads=32)) > t0
    assert step_time(**dict(base, latency=2e-6)) > t0
    assert step_time(**dict(base, peak_matmul=2 * 989e12)) <= t0
    assert step_time(**dict(base, peak_scalar=2 * 67e12)) <= t0
    # Very short chunks lose to latency, very long ones to quadratic FLOPs.
    assert step_time(**dict(base, T_c=1)) > t0 and step_time(**dict(base, T_c=4096)) > t0


# ---------------------------------------------------------------------------------------------
# Inputs.

def test_numpy_in_numpy_out():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.5, 1, (10, 3)), rng.normal(size=(10, 3))
    h = parallel_linear_scan(a, b, np.ones(3))
    assert isinstance(h, np.ndarray) and h.dtype == np.float64
    want = loop_states(torch.from_numpy(a), torch.from_numpy(b), torch.ones(3, dtype=F64))
    np.testing.assert_allclose(h, want.numpy(), rtol=1e-12)  # float64 throughout
    for scan in SCANS:
        A, B = scan(a, b)
        assert isinstance(A, np.ndarray) and isinstance(B, np.ndarray)
    assert all(isinstance(x, np.ndarray) for x in linear_recurrence_backward(a, b, None, b))
    Q, K, V = rng.normal(size=(6, 2)), rng.normal(size=(6, 2)), rng.normal(size=(6, 3))
    log_a = -rng.uniform(size=6)
    O, S = chunked_gla(Q, K, V, log_a, 4)
    assert isinstance(O, np.ndarray) and isinstance(S, np.ndarray)
    assert all(isinstance(x, np.ndarray) for x in linear_attention_backward(Q, K, V, log_a, O))
    assert isinstance(segsum(log_a), np.ndarray)
    assert isinstance(compose((a[0], b[0]), (a[1], b[1]))[0], np.ndarray)


def test_torch_inputs_keep_their_dtype():
    a, b = torch.rand(5, 2), torch.rand(5, 2)
    assert parallel_linear_scan(a, b).dtype == torch.float32
    # A NumPy argument next to a torch tensor takes the tensor's dtype and device.
    assert parallel_linear_scan(a, b, h0=np.zeros(2)).dtype == torch.float32


def test_docstring_examples_run():
    result = doctest.testmod(algebra)
    assert result.attempted > 10 and result.failed == 0
