"""The streaming Triton kernel (kernels/stream/recurrence.py, launched by launch/stream.py) under the
interpreter, against the oracle.

Every family flag (GDN, GDP folded, GLA scalar / per key, SSD tied / untied), the state cache with
padding and duplicate-free random slots, speculative-decoding snapshots (steps_per_token 1, 2, 3),
num_accepted_tokens, the bf16 state cache, launch splits, refusals and bad input.

Tolerance (DESIGN.md): the kernel computes in float32, so it is compared with the float64 oracle
relative to what the same oracle computes in float32 on the same inputs: RMS error and max abs error
each at most 4x the float32 oracle's own, plus a floor of 1e-6 (relative to the reference's RMS /
max). A bf16 state is rounded once on the way in (the oracle gets that same rounded state) and once
on the way out: there the same-precision reference is the float32 oracle's result rounded to bf16.
Slots not named and padding slots are compared bit for bit (NaN-poisoned first).
"""
from __future__ import annotations

import pytest
import torch

import recurscan
from recurscan.launch import stream as R
from recurscan.plan import stream as P
from recurscan.problem import key_contiguous
from recurscan.ops.mamba_decode import selective_state_update_reference
from recurscan.reference.delta import gated_delta_product_naive, gated_delta_rule_naive
from recurscan.reference.gla import gla_naive
from recurscan.reference.ssd import ssd_naive
from tests.helpers.tolerances import assert_like_fp32, bits, both

triton_only = pytest.mark.skipif(
    not torch.cuda.is_available() and __import__("os").environ.get("TRITON_INTERPRET") != "1",
    reason="the Triton kernel needs a GPU or TRITON_INTERPRET=1")
pytestmark = triton_only

F32, F64 = torch.float32, torch.float64
NAN = float("nan")


def inputs(B, T, H, HV, K, V, *, beta_mode="head", gate=True, seed=0, dtype=F32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, generator=gen) + 2) if gate else None
    if gate and T > 3:
        g[:, 1] = 0.0  # decay exactly 1
        g[:, T // 2, 0] = float("-inf")  # a reset
    beta = {"head": torch.rand(B, T, HV, generator=gen), "value": torch.rand(B, T, HV, V, generator=gen),
            None: None}[beta_mode]
    return [x if x is None else x.to(dtype) for x in (q, k, v, g, beta)]


# ------------------------------------------------------------------------------------------------
# Gated DeltaNet: flags, GVA, varlen, column blocks
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T, beta_mode, gate, l2norm, H", [
    (1, "head", True, True, 2), (1, "value", False, False, 1), (5, "value", True, False, 1), (17, None, False, True, 2),
    (66, "head", True, True, 1),
])
def test_gdn_matches_oracle(T, beta_mode, gate, l2norm, H):
    q, k, v, g, beta = inputs(2, T, H, 4, 24, 20, beta_mode=beta_mode, gate=gate)
    if not gate and not l2norm:
        k = torch.nn.functional.normalize(k, dim=-1)
    S0 = torch.randn(2, 4, 24, 20)
    o, S = recurscan.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, initial_state=S0, output_final_state=True,
                                                             use_qk_l2norm_in_kernel=l2norm, backend="triton")
    (wo, wS), (ro, rS) = both(gated_delta_rule_naive, q, k, v, g, beta, initial_state=S0,
                              use_qk_l2norm_in_kernel=l2norm)
    assert_like_fp32(o, wo, ro, "o")
    assert_like_fp32(S, wS, rS, "final state")


def test_gdn_varlen_narrow_column_blocks_and_odd_sizes():
    # K = 24 and V = 20 (not powers of two), 8-column blocks (3 blocks, the last one masked),
    # one-token sequences beside longer ones, scale given, bf16 inputs.
    cu = torch.tensor([0, 1, 2, 9, 10, 23])
    q, k, v, g, beta = inputs(1, 23, 2, 4, 24, 20, dtype=torch.bfloat16)
    S0 = torch.randn(5, 4, 24, 20)
    o = torch.full((1, 23, 4, 20), NAN, dtype=torch.bfloat16)
    final = torch.full((5, 4, 24, 20), NAN)
    cfg = P.StreamShape(BK=32, BV=8, num_warps=4, num_stages=1, reason="test: several column blocks")
    R.streaming_recurrence(q, k, v, o, scale=0.3, delta=True, gate="scalar", g=g, beta=beta, beta_mode="head",
                           l2norm=True, cu_seqlens=cu, initial=S0, final=final, num_sequences=5, shape=cfg)
    (wo, wS), (ro, rS) = both(gated_delta_rule_naive, q, k, v, g, beta, scale=0.3, initial_state=S0,
                              use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    assert_like_fp32(final, wS, rS, "final state")
    # the output is rounded to bf16: the same-precision reference is the float32 oracle rounded too
    assert_like_fp32(o, wo, ro.bfloat16(), "o (bf16)")


# ------------------------------------------------------------------------------------------------
# State cache: padding, random slots, untouched slots bit-identical, bf16 cache
# ------------------------------------------------------------------------------------------------


def _cache(S, HV, K, V, slots, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    cache = torch.full((S, HV, K, V), NAN, dtype=dtype)
    for s in slots:
        if s >= 0:
            cache[s] = torch.randn(HV, K, V, generator=gen).to(dtype)
    return cache


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("state_dtype", [F32, torch.bfloat16])
def test_gdn_state_cache_padding_and_random_slots(state_dtype, layout):
    """layout "vk": the cache is a [S, HV, V, K] tensor passed as its [S, HV, K, V] transposed view
    (vLLM's, SGLang's and FlashInfer's layout); the kernel reads it through its strides."""
    B, T, HV, K, V, S = 5, 2, 4, 16, 24, 11
    gen = torch.Generator().manual_seed(3)
    slots = torch.randperm(S, generator=gen)[:B]
    slots[1] = slots[3] = -1
    q, k, v, g, beta = inputs(B, T, 2, HV, K, V, beta_mode="value")
    cache = _cache(S, HV, K, V, slots.tolist(), state_dtype)
    if layout == "vk":
        cache = cache.transpose(-1, -2).contiguous().transpose(-1, -2)
        assert cache.stride(-2) == 1 and key_contiguous(cache)
    before = cache.clone()
    o, final = recurscan.fused_recurrent_gated_delta_rule_update(
        q, k, v, g, beta, use_qk_l2norm_in_kernel=True, state=cache, state_indices=slots.int(), backend="triton")
    assert final is cache
    live = [n for n in range(B) if slots[n] >= 0]
    S0 = torch.zeros(B, HV, K, V)
    S0[live] = before[slots[live]].float()
    (wo, wS), (ro, rS) = both(gated_delta_rule_naive, q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True)
    assert o[[1, 3]].eq(0).all() and not o[[1, 3]].isnan().any()  # padding: zero output
    assert_like_fp32(o[live], wo[live], ro[live], "o")
    rS = rS.to(state_dtype)  # the float32 oracle stored at the cache's precision
    assert_like_fp32(cache[slots[live]], wS[live], rS[live], "cache rows")
    untouched = [s for s in range(S) if s not in slots.tolist()]
    assert torch.equal(bits(cache[untouched]), bits(before[untouched]))


@pytest.mark.parametrize("steps_per_token", [1, 2, 3])
@pytest.mark.parametrize("varlen", [False, True])
def test_gdn_snapshots_every_draft_token(steps_per_token, varlen):
    B, drafts, HV, K, V, S = 3, 3, 2, 16, 16, 7
    T = drafts * steps_per_token
    slots = torch.tensor([5, -1, 2])
    q, k, v, g, beta = inputs(B, T, 1, HV, K, V)
    cu = None
    if varlen:  # the same requests packed: lengths T, T, T - steps_per_token (a shorter last one)
        lens = [T, T, T - steps_per_token]
        cu = torch.tensor([0, T, 2 * T, 3 * T - steps_per_token])
        q, k, v, g, beta = (x.reshape(1, B * T, *x.shape[2:])[:, : cu[-1]] for x in (q, k, v, g, beta))
    cache = _cache(S, HV, K, V, [5, 2], F32)
    snaps = torch.full((S, drafts, HV, K, V), NAN)
    before, snaps_before = cache.clone(), snaps.clone()
    o, _ = recurscan.fused_recurrent_gated_delta_rule_update(
        q, k, v, g, beta, use_qk_l2norm_in_kernel=True, state=cache, state_indices=slots, cu_seqlens=cu,
        intermediate_states=snaps, steps_per_token=steps_per_token, backend="triton")
    for n, s in ((0, 5), (2, 2)):
        L = lens[n] if varlen else T
        lo = n * T if varlen else 0
        sel = (slice(0, 1), slice(lo, lo + L)) if varlen else (slice(n, n + 1), slice(0, T))
        args = [x[sel] for x in (q, k, v, g, beta)]
        for i in range(L // steps_per_token):  # the state after draft token i: its prefix's final state
            m = (i + 1) * steps_per_token
            (_, wS), (_, rS) = both(gated_delta_rule_naive, *(a[:, :m] for a in args), initial_state=before[s: s + 1],
                                    use_qk_l2norm_in_kernel=True)
            assert_like_fp32(snaps[s, i], wS[0], rS[0], f"snapshot {i}")
        (wo, wS), (ro, rS) = both(gated_delta_rule_naive, *args, initial_state=before[s: s + 1],
                                  use_qk_l2norm_in_kernel=True)
        assert_like_fp32(o[sel], wo, ro, "o")
        assert_like_fp32(cache[s], wS[0], rS[0], "final")
        assert torch.equal(bits(cache[s]), bits(snaps[s, L // steps_per_token - 1]))
        if L // steps_per_token < drafts:  # entries past the request's draft tokens are not written
            assert torch.equal(bits(snaps[s, L // steps_per_token:]), bits(snaps_before[s, L // steps_per_token:]))
    pad_rows = o[0, T: 2 * T] if varlen else o[1]
    assert pad_rows.eq(0).all()
    others = [0, 1, 3, 4, 6]
    assert torch.equal(bits(cache[others]), bits(before[others]))
    assert torch.equal(bits(snaps[others]), bits(snaps_before[others]))


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("state_dtype", [F32, torch.bfloat16])
def test_num_accepted_tokens_restarts_from_the_snapshot(backend, state_dtype):
    B, drafts, HV, K, V, S, spt = 4, 3, 2, 16, 16, 9, 2
    T = drafts * spt
    slots = torch.tensor([7, 0, -1, 4])
    accepted = torch.tensor([2, 0, 1, 3])  # snapshot 1; the cache row; (padding); snapshot 2
    cache = _cache(S, HV, K, V, [7, 0, 4], state_dtype)
    gen = torch.Generator().manual_seed(5)
    snaps = torch.full((S, drafts, HV, K, V), NAN, dtype=state_dtype)
    for s in (7, 0, 4):
        snaps[s] = torch.randn(drafts, HV, K, V, generator=gen).to(state_dtype)
    snaps_before, before = snaps.clone(), cache.clone()
    q, k, v, g, beta = inputs(B, T, 1, HV, K, V, seed=9)
    o, _ = recurscan.fused_recurrent_gated_delta_rule_update(
        q, k, v, g, beta, state=cache, state_indices=slots, intermediate_states=snaps, steps_per_token=spt,
        num_accepted_tokens=accepted, backend=backend)
    starts = {0: snaps_before[7, 1], 1: before[0], 3: snaps_before[4, 2]}
    for n, start in starts.items():
        s = int(slots[n])
        (wo, wS), (ro, rS) = both(gated_delta_rule_naive, *(x[n: n + 1] for x in (q, k, v, g, beta)),
                                  initial_state=start[None].float())
        assert_like_fp32(o[n: n + 1], wo, ro, f"o of request {n}")
        assert_like_fp32(cache[s], wS[0], rS[0].to(state_dtype), f"final of request {n}")
    assert o[2].eq(0).all()
    others = [1, 2, 3, 5, 6, 8]
    assert torch.equal(bits(cache[others]), bits(before[others]))
    assert torch.equal(bits(snaps[others]), bits(snaps_before[others]))


# ------------------------------------------------------------------------------------------------
# Gated Delta Product folded into the sequence
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("M", [2, 3])
def test_gdp_folded_decode(M):
    B, T, H, HV, K, V, S = 2, 2, 1, 2, 16, 16, 5
    gen = torch.Generator().manual_seed(M)
    q, g = torch.randn(B, T, H, K, generator=gen), torch.nn.functional.logsigmoid(torch.randn(B, T, HV, generator=gen))
    k, v = torch.randn(B, T * M, H, K, generator=gen), torch.randn(B, T * M, HV, V, generator=gen)
    beta = torch.rand(B, T * M, HV, generator=gen)
    slots = torch.tensor([3, 1])
    cache = _cache(S, HV, K, V, [3, 1], F32)
    snaps = torch.full((S, T, HV, K, V), NAN)
    before = cache.clone()
    o, _ = recurscan.fused_recurrent_gated_delta_product_update(
        q, k, v, g, beta, M, use_qk_l2norm_in_kernel=True, state=cache, state_indices=slots,
        intermediate_states=snaps, backend="triton")
    assert o.shape == (B, T, HV, V)
    S0 = before[[3, 1]]
    (wo, wS), (ro, rS) = both(gated_delta_product_naive, q, k, v, g, beta, M, initial_state=S0,
                              use_qk_l2norm_in_kernel=True)
    assert_like_fp32(o, wo, ro, "o")
    assert_like_fp32(cache[[3, 1]], wS, rS, "final")
    for t in range(T):  # one snapshot per token, after its M Householder writes
        (_, wS_t), (_, rS_t) = both(gated_delta_product_naive, q[:, : t + 1], k[:, : (t + 1) * M], v[:, : (t + 1) * M],
                                    g[:, : t + 1], beta[:, : (t + 1) * M], M, initial_state=S0,
                                    use_qk_l2norm_in_kernel=True)
        assert_like_fp32(snaps[[3, 1], t], wS_t, rS_t, f"snapshot {t}")
    assert snaps[[0, 2, 4]].isnan().all()


# ------------------------------------------------------------------------------------------------
# GLA (scalar and per-key decay) through the same kernel
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 9])  # T = 1 reads o from the decayed tile (the decode order)
@pytest.mark.parametrize("per_key", [False, True])
def test_gla_families(per_key, T):
    B, H, HV, K, V = 2, 1, 2, 16, 12
    gen = torch.Generator().manual_seed(11)
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    shape = (B, T, HV, K) if per_key else (B, T, HV)
    g = torch.nn.functional.logsigmoid(torch.randn(*shape, generator=gen) + 1)
    g[:, min(3, T - 1)] = float("-inf")
    S0 = torch.randn(B, HV, K, V, generator=gen)
    o = torch.full((B, T, HV, V), NAN)
    final = torch.full((B, HV, K, V), NAN)
    R.streaming_recurrence(q, k, v, o, scale=K ** -0.5, delta=False, gate="per_key" if per_key else "scalar", g=g,
                           initial=S0, final=final, num_sequences=B)
    (wo, wS), (ro, rS) = both(gla_naive, q, k, v, g, initial_state=S0)
    assert_like_fp32(o, wo, ro, "o")
    assert_like_fp32(final, wS, rS, "final")


# ------------------------------------------------------------------------------------------------
# Mamba2 decode (selective_state_update)
# ------------------------------------------------------------------------------------------------


def ssd_args(b, T, H, P, G, N, *, tied=True, seed=0, with_tokens=False):
    gen = torch.Generator().manual_seed(seed)
    shape = (b, T, H, P) if with_tokens else (b, H, P)
    bc = (b, T, G, N) if with_tokens else (b, G, N)
    x, z = torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)
    B, C = torch.randn(*bc, generator=gen), torch.randn(*bc, generator=gen)
    if tied:
        dt = torch.randn(*shape[:-1], 1, generator=gen).expand(*shape)
        A = -torch.rand(H, 1, 1, generator=gen).expand(H, P, N)
        D = torch.randn(H, 1, generator=gen).expand(H, P)
        dt_bias = torch.randn(H, 1, generator=gen).expand(H, P)
    else:
        dt = torch.randn(*shape, generator=gen)
        A = -torch.rand(H, P, N, generator=gen)
        D, dt_bias = torch.randn(H, P, generator=gen), torch.randn(H, P, generator=gen)
    return x, dt, A, B, C, D, z, dt_bias


def test_mamba_reference_is_the_oracle_where_they_overlap():
    # Scalar A per head (tied), T tokens: the decode reference run T times == ssd_naive over T tokens.
    b, T, H, P, G, N = 2, 4, 4, 6, 2, 8
    x, dt, A, B, C, D, z, dt_bias = ssd_args(b, T, H, P, G, N, with_tokens=True)
    x, dt, A, B, C, D, z, dt_bias = (t.double() for t in (x, dt, A, B, C, D, z, dt_bias))
    state = torch.randn(b, H, P, N, dtype=F64)
    s = state.clone()
    y = selective_state_update_reference(s, x, dt, A, B, C, D, z, dt_bias, True)
    wy, wS = ssd_naive(x, dt[..., 0], A[:, 0, 0], B, C, D=D[:, 0], z=z, dt_bias=dt_bias[:, 0], dt_softplus=True,
                       initial_state=state)
    assert (y - wy).abs().max() <= 1e-10 * (1 + wy.abs().max()) and (s - wS).abs().max() <= 1e-10 * (1 + wS.abs().max())


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("state_dtype", [F32, torch.bfloat16])
def test_selective_state_update_matches_reference(tied, state_dtype):
    b, H, P, G, N, S = 4, 4, 12, 2, 16, 9
    x, dt, A, B, C, D, z, dt_bias = ssd_args(b, 1, H, P, G, N, tied=tied)
    gen = torch.Generator().manual_seed(2)
    idx = torch.randperm(S, generator=gen)[:b]
    idx[2] = -1
    state = torch.full((S, H, P, N), NAN, dtype=state_dtype)
    for s in idx.tolist():
        if s >= 0:
            state[s] = torch.randn(H, P, N, generator=gen).to(state_dtype)
    before = state.clone()
    y = recurscan.selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, True, idx, backend="triton")
    live = [i for i in range(b) if idx[i] >= 0]
    (wy, wS), (ry, rS) = [_ssd_ref(before, x, dt, A, B, C, D, z, dt_bias, idx, d) for d in (F64, F32)]
    assert y[2].eq(0).all()
    assert_like_fp32(y[live], wy[live], ry[live], "y")
    rows = idx[live]
    assert_like_fp32(state[rows], wS[rows], rS[rows].to(state_dtype), "state")
    untouched = [s for s in range(S) if s not in rows.tolist()]
    assert torch.equal(bits(state[untouched]), bits(before[untouched]))


def _ssd_ref(before, x, dt_, A, B, C, D, z, dt_bias, idx, dtype, snaps=None, accepted=None, tokens=False):
    s = before.to(dtype).clone()
    args = [t.to(dtype) for t in (x, dt_, A, B, C, D, z, dt_bias)]
    if not tokens:
        args = [a.unsqueeze(1) if n in (0, 1, 3, 4, 6) else a for n, a in enumerate(args)]
    sn = None if snaps is None else snaps.to(dtype).clone()
    y = selective_state_update_reference(s, *args, True, idx, intermediate_states=sn, num_accepted_tokens=accepted)
    y = y if tokens else y[:, 0]
    return (y, s) if snaps is None else (y, s, sn)


def test_selective_state_update_draft_tokens_snapshots_and_accepted():
    b, T, H, P, G, N, S = 3, 3, 2, 8, 1, 16, 6
    x, dt, A, B, C, D, z, dt_bias = ssd_args(b, T, H, P, G, N, tied=False, with_tokens=True, seed=4)
    idx = torch.tensor([5, -1, 1])
    gen = torch.Generator().manual_seed(6)
    state = torch.full((S, H, P, N), NAN)
    snaps = torch.full((S, T, H, P, N), NAN)
    for s in (5, 1):
        state[s] = torch.randn(H, P, N, generator=gen)
        snaps[s] = torch.randn(T, H, P, N, generator=gen)
    accepted = torch.tensor([2, 3, 0])
    before, snaps_before = state.clone(), snaps.clone()
    y = recurscan.selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, True, idx, intermediate_states=snaps,
                                         num_accepted_tokens=accepted, backend="triton")
    (wy, wS, wsn), (ry, rS, rsn) = [_ssd_ref(before, x, dt, A, B, C, D, z, dt_bias, idx, d, snaps_before, accepted,
                                             tokens=True) for d in (F64, F32)]
    assert y[1].eq(0).all()
    assert_like_fp32(y[[0, 2]], wy[[0, 2]], ry[[0, 2]], "y")
    assert_like_fp32(state[[5, 1]], wS[[5, 1]], rS[[5, 1]], "state")
    assert_like_fp32(snaps[[5, 1]], wsn[[5, 1]], rsn[[5, 1]], "snapshots")
    others = [0, 2, 3, 4]
    assert torch.equal(bits(state[others]), bits(before[others]))
    assert torch.equal(bits(snaps[others]), bits(snaps_before[others]))


def test_selective_state_update_no_heads_form_and_no_indices():
    b, P, N = 3, 10, 8
    gen = torch.Generator().manual_seed(8)
    state = torch.randn(b, P, N, generator=gen)
    x, dt, z = (torch.randn(b, P, generator=gen) for _ in range(3))
    A = -torch.rand(P, N, generator=gen)
    B, C = torch.randn(b, N, generator=gen), torch.randn(b, N, generator=gen)
    D, dt_bias = torch.randn(P, generator=gen), torch.randn(P, generator=gen)
    s1, s2 = state.clone(), state.clone()
    y1 = recurscan.selective_state_update(s1, x, dt, A, B, C, D, z, dt_bias, dt_softplus=True, backend="triton")
    y2 = recurscan.selective_state_update(s2.double(), x.double(), dt.double(), A.double(), B.double(), C.double(),
                                          D.double(), z.double(), dt_bias.double(), dt_softplus=True)
    s64 = s2.double()
    y64 = recurscan.selective_state_update(s64, x.double(), dt.double(), A.double(), B.double(), C.double(),
                                           D.double(), z.double(), dt_bias.double(), dt_softplus=True)
    y32 = recurscan.selective_state_update(s2, x, dt, A, B, C, D, z, dt_bias, dt_softplus=True)
    assert y1.shape == (b, P) and y2.shape == (b, P)
    assert_like_fp32(y1, y64, y32, "y")
    assert_like_fp32(s1, s64, s2, "state")


# ------------------------------------------------------------------------------------------------
# Launch splits, refusals, bad input
# ------------------------------------------------------------------------------------------------


def test_launch_split_hands_the_state_on(monkeypatch):
    cu = torch.tensor([0, 3, 4, 13])
    q, k, v, g, beta = inputs(1, 13, 1, 2, 16, 8)
    cache = _cache(6, 2, 16, 8, [4, 0, 2], F32)
    slots = torch.tensor([4, 0, 2])
    snaps = torch.full((6, 13, 2, 16, 8), NAN)
    kw = dict(use_qk_l2norm_in_kernel=True, cu_seqlens=cu, state_indices=slots, steps_per_token=1, backend="triton")
    c1, s1 = cache.clone(), snaps.clone()
    o1, _ = recurscan.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, state=c1, intermediate_states=s1, **kw)
    monkeypatch.setitem(P.DISPATCH_STEP_BOUND, "cpu", 4)  # 13 packed tokens: 4 launches of <= 4 steps
    c2, s2 = cache.clone(), snaps.clone()
    o2, _ = recurscan.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, state=c2, intermediate_states=s2, **kw)
    # float32 hand-off of a float32 state: bit-identical to one launch
    assert torch.equal(bits(o1), bits(o2)) and torch.equal(bits(c1), bits(c2)) and torch.equal(bits(s1), bits(s2))


def test_every_streaming_launch_names_every_kernel_argument():
    """The direct launcher (runtime/launcher.py) builds its parameter block from the step's arguments
    by the kernel's argument names, defaults included: a launch that leaves one to its default fails
    on the GPU's first call only, never under the interpreter."""
    q, k, v, g, beta = inputs(2, 5, 1, 2, 16, 8)
    o = torch.empty_like(v)
    for final in (None, torch.empty(2, 2, 16, 8)):
        tensors = R.StreamTensors(q, k, v, g, beta, o, ht=final)
        hit = R.build_stream_launches(tensors, P.stream_shape(P.StreamSizes(4, 16, 8, 5, 4), q.device), scale=0.25,
                                      delta=True, gate="scalar", beta_mode="head", num_sequences=2)
        missing = [a for a in R.streaming_recurrence_kernel.arg_names if a not in hit.kwargs]
        assert not missing, missing


def test_state_column_too_large_is_refused_before_launch():
    K = P.MAX_COLUMN_BYTES // 4 + 1
    q = torch.randn(1, 1, 1, K)
    with pytest.raises(P.StateColumnTooLarge, match="cannot fit on chip"):
        recurscan.fused_recurrent_gated_delta_rule_update(q, q, torch.randn(1, 1, 1, 4), backend="triton")
    assert issubclass(P.StateColumnTooLarge, ValueError)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_final_state_laid_out_as_the_initial_state(backend):
    """An initial state given as the transposed view of an [N, HV, V, K] tensor (fla's
    state_v_first layout) gets its final state in the same layout, with the oracle's values."""
    N, T, HV, K, V = 2, 3, 2, 16, 8
    q, k, v, g, beta = inputs(N, T, 1, HV, K, V)
    S0 = torch.randn(N, HV, V, K).transpose(-1, -2)
    o, final = recurscan.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, initial_state=S0,
                                                                 output_final_state=True, backend=backend)
    assert final.shape == (N, HV, K, V) and final.stride(-2) == 1
    (wo, wS), (ro, rS) = both(gated_delta_rule_naive, q, k, v, g, beta, initial_state=S0.contiguous())
    assert_like_fp32(final, wS, rS, "final state")
    assert_like_fp32(o, wo, ro, "o")


def test_stream_shape_rules(monkeypatch):
    cpu = torch.device("cpu")
    assert P.stream_shape(P.StreamSizes(8, 128, 128, 1, 4), cpu).BV == 32
    with pytest.raises(P.StateColumnTooLarge):
        P.stream_shape(P.StreamSizes(8, 1 << 15, 128, 1, 4), cpu)
    # The CUDA rows (the H200's 132 SMs; no GPU needed to read the table):
    monkeypatch.setattr(P, "sm_count", lambda device: 132)
    cuda = torch.device("cuda")

    def shape(heads_total, tokens, vk=False, state_bytes=4):
        c = P.stream_shape(P.StreamSizes(heads_total, 128, 128, tokens, state_bytes, key_contiguous=vk), cuda)
        return c.BV, c.num_warps
    assert shape(256 * 32, 1) == (64, 4)  # many requests, one token, [K, V] fp32: 64 columns on 4 warps
    assert shape(256 * 32, 1, state_bytes=2) == (32, 1)  # bf16 cache: one warp
    assert shape(256 * 32, 4) == (32, 1)  # draft tokens: one warp, 32 columns
    assert shape(32, 1) == (16, 1)  # one request: too few 64-column programs; one warp, narrowed
    assert shape(256 * 32, 1, vk=True) == (8, 1)  # key-contiguous: one warp, 8 rows
    assert shape(32, 4096) == (4, 1)  # streaming prefill


def _good(B=2, T=2):
    q, k, v, g, beta = inputs(B, T, 1, 2, 8, 8)
    return dict(q=q, k=k, v=v, g=g, beta=beta, state=torch.zeros(4, 2, 8, 8), state_indices=torch.tensor([0, 1]))


@pytest.mark.parametrize("change, match", [
    (dict(num_accepted_tokens=torch.tensor([1, 1])), "num_accepted_tokens: requests restart from their snapshots"),
    (dict(intermediate_states=torch.zeros(4, 2, 2, 8, 8), num_accepted_tokens=torch.tensor([1])),
     r"num_accepted_tokens: expected shape \[N\] = \[2\]"),
    (dict(intermediate_states=torch.zeros(4, 1, 2, 8, 8)), r"intermediate_states: expected shape .* T // steps_per_token = 2"),
    (dict(intermediate_states=torch.zeros(4, 1, 2, 8, 8).expand(4, 2, 2, 8, 8)),
     r"intermediate_states: dimension 1 has stride 0"),  # written in place: draft tokens sharing one snapshot
    (dict(backend="cuda"), "backend: expected None, 'torch' or 'triton'"),
])
def test_decode_bad_input_names_the_argument(change, match):
    with pytest.raises(ValueError, match=match):
        recurscan.fused_recurrent_gated_delta_rule_update(**(_good() | change))


def _mamba_good():
    x, dt, A, B, C, D, z, dt_bias = ssd_args(2, 1, 4, 6, 2, 8)
    return dict(state=torch.zeros(3, 4, 6, 8), x=x, dt=dt, A=A, B=B, C=C)


@pytest.mark.parametrize("change, error, match", [
    (lambda a: dict(B=a["B"][:, :, :5]), ValueError, r"B: expected shape \[b, G, N\]"),
    (lambda a: dict(B=torch.zeros(2, 3, 8), C=torch.zeros(2, 3, 8)), ValueError, "B: ngroups = 3 must divide nheads = 4"),
    (lambda a: dict(state_batch_indices=torch.tensor([1, 1])), ValueError, "state_batch_indices: a slot is named twice"),
    (lambda a: dict(state_batch_indices=torch.tensor([3, 0])), ValueError,
     r"state_batch_indices: expected slots in \[0, 3\)"),
    (lambda a: dict(x=a["x"].int()), TypeError, "x: expected dtype"),
    (lambda a: dict(num_accepted_tokens=torch.tensor([1, 1])), ValueError, "num_accepted_tokens: requests restart"),
    (lambda a: dict(state=torch.zeros(1, 4, 6, 8).expand(3, -1, -1, -1)), ValueError, r"state: dimension 0 has stride 0"),
    (lambda a: dict(intermediate_states=torch.zeros(1, 1, 4, 6, 8).expand(3, -1, -1, -1, -1)), ValueError,
     r"intermediate_states: dimension 0 has stride 0"),
    (lambda a: dict(dt_softplus="no"), TypeError, r"dt_softplus: expected a bool, got str 'no'"),
    (lambda a: dict(dt_softplus=1), TypeError, r"dt_softplus: expected a bool, got int 1"),
])
def test_mamba_bad_input_names_the_argument(change, error, match):
    args = _mamba_good()
    args |= change(args)
    with pytest.raises(error, match=match):
        recurscan.selective_state_update(**args)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("grad_on", ["x", "state"])
def test_selective_state_update_is_refused_under_autograd(grad_on, backend):
    """selective_state_update writes its cache in place (and its Triton kernel is forward-only): an
    argument that requires grad, the cache itself included, is a NotImplementedError on both
    backends before the cache is touched; under no_grad the call writes the cache."""
    args = _mamba_good()
    args["state"] = torch.randn(3, 4, 6, 8)
    args[grad_on] = args[grad_on].clone().requires_grad_()
    before = args["state"].detach().clone()
    with pytest.raises(NotImplementedError, match="selective_state_update: inference-only"):
        recurscan.selective_state_update(**args, backend=backend)
    assert torch.equal(args["state"].detach(), before)
    with torch.no_grad():
        recurscan.selective_state_update(**args, backend=backend)
    assert not torch.equal(args["state"].detach()[:2], before[:2])


def test_fla_entry_point_per_key_decay_and_v_first_state():
    B, T, H, HV, K, V = 2, 4, 1, 2, 16, 8
    q, k, v, _, beta = inputs(B, T, H, HV, K, V)
    gk = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, K))
    S0 = torch.randn(B, HV, V, K)  # V-first layout
    kw = dict(beta=beta, initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True, gk=gk,
              state_v_first=True)
    o1, S1 = recurscan.fused_recurrent_gated_delta_rule(q, k, v, backend="triton", **kw)
    o64, S64 = recurscan.fused_recurrent_gated_delta_rule(q.double(), k.double(), v.double(),
                                                          **{n: (a.double() if isinstance(a, torch.Tensor) else a)
                                                             for n, a in kw.items()})
    o32, S32 = recurscan.fused_recurrent_gated_delta_rule(q, k, v, **kw)
    assert S1.shape == (B, HV, V, K)
    assert_like_fp32(o1, o64, o32, "o")
    assert_like_fp32(S1, S64, S32, "final (V-first)")
    with pytest.raises(ValueError, match="use_gate_in_kernel: fla option"):
        recurscan.fused_recurrent_gated_delta_rule(q, k, v, use_gate_in_kernel=True)
