"""Chunked GDN / GDP Triton kernels on the GPU at real sizes, against the float64 oracle.

Run on the GPU machine: ``python -m pytest -m gpu tests/gpu/test_chunk_delta_gpu.py -s``
(-s prints each case's measured errors).

Tolerances, fixed before the first GPU run. bf16 / fp16 inputs: the kernels' products take
16-bit operands with float32 accumulation (as fla's do: the state, the WY factor and the
attention block are rounded to the input dtype before each product), and the output is stored in
the input dtype. That is METHOD.md's band for 16-bit operands: relative RMS error <= 1e-2 for the
output, the final state and the chunk states, against the float64 oracle on the same (16-bit)
inputs. Every element: |error| <= 5e-2 x max|reference| (rounding gives ~1e-3 x max; a wrong or
unwritten element gives O(1)). float32 inputs: the interpreter tests' bounds (2e-5 RMS, 1e-4
elementwise). Buffers the op allocates start as NaN (recurscan.launch.delta.POISON_BUFFERS).
"""
import pytest
import torch

import recurscan
from recurscan.descriptors import build_chunk_descriptors
from recurscan.launch import delta as launch_delta
from recurscan.launch.delta import chunk_delta_fwd, run_delta_launches
from recurscan.reference.delta import gated_delta_product_chunked, gated_delta_rule_chunked
from recurscan.runtime import launcher

from tests.helpers.launches import delta_launches
from tests.helpers.tolerances import relative_rms

pytestmark = pytest.mark.gpu

DEV = "cuda"
RMS16, ELEM16 = 1e-2, 5e-2


def rel_rms(got, want):
    d = got.double() - want.double()
    return (d.pow(2).mean().sqrt() / want.double().pow(2).mean().sqrt()).item()


def check(got, want, what, rms=RMS16, elem=ELEM16):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    r = rel_rms(got, want)
    worst = (got.double() - want.double()).abs().max().item() / want.abs().max().item()
    print(f"  {what:<28} rel RMS {r:.2e}  max|err|/max|ref| {worst:.2e}")
    assert r <= rms, f"{what}: relative RMS {r:.2e} > {rms:.0e}"
    assert worst <= elem, f"{what}: max abs error {worst:.2e} x max|ref| > {elem:.0e}"


def run_plan(plan_, args, sync_free):
    """One call of kept launches (a DeltaLaunches); ``sync_free``: under sync debug mode "error" (a host
    synchronisation raises), after a synchronize so that earlier work does not count."""
    if sync_free:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        return run_delta_launches(plan_, args)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)


def inputs(T, H, HV, K, V, *, M=1, dtype=torch.bfloat16, seed=0, correlated=False, B=1):
    """q, k [B, T*, H, K], v [B, T*M, HV, V], g [B, T, HV] (logsigmoid, with a few resets and
    zeros), beta [B, T*M, HV] in (0, 1). ``correlated``: keys of a head share a direction (cosine
    ~0.7 after normalisation), as real models' keys do: the WY systems are then far from I."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=gen, device=DEV)  # noqa: E731
    q = rn(B, T, H, K)
    k = rn(B, T * M, H, K)
    if correlated:
        k = k + 1.5 * rn(1, 1, H, K)
    v = rn(B, T * M, HV, V)
    g = torch.nn.functional.logsigmoid(rn(B, T, HV) + 3.0)
    if T > 300:
        g[:, 100, 0] = float("-inf")
        g[:, 257, -1] = float("-inf")
        g[:, 5:70] = 0.0
    beta = torch.sigmoid(rn(B, T * M, HV))
    return [x.to(dtype) for x in (q, k, v)] + [g, beta.to(dtype)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gdn_t65536(dtype):
    """T = 65536 (1024 chunks through one state), an initial state, chunk states, resets."""
    q, k, v, g, beta = inputs(65536, 2, 4, 128, 128, dtype=dtype)
    S0 = torch.randn(1, 4, 128, 128, device=DEV)
    o, S, C = recurscan.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=S0, output_final_state=True,
                                               use_qk_l2norm_in_kernel=True, return_chunk_states=True)
    wo, wS, wC = gated_delta_rule_chunked(q.double(), k.double(), v.double(), g.double(), beta.double(),
                                          initial_state=S0.double(), use_qk_l2norm_in_kernel=True,
                                          return_chunk_states=True)
    assert o.dtype == dtype and S.dtype == torch.float32
    check(o, wo, "o")
    check(S, wS, "final state")
    check(C, wC, "chunk states")


@pytest.mark.parametrize("correlated", [False, True])
def test_gdn_benchmark_shape(correlated):
    """B1 T16384 H16 HV32 K=V=128 bf16 (the headline workload's shape), GVA."""
    q, k, v, g, beta = inputs(16384, 16, 32, 128, 128, correlated=correlated, seed=1)
    o, S = recurscan.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    wo, wS = gated_delta_rule_chunked(q.double(), k.double(), v.double(), g.double(), beta.double(),
                                      initial_state=torch.zeros(1, 32, 128, 128, dtype=torch.float64, device=DEV),
                                      use_qk_l2norm_in_kernel=True)
    check(o, wo, "o")
    check(S, wS, "final state")


@pytest.mark.parametrize("M", [1, 2])
def test_the_split_inverse_is_no_less_accurate_than_the_whole_tile_form(M):
    """The prep's inverse with its first three levels on the 16 x 16 diagonal blocks (INV_SPLIT 16,
    planned: plan.delta.PREP_SPLIT_INVERSE) against the whole-tile form (INV_SPLIT 0) at real sizes,
    keys correlated (the WY systems far from I), GDN and GDP: both within the 16-bit band of the
    float64 oracle, and the split's error at most the whole-tile form's plus a tenth (the products
    it drops are of zero blocks; only the sums' order differs)."""
    from benchmarks.delta_variants import with_constants
    T, H, HV = (16384, 16, 32) if M == 1 else (4096, 16, 16)
    q, k, v, g, beta = inputs(T, H, HV, 128, 128, M=M, correlated=True, seed=7)
    S0 = torch.randn(1, HV, 128, 128, device=DEV)
    args = (q, k, v, g, beta)
    launches = delta_launches(*args, initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                              num_householder=M)
    given = launch_delta.DeltaInputs(*args, initial_state=S0)
    reference = gated_delta_product_chunked if M > 1 else gated_delta_rule_chunked
    extra = (M,) if M > 1 else ()
    wo, wS = reference(*(x.double() for x in args), *extra, initial_state=S0.double(), use_qk_l2norm_in_kernel=True)
    errors = {}
    for split in (16, 0):
        o, S = run_delta_launches(with_constants(launches, "prep", INV_SPLIT=split), given)[:2]
        check(o, wo, f"o, split {split}")
        check(S, wS, f"final state, split {split}")
        errors[split] = (rel_rms(o, wo), rel_rms(S, wS))
    for what, split_err, whole_err in zip(("o", "final state"), errors[16], errors[0]):
        assert split_err <= 1.1 * whole_err, f"{what}: split {split_err:.3e} against the whole tile's {whole_err:.3e}"


def test_gdn_varlen_cache_padding_bf16():
    """Varlen with one-token sequences, a state cache with padding (-1) and NaN in unnamed slots,
    padded descriptors, chunk states; H16 HV32."""
    lens = [1, 4000, 1, 63, 64, 65, 1, 2900, 200]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEV)
    T = int(cu[-1])
    q, k, v, g, beta = inputs(T, 16, 32, 128, 128, seed=2)
    slots = torch.tensor([5, 0, -1, 7, 2, 9, 3, -1, 11], dtype=torch.int32, device=DEV)
    cache = torch.full((13, 32, 128, 128), float("nan"), device=DEV)
    live = [int(s) for s in slots.tolist() if s >= 0]
    cache[live] = torch.randn(len(live), 32, 128, 128, device=DEV)
    before = cache.clone()
    d = build_chunk_descriptors(cu.cpu(), max_tokens=T + 500, device=DEV)
    o, final, C = recurscan.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                                   state=cache, state_indices=slots, return_chunk_states=True,
                                                   chunk_indices=d.chunk_indices, chunk_offsets=d.chunk_offsets)
    S0 = torch.zeros(len(lens), 32, 128, 128, dtype=torch.float64, device=DEV)
    for n, s in enumerate(slots.tolist()):
        if s >= 0:
            S0[n] = before[s].double()
    wo, wS, wC = gated_delta_rule_chunked(q.double(), k.double(), v.double(), g.double(), beta.double(),
                                          initial_state=S0, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                          return_chunk_states=True)
    bounds = cu.tolist()
    offs = d.chunk_offsets.tolist()
    for n, s in enumerate(slots.tolist()):
        a, b = bounds[n], bounds[n + 1]
        if s < 0:
            assert o[:, a:b].eq(0).all() and C[offs[n]:offs[n + 1]].eq(0).all()
            wo[:, a:b] = 0
            wC[offs[n]:offs[n + 1]] = 0
        else:
            check(cache[s], wS[n], f"slot {s} (sequence {n})")
    check(o, wo, "o")
    assert C.shape[0] == d.chunk_indices.shape[0] and C[offs[-1]:].eq(0).all()
    check(C[:offs[-1]], wC, "chunk states")
    untouched = [s for s in range(13) if s not in live]
    assert torch.equal(cache[untouched].view(torch.int32), before[untouched].view(torch.int32))


@pytest.mark.parametrize("M", [2, 3])
def test_gdp_varlen_bf16(M):
    lens = [1, 3000, 65, 5000, 1, 130]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEV)
    T = int(cu[-1])
    q, k, v, g, beta = inputs(T, 4, 8, 128, 128, M=M, seed=3)
    S0 = torch.randn(len(lens), 8, 128, 128, device=DEV)
    d = build_chunk_descriptors(cu.cpu(), M, device=DEV)
    o, S, C = recurscan.chunk_gated_delta_product_varlen(q, k, v, g, beta, M, cu, initial_state=S0,
                                                         output_final_state=True, use_qk_l2norm_in_kernel=True,
                                                         return_chunk_states=True, **d.as_kwargs())
    wo, wS, wC = gated_delta_product_chunked(q.double(), k.double(), v.double(), g.double(), beta.double(), M,
                                             initial_state=S0.double(), use_qk_l2norm_in_kernel=True,
                                             cu_seqlens=cu, return_chunk_states=True)
    check(o, wo, "o")
    check(S, wS, "final state")
    n = int(d.chunk_offsets[-1])
    assert C[n:].eq(0).all()
    check(C[:n], wC, "chunk states")


def test_float32_inputs():
    q, k, v, g, beta = inputs(700, 2, 4, 64, 96, dtype=torch.float32, seed=4)
    o, S = recurscan.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    wo, wS = gated_delta_rule_chunked(q.double(), k.double(), v.double(), g.double(), beta.double(),
                                      initial_state=torch.zeros(1, 4, 64, 96, dtype=torch.float64, device=DEV),
                                      use_qk_l2norm_in_kernel=True)
    check(o, wo, "o", rms=2e-5, elem=1e-4)
    check(S, wS, "final state", rms=2e-5, elem=1e-4)


@pytest.mark.parametrize("case", ["gdp", "gdn_bulk_store"])
def test_sync_free_and_cuda_graph_replay(case):
    """Given descriptors the op does no host synchronisation (sync debug mode 'error'), and a CUDA
    graph captured at a padded batch (zero-length sequences, slots -1) replays to the eager result
    bit for bit, on new data copied into the captured inputs. GDP M = 2, and GDN at a shape whose
    planned launch writes its outputs by bulk tensor stores (descriptors built on the device)."""
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem
    if case == "gdp":
        H, HV, K, V, M = 4, 8, 128, 128, 2
        T_pad, N_pad = 6000, 8
    else:
        H, HV, K, V, M = 4, 16, 128, 128, 1
        T_pad, N_pad = 20000, 8

    def batch(seed, lens):
        cu = [0]
        for L in lens + [0] * (N_pad - len(lens)):
            cu.append(cu[-1] + L)
        cu[-1] = T_pad  # the last (padding) sequence absorbs the padded tail: zero output, no state
        q, k, v, g, beta = inputs(T_pad, H, HV, K, V, M=M, seed=seed)
        slots = torch.tensor([3 * n if n < len(lens) else -1 for n in range(N_pad)], dtype=torch.int32, device=DEV)
        return dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=torch.tensor(cu, device=DEV), state_indices=slots), cu

    static, cu0 = batch(10, [1000, 1, 2500])
    x = static
    launch = delta_shape(delta_problem(x["q"], x["k"], x["v"], x["g"], x["beta"], num_householder=M,
                                        cu_seqlens=x["cu_seqlens"]), torch.device(DEV))
    assert launch.tma_store == (case == "gdn_bulk_store"), launch
    cache = torch.randn(32, HV, K, V, device=DEV)
    desc = build_chunk_descriptors(cu0, M, max_tokens=T_pad, device=DEV)
    dbuf = {name: t.clone() for name, t in desc.as_kwargs().items()}

    def call(x, cache):
        return recurscan.chunk_gated_delta_product_varlen(
            x["q"], x["k"], x["v"], x["g"], x["beta"], M, x["cu_seqlens"], use_qk_l2norm_in_kernel=True,
            state=cache, state_indices=x["state_indices"], return_chunk_states=True, **dbuf)

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call(static, cache.clone())  # compiles; must not synchronise either
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph_cache = cache.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call(static, graph_cache.clone())
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(static, graph_cache)
    for seed, lens in ((11, [1, 4000, 64]), (12, [700, 700, 700, 65, 1, 1, 2000])):
        new, cu = batch(seed, lens)
        new_desc = build_chunk_descriptors(cu, M, max_tokens=T_pad, device=DEV)
        for name, t in new_desc.as_kwargs().items():
            dbuf[name].copy_(t)
        for name, t in new.items():
            static[name].copy_(t)
        start = torch.randn(32, HV, K, V, device=DEV)
        graph_cache.copy_(start)
        graph.replay()
        eager_cache = start.clone()
        want = call(static, eager_cache)
        torch.cuda.synchronize()
        assert torch.equal(out[0], want[0]) and torch.equal(out[2], want[2])
        assert torch.equal(graph_cache, eager_cache)


def test_cached_direct_launch_equals_jit_launch():
    """A call signature seen before skips validation and planning and launches the compiled kernels
    directly (runtime/launcher.py): its results equal the first, JIT-launched call's bit for bit,
    with and without segments, and it does not synchronise."""
    from recurscan.ops import delta_rule as DR
    from recurscan.runtime import clear_caches
    H, HV, K, V = 2, 4, 128, 128
    for T in (200, 16384):  # T = 16384 over 4 pairs takes the planner's segments (prep, 3 sweeps, fix-up)
        q, k, v, g, beta = inputs(T, H, HV, K, V, seed=T)
        cache = torch.randn(8, HV, K, V, device=DEV)
        slots = torch.tensor([5], dtype=torch.int32, device=DEV)
        clear_caches()  # the first call of this signature plans and launches through Triton's JIT

        def call(c):
            return recurscan.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, state=c,
                                                    state_indices=slots, return_chunk_states=True)
        c1, c2 = cache.clone(), cache.clone()
        first = [t.clone() for t in call(c1)]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            second = call(c2)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        (plan_,) = DR.LAUNCHES.values()
        assert all(step.direct is not None for step in plan_.steps), "the second call did not launch directly"
        assert launcher.DRIVER_ERROR is None and all(step.direct.driver is not None for step in plan_.steps)
        assert len(plan_.steps) == (2 if T == 200 else 4) + 1  # the last: the replay launch
        assert torch.equal(first[0], second[0]) and torch.equal(first[2], second[2]) and torch.equal(c1, c2)


@pytest.mark.parametrize("T", [16384, 65536])
def test_segments_bf16(T):
    """The segment-parallel sweep (chunk_delta_fwd(segments=P), P in {2, 4, 8}; dense batch, GVA
    H2 HV4, an initial state, chunk states, resets, one on a segment boundary) against the float64
    oracle and against the single pass (segments=1), at the tolerances above.

    Long memory: decays and betas are scaled down (by T) so that a state still carries ~e^-1.5 of
    itself across a segment of T/8 tokens; with the usual inputs (decay ~0.94 per token) a wrong
    transition M_i would hide under the tolerance. All errors are printed before any assert."""
    H, HV, K, V = 2, 4, 128, 128
    q, k, v, g, beta = inputs(T, H, HV, K, V, seed=5)
    g = g * (0.01 * 16384 / T)  # -inf and 0 stay
    g[:, T // 4, 1] = float("-inf")  # a segment's first token for P = 4 and 8
    beta = (beta.float() * (0.1 * 16384 / T)).to(beta.dtype)
    S0 = torch.randn(1, HV, K, V, device=DEV)
    wo, wS, wC = gated_delta_rule_chunked(q.double(), k.double(), v.double(), g.double(), beta.double(),
                                          initial_state=S0.double(), use_qk_l2norm_in_kernel=True,
                                          return_chunk_states=True)
    kw = dict(initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True, return_chunk_states=True,
              block_v=32)
    names = ("o", "final state", "chunk states")
    failures = []

    def soft(got, want, what):
        try:
            check(got, want, what)
        except AssertionError as exc:
            failures.append(str(exc))

    with torch.no_grad():
        single = [t.clone() for t in chunk_delta_fwd(q, k, v, g, beta, segments=1, **kw)]
        for a, w, what in zip(single, (wo, wS, wC), names):
            soft(a, w, f"P=1 {what}")
        for P in (2, 4, 8):
            got = chunk_delta_fwd(q, k, v, g, beta, segments=P, **kw)
            for a, w, s, what in zip(got, (wo, wS, wC), single, names):
                soft(a, w, f"P={P} {what}")
                soft(a, s, f"P={P} {what} vs P=1")
    assert not failures, "; ".join(failures)


@pytest.mark.parametrize("case", ["dense_segments", "dense_segments_v_operand", "varlen_cache"])
def test_bulk_tensor_store_equals_masked_store(case):
    """``tma_store=True`` (output tiles by bulk tensor stores through a per-program descriptor over
    the sequence's rows) writes the same bf16 values as the masked store, bit for bit, in the
    single pass, the segment passes and varlen with padding (a sequence's last chunk must not
    write into the next sequence's rows); launched directly on the second call (global scratch
    passed by runtime/launcher.py) and sync-free."""
    if case == "dense_segments":
        q, k, v, g, beta = inputs(16384, 2, 4, 128, 128, seed=11)
        kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, block_v=64, num_stages=2, segments=3,
                  v_product=False)
    elif case == "dense_segments_v_operand":  # the few-pairs launch row (f60266e)
        q, k, v, g, beta = inputs(16384, 2, 4, 128, 128, seed=13)
        kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, block_v=64, num_stages=3, segments=3,
                  v_product=True)
    else:
        lens = [1, 4000, 1, 63, 64, 65, 1, 2900, 200]
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEV)
        q, k, v, g, beta = inputs(int(cu[-1]), 16, 32, 128, 128, seed=12)
        d = build_chunk_descriptors(cu.cpu(), device=DEV)
        slots = torch.tensor([5, 0, -1, 7, 2, 9, 3, -1, 11], dtype=torch.int32, device=DEV)
        cache = torch.randn(13, 32, 128, 128, device=DEV)
        kw = dict(use_qk_l2norm_in_kernel=True, cu_seqlens=cu, chunk_indices_dp=d.chunk_indices_dp,
                  state_indices=slots, block_v=128, num_warps=8, num_stages=3)
    outs = {}
    for tma in (False, True):
        plan_ = delta_launches(q, k, v, g, beta, tma_store=tma,
                               state=cache.clone() if case == "varlen_cache" else None, **kw)
        for call in range(2):  # the first through Triton's JIT, the second directly
            state = cache.clone() if case == "varlen_cache" else None
            args = (q, k, v, g, beta, None, state, kw.get("state_indices"), kw.get("cu_seqlens"),
                    kw.get("chunk_indices_dp"), None)
            got = run_plan(plan_, args, sync_free=call == 1)
            torch.cuda.synchronize()
            outs[(tma, call)] = [t.clone() for t in got if t is not None]
        assert all(step.direct is not None and step.direct.driver is not None for step in plan_.steps)
    assert launcher.DRIVER_ERROR is None
    for call in range(2):
        for a, b in zip(outs[(True, call)], outs[(False, call)]):
            assert torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a.view(torch.int32),
                               b.view(torch.int16) if b.dtype == torch.bfloat16 else b.view(torch.int32))


@pytest.mark.parametrize("T", [16384, 65536])
def test_phases_equal_single_pass_direct_and_graph(T):
    """The phased sweep (chunk_delta_fwd(phases=K): prep 0, sweep 0, prep 1, ...; each prep after
    the first a programmatic dependent of the sweep before it, running beside it) gives the single
    pass's bits at the headline launch (B1, H16 HV32, BV 64, three stages, V as a product operand,
    bulk stores) with an initial state and chunk states: over five calls (the first through
    Triton's JIT, then direct launches through cuLaunchKernelEx, sync-free) and under CUDA-graph
    replay. A prep racing the sweep it runs beside, or a later launch overtaking a sweep, would
    show as a difference in some call."""
    q, k, v, g, beta = inputs(T, 16, 32, 128, 128, seed=31)
    S0 = torch.randn(1, 32, 128, 128, device=DEV)
    kw = dict(initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True, return_chunk_states=True,
              block_v=64, num_warps=4, num_stages=3, v_product=True, tma_store=True)
    args = (q, k, v, g, beta, S0, None, None, None, None, None)
    with torch.no_grad():
        single = [t.clone() for t in chunk_delta_fwd(q, k, v, g, beta, **kw)]
        for phases in (2, 4):
            plan_ = delta_launches(q, k, v, g, beta, phases=phases, **kw)
            assert len(plan_.steps) == 2 * phases + 1  # the last: the replay launch
            assert [s.programmatic for s in plan_.steps] == [False, False] + [True, False] * (phases - 1) + [True]
            for call in range(5):
                got = run_plan(plan_, args, sync_free=call > 0)
                for a, b, what in zip(got, single, ("o", "final state", "chunk states")):
                    assert torch.equal(a, b), f"phases={phases}, call {call}: {what} differs from the single pass"
            assert launcher.DRIVER_ERROR is None
            assert all(s.direct is not None and s.direct.driver is not None for s in plan_.steps)
            # the programmatic launches went through cuLaunchKernelEx, the others cuLaunchKernel
            assert [s.direct.driver.config is not None for s in plan_.steps] == [s.programmatic for s in plan_.steps]
        plan_ = delta_launches(q, k, v, g, beta, phases=4, **kw)
        run_delta_launches(plan_, args)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            run_delta_launches(plan_, args)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run_delta_launches(plan_, args)
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            for a, b, what in zip(out, single, ("o", "final state", "chunk states")):
                assert torch.equal(a, b), f"graph replay: {what} differs from the single pass"


@pytest.mark.parametrize("op", ["gdn with chunk states", "gla with chunk states"])
def test_varlen_without_descriptors_under_graph_capture_is_refused_by_name(op):
    """A varlen call without chunk_indices / chunk_offsets that reads cu_seqlens on the host (with
    chunk states, whose row count only the host read gives) inside a CUDA graph capture: a
    ValueError that names build_chunk_descriptors (before: torch's "Cannot copy between CPU and
    CUDA tensors during CUDA graph capture"); outside the capture the same call runs."""
    gen = torch.Generator(device="cuda").manual_seed(12)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    T = 256
    cu = torch.tensor([0, 100, T], device="cuda", dtype=torch.int32)
    q, k, v = rn(1, T, 2, 128).bfloat16(), rn(1, T, 2, 128).bfloat16(), rn(1, T, 2, 128).bfloat16()
    if op.startswith("gdn"):  # the inputs made before the capture (a generator's draw inside one fails first)
        g, beta = torch.nn.functional.logsigmoid(rn(1, T, 2)), torch.rand(1, T, 2, device="cuda").bfloat16()
        call = lambda: recurscan.chunk_gated_delta_rule(  # noqa: E731
            q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True, return_chunk_states=True)
    else:
        g = torch.nn.functional.logsigmoid(rn(1, T, 2, 128)) / 16
        call = lambda: recurscan.chunk_gla(q, k, v, g, cu_seqlens=cu, return_chunk_states=True,  # noqa: E731
                                           backend="triton")
    call()
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="build_chunk_descriptors"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            call()


@pytest.mark.parametrize("M", [1, 2])
def test_the_descriptor_kernel_equals_the_host_built_descriptors(M):
    """The Triton kernel that forms the descriptors on the GPU (launch/descriptors.py) at serving
    sizes: 1 to 1024 sequences (empty and one-token ones among them), T up to 65536 plus padding;
    the tensors of build_chunk_descriptors, every entry, and a second call of the same signature
    (the direct launch) too."""
    import random

    from recurscan.descriptors import build_chunk_descriptors
    from recurscan.launch.descriptors import form_descriptors
    rng = random.Random(M)
    for N in (1, 7, 100, 1024):
        for _ in range(2):
            lengths = [rng.choice([0, 1, 64, 65, rng.randint(0, 65536 // N)]) for _ in range(N)]
            cu = [0]
            for L in lengths:
                cu.append(cu[-1] + L)
            T = cu[-1] + rng.choice([0, 3000])
            want = build_chunk_descriptors(cu, M, max_tokens=T)
            got = form_descriptors(torch.tensor(cu, device="cuda", dtype=torch.int32), M, T)
            for name, a, b in zip(want._fields, want, got):
                assert torch.equal(a, b.cpu()), (name, N)


@pytest.mark.parametrize("M", [1, 2, "gla per key"], ids=["gdn", "gdp", "gla per key"])
def test_varlen_without_descriptors_is_sync_free_and_captured(M):
    """A varlen call without descriptors (no chunk states) forms them on the GPU: no host
    synchronisation (torch's sync debug mode set to error), a CUDA graph captures the call, and its
    replay, after new boundaries are copied into cu_seqlens, equals the call given those boundaries'
    descriptors, bit for bit."""
    per_key = M == "gla per key"
    M = 1 if per_key else M
    gen = torch.Generator(device="cuda").manual_seed(14)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    T, H = 1000, 4
    q, k, v = rn(1, T, H, 128).bfloat16(), rn(1, T * M, H, 128).bfloat16(), rn(1, T * M, H, 128).bfloat16()
    g, beta = torch.nn.functional.logsigmoid(rn(1, T, H)), torch.rand(1, T * M, H, device="cuda").bfloat16()
    cu = torch.tensor([0, 1, 400, 1000], device="cuda", dtype=torch.int32)

    if per_key:
        gk = torch.nn.functional.logsigmoid(rn(1, T, H, 128)) / 16

    def call(**kw):
        if per_key:
            return recurscan.chunk_gla(q, k, v, gk, cu_seqlens=cu, output_final_state=True, **kw)
        if M == 1:
            return recurscan.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                                    output_final_state=True, **kw)
        return recurscan.chunk_gated_delta_product_varlen(q, k, v, g, beta, M, cu, use_qk_l2norm_in_kernel=True,
                                                          output_final_state=True, **kw)

    call()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = call()
    for bounds in ([0, 1, 400, 1000], [0, 600, 600, 1000]):
        cu.copy_(torch.tensor(bounds, dtype=torch.int32))
        graph.replay()
        built = recurscan.build_chunk_descriptors(cu, M, max_tokens=T, device="cuda")
        kw = dict(chunk_indices=built.chunk_indices, chunk_offsets=built.chunk_offsets)
        if M > 1:
            kw["chunk_indices_dp"] = built.chunk_indices_dp
        want = call(**kw)
        for a, b in zip(replayed, want):
            assert torch.equal(a, b), bounds
        if bounds[2] == 400:
            for a, b in zip(eager, want):
                assert torch.equal(a, b)


def test_varlen_segments_at_real_sizes():
    """A varlen batch the planner cuts into segments (two sequences of 8192 tokens, H = HV = 4,
    K = V = 128: 4 segments of each sequence, plan.delta's varlen row), bf16, l2norm, initial
    states: outputs and final states against the float64 PyTorch form on the GPU."""
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem
    gen = torch.Generator(device="cuda").manual_seed(15)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    T, H = 16384, 4
    q, k, v = rn(1, T, H, 128).bfloat16(), rn(1, T, H, 128).bfloat16(), rn(1, T, H, 128).bfloat16()
    g, beta = torch.nn.functional.logsigmoid(rn(1, T, H) + 6), torch.rand(1, T, H, device="cuda").bfloat16()
    h0 = rn(2, H, 128, 128) * 0.1
    cu = torch.tensor([0, 8192, T], device="cuda", dtype=torch.int32)
    d = recurscan.build_chunk_descriptors(cu, 1, device="cuda")
    shape = delta_shape(delta_problem(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu), torch.device("cuda"))
    assert shape.segments == 4, shape.reason
    got = recurscan.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                           chunk_indices=d.chunk_indices, chunk_offsets=d.chunk_offsets,
                                           use_qk_l2norm_in_kernel=True)
    want = recurscan.chunk_gated_delta_rule(*(t.double() for t in (q, k, v, g, beta)), initial_state=h0.double(),
                                            output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                            backend="torch")
    for a, b in zip(got, want):
        assert relative_rms(a.double(), b) < 1e-2


def test_varlen_without_descriptors_reuses_the_launches_of_its_signature():
    """GDP M = 2 varlen on the GPU without descriptors: each call derives the descriptors padded to
    q's T, so a second call, even with other boundaries, plans and builds
    nothing (the signature's launches serve it) and equals the call given its descriptors."""
    from recurscan.runtime.cache import cache_stats
    gen = torch.Generator(device="cuda").manual_seed(13)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    T, M, H = 1000, 2, 4
    q, k, v = rn(1, T, H, 128).bfloat16(), rn(1, T * M, H, 128).bfloat16(), rn(1, T * M, H, 128).bfloat16()
    g, beta = torch.nn.functional.logsigmoid(rn(1, T, H)), torch.rand(1, T * M, H, device="cuda").bfloat16()
    for i, cu in enumerate(([0, 1, 400, 1000], [0, 600, 601, 1000])):
        cu = torch.tensor(cu, device="cuda", dtype=torch.int32)
        stored = cache_stats()["chunked delta rule"]["stored"]
        got = recurscan.chunk_gated_delta_product_varlen(q, k, v, g, beta, M, cu, use_qk_l2norm_in_kernel=True,
                                                         output_final_state=True)
        if i > 0:
            assert cache_stats()["chunked delta rule"]["stored"] == stored
        want = recurscan.chunk_gated_delta_product_varlen(
            q, k, v, g, beta, M, cu, use_qk_l2norm_in_kernel=True, output_final_state=True,
            **recurscan.build_chunk_descriptors(cu, M, max_tokens=T, device="cuda").as_kwargs())
        for a, b in zip(got, want):
            assert torch.equal(a, b)


@pytest.mark.parametrize("layout", ["dense", "varlen cache"])
def test_few_tokens_a_sequence_take_the_streaming_kernel(layout):
    """chunk_gated_delta_rule with 64 sequences of 2 tokens (H16 HV32 K = V = 128 bf16): the cost
    model gives the call to the streaming kernel (recorded as a recurrent schedule), whose output and
    states match the float64 oracle as the chunked kernels' do; 64 of 64 tokens stay chunked. The
    cost model predicts only for devices whose ceilings were measured (elsewhere every prefill is
    chunked: plan.cost.prefill_algorithm)."""
    from recurscan.plan.cost import ceilings_for
    if ceilings_for(torch.cuda.get_device_name()) is None:
        pytest.skip(f"no measured ceilings for {torch.cuda.get_device_name()} in plan.cost.CEILINGS")
    N, T = 64, 2
    q, k, v, g, beta = inputs(N * T, 16, 32, 128, 128, seed=9)
    kw = dict(use_qk_l2norm_in_kernel=True, output_final_state=True)
    S0 = torch.randn(N, 32, 128, 128, device=DEV)
    if layout == "dense":
        q, k, v, g, beta = (x.reshape(N, T, *x.shape[2:]) for x in (q, k, v, g, beta))
        call = lambda: recurscan.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=S0, **kw)  # noqa: E731
        flat = [x.reshape(1, N * T, *x.shape[2:]) for x in (q, k, v, g, beta)]
    else:
        cu = torch.arange(N + 1, device=DEV, dtype=torch.int32) * T
        cache = torch.randn(N + 3, 32, 128, 128, device=DEV)
        slots = torch.randperm(N + 3, device=DEV)[:N].to(torch.int32)
        before = cache.clone()
        call = lambda: recurscan.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, state=cache,  # noqa: E731
                                                        state_indices=slots, use_qk_l2norm_in_kernel=True)
        S0 = before[slots.long()]
        flat = [q, k, v, g, beta]
    with torch.inference_mode(), recurscan.record_schedules() as log:
        o, S = call()
    assert [s.algorithm for _, _, s in log] == ["recurrent"], [s.describe() for _, _, s in log]
    wo, wS = gated_delta_rule_chunked(*(x.double() for x in flat), initial_state=S0.double(),
                                      use_qk_l2norm_in_kernel=True,
                                      cu_seqlens=torch.arange(N + 1, device=DEV) * T)
    check(o.reshape(wo.shape), wo, "o")
    check(S[slots.long()] if layout != "dense" else S, wS, "final states")
    q64, k64, v64, g64, b64 = inputs(N * 64, 16, 32, 128, 128, seed=10)
    with torch.inference_mode(), recurscan.record_schedules() as log:
        recurscan.chunk_gated_delta_rule(*(x.reshape(N, 64, *x.shape[2:]) for x in (q64, k64, v64, g64, b64)), **kw)
    assert [s.algorithm for _, _, s in log] == ["chunked"]
