"""The fused prefill (kernels/gluon/delta_fused.py) on the GPU, under the Gluon rules
(docs/kernels-gluon.md): within the float64 oracle's tolerance where its twin (the planned prep
and sweep, the shape's ``fused`` off) is, dense and varlen, with partial last chunks, empty and
one-token sequences, GVA, an initial state and fp16; the token loop for the pairs it flags
(non-finite input, a step that is no contraction), every other pair's bits untouched; and the
planner's choice. Run: ``python -m pytest -m gpu tests/gpu/test_fused_prefill_gpu.py``."""
import pytest
import torch

import recurscan
from recurscan.descriptors import build_chunk_descriptors
from recurscan.kernels.gluon.delta_fused import gluon_fused_prefill_kernel
from recurscan.launch import delta as launch_delta
from recurscan.launch.delta import DeltaInputs, run_delta_launches
from recurscan.reference.delta import gated_delta_rule_chunked

from tests.helpers.launches import delta_launches
from tests.helpers.tolerances import bits, relative_rms

pytestmark = pytest.mark.gpu

DEV = "cuda"
#: The planner's row for many pairs (the fused shape's fallback and the twin here).
ROW = dict(block_v=128, num_warps=8, num_stages=3, v_product=True, tma_store=True)


@pytest.fixture(autouse=True)
def poisoned_buffers(gluon_only, monkeypatch):
    """Where Gluon may run (conftest's gluon_only), every buffer the op allocates starts as NaN."""
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)


def inputs(B, T, H, HV, dtype=torch.bfloat16, seed=0, h0=False):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=gen, device=DEV)  # noqa: E731
    q, k, v = rn(B, T, H, 128), rn(B, T, H, 128), rn(B, T, HV, 128)
    g = torch.nn.functional.logsigmoid(rn(B, T, HV) + 3.0)
    beta = torch.sigmoid(rn(B, T, HV))
    x = [t.to(dtype) for t in (q, k, v)] + [g, beta.to(dtype)]
    return x, (rn(B, HV, 128, 128) * 0.1 if h0 else None)


def run(x, h0, fused, cu_seqlens=None):
    """(o, final) of the launches with the shape's ``fused`` on or off, and whether the fused kernel ran."""
    q, k, v, g, beta = x
    ci = build_chunk_descriptors(cu_seqlens.cpu(), device=DEV).chunk_indices if cu_seqlens is not None else None
    launches = delta_launches(q, k, v, g, beta, fused=fused, **ROW, scale=0.1, initial_state=h0,
                              output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens,
                              chunk_indices_dp=ci)
    ran = any(s.kernel is gluon_fused_prefill_kernel for s in launches.steps)
    outs = [run_delta_launches(launches, DeltaInputs(q, k, v, g, beta, h0, None, None, cu_seqlens, ci))
            for _ in range(2)]  # the JIT launch, then the direct launches
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(outs[0], outs[1]))
    return outs[1], ran


def oracle(x, h0, cu_seqlens=None):
    q, k, v, g, beta = (t.double() for t in x)
    return gated_delta_rule_chunked(q, k, v, g, beta, scale=0.1, initial_state=None if h0 is None else h0.double(),
                                    use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens)


CASES = {
    "dense, whole chunks": dict(B=2, T=1024, H=4, HV=8),
    "dense, a partial last chunk, initial state": dict(B=3, T=1000, H=4, HV=8, h0=True),
    "GVA 16 value heads a q/k head, fp16": dict(B=2, T=700, H=2, HV=32, dtype=torch.float16),
    "real size, B4 T8192 H16 HV64": dict(B=4, T=8192, H=16, HV=64),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_prefill_is_within_the_oracle_tolerance_of_its_twin(case):
    x, h0 = inputs(**CASES[case])
    (o_f, s_f), ran = run(x, h0, True)
    (o_t, s_t), twin_ran = run(x, h0, False)
    assert ran and not twin_ran
    o_w, s_w = oracle(x, h0)
    for got, twin, want, what in ((o_f, o_t, o_w, "o"), (s_f, s_t, s_w, "final state")):
        assert bool(torch.isfinite(got).all()), what
        err, twin_err = relative_rms(got, want), relative_rms(twin, want)
        assert err <= 1.25 * twin_err + 1e-4, f"{what}: {err:.3e} against the twin's {twin_err:.3e}"


@pytest.mark.parametrize("case", list(CASES))
def test_the_prep_inverting_its_own_diagonal_blocks_keeps_the_oracle_tolerance(case, monkeypatch):
    """plan.delta.FUSED_DIAGONAL_FROM_PASS off: the prep inverts the WY matrix's diagonal blocks
    itself (the pass writes none): its outputs and final state within the float64 oracle's tolerance
    of the twin's, as the planned form's are."""
    from recurscan.plan import delta as plan_delta
    monkeypatch.setattr(plan_delta, "FUSED_DIAGONAL_FROM_PASS", False)
    test_fused_prefill_is_within_the_oracle_tolerance_of_its_twin(case)


def test_the_prep_inverting_its_own_diagonal_blocks_keeps_varlen_right(monkeypatch):
    """The same, varlen with empty and one-token sequences."""
    from recurscan.plan import delta as plan_delta
    monkeypatch.setattr(plan_delta, "FUSED_DIAGONAL_FROM_PASS", False)
    test_fused_prefill_varlen_with_empty_and_one_token_sequences()


@pytest.mark.unproven  # plan.delta.FUSED_PIPELINED is off (not yet measured); not yet run on a GPU
@pytest.mark.parametrize("case", list(CASES))
def test_the_pipelined_form_keeps_the_oracle_tolerance(case, monkeypatch):
    """plan.delta.FUSED_PIPELINED on: the chains at 184 registers a thread and the prep at 120 in its
    PIPELINED form (one [64, 64] product at a time), where ptxas pipelines the kernel's wgmmas: its
    outputs and final state within the float64 oracle's tolerance of the twin's, as the planned
    form's are; varlen with empty and one-token sequences, and serving a cache, too."""
    from recurscan.plan import delta as plan_delta
    monkeypatch.setattr(plan_delta, "FUSED_PIPELINED", True)
    test_fused_prefill_is_within_the_oracle_tolerance_of_its_twin(case)
    if case == "dense, whole chunks":
        test_fused_prefill_varlen_with_empty_and_one_token_sequences()
        test_fused_prefill_serves_a_state_cache(torch.bfloat16, "vk")


def test_fused_prefill_varlen_with_empty_and_one_token_sequences():
    lengths = [0, 1, 63, 64, 65, 700, 0, 129, 1000]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device=DEV, dtype=torch.int32)
    x, _ = inputs(1, int(cu[-1]), 2, 4)
    h0 = torch.randn(len(lengths), 4, 128, 128, device=DEV) * 0.1
    (o_f, s_f), ran = run(x, h0, True, cu)
    (o_t, s_t), _ = run(x, h0, False, cu)
    assert ran
    o_w, s_w = oracle(x, h0, cu)
    assert relative_rms(o_f, o_w) <= 1.25 * relative_rms(o_t, o_w) + 1e-4
    assert relative_rms(s_f, s_w) <= 1.25 * relative_rms(s_t, s_w) + 1e-4
    assert torch.equal(s_f[0], h0[0]) and torch.equal(s_f[6], h0[6])  # empty sequences keep their state


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_fused_prefill_serves_a_state_cache(state_dtype, layout):
    """Varlen requests read and write their cache slots in place (the cache bf16 or float32, in
    either layout): within the oracle's tolerance where the twin is; a padding request (slot -1)
    gets zero outputs and touches no slot; slots not named keep their bits; a NaN key in one
    request leaves its slot to the token loop (non-finite, as the twin's)."""
    lengths = [300, 0, 64, 129, 700]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device=DEV, dtype=torch.int32)
    x, _ = inputs(1, int(cu[-1]), 2, 32)
    q, k, v, g, beta = x
    k[0, 100, 1, 3] = float("nan")  # request 0, q/k head 1: value heads 16..31
    slots = torch.tensor([6, 2, -1, 0, 4], device=DEV, dtype=torch.int32)
    full = torch.randn(8, 32, 128, 128, device=DEV, generator=torch.Generator(device=DEV).manual_seed(5)) * 0.1
    cache0 = full.to(state_dtype)
    if layout == "vk":  # [S, HV, V, K] storage seen as [S, HV, K, V] (vLLM's, SGLang's, FlashInfer's)
        cache0 = cache0.transpose(-1, -2).contiguous().transpose(-1, -2)
    ci = build_chunk_descriptors(cu.cpu(), device=DEV).chunk_indices
    got = {}
    for fused in (True, False):
        launches = delta_launches(q, k, v, g, beta, fused=fused, **ROW, scale=0.1, use_qk_l2norm_in_kernel=True,
                                  cu_seqlens=cu, chunk_indices_dp=ci, state=cache0, state_indices=slots)
        assert any(s.kernel is gluon_fused_prefill_kernel for s in launches.steps) == fused
        cache = cache0.clone()
        o, _ = run_delta_launches(launches, DeltaInputs(q, k, v, g, beta, None, cache, slots, cu, ci))
        got[fused] = o, cache
    (o_f, c_f), (o_t, c_t) = got[True], got[False]
    live = [n for n in range(len(lengths)) if slots[n] >= 0]
    h0 = torch.stack([cache0[int(slots[n])].float() if slots[n] >= 0 else torch.zeros(32, 128, 128, device=DEV)
                      for n in range(len(lengths))])
    o_w, s_w = oracle(x, h0, cu)
    bounds = cu.tolist()
    assert bool((o_f[0, bounds[2]:bounds[3]] == 0).all())  # the padding request
    for slot in (1, 3, 5, 7):  # slots no request names
        assert torch.equal(bits(c_f[slot]), bits(cache0[slot]))
    for n in live:
        rows, s = slice(bounds[n], bounds[n + 1]), int(slots[n])
        heads = slice(0, 16) if n == 0 else slice(0, 32)  # request 0's heads 16..31 see the NaN key
        if lengths[n] == 0:  # an empty request keeps its slot's bits
            assert torch.equal(bits(c_f[s]), bits(cache0[s])), n
            continue
        err = relative_rms(o_f[0, rows, heads], o_w[0, rows, heads])
        assert err <= 1.25 * relative_rms(o_t[0, rows, heads], o_w[0, rows, heads]) + 1e-4, (n, err)
        err = relative_rms(c_f[s, heads].float(), s_w[n, heads])
        assert err <= 1.25 * relative_rms(c_t[s, heads].float(), s_w[n, heads]) + 1e-4, (n, err)
    assert not bool(torch.isfinite(c_f[6, 16:].float()).all()) and bool(torch.isfinite(c_f[6, :16].float()).all())
    assert bool(torch.isfinite(o_f[0, :100, 16:]).all()) and not bool(torch.isfinite(o_f[0, 100, 16:]).all())


def test_fused_prefill_writes_through_out_views():
    """As the traced scan's packed result (ops/scan.py) takes them: o written through a view whose
    token rows are strided past its heads, the final state into a view of a larger buffer; the same
    bits as into the launch's own buffers."""
    x, h0 = inputs(2, 700, 4, 64, h0=True)
    q, k, v, g, beta = x
    o_view = torch.full((2, 700, 65, 128), float("nan"), device=DEV, dtype=torch.bfloat16)[:, :, :64]
    final_view = torch.full((3, 64, 128, 128), float("nan"), device=DEV)[1:]
    views = delta_launches(q, k, v, g, beta, fused=True, **ROW, scale=0.1, initial_state=h0, output_final_state=True,
                           use_qk_l2norm_in_kernel=True, out_views=(o_view, final_view))
    assert any(s.kernel is gluon_fused_prefill_kernel for s in views.steps)
    run_delta_launches(views, DeltaInputs(q, k, v, g, beta, h0), given={"o": o_view, "final": final_view})
    (o, s_), _ = run(x, h0, True)
    assert torch.equal(bits(o_view), bits(o)) and torch.equal(bits(final_view), bits(s_))


def test_flagged_pairs_run_the_token_loop_and_leave_the_others_bits():
    """A NaN key in sequence 1 (q/k head 2: value heads 8..11), and beta < 0 for value head 5 of
    sequence 2 (no contraction): those pairs come from the token loop, every other pair's outputs
    and states keep the clean run's bits."""
    x, h0 = inputs(4, 700, 4, 16, h0=True)
    (o_c, s_c), _ = run(x, h0, True)
    q, k, v, g, beta = (t.clone() for t in x)
    k[1, 300, 2, 7] = float("nan")
    beta[2, :, 5] = -0.3
    (o_f, s_f), ran = run([q, k, v, g, beta], h0, True)
    assert ran
    touched = torch.zeros(4, 16, dtype=torch.bool)
    touched[1, 8:12] = True
    touched[2, 5] = True
    for n in range(4):
        for hv in range(16):
            if not touched[n, hv]:
                assert torch.equal(bits(o_f[n, :, hv]), bits(o_c[n, :, hv])), (n, hv)
                assert torch.equal(bits(s_f[n, hv]), bits(s_c[n, hv])), (n, hv)
    # The NaN key: outputs before it finite and right, from it on non-finite, as the token loop's.
    before = o_f[1, :300, 8:12]
    assert bool(torch.isfinite(before).all())
    assert relative_rms(before, o_c[1, :300, 8:12]) < 1e-2
    assert not bool(torch.isfinite(o_f[1, 300, 8:12]).all()) and not bool(torch.isfinite(s_f[1, 8:12]).all())
    # beta < 0: finite, and the oracle's within the twin's tolerance
    (o_t, s_t), _ = run([q, k, v, g, beta], h0, False)
    o_w, s_w = oracle([q, k, v, g, beta], h0)
    assert bool(torch.isfinite(o_f[2, :, 5]).all())
    assert relative_rms(o_f[2, :, 5], o_w[2, :, 5]) <= 1.25 * relative_rms(o_t[2, :, 5], o_w[2, :, 5]) + 1e-4
    assert relative_rms(s_f[2, 5], s_w[2, 5]) <= 1.25 * relative_rms(s_t[2, 5], s_w[2, 5]) + 1e-4


def test_the_planner_takes_the_fused_prefill_where_pairs_fill_the_sms():
    from recurscan.plan.delta import FUSED_MIN_PAIRS_PER_SM, delta_shape
    from recurscan.plan.device import sm_count
    from recurscan.problem import delta_problem
    sms = sm_count(torch.device(DEV))
    for B, HV, want in ((4, 64, 4 * 64 >= FUSED_MIN_PAIRS_PER_SM * sms), (4, 16, False)):
        x, _ = inputs(B, 128, 16, HV)
        assert delta_shape(delta_problem(*x), torch.device(DEV)).fused == want, (B, HV)
    x, _ = inputs(4, 2048, 16, 64)
    o, s = recurscan.chunk_gated_delta_rule(*x, use_qk_l2norm_in_kernel=True, output_final_state=True)
    o_t, s_t = recurscan.chunk_gated_delta_rule(*x, use_qk_l2norm_in_kernel=True, output_final_state=True,
                                                backend="triton")
    assert relative_rms(o, o_t) < 5e-3 and relative_rms(s, s_t) < 5e-3
