"""The scalar-decay GLA forward kernel (kernels/gla/forward.py, through ``chunk_simple_gla(...,
backend="triton")``) under the interpreter: outputs and final states against the float64 token
loop, bounded by what the float32 chunked oracle gets, over the hostile cases; causality under
non-finite input; strided and 16-bit inputs; what the Triton path refuses."""
import dataclasses

import pytest
import torch

import recurscan
from recurscan.reference.gla import gla_chunked, gla_naive
from tests.helpers.gla_forms import (PER_KEY_FORMS, assert_the_backward_read_the_kept_states, use_form, use_grads_form,
                                     use_per_key_form)
from tests.helpers.tolerances import assert_like_fp32, relative_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"



@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every buffer the op allocates starts as NaN: an element the kernel does not write shows."""
    import recurscan.launch.delta as launch_delta
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)

CASES = {
    "T 1": dict(B=2, T=1, H=1, HV=1, cu=None),
    "T 63, GVA": dict(B=2, T=63, H=1, HV=2, cu=None),
    "T 64": dict(B=1, T=64, H=2, HV=2, cu=None),
    "T 65, V 40": dict(B=1, T=65, H=1, HV=1, cu=None, V=40),
    "T 300, GVA 4": dict(B=1, T=300, H=1, HV=4, cu=None),
    "varlen, one-token sequences": dict(B=1, T=200, H=2, HV=4, cu=[0, 1, 2, 66, 67, 200]),
    "K 24 (not a power of two), varlen": dict(B=1, T=150, H=1, HV=2, cu=[0, 90, 150], K=24),
}


def gla_inputs(B, T, H, HV, K, V, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    k = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    v = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, generator=gen, dtype=torch.float64) + 2)
    if T > 3:
        g[:, T // 2, 0] = float("-inf")  # decay exactly 0: a reset mid-sequence
        g[:, 1] = 0.0  # decay exactly 1
    return q, k, v, g


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("optional", ["all", "no_g_no_h0"])
@pytest.mark.parametrize("form", ["sweep", "fused", "split", "sweep segments", "sweep phases", "sweep, group prep",
                                  "sweep segments, group prep", "sweep phases, group prep", "sweep, calm gates",
                                  "sweep segments, calm gates", "sweep phases, calm gates",
                                  "sweep, scores in the sweep", "sweep segments, scores in the sweep"])
def test_triton_forward_matches_the_token_loop(case, optional, form, monkeypatch):
    use_form(form, monkeypatch)
    c = CASES[case]
    K, V = c.get("K", 16), c.get("V", 16)
    q, k, v, g = gla_inputs(c["B"], c["T"], c["H"], c["HV"], K, V, seed=len(case))
    cu = None if c["cu"] is None else torch.tensor(c["cu"])
    N = c["B"] if cu is None else len(c["cu"]) - 1
    h0 = torch.randn(N, c["HV"], K, V, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    if optional == "no_g_no_h0":
        g = h0 = None
    for what, a, b, r in zip(("o", "final state"), *forward_and_references(q, k, v, g, h0, cu)):
        assert_like_fp32(a.cpu(), b, r, what)


def forward_and_references(q, k, v, g, h0, cu):
    """``(got, want, ref32)``: chunk_simple_gla's ``(o, final state)`` on the Triton path (float32
    inputs, scale 0.3), the float64 token loop's and the float32 chunked reference's (g None: decay 1)."""
    g_ref = torch.zeros(v.shape[:3], dtype=torch.float64) if g is None else g
    args = dict(scale=0.3, initial_state=h0, cu_seqlens=cu)
    want = gla_naive(q, k, v, g_ref, **args)
    f32 = lambda x: None if x is None else x.float()  # noqa: E731
    ref32 = gla_chunked(*map(f32, (q, k, v, g_ref)), **dict(args, initial_state=f32(h0)))
    dev = lambda x: None if x is None else x.float().to(DEVICE)  # noqa: E731
    got = recurscan.chunk_simple_gla(*map(dev, (q, k, v, g)), scale=0.3, initial_state=dev(h0),
                                     output_final_state=True, cu_seqlens=None if cu is None else cu.to(DEVICE),
                                     backend="triton")
    return got, want, ref32


@pytest.mark.parametrize("cu", [None, [0, 1, 70, 130]])
def test_the_coef_alone_in_blocks_across_query_key_heads(cu, monkeypatch):
    """Where the sweep forms the scores, the group prep writes the gates alone, so its programs take
    blocks of up to 16 value heads across query/key heads (launch.delta._group_prep_blocks): 3
    query/key heads of 6 value heads each in blocks of 16, the second block 2 heads and 14 masked,
    a NaN decay in a head of the second block, resets; outputs and final states against the token
    loop, and two prep programs a chunk."""
    from recurscan.runtime.cache import clear_caches
    use_form("sweep, scores in the sweep", monkeypatch)
    clear_caches()  # the launches read below are this test's alone
    q, k, v, g = gla_inputs(1, 130, 3, 18, 16, 16, seed=5)
    g[0, 40, 17] = float("nan")
    cu_t = None if cu is None else torch.tensor(cu)
    h0 = torch.randn(1 if cu is None else len(cu) - 1, 18, 16, 16, dtype=torch.float64,
                     generator=torch.Generator().manual_seed(6))
    for what, a, b, r in zip(("o", "final state"), *forward_and_references(q, k, v, g, h0, cu_t)):
        finite = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a.cpu()), finite), what
        assert_like_fp32(torch.where(finite, a.cpu(), 0), torch.where(finite, b, 0), torch.where(finite, r, 0), what)
    from recurscan.kernels.gla.group_prep import chunk_group_prep_kernel
    from recurscan.launch import gla as launch_gla
    preps = [s for launches in launch_gla.GLA_SWEEP_LAUNCHES.values() for s in launches.steps
             if s.kernel is chunk_group_prep_kernel and not s.kwargs["SCORES"]]
    assert preps and all(s.kwargs["HB"] == 16 and s.grid[0] % 2 == 0 for s in preps), [(s.grid, s.kwargs["HB"])
                                                                                          for s in preps]
    if cu is None:  # 3 chunks of 2 blocks
        assert {s.grid for s in preps} == {(6,)}


@pytest.mark.parametrize("form", ["sweep, group prep", "sweep, scores in the sweep"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_key_poisons_its_row_on_and_the_state_alone(form, value, monkeypatch):
    """A key with one non-finite entry (mid-chunk): the outputs before it bit-identical, every
    output of its head from its row on non-finite, the other sequence untouched. Head 0 resets
    five rows later (gla_inputs' decay 0 at row 100): the token loop's state stays NaN through it
    (0 x NaN). On the group prep's scores the prep marks the key's row bad, which poisons the
    head's whole state; where the sweep forms the scores itself the key reaches the products as in
    the token loop (kept past the reset in its chunk: without that, rows 100-127 would be finite),
    and the state's non-finite entries are the PyTorch path's: the key's row alone."""
    use_form(form, monkeypatch)
    q, k, v, g = (x.float().to(DEVICE) for x in gla_inputs(1, 200, 1, 2, 16, 16, seed=12))
    cu = torch.tensor([0, 130, 200], device=DEVICE)
    clean = recurscan.chunk_simple_gla(q, k, v, g, output_final_state=True, cu_seqlens=cu, backend="triton")
    bad = k.clone()
    bad[0, 95, 0, 3] = value
    o, S = recurscan.chunk_simple_gla(q, bad, v, g, output_final_state=True, cu_seqlens=cu, backend="triton")
    assert torch.equal(o[:, :95], clean[0][:, :95]), "an output before the bad key changed"
    assert not torch.isfinite(o[0, 95:130]).any()
    if form == "sweep, scores in the sweep":
        want_o, want_S = recurscan.chunk_simple_gla(q, bad, v, g, output_final_state=True, cu_seqlens=cu,
                                                    backend="torch")
        assert torch.equal(torch.isfinite(S), torch.isfinite(want_S)) and not torch.isfinite(S[0]).all()
        assert torch.equal(torch.isfinite(o), torch.isfinite(want_o))
    else:
        assert not torch.isfinite(S[0]).any()
    assert torch.equal(o[:, 130:], clean[0][:, 130:]) and torch.equal(S[1], clean[1][1])


@pytest.mark.parametrize("name, form", [(n, "sweep") for n in "qkvg"] + [(n, "fused") for n in "qkvg"] +
                         [("q", "split"), ("g", "split"), ("v", "sweep segments")] +
                         [(n, "sweep, group prep") for n in "qkvg"] + [(n, "sweep, calm gates") for n in "qkvg"] +
                         [(n, "sweep, scores in the sweep") for n in "qkvg"])
def test_a_non_finite_input_leaves_earlier_outputs_and_other_sequences_bit_identical(name, form, monkeypatch):
    use_form(form, monkeypatch)
    q, k, v, g = (x.float().to(DEVICE) for x in gla_inputs(1, 200, 1, 2, 16, 16, seed=11))
    cu = torch.tensor([0, 130, 200], device=DEVICE)
    clean = recurscan.chunk_simple_gla(q, k, v, g, output_final_state=True, cu_seqlens=cu, backend="triton")
    x = dict(q=q, k=k, v=v, g=g)
    bad = x[name].clone()
    bad[0, 95, 0] = float("nan")  # in the first sequence, mid-chunk (rows 64-127)
    x[name] = bad
    o, S = recurscan.chunk_simple_gla(*x.values(), output_final_state=True, cu_seqlens=cu, backend="triton")
    assert torch.equal(o[:, :95], clean[0][:, :95]), "an output before the NaN changed"
    assert torch.equal(o[:, 130:], clean[0][:, 130:]) and torch.equal(S[1], clean[1][1]), "the other sequence changed"
    if name == "q":  # as the token loop: a query enters its own output alone, and no state
        assert torch.isnan(o[0, 95]).all()  # both value heads read the one q/k head
        assert torch.equal(o[:, 96:130], clean[0][:, 96:130]) and torch.equal(S[0], clean[1][0])
        want_o, want_S = recurscan.chunk_simple_gla(*x.values(), output_final_state=True, cu_seqlens=cu,
                                                    backend="torch")
        assert torch.equal(torch.isnan(o), torch.isnan(want_o)) and torch.isfinite(want_S).all()
    else:
        assert torch.isnan(o[0, 95, 0]).any() and torch.isnan(S[0, 0]).any(), "the NaN vanished"


@pytest.mark.parametrize("form", ["sweep", "sweep, scores in the sweep"])
def test_strided_and_16_bit_inputs(form, monkeypatch):
    use_form(form, monkeypatch)
    q, k, v, g = gla_inputs(1, 130, 2, 2, 16, 16, seed=5)
    want = gla_naive(q, k, v, g)[0]
    strided = lambda x: x.transpose(-1, -2).contiguous().transpose(-1, -2) if x.dim() == 4 else \
        torch.stack([x, x], -1)[..., 0]  # noqa: E731
    dev = lambda x: strided(x.float()).to(DEVICE)  # noqa: E731
    a = recurscan.chunk_simple_gla(*map(dev, (q, k, v, g)), backend="triton")[0]
    b = recurscan.chunk_simple_gla(*(x.float().to(DEVICE) for x in (q, k, v, g)), backend="triton")[0]
    assert torch.equal(a, b)
    for dtype in (torch.bfloat16, torch.float16):
        low = recurscan.chunk_simple_gla(*(x.to(DEVICE, dtype) for x in (q, k, v)), g.float().to(DEVICE),
                                         backend="triton")[0]
        assert low.dtype == dtype and relative_rms(low.double().cpu(), want) < 1e-2


def test_what_the_triton_path_refuses():
    q, k, v, g = gla_inputs(1, 10, 1, 1, 16, 16, seed=1)
    with pytest.raises(ValueError, match="float64"):
        recurscan.chunk_gla(q, k, v, g[..., None].expand(-1, -1, -1, 16), backend="triton")
    wide = torch.zeros(1, 10, 1, 300)
    with pytest.raises(ValueError, match="K = 300 > 256"):
        recurscan.chunk_simple_gla(wide, wide, v.float(), g.float(), backend="triton")


GRAD_CASES = {
    "dense, GVA, T 130": dict(B=2, T=130, H=1, HV=2, cu=None, V=24),
    "varlen, one-token sequences": dict(B=1, T=200, H=2, HV=4, cu=[0, 1, 2, 66, 67, 200], V=16),
    "T 1": dict(B=1, T=1, H=1, HV=1, cu=None, V=16),
    "T 63": dict(B=1, T=63, H=1, HV=1, cu=None, V=16),
}


@pytest.mark.parametrize("case", list(GRAD_CASES))
@pytest.mark.parametrize("optional", ["all", "no_g_no_h0"])
# The backward's chunk states: by the GLA kernel, or the sweep (its prep the delta prep, or the group prep;
# the forward forming its scores in the sweep, whose backward recomputes on the delta prep).
@pytest.mark.parametrize("recompute", ["fused", "sweep", "sweep, group prep", "sweep, scores in the sweep"])
def test_triton_gradients_match_autograd_through_the_token_loop(case, optional, recompute, monkeypatch):
    """Every gradient (q, k, v, g, the initial state; a gradient into the final state too) of the
    Triton path (kernels/gla/backward.py) against autograd through the float64 token loop,
    bounded by the float32 band."""
    use_grads_form("per head", monkeypatch)
    check_gradients(GRAD_CASES[case], case, optional, recompute, monkeypatch)


@pytest.mark.parametrize("case", ["dense, GVA, T 130", "varlen, one-token sequences"])
@pytest.mark.parametrize("recompute", ["sweep", "sweep, group prep"])
def test_gradients_with_the_reverse_sweep_on_16_columns(case, recompute, monkeypatch):
    """The reverse sweep on 16 value columns a program (plan.gla.REVERSE_SWEEP; V 24 in two
    blocks, the second masked): every gradient as above."""
    from recurscan.plan import gla as plan_gla
    use_grads_form("per head", monkeypatch)
    monkeypatch.setattr(plan_gla, "REVERSE_SWEEP", (16, 4))
    check_gradients(GRAD_CASES[case], case, "all", recompute, monkeypatch)


GROUP_GRAD_CASES = {
    "dense, T 130, a group of 4, V 24": dict(B=2, T=130, H=1, HV=4, cu=None, V=24),
    "varlen, one-token sequences, 2 groups of 4, K 24": dict(B=1, T=200, H=2, HV=8, cu=[0, 1, 2, 66, 67, 200],
                                                            V=16, K=24),
}


@pytest.mark.parametrize("case", list(GROUP_GRAD_CASES))
@pytest.mark.parametrize("optional", ["all", "no_g_no_h0"])
@pytest.mark.parametrize("grads", ["group", "group, dg with dq and dk", "group in shares", "group, dq and dk apart"])
def test_gradients_with_a_groups_value_heads_summed_in_one_program(case, optional, grads, monkeypatch):
    """The parallel stage summing a query/key head's value heads in its programs (HEADS > 1), in
    each form of tests/helpers/gla_forms.py's use_grads_form (dg apart or not, the group in one
    program or two shares, dq and dk apart): every gradient as above."""
    use_grads_form(grads, monkeypatch)
    check_gradients(GROUP_GRAD_CASES[case], case, optional, "sweep, group prep", monkeypatch)


@pytest.mark.parametrize("case", list(GROUP_GRAD_CASES))
def test_gradients_with_the_recompute_beside_the_reverse_sweep(case, monkeypatch):
    """plan.gla.GLA_BACKWARD_CORUN: the recompute's group prep first, then the reverse sweep and the
    recompute's sweep (on a side stream on the GPU; here in that order on one), then the parallel
    stage: every gradient as above, and the backward was built to run so. The buffers are
    poisoned (NaN) when allocated, so the reverse sweep, which runs before the recompute's sweep
    writes the chunk states, reads none of them. (A recompute at all: the forward keeps no chunk
    states, plan.gla.GLA_FORWARD_STATES off.)"""
    from recurscan.launch import delta as launch_delta
    from recurscan.launch import gla as launch_gla
    from recurscan.plan import gla as plan_gla
    from recurscan.runtime.cache import clear_caches
    monkeypatch.setattr(plan_gla, "GLA_BACKWARD_CORUN", 1e9)
    monkeypatch.setattr(plan_gla, "GLA_FORWARD_STATES", False)
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)
    clear_caches()
    check_gradients(GROUP_GRAD_CASES[case], case, "all", "sweep, group prep", monkeypatch)
    built = list(launch_gla.GLA_BACKWARD_LAUNCHES.values())
    assert built and all(b.corun for b in built)


@pytest.mark.parametrize("case", ["dense, GVA, T 130", "varlen, one-token sequences", "T 1"])
@pytest.mark.parametrize("recompute", ["sweep", "sweep, group prep", "sweep, scores in the sweep", "sweep segments",
                                       "sweep phases"])
def test_gradients_from_the_chunk_states_the_forward_kept(case, recompute, monkeypatch):
    """plan.gla.GLA_FORWARD_STATES: the training forward keeps the state entering every chunk (in
    q's dtype, not filled: buffers are poisoned with NaN when allocated, so a row the forward left
    unwritten would reach the gradients), and the backward reads them in place of its recompute's
    sweep: every gradient as above; the recompute keeps its group prep alone where the reverse
    sweep reads its scores and gates, else nothing runs of it."""
    from recurscan.launch import delta as launch_delta
    from recurscan.plan import gla as plan_gla
    from recurscan.runtime.cache import clear_caches
    monkeypatch.setattr(plan_gla, "GLA_FORWARD_STATES", True)
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)
    clear_caches()
    check_gradients(GRAD_CASES[case], case, "all", recompute, monkeypatch)
    assert_the_backward_read_the_kept_states(group_prep=recompute == "sweep, group prep")


def check_gradients(c, case, optional, recompute, monkeypatch):
    from recurscan.plan import gla as plan_gla
    monkeypatch.setattr(plan_gla, "GLA_LAUNCH", dataclasses.replace(plan_gla.GLA_LAUNCH,
                                                                    recompute_on_sweep=recompute != "fused"))
    if recompute != "sweep" and recompute != "fused":  # a form of tests/helpers/gla_forms.py
        use_form(recompute, monkeypatch)
    q, k, v, g = gla_inputs(c["B"], c["T"], c["H"], c["HV"], c.get("K", 16), c["V"], seed=len(case))
    cu = None if c["cu"] is None else torch.tensor(c["cu"])
    N = c["B"] if cu is None else len(c["cu"]) - 1
    h0 = torch.randn(N, c["HV"], c.get("K", 16), c["V"], dtype=torch.float64,
                     generator=torch.Generator().manual_seed(3))
    if optional == "no_g_no_h0":
        g = h0 = None
    names = [n for n, t in zip(("q", "k", "v", "g", "h0"), (q, k, v, g, h0)) if t is not None]
    ref = [t.clone().requires_grad_() for t in (q, k, v, g, h0) if t is not None]
    full = dict(zip(names, ref))
    g_ref = full.get("g", torch.zeros(v.shape[:3], dtype=torch.float64))
    o, S = gla_naive(full["q"], full["k"], full["v"], g_ref, scale=0.3, initial_state=full.get("h0"), cu_seqlens=cu)
    gen = torch.Generator().manual_seed(5)
    do, dht = torch.randn(o.shape, generator=gen, dtype=torch.float64), torch.randn(S.shape, generator=gen,
                                                                                    dtype=torch.float64)
    want = torch.autograd.grad((o, S), ref, (do, dht))
    mine = [t.float().to(DEVICE).requires_grad_() for t in ref]
    args = dict(zip(names, mine))
    o2, S2 = recurscan.chunk_simple_gla(args["q"], args["k"], args["v"], args.get("g"), scale=0.3,
                                        initial_state=args.get("h0"), output_final_state=True,
                                        cu_seqlens=None if cu is None else cu.to(DEVICE), backend="triton")
    got = torch.autograd.grad((o2, S2), mine, (do.float().to(DEVICE), dht.float().to(DEVICE)))
    for name, a, b in zip(names, got, want):
        assert torch.isfinite(a).all(), name
        assert relative_rms(a.double().cpu(), b) < 2e-5, f"{name}: {relative_rms(a.double().cpu(), b):.2e}"


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_g_gamma_is_a_constant_decay_per_head(backend):
    """fla's ``g_gamma`` (RetNet's fixed decays): the same as g holding it at every token, and
    added to a g given with it."""
    q, k, v, g = (x.float().to(DEVICE) for x in gla_inputs(1, 100, 1, 2, 16, 16, seed=2))
    gamma = torch.tensor([-0.1, -0.5], device=DEVICE)
    a = recurscan.chunk_simple_gla(q, k, v, g_gamma=gamma, output_final_state=True, backend=backend)
    b = recurscan.chunk_simple_gla(q, k, v, gamma.expand(1, 100, 2).contiguous(), output_final_state=True,
                                   backend=backend)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = recurscan.chunk_simple_gla(q, k, v, g, g_gamma=gamma, backend=backend)[0]
    d = recurscan.chunk_simple_gla(q, k, v, g + gamma, backend=backend)[0]
    assert torch.equal(c, d)
    with pytest.raises(ValueError, match="g_gamma"):
        recurscan.chunk_simple_gla(q, k, v, g_gamma=torch.zeros(3, device=DEVICE), backend=backend)


@pytest.mark.parametrize("cu", [None, [0, 1, 70, 130]])
@pytest.mark.parametrize("form", ["sweep", "fused", "split"])
def test_state_cache_on_both_backends(cu, form, monkeypatch):
    """chunk_simple_gla's state cache: slots read and written in place, a padding sequence (slot -1)
    with zero outputs and its slot untouched, the other slots untouched; the Triton path equals the
    PyTorch one, which equals the initial / final-state call."""
    use_form(form, monkeypatch)
    B = 3 if cu is None else 1
    q, k, v, g = (x.float().to(DEVICE) for x in gla_inputs(B, 130, 1, 2, 16, 16, seed=14))
    n = B if cu is None else len(cu) - 1
    cache = torch.randn(5, 2, 16, 16, generator=torch.Generator().manual_seed(15)).to(DEVICE)
    slots = torch.tensor([3, -1, 0], dtype=torch.int32, device=DEVICE)[:n]
    cu_t = None if cu is None else torch.tensor(cu, device=DEVICE)
    got = {}
    for backend in ("torch", "triton"):
        mine = cache.clone()
        o, S = recurscan.chunk_simple_gla(q, k, v, g, cu_seqlens=cu_t, state=mine, state_indices=slots,
                                          backend=backend)
        assert S is mine
        got[backend] = (o, mine)
    assert (got["triton"][0] - got["torch"][0]).abs().max() < 1e-4
    assert (got["triton"][1] - got["torch"][1]).abs().max() < 1e-4
    o, mine = got["torch"]
    h0 = cache[slots.clamp_min(0).long()]
    want_o, want_S = recurscan.chunk_simple_gla(q, k, v, g, initial_state=h0, output_final_state=True,
                                                cu_seqlens=cu_t, backend="torch")
    live = (slots >= 0).tolist()
    for i, is_live in enumerate(live):
        rows = (i, slice(0, 130)) if cu is None else (0, slice(cu[i], cu[i + 1]))
        assert o[rows].numel() > 0
        if is_live:
            assert torch.allclose(o[rows], want_o[rows], atol=1e-5) and torch.allclose(mine[slots[i]], want_S[i], atol=1e-5)
        else:
            assert (o[rows] == 0).all()
    untouched = [s for s in range(5) if s not in [x for x in slots.tolist() if x >= 0]]
    assert torch.equal(mine[untouched], cache[untouched])


def test_planner_rows_for_the_gla_engine():
    """On CUDA, chunked GLA with a scalar decay or a decay per key dimension, and SSD, take the GLA
    kernels (the rule names the measurements); float64 inputs keep the PyTorch form; CPU tensors take
    the oracle unless asked."""
    from recurscan.plan import RULES, plan
    from recurscan.problem import gla_problem, ssd_problem
    cuda = torch.device("cuda")
    first = lambda family, prob: next(r for r in RULES if r.applies(family, prob, cuda, "chunked"))  # noqa: E731
    q, k, v = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    scalar = gla_problem(q, k, v, torch.full((1, 8, 2), -0.1), per_key_decay=False)
    per_key = gla_problem(q, k, v, torch.full((1, 8, 2, 16), -0.1), per_key_decay=True)
    assert first("gla", scalar).backend == "triton" and "ms" in first("gla", scalar).reason
    assert first("gla", per_key).backend == "triton"
    assert first("gla", gla_problem(q.double(), k.double(), v.double(), torch.full((1, 8, 2), -0.1).double(),
                                    per_key_decay=False)).backend == "torch"
    assert plan("gla", scalar, torch.device("cpu")).backend == "torch"
    x, dt, A, B, C = torch.randn(1, 8, 2, 16), torch.rand(1, 8, 2), -torch.rand(2), torch.randn(1, 8, 1, 16), \
        torch.randn(1, 8, 1, 16)
    assert first("ssd", ssd_problem(x, dt, A, B, C)).backend == "triton"
    assert plan("ssd", ssd_problem(x, dt, A, B, C), torch.device("cpu")).backend == "torch"


def test_the_planner_sums_large_groups_in_the_parallel_stage():
    """plan.gla.grads_heads: a query/key head serving 8 value heads or more (SSD's groups) has them
    summed in the parallel stage's programs, split into the fewest shares that give the measured
    programs an SM; small groups, a decay per key and K or V over 128 keep one value head a program.
    The dg launch takes a divisor of the group."""
    from recurscan.plan import gla as plan_gla
    waves = plan_gla.GROUP_GRADS_WAVES
    assert plan_gla.grads_heads(256, 1, 80, 128, 64, False, 132) == 80 // -(-waves * 132 // 256)
    assert plan_gla.grads_heads(4096, 1, 80, 128, 64, False, 132) == 80  # enough chunks: one share
    assert plan_gla.grads_heads(256, 16, 32, 128, 128, False, 132) == 1  # GVA of 2
    assert plan_gla.grads_heads(256, 1, 80, 128, 64, True, 132) == 1  # a decay per key
    assert plan_gla.grads_heads(256, 1, 80, 256, 64, False, 132) == 1  # K 256
    assert plan_gla.grads_heads(256, 1, 4, 128, 64, False, 132) == 1  # a group of 4
    heads, _ = plan_gla.grads_dg_launch(80)
    assert 80 % heads == 0 and plan_gla.grads_dg_launch(3)[0] in (1, 3)


def test_the_forward_starts_the_backward_compiling(monkeypatch):
    """A signature's first forward under autograd hands the backward's kernels (the forward again
    for the chunk states, the sweep, the parallel stage) to the background compiler; the backward
    finds those launches (none built twice), waits for the compiles, and its gradients are the
    PyTorch form's; the recompute on the fused kernel here (the sweep's: the next test). The
    compiler itself is recorded here: the interpreter compiles nothing."""
    import recurscan.launch.gla as lg
    from recurscan.plan import gla as plan_gla
    monkeypatch.setattr(plan_gla, "GLA_LAUNCH", dataclasses.replace(plan_gla.GLA_LAUNCH, recompute_on_sweep=False))
    handed, waited = [], []
    monkeypatch.setattr(lg, "INTERPRET", False)
    monkeypatch.setattr(lg, "compile_in_background", lambda launches, names, values, device:
                        handed.append((launches, names, values)) or (lambda: waited.append(1)))
    gen = torch.Generator().manual_seed(12)
    x = [torch.randn(1, 77, 2, 16, generator=gen), torch.randn(1, 77, 2, 16, generator=gen),
         torch.randn(1, 77, 2, 24, generator=gen), -torch.rand(1, 77, 2, generator=gen)]
    before = len(lg.GLA_BACKWARD_LAUNCHES)
    mine = [t.clone().requires_grad_() for t in x]
    o, _ = recurscan.chunk_simple_gla(*mine, scale=0.3, backend="triton")
    assert len(handed) == 2 and len(lg.GLA_BACKWARD_LAUNCHES) == before + 1
    built = list(lg.GLA_BACKWARD_LAUNCHES.values())[-1]
    assert [launch[0] for launch in handed[0][0]] == [built.forward.step.kernel]
    assert [launch[0] for launch in handed[1][0]] == [s.kernel for s in built.steps]
    do = torch.randn_like(o)
    got = torch.autograd.grad(o, mine, do)
    assert waited == [1, 1] and built.pending is None and len(lg.GLA_BACKWARD_LAUNCHES) == before + 1
    ref = [t.clone().requires_grad_() for t in x]
    want = torch.autograd.grad(recurscan.chunk_simple_gla(*ref, scale=0.3, backend="torch")[0], ref, do)
    for name, a, b in zip(("dq", "dk", "dv", "dg"), got, want):
        assert relative_rms(a, b) < 1e-4, name


@pytest.mark.parametrize("cu", [None, [0, 1, 70, 200]], ids=["dense", "varlen"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("form", ["sweep", "fused", "split"])
def test_chunk_states_are_the_delta_ops_rows(cu, backend, form, monkeypatch):
    """return_chunk_states: the state entering each 64-token chunk of each sequence, at row
    chunk_offsets[n] + c (dense: n * ceil(T / 64) + c), float32, against the float64 token loop."""
    use_form(form, monkeypatch)
    B = 2 if cu is None else 1
    q, k, v, g = gla_inputs(B, 200, 1, 2, 16, 24, seed=31)
    h0 = torch.randn(B if cu is None else 3, 2, 16, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    cu_t = None if cu is None else torch.tensor(cu)
    want = gla_naive(q, k, v, g, initial_state=h0, cu_seqlens=cu_t, return_chunk_states=True)
    ref32 = gla_chunked(*(t.float() for t in (q, k, v, g)), initial_state=h0.float(), cu_seqlens=cu_t,
                        return_chunk_states=True)
    dev = lambda t: None if t is None else (t.float() if t.is_floating_point() else t).to(DEVICE)  # noqa: E731
    o, S, chunks = recurscan.chunk_simple_gla(*map(dev, (q, k, v, g)), initial_state=dev(h0), output_final_state=True,
                                              cu_seqlens=dev(cu_t), return_chunk_states=True, backend=backend)
    assert chunks.dtype == torch.float32 and chunks.shape == want[2].shape
    for what, a, b, r in zip(("o", "final state", "chunk states"), (o, S, chunks), want, ref32):
        assert_like_fp32(a.cpu(), b, r, what)


def test_chunk_states_with_padded_descriptors_and_training_without_a_sync(monkeypatch):
    """Given descriptors padded for a larger batch, the Triton path returns len(chunk_indices) rows,
    the padding ones zero, and builds no descriptors; training with them builds none either."""
    import recurscan.descriptors as descriptors
    q, k, v, g = (t.float().to(DEVICE) for t in gla_inputs(1, 200, 1, 2, 16, 16, seed=32))
    cu = torch.tensor([0, 1, 70, 200], device=DEVICE)
    d = recurscan.build_chunk_descriptors(cu, max_tokens=400, device=DEVICE)
    want = recurscan.chunk_simple_gla(q, k, v, g, cu_seqlens=cu, return_chunk_states=True, backend="torch")[2]
    monkeypatch.setattr(descriptors, "build_chunk_descriptors", lambda *a, **kw: pytest.fail("built descriptors"))
    got = recurscan.chunk_simple_gla(q, k, v, g, cu_seqlens=cu, chunk_indices=d.chunk_indices,
                                     chunk_offsets=d.chunk_offsets, return_chunk_states=True, backend="triton")[2]
    assert got.shape[0] == d.chunk_indices.shape[0] > want.shape[0]
    assert (got[want.shape[0]:] == 0).all()
    assert (got[:want.shape[0]] - want).norm() <= 1e-5 * want.norm()
    x = [t.clone().requires_grad_() for t in (q, k, v, g)]
    o, _ = recurscan.chunk_simple_gla(*x, cu_seqlens=cu, chunk_indices=d.chunk_indices, chunk_offsets=d.chunk_offsets,
                                      backend="triton")
    torch.autograd.grad(o.sum(), x)
    with pytest.raises(NotImplementedError, match="return_chunk_states are inference-only"):
        recurscan.chunk_simple_gla(*x, cu_seqlens=cu, return_chunk_states=True, backend="triton")
    with pytest.raises(ValueError, match="chunk_offsets"):
        recurscan.chunk_simple_gla(q, k, v, g, cu_seqlens=cu, chunk_indices=d.chunk_indices,
                                   chunk_offsets=d.chunk_offsets[:-1], backend="triton")


@pytest.mark.parametrize("form", ["sweep", "sweep, group prep"])
def test_training_from_kept_chunk_states_with_padded_descriptors(form, monkeypatch):
    """plan.gla.GLA_FORWARD_STATES with descriptors padded for a larger batch: the forward keeps
    len(chunk_indices) rows unfilled (poisoned with NaN here) and writes its sequences' alone, and
    the backward reads no padding row: every gradient finite and within float32 rounding of those
    with exact descriptors and the recompute."""
    from recurscan.launch import delta as launch_delta
    from recurscan.plan import gla as plan_gla
    from recurscan.runtime.cache import clear_caches
    use_form(form, monkeypatch)
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)
    q, k, v, g = (t.float().to(DEVICE) for t in gla_inputs(1, 200, 2, 4, 16, 16, seed=33))
    cu = torch.tensor([0, 1, 70, 200], device=DEVICE)
    do = torch.randn(v.shape, generator=torch.Generator().manual_seed(34)).to(DEVICE)
    got = {}
    for kept, pad in ((False, None), (True, 400)):
        monkeypatch.setattr(plan_gla, "GLA_FORWARD_STATES", kept)
        clear_caches()
        d = recurscan.build_chunk_descriptors(cu, max_tokens=pad, device=DEVICE)
        x = [t.clone().requires_grad_() for t in (q, k, v, g)]
        o, _ = recurscan.chunk_simple_gla(*x, cu_seqlens=cu, chunk_indices=d.chunk_indices,
                                          chunk_offsets=d.chunk_offsets, backend="triton")
        got[kept] = torch.autograd.grad(o, x, do)
    assert d.chunk_indices.shape[0] > int(d.chunk_offsets[-1])  # padding rows
    for name, a, b in zip(("dq", "dk", "dv", "dg"), got[True], got[False]):
        assert torch.isfinite(a).all() and relative_rms(a, b) < 1e-5, name


def per_key_decays(B, T, HV, K, seed):
    """Per-key log decays with the hostile values: a reset (-inf) in one key mid-sequence, decay
    exactly 1 in a row, and a long run of strong decay (e^-30 a token) in another key, where a
    factor split across rows would overflow."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, K, generator=gen, dtype=torch.float64) + 2)
    if T > 3:
        g[:, T // 2, 0, 0] = float("-inf")
        g[:, 1] = 0.0
        g[:, T // 4:T // 4 + 40, -1, K // 2] = -30.0
    return g


#: The planner's per-key form over every hostile case; the others over the hardest (a width not a
#: power of two, one-token varlen sequences, several chunks under GVA).
PER_KEY_FORWARD = [(c, "sweep") for c in CASES] + [
    (c, f) for f in PER_KEY_FORMS[1:] for c in ("T 65, V 40", "T 300, GVA 4", "varlen, one-token sequences",
                                                 "K 24 (not a power of two), varlen")]


@pytest.mark.parametrize("case, form", PER_KEY_FORWARD)
def test_per_key_triton_forward_matches_the_token_loop(case, form, monkeypatch):
    """chunk_gla on the Triton path (the per-key prep, kernels/gla/prep.py, then the delta sweep
    with KEY_DECAY, in one pass or in segments, or the fused kernel with PER_KEY): output and
    final state against the float64 token loop, over the hostile cases."""
    use_per_key_form(form, monkeypatch)
    c = CASES[case]
    K, V = c.get("K", 16), c.get("V", 16)
    q, k, v, _ = gla_inputs(c["B"], c["T"], c["H"], c["HV"], K, V, seed=len(case) + 50)
    g = per_key_decays(c["B"], c["T"], c["HV"], K, seed=len(case))
    cu = None if c["cu"] is None else torch.tensor(c["cu"])
    N = c["B"] if cu is None else len(c["cu"]) - 1
    h0 = torch.randn(N, c["HV"], K, V, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    args = dict(scale=0.3, initial_state=h0, cu_seqlens=cu)
    want = gla_naive(q, k, v, g, **args)
    ref32 = gla_chunked(*(x.float() for x in (q, k, v, g)), **dict(args, initial_state=h0.float()))
    dev = lambda x: None if x is None else (x.float() if x.is_floating_point() else x).to(DEVICE)  # noqa: E731
    got = recurscan.chunk_gla(*map(dev, (q, k, v, g)), scale=0.3, initial_state=dev(h0), output_final_state=True,
                              cu_seqlens=dev(cu), backend="triton")
    for what, a, b, r in zip(("o", "final state"), got, want, ref32):
        assert_like_fp32(a.cpu(), b, r, what)


@pytest.mark.parametrize("name, form", [(n, f) for f in ("sweep", "fused") for n in "qkvg"] +
                         [("k", "sweep segments"), ("g", "sweep segments")] +
                         [(n, "sweep, general steps") for n in "qkvg"] +
                         [(n, "sweep, general steps, key blocks of 16") for n in "qkg"] +
                         [(n, "sweep, calm pass of 16 keys") for n in "qkg"])
def test_per_key_non_finite_input_stays_causal(name, form, monkeypatch):
    """A NaN at token 95 (one key of g, one element of the others; with key blocks, a key of the
    second block, which must still mark the row for the first): the outputs before it and the
    other sequence keep their bits; a query's NaN reaches its own row alone."""
    use_per_key_form(form, monkeypatch)
    K = 32 if "16 keys" in form or "key blocks" in form else 16
    q, k, v, _ = (x.float().to(DEVICE) for x in gla_inputs(1, 200, 1, 2, K, 16, seed=61))
    g = per_key_decays(1, 200, 2, K, seed=62).float().to(DEVICE)
    cu = torch.tensor([0, 130, 200], device=DEVICE)
    clean = recurscan.chunk_gla(q, k, v, g, output_final_state=True, cu_seqlens=cu, backend="triton")
    x = dict(q=q, k=k, v=v, g=g)
    bad = x[name].clone()
    bad[0, 95, 0, 20 if K == 32 else 3 if name == "g" else 0] = float("nan")
    x[name] = bad
    o, S = recurscan.chunk_gla(*x.values(), output_final_state=True, cu_seqlens=cu, backend="triton")
    assert torch.equal(o[:, :95], clean[0][:, :95]), "an output before the NaN changed"
    assert torch.equal(o[:, 130:], clean[0][:, 130:]) and torch.equal(S[1], clean[1][1]), "the other sequence changed"
    if name == "q":
        assert torch.isnan(o[0, 95]).all() and torch.equal(o[:, 96:130], clean[0][:, 96:130])
        assert torch.equal(S[0], clean[1][0])
    else:
        assert torch.isnan(o[0, 95, 0]).any() and torch.isnan(S[0, 0]).any(), "the NaN vanished"


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("optional", ["all", "no_h0"])
def test_per_key_triton_gradients_match_autograd_through_the_token_loop(case, optional):
    """chunk_gla's Triton backward (the prep and the states again, the reverse sweep and the
    parallel stage with PER_KEY): every gradient (q, k, v, g per key, the initial state; a gradient
    into the final state too) against autograd through the float64 token loop, over the hostile
    cases and decays (a reset, a decay of exactly 1, a run of e^-30 a token), bounded by the
    float32 band; a reset's dg is exactly 0, as autograd's."""
    c = CASES[case]
    K, V = c.get("K", 16), c.get("V", 16)
    q, k, v, _ = gla_inputs(c["B"], c["T"], c["H"], c["HV"], K, V, seed=len(case) + 70)
    g = per_key_decays(c["B"], c["T"], c["HV"], K, seed=len(case) + 1)
    cu = None if c["cu"] is None else torch.tensor(c["cu"])
    N = c["B"] if cu is None else len(c["cu"]) - 1
    h0 = None if optional == "no_h0" else \
        torch.randn(N, c["HV"], K, V, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    ref = [t.clone().requires_grad_() for t in (q, k, v, g, h0) if t is not None]
    o, S = gla_naive(*ref[:4], scale=0.3, initial_state=ref[4] if h0 is not None else None, cu_seqlens=cu)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(S.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad((o, S), ref, (do, dht))
    mine = [t.detach().float().to(DEVICE).requires_grad_() for t in ref]
    o2, S2 = recurscan.chunk_gla(*mine[:4], scale=0.3, initial_state=mine[4] if h0 is not None else None,
                                 output_final_state=True, cu_seqlens=None if cu is None else cu.to(DEVICE),
                                 backend="triton")
    got = torch.autograd.grad((o2, S2), mine, (do.float().to(DEVICE), dht.float().to(DEVICE)))
    for name, a, b in zip(("q", "k", "v", "g", "h0"), got, want):
        assert torch.isfinite(a).all() and torch.isfinite(b).all(), name
        assert relative_rms(a.double().cpu(), b) < 2e-5, f"{name}: {relative_rms(a.double().cpu(), b):.2e}"
    assert (got[3][g.isinf().to(DEVICE)] == 0).all(), "a reset's dg"


@pytest.mark.parametrize("decay, form", [("per key", f) for f in PER_KEY_FORMS] +
                         [("scalar", "sweep"), ("scalar", "fused")])
def test_cache_chunk_states_and_what_it_refuses(decay, form, monkeypatch):
    """A state cache (-1 padding) with chunk states equals the PyTorch form, a padding sequence's
    chunk-state rows zero as its outputs; with grad and a cache it is refused."""
    (use_per_key_form if decay == "per key" else use_form)(form, monkeypatch)
    q, k, v, g = (x.float().to(DEVICE) for x in gla_inputs(1, 150, 1, 2, 16, 16, seed=63))
    if decay == "per key":
        g = per_key_decays(1, 150, 2, 16, seed=64).float().to(DEVICE)
    cu = torch.tensor([0, 1, 90, 150], device=DEVICE)
    cache = torch.randn(5, 2, 16, 16, device=DEVICE)
    slots = torch.tensor([3, -1, 0], device=DEVICE)
    op = recurscan.chunk_gla if decay == "per key" else recurscan.chunk_simple_gla
    outs = {}
    for backend in ("torch", "triton"):
        c = cache.clone()
        outs[backend] = op(q, k, v, g, cu_seqlens=cu, state=c, state_indices=slots, return_chunk_states=True,
                           backend=backend)
    (o1, c1, ch1), (o2, c2, ch2) = outs["torch"], outs["triton"]
    assert relative_rms(o2, o1) < 1e-5 and relative_rms(c2, c1) < 1e-5 and torch.equal(c2[1], cache[1])
    assert relative_rms(ch2[:ch1.shape[0]], ch1) < 1e-5 and (ch2[ch1.shape[0]:] == 0).all()
    assert (ch1[1:3] == 0).all() and (ch1[[0, 3]] != 0).any(dim=(1, 2, 3)).all(), "the padding sequence's rows"
    x = [t.clone().requires_grad_() for t in (q, k, v, g)]
    with pytest.raises(NotImplementedError, match="inference-only"):
        op(*x, cu_seqlens=cu, state=cache.clone(), state_indices=slots, backend="triton")


def test_prep_programs_over_several_heads_give_the_same_bits(monkeypatch):
    """GVA: 4 value heads a prep program (sharing q, k and Q K^T) write what one a program writes."""
    q, k, v, g = (x.float().to(DEVICE) for x in gla_inputs(1, 150, 2, 8, 16, 16, seed=8))
    cu = torch.tensor([0, 1, 90, 150], device=DEVICE)
    got = {}
    for form in ("sweep, 1 head a prep program", "sweep, 4 heads a prep program"):
        with monkeypatch.context() as m:
            use_form(form, m)
            got[form] = recurscan.chunk_simple_gla(q, k, v, g, output_final_state=True, cu_seqlens=cu, backend="triton")
    one, four = got.values()
    assert all(torch.equal(a, b) for a, b in zip(one, four))


@pytest.mark.parametrize("kept, form, recompute", [
    (False, "sweep", ["chunk_delta_prep_kernel", "chunk_delta_sweep_kernel"]),
    (True, "sweep", []), (True, "sweep, group prep", ["chunk_group_prep_kernel"])],
    ids=["recomputed", "kept", "kept, group prep"])
def test_the_forward_starts_compiling_the_recompute_on_the_sweep(kept, form, recompute, monkeypatch):
    """With the recompute on the delta sweep (GlaShape.recompute_on_sweep), the forward under
    autograd hands that sweep's prep and sweep to the background compiler, then the backward's
    stages; with the chunk states kept by the forward (plan.gla.GLA_FORWARD_STATES) the recompute's
    group prep alone (the reverse sweep reads its scores), or nothing of it without the group prep.
    The backward finds those launches and its gradients are the PyTorch form's."""
    import recurscan.launch.gla as lg
    from recurscan.plan import gla as plan_gla
    monkeypatch.setattr(plan_gla, "GLA_LAUNCH", dataclasses.replace(plan_gla.GLA_LAUNCH, recompute_on_sweep=True))
    monkeypatch.setattr(plan_gla, "GLA_FORWARD_STATES", kept)
    use_form(form, monkeypatch)
    handed = []
    monkeypatch.setattr(lg, "INTERPRET", False)
    monkeypatch.setattr(lg, "compile_in_background", lambda launches, names, values, device:
                        handed.append((launches, names, values)) or (lambda: None))
    gen = torch.Generator().manual_seed(13)
    T = 90 + kept + (form != "sweep")  # a signature of its own
    x = [torch.randn(1, T, 2, 16, generator=gen), torch.randn(1, T, 2, 16, generator=gen),
         torch.randn(1, T, 2, 24, generator=gen), -torch.rand(1, T, 2, generator=gen)]
    mine = [t.clone().requires_grad_() for t in x]
    before = len(lg.GLA_BACKWARD_LAUNCHES)
    o, _ = recurscan.chunk_simple_gla(*mine, scale=0.3, backend="triton")
    assert [names for _, names, _ in handed] == [lg.CALL_NAMES] * bool(recompute) + [lg.BWD_NAMES]
    if recompute:
        assert [launch[0].fn.__name__ for launch in handed[0][0]] == recompute
    do = torch.randn_like(o)
    got = torch.autograd.grad(o, mine, do)
    assert len(lg.GLA_BACKWARD_LAUNCHES) == before + 1  # the forward's, found by the backward
    ref = [t.clone().requires_grad_() for t in x]
    want = torch.autograd.grad(recurscan.chunk_simple_gla(*ref, scale=0.3, backend="torch")[0], ref, do)
    for name, a, b in zip(("dq", "dk", "dv", "dg"), got, want):
        assert relative_rms(a, b) < 1e-4, name


@pytest.mark.parametrize("case", ["H = HV", "GVA", "the reverse sweep's Gluon twin", "nothing narrowed"])
def test_the_backward_stores_the_gradients_its_caller_narrows_in_the_inputs_dtypes(case):
    """launch.gla.build_gla_backward's ``narrow`` (autograd/gla.py's NARROW: dq, dk, dv; SSD's: dq,
    dk): those gradients are stored in q's, k's and v's dtypes rather than cast after; dq and dk
    where the stage leaves them whole, else their group sums (the shares stay float32); dv where
    the Triton reverse sweep writes it (the Gluon twin's bulk store takes float32)."""
    import dataclasses
    from recurscan.launch.gla import build_gla_backward
    from recurscan.plan import gla as plan_gla
    from recurscan.plan.delta import DeltaShape
    B, T, H, K, V = 1, 300, 2, 128, 64
    HV = 2 * H if case == "GVA" else 8 if case.startswith("the reverse") else H
    H = 1 if case.startswith("the reverse") else H
    bf = dict(dtype=torch.bfloat16)
    q, k, v, do = (torch.zeros(B, T, h, d, **bf) for h, d in ((H, K), (H, K), (HV, V), (HV, V)))
    shape = plan_gla.GLA_LAUNCH
    if case.startswith("the reverse"):  # as the reverse sweep's twin test plans it: the group prep's scores
        shape = dataclasses.replace(shape, sweep=DeltaShape(64, 4, 2, 4, "test", tma_store=True, group_prep=True),
                                    reverse_twin=True)
    narrow = () if case == "nothing narrowed" else ("dq", "dk", "dv")
    launches = build_gla_backward(q, k, v, torch.zeros(B, T, HV), do, None, None, None, None, None,
                                  scale=K ** -0.5, shape=shape, narrow=narrow)
    dtypes = {n: d for n, (_, d) in launches.buffers.items()}
    low = torch.bfloat16 if narrow else torch.float32
    twin = type(launches.steps[0].kernel).__name__ == "GluonJITFunction"
    assert twin == case.startswith("the reverse")
    assert dtypes["dv"] == (torch.float32 if twin else low)
    if launches.gva:
        assert (dtypes["dq"], dtypes["dk"], dtypes["dq_sum"], dtypes["dk_sum"]) == (torch.float32,) * 2 + (low,) * 2
    else:
        assert (dtypes["dq"], dtypes["dk"]) == (low, low)
    assert case != "GVA" or launches.gva, "the GVA case should sum value-head shares"
