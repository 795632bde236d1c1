"""Mamba2 SSD on the GLA engine's kernel (``mamba_chunk_scan_combined(..., backend="triton")``:
q = C, k = B, v = dt x) under the interpreter, against the float64 token loop (ssd_naive),
bounded by what the float32 chunked oracle gets: the hostile cases of issue 20."""
import pytest
import torch

import recurscan
from recurscan.launch import delta as launch_delta
from recurscan.reference.ssd import ssd_chunked, ssd_naive
from tests.helpers.gla_forms import assert_the_backward_read_the_kept_states, use_form, use_grads_form
from tests.helpers.launches import delta_launches
from tests.helpers.tolerances import assert_like_fp32

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


CASES = {
    "T 1": dict(Bt=2, T=1, H=2, G=1, cu=None),
    "T 63, groups 2": dict(Bt=1, T=63, H=4, G=2, cu=None),
    "T 64, groups H": dict(Bt=1, T=64, H=2, G=2, cu=None),
    "T 65": dict(Bt=2, T=65, H=2, G=1, cu=None),
    "T 300": dict(Bt=1, T=300, H=2, G=1, cu=None),
    "varlen, one-token sequences": dict(Bt=1, T=200, H=4, G=2, cu=[0, 1, 2, 66, 67, 200]),
}


def ssd_inputs(Bt, T, H, G, P=8, N=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    A = -torch.rand(H, generator=gen, dtype=torch.float64)
    A[0] = 0.0  # decay exactly 1
    return dict(x=r(Bt, T, H, P), dt=r(Bt, T, H), A=A, B=r(Bt, T, G, N), C=r(Bt, T, G, N))


EXTRAS = ["D per head, z, dt_bias, softplus, h0", "D per channel, dt_limit", "none"]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("extras, form", [(e, "sweep") for e in EXTRAS] + [(e, "fused") for e in EXTRAS[:2]] +
                         [(e, "split") for e in EXTRAS[:2]] +
                         [(EXTRAS[0], "sweep segments"), (EXTRAS[0], "sweep phases")] +
                         [(e, "sweep, group prep") for e in EXTRAS] +
                         [(EXTRAS[0], "sweep segments, group prep"), (EXTRAS[0], "sweep phases, group prep")] +
                         [(e, "sweep, calm gates") for e in EXTRAS] +
                         [(EXTRAS[0], "sweep segments, calm gates"), (EXTRAS[0], "sweep phases, calm gates")] +
                         [(e, "sweep, scores in the sweep") for e in EXTRAS[1:]])
def test_triton_ssd_matches_the_token_loop(case, extras, form, monkeypatch):
    check_against_the_token_loop(CASES[case], extras, form, monkeypatch, seed=len(case))


@pytest.mark.parametrize("extras", [EXTRAS[0], EXTRAS[2]])
@pytest.mark.parametrize("form", ["sweep, group prep", "sweep, calm gates", "sweep, group prep, 4 heads a program",
                                  "sweep, group prep, 32 heads a program"])
def test_a_group_of_more_heads_than_a_group_prep_program_takes(form, extras, monkeypatch):
    """18 heads a group: the group prep's two programs a (chunk, group), 16 heads and 2 (the rest of
    the second's block masked), varlen with a one-token sequence; in blocks of at most 4 heads
    (DeltaShape.group_prep_heads: five programs, the last with 2), and of 32 (one, 14 masked)."""
    from recurscan.kernels.gla.group_prep import chunk_group_prep_kernel
    from recurscan.launch import gla as launch_gla
    from recurscan.runtime.cache import clear_caches
    clear_caches()  # the launches read below are this test's alone
    check_against_the_token_loop(dict(Bt=1, T=130, H=36, G=2, cu=[0, 1, 70, 130]), extras, form, monkeypatch,
                                 seed=5)
    blocks = {s.kwargs["HB"] for launches in launch_gla.GLA_SWEEP_LAUNCHES.values() for s in launches.steps
              if s.kernel is chunk_group_prep_kernel}
    assert blocks == {4 if "4 heads" in form else 32 if "32 heads" in form else 16}, blocks


def check_against_the_token_loop(c, extras, form, monkeypatch, seed):
    """The Triton path in a test form against the float64 token loop, within the float32 chunked
    form's error: the outputs and the final states."""
    use_form(form, monkeypatch)
    x = ssd_inputs(c["Bt"], c["T"], c["H"], c["G"], seed=seed)
    H, P, N = c["H"], 8, 16
    gen = torch.Generator().manual_seed(9)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    cu = None if c["cu"] is None else torch.tensor(c["cu"])
    n = c["Bt"] if cu is None else len(c["cu"]) - 1
    kw = dict(cu_seqlens=cu)
    if extras.startswith("D per head"):
        kw.update(D=r(H), z=r(c["Bt"], c["T"], H, P), dt_bias=r(H), dt_softplus=True, initial_states=r(n, H, P, N))
    elif extras.startswith("D per channel"):
        kw.update(D=r(H, P), dt_softplus=True, dt_limit=(0.1, 0.5))
    ref_kw = {("initial_state" if k == "initial_states" else k): v for k, v in kw.items()}
    want = ssd_naive(*x.values(), **ref_kw)
    f32 = lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
    ref32 = ssd_chunked(*map(f32, x.values()), **{k: f32(v) for k, v in ref_kw.items()})
    dev = lambda t: f32(t).to(DEVICE) if isinstance(t, torch.Tensor) else t  # noqa: E731
    got = recurscan.mamba_chunk_scan_combined(*map(dev, x.values()), **{k: dev(v) for k, v in kw.items()},
                                              return_final_states=True, backend="triton")
    for what, a, b, ref in zip(("y", "final state"), got, want, ref32):
        assert_like_fp32(a.cpu(), b, ref, what)


@pytest.mark.parametrize("form", ["sweep", "sweep, group prep", "sweep, calm gates", "sweep, scores in the sweep"])
@pytest.mark.parametrize("where", ["dt", "B"])
def test_a_nan_leaves_earlier_outputs_and_other_sequences_bit_identical(form, where, monkeypatch):
    """A NaN step size (its head) or key (B: every head of the group) mid-chunk: the outputs before
    it and the other sequence's keep their bits, the NaN reaches the outputs from it on (with the
    scores formed in the sweep, where the prep reads no key, through the sweep's own products)."""
    use_form(form, monkeypatch)
    x = {k: v.float().to(DEVICE) for k, v in ssd_inputs(1, 200, 2, 1, seed=4).items()}
    cu = torch.tensor([0, 130, 200], device=DEVICE)
    clean = recurscan.mamba_chunk_scan_combined(*x.values(), cu_seqlens=cu, dt_softplus=True,
                                                return_final_states=True, backend="triton")
    x[where] = x[where].clone()
    if where == "dt":
        x["dt"][0, 95, 1] = float("nan")
    else:
        x["B"][0, 95, 0, 3] = float("nan")
    y, h = recurscan.mamba_chunk_scan_combined(*x.values(), cu_seqlens=cu, dt_softplus=True,
                                               return_final_states=True, backend="triton")
    assert torch.equal(y[:, :95], clean[0][:, :95]) and torch.equal(y[:, 130:], clean[0][:, 130:])
    assert torch.equal(h[1], clean[1][1]) and torch.isnan(y[0, 95, 1]).any()


def _stormy_inputs():
    """test_calm_and_stormy_chunks_alike's inputs: T 300, 4 heads, one group, seq_idx resets in
    chunk 0; head 1 decays e^-3 a token through chunk 1 and the partial chunk 4, head 2 over the
    second half of chunk 2, head 3 by 2^-90 across chunk 3, head 0 calm throughout."""
    x = ssd_inputs(1, 300, 4, 1, seed=31)
    x["A"] = torch.tensor([-0.5, -1.0, -1.0, -1.0], dtype=torch.float64)
    x["dt"] = 0.05 * x["dt"].abs()
    x["dt"][0, 64:128, 1] = 3.0
    x["dt"][0, 256:, 1] = 3.0
    x["dt"][0, 160:192, 2] = 3.0
    x["dt"][0, 192:256, 3] = 90 / 64 / 1.4426950408889634
    return x, [0] * 20 + [1] * 30 + [2] * 250


@pytest.mark.parametrize("form", ["sweep, group prep", "sweep, calm gates"])
def test_calm_and_stormy_chunks_alike(form, monkeypatch):
    """The calm gates (kernels/gla/group_prep.py, CALM_LOG2_SPAN) beside chunks they must leave to
    the whole gate tile (:func:`_stormy_inputs`: factored, head 1's column factors in chunk 1
    would overflow). Against the float64 token loop, bounded by the float32 oracle."""
    use_form(form, monkeypatch)
    x, ids = _stormy_inputs()
    h0 = torch.zeros(1, 4, 8, 16, dtype=torch.float64)
    want_y, want_h = _per_sequence(x, [ids], h0)
    ref_y, ref_h = _per_sequence({k: v.float() for k, v in x.items()}, [ids], h0.float())
    f32 = lambda t: t.float().to(DEVICE)  # noqa: E731
    y, h = recurscan.mamba_chunk_scan_combined(*map(f32, x.values()), chunk_size=64, return_final_states=True,
                                               seq_idx=torch.tensor([ids], dtype=torch.int32, device=DEVICE),
                                               backend="triton")
    assert_like_fp32(y.cpu(), want_y, ref_y, "y")
    assert_like_fp32(h.cpu(), want_h, ref_h, "final state")


@pytest.mark.parametrize("form", ["sweep, group prep", "sweep, calm gates"])
def test_calm_and_stormy_chunks_train_alike(form, monkeypatch):
    """Gradients through the Triton path on :func:`_stormy_inputs`, the backward's reverse sweep
    reading the recompute's group prep (its calm chunks factored, the others by the whole tile):
    equal to the PyTorch form's through autograd."""
    use_form(form, monkeypatch)
    x, ids = _stormy_inputs()
    gen = torch.Generator().manual_seed(32)
    h0, dy = torch.randn(1, 4, 8, 16, generator=gen), torch.randn(1, 300, 4, 8, generator=gen)
    seq_idx = torch.tensor([ids], dtype=torch.int64, device=DEVICE)

    def grads(backend):
        leaves = [t.float().clone().to(DEVICE).requires_grad_() for t in (*x.values(), h0)]
        y, h = recurscan.mamba_chunk_scan_combined(*leaves[:5], initial_states=leaves[5], seq_idx=seq_idx,
                                                   chunk_size=64, return_final_states=True, backend=backend)
        return torch.autograd.grad((y, h), leaves, (dy.to(DEVICE), torch.ones_like(h)))

    for name, a, b in zip(("dx", "ddt", "dA", "dB", "dC", "dh0"), grads("triton"), grads("torch")):
        assert torch.isfinite(a).all(), name
        assert (a - b).norm() <= 1e-4 * b.norm(), f"{name}: {((a - b).norm() / b.norm()).item():.2e}"


@pytest.mark.parametrize("cu", [None, [0, 1, 70, 130]])
@pytest.mark.parametrize("form", ["sweep", "fused", "sweep, group prep"])
def test_outputs_without_the_final_states_are_the_same_bits(cu, form, monkeypatch):
    """A call that asks for no final states (the Triton path then neither stores nor transposes
    them) gives the outputs of one that asks, bit for bit, with initial states."""
    use_form(form, monkeypatch)
    Bt = 2 if cu is None else 1
    x = {k: v.float().to(DEVICE) for k, v in ssd_inputs(Bt, 130, 4, 2, seed=14).items()}
    n = Bt if cu is None else len(cu) - 1
    gen = torch.Generator().manual_seed(15)
    kw = dict(D=torch.randn(4, generator=gen).to(DEVICE), dt_softplus=True,
              initial_states=torch.randn(n, 4, 8, 16, generator=gen).to(DEVICE),
              cu_seqlens=None if cu is None else torch.tensor(cu, device=DEVICE))
    y = recurscan.mamba_chunk_scan_combined(*x.values(), backend="triton", **kw)
    y_with, final = recurscan.mamba_chunk_scan_combined(*x.values(), backend="triton", return_final_states=True,
                                                        **kw)
    assert torch.is_tensor(y) and torch.equal(y, y_with) and final.shape == (n, 4, 8, 16)


@pytest.mark.parametrize("cu", [None, [0, 1, 70, 130]])
@pytest.mark.parametrize("form", ["sweep", "fused", "split", "sweep, group prep", "sweep, calm gates"])
def test_state_cache_equals_the_torch_path(cu, form, monkeypatch):
    """The state cache on the Triton path: slots read and written in place through mamba's
    [S, H, P, Nstate] layout, a padding sequence (slot -1) with zero outputs and its slot untouched,
    slots no sequence names untouched: the same as the PyTorch path, with the same cache."""
    use_form(form, monkeypatch)
    Bt = 3 if cu is None else 1
    x = {k: v.float().to(DEVICE) for k, v in ssd_inputs(Bt, 130, 4, 2, seed=12).items()}
    n = Bt if cu is None else len(cu) - 1
    gen = torch.Generator().manual_seed(13)
    cache = torch.randn(6, 4, 8, 16, generator=gen).to(DEVICE)
    slots = torch.tensor([4, -1, 1][:n], dtype=torch.int32, device=DEVICE)
    kw = dict(D=torch.randn(4, generator=gen).to(DEVICE), dt_softplus=True, state_indices=slots,
              cu_seqlens=None if cu is None else torch.tensor(cu, device=DEVICE))
    mine, theirs = cache.clone(), cache.clone()
    y = recurscan.mamba_chunk_scan_combined(*x.values(), state=mine, backend="triton", **kw)
    want = recurscan.mamba_chunk_scan_combined(*x.values(), state=theirs, backend="torch", **kw)
    assert (y - want).abs().max() < 1e-4 and (mine - theirs).abs().max() < 1e-4
    untouched = [i for i in range(6) if i not in slots.tolist()]
    assert torch.equal(mine[untouched], cache[untouched])


def test_what_the_triton_path_refuses():
    x = {k: v.float() for k, v in ssd_inputs(1, 10, 2, 1).items()}
    x["x"].requires_grad_()
    with pytest.raises(NotImplementedError, match="inference-only"):
        recurscan.mamba_chunk_scan_combined(*x.values(), state=torch.zeros(2, 2, 8, 16),
                                            state_indices=torch.tensor([0], dtype=torch.int32), backend="triton")


@pytest.mark.parametrize("extras, form, grads", [("D per head, z", "sweep", "per head"),
                                                ("D per channel, no z", "sweep", "per head"),
                                                ("no D, no z", "sweep", "per head"),
                                                ("D per head, z", "sweep, group prep", "per head"),
                                                ("D per head, z", "sweep, group prep", "group"),
                                                ("no D, no z", "sweep, group prep", "group, dg with dq and dk"),
                                                ("D per channel, no z", "sweep", "group in shares"),
                                                ("D per head, z", "sweep", "group, dq and dk apart"),
                                                ("D per head, z", "fused", "per head")])
@pytest.mark.parametrize("cu", [None, [0, 1, 70, 130]])
def test_triton_gradients_match_autograd_through_the_token_loop(cu, extras, form, grads, monkeypatch):
    """Gradients of x, dt, A, B, C, D, z, dt_bias and the initial states through the Triton path
    (the GLA kernels' backward, the elementwise prologue and epilogue by autograd) against
    autograd through the float64 token loop; the forward and the backward's recompute in ``form``,
    the parallel stage in ``grads`` (tests/helpers/gla_forms.py; 8 heads in 2 groups there)."""
    check_ssd_gradients(cu, extras, form, grads, monkeypatch)


@pytest.mark.parametrize("form, grads", [("sweep", "per head"), ("sweep, group prep", "group"),
                                         ("sweep, scores in the sweep", "per head")])
@pytest.mark.parametrize("cu", [None, [0, 1, 70, 130]])
def test_gradients_from_the_chunk_states_the_forward_kept(cu, form, grads, monkeypatch):
    """plan.gla.GLA_FORWARD_STATES: SSD's training forward keeps the state entering every chunk
    (from x raw with dt in the gates; in the kernels' dtype, not filled: buffers are poisoned with
    NaN when allocated, so a row the forward left unwritten would reach the gradients), and the
    backward reads them in place of its recompute's sweep: every gradient as above; the backward's
    recompute keeps its group prep alone where the reverse sweep reads its scores, else nothing."""
    from recurscan.plan import gla as plan_gla
    from recurscan.runtime.cache import clear_caches
    monkeypatch.setattr(plan_gla, "GLA_FORWARD_STATES", True)
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)
    clear_caches()
    check_ssd_gradients(cu, "D per head, z", form, grads, monkeypatch)
    assert_the_backward_read_the_kept_states(group_prep=form == "sweep, group prep")


@pytest.mark.parametrize("extras, form, grads", [("D per head, no z", "sweep", "per head"),
                                                ("D per channel, no z", "sweep, group prep", "group"),
                                                ("no D, no z", "sweep, scores in the sweep", "per head"),
                                                ("D per head, z", "sweep, group prep", "group")])
@pytest.mark.parametrize("cu", [None, [0, 1, 70, 130]])
def test_gradients_with_x_and_dt_formed_in_the_reverse_sweep(cu, extras, form, grads, monkeypatch):
    """plan.gla.GLA_REVERSE_SSD_GRADS: without a gate z the reverse sweep forms x's gradient, dt's
    through v = dt x and D's sums (SSD_GRADS) where it would write dV, and no elementwise pass
    runs after it but dt's dg A; with z the backward keeps that pass. Every gradient as above, with
    buffers poisoned (NaN) when allocated, and the sweep was built with the flag exactly where z
    is absent."""
    from recurscan.launch import gla as launch_gla
    from recurscan.plan import gla as plan_gla
    from recurscan.runtime.cache import clear_caches
    monkeypatch.setattr(plan_gla, "GLA_REVERSE_SSD_GRADS", True)
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)
    clear_caches()
    check_ssd_gradients(cu, extras, form, grads, monkeypatch)
    built = list(launch_gla.GLA_BACKWARD_LAUNCHES.values())
    assert built and all(b.steps[0].kwargs["SSD_GRADS"] == extras.endswith("no z") for b in built)


@pytest.mark.parametrize("grads", ["group", "group, dg with dq and dk", "group in shares", "group, dq and dk apart",
                                   "per head"])
@pytest.mark.parametrize("cu", [None, [0, 1, 70, 130]])
def test_gradients_with_v_formed_in_the_parallel_stage(cu, grads, monkeypatch):
    """With the chunk states kept by the forward and x's and dt's gradients in the reverse sweep
    (no gate z), nothing but the parallel stage reads v = dt x, and its group form can take x and dt
    instead (plan.gla.GLA_PARALLEL_V_FROM_X, V_FROM_X: dt as the row factors of V dS'^T's left operand and the column factors of dO
    V^T), so v is never formed: every gradient as above, with buffers poisoned; one value head a
    program (no group form) forms v as before."""
    import recurscan.autograd.ssd as autograd_ssd
    from recurscan.launch import gla as launch_gla
    from recurscan.plan import gla as plan_gla
    from recurscan.runtime.cache import clear_caches
    monkeypatch.setattr(plan_gla, "GLA_FORWARD_STATES", True)
    monkeypatch.setattr(plan_gla, "GLA_REVERSE_SSD_GRADS", True)
    monkeypatch.setattr(plan_gla, "GLA_PARALLEL_V_FROM_X", True)
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)
    formed = []
    values = autograd_ssd.values
    monkeypatch.setattr(autograd_ssd, "values", lambda *a: formed.append(1) or values(*a))
    clear_caches()
    check_ssd_gradients(cu, "D per head, no z", "sweep, group prep", grads, monkeypatch)
    built = list(launch_gla.GLA_BACKWARD_LAUNCHES.values())
    group = grads != "per head"
    assert built and all(b.v_from_x == group for b in built) and bool(formed) != group


def check_ssd_gradients(cu, extras, form, grads, monkeypatch):
    use_form(form, monkeypatch)
    use_grads_form(grads, monkeypatch)
    Bt = 2 if cu is None else 1
    H = 4 if grads == "per head" else 8
    x = ssd_inputs(Bt, 130, H, 2, seed=7)
    gen = torch.Generator().manual_seed(8)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    n = Bt if cu is None else len(cu) - 1
    extra = dict(D=r(H), z=r(Bt, 130, H, 8), dt_bias=r(H), initial_states=r(n, H, 8, 16))
    if extras == "D per channel, no z":
        extra.update(D=r(H, 8), z=None)
    elif extras == "D per head, no z":
        extra.update(z=None)
    elif extras == "no D, no z":
        extra.update(D=None, z=None)
    cu_t = None if cu is None else torch.tensor(cu)
    names = list(x) + list(extra)
    ref = [None if t is None else t.clone().requires_grad_() for t in (*x.values(), *extra.values())]
    y, h = ssd_naive(*ref[:5], D=ref[5], z=ref[6], dt_bias=ref[7], initial_state=ref[8], dt_softplus=True,
                     cu_seqlens=cu_t)
    dy, dh = torch.randn(y.shape, generator=gen, dtype=torch.float64), torch.randn(h.shape, generator=gen,
                                                                                   dtype=torch.float64)
    live = [i for i, t in enumerate(ref) if t is not None]
    want = torch.autograd.grad((y, h), [ref[i] for i in live], (dy, dh))
    mine = [None if t is None else t.float().to(DEVICE).requires_grad_() for t in ref]
    y2, h2 = recurscan.mamba_chunk_scan_combined(*mine[:5], D=mine[5], z=mine[6], dt_bias=mine[7],
                                                 initial_states=mine[8], dt_softplus=True,
                                                 cu_seqlens=None if cu_t is None else cu_t.to(DEVICE),
                                                 return_final_states=True, backend="triton")
    got = torch.autograd.grad((y2, h2), [mine[i] for i in live], (dy.float().to(DEVICE), dh.float().to(DEVICE)))
    from tests.helpers.tolerances import relative_rms
    for name, a, b in zip([names[i] for i in live], got, want):
        assert relative_rms(a.double().cpu(), b) < 2e-5, f"{name}: {relative_rms(a.double().cpu(), b):.2e}"


@pytest.mark.parametrize("form, fold, kept", [("sweep", False, False), ("fused", False, False), ("sweep", True, False),
                                             ("sweep", True, True)])
def test_the_training_forward_starts_the_backward_compiling(form, fold, kept, monkeypatch):
    """SSD's training forward (the recurrence's kernels with v = dt x and D x inside, as inference
    runs them) starts its backward compiling on the signature's first call, from x's signature
    for v and the step sizes' for g (launch/gla.py's _backward_decay): the backward then finds
    those launches (none built again), waits for the compiles, and its gradients are the ones a
    call without the early compile gives. The compiler is recorded here: the interpreter compiles
    nothing. ``fold``: with x's and dt's gradients formed in the reverse sweep
    (plan.gla.GLA_REVERSE_SSD_GRADS), whose flags the forward's early build shares with the
    backward's. ``kept``: with the chunk states kept by the forward (plan.gla.GLA_FORWARD_STATES),
    three heads with no group prep, so that the backward recomputes nothing and compiles its own
    launches alone."""
    import recurscan.launch.gla as lg
    from recurscan.plan import gla as plan_gla
    monkeypatch.setattr(plan_gla, "GLA_REVERSE_SSD_GRADS", fold)
    monkeypatch.setattr(plan_gla, "GLA_FORWARD_STATES", kept)
    use_form(form, monkeypatch)
    x = {k: v.float() for k, v in ssd_inputs(1, 97, 3, 1, seed=31).items()}  # a signature no other test has
    gen = torch.Generator().manual_seed(32)
    D, dy = torch.randn(3, generator=gen), torch.randn(1, 97, 3, 8, generator=gen)

    def grads():
        leaves = [t.clone().to(DEVICE).requires_grad_() for t in (*x.values(), D)]
        y = recurscan.mamba_chunk_scan_combined(*leaves[:5], D=leaves[5], dt_softplus=True, backend="triton")
        return torch.autograd.grad(y, leaves, dy.to(DEVICE))

    want = grads()  # built and launched on the backward's first call
    lg.GLA_SWEEP_LAUNCHES.clear(), lg.GLA_LAUNCHES.clear(), lg.GLA_BACKWARD_LAUNCHES.clear()
    handed, waited = [], []
    monkeypatch.setattr(lg, "INTERPRET", False)
    monkeypatch.setattr(lg, "compile_in_background",
                        lambda launches, names, values, device: handed.append(names) or (lambda: waited.append(1)))
    got = grads()
    recompute = [] if kept else [lg.CALL_NAMES if form == "sweep" else lg.NAMES]
    assert handed == [*recompute, lg.BWD_NAMES] and waited == [1] * len(handed)
    (built,) = lg.GLA_BACKWARD_LAUNCHES.values()  # the forward's, found by the backward
    assert built.pending is None and built.steps[0].kwargs["SSD_GRADS"] == fold and (built.forward is None) == kept
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


SEQ_IDX = [[0, 0, 0, 1, 1, 1, 1, 1] + [1] * 62 + [2] + [5] * 59,  # a one-token sequence; ids need not be consecutive
           [7] * 64 + [8] * 66]  # a start on a chunk boundary


def _per_sequence(x, seq_idx, h0, **kw):
    """The ground truth for packed rows: each sequence of each row through the float64 token loop
    alone, the row's initial state entering its first; (y, each row's last final state)."""
    ys, finals = [], []
    for b, ids in enumerate(seq_idx):
        starts = [t for t in range(1, len(ids)) if ids[t] != ids[t - 1]]
        cu = torch.tensor([0, *starts, len(ids)])
        row = {k: v[b:b + 1] if v.dim() > 1 else v for k, v in x.items()}
        H, P, N = row["x"].shape[2], row["x"].shape[3], row["B"].shape[3]
        s0 = torch.cat([h0[b:b + 1], h0.new_zeros(len(starts), H, P, N)])
        row_kw = {k: v[b:b + 1] if k == "z" else v for k, v in kw.items()}
        y, final = ssd_naive(*row.values(), initial_state=s0, cu_seqlens=cu, **row_kw)
        ys.append(y)
        finals.append(final[-1:])
    return torch.cat(ys), torch.cat(finals)


@pytest.mark.parametrize("backend, form", [("torch", "sweep")] + [("triton", f) for f in ("sweep", "fused", "split",
                                                                                           "sweep, group prep",
                                                                                           "sweep, calm gates")])
def test_seq_idx_packs_sequences_in_a_row(backend, form, monkeypatch):
    """mamba_ssm's seq_idx [Bt, T]: the state resets wherever it changes (a one-token sequence, a
    start on a chunk boundary, ids that skip), initial states enter each row's first sequence and
    the final states are each row's last sequence's; against each sequence through the float64
    token loop alone."""
    use_form(form, monkeypatch)
    x = ssd_inputs(2, 130, 4, 2, seed=21)
    gen = torch.Generator().manual_seed(22)
    D, z, h0 = torch.randn(4, generator=gen).double(), torch.randn(2, 130, 4, 8, generator=gen).double(), \
        torch.randn(2, 4, 8, 16, generator=gen).double()
    kw = dict(D=D, z=z, dt_softplus=True)
    want_y, want_h = _per_sequence(x, SEQ_IDX, h0, **kw)
    f32 = lambda t: t.float().to(DEVICE)  # noqa: E731
    seq_idx = torch.tensor(SEQ_IDX, dtype=torch.int32, device=DEVICE)
    y, h = recurscan.mamba_chunk_scan_combined(*map(f32, x.values()), D=f32(D), z=f32(z), dt_softplus=True,
                                               initial_states=f32(h0), seq_idx=seq_idx, chunk_size=64,
                                               return_final_states=True, backend=backend)
    ref32 = _per_sequence({k: v.float() for k, v in x.items()}, SEQ_IDX, h0.float(), D=D.float(), z=z.float(),
                          dt_softplus=True)
    assert_like_fp32(y.cpu(), want_y, ref32[0], "y")
    assert_like_fp32(h.cpu(), want_h, ref32[1], "final state")


def test_seq_idx_trains_on_the_triton_path():
    """Gradients with seq_idx on the Triton path (the resets as -inf log decays inside the GLA
    kernels' autograd) equal the PyTorch form's through autograd."""
    x = {k: v.float() for k, v in ssd_inputs(2, 130, 4, 2, seed=23).items()}
    gen = torch.Generator().manual_seed(24)
    h0, dy = torch.randn(2, 4, 8, 16, generator=gen), torch.randn(2, 130, 4, 8, generator=gen)
    seq_idx = torch.tensor(SEQ_IDX, dtype=torch.int64, device=DEVICE)

    def grads(backend):
        leaves = [t.clone().to(DEVICE).requires_grad_() for t in (*x.values(), h0)]
        y, h = recurscan.mamba_chunk_scan_combined(*leaves[:5], initial_states=leaves[5], seq_idx=seq_idx,
                                                   dt_softplus=True, return_final_states=True, backend=backend)
        return torch.autograd.grad((y, h), leaves, (dy.to(DEVICE), torch.ones_like(h)))

    for name, a, b in zip(("dx", "ddt", "dA", "dB", "dC", "dh0"), grads("triton"), grads("torch")):
        assert torch.isfinite(a).all(), name
        assert (a - b).norm() <= 1e-4 * b.norm(), f"{name}: {((a - b).norm() / b.norm()).item():.2e}"


def test_seq_idx_is_validated():
    x = {k: v.float() for k, v in ssd_inputs(2, 10, 2, 1).items()}
    with pytest.raises(TypeError, match="seq_idx: expected dtype"):
        recurscan.mamba_chunk_scan_combined(*x.values(), seq_idx=torch.zeros(2, 10))
    with pytest.raises(ValueError, match="seq_idx: expected shape"):
        recurscan.mamba_chunk_scan_combined(*x.values(), seq_idx=torch.zeros(2, 9, dtype=torch.int32))
    with pytest.raises(ValueError, match="return_varlen_states: needs cu_seqlens"):
        recurscan.mamba_chunk_scan_combined(*x.values(), seq_idx=torch.zeros(2, 10, dtype=torch.int32),
                                            return_varlen_states=True)
    with pytest.raises(ValueError, match="seq_idx: a state cache"):
        recurscan.mamba_chunk_scan_combined(*x.values(), seq_idx=torch.zeros(2, 10, dtype=torch.int32),
                                            state=torch.zeros(4, 2, 8, 16), state_indices=torch.tensor([0, 1]))


@pytest.mark.parametrize("cu", [None, [0, 1, 70, 200]], ids=["dense", "varlen"])
@pytest.mark.parametrize("backend, form", [("torch", "sweep")] + [("triton", f) for f in ("sweep", "fused", "split",
                                                                                           "sweep, group prep",
                                                                                           "sweep, calm gates")])
def test_chunk_states_every_64_tokens_in_mambas_layout(cu, backend, form, monkeypatch):
    """return_chunk_states: [NT, H, P, Nstate] float32, the state entering each 64-token chunk of
    each sequence at the delta ops' rows whatever chunk_size is, against the float64 token loop."""
    use_form(form, monkeypatch)
    Bt = 2 if cu is None else 1
    x = ssd_inputs(Bt, 200, 4, 2, seed=41)
    cu_t = None if cu is None else torch.tensor(cu)
    want = ssd_naive(*x.values(), dt_softplus=True, cu_seqlens=cu_t, return_chunk_states=True)
    ref32 = ssd_chunked(*(t.float() for t in x.values()), dt_softplus=True, cu_seqlens=cu_t, return_chunk_states=True)
    dev = lambda t: None if t is None else (t.float() if t.is_floating_point() else t).to(DEVICE)  # noqa: E731
    y, h, chunks = recurscan.mamba_chunk_scan_combined(*map(dev, x.values()), chunk_size=256, dt_softplus=True,
                                                       cu_seqlens=dev(cu_t), return_final_states=True,
                                                       return_chunk_states=True, backend=backend)
    assert chunks.dtype == torch.float32 and chunks.shape == want[2].shape
    for what, a, b, r in zip(("y", "final state", "chunk states"), (y, h, chunks), want, ref32):
        assert_like_fp32(a.cpu(), b, r, what)


def test_ssd_training_with_descriptors_builds_none(monkeypatch):
    import recurscan.descriptors as descriptors
    x = {k: v.float().to(DEVICE) for k, v in ssd_inputs(1, 200, 4, 2, seed=42).items()}
    cu = torch.tensor([0, 1, 70, 200], device=DEVICE)
    d = recurscan.build_chunk_descriptors(cu, device=DEVICE)
    monkeypatch.setattr(descriptors, "build_chunk_descriptors", lambda *a, **kw: pytest.fail("built descriptors"))
    leaves = [t.clone().requires_grad_() for t in x.values()]
    y = recurscan.mamba_chunk_scan_combined(*leaves, cu_seqlens=cu, chunk_indices=d.chunk_indices,
                                            chunk_offsets=d.chunk_offsets, dt_softplus=True, backend="triton")
    assert all(torch.isfinite(gr).all() for gr in torch.autograd.grad(y.sum(), leaves))
    with pytest.raises(NotImplementedError, match="return_chunk_states is inference-only"):
        recurscan.mamba_chunk_scan_combined(*leaves, cu_seqlens=cu, return_chunk_states=True, backend="triton")
    with pytest.raises(ValueError, match="return_chunk_states: chunk states are per sequence"):
        recurscan.mamba_chunk_scan_combined(*x.values(), seq_idx=torch.zeros(1, 200, dtype=torch.int32, device=DEVICE),
                                            return_chunk_states=True)


@pytest.mark.parametrize("groups", [1, 2])
def test_prep_programs_over_several_heads_give_the_same_bits(groups, monkeypatch):
    """The sweep's prep with 4 value heads a program (sharing C, B and C B^T; 2 a program where
    a group has 2 heads) writes what one head a program writes: the same outputs and states, bit
    for bit, with every prologue and epilogue part on, a reset and a NaN step mid-sequence."""
    x = ssd_inputs(1, 150, 4, groups, seed=groups)
    x["dt"][0, 90, 1] = float("nan")
    gen = torch.Generator().manual_seed(4)
    kw = dict(D=torch.randn(4, generator=gen), z=torch.randn(1, 150, 4, 8, generator=gen), dt_bias=torch.randn(4),
              dt_softplus=True, dt_limit=(0.01, 2.0), seq_idx=(torch.arange(150) >= 70).int()[None])
    f32 = {k: v.float().to(DEVICE) for k, v in x.items()}
    kw = {k: (v.float() if v.is_floating_point() else v).to(DEVICE) if isinstance(v, torch.Tensor) else v
          for k, v in kw.items()}
    got = {}
    for form in ("sweep, 1 head a prep program", "sweep, 4 heads a prep program"):
        with monkeypatch.context() as m:
            use_form(form, m)
            got[form] = recurscan.mamba_chunk_scan_combined(*f32.values(), chunk_size=64, return_final_states=True,
                                                            backend="triton", **kw)
    one, four = got.values()
    assert torch.isnan(one[0][0, 90:, 1]).any() and not torch.isnan(one[0][0, :90]).any()
    for a, b in zip(one, four):  # the same bits, NaN where NaN
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_training_gate_kernels_match_the_reference(dtype):
    """autograd/ssd.py's gate_forward and gate_backward (one Triton pass each: y = u silu(z) on the
    recurrence's u = o + D x) against reference.ssd.skip_and_gate under autograd in float64: y and
    the gradients of u and z, over rows that are not a multiple of the kernel's block and a head
    dim that is not a power of two."""
    from recurscan.autograd.ssd import gate_backward, gate_forward
    from recurscan.reference.ssd import skip_and_gate
    from tests.helpers.tolerances import relative_rms
    gen = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    u, z = r(2, 75, 3, 12).requires_grad_(), (r(2, 75, 3, 12) * 3).requires_grad_()
    want = skip_and_gate(u, torch.zeros_like(u), None, z)
    dy = r(*want.shape)
    want_grads = torch.autograd.grad(want, (u, z), dy)
    mine = [t.detach().to(dtype).to(DEVICE) for t in (u, z)]
    y = gate_forward(*mine)
    grads = gate_backward(dy.to(dtype).to(DEVICE), *mine)
    bound = 1e-6 if dtype == torch.float32 else 1e-2
    assert relative_rms(y.double().cpu(), want.detach()) < bound
    for name, g, w in zip("uz", grads, want_grads):
        assert g.dtype == dtype, name
        assert relative_rms(g.double().cpu(), w) < bound, f"d{name}: {relative_rms(g.double().cpu(), w):.1e}"


@pytest.mark.parametrize("D_form, with_z", [(None, False), (None, True), ("head", False), ("head", True),
                                            ("channel", False), ("channel", True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_training_step_kernel_matches_the_reference(D_form, with_z, dtype):
    """autograd/ssd.py's step_backward (one Triton pass: x's gradient through v = dt x and the
    skip, dt's through v and the log decay dt A, D's) against autograd in float64 through
    <dv, dt x> + <dg, dt A> + <dy, skip_and_gate(o, x, D, z)>: dx, ddt and dD (None without D),
    over rows that are not a multiple of the kernel's block and a head dim that is not a power of
    two."""
    from recurscan.autograd.ssd import step_backward
    from recurscan.reference.ssd import skip_and_gate
    from tests.helpers.tolerances import relative_rms
    gen = torch.Generator().manual_seed(4)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    x, step = r(2, 75, 3, 12).requires_grad_(), r(2, 75, 3).abs().requires_grad_()
    D = None if D_form is None else (r(3) if D_form == "head" else r(3, 12)).requires_grad_()
    o, z, A = r(2, 75, 3, 12), (r(2, 75, 3, 12) * 3 if with_z else None), -r(3).abs()
    dv, dg, dy = r(2, 75, 3, 12), r(2, 75, 3), r(2, 75, 3, 12)
    loss = (dv * step[..., None] * x).sum() + (dg * step * A).sum() + (dy * skip_and_gate(o, x, D, z)).sum()
    leaves = {name: t for name, t in zip("xtD", (x, step, D)) if t is not None}
    want = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
    low = lambda t: None if t is None else t.detach().to(dtype).to(DEVICE)  # noqa: E731
    dx, dstep, dD = step_backward(dv.float().to(DEVICE), dg.float().to(DEVICE), low(x), step.detach().float().to(DEVICE),
                                  A.float().to(DEVICE), low(dy), None if D is None else D.detach().float().to(DEVICE),
                                  low(z))
    bound = 1e-6 if dtype == torch.float32 else 1e-2
    assert dx.dtype == dtype and dstep.dtype == torch.float32
    for name, g in (("x", dx), ("t", dstep), ("D", dD)):
        if name not in want:
            assert g is None, name
            continue
        err = relative_rms(g.double().cpu(), want[name])
        assert err < bound, f"d{name}: {err:.1e}"


def test_the_planner_takes_the_group_prep_where_the_h200_measured_it_faster(monkeypatch):
    """SSD at Mamba2's sizes (80 heads of 64, one group, dstate 128) on the H200's 132 SMs, where
    the Gluon twin cannot run (float32 inputs; no GPU here): B4 T4096 (320 sweep programs) takes
    the group prep at two stages (without its calm gates, which lost there); B1 T16384 (80
    programs) the delta prep in 6 phases; the backward's recompute takes the group prep with its
    calm gates at both (two stages); a group of 4 heads takes it nowhere."""
    from recurscan.plan import gla as plan_gla
    from recurscan.problem import ssd_problem
    monkeypatch.setattr(plan_gla, "sm_count", lambda device: 132)

    def sweep(Bt, T, H=80, G=1):
        meta = dict(device="meta")
        problem = ssd_problem(torch.empty(Bt, T, H, 64, **meta), torch.empty(Bt, T, H, **meta),
                              torch.empty(H, **meta), torch.empty(Bt, T, G, 128, **meta),
                              torch.empty(Bt, T, G, 128, **meta))
        shape = plan_gla.gla_sweep_shape(problem, torch.device("cuda"))
        return shape, plan_gla.recompute_sweep_shape(shape, G, H)

    b4, b4_recompute = sweep(4, 4096)
    assert b4.group_prep and not b4.calm_gates and b4.num_stages == 2 and b4.phases == 1
    assert b4_recompute.group_prep and b4_recompute.calm_gates
    b1, b1_recompute = sweep(1, 16384)
    assert not b1.group_prep and b1.phases == 6 and b1.num_stages == 3
    assert b1_recompute.group_prep and b1_recompute.calm_gates and b1_recompute.phases == 1
    assert b1_recompute.num_stages == 2
    few, few_recompute = sweep(4, 4096, H=8, G=2)
    assert not few.group_prep and not few_recompute.group_prep


@pytest.mark.parametrize("case, planned, group_prep", [
    ("B1 T16384, 6 phases", True, False), ("B1 T16384, the group prep, its row on", True, True),
    ("B1 T16384, the group prep, its row on, a gate z", True, False), ("row off", False, False),
    ("no usable Gluon", False, False), ("no usable Gluon, its row on", False, False),
    ('backend="triton"', False, False), ("B4 T4096, the group prep", False, True),
    ("B4 T4096, the group prep, its row on", True, True), ("float32", False, False), ("dstate 96", False, False),
    ("a decay per key", False, False)])
def test_the_planner_gives_the_gla_sweep_to_its_gluon_twin_only_in_scope(monkeypatch, case, planned, group_prep):
    """plan.gla.gluon_gla_forward_sweep and GLA_SWEEP_LAUNCH's row that names the twin (the Gluon
    rules, docs/kernels-gluon.md): the twin with the WY step off takes a phased row of its kind (64
    value columns on one warpgroup, the delta prep), and where GLUON_GLA_GROUP_SWEEP is on the
    group prep's row in one pass (SSD B1 and B4; warp-specialised, DeltaShape.specialized), except
    with a gate z (the launch would run the Triton sweep, which is faster in phases on the delta
    prep there); 16-bit inputs, K 64 or 128, Gluon usable here, the caller not forcing Triton; never
    a decay per key, and never the backward's recompute (GLUON_GLA_RECOMPUTE_SWEEP, off)."""
    import dataclasses
    from recurscan.plan import gla as plan_gla
    from recurscan.problem import gla_problem, ssd_problem
    monkeypatch.setattr(plan_gla, "sm_count", lambda device: 132)
    monkeypatch.setattr(plan_gla, "gluon_usable", lambda device: "no usable Gluon" not in case)
    monkeypatch.setattr(plan_gla, "GLUON_GLA_FORWARD_SWEEP",
                        dataclasses.replace(plan_gla.GLUON_GLA_FORWARD_SWEEP, on=case != "row off"))
    monkeypatch.setattr(plan_gla, "GLUON_GLA_GROUP_SWEEP",
                        dataclasses.replace(plan_gla.GLUON_GLA_GROUP_SWEEP, on="its row on" in case))
    meta = dict(device="meta", dtype=torch.float32 if case == "float32" else torch.bfloat16)
    Bt, T = (4, 4096) if "B4" in case else (1, 16384)
    N = 96 if case == "dstate 96" else 128
    if case == "a decay per key":
        q = torch.empty(1, 16384, 80, 128, **meta)
        problem = gla_problem(q, q, torch.empty(1, 16384, 80, 64, **meta), torch.empty(1, 16384, 80, 128,
                                                                                       device="meta"),
                              per_key_decay=True)
        shape = plan_gla.gla_shape(problem, torch.device("cuda")).sweep
    else:
        z = torch.empty(Bt, T, 80, 64, **meta) if case.endswith("a gate z") else None
        problem = ssd_problem(torch.empty(Bt, T, 80, 64, **meta), torch.empty(Bt, T, 80, device="meta"),
                              torch.empty(80, device="meta"), torch.empty(Bt, T, 1, N, **meta),
                              torch.empty(Bt, T, 1, N, **meta), z=z)
        shape = plan_gla.gla_shape(problem, torch.device("cuda"), gluon=case != 'backend="triton"').sweep
    assert shape.gluon_sweep is planned
    if case != "a decay per key":
        assert shape.group_prep is group_prep and (shape.phases == 1 or not group_prep)
    # the group prep's row on the twin runs it warp-specialised, at three stages
    assert shape.specialized is (planned and group_prep)
    assert shape.num_stages == 3 or not shape.specialized
    recompute = plan_gla.recompute_sweep_shape(shape, 1, 80)
    assert not recompute.gluon_sweep and not recompute.specialized  # states alone: never warp-specialised
    assert not plan_gla.per_key_shape_of(shape).gluon_sweep  # the Triton sweep (specialized is then unread)


@pytest.mark.parametrize("case, scores_in_sweep", [
    ("simple GLA B4 T4096 H16", True), ("simple GLA B8 T4096 H16", True), ("simple GLA B1 T16384 H16", False),
    ("simple GLA B4 T4096 H16, GVA 2", False), ("simple GLA B4 T4096 H16, its row off", False),
    ('simple GLA B4 T4096 H16, backend="triton"', False), ("SSD B4 T4096, a group a head", True),
    ("SSD B4 T4096, one group", False)])
def test_the_planner_forms_the_scores_in_the_sweep_where_no_query_key_head_is_shared(monkeypatch, case,
                                                                                     scores_in_sweep):
    """GLA_SWEEP_LAUNCH's row for a query/key head a value head (DeltaShape.sweep_scores, warp-
    specialised, three stages): simple GLA (and SSD with a group a head) over a third of the SMs or
    more in 64-column programs, where the Gluon twin may run and GLUON_GLA_GROUP_SWEEP is on; not
    under GVA, nor for fewer programs (B1 T16384 H16: 32), nor for SSD's shared groups; the
    backward's recompute never."""
    import dataclasses
    from recurscan.plan import gla as plan_gla
    from recurscan.problem import gla_problem, ssd_problem
    monkeypatch.setattr(plan_gla, "sm_count", lambda device: 132)
    monkeypatch.setattr(plan_gla, "gluon_usable", lambda device: True)
    monkeypatch.setattr(plan_gla, "GLUON_GLA_GROUP_SWEEP",
                        dataclasses.replace(plan_gla.GLUON_GLA_GROUP_SWEEP, on="row off" not in case))
    meta = dict(device="meta", dtype=torch.bfloat16)
    Bt, T = (8, 4096) if "B8" in case else (1, 16384) if "B1" in case else (4, 4096)
    if case.startswith("SSD"):
        G = 80 if "a group a head" in case else 1
        problem = ssd_problem(torch.empty(Bt, T, 80, 64, **meta), torch.empty(Bt, T, 80, device="meta"),
                              torch.empty(80, device="meta"), torch.empty(Bt, T, G, 128, **meta),
                              torch.empty(Bt, T, G, 128, **meta))
    else:
        H, HV = (8, 16) if "GVA" in case else (16, 16)
        q = torch.empty(Bt, T, H, 128, **meta)
        problem = gla_problem(q, q, torch.empty(Bt, T, HV, 128, **meta), torch.empty(Bt, T, HV, device="meta"),
                              per_key_decay=False)
    shape = plan_gla.gla_shape(problem, torch.device("cuda"), gluon="triton" not in case).sweep
    assert shape.sweep_scores is scores_in_sweep
    if scores_in_sweep:
        assert shape.group_prep and shape.specialized and shape.gluon_sweep and shape.num_stages == 3
    recompute = plan_gla.recompute_sweep_shape(shape, 1, 1)
    assert not recompute.sweep_scores and not recompute.specialized
    if scores_in_sweep and case.startswith("simple GLA"):  # the delta prep's recompute (the faster there)
        assert not recompute.group_prep and not recompute.calm_gates


def test_the_gla_sweeps_gluon_twin_takes_ssd_without_z_and_the_triton_sweep_the_rest():
    """With ``gluon_sweep`` and the WY step off: the single pass and every phase launch the twin
    (the replay stays the Triton kernel's), on the delta prep or the group prep; SSD with a gate z
    runs the Triton sweep throughout; the calm gates are refused (a ValueError naming the field)."""
    from recurscan.launch.gla import SsdPrologue
    q, k = (torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    v = torch.zeros(1, 256, 4, 64, dtype=torch.bfloat16)
    twin = dict(block_v=64, num_warps=4, num_stages=2, tma_store=True, gluon_sweep=True, wy=False)

    def kinds(**kw):
        return [(s.kwargs["PASS"], s.kwargs["REPLAY"], "gluon" if type(s.kernel).__name__ == "GluonJITFunction" else
                 "triton")
                for s in delta_launches(q, k, v, torch.zeros(1, 256, 4), None, **twin, **kw).steps
                if launch_delta.is_sweep_step(s)]
    G, J = "gluon", "triton"
    assert kinds() == [(0, False, G), (0, True, J)]
    assert kinds(phases=3) == [(3, False, G)] * 3 + [(0, True, J)]
    ssd = lambda z: SsdPrologue(torch.zeros(1, 256, 4), -torch.ones(4), None, torch.ones(4), z, True,  # noqa: E731
                                (0.0, float("inf")))
    assert kinds(ssd=ssd(None), phases=3) == [(3, False, G)] * 3 + [(0, True, J)]
    assert {kind for *_, kind in kinds(ssd=ssd(torch.zeros(1, 256, 4, 64, dtype=torch.bfloat16)))} == {J}
    assert kinds(group_prep=True) == [(0, False, G), (0, True, J)]
    with pytest.raises(ValueError, match="gluon_sweep"):
        kinds(group_prep=True, calm_gates=True)
    # The backward's recompute (states alone): the twin with its outputs off, the calm gates'
    # factors the prep's alone, no replay launch.
    assert kinds(group_prep=True, calm_gates=True, states_only=True) == [(0, False, G)]
    sweep, = [s for s in delta_launches(q, k, v, torch.zeros(1, 256, 4), None, **twin, group_prep=True,
                                        calm_gates=True, states_only=True).steps if launch_delta.is_sweep_step(s)]
    assert not sweep.kwargs["OUTPUTS"] and not sweep.kwargs["CALM_GATES"] and not sweep.kwargs["TMA_STORE"]


def test_the_warp_specialised_sweep_takes_the_single_pass_with_outputs_and_the_twin_the_rest():
    """DeltaShape.specialized (kernels/gluon/gla_sweep_specialized.py): with the group prep and the
    Gluon twin, the single pass with outputs launches the warp-specialised kernel under its register
    cap (launch.delta.SPECIALIZED_MAXNREG) and the replay the Triton kernel without it; the
    backward's recompute (no outputs) and a call returning chunk states run the twin; SSD with a gate
    z the Triton sweep; phases launch it once a phase (PASS 3, each after its phase's prep); without
    the twin, specialized is unread (the Triton sweep); with it, a shape without the group prep, or
    in segments, is a ValueError naming the field."""
    from recurscan.launch.gla import SsdPrologue
    q, k = (torch.zeros(1, 256, 1, 128, dtype=torch.bfloat16) for _ in range(2))
    v = torch.zeros(1, 256, 16, 64, dtype=torch.bfloat16)
    ws = dict(block_v=64, num_warps=4, num_stages=2, tma_store=True, gluon_sweep=True, wy=False, group_prep=True,
              specialized=True)

    def sweeps(**kw):
        return [(getattr(s.kernel, "fn", s.kernel).__name__, s.kwargs["REPLAY"], s.options.get("maxnreg"))
                for s in delta_launches(q, k, v, torch.zeros(1, 256, 16), None, **{**ws, **kw}).steps
                if launch_delta.is_sweep_step(s)]
    W, G, J = "gluon_gla_sweep_specialized_kernel", "gluon_sweep_kernel", "chunk_delta_sweep_kernel"
    cap = launch_delta.SPECIALIZED_MAXNREG
    assert sweeps() == [(W, False, cap), (J, True, None)]
    ssd = lambda z: SsdPrologue(torch.zeros(1, 256, 16), -torch.ones(16), None, torch.ones(16), z, True,  # noqa: E731
                                (0.0, float("inf")))
    assert sweeps(ssd=ssd(None)) == [(W, False, cap), (J, True, None)]
    assert {name for name, *_ in sweeps(ssd=ssd(torch.zeros(1, 256, 16, 64, dtype=torch.bfloat16)))} == {J}
    assert sweeps(calm_gates=True, states_only=True) == [(G, False, None)]
    assert sweeps(return_chunk_states=True) == [(G, False, None), (J, True, None)]
    phased = delta_launches(q, k, v, torch.zeros(1, 256, 16), None, **{**ws, "phases": 3, "phase_ratio": 1.0}).steps
    P = "chunk_group_prep_kernel"
    assert [getattr(s.kernel, "fn", s.kernel).__name__ for s in phased] == [P, W, P, W, P, W, J]
    assert [(s.kwargs["PASS"], s.kwargs["tc_first"], s.kwargs["tc_count"], s.kwargs["trigger_dependents"])
            for s in phased[1:6:2]] == [(3, 0, 1, 1), (3, 1, 2, 1), (3, 3, 1, 0)]  # chunks [0, 1, 3, 4]
    assert [s.kwargs["REPLAY"] for s in phased[1::2] + phased[-1:]] == [False, False, False, True]
    for bad in (dict(group_prep=False), dict(segments=2), dict(specialized=1)):
        with pytest.raises(ValueError, match="specialized"):
            sweeps(**bad)
    assert sweeps(gluon_sweep=False) == [(J, False, None), (J, True, None)]  # specialized refines the twin


def test_the_scores_formed_in_the_sweep_run_on_the_warp_specialised_kernel_or_the_triton_one():
    """DeltaShape.sweep_scores: the group prep writes the coef alone (SCORES off, no scores buffer)
    and every sweep launch forms the scores (SWEEP_SCORES): the warp-specialised kernel where it
    runs, else the Triton kernel (the twin reads the prep's scores); the replay the Triton kernel's.
    Without the group prep, or with the calm gates, a ValueError naming the field."""
    q, k = (torch.zeros(1, 256, 4, 128, dtype=torch.bfloat16) for _ in range(2))
    v = torch.zeros(1, 256, 4, 128, dtype=torch.bfloat16)
    ws = dict(block_v=64, num_warps=4, num_stages=3, tma_store=True, gluon_sweep=True, wy=False, group_prep=True,
              specialized=True, sweep_scores=True)

    def launches(**kw):
        return delta_launches(q, k, v, torch.zeros(1, 256, 4), None, **{**ws, **kw})

    def sweeps(**kw):
        return [(getattr(s.kernel, "fn", s.kernel).__name__, s.kwargs["REPLAY"], s.kwargs["SWEEP_SCORES"])
                for s in launches(**kw).steps if launch_delta.is_sweep_step(s)]
    W, J = "gluon_gla_sweep_specialized_kernel", "chunk_delta_sweep_kernel"
    built = launches()
    prep, = [s for s in built.steps if "SCORES" in s.kwargs]
    assert not prep.kwargs["SCORES"] and "scores" not in built.buffers
    assert sweeps() == [(W, False, True), (J, True, True)]
    assert sweeps(return_chunk_states=True) == [(J, False, True), (J, True, True)]
    assert sweeps(specialized=False) == [(J, False, True), (J, True, True)]
    assert sweeps(gluon_sweep=False, specialized=False) == [(J, False, True), (J, True, True)]
    for bad in (dict(group_prep=False, specialized=False, gluon_sweep=False),
                dict(calm_gates=True, num_stages=2, specialized=False, gluon_sweep=False)):
        with pytest.raises(ValueError, match="sweep_scores"):
            sweeps(**bad)


@pytest.mark.parametrize("case, planned", [("row on", True), ("row off", False), ("no usable Gluon", False),
                                           ('backend="triton"', False)])
def test_the_planner_gives_the_backwards_recompute_to_the_twin_only_where_its_row_is_on(monkeypatch, case, planned):
    """plan.gla.GLUON_GLA_RECOMPUTE_SWEEP, GLUON_GLA_REVERSE_SWEEP and GLUON_GLA_DG: the backward's
    recompute of the chunk states runs on the forward sweep's Gluon twin (outputs off), its reverse
    sweep (warp-specialised: GLUON_GLA_REVERSE_SPECIALIZED) and its dg launch on their own Gluon
    twins, where each row is on and the twin may run (Gluon usable here, the caller not
    forcing Triton); SSD's group of 80 keeps the group prep with its calm gates."""
    import dataclasses
    from recurscan.plan import gla as plan_gla
    from recurscan.problem import ssd_problem
    monkeypatch.setattr(plan_gla, "sm_count", lambda device: 132)
    monkeypatch.setattr(plan_gla, "gluon_usable", lambda device: "no usable Gluon" not in case)
    monkeypatch.setattr(plan_gla, "GLUON_GLA_RECOMPUTE_SWEEP",
                        dataclasses.replace(plan_gla.GLUON_GLA_RECOMPUTE_SWEEP, on=case != "row off"))
    monkeypatch.setattr(plan_gla, "GLUON_GLA_REVERSE_SWEEP",
                        dataclasses.replace(plan_gla.GLUON_GLA_REVERSE_SWEEP, on=case != "row off"))
    meta = dict(device="meta", dtype=torch.bfloat16)
    problem = ssd_problem(torch.empty(4, 4096, 80, 64, **meta), torch.empty(4, 4096, 80, device="meta"),
                          torch.empty(80, device="meta"), torch.empty(4, 4096, 1, 128, **meta),
                          torch.empty(4, 4096, 1, 128, **meta))
    monkeypatch.setattr(plan_gla, "GLUON_GLA_DG", dataclasses.replace(plan_gla.GLUON_GLA_DG, on=case != "row off"))
    shape = plan_gla.gla_shape(problem, torch.device("cuda"), gluon=case != 'backend="triton"')
    assert shape.recompute_twin is planned and shape.reverse_twin is planned and shape.dg_twin is planned
    recompute = plan_gla.recompute_sweep_shape(shape.sweep, 1, 80, twin=shape.recompute_twin)
    assert recompute.gluon_sweep is planned and recompute.group_prep and recompute.calm_gates
    assert shape.reverse_specialized is planned and shape.dg_specialized is planned
    for row in ("GLUON_GLA_REVERSE_SPECIALIZED", "GLUON_GLA_DG_SPECIALIZED"):
        monkeypatch.setattr(plan_gla, row, dataclasses.replace(getattr(plan_gla, row), on=False))
    shape = plan_gla.gla_shape(problem, torch.device("cuda"), gluon=case != 'backend="triton"')
    assert not shape.reverse_specialized and not shape.dg_specialized


@pytest.mark.parametrize("specialized", [False, True])
def test_the_reverse_sweep_launches_its_twin_or_the_warp_specialised_form(monkeypatch, specialized):
    """launch.gla's reverse sweep for SSD's backward with GlaShape.reverse_twin: the twin on 4 warps
    at GLUON_GLA_REVERSE_STAGES, or with reverse_specialized its warp-specialised form at
    GLUON_GLA_REVERSE_SPECIALIZED_STAGES under the register cap (launch.delta.SPECIALIZED_MAXNREG);
    both with the twin's arguments at 64 value columns."""
    import dataclasses
    from recurscan.launch import gla as launch_gla
    from recurscan.launch.delta import SPECIALIZED_MAXNREG
    from recurscan.plan import gla as plan_gla
    q, k = (torch.zeros(1, 256, 1, 128, dtype=torch.bfloat16) for _ in range(2))
    do = torch.zeros(1, 256, 16, 64, dtype=torch.bfloat16)
    triton_step = launch_gla.Step(object(), (16,), dict(BV=64, NUM_STAGES=1), dict(num_warps=4))
    shape = dataclasses.replace(plan_gla.GLA_LAUNCH, reverse_twin=True, reverse_specialized=specialized)
    step = launch_gla._reverse_sweep_twin(triton_step, shape, q, k, do, group=True, per_key=False, rows=4)
    name = getattr(step.kernel, "fn", step.kernel).__name__
    if specialized:
        assert name == "gluon_gla_bwd_sweep_specialized_kernel"
        assert step.kwargs["NUM_STAGES"] == plan_gla.GLUON_GLA_REVERSE_SPECIALIZED_STAGES
        assert step.options == dict(num_warps=4, maxnreg=SPECIALIZED_MAXNREG)
    else:
        assert name == "gluon_gla_bwd_sweep_kernel" and step.options == dict(num_warps=4)
        assert step.kwargs["NUM_STAGES"] == plan_gla.GLUON_GLA_REVERSE_STAGES
    assert step.grid == (16,) and step.kwargs["BV"] == 64



@pytest.mark.parametrize("batch, T, corun", [(1, 16384, True), (4, 4096, False), (2, 8192, False)])
def test_the_planner_runs_the_recompute_beside_the_reverse_sweep_where_its_programs_leave_sms_idle(
        monkeypatch, batch, T, corun):
    """plan.gla.GLA_BACKWARD_CORUN: SSD's backward runs its recompute's sweep on a side stream beside
    the reverse sweep where the reverse sweep's programs (sequences x 80 value heads, 64 columns
    each) are at most the planned share of 132 SMs: B1 (80 programs) does, B4 and B2 (320, 160)
    do not."""
    from recurscan.plan import gla as plan_gla
    from recurscan.problem import ssd_problem
    monkeypatch.setattr(plan_gla, "sm_count", lambda device: 132)
    monkeypatch.setattr(plan_gla, "gluon_usable", lambda device: True)
    meta = dict(device="meta", dtype=torch.bfloat16)
    problem = ssd_problem(torch.empty(batch, T, 80, 64, **meta), torch.empty(batch, T, 80, device="meta"),
                          torch.empty(80, device="meta"), torch.empty(batch, T, 1, 128, **meta),
                          torch.empty(batch, T, 1, 128, **meta))
    assert plan_gla.gla_shape(problem, torch.device("cuda")).corun is corun


@pytest.mark.parametrize("case, twin", [("planned", True), ("row off", False), ("V 128", False),
                                        ("dO in float32", False), ("v misaligned", False),
                                        ("warp-specialised", True), ("warp-specialised, V 128", False),
                                        ("warp-specialised, a group of 3", True)])
def test_the_dg_launchs_gluon_twin_takes_a_groups_heads_in_its_scope_and_the_triton_kernel_the_rest(case, twin,
                                                                                                      monkeypatch):
    """launch.gla's dg launch (the parallel stage's PART 2, where a group's value heads are summed in
    dq's and dk's programs): with GlaShape.dg_twin, the Gluon twin on one persistent program an SM
    (8 warps, plan.gla's stages, the Triton launch's arguments; with GlaShape.dg_specialized its
    warp-specialised form on 4 warps under launch.gla.DG_SPECIALIZED_MAXNREG, the twin below
    plan.gla.GLUON_GLA_DG_SPECIALIZED_MIN_GROUP value heads a query/key head) where
    plan.gla.gluon_dg_scope allows (16-bit, K 64 / 128, V 64, a group of at least the stages) and
    q, k, v and dO share a dtype and are 16-byte aligned; else the Triton kernel's PART 2."""
    import dataclasses
    from recurscan.launch.gla import build_gla_backward
    from recurscan.plan import gla as plan_gla
    from recurscan.plan.delta import DeltaShape
    B, T, H, HV, K = 1, 300, 1, 3 if case.endswith("a group of 3") else 16, 128
    if HV < plan_gla.GROUP_GRADS_MIN_HEADS:  # a group's heads summed in dq's and dk's programs, dg apart
        monkeypatch.setattr(plan_gla, "GROUP_GRADS_MIN_HEADS", HV)
    V = 128 if case.endswith("V 128") else 64
    bf = dict(dtype=torch.bfloat16)
    store = torch.zeros(B * T * HV * V + 8, **bf)
    v = (store[1:1 + B * T * HV * V] if case == "v misaligned" else store[:B * T * HV * V]).view(B, T, HV, V)
    q, k = torch.zeros(B, T, H, K, **bf), torch.zeros(B, T, H, K, **bf)
    do = torch.zeros(B, T, HV, V, dtype=torch.float32 if case == "dO in float32" else torch.bfloat16)
    sweep = DeltaShape(64, 4, 2, 4, "test", tma_store=True, group_prep=True)
    asked = case.startswith("warp-specialised")
    specialized = asked and HV // H >= plan_gla.GLUON_GLA_DG_SPECIALIZED_MIN_GROUP
    shape = dataclasses.replace(plan_gla.GLA_LAUNCH, sweep=sweep, dg_twin=case != "row off", dg_specialized=asked)
    launches = build_gla_backward(q, k, v, torch.zeros(B, T, HV), do, None, None, None, None, None, scale=K ** -0.5,
                                  shape=shape)
    step, = [st for st in launches.steps if st.kwargs.get("PART") == 2]
    assert (type(step.kernel).__name__ == "GluonJITFunction") is twin
    if twin:
        from recurscan.launch.gla import DG_SPECIALIZED_MAXNREG
        assert getattr(step.kernel, "fn").__name__ == ("gluon_gla_bwd_dg_specialized_kernel" if specialized else
                                                       "gluon_gla_bwd_dg_kernel")
        assert step.options == (dict(num_warps=4, maxnreg=DG_SPECIALIZED_MAXNREG) if specialized else
                                dict(num_warps=8))
        assert step.grid == (min(1, 5 * H),)  # sm_count is 1 off CUDA
        assert step.kwargs["NUM_STAGES"] == plan_gla.GLUON_GLA_DG_STAGES
    else:
        assert step.grid[0] * step.kwargs["HEADS"] == 5 * HV


@pytest.mark.parametrize("case, twin", [("planned", True), ("row off", False), ("a decay per key", False),
                                        ("dO in float32", False), ("q misaligned", False)])
def test_the_reverse_sweeps_gluon_twin_takes_the_group_preps_scores_and_the_triton_kernel_the_rest(case, twin):
    """launch.gla's reverse sweep: with GlaShape.reverse_twin, the Gluon twin at 64 value columns on
    4 warps (its stages from plan.gla) where the reverse sweep reads the group prep's scores
    (GATE_SCORES), dO is in q's dtype and q, k and dO are 16-byte aligned; else the Triton kernel
    at plan.gla.REVERSE_SWEEP, the same arguments."""
    import dataclasses
    from recurscan.launch.gla import build_gla_backward
    from recurscan.plan import gla as plan_gla
    from recurscan.plan.delta import DeltaShape
    B, T, H, HV, K, V = 1, 300, 1, 8, 128, 64
    bf = dict(dtype=torch.bfloat16)
    store = torch.zeros(B * T * H * K + 8, **bf)
    q = (store[1:1 + B * T * H * K] if case == "q misaligned" else store[:B * T * H * K]).view(B, T, H, K)
    k, v = torch.zeros(B, T, H, K, **bf), torch.zeros(B, T, HV, V, **bf)
    do = torch.zeros(B, T, HV, V, dtype=torch.float32 if case == "dO in float32" else torch.bfloat16)
    g = torch.zeros(B, T, HV, K) if case == "a decay per key" else torch.zeros(B, T, HV)
    sweep = DeltaShape(64, 4, 2, 4, "test", tma_store=True, group_prep=True)
    shape = dataclasses.replace(plan_gla.GLA_LAUNCH, sweep=sweep, reverse_twin=case != "row off")
    launches = build_gla_backward(q, k, v, g, do, None, None, None, None, None, scale=K ** -0.5, shape=shape)
    step = launches.steps[0]
    assert (type(step.kernel).__name__ == "GluonJITFunction") is twin
    assert step.kwargs["BV"] == (64 if twin else min(plan_gla.REVERSE_SWEEP[0], V))
    assert step.options["num_warps"] == (4 if twin else plan_gla.REVERSE_SWEEP[1])
    assert step.grid == (B * HV * V // step.kwargs["BV"],)
    if twin:
        assert step.kwargs["NUM_STAGES"] == plan_gla.GLUON_GLA_REVERSE_STAGES and step.kwargs["GATE_SCORES"]

def test_every_planned_scalar_decay_shape_is_one_the_kernels_take():
    """Each row of the GLA / SSD launch table passes the launch's shape check (among them: the calm
    gates at two stages at most, where Triton 3.6's sm_90 build is sound)."""
    from recurscan.launch.delta import check_shape
    from recurscan.plan import gla as plan_gla
    for _, shape in plan_gla.GLA_SWEEP_LAUNCH:
        check_shape(shape)
        for heads, value_heads in ((16, 16), (1, 80)):  # the backward's recompute, with the group prep at 80
            check_shape(plan_gla.recompute_sweep_shape(shape, heads, value_heads))


@pytest.mark.parametrize("stages", [3, 4])
def test_the_calm_gates_at_three_stages_or_more_are_refused(stages):
    """The calm sweep at 3 stages made an illegal memory access on the H200 (Triton 3.6.0), with
    bulk stores or without: a hand-made shape asking for it gets a ValueError naming the field."""
    from recurscan.launch.delta import check_shape
    from recurscan.plan.delta import DeltaShape
    check_shape(DeltaShape(64, 4, 2, 4, "two stages", group_prep=True, calm_gates=True))
    with pytest.raises(ValueError, match="calm_gates: takes num_stages <= 2"):
        check_shape(DeltaShape(64, 4, stages, 4, "too many stages", group_prep=True, calm_gates=True))


@pytest.mark.parametrize("heads", [0, 1, 3, 128, 16.0, True])
def test_a_group_prep_block_that_is_not_a_power_of_two_from_2_to_64_is_refused(heads):
    """DeltaShape.group_prep_heads, a hand-made shape's: a ValueError naming the field."""
    from recurscan.launch.delta import check_shape
    from recurscan.plan.delta import DeltaShape
    check_shape(DeltaShape(64, 4, 2, 4, "32 heads", group_prep=True, group_prep_heads=32))
    with pytest.raises(ValueError, match="group_prep_heads: expected a power of two from 2 to 64"):
        check_shape(DeltaShape(64, 4, 2, 4, "a bad block", group_prep=True, group_prep_heads=heads))


@pytest.mark.parametrize("cu", [None, [0, 1, 70, 130]], ids=["dense, a partial last chunk", "varlen"])
def test_the_group_prep_writes_every_row_of_a_chunks_slot(cu):
    """The warp-specialised sweep's outputs load a chunk's coef rows unmasked: the group prep writes
    every row of every chunk's slot, the rows past a sequence's end too (finite from finite inputs),
    and no slot that no chunk owns. The coef buffer is NaN beforehand."""
    from recurscan import build_chunk_descriptors
    from recurscan.launch.delta import DeltaInputs, run_delta_launches
    gen = torch.Generator().manual_seed(16)
    Bt, T = (2, 100) if cu is None else (1, 130)
    q, k = (torch.randn(Bt, T, 1, 32, generator=gen).to(DEVICE) for _ in range(2))
    v = torch.randn(Bt, T, 4, 16, generator=gen).to(DEVICE)
    g = torch.nn.functional.logsigmoid(torch.randn(Bt, T, 4, generator=gen)).to(DEVICE)
    cu_seqlens = dp = None
    if cu is not None:
        cu_seqlens = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
        dp = build_chunk_descriptors(cu, device=DEVICE).chunk_indices_dp
    launches = delta_launches(q, k, v, g, None, block_v=16, num_stages=2, group_prep=True, wy=False,
                              cu_seqlens=cu_seqlens, chunk_indices_dp=dp)
    N = Bt if cu is None else len(cu) - 1
    coef = torch.full(((Bt * T) // 64 + N, 4, 64, 8), float("nan"), device=DEVICE)
    run_delta_launches(launches, DeltaInputs(q, k, v, g, None, cu_seqlens=cu_seqlens, chunk_indices_dp=dp),
                       given={"coef": coef})
    starts = [n * T for n in range(Bt)] if cu is None else cu[:-1]
    lengths = [T] * Bt if cu is None else [b - a for a, b in zip(cu[:-1], cu[1:])]
    owned = {(bos + c * 64) // 64 + n for n, (bos, L) in enumerate(zip(starts, lengths)) for c in range((L + 63) // 64)}
    for slot in range(coef.shape[0]):
        rows = coef[slot]
        assert torch.isfinite(rows).all() if slot in owned else torch.isnan(rows).all(), slot


@pytest.mark.parametrize("op, dstate, kept", [("SSD", 128, True), ("SSD", 256, False), ("simple GLA", 128, True)])
def test_the_forward_keeps_the_chunk_states_only_within_its_memory_budget(monkeypatch, op, dstate, kept):
    """plan.gla.GLA_FORWARD_STATES_MAX_RATIO: a training forward keeps its chunk states only where
    they take at most twice its inputs' bytes: SSD's 80 heads x 64 at dstate 128 (1.9x x, B and C),
    not at dstate 256 (3.8x); simple GLA at K = V = 128 (0.67x q, k and v)."""
    from recurscan.plan import gla as plan_gla
    from recurscan.problem import gla_problem, ssd_problem
    monkeypatch.setattr(plan_gla, "sm_count", lambda device: 132)
    monkeypatch.setattr(plan_gla, "gluon_usable", lambda device: True)
    meta = dict(device="meta", dtype=torch.bfloat16)
    if op == "SSD":
        problem = ssd_problem(torch.empty(1, 4096, 80, 64, **meta), torch.empty(1, 4096, 80, device="meta"),
                              torch.empty(80, device="meta"), torch.empty(1, 4096, 1, dstate, **meta),
                              torch.empty(1, 4096, 1, dstate, **meta))
    else:
        qkv = [torch.empty(4, 4096, 16, 128, **meta) for _ in range(3)]
        problem = gla_problem(*qkv, torch.empty(4, 4096, 16, device="meta"), per_key_decay=False)
    assert plan_gla.forward_states_fit(problem) is kept
    assert plan_gla.gla_shape(problem, torch.device("cuda")).forward_states is kept
    monkeypatch.setattr(plan_gla, "GLA_FORWARD_STATES", False)
    assert not plan_gla.gla_shape(problem, torch.device("cuda")).forward_states
