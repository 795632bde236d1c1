"""The GLA engine on the GPU (issue 20): the scalar-decay forward kernel at real sizes, bf16."""
import dataclasses

import pytest
import torch

import recurscan
from tests.helpers.tolerances import relative_rms

pytestmark = pytest.mark.gpu


def test_simple_gla_triton_forward_at_real_sizes():
    """The GLA engine's first kernel (issue 20) at fla's shape and SSD's core shape, bf16, against
    the float64 chunked oracle on the GPU."""
    from recurscan.reference.gla import gla_chunked
    gen = torch.Generator(device="cuda").manual_seed(7)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    for B, T, H, HV, K, V in ((2, 2048, 4, 4, 128, 128), (1, 4096, 1, 8, 128, 64)):
        q, k, v = rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, HV, V).bfloat16()
        g = torch.nn.functional.logsigmoid(rn(B, T, HV) + 4)
        h0 = rn(B, HV, K, V) * 0.1
        o, S = recurscan.chunk_simple_gla(q, k, v, g, initial_state=h0, output_final_state=True, backend="triton")
        wo, wS = gla_chunked(q.double(), k.double(), v.double(), g.double(), initial_state=h0.double())
        assert relative_rms(o.double(), wo) < 1e-2 and relative_rms(S.double(), wS) < 1e-2


@pytest.mark.parametrize("recompute", ["fused", "sweep"])
def test_simple_gla_triton_gradients_at_real_sizes(recompute, monkeypatch):
    """The GLA backward (kernels/gla/backward.py) at fla's head sizes, bf16, GVA, its chunk states
    recomputed on the fused kernel and on the delta sweep (GlaShape.recompute_on_sweep): every
    gradient against autograd through the float64 chunked oracle on the GPU."""
    from recurscan.plan import gla as plan_gla
    monkeypatch.setattr(plan_gla, "GLA_LAUNCH",
                        dataclasses.replace(plan_gla.GLA_LAUNCH, recompute_on_sweep=recompute == "sweep"))
    from recurscan.reference.gla import gla_chunked
    gen = torch.Generator(device="cuda").manual_seed(8)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    B, T, H, HV, K, V = 1, 2048, 2, 4, 128, 128
    x = [rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, HV, V).bfloat16(),
         torch.nn.functional.logsigmoid(rn(B, T, HV) + 4), rn(B, HV, K, V) * 0.1]
    mine = [t.clone().requires_grad_() for t in x]
    o, S = recurscan.chunk_simple_gla(*mine[:4], initial_state=mine[4], output_final_state=True, backend="triton")
    do, dht = rn(*o.shape).bfloat16(), rn(*S.shape)
    got = torch.autograd.grad((o, S), mine, (do, dht))
    ref = [t.double().requires_grad_() for t in x]
    wo, wS = gla_chunked(*ref[:4], initial_state=ref[4])
    want = torch.autograd.grad((wo, wS), ref, (do.double(), dht.double()))
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dh0"), got, want):
        assert torch.isfinite(a).all(), name
        assert relative_rms(a.double(), b) < 1e-2, f"{name}: {relative_rms(a.double(), b):.2e}"


@pytest.mark.parametrize("recompute, grads", [("fused", "per head"), ("sweep", "per head"),
                                             ("sweep, group prep", "per head"), ("sweep, calm gates", "per head"),
                                             ("sweep, calm gates", "group"), ("sweep", "group in shares"),
                                             ("sweep, calm gates", "group, dq and dk apart")])
@pytest.mark.parametrize("cu", [None, [0, 1, 700, 2048]])
def test_ssd_triton_forward_and_gradients_at_real_sizes(cu, recompute, grads, monkeypatch):
    """mamba_chunk_scan_combined on the Triton path (the GLA engine with SSD's prologue and
    epilogue), Mamba2's head sizes, bf16 x / B / C, two groups, D per channel, z, dt_bias,
    dt_softplus, dt_limit active, an initial state; dense and varlen with a one-token sequence;
    the backward's chunk states recomputed on the fused kernel and on the delta sweep
    (GlaShape.recompute_on_sweep), the sweep's prep the delta prep or the group prep (the forward's
    too; with or without its calm gates), the parallel stage one value head a program or a group's
    heads summed in its programs (``grads``, tests/helpers/gla_forms.py): the output, the final
    states and every gradient against autograd through the PyTorch form in float64 on the GPU."""
    from recurscan.plan import gla as plan_gla
    from tests.helpers.gla_forms import use_grads_form
    use_grads_form(grads, monkeypatch)
    monkeypatch.setattr(plan_gla, "GLA_LAUNCH",
                        dataclasses.replace(plan_gla.GLA_LAUNCH, recompute_on_sweep=recompute != "fused"))
    if recompute.endswith(("group prep", "calm gates")):  # the forward and the recompute (here H / G = 4 < 8)
        planned, calm = plan_gla.gla_sweep_shape, recompute.endswith("calm gates")
        monkeypatch.setattr(plan_gla, "gla_sweep_shape", lambda problem, device, gluon=True: dataclasses.replace(
            planned(problem, device), group_prep=True, prep_heads=1, calm_gates=calm, gluon_sweep=False,
            specialized=False, num_stages=2 if calm else planned(problem, device).num_stages))
    gen = torch.Generator(device="cuda").manual_seed(9)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    Bt, T, H, P, G, N = (2, 2048, 8, 64, 2, 128) if cu is None else (1, 2048, 8, 64, 2, 128)
    S = Bt if cu is None else len(cu) - 1
    cu_t = None if cu is None else torch.tensor(cu, device="cuda", dtype=torch.int32)
    x = [rn(Bt, T, H, P).bfloat16(), rn(Bt, T, H), -torch.rand(H, device="cuda", generator=gen) * 4,
         rn(Bt, T, G, N).bfloat16(), rn(Bt, T, G, N).bfloat16(), rn(H, P), rn(Bt, T, H, P).bfloat16(), rn(H),
         rn(S, H, P, N) * 0.1]
    kw = dict(chunk_size=256, dt_softplus=True, dt_limit=(0.0, 2.0), cu_seqlens=cu_t, return_final_states=True)

    def run(t, backend):
        xs, dt, A, B, C, D, z, dt_bias, h0 = t
        return recurscan.mamba_chunk_scan_combined(xs, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, initial_states=h0,
                                                   backend=backend, **kw)

    mine = [t.clone().requires_grad_() for t in x]
    y, hT = run(mine, "triton")
    dy, dhT = rn(*y.shape).bfloat16(), rn(*hT.shape)
    got = torch.autograd.grad((y, hT), mine, (dy, dhT))
    ref = [t.double().requires_grad_() for t in x]
    wy, whT = run(ref, "torch")
    want = torch.autograd.grad((wy, whT), ref, (dy.double(), dhT.double()))
    assert relative_rms(y.double(), wy) < 1e-2 and relative_rms(hT.double(), whT) < 1e-2
    for name, a, b in zip(("dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "dh0"), got, want):
        assert torch.isfinite(a).all(), name
        assert relative_rms(a.double(), b) < 1e-2, f"{name}: {relative_rms(a.double(), b):.2e}"


@pytest.mark.parametrize("T", [4096, 16384])
def test_ssd_calm_gates_at_the_benchmark_shape(T, monkeypatch):
    """The benchmark's SSD (80 heads x 64, one group, dstate 128, D per head, dt_bias, softplus;
    benchmarks/gpu_gla.py's inputs, where most chunks are calm and some are not) through the group
    prep with the whole gate tile and with its calm gates, bf16: each against the float64 PyTorch
    form, and the calm gates' error within 1.5x of the whole tile's (their products round U o f
    and the scores to bf16 where the tile rounds G o c o scores once)."""
    from benchmarks.gpu_gla import ssd_inputs
    from recurscan.plan import gla as plan_gla
    from recurscan.runtime.cache import clear_caches
    a, kw = ssd_inputs(1, T)
    want = recurscan.mamba_chunk_scan_combined(*(t.double() for t in a), **{k: (v.double() if torch.is_tensor(v)
                                                                              else v) for k, v in kw.items()},
                                               backend="torch")
    planned, errors = plan_gla.gla_sweep_shape, {}
    for calm in (False, True):
        monkeypatch.setattr(plan_gla, "gla_sweep_shape", lambda problem, device, gluon=True, calm=calm: dataclasses.replace(
            planned(problem, device), group_prep=True, prep_heads=1, calm_gates=calm, phases=1, num_stages=2,
            gluon_sweep=False, specialized=False))
        clear_caches()
        y = recurscan.mamba_chunk_scan_combined(*a, **kw, backend="triton")
        assert torch.isfinite(y).all()
        errors[calm] = relative_rms(y.double(), want)
    print(f"T {T}: relative RMS, whole tile {errors[False]:.3e}, calm gates {errors[True]:.3e}")
    assert errors[False] < 1e-2 and errors[True] < 1.5 * errors[False]


@pytest.mark.parametrize("reverse_twin", [True, False], ids=["planned", "the reverse sweep on the Triton kernel"])
@pytest.mark.parametrize("Bt, T", [(1, 4096), (2, 2048)])
def test_ssd_gradients_at_the_benchmark_shape(Bt, T, reverse_twin, monkeypatch):
    """SSD forward + backward as planned at the benchmark's heads (80 x 64, one group, dstate 128,
    D per head, dt_bias, softplus; benchmarks/gpu_gla.py's inputs), through the planner's choice of
    backend (``backend="triton"`` would turn every Gluon twin off): the forward on the group prep's
    twin, the backward's recompute on the group prep with its calm gates and the forward sweep's
    twin, the reverse sweep as its Gluon twin (or on the Triton kernel:
    plan.gla.GLUON_GLA_REVERSE_SWEEP off), dg as its Gluon twin where Gluon runs. Every gradient
    against autograd through the float64 PyTorch form."""
    from benchmarks.gpu_gla import SSD_GRADS, ssd_inputs, train_step
    from recurscan.plan import gla as plan_gla
    from recurscan.runtime.cache import clear_caches
    monkeypatch.setattr(plan_gla, "GLUON_GLA_REVERSE_SWEEP",
                        dataclasses.replace(plan_gla.GLUON_GLA_REVERSE_SWEEP, on=reverse_twin))
    clear_caches()
    a, kw = ssd_inputs(Bt, T)
    dy = torch.randn(a[0].shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3)).bfloat16()
    got = train_step(recurscan.mamba_chunk_scan_combined, a, kw, SSD_GRADS, dy)
    ref_kw = {k: (v.double() if torch.is_tensor(v) else v) for k, v in kw.items()}
    want = train_step(lambda *x, **k: recurscan.mamba_chunk_scan_combined(*x, **k, backend="torch"),
                      [t.double() for t in a], ref_kw, SSD_GRADS, dy.double())
    for name, g, w in zip(("dx", "ddt", "dA", "dB", "dC", "dD", "ddt_bias"), got, want):
        assert torch.isfinite(g).all(), name
        assert relative_rms(g.double(), w) < 1e-2, f"{name}: {relative_rms(g.double(), w):.2e}"


@pytest.mark.parametrize("form", ["sweep", "sweep, general steps", "sweep, general steps, key blocks of 16",
                                  "sweep, calm pass of 16 keys", "fused"])
def test_per_key_gla_triton_forward_at_real_sizes(form, monkeypatch):
    """chunk_gla's Triton forward (the per-key prep in each of its forms, then the delta sweep
    with KEY_DECAY or the fused kernel) at fla's head sizes, bf16, GVA and varlen with a one-token
    sequence, GLA's decays (logsigmoid / 16) and a run of strong ones (chunks that are not calm):
    output and final state against the float64 chunked oracle on the GPU."""
    from recurscan.reference.gla import gla_chunked
    from tests.helpers.gla_forms import use_per_key_form
    use_per_key_form(form, monkeypatch)
    gen = torch.Generator(device="cuda").manual_seed(10)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    B, T, H, HV, K, V = 1, 2048, 2, 4, 128, 128
    q, k, v = rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, HV, V).bfloat16()
    g = torch.nn.functional.logsigmoid(rn(B, T, HV, K)) / 16
    g[:, 300:340, 1, :8] = -30.0
    cu = torch.tensor([0, 1, 700, 2048], device="cuda", dtype=torch.int32)
    h0 = rn(3, HV, K, V) * 0.1
    o, S = recurscan.chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                               backend="triton")
    wo, wS = gla_chunked(q.double(), k.double(), v.double(), g.double(), initial_state=h0.double(), cu_seqlens=cu)
    assert relative_rms(o.double(), wo) < 1e-2 and relative_rms(S.double(), wS) < 1e-2


def test_per_key_gla_triton_gradients_at_real_sizes():
    """chunk_gla's Triton backward (kernels/gla/backward.py with PER_KEY) at fla's head sizes,
    bf16, GVA and varlen with a one-token sequence, GLA's decays and a run of strong ones: every
    gradient against autograd through the float64 chunked oracle on the GPU."""
    from recurscan.reference.gla import gla_chunked
    gen = torch.Generator(device="cuda").manual_seed(11)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    B, T, H, HV, K, V = 1, 2048, 2, 4, 128, 128
    g = torch.nn.functional.logsigmoid(rn(B, T, HV, K)) / 16
    g[:, 300:340, 1, :8] = -30.0
    cu = torch.tensor([0, 1, 700, 2048], device="cuda", dtype=torch.int32)
    x = [rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, HV, V).bfloat16(), g, rn(3, HV, K, V) * 0.1]
    mine = [t.clone().requires_grad_() for t in x]
    o, S = recurscan.chunk_gla(*mine[:4], initial_state=mine[4], output_final_state=True, cu_seqlens=cu,
                               backend="triton")
    do, dht = rn(*o.shape).bfloat16(), rn(*S.shape)
    got = torch.autograd.grad((o, S), mine, (do, dht))
    ref = [t.double().requires_grad_() for t in x]
    wo, wS = gla_chunked(*ref[:4], initial_state=ref[4], cu_seqlens=cu)
    want = torch.autograd.grad((wo, wS), ref, (do.double(), dht.double()))
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dh0"), got, want):
        assert torch.isfinite(a).all(), name
        assert relative_rms(a.double(), b) < 1e-2, f"{name}: {relative_rms(a.double(), b):.2e}"


@pytest.mark.parametrize("family", ["gla", "ssd"])
def test_the_split_launch_at_real_sizes(family, monkeypatch):
    """The split launch (plan.gla.GlaShape.split: the prep, then the sweep with PER_KEY) of a scalar
    decay and of SSD at real sizes, bf16, against the float64 PyTorch form on the GPU."""
    from recurscan.plan import gla as plan_gla
    monkeypatch.setattr(plan_gla, "GLA_LAUNCH", plan_gla.GlaShape(64, 8, "test: split", split=True))
    gen = torch.Generator(device="cuda").manual_seed(11)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    if family == "gla":
        q, k, v = rn(2, 2048, 4, 128).bfloat16(), rn(2, 2048, 4, 128).bfloat16(), rn(2, 2048, 4, 128).bfloat16()
        g = torch.nn.functional.logsigmoid(rn(2, 2048, 4) + 4)
        got = recurscan.chunk_simple_gla(q, k, v, g, output_final_state=True)
        want = recurscan.chunk_simple_gla(q.double(), k.double(), v.double(), g.double(), output_final_state=True,
                                          backend="torch")
    else:
        x, dt, A = rn(1, 4096, 8, 64).bfloat16(), rn(1, 4096, 8), -torch.rand(8, device="cuda", generator=gen) * 4
        B, C, D, z = rn(1, 4096, 2, 128).bfloat16(), rn(1, 4096, 2, 128).bfloat16(), rn(8, 64), rn(1, 4096, 8, 64)
        seq_idx = torch.cat([torch.zeros(1, 1000), torch.ones(1, 3096)], 1).int().cuda()
        kw = dict(D=D, z=z.bfloat16(), dt_softplus=True, dt_limit=(0.0, 2.0), seq_idx=seq_idx, return_final_states=True)
        got = recurscan.mamba_chunk_scan_combined(x, dt, A, B, C, **kw)
        want = recurscan.mamba_chunk_scan_combined(*(t.double() for t in (x, dt, A, B, C)),
                                                   **dict(kw, D=D.double(), z=z.double()), backend="torch")
    for a, b in zip(got, want):
        assert relative_rms(a.double(), b) < 1e-2


@pytest.mark.parametrize("family", ["simple", "per_key", "ssd", "ssd, 16 heads a group"])
def test_the_gla_backward_gives_the_same_bits_every_run(family):
    """Four forward + backward runs of one input, B2 T2048 bf16 at fla's and mamba's head sizes:
    every gradient bit for bit the same (the delta rule's dk kernel gave run-to-run differences
    from a pipelined load used both as a product's shared-memory operand and elsewhere; the GLA
    parallel stage keeps such loads to one use since)."""
    gen = torch.Generator(device="cuda").manual_seed(17)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    B, T, H, K, V = 2, 2048, 4, 128, 128
    if family.startswith("ssd"):
        H = 16 if family.endswith("a group") else H  # the parallel stage sums the group's heads (plan.gla)
        P, N = 64, 128
        x = [rn(B, T, H, P).bfloat16(), rn(B, T, H) - 1, -torch.rand(H, device="cuda", generator=gen) - 0.5,
             rn(B, T, 1, N).bfloat16(), rn(B, T, 1, N).bfloat16()]
        run = lambda t: recurscan.mamba_chunk_scan_combined(*t, chunk_size=256, dt_softplus=True,  # noqa: E731
                                                            backend="triton")
    else:
        g = torch.nn.functional.logsigmoid(rn(B, T, H, K)) / 16 if family == "per_key" else \
            torch.nn.functional.logsigmoid(rn(B, T, H) + 4)
        x = [rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, H, V).bfloat16(), g]
        op = recurscan.chunk_gla if family == "per_key" else recurscan.chunk_simple_gla
        run = lambda t: op(*t, backend="triton")[0]  # noqa: E731
    leaves = [t.clone().requires_grad_() for t in x]
    runs = []
    for _ in range(4):
        out = run(leaves)
        out = out[0] if isinstance(out, tuple) else out
        runs.append(torch.autograd.grad(out, leaves, torch.ones_like(out)))
    for r in runs[1:]:
        for i, (a, b) in enumerate(zip(runs[0], r)):
            assert torch.equal(a, b), f"gradient {i}: {int((a != b).sum())} elements differ"


@pytest.mark.parametrize("Bt, T", [(1, 4096), (2, 1000)])
def test_ssd_gradients_with_the_recompute_beside_the_reverse_sweep(Bt, T, monkeypatch):
    """plan.gla.GLA_BACKWARD_CORUN: SSD's backward with its recompute's sweep on a side stream beside
    the reverse sweep (80 value heads of one group: 80 or 160 reverse-sweep programs) gives the
    gradients of the backward on one stream bit for bit (the same kernels on the same inputs), and
    was built to run so. (A recompute at all: the forward keeps no chunk states, plan.gla.GLA_FORWARD_STATES off.)"""
    from recurscan.launch import gla as launch_gla
    from recurscan.plan import gla as plan_gla
    from recurscan.runtime.cache import clear_caches
    from tests.helpers.tolerances import bits
    monkeypatch.setattr(plan_gla, "GLA_FORWARD_STATES", False)
    gen = torch.Generator(device="cuda").manual_seed(31)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    H, P, N = 80, 64, 128
    leaves = [rn(Bt, T, H, P).bfloat16(), rn(Bt, T, H), -torch.rand(H, device="cuda", generator=gen),
              rn(Bt, T, 1, N).bfloat16(), rn(Bt, T, 1, N).bfloat16(), rn(H), rn(H)]
    dy = rn(Bt, T, H, P).bfloat16()
    out = {}
    for corun in (None, 1e9):
        monkeypatch.setattr(plan_gla, "GLA_BACKWARD_CORUN", corun)
        clear_caches()
        mine = [t.detach().clone().requires_grad_() for t in leaves]
        y = recurscan.mamba_chunk_scan_combined(*mine[:5], chunk_size=256, D=mine[5], dt_bias=mine[6],
                                                dt_softplus=True)
        out[corun] = torch.autograd.grad(y, mine, dy)
        assert all(b.corun is (corun is not None) for b in launch_gla.GLA_BACKWARD_LAUNCHES.values())
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(out[None], out[1e9])):
        assert torch.isfinite(b).all() and torch.equal(bits(a), bits(b)), f"gradient {i}"


@pytest.mark.parametrize("family", ["simple GLA", "simple GLA, GVA", "SSD"])
def test_the_narrowed_gradients_are_the_float32_ones_cast(family, monkeypatch):
    """autograd/gla.py's and autograd/ssd.py's NARROW (the stages store dq, dk, and for GLA dv, in
    the inputs' dtypes): the same bits as the float32 gradients cast after, one round-to-nearest
    either way, at real sizes in bf16 through the planner."""
    import recurscan.autograd.gla as autograd_gla
    import recurscan.autograd.ssd as autograd_ssd
    gen = torch.Generator(device="cuda").manual_seed(21)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    if family.startswith("simple"):
        B, T, H, K, V = 2, 2048, 4, 128, 128
        HV = 2 * H if family.endswith("GVA") else H
        x = [rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, HV, V).bfloat16(),
             torch.nn.functional.logsigmoid(rn(B, T, HV) + 4)]
        module, op = autograd_gla, lambda *t: recurscan.chunk_simple_gla(*t)[0]
        do = rn(B, T, HV, V).bfloat16()
    else:
        Bt, T, H, P, G, N = 1, 4096, 16, 64, 1, 128
        x = [rn(Bt, T, H, P).bfloat16(), torch.rand(Bt, T, H, device="cuda", generator=gen) * 0.1,
             -torch.rand(H, device="cuda", generator=gen) - 0.5, rn(Bt, T, G, N).bfloat16(), rn(Bt, T, G, N).bfloat16()]
        module, op = autograd_ssd, lambda *t: recurscan.mamba_chunk_scan_combined(*t, chunk_size=256)
        do = rn(Bt, T, H, P).bfloat16()

    def grads():
        leaves = [t.clone().requires_grad_() for t in x]
        return torch.autograd.grad(op(*leaves), leaves, do)
    narrowed = grads()
    monkeypatch.setattr(module, "NARROW", ())
    cast = grads()
    for i, (a, b) in enumerate(zip(narrowed, cast)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"gradient {i} of {family}"
