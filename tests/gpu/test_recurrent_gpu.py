"""The streaming kernel and the decode ops on a CUDA GPU at real sizes (``pytest -m gpu``).

Same tolerance rule as tests/test_kernels_recurrent.py (tests/helpers/tolerances.py): against the float64 oracle, at most 4x
the error of the float32 oracle on the same inputs (RMS and max abs), plus a 1e-6 floor; bf16
outputs / states against the float32 oracle rounded the same way. Slots not named are compared
bit for bit.
"""
from __future__ import annotations

import pytest
import torch

import recurscan
from recurscan.launch import stream as R
from recurscan.plan import DISPATCH_STEP_BOUND
from recurscan.ops.mamba_decode import selective_state_update_reference
from recurscan.reference.delta import gated_delta_product_naive, gated_delta_rule_chunked, gated_delta_rule_naive
from tests.helpers.tolerances import assert_like_fp32, bits, both

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEV = "cuda"
F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16


def gdn_decode_inputs(N, T, H, HV, K, V, *, dtype=BF16, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, device=DEV)  # noqa: E731
    q, k, v = r(N, T, H, K).to(dtype), r(N, T, H, K).to(dtype), r(N, T, HV, V).to(dtype)
    g = torch.nn.functional.logsigmoid(r(N, T, HV) + 3)
    beta = torch.sigmoid(r(N, T, HV)).to(dtype)
    return q, k, v, g, beta


def pool(S, HV, K, V, slots, dtype, seed=1):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    cache = torch.full((S, HV, K, V), float("nan"), device=DEV, dtype=dtype)
    live = slots[slots >= 0].long()
    cache[live] = (0.1 * torch.randn(len(live), HV, K, V, generator=gen, device=DEV)).to(dtype)
    return cache


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("state_dtype", [F32, BF16])
def test_gdn_decode_256_requests(state_dtype, layout):
    """layout "vk": a [S, HV, V, K] cache passed as its transposed view (key-contiguous tiles)."""
    N, H, HV, K, V, S = 256, 16, 32, 128, 128, 1024
    gen = torch.Generator(device=DEV).manual_seed(7)
    slots = torch.randperm(S, generator=gen, device=DEV)[:N].int()
    slots[::16] = -1
    q, k, v, g, beta = gdn_decode_inputs(N, 1, H, HV, K, V)
    cache = pool(S, HV, K, V, slots, state_dtype)
    if layout == "vk":
        cache = cache.transpose(-1, -2).contiguous().transpose(-1, -2)
    before = cache.clone()
    o, final = recurscan.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,
                                                                 state=cache, state_indices=slots)
    assert final is cache and o.dtype == BF16
    live = (slots >= 0).nonzero().flatten()
    S0 = torch.zeros(N, HV, K, V, device=DEV)
    S0[live] = before[slots[live].long()].float()
    (wo, wS), (ro, rS) = both(gated_delta_rule_naive, q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True)
    assert o[slots < 0].eq(0).all()
    assert_like_fp32(o[live], wo[live], ro[live].bfloat16(), "o")
    assert_like_fp32(cache[slots[live].long()], wS[live], rS[live].to(state_dtype), "cache")
    named = torch.zeros(S, dtype=torch.bool, device=DEV)
    named[slots[live].long()] = True
    assert torch.equal(bits(cache[~named]), bits(before[~named]))
    if layout == "vk":  # the launch rule saw the key-contiguous layout
        from recurscan.ops import decode as D
        preps = [p for p in D.PREPARED.values() if p.launches is not None and p.launches.kwargs["s0_k"] == 1]
        assert preps and all(p.launches.options["num_warps"] == 1 and p.launches.kwargs["BV"] == 8 for p in preps)


@pytest.mark.parametrize("M", [1, 2])
def test_speculative_decode_snapshots_and_accepted(M):
    N, drafts, H, HV, K, V, S = 64, 4, 16, 32, 128, 128, 200
    gen = torch.Generator(device=DEV).manual_seed(M)
    slots = torch.randperm(S, generator=gen, device=DEV)[:N].int()
    slots[5] = -1
    q, _, _, g, _ = gdn_decode_inputs(N, drafts, H, HV, K, V, seed=M)
    _, k, v, _, beta = gdn_decode_inputs(N, drafts * M, H, HV, K, V, seed=M + 10)
    cache = pool(S, HV, K, V, slots, F32)
    snaps = torch.full((S, drafts, HV, K, V), float("nan"), device=DEV)
    live = (slots >= 0).nonzero().flatten()
    snaps[slots[live].long()] = 0.1 * torch.randn(len(live), drafts, HV, K, V, generator=gen, device=DEV)
    accepted = torch.randint(0, drafts + 1, (N,), generator=gen, device=DEV, dtype=torch.int32)
    before, snaps_before = cache.clone(), snaps.clone()
    o, _ = recurscan.fused_recurrent_gated_delta_product_update(
        q, k, v, g, beta, M, use_qk_l2norm_in_kernel=True, state=cache, state_indices=slots,
        intermediate_states=snaps, num_accepted_tokens=accepted)
    rows = slots[live].long()
    a = accepted[live].long()
    S0 = torch.zeros(N, HV, K, V, device=DEV)
    S0[live] = torch.where((a > 0).view(-1, 1, 1, 1), snaps_before[rows, (a - 1).clamp(min=0)], before[rows])
    (wo, wS), (ro, rS) = both(gated_delta_product_naive, q, k, v, g, beta, M, initial_state=S0,
                              use_qk_l2norm_in_kernel=True)
    assert o[5].eq(0).all()
    assert_like_fp32(o[live], wo[live], ro[live].bfloat16(), "o")
    assert_like_fp32(cache[rows], wS[live], rS[live], "final")
    last = drafts - 1  # the last snapshot is the final state; earlier ones: prefixes
    (_, wS2), (_, rS2) = both(gated_delta_product_naive, q[:, :2], k[:, : 2 * M], v[:, : 2 * M], g[:, :2],
                              beta[:, : 2 * M], M, initial_state=S0, use_qk_l2norm_in_kernel=True)
    assert_like_fp32(snaps[rows, 1], wS2[live], rS2[live], "snapshot 1")
    assert torch.equal(bits(snaps[rows, last]), bits(cache[rows]))
    named = torch.zeros(S, dtype=torch.bool, device=DEV)
    named[rows] = True
    assert torch.equal(bits(cache[~named]), bits(before[~named]))
    assert torch.equal(bits(snaps[~named]), bits(snaps_before[~named]))


def test_pool_offsets_past_2_31():
    # slot * HV * K * V passes 2**31 at slot >= 4096 for 32 x 128 x 128 (8.6 GB of float32 state).
    S, HV, K, V = 4100, 32, 128, 128
    slots = torch.tensor([4099, 5, -1, 4097], dtype=torch.int32, device=DEV)
    cache = torch.zeros(S, HV, K, V, device=DEV)
    cache[4099], cache[5], cache[4097] = 1.0, 2.0, 3.0
    q, k, v, g, beta = gdn_decode_inputs(4, 1, 16, HV, K, V, dtype=F32)
    S0 = cache[[4099, 5, 0, 4097]].clone()
    S0[2] = 0
    sentinel = cache[[4096, 4098, 6, 1]].clone()
    o, _ = recurscan.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,
                                                             state=cache, state_indices=slots)
    (wo, wS), (ro, rS) = both(gated_delta_rule_naive, q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True)
    assert_like_fp32(cache[[4099, 5, 4097]], wS[[0, 1, 3]], rS[[0, 1, 3]], "cache rows past 2**31")
    assert_like_fp32(o[[0, 1, 3]], wo[[0, 1, 3]], ro[[0, 1, 3]], "o")
    assert torch.equal(cache[[4096, 4098, 6, 1]], sentinel)


def test_streaming_prefill_long_few_heads():
    # 65536 tokens over 2 value heads: the few-heads rule (narrow column blocks), a reset mid-way.
    T, H, HV, K, V = 65536, 1, 2, 128, 128
    q, k, v, g, beta = gdn_decode_inputs(1, T, H, HV, K, V, dtype=BF16, seed=3)
    g[0, T // 2, 0] = float("-inf")
    S0 = 0.1 * torch.randn(1, HV, K, V, device=DEV)
    o, S = recurscan.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, initial_state=S0,
                                                             output_final_state=True, use_qk_l2norm_in_kernel=True)
    # the chunked oracle equals the token loop within float64 reassociation (tests/test_reference_delta)
    (wo, wS), (ro, rS) = both(gated_delta_rule_chunked, q, k, v, g, beta, initial_state=S0,
                              use_qk_l2norm_in_kernel=True)
    assert_like_fp32(o, wo, ro.bfloat16(), "o")
    assert_like_fp32(S, wS, rS, "final")


def test_launch_split_on_the_gpu(monkeypatch):
    cu = torch.tensor([0, 100, 101, 300], device=DEV)
    q, k, v, g, beta = gdn_decode_inputs(1, 300, 4, 8, 128, 128, dtype=BF16, seed=4)
    S0 = torch.randn(3, 8, 128, 128, device=DEV)
    kw = dict(initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    o1, S1 = recurscan.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, **kw)
    monkeypatch.setitem(DISPATCH_STEP_BOUND, "cuda", 64)
    o2, S2 = recurscan.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, **kw)
    assert torch.equal(bits(o1), bits(o2)) and torch.equal(bits(S1), bits(S2))


@pytest.mark.parametrize("state_dtype", [F32, BF16])
def test_selective_state_update_256_requests(state_dtype):
    b, H, P, G, N, S = 256, 80, 64, 1, 128, 300
    gen = torch.Generator(device=DEV).manual_seed(9)
    r = lambda *s: torch.randn(*s, generator=gen, device=DEV)  # noqa: E731
    idx = torch.randperm(S, generator=gen, device=DEV)[:b].int()
    idx[3] = -1
    state = torch.full((S, H, P, N), float("nan"), device=DEV, dtype=state_dtype)
    live = (idx >= 0).nonzero().flatten()
    state[idx[live].long()] = (0.1 * r(len(live), H, P, N)).to(state_dtype)
    x, z = r(b, H, P).bfloat16(), r(b, H, P).bfloat16()
    dt = (r(b, H, 1) * 0.5 - 1).expand(b, H, P)
    A = -torch.exp(r(H) * 0.5)[:, None, None].expand(H, P, N)
    B, C = r(b, G, N).bfloat16(), r(b, G, N).bfloat16()
    D, dt_bias = r(H)[:, None].expand(H, P), (0.1 * r(H))[:, None].expand(H, P)
    before = state.clone()
    y = recurscan.selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, True, idx)
    outs = []
    for d in (F64, F32):
        s = before.to(d).clone()
        yy = selective_state_update_reference(s, x.unsqueeze(1), dt.unsqueeze(1).to(d), A.to(d), B.unsqueeze(1),
                                              C.unsqueeze(1), D.to(d), z.unsqueeze(1), dt_bias.to(d), True, idx)
        outs.append((yy[:, 0], s))
    (wy, wS), (ry, rS) = outs
    rows = idx[live].long()
    assert y[3].eq(0).all()
    assert_like_fp32(y[live], wy[live], ry[live].bfloat16(), "y")
    assert_like_fp32(state[rows], wS[rows], rS[rows].to(state_dtype), "state")
    named = torch.zeros(S, dtype=torch.bool, device=DEV)
    named[rows] = True
    assert torch.equal(bits(state[~named]), bits(before[~named]))


def test_no_host_sync_and_cuda_graph_capture():
    N, H, HV, K, V, S = 32, 16, 32, 128, 128, 64
    slots = torch.arange(N, device=DEV, dtype=torch.int32)
    slots[3] = -1
    q, k, v, g, beta = gdn_decode_inputs(N, 1, H, HV, K, V)
    cache = pool(S, HV, K, V, slots, F32).nan_to_num()
    x = torch.randn(N, 80, 64, device=DEV)
    dt = torch.randn(N, 80, 1, device=DEV).expand(N, 80, 64)
    A = -torch.rand(80, device=DEV)[:, None, None].expand(80, 64, 128)
    Bm, Cm = torch.randn(N, 1, 128, device=DEV), torch.randn(N, 1, 128, device=DEV)
    ssd_state = torch.randn(S, 80, 64, 128, device=DEV)

    def step():
        o, _ = recurscan.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,
                                                                 state=cache, state_indices=slots)
        y = recurscan.selective_state_update(ssd_state, x, dt, A, Bm, Cm, dt_softplus=True, state_batch_indices=slots)
        return o, y

    c0, s0 = cache.clone(), ssd_state.clone()
    first = [t.clone() for t in step()]  # first call of this signature: validation, JIT compile
    first_cache = cache.clone()
    torch.cuda.synchronize()
    cache.copy_(c0)
    ssd_state.copy_(s0)
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = step()  # a cached signature: no host synchronisation
    finally:
        torch.cuda.set_sync_debug_mode("default")
    eager = [t.clone() for t in eager]
    want_cache, want_ssd = cache.clone(), ssd_state.clone()
    # the cached direct launch computes what the JIT launch computed
    assert torch.equal(first[0], eager[0]) and torch.equal(first[1], eager[1]) and torch.equal(first_cache, want_cache)
    cache.copy_(c0)
    ssd_state.copy_(s0)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            captured = step()
    torch.cuda.current_stream().wait_stream(side)
    cache.copy_(c0)
    ssd_state.copy_(s0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])
    assert torch.equal(cache, want_cache) and torch.equal(ssd_state, want_ssd)
    assert R.DIRECT_LAUNCH_ERROR is None
    from recurscan.runtime import launcher
    assert launcher.DRIVER_ERROR is None  # no direct launch fell back to Triton's launcher
    from recurscan.ops import decode as D, mamba_decode as MD
    # the cached direct launch path ran for both ops
    assert any(p.launches is not None and p.launches.direct is not None and p.launches.direct.driver is not None
               for p in D.PREPARED.values())
    assert any(p.launches is not None and p.launches.direct is not None for p in MD.PREPARED.values())
