"""The Triton backward stages of the chunked delta rule (launch/delta_backward.py,
kernels/delta/backward.py) under the interpreter, against the written-out reference
(reference/delta_backward.py): every gradient against the float64 reference, bounded by what the
same reference gets in float32."""
import dataclasses

import pytest
import torch

from recurscan.descriptors import build_chunk_descriptors
from recurscan.launch.delta_backward import chunk_delta_bwd
from recurscan.plan.delta import DeltaBackwardShape, DeltaShape
from recurscan.reference.delta_backward import gated_delta_rule_chunked_backward
from tests.helpers.inputs import gdn_inputs
from tests.helpers.tolerances import assert_like_fp32, relative_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every buffer the forward recompute and the stages allocate starts as NaN (-1 for integers):
    an element no kernel writes shows up in the gradients."""
    import recurscan.launch.delta as launch_delta
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)

CASES = {
    "dense, l2norm, resets": dict(B=2, T=130, H=2, HV=2, cu=None, l2norm=True),
    "GVA, T 64": dict(B=1, T=64, H=1, HV=2, cu=None, l2norm=True),
    "varlen, one-token sequences": dict(B=1, T=200, H=2, HV=4, cu=[0, 1, 2, 66, 67, 200], l2norm=True),
    "no l2norm, short": dict(B=1, T=5, H=1, HV=1, cu=None, l2norm=False),
    "two value blocks, V 40": dict(B=1, T=100, H=1, HV=2, cu=[0, 30, 100], l2norm=True, V=40),
    "T 1": dict(B=2, T=1, H=1, HV=1, cu=None, l2norm=True),
    "T 63, GVA": dict(B=2, T=63, H=1, HV=2, cu=None, l2norm=True),
    "T 65": dict(B=1, T=65, H=2, HV=2, cu=None, l2norm=True),
    "T 300, GVA 4": dict(B=1, T=300, H=1, HV=4, cu=None, l2norm=True),
    "K 24, V 40 (not powers of two), varlen": dict(B=1, T=150, H=1, HV=2, cu=[0, 1, 150], l2norm=True, K=24, V=40),
}
#: Another launch shape than the planner's: 4 warps, and a parallel stage stepping 16 value columns.
NARROW = DeltaBackwardShape(32, 4, 4, "tests: 4 warps, the parallel stage over 16-column steps", grads_block_v=16)
#: The recompute in three phases, and in three segments (pass 1, the fix-up, pass 2), its scores kernel at 64 columns.
PHASED = DeltaBackwardShape(32, 8, 4, "tests: the recompute in phases", grads_block_v=16, scores_warps=4,
                            scores_block_v=64, recompute=DeltaShape(32, 4, 2, 4, "tests", phases=3))
SEGMENTED = DeltaBackwardShape(16, 4, 4, "tests: the recompute in segments",
                               recompute=DeltaShape(16, 4, 2, 4, "tests", segments=3, v_product=False))


#: GVA summed in the dq, dk kernels over 16-column steps (NARROW sums a group's dq, dk after them).
GROUPED = DeltaBackwardShape(32, 8, 4, "tests: GVA summed in the dq, dk kernels", grads_block_v=16,
                             group_in_kernel=True)
#: dk, then dq, in one launch (GVA summed in it).
ONE_LAUNCH = DeltaBackwardShape(32, 4, 4, "tests: dk then dq in one launch", grads_block_v=16, group_in_kernel=True,
                                dqdk_one_launch=True)


def _cases():
    for case, c in CASES.items():
        for optional in ("all", "no_g_beta_h0"):
            yield pytest.param(case, optional, None, id=f"{case}-{optional}")
            if optional == "all":
                yield pytest.param(case, optional, NARROW, id=f"{case}-{optional}-narrow")
                yield pytest.param(case, optional, ONE_LAUNCH, id=f"{case}-{optional}-one-launch")
            if c["HV"] != c["H"]:  # GVA summed in the kernel
                yield pytest.param(case, optional, GROUPED,
                                   id=f"{case}-{optional}-grouped")
            if optional == "all" and c["cu"] is None and c["T"] > 64:  # phases and segments: dense, several chunks
                yield pytest.param(case, optional, PHASED, id=f"{case}-{optional}-recompute-phased")
                yield pytest.param(case, optional, SEGMENTED, id=f"{case}-{optional}-recompute-segmented")


@pytest.mark.parametrize("case, optional, backward_shape", list(_cases()))
def test_triton_backward_matches_the_reference(case, optional, backward_shape):
    """Every gradient under the interpreter against the float64 chunkwise reference: T in
    {1, 5, 63, 64, 65, 100, 130, 150, 200, 300}, head sizes that are not powers of two, GVA (a group's dq, dk summed after or in the kernel),
    the stages' launch shapes, the recompute in phases or segments,
    varlen with one-token sequences, decays exactly 0 and -inf (gdn_inputs), with and without g,
    beta and an initial state."""
    c = CASES[case]
    V = c.get("V", 16)
    K = c.get("K", 16)
    q, k, v, g, beta, _ = gdn_inputs(c["B"], c["T"], c["H"], c["HV"], K, V, seed=len(case))
    cu = None if c["cu"] is None else torch.tensor(c["cu"])
    N = c["B"] if cu is None else len(c["cu"]) - 1
    gen = torch.Generator().manual_seed(7)
    S0 = torch.randn(N, c["HV"], K, V, dtype=torch.float64, generator=gen)
    do = torch.randn(c["B"], c["T"], c["HV"], V, dtype=torch.float64, generator=gen)
    dht = torch.randn(N, c["HV"], K, V, dtype=torch.float64, generator=gen)
    if optional == "no_g_beta_h0":
        g = beta = S0 = None
    args = dict(scale=0.2, use_qk_l2norm_in_kernel=c["l2norm"], cu_seqlens=cu)
    want64 = gated_delta_rule_chunked_backward(q, k, v, g, beta, do, dht, initial_state=S0, **args)
    f32 = lambda x: None if x is None else x.float()  # noqa: E731
    ref32 = gated_delta_rule_chunked_backward(*map(f32, (q, k, v, g, beta, do, dht)), initial_state=f32(S0), **args)
    dev = lambda x: None if x is None else x.float().to(DEVICE)  # noqa: E731
    desc = {} if cu is None else dict(zip(("chunk_indices", "chunk_offsets"),
                                          (lambda d: (d.chunk_indices, d.chunk_offsets))(
                                              build_chunk_descriptors(cu, device=DEVICE))))
    got = chunk_delta_bwd(*map(dev, (q, k, v, g, beta, do, dht)), initial_state=dev(S0),
                          **dict(args, cu_seqlens=None if cu is None else cu.to(DEVICE)), **desc,
                          backward_shape=backward_shape)
    for name, a, b, r in zip(NAMES, got, want64, ref32):
        assert (a is None) == (b is None), name
        if a is not None:
            assert_like_fp32(a.cpu(), b, r, name)


@pytest.mark.parametrize("backward_shape", [None, NARROW, SEGMENTED, GROUPED, ONE_LAUNCH],
                         ids=["planned", "narrow", "split", "grouped", "one-launch"])
@pytest.mark.parametrize("M, cu", [(2, None), (3, [0, 1, 40, 41, 90])])
def test_gated_delta_product_on_the_expanded_stream(M, cu, backward_shape):
    """GDP: the stages on the expanded stream with q, dO (last copies) and g (first copies) read
    from the token stream, dq and dg written there; every launch shape."""
    from recurscan.launch.delta_backward import chunk_delta_product_bwd
    from recurscan.reference.delta_backward import gated_delta_product_chunked_backward
    from tests.helpers.inputs import gdp_inputs
    T = 90
    q, k, v, g, beta = gdp_inputs(T, M, 2, 4, 16, 16, seed=M)[:5]
    cu_t = None if cu is None else torch.tensor(cu)
    N = 1 if cu is None else len(cu) - 1
    gen = torch.Generator().manual_seed(8)
    S0 = torch.randn(N, 4, 16, 16, dtype=torch.float64, generator=gen)
    do = torch.randn(1, T, 4, 16, dtype=torch.float64, generator=gen)
    dht = torch.randn(N, 4, 16, 16, dtype=torch.float64, generator=gen)
    args = dict(use_qk_l2norm_in_kernel=True, cu_seqlens=cu_t)
    want64 = gated_delta_product_chunked_backward(q, k, v, g, beta, M, do, dht, initial_state=S0, **args)
    f32 = lambda x: x.float()  # noqa: E731
    ref32 = gated_delta_product_chunked_backward(*map(f32, (q, k, v, g, beta)), M, f32(do), f32(dht),
                                                 initial_state=f32(S0), **args)
    dev = lambda x: x.float().to(DEVICE)  # noqa: E731
    got = chunk_delta_product_bwd(*map(dev, (q, k, v, g, beta)), M, dev(do), dev(dht), initial_state=dev(S0),
                                  use_qk_l2norm_in_kernel=True, cu_seqlens=None if cu_t is None else cu_t.to(DEVICE),
                                  backward_shape=backward_shape)
    for name, a, b, r in zip(NAMES, got, want64, ref32):
        assert_like_fp32(a.cpu(), b, r, name)


def test_strided_inputs_and_gradient_give_the_contiguous_bits():
    """q, k, v, g, beta, dO and dht arriving as strided views: the same gradients as contiguous copies."""
    q, k, v, g, beta, S0 = (x.float().to(DEVICE) for x in gdn_inputs(1, 80, 2, 2, 16, 16, seed=21))
    gen = torch.Generator().manual_seed(22)
    do = torch.randn(1, 80, 2, 16, generator=gen).to(DEVICE)
    dht = torch.randn(1, 2, 16, 16, generator=gen).to(DEVICE)
    strided = lambda x: x.transpose(-1, -2).contiguous().transpose(-1, -2) if x.dim() == 4 else \
        torch.stack([x, x], -1)[..., 0]  # noqa: E731
    a = chunk_delta_bwd(q, k, v, g, beta, do, dht, initial_state=S0, use_qk_l2norm_in_kernel=True)
    b = chunk_delta_bwd(*map(strided, (q, k, v, g, beta, do, dht)), initial_state=S0, use_qk_l2norm_in_kernel=True)
    assert not strided(g).is_contiguous() and not strided(q).is_contiguous()
    for name, x, y in zip(NAMES, a, b):
        assert torch.equal(x, y), name


def test_wrong_chunk_offsets_read_and_write_nothing_outside():
    """A chunk_offsets entry past the chunk-state rows: wrong gradients, never an access outside a
    tensor (the stages bound every chunk-state row they take from it)."""
    q, k, v, g, beta, _ = (x.float().to(DEVICE) for x in gdn_inputs(1, 130, 1, 1, 16, 16, seed=30))
    cu = torch.tensor([0, 60, 130], device=DEVICE)
    d = build_chunk_descriptors(cu.cpu(), device=DEVICE)
    bad = d.chunk_offsets.clone()
    bad[1] = 1 << 20
    do = torch.ones(1, 130, 1, 16, device=DEVICE)
    got = chunk_delta_bwd(q, k, v, g, beta, do, cu_seqlens=cu, chunk_indices=d.chunk_indices, chunk_offsets=bad)
    assert got[2].shape == v.shape


@pytest.mark.parametrize("M", [1, 2, 3])
def test_expanded_chunk_offsets_on_the_device_equal_the_host_descriptors(M):
    from recurscan.launch.delta_backward import expanded_chunk_offsets
    cu = torch.tensor([0, 1, 2, 66, 67, 200, 200, 331])
    want = build_chunk_descriptors(cu * M).chunk_offsets
    assert torch.equal(expanded_chunk_offsets(cu, M).cpu(), want.cpu())


def _op_call(M, cu, HV, seed):
    """Inputs (float32, on DEVICE) and keyword arguments of the public GDN (M = 1) or GDP op on the
    Triton path: a dense batch of two 130-token sequences, or one varlen batch ``cu`` with its
    descriptors."""
    from tests.helpers.inputs import gdp_inputs
    T = 130 if cu is None else cu[-1]
    x = [t.float().to(DEVICE) for t in (gdn_inputs(2 if cu is None else 1, T, 1, HV, 16, 16, seed=seed)[:5] if M == 1
                                        else gdp_inputs(T, M, 1, HV, 16, 16, seed=seed)[:5])]
    kw = dict(use_qk_l2norm_in_kernel=True, backend="triton")
    if cu is not None:
        d = build_chunk_descriptors(torch.tensor(cu), M, device=DEVICE)
        kw.update(cu_seqlens=torch.tensor(cu, device=DEVICE), chunk_indices=d.chunk_indices,
                  chunk_offsets=d.chunk_offsets, **({"chunk_indices_dp": d.chunk_indices_dp} if M > 1 else {}))
    return x, kw


def _op(M):
    import recurscan
    return recurscan.chunk_gated_delta_rule if M == 1 else \
        lambda *x, **kw: recurscan.chunk_gated_delta_product_varlen(*x, M, **kw)


@pytest.mark.parametrize("M, cu", [(1, None), (1, [0, 1, 70, 130]), (2, [0, 1, 40, 70])],
                         ids=["GDN dense", "GDN varlen", "GDP varlen"])
def test_the_prep_kept_by_the_forward_gives_the_recomputed_bits(monkeypatch, M, cu):
    """Through autograd, the forward keeping its prep's outputs for the backward (the planner's
    keep_prep_for_backward, forced either way here): the same gradients, bit for bit, with the
    recompute's prep launched only where nothing was kept, and the kept tensors saved beside the
    inputs."""
    import recurscan.plan.delta as plan_delta
    from recurscan.kernels.delta.prep import chunk_delta_prep_kernel
    from recurscan.launch.delta_backward import BACKWARD_LAUNCHES
    from recurscan.runtime.cache import clear_caches
    x, kw = _op_call(M, cu, 2, seed=5)
    grads, saved = {}, {}
    for keep in (False, True):
        clear_caches()  # the signature's launches, planned the other way
        monkeypatch.setattr(plan_delta, "keep_prep_for_backward", lambda problem: keep)
        leaves = [t.clone().requires_grad_() for t in x]
        count = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: count.append(t) or t, lambda t: t):
            o, _ = _op(M)(*leaves, **kw)
        saved[keep] = len(count)
        grads[keep] = torch.autograd.grad(o, leaves, torch.ones_like(o))
        (launches,) = BACKWARD_LAUNCHES.values()
        preps = [s for s in launches.forward.steps if s.kernel is chunk_delta_prep_kernel]
        assert bool(preps) != keep
    assert saved[True] == saved[False] + (4 if cu is None else 5)  # wy, G o Tinv, aqk, coef[, sequence order]
    for name, a, b in zip(NAMES, grads[False], grads[True]):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("every", [1, 2, 3])
@pytest.mark.parametrize("fields", [{}, dict(phases=3), dict(segments=2)], ids=["one pass", "phases", "segments"])
def test_the_forward_checkpoints_the_states_entering_every_eth_chunk(every, fields):
    """``checkpoint_chunks`` E: the float32 state entering token chunk c E is row c of the
    checkpoints, the state the sweep itself carried there (its chunk states, float32), whichever
    way the forward runs (one pass, phases, segments)."""
    from recurscan.launch.delta import DeltaInputs, TEST_SHAPE, build_delta_launches, run_delta_launches
    import dataclasses
    q, k, v, g, beta, _ = (x.float().to(DEVICE) for x in gdn_inputs(2, 300, 1, 2, 16, 16, seed=9))
    h0 = torch.randn(2, 2, 16, 16, device=DEVICE)
    launches = build_delta_launches(q, k, v, g, beta, dataclasses.replace(TEST_SHAPE, **fields), initial_state=h0,
                                    use_qk_l2norm_in_kernel=True, return_chunk_states=True, checkpoint_chunks=every)
    o, _, chunk_states, checkpoints = run_delta_launches(launches, DeltaInputs(q, k, v, g, beta, h0, *[None] * 5))
    chunks = 5  # ceil(300 / 64)
    assert checkpoints.shape == (2, -(-chunks // every), 2, 16, 16)
    want = chunk_states.view(2, chunks, 2, 16, 16)[:, ::every]
    assert torch.equal(checkpoints, want)


@pytest.mark.parametrize("keep_prep", [False, True])
@pytest.mark.parametrize("every", [1, 2, 4])
def test_the_recompute_from_checkpoints_gives_the_same_gradients(monkeypatch, every, keep_prep):
    """Through autograd on a dense batch, the forward keeping every E-th chunk's state (the
    planner's checkpoint_chunks_for_backward, forced here) and the backward recomputing the chunk
    states every segment at once (one PASS 2 sweep launch, no single pass): the gradients of the
    recompute from the initial state, bit for bit, and the checkpoints saved beside the inputs."""
    import recurscan.plan.delta as plan_delta
    from recurscan.launch.delta_backward import BACKWARD_LAUNCHES
    from recurscan.kernels.delta.sweep import chunk_delta_sweep_kernel
    from recurscan.runtime.cache import clear_caches
    x, kw = _op_call(1, None, 2, seed=6)
    x = [torch.cat([t, t.flip(1)], 1) for t in x]  # 260 tokens: 5 chunks, the last partial
    monkeypatch.setattr(plan_delta, "keep_prep_for_backward", lambda problem: keep_prep)
    grads, saved = {}, {}
    for e in (0, every):
        clear_caches()
        monkeypatch.setattr(plan_delta, "checkpoint_chunks_for_backward", lambda problem, device: e)
        leaves = [t.clone().requires_grad_() for t in x]
        count = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: count.append(t) or t, lambda t: t):
            o, ht = _op(1)(*leaves, output_final_state=True, **kw)
        saved[e] = len(count)
        grads[e] = torch.autograd.grad((o, ht), leaves, (torch.ones_like(o), torch.ones_like(ht)))
        (launches,) = BACKWARD_LAUNCHES.values()
        (sweep,) = [s for s in launches.forward.steps if s.kernel is chunk_delta_sweep_kernel]
        assert sweep.kwargs["PASS"] == (2 if e else 0)
        assert sweep.grid[0] == 2 * 2 * (-(-5 // e) if e else 1)  # sequences x value heads x segments
    assert saved[every] == saved[0] + 1
    for name, a, b in zip(NAMES, grads[0], grads[every]):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("M, cu, every", [(1, None, 0), (1, None, 2), (1, [0, 1, 70, 130], 0), (2, [0, 1, 40, 70], 0)],
                         ids=["GDN dense", "GDN dense, checkpoints", "GDN varlen", "GDP varlen"])
@pytest.mark.parametrize("keep_prep", [True, False], ids=["prep kept", "prep recomputed"])
def test_the_recompute_beside_the_reverse_sweep_gives_the_same_bits(monkeypatch, M, cu, every, keep_prep):
    """Through autograd, ``DeltaBackwardShape.corun`` (the recompute on a side stream, launched after
    the reverse sweep; here on one stream in that order): taken only where the forward kept its
    prep (the reverse sweep reads G o Tinv, which the recompute's prep would write), and then the
    reverse sweep runs while every buffer the recompute fills is still NaN (poisoned), so it reads
    none of them: the gradients of the serial order, bit for bit."""
    import recurscan.plan.delta as plan_delta
    from tests.helpers.plan import grads_serial_and_corun
    x, kw = _op_call(M, cu, 2, seed=8)
    monkeypatch.setattr(plan_delta, "keep_prep_for_backward", lambda problem: keep_prep)
    monkeypatch.setattr(plan_delta, "checkpoint_chunks_for_backward", lambda problem, device: every)
    runs = grads_serial_and_corun(monkeypatch, lambda *t: _op(M)(*t, **kw), x, torch.ones_like)
    grads = {corun: g for corun, (g, _) in runs.items()}
    assert [taken for _, taken in runs.values()] == [False, keep_prep]
    for name, a, b in zip(NAMES, grads[False], grads[True]):
        assert torch.equal(a, b), name
        assert torch.isfinite(a).all(), name


@pytest.mark.parametrize("bad", ["rows", "dtype", "every 0", "varlen"])
def test_checkpoints_of_another_call_are_refused(bad):
    """The recompute reads the checkpoints at offsets from the call's sizes: checkpoints of another
    shape, dtype or chunk interval, or any with a varlen call, are refused before a launch."""
    q, k, v, g, beta, _ = (x.float().to(DEVICE) for x in gdn_inputs(1, 300, 1, 2, 16, 16, seed=3))
    every, ckpt, kw = 2, torch.zeros(1, 3, 2, 16, 16, device=DEVICE), {}
    if bad == "rows":
        ckpt = ckpt[:, :2]
    elif bad == "dtype":
        ckpt = ckpt.bfloat16()
    elif bad == "every 0":
        every = 0
    else:
        d = build_chunk_descriptors(torch.tensor([0, 300]), device=DEVICE)
        kw = dict(cu_seqlens=torch.tensor([0, 300], device=DEVICE), chunk_indices=d.chunk_indices,
                  chunk_offsets=d.chunk_offsets)
    with pytest.raises(ValueError, match="checkpoints"):
        chunk_delta_bwd(q, k, v, g, beta, torch.ones(1, 300, 2, 16, device=DEVICE), checkpoints=ckpt,
                        checkpoint_chunks=every, **kw)


def test_the_planner_overlaps_or_checkpoints_the_recompute_where_the_reverse_sweep_leaves_sms_idle():
    """On a 132-SM device. B1 T16384 HV32 K = V = 128 (64 reverse-sweep programs, the prep kept):
    the recompute beside the reverse sweep (corun), no checkpoints. The same at K = V = 64 (the prep
    not kept, so the reverse sweep waits for the recompute's G o Tinv): every 4th chunk's state kept
    (34 MB within q, k, v's 134 MB). B4 T4096 HV16 (128 programs, the SMs filled): neither; varlen
    and GDP: no checkpoints. dk and dq in one launch where each value head has its own q/k head."""
    import dataclasses
    from recurscan.plan import delta as plan_delta
    from recurscan.problem import DeltaProblem
    base = dict(heads=16, key_dim=128, value_dim=128, householder=1, beta_per_value=False, scale=1.0,
                varlen=False, uses_cache=False, device=torch.device("cuda"), dtype=torch.bfloat16)
    b1 = DeltaProblem(batch=1, tokens=16384, value_heads=32, sequences=1, **base)
    b1_64 = dataclasses.replace(b1, key_dim=64, value_dim=64)
    b4 = DeltaProblem(batch=4, tokens=4096, value_heads=16, sequences=4, **base)
    sms = plan_delta.sm_count
    try:
        plan_delta.sm_count = lambda device: 132
        assert plan_delta.delta_backward_shape(32, 128, b1.device).corun
        assert not plan_delta.delta_backward_shape(64, 128, b4.device).corun
        # dk, then dq, in one launch where a value head has its own q/k head (B4 T4096, GDP); two under GVA
        assert plan_delta.delta_backward_shape(64, 128, b4.device, group=1).dqdk_one_launch
        assert not plan_delta.delta_backward_shape(64, 128, b4.device, group=2).dqdk_one_launch
        assert not plan_delta.delta_backward_shape(32, 128, b1.device, group=2).dqdk_one_launch
        # dq's launch of its own steps 32 columns from V = 128, 16 below (its two 32-column steps at
        # V = 64 repeated no bits on the H200); dk then dq in one launch keeps 32
        assert plan_delta.delta_backward_shape(64, 128, b4.device, group=2).grads_block_v == 32
        assert plan_delta.delta_backward_shape(64, 64, b4.device, group=2).grads_block_v == 16
        assert plan_delta.delta_backward_shape(8, 64, b4.device, group=2).grads_block_v == 16
        assert plan_delta.delta_backward_shape(128, 64, b4.device, group=1).grads_block_v == 32
        assert plan_delta.keep_prep_for_backward(b1) and not plan_delta.keep_prep_for_backward(b1_64)
        assert plan_delta.checkpoint_chunks_for_backward(b1, b1.device) == 0
        assert plan_delta.checkpoint_chunks_for_backward(b1_64, b1.device) == 4
        assert plan_delta.checkpoint_chunks_for_backward(b4, b4.device) == 0
        assert plan_delta.checkpoint_chunks_for_backward(dataclasses.replace(b1_64, varlen=True), b1.device) == 0
        assert plan_delta.checkpoint_chunks_for_backward(dataclasses.replace(b1_64, householder=2), b1.device) == 0
    finally:
        plan_delta.sm_count = sms


@pytest.mark.parametrize("case, sweep, dqdk, scores", [
    ("bf16 GDN K = V = 128", True, True, True), ("fp16, K = 64, V = 192", True, False, True), ("GVA", True, False, True),
    ("GVA summed in the kernel", True, True, True), ("GVA of 8 summed in the kernel", True, False, True),
    ("V = 96", False, True, False), ("V = 64", True, False, True), ("V = 80", False, False, False),
    ("GDP M = 2", False, False, False), ("GDP M = 2, its rows on", True, True, True),
    ("GDP M = 3", False, False, False),
    ("GDP M = 2, K = 64, its rows on", True, False, True),
    ("float32", False, False, False), ("K = 96", False, False, False),
    ('backend="triton"', False, False, False), ("no usable Gluon", False, False, False)])
def test_the_planner_gives_backward_stages_to_their_gluon_twins_only_in_scope(monkeypatch, case, sweep, dqdk, scores):
    """plan.delta.gluon_twins (the Gluon rules, docs/kernels-gluon.md), with the twins' rows on: each
    twin's scope (GDN, 16-bit inputs, K 64 or 128; the reverse sweep V a multiple of 64, then 64 value
    columns on one warpgroup, and Gated Delta Product at M = 2 where GLUON_GDP_REVERSE_SWEEP is on too
    and K one it was measured faster at (GLUON_GDP_REVERSE_SWEEP_KEY_DIMS);
    dq and dk one value head a q/k head, or a GVA group of at most 4 summed in the kernel, and V a
    multiple of 32, three steps of 32 at least, Gated Delta Product at M = 2 where GLUON_GDP_DQDK is
    on too, K one it was measured faster at (GLUON_DQDK_KEY_DIMS: 128), its warp-specialised form
    GDN's alone; the warp-specialised scores kernel V a multiple of
    64, and Gated Delta Product at M = 2 where GLUON_GDP_SCORES is on too), a device where Gluon is usable, the caller not forcing the Triton kernels. Elsewhere the
    shape as given."""
    import dataclasses
    from recurscan.plan import delta as plan_delta
    monkeypatch.setattr(plan_delta, "gluon_usable", lambda device: case != "no usable Gluon")
    monkeypatch.setattr(plan_delta, "GLUON_BACKWARD_TWINS", {
        name: dataclasses.replace(row, on=True) for name, row in plan_delta.GLUON_BACKWARD_TWINS.items()})
    monkeypatch.setattr(plan_delta, "GLUON_GDP_REVERSE_SWEEP",
                        dataclasses.replace(plan_delta.GLUON_GDP_REVERSE_SWEEP, on=case.endswith("its rows on")))
    monkeypatch.setattr(plan_delta, "GLUON_GDP_DQDK",
                        dataclasses.replace(plan_delta.GLUON_GDP_DQDK, on=case.endswith("its rows on")))
    monkeypatch.setattr(plan_delta, "GLUON_GDP_SCORES",
                        dataclasses.replace(plan_delta.GLUON_GDP_SCORES, on=case.endswith("its rows on")))
    fp16 = case == "fp16, K = 64, V = 192"
    args = dict(householder=3 if case == "GDP M = 3" else 2 if case.startswith("GDP") else 1,
                heads=2 if "GVA of 8" in case else 8 if case.startswith("GVA") else 16, value_heads=16,
                key_dim=96 if case == "K = 96" else 64 if fp16 or "K = 64" in case else 128,
                value_dim={"V = 96": 96, "V = 64": 64, "V = 80": 80}.get(case, 192 if fp16 else 128),
                dtype=torch.float32 if case == "float32" else torch.float16 if fp16 else torch.bfloat16,
                device=torch.device("cuda"), twin_only=case == 'backend="triton"')
    given = plan_delta.DeltaBackwardShape(32, 8, 4, "test", group_in_kernel="summed in the kernel" in case)
    got = plan_delta.gluon_twins(given, **args)
    assert (got.gluon_sweep, got.gluon_dqdk, got.gluon_scores) == (sweep, dqdk, scores)
    # its form, where a q/k head serves at most two value heads (GDN)
    assert got.gluon_dqdk_specialized == (dqdk and args["householder"] == 1 and
                                          args["value_heads"] <= 2 * args["heads"])
    # the recompute's sweep warp-specialised: the forward sweep's scope (GDN)
    assert got.recompute_specialized == (sweep and args["householder"] == 1)
    if sweep:
        assert (got.block_v, got.sweep_warps, got.sweep_stages) == (64, 4, 3)
    if dqdk:  # its ring's stages (GLUON_DQDK_STAGES: four for GDN, three for GDP; no more than V's steps)
        assert got.gluon_dqdk_stages == (4 if args["householder"] == 1 and args["value_dim"] >= 128 else 3)
    if not (sweep or dqdk or scores):
        assert got is given


def test_each_gluon_twin_is_planned_only_where_its_row_is_on(monkeypatch):
    """A twin whose GLUON_BACKWARD_TWINS row is off (not measured faster) is not planned, whatever
    the others' rows say; dq and dk's warp-specialised form is a form of their twin, so it goes
    with it."""
    import dataclasses
    from recurscan.plan import delta as plan_delta
    monkeypatch.setattr(plan_delta, "gluon_usable", lambda device: True)
    args = dict(householder=1, heads=16, value_heads=16, key_dim=128, value_dim=128, dtype=torch.bfloat16,
                device=torch.device("cuda"))
    for off in plan_delta.GLUON_BACKWARD_TWINS:
        monkeypatch.setattr(plan_delta, "GLUON_BACKWARD_TWINS", {
            name: dataclasses.replace(row, on=name != off) for name, row in plan_delta.GLUON_BACKWARD_TWINS.items()})
        got = plan_delta.gluon_twins(plan_delta.DeltaBackwardShape(32, 8, 4, "test"), **args)
        want = {n: n != off for n in plan_delta.GLUON_BACKWARD_TWINS}
        if off == "gluon_dqdk":
            want["gluon_dqdk_specialized"] = False
        assert {n: getattr(got, n) for n in plan_delta.GLUON_BACKWARD_TWINS} == want


def test_gluon_usable_is_false_off_hopper_and_under_the_interpreter():
    """No Gluon twin on the CPU, nor under TRITON_INTERPRET=1 (where no Gluon kernel runs)."""
    from recurscan.plan.device import gluon_usable
    assert not gluon_usable(torch.device("cpu"))


@pytest.mark.parametrize("what", ["sweep, M = 3", "sweep, float32", "sweep, block_v 32", "dq dk, M = 3",
                                  "dq dk, M = 2, GVA in the kernel", "dq dk warp-specialised, M = 2",
                                  "dq dk, float32", "dq dk, GVA", "dq dk, GVA of 8 in the kernel", "dq dk, V = 48",
                                  "dq dk, V = 64", "scores, M = 3", "scores, float32", "scores, V = 48",
                                  "recompute warp-specialised, M = 2", "recompute warp-specialised, float32",
                                  "recompute warp-specialised, V = 48"])
def test_a_gluon_twin_outside_its_scope_is_refused(what):
    """A hand-made DeltaBackwardShape asking for a Gluon twin where it cannot run: a ValueError naming
    the field, before anything is built or launched."""
    from recurscan.launch.delta import TEST_SHAPE
    from recurscan.launch.delta_backward import build_delta_backward
    M = 3 if "M = 3" in what else 2 if "M = 2" in what else 1
    dtype = torch.float32 if "float32" in what else torch.bfloat16
    T, K = 64, 128
    H, HV = (1, 8) if "GVA of 8" in what else (1, 2) if "GVA" in what else (2, 2)
    V = 48 if "V = 48" in what else 64 if "V = 64" in what else 128
    q, do = torch.zeros(1, T, H, K, dtype=dtype), torch.zeros(1, T, HV, V, dtype=dtype)
    k, v = torch.zeros(1, T * M, H, K, dtype=dtype), torch.zeros(1, T * M, HV, V, dtype=dtype)
    beta = torch.ones(1, T * M, HV, dtype=dtype)
    field = {"sweep": "gluon_sweep", "dq dk": "gluon_dqdk", "dq dk warp-specialised": "gluon_dqdk_specialized",
             "scores": "gluon_scores", "recompute warp-specialised": "recompute_specialized"}[what.split(",")[0]]
    flags = {field: True, "gluon_dqdk": True} if field == "gluon_dqdk_specialized" else {field: True}
    shape = DeltaBackwardShape(32 if "block_v 32" in what else 64, 4, 4, "test",
                               group_in_kernel="in the kernel" in what, **flags)
    with pytest.raises(ValueError, match=field):
        build_delta_backward(q, k, v, None, beta, do, None, scale=1.0, initial_state=None,
                             use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_indices=None, chunk_offsets=None,
                             shape=TEST_SHAPE, backward_shape=shape, num_householder=M)


def test_gdp_training_with_descriptors_builds_none(monkeypatch):
    """Gated Delta Product through autograd with the forward's descriptors: the backward takes the
    expanded stream's from them (no host read of cu_seqlens), and its gradients are the reference's."""
    import recurscan
    import recurscan.descriptors as descriptors
    from tests.helpers.inputs import gdp_inputs
    M, T = 2, 70
    cu = torch.tensor([0, 1, 40, 70])
    d = build_chunk_descriptors(cu, M, device=DEVICE)
    x = [t.float().to(DEVICE).requires_grad_() for t in gdp_inputs(T, M, 1, 2, 16, 16, seed=4)[:5]]

    def refuse(*args, **kwargs):
        raise AssertionError("descriptors built although the call passed them")

    monkeypatch.setattr(descriptors, "build_chunk_descriptors", refuse)
    o, _ = recurscan.chunk_gated_delta_product_varlen(*x, M, cu.to(DEVICE), use_qk_l2norm_in_kernel=True,
                                                      backend="triton", **d.as_kwargs())
    do = torch.randn_like(o)
    got = torch.autograd.grad(o, x, do)
    from recurscan.reference.delta_backward import gated_delta_product_chunked_backward
    want = gated_delta_product_chunked_backward(*(t.detach().double().cpu() for t in x), M, do.double().cpu(),
                                                use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    for name, a, b in zip(NAMES, got, want):
        assert relative_rms(a.double().cpu(), b) < 1e-5, name


@pytest.mark.parametrize("backward_shape", [None, NARROW, SEGMENTED, GROUPED, ONE_LAUNCH],
                         ids=["planned", "narrow", "split", "grouped", "one-launch"])
def test_every_backward_launch_names_every_kernel_argument(backward_shape):
    """The direct launcher fills a kernel's parameters by name, defaults included: every launch of
    the backward (its forward recompute too) names every argument of its kernel."""
    from recurscan.launch.delta_backward import build_delta_backward
    from recurscan.launch.delta import TEST_SHAPE
    from recurscan.plan.delta import delta_backward_shape
    q, k, v, g, beta, S0 = (x.float() for x in gdn_inputs(1, 130, 1, 2, 16, 16, seed=9))
    cu = torch.tensor([0, 60, 130])
    d = build_chunk_descriptors(cu)
    h0 = S0.expand(2, -1, -1, -1).contiguous()  # two sequences
    launches = build_delta_backward(q, k, v, g, beta, torch.zeros_like(v), torch.zeros_like(h0), scale=0.25,
                                    initial_state=h0, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                    chunk_indices=d.chunk_indices,
                                    chunk_offsets=d.chunk_offsets, shape=TEST_SHAPE,
                                    backward_shape=backward_shape or delta_backward_shape(4, 16, q.device))
    for step in launches.forward.steps + launches.steps:
        missing = [a for a in step.kernel.arg_names if a not in step.kwargs]
        assert not missing, f"{getattr(step.kernel, 'fn', step.kernel).__name__}: {missing}"


@pytest.mark.parametrize("backward_shape", [None, NARROW, SEGMENTED, GROUPED, ONE_LAUNCH],
                         ids=["planned", "narrow", "split", "grouped", "one-launch"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs(dtype, backward_shape):
    """bf16 / fp16 inputs (the buffers the stages hand each other then are 16-bit too), GVA and
    varlen with a one-token sequence: every gradient within the 16-bit band of the float64 reference."""
    q, k, v, g, beta, _ = gdn_inputs(1, 130, 1, 2, 32, 48, seed=3)
    cu = torch.tensor([0, 1, 70, 130])
    d = build_chunk_descriptors(cu, device=DEVICE)
    gen = torch.Generator().manual_seed(4)
    h0 = torch.randn(3, 2, 32, 48, dtype=torch.float64, generator=gen) * 0.1
    do = torch.randn(1, 130, 2, 48, dtype=torch.float64, generator=gen)
    want = gated_delta_rule_chunked_backward(q, k, v, g, beta, do, None, initial_state=h0,
                                             use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    low = lambda x: x.to(DEVICE, dtype)  # noqa: E731
    got = chunk_delta_bwd(low(q), low(k), low(v), g.float().to(DEVICE), low(beta), low(do), None,
                          initial_state=h0.float().to(DEVICE), use_qk_l2norm_in_kernel=True, cu_seqlens=cu.to(DEVICE),
                          chunk_indices=d.chunk_indices, chunk_offsets=d.chunk_offsets, backward_shape=backward_shape)
    for name, a, b in zip(NAMES, got, want):
        assert relative_rms(a.double().cpu(), b) < 1e-2, name


@pytest.mark.parametrize("M, cu, every", [(1, None, 0), (1, None, 2), (1, [0, 1, 130], 0), (2, [0, 1, 130], 0)],
                         ids=["GDN dense", "GDN dense from checkpoints", "GDN varlen", "GDP varlen"])
def test_the_forward_starts_the_backward_compiling(monkeypatch, M, cu, every):
    """On a signature's first forward under autograd, compile_backward_early builds the backward's
    launches and hands every kernel of them (the recompute's and the stages') to the background
    compiler, every buffer they take with a stand-in (the forward's checkpoints too: a compile
    handed None for them compiled another kernel, and the first backward compiled its own, 2 s
    later at B1 T16384 on the H200); the backward then finds those launches (none built twice),
    waits for the compiles and gives the gradients the reference does. The compiler itself is
    recorded here: the interpreter compiles nothing."""
    import recurscan.launch.delta_backward as lb
    from recurscan.launch.delta import TEST_SHAPE
    handed, waited = [], []
    monkeypatch.setattr(lb, "INTERPRET", False)
    monkeypatch.setattr(lb, "compile_in_background",
                        lambda launches, names, values, device: handed.append((launches, names, values))
                        or (lambda: waited.append(1)))
    q, k, v, g, beta, S0 = (x.float() for x in gdn_inputs(1, 130, 1, 2, 16, 16, seed=11))
    if M > 1:
        k, v, beta = (x.repeat_interleave(M, dim=1) * (0.9 if x is k else 1.0) for x in (k, v, beta))
    cu_t = None if cu is None else torch.tensor(cu)
    N = 1 if cu is None else len(cu) - 1
    h0 = S0.expand(N, -1, -1, -1).contiguous()
    d = None if cu is None else build_chunk_descriptors(cu_t, M)
    desc = {} if d is None else dict(chunk_indices=d.chunk_indices_dp if M > 1 else d.chunk_indices,
                                     chunk_offsets=d.chunk_offsets)
    o, final = torch.zeros(1, 130, 2, 16), torch.zeros(N, 2, 16, 16)
    signature = ("test", M, cu is None, every)
    lb.EARLY_SIGNATURES.discard(signature)
    before = len(lb.BACKWARD_LAUNCHES)
    lb.compile_backward_early(signature, q, k, v, g, beta, o, final, num_householder=M, scale=0.25,
                              initial_state=h0, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_t, shape=TEST_SHAPE,
                              checkpoint_chunks=every, **desc)
    assert len(lb.BACKWARD_LAUNCHES) == before + 1 and len(handed) == 2
    built = list(lb.BACKWARD_LAUNCHES.values())[-1]
    assert [launch[0] for launch in handed[0][0]] == [s.kernel for s in built.forward.steps]
    assert [launch[0] for launch in handed[1][0]] == [s.kernel for s in built.steps]
    buffers = set(built.forward.buffers) | set(built.buffers) | {"states", "winv", "aqk", "coef", "checkpoints"}
    for launches, names, values in handed:  # every buffer a kernel reads or writes has a stand-in
        for kernel, grid, kwargs, options in launches:
            for arg in kwargs.values():
                if isinstance(arg, lb.CallArg):
                    assert arg in names and (arg not in buffers or values[names.index(arg)] is not None), arg
    lb.compile_backward_early(signature, q, k, v, g, beta, o, final, num_householder=M, scale=0.25, initial_state=h0,
                              use_qk_l2norm_in_kernel=True, cu_seqlens=cu_t, shape=TEST_SHAPE,
                              checkpoint_chunks=every, **desc)
    assert len(handed) == 2  # a signature's later forwards start nothing
    ckpt = {}
    if every:  # the forward's checkpoints, as a forward under autograd keeps them
        from recurscan.launch.delta import DeltaInputs, build_delta_launches, run_delta_launches
        fwd = build_delta_launches(q, k, v, g, beta, TEST_SHAPE, scale=0.25, initial_state=h0,
                                   use_qk_l2norm_in_kernel=True, checkpoint_chunks=every)
        ckpt = dict(checkpoints=run_delta_launches(fwd, DeltaInputs(q, k, v, g, beta, h0, *[None] * 5))[-1],
                    checkpoint_chunks=every)
    do, dht = torch.randn(1, 130, 2, 16), torch.randn(N, 2, 16, 16)
    if M > 1:
        got = lb.chunk_delta_product_bwd(q, k, v, g, beta, M, do, dht, scale=0.25, initial_state=h0,
                                         use_qk_l2norm_in_kernel=True, cu_seqlens=cu_t, shape=TEST_SHAPE,
                                         chunk_indices_dp=d.chunk_indices_dp)
    else:
        got = lb.chunk_delta_bwd(q, k, v, g, beta, do, dht, scale=0.25, initial_state=h0, use_qk_l2norm_in_kernel=True,
                                 cu_seqlens=cu_t, shape=TEST_SHAPE, **desc, **ckpt)
    assert len(lb.BACKWARD_LAUNCHES) == before + 1 and waited == [1, 1] and built.pending is None
    if M == 1:
        want = gated_delta_rule_chunked_backward(*(t.double() for t in (q, k, v, g, beta, do)), dht.double(),
                                                 scale=0.25, initial_state=h0.double(), use_qk_l2norm_in_kernel=True,
                                                 cu_seqlens=cu_t)
        for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want):
            assert relative_rms(a.double(), b) < 1e-4, name


@pytest.mark.parametrize("M, cu, HV", [(1, None, 2), (1, [0, 1, 70, 130], 4), (2, [0, 1, 40, 70], 2)],
                         ids=["GDN dense", "GDN varlen, GVA", "GDP varlen"])
def test_the_backward_starts_compiling_from_stand_ins_of_the_outputs(monkeypatch, M, cu, HV):
    """Through the public ops: the forward starts the backward compiling before it runs, from
    stand-ins of its outputs, so the stand-ins must have the outputs' signature (shape, strides,
    dtype, device), the one dO and dht then carry: else the backward builds its launches again
    and the early compiles are lost (the cold first call: docs/kernels-delta-backward.md)."""
    import recurscan.autograd.delta as autograd_delta
    from recurscan.launch.delta_backward import output_stand_ins
    from recurscan.runtime.cache import launch_key
    seen = []
    monkeypatch.setattr(autograd_delta, "compile_backward_early", lambda signature, q, k, v, g, beta, **kw: seen.append(
        (output_stand_ins(q, k, v, kw["cu_seqlens"]), kw["prep_kept"])))
    x, kw = _op_call(M, cu, HV, seed=6)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        o, final = _op(M)(*(t.requires_grad_() for t in x), output_final_state=True, **kw)
    (((o_like, final_like), prep_kept),) = seen
    assert launch_key((o_like, final_like)) == launch_key((o.detach(), final.detach()))
    assert prep_kept == (len(saved) > 6)  # the forward kept its prep exactly when it said it would



@pytest.mark.parametrize("misfit", ["q 2 bytes off 16-byte alignment", "v 2 bytes off 16-byte alignment",
                                    "dO in float32"])
def test_a_call_the_planned_gluon_twins_cannot_take_builds_the_triton_backward(monkeypatch, misfit):
    """Where the planner gives the backward's stages to their Gluon twins (here: as on the H200) and
    the call cannot take them (launch.delta_backward._gluon_takes), the launches are the Triton
    kernels'."""
    from recurscan.launch import delta_backward
    from recurscan.plan import delta as plan_delta
    monkeypatch.setattr(plan_delta, "gluon_usable", lambda device: True)
    gen = torch.Generator().manual_seed(5)
    base = torch.randn(1 + 64 * 2 * 128, generator=gen).bfloat16()
    q = base[1:].view(1, 64, 2, 128) if misfit.startswith("q") else base[:-1].view(1, 64, 2, 128)
    k = torch.randn(1, 64, 2, 128, generator=gen).bfloat16()
    v = torch.randn(1 + 64 * 2 * 64, generator=gen).bfloat16()
    v = v[1:].view(1, 64, 2, 64) if misfit.startswith("v") else v[:-1].view(1, 64, 2, 64)
    do = torch.randn(1, 64, 2, 64, generator=gen, dtype=torch.float32 if "float32" in misfit else torch.bfloat16)
    g = -torch.rand(1, 64, 2, generator=gen)
    planned = plan_delta.gluon_twins(plan_delta.DeltaBackwardShape(64, 4, 4, "test"), householder=1, heads=2,
                                     value_heads=2, key_dim=128, value_dim=64, dtype=torch.bfloat16,
                                     device=torch.device("cpu"))
    assert planned.gluon_sweep  # the reverse sweep's twin, as planned on the H200
    planned = dataclasses.replace(planned, gluon_scores=True)  # and the warp-specialised scores kernel
    launches, _ = delta_backward._backward_call(
        q, k, v, g, None, do, None, num_householder=1, scale=None, initial_state=None, use_qk_l2norm_in_kernel=False,
        cu_seqlens=None, chunk_indices=None, chunk_offsets=None, shape=None, backward_shape=planned,
        prep_kept=False)
    names = [getattr(s.kernel, "fn", s.kernel).__name__ for s in launches.steps]
    assert names and not [n for n in names if n.startswith("gluon")], names


@pytest.mark.parametrize("key_dim", [64, 128])
def test_the_gluon_twins_are_refused_where_a_descriptor_row_passes_int32(key_dim):
    """The Gluon twins address the chunk states (K rows a chunk and value head) and the scratch (2 x
    64 rows) through int32 descriptor coordinates: a call whose rows would pass 2^31 in either takes
    the Triton kernels (at K = 64 the scratch's bound is the tighter)."""
    from recurscan.launch.delta_backward import _gluon_takes
    q = k = torch.zeros(1, 64, 1, key_dim, dtype=torch.bfloat16)
    v = do = torch.zeros(1, 64, 1, 128, dtype=torch.bfloat16)
    heads = 64
    fits = (2 ** 31 - 1) // (heads * 128)  # chunk rows whose coordinates stay under 2^31 at 128 rows each
    for rows, ok in ((fits, True), (fits + 1, False)):
        chunk_indices = torch.zeros(1, 2, dtype=torch.int32).expand(rows, 2)  # no memory behind the rows
        assert _gluon_takes(q, k, v, do, chunk_indices, heads) is ok, (rows, ok)
