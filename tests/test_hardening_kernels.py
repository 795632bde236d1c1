"""Hardening of the Triton paths (issue 17), as a specification. Each case runs on CPU tensors
under the interpreter (CI) and, marked ``gpu``, on the H200 at real head sizes
(``python -m pytest -m gpu tests/test_hardening_kernels.py``).

1. Strides: every state argument is read and written through its strides: a contiguous cache, a
   ``[S, HV, V, K]`` cache passed transposed, a slot-strided ``pool[::2]`` and a slice of a larger
   pool give the bits of the same call on a contiguous copy, write exactly their own rows, and
   leave every other row of the pool untouched. (Decode on the GPU runs a key-contiguous cache
   with a launch shape of its own, so there the reference is a contiguous cache of the same memory
   order, and the [K, V] run agrees to float32 rounding.)
2. Descriptors: wrong varlen descriptors on the CPU are a ValueError naming the entry; handed to
   the kernels anyway, they never write outside a tensor.
3. Causality: a NaN or inf at token t leaves every output before t, and every other sequence,
   bit-identical to the clean run; outputs from t on (in the affected columns) are not finite.
4. Growth (g > 0): right wherever float32 holds the token loop's result.
"""
import pytest
import torch

import recurscan
from recurscan.descriptors import build_chunk_descriptors
from recurscan.launch.delta import chunk_delta_fwd
from recurscan.reference.delta import gated_delta_rule_naive

CPU = "cpu"
GPU = pytest.param("cuda", marks=pytest.mark.gpu)
DEVICES = [CPU, GPU]


def dims(device):  # small under the interpreter, the models' head sizes on the GPU
    return dict(H=2, HV=4, K=16, V=32) if device == "cpu" else dict(H=4, HV=8, K=128, V=128)


def delta_inputs(device, T=150, M=1, dtype=torch.float32, seed=0):
    d = dims(device)
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    x = dict(q=r(1, T, d["H"], d["K"]), k=r(1, T * M, d["H"], d["K"]), v=r(1, T * M, d["HV"], d["V"]),
             g=-torch.rand(1, T, d["HV"], generator=gen), beta=torch.rand(1, T * M, d["HV"], generator=gen))
    return {n: t.to(device=device, dtype=dtype if n != "g" else torch.float32) for n, t in x.items()}


def run_delta(x, M=1, **kw):
    kw.setdefault("use_qk_l2norm_in_kernel", True)
    if M == 1:
        return recurscan.chunk_gated_delta_rule(**x, backend="triton", **kw)
    T = x["q"].shape[1]
    kw.setdefault("cu_seqlens", torch.tensor([0, T], device=x["q"].device))
    return recurscan.chunk_gated_delta_product_varlen(**x, num_householder=M, backend="triton", **kw)


# ---------------------------------------------------------------------------------------------
# 1. Strides
# ---------------------------------------------------------------------------------------------

LAYOUTS = ["contiguous", "transposed_vk", "pool_every_other", "slice_of_pool"]


def cache_view(pool_vk_last, layout, S):
    """A view with S slots [S, HV, K, V] over ``pool`` ([2S + 2, HV, K, V] or its [.., V, K] twin)."""
    if layout == "contiguous":
        return pool_vk_last[:S]
    if layout == "transposed_vk":
        return pool_vk_last  # built as [.., V, K] and transposed by the caller
    if layout == "pool_every_other":
        return pool_vk_last[::2][:S]
    return pool_vk_last[1:1 + S]


def make_pool(device, layout, S, HV, K, V, seed=1):
    gen = torch.Generator().manual_seed(seed)
    if layout == "transposed_vk":
        base = torch.randn(S, HV, V, K, generator=gen).to(device)
        return base, base.transpose(-1, -2)
    base = torch.randn(2 * S + 2, HV, K, V, generator=gen).to(device)
    return base, cache_view(base, layout, S)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("M", [1, 2])
def test_chunked_cache_through_strides(device, layout, M):
    d = dims(device)
    x = delta_inputs(device, T=150, M=M, dtype=torch.float32 if device == "cpu" else torch.bfloat16)
    cu = torch.tensor([0, 70, 70, 150], device=device)
    S = 4
    base, cache = make_pool(device, layout, S, d["HV"], d["K"], d["V"])
    idx = torch.tensor([2, -1, 0], device=device)
    before = base.clone()
    want_cache = torch.empty(cache.shape, dtype=cache.dtype, device=device).copy_(cache)
    want = run_delta(x, M, cu_seqlens=cu, state=want_cache, state_indices=idx) if M > 1 else \
        recurscan.chunk_gated_delta_rule(**x, cu_seqlens=cu, state=want_cache, state_indices=idx, backend="triton",
                                         use_qk_l2norm_in_kernel=True)
    got = run_delta(x, M, cu_seqlens=cu, state=cache, state_indices=idx) if M > 1 else \
        recurscan.chunk_gated_delta_rule(**x, cu_seqlens=cu, state=cache, state_indices=idx, backend="triton",
                                         use_qk_l2norm_in_kernel=True)
    assert got[1] is cache, "the in-place cache is returned, never a copy"
    assert torch.equal(got[0], want[0])
    assert torch.equal(cache, want_cache), "the written slots hold the contiguous run's states"
    # Every element of the pool outside the view's slots 0 and 2 is untouched.
    changed = (base != before).reshape(base.shape[0], -1).any(-1)
    owned = torch.zeros_like(changed)
    view_rows = {"contiguous": [0, 2], "transposed_vk": [0, 2], "pool_every_other": [0, 4],
                 "slice_of_pool": [1, 3]}[layout]
    owned[view_rows] = True
    assert not (changed & ~owned).any(), f"rows {(changed & ~owned).nonzero().flatten().tolist()} were written"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["transposed_vk", "pool_every_other"])
def test_chunked_initial_state_through_strides(device, layout):
    d = dims(device)
    x = delta_inputs(device, T=100)
    _, h0 = make_pool(device, layout, 1, d["HV"], d["K"], d["V"])
    o, S = run_delta(x, initial_state=h0, output_final_state=True)
    o_ref, S_ref = run_delta(x, initial_state=h0.contiguous(), output_final_state=True)
    assert torch.equal(o, o_ref) and torch.equal(S, S_ref)


# ---------------------------------------------------------------------------------------------
# 2. Descriptors
# ---------------------------------------------------------------------------------------------

def _varlen_call(device, **desc):
    x = delta_inputs(device, T=200)
    cu = torch.tensor([0, 10, 150, 200], device=device)
    return recurscan.chunk_gated_delta_rule(**x, cu_seqlens=cu, backend="triton", return_chunk_states=True,
                                            output_final_state=True, **desc)


BAD_DESCRIPTORS = {
    "offset past the rows": ("chunk_offsets", lambda d: d.chunk_offsets + torch.tensor([0, 0, 5, 9], dtype=torch.int32),
                             r"chunk_offsets: entry 2 is 9, expected 4"),
    "sequence out of range": ("chunk_indices", lambda d: d.chunk_indices.index_put_((torch.tensor([1]), torch.tensor([0])),
                                                                                    torch.tensor(7, dtype=torch.int32)),
                              r"chunk_indices: row 1 is \[7, 0\], expected \[1, 0\]"),
    "too short": ("chunk_indices", lambda d: d.chunk_indices[:3], r"chunk_indices: 3 rows, fewer than the 5 chunks"),
    "not int": ("chunk_indices", lambda d: d.chunk_indices.float(), r"chunk_indices: expected dtype int32 or int64"),
    "wrong shape": ("chunk_indices", lambda d: d.chunk_indices[:, 0], r"chunk_indices: expected shape \[chunks, 2\]"),
}


@pytest.mark.parametrize("case", list(BAD_DESCRIPTORS))
def test_bad_descriptors_are_named_on_cpu(case):
    name, corrupt, message = BAD_DESCRIPTORS[case]
    desc = build_chunk_descriptors([0, 10, 150, 200])
    given = dict(chunk_indices=desc.chunk_indices, chunk_offsets=desc.chunk_offsets)
    given[name] = corrupt(desc)
    with pytest.raises((ValueError, TypeError), match=message):
        _varlen_call("cpu", **given)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["offset past the rows", "sequence out of range", "too short", "bad cu_seqlens",
                                  "slot out of range"])
def test_bad_descriptors_never_write_outside(device, case):
    """Past the op's checks (a GPU does not read descriptors on the host): the kernels bound every
    index, so every tensor around the op's own keeps its bits. Called on chunk_delta_fwd directly."""
    d = dims(device)
    x = delta_inputs(device, T=200)
    cu = torch.tensor([0, 10, 150, 200], device=device)
    desc = build_chunk_descriptors([0, 10, 150, 200], device=device)
    ci, co = desc.chunk_indices.clone(), desc.chunk_offsets.clone()
    pool = torch.randn(8, d["HV"], d["K"], d["V"], device=device)
    before = pool.clone()
    state, idx = pool[2:5], torch.tensor([0, 1, 2], device=device)
    if case == "offset past the rows":
        co[2:] += 40
    elif case == "sequence out of range":
        ci[1, 0] = 1 << 20
    elif case == "too short":
        ci = ci[:2]
    elif case == "bad cu_seqlens":
        cu = torch.tensor([0, 500, -7, 200], device=device)
    else:
        idx = torch.tensor([0, 1 << 30, 2], device=device)
    out = chunk_delta_fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=cu, chunk_indices_dp=ci,
                          chunk_offsets=co, num_chunk_rows=desc.chunk_indices.shape[0], state=state,
                          state_indices=idx, return_chunk_states=True, use_qk_l2norm_in_kernel=True)
    if device == "cuda":
        torch.cuda.synchronize()
    assert out[2].shape[0] == desc.chunk_indices.shape[0]
    assert torch.equal(pool[:2], before[:2]) and torch.equal(pool[5:], before[5:]), "a row outside the cache changed"


def test_recursecan_check_validates_device_descriptors(monkeypatch):
    """RECURSCAN_CHECK=1 turns on the value checks for descriptors on any device (here: forced on
    CPU tensors, where they always run; the switch itself is read per call)."""
    from recurscan import problem
    monkeypatch.setenv("RECURSCAN_CHECK", "1")
    assert problem.debug_checks()
    monkeypatch.setenv("RECURSCAN_CHECK", "0")
    assert not problem.debug_checks()


# ---------------------------------------------------------------------------------------------
# 3. Causality under non-finite input
# ---------------------------------------------------------------------------------------------

def _poison(x, name, t, M, value):
    bad = {n: v.clone() for n, v in x.items()}
    row = t * M if name in ("k", "v", "beta") else t
    if name == "v":
        bad[name][0, row, :, 3] = value  # one value column: the others stay finite, as in the token loop
    else:
        bad[name][0, row] = value
    return bad


def _causal_cases():
    """Every case under the interpreter; on the GPU (compiled kernels, real head sizes) a NaN in
    each input at a chunk's middle and at a later chunk's middle."""
    for M in (1, 2):
        for name in ("q", "k", "v", "g", "beta"):
            for t in (0, 40, 63, 64, 100, 140):
                for value in (float("nan"), float("inf")):
                    yield pytest.param("cpu", M, name, t, value, id=f"cpu-M{M}-{name}-{t}-{value}")
            for t in (40, 100):
                yield pytest.param("cuda", M, name, t, float("nan"), marks=pytest.mark.gpu,
                                   id=f"cuda-M{M}-{name}-{t}-nan")


@pytest.mark.parametrize("device, M, name, t, value", list(_causal_cases()))
def test_nonfinite_input_is_causal(device, M, name, t, value):
    x = delta_inputs(device, T=150, M=M, dtype=torch.float32 if device == "cpu" else torch.bfloat16)
    o, S = run_delta(x, M, output_final_state=True)
    o_bad, S_bad = run_delta(_poison(x, name, t, M, value), M, output_final_state=True)
    assert torch.equal(o_bad[0, :t], o[0, :t]), "an output before the bad token changed"
    cols = [3] if name == "v" else slice(None)
    assert not torch.isfinite(o_bad[0, t, :, cols]).any(), "the bad token's output is finite"
    if name != "q":  # the state carries it: every later output is non-finite in the affected columns
        assert not torch.isfinite(o_bad[0, t:, :, cols]).any()
        assert not torch.isfinite(S_bad[..., cols]).any()
        if name == "v":
            others = [c for c in range(o.shape[-1]) if c != 3]
            assert torch.isfinite(o_bad[..., others]).all(), "a value column without bad input went non-finite"
    else:
        assert torch.equal(o_bad[0, t + 1:], o[0, t + 1:]) and torch.equal(S_bad, S)


@pytest.mark.parametrize("device", DEVICES)
def test_nonfinite_input_leaves_other_sequences(device):
    x = delta_inputs(device, T=200)
    cu = torch.tensor([0, 90, 200], device=device)
    o, S = run_delta(x, cu_seqlens=cu, output_final_state=True)
    bad = _poison(x, "k", 95, 1, float("nan"))
    o_bad, S_bad = run_delta(bad, cu_seqlens=cu, output_final_state=True)
    assert torch.equal(o_bad[0, :95], o[0, :95]) and torch.equal(S_bad[0], S[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("schedule", [dict(segments=3), dict(phases=3)])
def test_nonfinite_input_is_causal_in_every_schedule(device, schedule):
    x = delta_inputs(device, T=400)
    o, _ = chunk_delta_fwd(**x, use_qk_l2norm_in_kernel=True, **schedule)
    bad = _poison(x, "v", 200, 1, float("nan"))
    o_bad, S_bad = chunk_delta_fwd(**bad, use_qk_l2norm_in_kernel=True, output_final_state=True,
                                   **schedule)
    assert torch.equal(o_bad[0, :200], o[0, :200])
    assert not torch.isfinite(o_bad[0, 200:, :, 3]).any() and not torch.isfinite(S_bad[..., 3]).any()


# ---------------------------------------------------------------------------------------------
# 4. Growth
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("growth", [0.3, 1.5, 2.0])
def test_growth_is_right_where_float32_holds_it(device, growth):
    """g > 0 everywhere: every row whose true output (the float64 token loop) stays under 1e30 in
    magnitude, eight orders under float32's largest, is finite and right; a row the kernel cannot
    hold is NaN (a factor past 2^127 within a chunk is poisoned, not overflowed into earlier rows),
    and no finite row follows a non-finite one."""
    x = delta_inputs(device, T=100)
    x["g"] = torch.full_like(x["g"], growth)
    o, _ = run_delta(x)
    cpu = {n: t.cpu() for n, t in x.items()}
    want, _ = gated_delta_rule_naive(**{n: t.double() for n, t in cpu.items()}, use_qk_l2norm_in_kernel=True)
    representable = int((want[0].abs().flatten(1).amax(-1) < 1e30).int().cumprod(0).sum())
    ours = int(torch.isfinite(o[0]).flatten(1).all(-1).int().cumprod(0).sum())
    assert ours >= representable, f"finite to token {ours}, the true values stay under 1e30 to token {representable}"
    assert not torch.isfinite(o[0, ours:]).all(-1).all(-1).any(), "a finite row after a non-finite one"
    err = (o[0, :ours].double().cpu() - want[0, :ours]).abs().flatten(1).amax(-1)
    scale = want[0, :ours].abs().flatten(1).amax(-1)
    assert (err <= 1e-4 * scale).all()


BACKENDS = [("cpu", "torch"), ("cpu", "triton"), pytest.param("cuda", "triton", marks=pytest.mark.gpu)]


def _check_pool(base, before, view_rows):
    changed = (base != before).reshape(base.shape[0], -1).any(-1)
    owned = torch.zeros_like(changed)
    owned[view_rows] = True
    assert not (changed & ~owned).any(), f"rows {(changed & ~owned).nonzero().flatten().tolist()} were written"


VIEW_ROWS = {"contiguous": [0, 2], "transposed_vk": [0, 2], "pool_every_other": [0, 4], "slice_of_pool": [1, 3]}


@pytest.mark.parametrize("device, backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_cache_and_snapshots_through_strides(device, backend, layout):
    """Speculative decode (2 draft tokens) against a strided cache and a strided snapshot pool."""
    d = dims(device)
    gen = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=gen).to(device)  # noqa: E731
    N, T = 3, 2
    q, k, v = r(N, T, d["H"], d["K"]), r(N, T, d["H"], d["K"]), r(N, T, d["HV"], d["V"])
    g, beta = -torch.rand(N, T, d["HV"], generator=gen).to(device), torch.rand(N, T, d["HV"], generator=gen).to(device)
    base, cache = make_pool(device, layout, 4, d["HV"], d["K"], d["V"])
    snap_base = torch.randn(8, T, d["HV"], d["K"], d["V"], generator=gen).to(device)
    snaps = snap_base[::2]  # [4, T, HV, K, V], slot-strided
    idx = torch.tensor([2, -1, 0], device=device)
    before, snap_before = base.clone(), snap_base.clone()
    kw = dict(state_indices=idx, use_qk_l2norm_in_kernel=True, backend=backend)

    def run(state, snapshots):
        return recurscan.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, state=state,
                                                                 intermediate_states=snapshots, **kw)

    # The reference: a fresh contiguous tensor of the same memory order (a key-contiguous cache,
    # [S, HV, V, K] transposed, runs its own launch shape by rule on the GPU).
    fresh = (lambda c: c.transpose(-1, -2).contiguous().transpose(-1, -2)) if layout == "transposed_vk" \
        else (lambda c: c.contiguous())
    want_cache, want_snaps = fresh(cache.clone()), snaps.clone()
    o_ref, _ = run(want_cache, want_snaps)
    o, S = run(cache, snaps)
    assert S is cache
    assert torch.equal(o, o_ref) and torch.equal(cache, want_cache) and torch.equal(snaps, want_snaps)
    _check_pool(base, before, VIEW_ROWS[layout])
    _check_pool(snap_base, snap_before, [0, 4])
    if layout == "transposed_vk":  # and the key-contiguous shape agrees with the [K, V] one to fp32 rounding
        kv_cache, kv_snaps = before[:4].transpose(-1, -2).contiguous(), snap_before[::2].clone()
        o_kv, _ = run(kv_cache, kv_snaps)
        torch.testing.assert_close(o, o_kv, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(cache, kv_cache, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(snaps, kv_snaps, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device, backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_ssd_decode_cache_through_strides(device, backend, layout):
    gen = torch.Generator().manual_seed(4)
    H, P, Nst = (2, 8, 16) if device == "cpu" else (8, 64, 128)
    r = lambda *s: torch.randn(*s, generator=gen).to(device)  # noqa: E731
    b = 3
    base, cache = make_pool(device, layout, 4, H, P, Nst)  # [S, nheads, dim, dstate]
    x, dt = r(b, H, P), torch.rand(b, H, P, generator=gen).to(device)
    A = -torch.rand(H, generator=gen).to(device)[:, None, None].expand(H, P, Nst)
    B, C = r(b, 1, Nst), r(b, 1, Nst)
    idx = torch.tensor([2, -1, 0], device=device)
    before = base.clone()
    want_cache = torch.empty(cache.shape, device=device).copy_(cache)
    y_ref = recurscan.selective_state_update(want_cache, x, dt, A, B, C, state_batch_indices=idx, backend=backend)
    y = recurscan.selective_state_update(cache, x, dt, A, B, C, state_batch_indices=idx, backend=backend)
    assert torch.equal(y, y_ref) and torch.equal(cache, want_cache)
    _check_pool(base, before, VIEW_ROWS[layout])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ssd_chunked_cache_through_strides(layout):
    """Mamba2's chunked prefill (the PyTorch form) against a strided cache: the same bits as on a
    contiguous copy, its own slots written, every other row of the pool untouched."""
    gen = torch.Generator().manual_seed(5)
    H, P, Nst, T = 2, 8, 16, 100
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    base, cache = make_pool("cpu", layout, 4, H, P, Nst)  # [S, H, P, Nstate]
    x, dt = r(1, T, H, P), torch.rand(1, T, H, generator=gen)
    A, B, C = -torch.rand(H, generator=gen), r(1, T, 1, Nst), r(1, T, 1, Nst)
    cu, idx = torch.tensor([0, 30, 60, 100]), torch.tensor([2, -1, 0])
    before = base.clone()
    want_cache = torch.empty(cache.shape).copy_(cache)
    y_ref = recurscan.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=64, cu_seqlens=cu, state=want_cache,
                                                state_indices=idx)
    y = recurscan.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=64, cu_seqlens=cu, state=cache,
                                            state_indices=idx)
    assert torch.equal(y, y_ref) and torch.equal(cache, want_cache)
    _check_pool(base, before, VIEW_ROWS[layout])


@pytest.mark.parametrize("family", ["gla", "simple_gla", "diagonal", "ssd"])
@pytest.mark.parametrize("layout", ["transposed_vk", "pool_every_other"])
def test_initial_states_through_strides(family, layout):
    """Every family's initial state may arrive strided: the same bits as a contiguous copy."""
    gen = torch.Generator().manual_seed(6)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    T, H, K, V = 70, 2, 8, 12
    shape = {"diagonal": (2, 12), "ssd": (2, H, V, K)}.get(family, (2, H, K, V))
    base = r(2 * shape[0], *shape[1:-2], shape[-1], shape[-2]) if layout == "transposed_vk" and len(shape) > 2 \
        else r(2 * shape[0], *shape[1:])
    h0 = base[:shape[0]].transpose(-1, -2) if layout == "transposed_vk" and len(shape) > 2 else base[::2]
    if family == "diagonal":
        a, b = torch.rand(2, T, 12, generator=gen), r(2, T, 12)
        run = lambda h: recurscan.diagonal_scan(a, b, initial_state=h, output_final_state=True)  # noqa: E731
    elif family == "ssd":
        x, dt, B, C = r(2, T, H, V), torch.rand(2, T, H, generator=gen), r(2, T, 1, K), r(2, T, 1, K)
        A = -torch.rand(H, generator=gen)
        run = lambda h: recurscan.mamba_chunk_scan_combined(  # noqa: E731
            x, dt, A, B, C, chunk_size=64, initial_states=h, return_final_states=True)
    else:
        q, k, v = r(2, T, H, K), r(2, T, H, K), r(2, T, H, V)
        g = -torch.rand(2, T, H, K, generator=gen) if family == "gla" else -torch.rand(2, T, H, generator=gen)
        op = recurscan.chunk_gla if family == "gla" else recurscan.chunk_simple_gla
        run = lambda h: op(q, k, v, g, initial_state=h, output_final_state=True)  # noqa: E731
    got, want = run(h0), run(h0.contiguous())
    assert all(torch.equal(a, b) for a, b in zip(got, want))
