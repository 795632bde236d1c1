"""Gradients through the Triton path on the GPU at the models' head sizes, bf16 inputs: every
gradient against autograd through the float64 oracle on the same (bf16-rounded) inputs, within the
16-bit band (relative RMS 1e-2, as the property test's bf16 cases). The float64 token loops run on
the GPU too (on the CPU, at T = 1000 with 128 x 128 states, their autograd took minutes)."""
import pytest
import torch

import recurscan
from recurscan.reference.delta import gated_delta_rule_naive
from tests.helpers.tolerances import relative_rms

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cu, every", [(None, None), (None, 4), ([0, 1, 300, 1000], None)],
                         ids=["dense", "dense from checkpoints", "varlen"])
def test_gdn_gradients_bf16(monkeypatch, cu, every):
    """``every``: the forward keeps every 4th chunk's state and the backward recomputes the chunk
    states from them (plan.delta.checkpoint_chunks_for_backward, forced here)."""
    from recurscan.plan import delta as plan_delta
    from recurscan.runtime.cache import clear_caches
    if every is not None:
        clear_caches()  # the signature's launches, planned with the checkpoints
        monkeypatch.setattr(plan_delta, "checkpoint_chunks_for_backward", lambda problem, device: every)
    gen = torch.Generator().manual_seed(0)
    T, H, HV, K, V = 1000, 4, 8, 128, 128
    N = 1 if cu is None else len(cu) - 1
    x = dict(q=torch.randn(1, T, H, K, generator=gen), k=torch.randn(1, T, H, K, generator=gen),
             v=torch.randn(1, T, HV, V, generator=gen),
             g=torch.nn.functional.logsigmoid(torch.randn(1, T, HV, generator=gen) + 3),
             beta=torch.rand(1, T, HV, generator=gen), h0=torch.randn(N, HV, K, V, generator=gen) * 0.1)
    x = {n: (t.bfloat16() if n in ("q", "k", "v", "beta") else t) for n, t in x.items()}
    do = torch.randn(1, T, HV, V, generator=gen)
    dht = torch.randn(N, HV, K, V, generator=gen)
    cu_t = None if cu is None else torch.tensor(cu)

    def grads(device, dtype_of, op):
        leaves = [t.to(device=device, dtype=dtype_of(t)).requires_grad_() for t in x.values()]
        o, S = op(*leaves[:5], initial_state=leaves[5], use_qk_l2norm_in_kernel=True,
                  cu_seqlens=None if cu_t is None else cu_t.to(device))
        return torch.autograd.grad((o, S), leaves, (do.to(device, o.dtype), dht.to(device, S.dtype)))

    got = grads("cuda", lambda t: t.dtype, lambda *a, **kw: recurscan.chunk_gated_delta_rule(
        *a, output_final_state=True, **kw))
    if every is not None:  # it did recompute from them: one PASS 2 sweep over the segments
        from recurscan.kernels.delta.sweep import chunk_delta_sweep_kernel
        from recurscan.launch.delta_backward import BACKWARD_LAUNCHES
        (launches,) = BACKWARD_LAUNCHES.values()
        assert [s.kwargs["PASS"] for s in launches.forward.steps if s.kernel is chunk_delta_sweep_kernel] == [2]
        clear_caches()
    want = grads("cuda", lambda t: torch.float64, gated_delta_rule_naive)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want):
        assert torch.isfinite(a).all(), name
        assert relative_rms(a.double(), b) < 1e-2, f"{name}: relative RMS {relative_rms(a.double(), b):.2e}"


def test_gdp_gradients_bf16():
    """Gated Delta Product M = 2 on the GPU, varlen with a one-token sequence, against the float64
    token loop: the expanded stream's backward and the gathers back onto the token stream."""
    from recurscan.reference.delta import gated_delta_product_naive
    gen = torch.Generator().manual_seed(1)
    T, M, H, HV, K, V = 600, 2, 2, 4, 128, 128
    cu = torch.tensor([0, 1, 250, 600])
    N = len(cu) - 1
    x = dict(q=torch.randn(1, T, H, K, generator=gen), k=torch.randn(1, T * M, H, K, generator=gen),
             v=torch.randn(1, T * M, HV, V, generator=gen),
             g=torch.nn.functional.logsigmoid(torch.randn(1, T, HV, generator=gen) + 3),
             beta=torch.rand(1, T * M, HV, generator=gen), h0=torch.randn(N, HV, K, V, generator=gen) * 0.1)
    x = {n: (t.bfloat16() if n in ("q", "k", "v", "beta") else t) for n, t in x.items()}
    do = torch.randn(1, T, HV, V, generator=gen)
    dht = torch.randn(N, HV, K, V, generator=gen)

    def grads(device, dtype_of, op):
        leaves = [t.to(device=device, dtype=dtype_of(t)).requires_grad_() for t in x.values()]
        o, S = op(*leaves[:5], M, initial_state=leaves[5], use_qk_l2norm_in_kernel=True,
                  cu_seqlens=cu.to(device), output_final_state=True)
        return torch.autograd.grad((o, S), leaves, (do.to(device, o.dtype), dht.to(device, S.dtype)))

    got = grads("cuda", lambda t: t.dtype, recurscan.chunk_gated_delta_product_varlen)
    want = grads("cuda", lambda t: torch.float64,
                 lambda *a, output_final_state, **kw: gated_delta_product_naive(*a, **kw))
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want):
        assert torch.isfinite(a).all(), name
        assert relative_rms(a.double(), b) < 1e-2, f"{name}: relative RMS {relative_rms(a.double(), b):.2e}"


def _gdp_batch(M, B=1, T=600, H=2, HV=4, K=128, seed=2):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    return [rn(B, T, H, K).bfloat16(), rn(B, T * M, H, K).bfloat16(), rn(B, T * M, HV, K).bfloat16(),
            torch.nn.functional.logsigmoid(rn(B, T, HV) + 3),
            torch.rand(B, T * M, HV, device="cuda", generator=gen).bfloat16()]


@pytest.mark.parametrize("M", [1, 2])
def test_training_step_with_descriptors_is_sync_free(M):
    """Forward + backward through the varlen ops with the descriptors passed: no host
    synchronisation after the first call (which compiles)."""
    cu = torch.tensor([0, 1, 250, 600], device="cuda", dtype=torch.int32)
    desc = recurscan.build_chunk_descriptors(cu, M, device="cuda").as_kwargs()
    x = [t.requires_grad_() for t in _gdp_batch(M)]

    def step():
        o, S = recurscan.chunk_gated_delta_product_varlen(*x, M, cu, use_qk_l2norm_in_kernel=True,
                                                          output_final_state=True, **desc)
        torch.autograd.grad((o.float().sum() + S.sum()), x)

    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_parallel_stage_warps_on_the_gpu():
    """The parallel stage at 4 warps (the planner's) and 8, against the float64 oracle at the
    models' head sizes, GVA and varlen: the numbers the planner's choice between them rests on."""
    from recurscan.descriptors import build_chunk_descriptors
    from recurscan.launch.delta_backward import chunk_delta_bwd
    from recurscan.plan.delta import DeltaBackwardShape
    from recurscan.reference.delta_backward import gated_delta_rule_chunked_backward
    q, k, v, g, beta = _gdp_batch(1, T=1000, seed=3)
    cu = torch.tensor([0, 1, 300, 1000], device="cuda")
    d = build_chunk_descriptors(cu, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(4)
    do = torch.randn(v.shape, device="cuda", generator=gen).bfloat16()
    h0 = torch.randn(3, 4, 128, 128, device="cuda", generator=gen) * 0.1
    args = dict(initial_state=h0, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    for warps in (8, 4):
        shape = DeltaBackwardShape(32, 8, warps, "test")
        got = chunk_delta_bwd(q, k, v, g, beta, do, None, chunk_indices=d.chunk_indices, chunk_offsets=d.chunk_offsets,
                              backward_shape=shape, **args)
        want = gated_delta_rule_chunked_backward(*(t.double() for t in (q, k, v, g, beta, do)), None,
                                                 **dict(args, initial_state=h0.double()))
        for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want):
            assert torch.isfinite(a).all(), name
            assert relative_rms(a.double(), b) < 1e-2, f"{warps} warps, {name}: {relative_rms(a.double(), b):.2e}"


def test_dense_gated_delta_product_trains_on_the_gpu():
    """fla's dense signature at B = 2 against the float64 token loop: output and gradients."""
    from recurscan.reference.delta import gated_delta_product_naive
    M = 2
    x = [t.requires_grad_() for t in _gdp_batch(M, B=2, T=300, seed=5)]
    o, _ = recurscan.chunk_gated_delta_product(*x, M, use_qk_l2norm_in_kernel=True)
    do = torch.randn_like(o)
    got = torch.autograd.grad(o, x, do)
    y = [t.detach().double().requires_grad_() for t in x]
    want_o = gated_delta_product_naive(*y, M, use_qk_l2norm_in_kernel=True)[0]
    want = torch.autograd.grad(want_o, y, do.double())
    assert relative_rms(o.double(), want_o.detach()) < 1e-2
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), got, want):
        assert relative_rms(a.double(), b) < 1e-2, name


def test_gdn_gradients_at_the_benchmark_size():
    """B1 T4096 H=HV=16 K=V=128, bf16, through the public op: every gradient against the float64
    chunkwise reference run on the GPU (the size the benchmarks time, where a miscompile that
    small shapes miss would show)."""
    from recurscan.reference.delta_backward import gated_delta_rule_chunked_backward
    gen = torch.Generator(device="cuda").manual_seed(6)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    B, T, H, K = 1, 4096, 16, 128
    x = [rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(),
         torch.nn.functional.logsigmoid(rn(B, T, H) + 3), torch.rand(B, T, H, device="cuda", generator=gen).bfloat16()]
    leaves = [t.clone().requires_grad_() for t in x]
    o, _ = recurscan.chunk_gated_delta_rule(*leaves, use_qk_l2norm_in_kernel=True)
    do = rn(B, T, H, K).bfloat16()
    got = torch.autograd.grad(o, leaves, do)
    want = gated_delta_rule_chunked_backward(*(t.double() for t in x), do.double(), use_qk_l2norm_in_kernel=True)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), got, want):
        assert torch.isfinite(a).all(), name
        assert relative_rms(a.double(), b) < 1e-2, f"{name}: relative RMS {relative_rms(a.double(), b):.2e}"


@pytest.mark.parametrize("every", [0, 16], ids=["one pass", "from checkpoints"])
def test_the_recompute_on_a_side_stream_gives_the_serial_bits(monkeypatch, every):
    """``DeltaBackwardShape.corun`` on the GPU at B1 T16384 H16 HV32 (the recompute on a side
    stream beside the reverse sweep, really concurrent here): every gradient bit for bit as the
    serial order's, eager, and replayed from a CUDA graph captured with it (the fork and the join
    captured as the graph's edges)."""
    from recurscan.plan import delta as plan_delta
    from tests.helpers.plan import grads_serial_and_corun
    gen = torch.Generator(device="cuda").manual_seed(9)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    B, T, H, HV, K = 1, 16384, 16, 32, 128
    x = [rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, HV, K).bfloat16(),
         torch.nn.functional.logsigmoid(rn(B, T, HV) + 3), torch.rand(B, T, HV, device="cuda", generator=gen).bfloat16()]
    do = rn(B, T, HV, K).bfloat16()
    monkeypatch.setattr(plan_delta, "checkpoint_chunks_for_backward", lambda problem, device: every)
    runs = grads_serial_and_corun(
        monkeypatch, lambda *t: recurscan.chunk_gated_delta_rule(*t, use_qk_l2norm_in_kernel=True), x, lambda o: do)
    grads = {corun: g for corun, (g, _) in runs.items()}
    assert [taken for _, taken in runs.values()] == [False, True]
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), grads[False], grads[True]):
        assert torch.equal(a, b), name
    # Forward and backward captured (still planned with corun, the helper's last run), as
    # whole-network capture does.
    leaves = [t.clone().requires_grad_() for t in x]

    def step():
        o, _ = recurscan.chunk_gated_delta_rule(*leaves, use_qk_l2norm_in_kernel=True)
        return torch.autograd.grad(o, leaves, do)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on another stream, as torch.cuda.graphs asks
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), captured, grads[True]):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("B, H, HV, K, V", [(4, 8, 16, 128, 128), (4, 8, 8, 128, 256), (1, 4, 8, 64, 64)],
                         ids=["B4 T4096 HV16 V128", "B4 T4096 HV8 V256", "B1 T4096 GVA K=V=64"])
def test_the_backward_gives_the_same_bits_every_run(B, H, HV, K, V):
    """Four forward + backward runs of one input, T4096 bf16: every gradient bit for bit the same.
    The dk kernel's pipelined value loop once read an operand's shared memory while the next
    stage's copy overwrote it (Triton 3.6 on the H200): 2.5% of dk's elements and 5% of dg's
    changed from run to run, small enough to pass the oracle's tolerance. V 256: the scores
    kernel's value loop takes two steps. K = V = 64 under GVA: dq's launch of its own, whose two
    steps of 32 columns gave other dq and dg bits from run to run (plan.delta.DQ_LAUNCH_MIN_V32)."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    T = 4096
    x = [rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, HV, V).bfloat16(),
         torch.nn.functional.logsigmoid(rn(B, T, HV) + 3), torch.rand(B, T, HV, device="cuda", generator=gen).bfloat16()]
    do = rn(B, T, HV, V).bfloat16()
    leaves = [t.clone().requires_grad_() for t in x]
    runs = []
    for _ in range(4):
        o, _ = recurscan.chunk_gated_delta_rule(*leaves, use_qk_l2norm_in_kernel=True)
        runs.append(torch.autograd.grad(o, leaves, do))
    for run in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), runs[0], run):
            assert torch.equal(a, b), f"{name}: {int((a != b).sum())} elements differ"


@pytest.mark.parametrize("H, HV, cu", [(16, 16, None), (8, 16, None), (8, 16, [0, 1, 3000, 8192])],
                         ids=["B2 T4096 H=HV=16", "GVA HV=2H", "varlen, a one-token sequence"])
def test_dk_then_dq_in_one_launch_gives_the_two_launches_bits(H, HV, cu):
    """``DeltaBackwardShape.dqdk_one_launch`` (dk's pass, then dq's, in one program) at the models'
    head sizes, bf16: every gradient bit for bit as dk's and dq's launches apart (the same products
    in the same order), and within the oracle's band of the float64 chunkwise reference."""
    from recurscan.descriptors import build_chunk_descriptors
    from recurscan.launch.delta_backward import chunk_delta_bwd
    from recurscan.plan.delta import DeltaBackwardShape
    from recurscan.reference.delta_backward import gated_delta_rule_chunked_backward
    gen = torch.Generator(device="cuda").manual_seed(12)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    B, T, K = (2, 4096, 128) if cu is None else (1, 8192, 128)
    q, k, v = rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, HV, K).bfloat16()
    g = torch.nn.functional.logsigmoid(rn(B, T, HV) + 3)
    beta = torch.rand(B, T, HV, device="cuda", generator=gen).bfloat16()
    do = rn(B, T, HV, K).bfloat16()
    args = dict(use_qk_l2norm_in_kernel=True)
    if cu is not None:
        cu_t = torch.tensor(cu, device="cuda", dtype=torch.int32)
        d = build_chunk_descriptors(cu_t, device="cuda")
        args.update(cu_seqlens=cu_t, chunk_indices=d.chunk_indices, chunk_offsets=d.chunk_offsets)
    shapes = {one: DeltaBackwardShape(64, 4, 4, "test", grads_block_v=32, scores_warps=4, scores_block_v=128,
                                      group_in_kernel=True, dqdk_one_launch=one) for one in (False, True)}
    got = {one: chunk_delta_bwd(q, k, v, g, beta, do, None, backward_shape=shape, **args)
           for one, shape in shapes.items()}
    names = ("dq", "dk", "dv", "dg", "dbeta")
    for name, a, b in zip(names, got[False], got[True]):
        assert torch.equal(a, b), f"{name}: {int((a != b).sum())} elements differ"
    want = gated_delta_rule_chunked_backward(*(t.double() for t in (q, k, v, g, beta, do)), None,
                                             **{n: a for n, a in args.items() if n in ("use_qk_l2norm_in_kernel",
                                                                                       "cu_seqlens")})
    for name, a, b in zip(names, got[True], want):
        assert torch.isfinite(a).all(), name
        assert relative_rms(a.double(), b) < 1e-2, f"{name}: relative RMS {relative_rms(a.double(), b):.2e}"


def _twin_case(B, T, H, HV, cu, l2norm, seed, device="cuda", K=128, V=128):
    """A Gluon-twin comparison's inputs, bf16 (K = V = 128 unless given) with an initial state and
    dht: ``(x, args)``, x = (q, k, v, g, beta, dO, dht) and args chunk_delta_bwd's keywords (varlen
    descriptors built from ``cu``)."""
    from recurscan.descriptors import build_chunk_descriptors
    gen = torch.Generator(device=device).manual_seed(seed)
    rn = lambda *s: torch.randn(*s, device=device, generator=gen)  # noqa: E731
    N = B if cu is None else len(cu) - 1
    q, k, v = rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, HV, V).bfloat16()
    if not l2norm:
        q, k = (t * K ** -0.5 for t in (q, k))
    g = torch.nn.functional.logsigmoid(rn(B, T, HV) + 3)
    beta = torch.rand(B, T, HV, device=device, generator=gen).bfloat16()
    do = rn(B, T, HV, V).bfloat16()
    h0, dht = rn(N, HV, K, V) * 0.1, rn(N, HV, K, V)
    args = dict(use_qk_l2norm_in_kernel=l2norm, initial_state=h0)
    if cu is not None:
        cu_t = torch.tensor(cu, device=device, dtype=torch.int32)
        d = build_chunk_descriptors(cu_t, device=device)
        args.update(cu_seqlens=cu_t, chunk_indices=d.chunk_indices, chunk_offsets=d.chunk_offsets)
    return (q, k, v, g, beta, do, dht), args


def _twin_runs(x, args, stages=3, **twin):
    """chunk_delta_bwd's gradients ``(dq, dk, dv, dg, dbeta, dh0)`` with the Triton kernels (False)
    and with the twin named in ``twin`` (True; dq and dk's on a ring of ``stages``); the planner's
    B4 shape otherwise. Asserts that the
    run with the twin launched its Gluon kernel (a fallback to the Triton one would pass the
    comparisons) and the other run none."""
    from recurscan.kernels.gluon.delta_backward_dqdk import gluon_bwd_dqdk_kernel
    from recurscan.kernels.gluon.delta_backward_dqdk_specialized import gluon_bwd_dqdk_specialized_kernel
    from recurscan.kernels.gluon.delta_backward_scores_specialized import gluon_bwd_scores_specialized_kernel
    from recurscan.kernels.gluon.delta_backward_sweep import gluon_bwd_sweep_kernel
    from recurscan.launch.delta_backward import BACKWARD_LAUNCHES, chunk_delta_bwd
    from recurscan.plan.delta import DeltaBackwardShape
    from recurscan.plan.device import gluon_usable
    from recurscan.runtime.cache import clear_caches
    if not gluon_usable(torch.device("cuda")):
        pytest.skip("Gluon twins run on sm_90 with a tested Triton (plan.device.gluon_usable)")
    kernels = dict(gluon_sweep=gluon_bwd_sweep_kernel, gluon_scores=gluon_bwd_scores_specialized_kernel,
                   gluon_dqdk=gluon_bwd_dqdk_specialized_kernel if twin.get("gluon_dqdk_specialized")
                   else gluon_bwd_dqdk_kernel)
    shape = dict(grads_block_v=32, scores_warps=4, scores_block_v=128, group_in_kernel=True, dqdk_one_launch=True,
                 sweep_stages=3, gluon_dqdk_stages=stages)
    got = {}
    for on in (False, True):
        clear_caches()
        got[on] = chunk_delta_bwd(*x, backward_shape=DeltaBackwardShape(64, 4, 4, "test", **shape,
                                                                        **{n: on for n in twin}), **args)
        (launches,) = BACKWARD_LAUNCHES.values()
        ran = {step.kernel for step in launches.steps}
        for name in twin:
            if name in kernels:
                assert (kernels[name] in ran) == on, f"{name}: the Gluon kernel {'did not run' if on else 'ran'}"
    clear_caches()
    return got


def _assert_like_the_oracle(x, args, grads):
    from recurscan.reference.delta_backward import gated_delta_rule_chunked_backward
    want = gated_delta_rule_chunked_backward(*(None if t is None else t.double() for t in x),
                                             initial_state=args["initial_state"].double(),
                                             use_qk_l2norm_in_kernel=args["use_qk_l2norm_in_kernel"],
                                             cu_seqlens=args.get("cu_seqlens"))
    for name, a, b in zip(GRAD_NAMES, grads, want):
        if b is None:  # no decay given: no dg
            assert a is None, name
            continue
        assert torch.isfinite(a).all(), name
        assert relative_rms(a.double(), b) < 1e-2, f"{name}: relative RMS {relative_rms(a.double(), b):.2e}"


GRAD_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


#: How far a Gluon form of the parallel stage may be from the Triton kernels (relative RMS; 0: the
#: same bits): dq and dk one bf16 rounding, dg float32's, the other kernels' gradients their bits;
#: dbeta float32's where the scores kernel is the Gluon one.
DQDK_BOUNDS = dict(dq=2 ** -8, dk=2 ** -8, dg=1e-5, dv=0.0, dbeta=0.0, dh0=0.0)
SCORES_BOUNDS = dict(DQDK_BOUNDS, dbeta=1e-5)


def _check_form(x, args, bounds, stages=3, **twin):
    """The run with the Gluon forms named in ``twin`` within ``bounds`` of the Triton kernels', and
    within the oracle's band of the float64 chunkwise reference."""
    got = _twin_runs(x, args, stages, **twin)
    _assert_near_the_triton_kernels(got, bounds)
    _assert_like_the_oracle(x, args, got[True])


def _assert_near_the_triton_kernels(got, bounds):
    """Each gradient of the run with a Gluon kernel (``got[True]``) within ``bounds[name]`` (relative
    RMS; 0: the same bits) of the run with the Triton kernels (``got[False]``); None in both where
    the input was None."""
    for name, a, b in zip(GRAD_NAMES, got[False], got[True]):
        if a is None:
            assert b is None, name
            continue
        err = relative_rms(b.double(), a.double())
        assert err <= bounds[name], f"{name}: relative RMS {err:.2e} from the Triton twin's"


@pytest.mark.parametrize("B, T, H, HV, cu", [(2, 4096, 16, 16, None), (1, 4096, 8, 16, None), (3, 1000, 4, 8, None),
                                             (1, 8192, 8, 16, [0, 1, 3000, 3064, 8192])],
                         ids=["B2 T4096 H=HV=16", "GVA HV=2H", "a partial last chunk", "varlen, a one-token sequence"])
def test_the_gluon_reverse_sweep_gives_its_twins_bits(B, T, H, HV, cu):
    """The reverse sweep's Gluon twin (kernels/gluon/delta_backward_sweep.py, the Gluon rules in
    docs/kernels-gluon.md): every gradient, dh0 among them (an initial state and dht given), bit for
    bit the Triton sweep's (the same products in the same order), and within the oracle's band of the
    float64 chunkwise reference."""
    x, args = _twin_case(B, T, H, HV, cu, True, seed=21)
    got = _twin_runs(x, args, gluon_sweep=True)
    for name, a, b in zip(GRAD_NAMES, got[False], got[True]):
        assert torch.equal(a, b), f"{name}: {int((a != b).sum())} elements differ"
    _assert_like_the_oracle(x, args, got[True])


#: How far the Gluon reverse sweep's Gated Delta Product form may be from the Triton sweep's gradients
#: (relative RMS): its query-side products sum a chunk's 32 query rows where the Triton kernel sums
#: 64 rows, half of them zero, so dU differs by float32 rounding, and what the chain rounds to 16
#: bits each chunk (dS, dU, dY, dv) may then round the other way: one bf16 rounding.
GDP_SWEEP_BOUND = 2 ** -8


@pytest.mark.parametrize("B, T, H, HV, cu, K", [
    (2, 2048, 8, 8, None, 128), (1, 1000, 2, 4, None, 128), (1, 1500, 2, 4, [0, 1, 700, 733, 1500], 128),
    (1, 1000, 2, 4, [0, 1, 700, 1000], 64)],
    ids=["B2 T2048 H=HV=8", "GVA, a partial last chunk", "varlen, a one-token sequence", "K 64, varlen"])
def test_the_gluon_reverse_sweep_for_gdp_agrees_with_its_twin(B, T, H, HV, cu, K):
    """The reverse sweep's Gluon twin at M = 2 (Gated Delta Product: q, dO and aqk's query rows read
    by token): every gradient within one bf16 rounding of the Triton sweep's (GDP_SWEEP_BOUND), dh0
    among them (an initial state and dht given); at the smaller sizes also within the oracle's band
    of the float64 token loop."""
    from recurscan.kernels.gluon.delta_backward_sweep import gluon_bwd_sweep_kernel
    _check_gdp_form(B, T, H, HV, cu, K, "gluon_sweep", gluon_bwd_sweep_kernel, dict.fromkeys(GRAD_NAMES,
                                                                                            GDP_SWEEP_BOUND))


@pytest.mark.parametrize("B, T, H, HV, cu, K, l2norm, decay", [
    (2, 2048, 8, 8, None, 128, True, True), (3, 1000, 2, 2, None, 128, True, True),
    (1, 1500, 4, 4, [0, 1, 700, 733, 1500], 128, True, True), (2, 1024, 4, 4, None, 128, False, True),
    (1, 1000, 2, 2, [0, 1, 700, 1000], 64, True, True),
    (1, 1000, 2, 2, [0, 1, 700, 1000], 128, True, False)],
    ids=["B2 T2048 H=HV=8", "a partial last chunk", "varlen, a one-token sequence", "no l2norm", "K 64, varlen",
         "no decay"])
def test_the_gluon_dq_dk_kernel_for_gdp_agrees_with_its_twin(B, T, H, HV, cu, K, l2norm, decay):
    """dq and dk's Gluon twin at M = 2 (Gated Delta Product: a chunk's 32 tokens of q, dO and
    (dscores o G)'s query rows read by token into the first rows of their tiles, the other rows
    zero; dg joined from each token's first copy): dq and dk within one bf16 rounding of the Triton
    kernel's, dg float32's, the other kernels' gradients their bits (DQDK_BOUNDS); at the smaller
    sizes also within the oracle's band of the float64 token loop."""
    from recurscan.kernels.gluon.delta_backward_dqdk import gluon_bwd_dqdk_kernel
    _check_gdp_form(B, T, H, HV, cu, K, "gluon_dqdk", gluon_bwd_dqdk_kernel, DQDK_BOUNDS, l2norm, decay)


@pytest.mark.parametrize("B, T, H, HV, cu, K, l2norm, decay", [
    (2, 2048, 8, 8, None, 128, True, True), (3, 1000, 2, 2, None, 128, True, True),
    (1, 1500, 4, 4, [0, 1, 700, 733, 1500], 128, True, True), (2, 1024, 4, 4, None, 128, False, True),
    (1, 1000, 2, 4, [0, 1, 700, 1000], 64, True, True), (1, 1000, 2, 2, [0, 1, 700, 1000], 128, True, False),
    (1, 1000, 2, 4, None, 128, True, True)],
    ids=["B2 T2048 H=HV=8", "a partial last chunk", "varlen, a one-token sequence", "no l2norm", "K 64, GVA varlen",
         "no decay", "GVA, a partial last chunk"])
def test_the_gluon_scores_kernel_for_gdp_agrees_with_its_twin(B, T, H, HV, cu, K, l2norm, decay):
    """The warp-specialised scores kernel at M = 2 (Gated Delta Product: a chunk's rows copy-major,
    each token's query copy first; q and dO by token into the first half of their tiles): the
    products of the Triton kernel with their rows and columns in that order, the row sums (dbeta's,
    dg's) in another order. So dv and dh0 are the same bits, dbeta and dg agree to float32 rounding,
    dq and dk (from the score tiles, stored in bf16) to within one bf16 rounding (SCORES_BOUNDS); at
    the smaller sizes also within the oracle's band of the float64 token loop."""
    from recurscan.kernels.gluon.delta_backward_scores_specialized import gluon_bwd_scores_specialized_kernel
    _check_gdp_form(B, T, H, HV, cu, K, "gluon_scores", gluon_bwd_scores_specialized_kernel, SCORES_BOUNDS, l2norm,
                    decay)


def _check_gdp_form(B, T, H, HV, cu, K, field, kernel, bounds, l2norm=True, decay=True, stages=3):
    """Gated Delta Product (M = 2, V = 128) gradients with the backward stage ``field`` as its Gluon
    ``kernel`` against the Triton kernels': each within ``bounds[name]`` (relative RMS; 0: the same
    bits), the Gluon kernel asserted to have run (a fallback to the Triton one would pass the
    bounds), an initial state and dht given, g None without ``decay``; where B T <= 1500, also
    within the oracle's band of autograd through the float64 token loop."""
    from recurscan.launch.delta_backward import BACKWARD_LAUNCHES, chunk_delta_product_bwd
    from recurscan.plan.delta import DeltaBackwardShape
    from recurscan.plan.device import gluon_usable
    from recurscan.reference.delta import gated_delta_product_naive
    from recurscan.runtime.cache import clear_caches
    if not gluon_usable(torch.device("cuda")):
        pytest.skip("Gluon twins run on sm_90 with a tested Triton (plan.device.gluon_usable)")
    M, V = 2, 128
    q, k, v, g, beta = _gdp_batch(M, B, T, H, HV, K, seed=27)
    g = g if decay else None
    if K != V:  # the batch's values are K wide
        gen_v = torch.Generator(device="cuda").manual_seed(29)
        v = torch.randn(B, T * M, HV, V, device="cuda", generator=gen_v).bfloat16()
    if not l2norm:
        q, k = (t * K ** -0.5 for t in (q, k))
    N = B if cu is None else len(cu) - 1
    gen = torch.Generator(device="cuda").manual_seed(28)
    do = torch.randn(B, T, HV, V, device="cuda", generator=gen).bfloat16()
    dht = torch.randn(N, HV, K, V, device="cuda", generator=gen)
    h0 = torch.randn(N, HV, K, V, device="cuda", generator=gen) * 0.1
    cu_t = None if cu is None else torch.tensor(cu, device="cuda", dtype=torch.int32)
    got = {}
    for on in (False, True):
        clear_caches()
        shape = DeltaBackwardShape(64, 4, 4, "test", grads_block_v=32, scores_warps=4, scores_block_v=128,
                                   sweep_stages=3, gluon_dqdk_stages=stages, **{field: on})
        got[on] = chunk_delta_product_bwd(q, k, v, g, beta, M, do, dht, initial_state=h0,
                                          use_qk_l2norm_in_kernel=l2norm, cu_seqlens=cu_t, backward_shape=shape)
        (launches,) = BACKWARD_LAUNCHES.values()
        assert any(step.kernel is kernel for step in launches.steps) == on
    clear_caches()
    for name, a, b in zip(GRAD_NAMES, got[False], got[True]):
        if a is None:  # no decay given: no dg
            assert b is None, name
            continue
        assert torch.isfinite(b).all(), name
        err = relative_rms(b.double(), a.double())
        print(f"{name}: {err:.2e} from the Triton kernels'")
        assert err <= bounds[name], f"{name}: relative RMS {err:.2e} from the Triton kernels'"
    if B * T <= 1500:
        leaves = [None if t is None else t.double().requires_grad_() for t in (q, k, v, g, beta, h0)]
        o, S = gated_delta_product_naive(*leaves[:5], M, initial_state=leaves[5], use_qk_l2norm_in_kernel=l2norm,
                                         cu_seqlens=None if cu is None else torch.tensor(cu, device="cuda"))
        given = [t for t in leaves if t is not None]
        want = iter(torch.autograd.grad((o, S), given, (do.double(), dht.double())))
        for name, a, leaf in zip(GRAD_NAMES, got[True], leaves):
            if leaf is None:
                continue
            b = next(want)
            assert relative_rms(a.double(), b) < 1e-2, f"{name}: relative RMS {relative_rms(a.double(), b):.2e}"


@pytest.mark.parametrize("B, T, H, HV, cu, l2norm", [
    (2, 4096, 16, 16, None, True), (3, 1000, 4, 4, None, True), (1, 8192, 8, 8, [0, 1, 3000, 3064, 8192], True),
    (2, 1024, 4, 4, None, False), (1, 4096, 8, 16, None, True), (2, 1000, 2, 8, None, True),
    (1, 8192, 4, 8, [0, 1, 3000, 3064, 8192], True), (2, 1024, 4, 8, None, False)],
    ids=["B2 T4096 H=HV=16", "a partial last chunk", "varlen, a one-token sequence", "no l2norm", "GVA HV=2H",
         "GVA HV=4H, a partial last chunk", "GVA varlen, a one-token sequence", "GVA, no l2norm"])
def test_the_gluon_dq_dk_kernel_agrees_with_its_twin(B, T, H, HV, cu, l2norm):
    """dq and dk's Gluon twin (kernels/gluon/delta_backward_dqdk.py): the same products in the same
    order as the Triton kernel, the reductions (|q|, |k|, the projections, S . dS) in another order;
    under GVA both sum the group's value heads in the kernel. So dv and dbeta (other kernels) are
    the same bits, dg agrees to float32 rounding, dq and dk to within one bf16 rounding (2^-8
    relative RMS); all within the oracle's band of the float64 chunkwise reference."""
    x, args = _twin_case(B, T, H, HV, cu, l2norm, seed=22)
    _check_form(x, args, DQDK_BOUNDS, gluon_dqdk=True)


@pytest.mark.parametrize("B, T, H, HV, cu, M", [
    (2, 4096, 16, 16, None, 1), (1, 8192, 8, 8, [0, 1, 3000, 3064, 8192], 1), (1, 4096, 8, 16, None, 1),
    (3, 1000, 2, 2, None, 2), (1, 1500, 4, 4, [0, 1, 700, 733, 1500], 2)],
    ids=["B2 T4096 H=HV=16", "varlen, a one-token sequence", "GVA HV=2H", "GDP, a partial last chunk",
         "GDP varlen, a one-token sequence"])
def test_the_gluon_dq_dk_kernel_on_a_ring_of_four_stages_agrees_with_its_twin(B, T, H, HV, cu, M):
    """dq and dk's Gluon twin on four tile stages (planned for GDN: plan.delta.GLUON_DQDK_STAGES; the
    next item's steps all issued under this item's epilogue): as on three, GDN and Gated Delta
    Product."""
    from recurscan.kernels.gluon.delta_backward_dqdk import gluon_bwd_dqdk_kernel
    if M == 1:
        x, args = _twin_case(B, T, H, HV, cu, True, seed=22)
        _check_form(x, args, DQDK_BOUNDS, stages=4, gluon_dqdk=True)
    else:
        _check_gdp_form(B, T, H, HV, cu, 128, "gluon_dqdk", gluon_bwd_dqdk_kernel, DQDK_BOUNDS, stages=4)


@pytest.mark.unproven  # its planner row is off (slower); its tests passed on an H100 at 4a5bb0f
@pytest.mark.parametrize("B, T, H, HV, cu, l2norm, decay", [
    (2, 4096, 16, 16, None, True, True), (3, 1000, 4, 4, None, True, True),
    (1, 8192, 8, 8, [0, 1, 3000, 3064, 8192], True, True), (2, 1024, 4, 4, None, False, True),
    (2, 1024, 4, 4, None, True, False), (1, 4096, 8, 16, None, True, True),
    (1, 8192, 4, 8, [0, 1, 3000, 3064, 8192], True, True), (2, 1000, 2, 8, None, True, True)],
    ids=["B2 T4096 H=HV=16", "a partial last chunk", "varlen, a one-token sequence", "no l2norm", "no decay",
         "GVA HV=2H", "GVA HV=2H varlen, a one-token sequence", "GVA HV=4H (the twin)"])
def test_the_warp_specialised_dq_dk_kernel_agrees_with_its_twin(B, T, H, HV, cu, l2norm, decay):
    """dq and dk's twin warp-specialised (kernels/gluon/delta_backward_dqdk_specialized.py; a GVA
    group of two summed in it, a larger one running the twin): the twin's products (each sum and
    product as two column halves; under GVA every head's score-tile products after the group's value
    sums, where the twin interleaves them), the reductions (|q|, |k|, the projections, S . dS) in
    another order. So dv and dbeta (other kernels) are the same bits, dg agrees with the Triton
    kernel's to float32 rounding, dq and dk to within one bf16 rounding; all within the oracle's
    band of the float64 chunkwise reference."""
    x, args = _twin_case(B, T, H, HV, cu, l2norm, seed=26)
    if not decay:
        x = x[:3] + (None,) + x[4:]
    _check_form(x, args, DQDK_BOUNDS, gluon_dqdk=True, gluon_dqdk_specialized=True)


@pytest.mark.parametrize("B, T, H, HV, cu, l2norm, decay", [
    (2, 4096, 16, 16, None, True, True), (3, 1000, 4, 4, None, True, True),
    (1, 8192, 8, 8, [0, 1, 3000, 3064, 8192], True, True), (2, 1024, 4, 4, None, False, True),
    (2, 1024, 4, 4, None, True, False), (2, 1000, 2, 8, None, True, True),
    (1, 8192, 4, 8, [0, 1, 3000, 3064, 8192], True, True)],
    ids=["B2 T4096 H=HV=16", "a partial last chunk", "varlen, a one-token sequence", "no l2norm", "no decay",
         "GVA HV=4H, a partial last chunk", "GVA varlen, a one-token sequence"])
def test_the_gluon_scores_kernel_agrees_with_its_twin(B, T, H, HV, cu, l2norm, decay):
    """The scores kernel warp-specialised in Gluon (kernels/gluon/delta_backward_scores_specialized.py):
    the same products as the Triton kernel (64 value columns a step against its 128), dg's [BT, BT]
    part summed in another order (row and column sums of the strict tile), the rest as the Triton
    kernel forms it. So dv and dh0 (other kernels) are the same bits, dbeta and dg agree to float32
    rounding, dq and dk (from the score tiles, stored in bf16) to within one bf16 rounding; all
    within the oracle's band of the float64 chunkwise reference."""
    x, args = _twin_case(B, T, H, HV, cu, l2norm, seed=25)
    if not decay:
        x = x[:3] + (None,) + x[4:]
    _check_form(x, args, SCORES_BOUNDS, gluon_scores=True)


@pytest.mark.parametrize("K, V, HV", [(64, 64, 8), (64, 192, 16), (128, 256, 8)],
                         ids=["K 64, V 64 (one step)", "K 64, V 192, GVA (a step for each stage)",
                              "V 256 (more steps than stages)"])
@pytest.mark.parametrize("form", ["gluon_scores", pytest.param("gluon_dqdk_specialized", marks=pytest.mark.unproven)])
def test_the_warp_specialised_stages_at_other_head_sizes(form, K, V, HV):
    """The warp-specialised scores kernel and dq/dk kernel at the other head sizes their scope takes
    (K 64; value steps fewer than, as many as and more than the ring's stages, the stages' other
    layouts), on a batch with a partial last chunk: as their tests at K = V = 128 bound them."""
    if form == "gluon_dqdk_specialized" and V == 64:
        V = 96  # dq and dk's twin takes at least three steps of 32 columns: an odd count of steps
    x, args = _twin_case(2, 1000, 8, HV, None, True, seed=27, K=K, V=V)
    if form == "gluon_scores":
        _check_form(x, args, SCORES_BOUNDS, gluon_scores=True)
    else:
        _check_form(x, args, DQDK_BOUNDS, gluon_dqdk=True, gluon_dqdk_specialized=True)


@pytest.mark.parametrize("poisoned", ["v, dO", "q, k"])
@pytest.mark.parametrize("specialised", [False, pytest.param(True, marks=pytest.mark.unproven)],
                         ids=["twins", "the warp-specialised scores, dq and dk"])
@pytest.mark.parametrize("H", [8, 4], ids=["H=HV", "GVA"])
def test_non_finite_input_of_one_sequence_stays_in_it_through_the_gluon_twins(H, specialised, poisoned):
    """The Gluon twins' bulk copies read whole tensors, so a chunk's rows past its sequence's end
    hold the next sequence's values. With NaN in the middle sequence's v and dO, or its q and k
    (whose L2-norm factors are then NaN on those rows: selected away, not multiplied by zero), the
    other sequences' gradients (and dh0) are bit for bit those of the run with it finite."""
    from recurscan.launch.delta_backward import chunk_delta_bwd
    from recurscan.plan.delta import DeltaBackwardShape
    from recurscan.plan.device import gluon_usable
    if not gluon_usable(torch.device("cuda")):
        pytest.skip("Gluon twins run on sm_90 with a tested Triton (plan.device.gluon_usable)")
    cu = [0, 100, 1000, 2048]
    x, args = _twin_case(1, 2048, H, 8, cu, True, seed=24)
    shape = DeltaBackwardShape(64, 4, 4, "test", grads_block_v=32, scores_warps=4, scores_block_v=128,
                               group_in_kernel=True, dqdk_one_launch=True, sweep_stages=3, gluon_sweep=True,
                               gluon_dqdk=True, gluon_scores=specialised, gluon_dqdk_specialized=specialised)
    clean = chunk_delta_bwd(*x, backward_shape=shape, **args)
    q, k, v, g, beta, do, dht = (t.clone() for t in x)
    for t in (v, do) if poisoned == "v, dO" else (q, k):
        t[:, 100:1000] = float("nan")
    got = chunk_delta_bwd(q, k, v, g, beta, do, dht, backward_shape=shape, **args)
    for name, a, b in zip(GRAD_NAMES, clean, got):
        if name == "dh0":
            a, b = a[[0, 2]], b[[0, 2]]
        else:
            a, b = torch.cat([a[:, :100], a[:, 1000:]], 1), torch.cat([b[:, :100], b[:, 1000:]], 1)
        assert torch.isfinite(a).all(), name
        assert torch.equal(a, b), f"{name}: {int((a != b).sum())} elements differ"


@pytest.mark.parametrize("poisoned", ["v, dO", "q, k"])
@pytest.mark.parametrize("scores", [False, True], ids=["twins", "twins and the scores kernel's"])
def test_non_finite_input_of_one_gdp_sequence_stays_in_it_through_the_gluon_twins(scores, poisoned):
    """Gated Delta Product (M = 2) through the reverse sweep's and dq and dk's Gluon twins (and the
    warp-specialised scores kernel), whose bulk copies read a partial chunk's rows past its
    sequence's end (the first sequence's 100 tokens are 200 rows of the expanded stream, 3.125
    chunks): with NaN in the middle sequence's v and dO, or its q and k, the other sequences'
    gradients (and dh0) are bit for bit those of the run with it finite."""
    from recurscan.kernels.gluon.delta_backward_dqdk import gluon_bwd_dqdk_kernel
    from recurscan.kernels.gluon.delta_backward_scores_specialized import gluon_bwd_scores_specialized_kernel
    from recurscan.kernels.gluon.delta_backward_sweep import gluon_bwd_sweep_kernel
    from recurscan.launch.delta_backward import BACKWARD_LAUNCHES, chunk_delta_product_bwd
    from recurscan.plan.delta import DeltaBackwardShape
    from recurscan.plan.device import gluon_usable
    from recurscan.runtime.cache import clear_caches
    if not gluon_usable(torch.device("cuda")):
        pytest.skip("Gluon twins run on sm_90 with a tested Triton (plan.device.gluon_usable)")
    clear_caches()
    M, T, H, K = 2, 2048, 4, 128
    cu = torch.tensor([0, 100, 1000, T], device="cuda", dtype=torch.int32)
    q, k, v, g, beta = _gdp_batch(M, 1, T, H, H, K, seed=25)
    gen = torch.Generator(device="cuda").manual_seed(26)
    do = torch.randn(1, T, H, K, device="cuda", generator=gen).bfloat16()
    dht = torch.randn(3, H, K, K, device="cuda", generator=gen)
    h0 = torch.randn(3, H, K, K, device="cuda", generator=gen) * 0.1
    shape = DeltaBackwardShape(64, 4, 4, "test", grads_block_v=32, scores_warps=4, scores_block_v=128,
                               sweep_stages=3, gluon_sweep=True, gluon_dqdk=True, gluon_scores=scores)

    def grads(q, k, v, do):
        return chunk_delta_product_bwd(q, k, v, g, beta, M, do, dht, initial_state=h0, use_qk_l2norm_in_kernel=True,
                                       cu_seqlens=cu, backward_shape=shape)

    clean = grads(q, k, v, do)
    (launches,) = BACKWARD_LAUNCHES.values()  # the Gluon kernels ran, not a fallback to the Triton ones
    ran = {step.kernel for step in launches.steps}
    assert {gluon_bwd_sweep_kernel, gluon_bwd_dqdk_kernel} <= ran
    assert (gluon_bwd_scores_specialized_kernel in ran) == scores
    q, k, v, do = (t.clone() for t in (q, k, v, do))
    for t, per_token in ((v, M), (do, 1)) if poisoned == "v, dO" else ((q, 1), (k, M)):
        t[:, 100 * per_token:1000 * per_token] = float("nan")
    got = grads(q, k, v, do)
    for name, a, b in zip(GRAD_NAMES, clean, got):
        if name == "dh0":
            a, b = a[[0, 2]], b[[0, 2]]
        else:  # dq and dg on the token stream, the others on the expanded one
            r = 1 if name in ("dq", "dg") else M
            a, b = (torch.cat([t[:, :100 * r], t[:, 1000 * r:]], 1) for t in (a, b))
        assert torch.isfinite(a).all(), name
        assert torch.equal(a, b), f"{name}: {int((a != b).sum())} elements differ"


@pytest.mark.parametrize("every", [False, pytest.param(True, marks=pytest.mark.unproven)],
                         ids=["the rows on", "every row on"])
@pytest.mark.parametrize("H", [4, 2], ids=["H=HV", "GVA HV=2H"])
def test_the_planner_gives_backward_stages_to_gluon_only_where_allowed(monkeypatch, H, every):
    """With the Gluon rows that are on (or every row: the warp-specialised forms too), a bf16 GDN
    training step (H = HV, or a GVA group the planner sums in the kernel) plans the reverse sweep's
    and dq/dk's Gluon kernels, and the scores kernel's where its row is on; ``backend="triton"``
    keeps the Triton kernels; the gradients agree (dv the same bits, dbeta too unless the scores
    kernel is Gluon's)."""
    from recurscan.kernels.delta.backward import chunk_delta_bwd_sweep_kernel
    from recurscan.launch.delta_backward import BACKWARD_LAUNCHES
    from recurscan.plan import delta as plan_delta
    from recurscan.plan.device import gluon_usable
    from recurscan.runtime.cache import clear_caches
    if not gluon_usable(torch.device("cuda")):
        pytest.skip("Gluon twins run on sm_90 with a tested Triton (plan.device.gluon_usable)")
    gen = torch.Generator(device="cuda").manual_seed(3)
    B, T, HV, K = 2, 1024, 4, 128
    x = [torch.randn(B, T, h, K, device="cuda", generator=gen).bfloat16() for h in (H, H, HV)] + \
        [torch.nn.functional.logsigmoid(torch.randn(B, T, HV, device="cuda", generator=gen) + 3),
         torch.rand(B, T, HV, device="cuda", generator=gen).bfloat16()]

    def step(backend):
        clear_caches()
        leaves = [t.clone().requires_grad_() for t in x]
        o, _ = recurscan.chunk_gated_delta_rule(*leaves, use_qk_l2norm_in_kernel=True, backend=backend)
        grads = torch.autograd.grad(o.float().square().sum(), leaves)
        (launches,) = BACKWARD_LAUNCHES.values()
        return grads, [type(s.kernel).__name__ for s in launches.steps], launches.steps[0].kernel

    import dataclasses
    rows = {name: dataclasses.replace(row, on=row.on or every) for name, row in plan_delta.GLUON_BACKWARD_TWINS.items()}
    monkeypatch.setattr(plan_delta, "GLUON_BACKWARD_TWINS", rows)
    scores = "GluonJITFunction" if rows["gluon_scores"].on else "JITFunction"
    planned, kinds, _ = step(None)
    assert kinds == ["GluonJITFunction", scores, "GluonJITFunction"]  # the reverse sweep, scores, dq and dk
    forced, kinds, kernel = step("triton")
    assert kernel is chunk_delta_bwd_sweep_kernel and "GluonJITFunction" not in kinds
    bounds = SCORES_BOUNDS if rows["gluon_scores"].on else DQDK_BOUNDS
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), planned, forced):
        err = relative_rms(a.double(), b.double())
        assert err <= bounds[name], f"{name}: {err:.2e}"
    clear_caches()
