"""The forward sweep's Gluon twin with the WY step off (kernels/gluon/delta_sweep.py: U = V, SSD's
skip D x) on the H200, under the Gluon rules (docs/kernels-gluon.md): bit for bit the Triton
sweep's outputs and final states for Mamba2 SSD (D per head and per channel, one pass and phases,
dense and varlen with a one-token sequence, an initial state; on the delta prep and on the group
prep's scores) and simple GLA; a gate z runs the
Triton sweep; the float64 oracle at the benchmark's size; and the training forward on it gives the
same gradients. Run: ``python -m pytest -m gpu tests/gpu/test_gluon_gla_sweep_gpu.py``."""
import dataclasses

import pytest
import torch

import recurscan
from recurscan.launch import delta as launch_delta
from recurscan.plan import gla as plan_gla
from recurscan.plan.delta import DeltaShape
from recurscan.runtime.cache import clear_caches

from tests.helpers.tolerances import bits, relative_rms

pytestmark = pytest.mark.gpu

DEV = "cuda"


@pytest.fixture(autouse=True)
def poisoned(gluon_only, monkeypatch):
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)


def sweep_kernels(monkeypatch, by_name=False):
    """The kinds (or with ``by_name`` the function names) of the sweep kernels the launch layer
    picks from now on (appended per build)."""
    picked = []
    choose = launch_delta._sweep_kernel

    def recording(*a, **kw):
        kernel, options = choose(*a, **kw)
        picked.append(getattr(kernel, "fn", kernel).__name__ if by_name else type(kernel).__name__)
        return kernel, options
    monkeypatch.setattr(launch_delta, "_sweep_kernel", recording)
    return picked


def run_both(monkeypatch, call, phases=1, group_prep=False, stages=3, specialized=False, sweep_scores=False):
    """``call()``'s outputs with the planned sweep shape at ``phases`` (the delta prep, or the
    group prep without calm gates; 64 value columns on 4 warps, ``stages`` stages, bulk stores) on
    the Triton sweep and on its Gluon twin (``specialized``: warp-specialised, DeltaShape.specialized,
    kernels/gluon/gla_sweep_specialized.py; ``sweep_scores``: both forming the scores themselves);
    asserts which kernel ran and that the two agree bit for bit. Returns the twin's outputs."""
    picked = sweep_kernels(monkeypatch, by_name=True)
    planned = plan_gla.gla_sweep_shape
    out = {}
    for twin in (False, True):
        monkeypatch.setattr(plan_gla, "gla_sweep_shape", lambda problem, device, gluon=True, twin=twin: dataclasses.replace(
            planned(problem, device, gluon=False), block_v=64, num_warps=4, num_stages=stages, tma_store=True,
            group_prep=group_prep, calm_gates=False, prep_heads=1, phases=phases, segments=1, gluon_sweep=twin,
            specialized=twin and specialized, sweep_scores=sweep_scores))
        clear_caches()
        picked.clear()
        got = call()
        got = got if isinstance(got, (tuple, list)) else (got,)
        out[twin] = [t.clone() for t in got if torch.is_tensor(t)]
        want = {"gluon_gla_sweep_specialized_kernel" if specialized else "gluon_sweep_kernel"} if twin else set()
        assert picked and {name for name in picked if name.startswith("gluon")} == want, picked
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(out[False], out[True])):
        assert torch.equal(bits(a), bits(b)), f"output {i}: {int((a != b).sum())} elements differ"
    return out[True]


def ssd_args(Bt, T, H=16, P=64, G=2, N=128, per_channel=False, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    rn = lambda *s: torch.randn(*s, device=DEV, generator=gen)  # noqa: E731
    x, dt = rn(Bt, T, H, P).bfloat16(), rn(Bt, T, H)
    A, dt_bias = -torch.rand(H, device=DEV, generator=gen), rn(H)
    D = rn(H, P) if per_channel else rn(H)
    B, C = rn(Bt, T, G, N).bfloat16(), rn(Bt, T, G, N).bfloat16()
    return (x, dt, A, B, C), dict(chunk_size=256, D=D, dt_bias=dt_bias, dt_softplus=True)


@pytest.mark.parametrize("phases", [1, 6])
@pytest.mark.parametrize("per_channel", [False, True], ids=["D per head", "D per channel"])
def test_ssd_gives_the_triton_sweeps_bits(phases, per_channel, monkeypatch):
    """Dense, two groups, a partial last chunk, an initial state and the final states."""
    a, kw = ssd_args(2, 3000, per_channel=per_channel)
    h0 = torch.randn(2, 16, 64, 128, device=DEV)
    y, hT = run_both(monkeypatch, lambda: recurscan.mamba_chunk_scan_combined(
        *a, **kw, initial_states=h0, return_final_states=True), phases)
    assert torch.isfinite(y).all() and torch.isfinite(hT).all()


def test_ssd_varlen_with_a_one_token_sequence_gives_the_triton_sweeps_bits(monkeypatch):
    a, kw = ssd_args(1, 4100, seed=2)
    cu = torch.tensor([0, 1, 2000, 2001, 4100], device=DEV, dtype=torch.int32)
    out = run_both(monkeypatch, lambda: recurscan.mamba_chunk_scan_combined(*a, **kw, cu_seqlens=cu,
                                                                            return_varlen_states=True))
    assert all(torch.isfinite(t).all() for t in out)


@pytest.mark.parametrize("stages", [2, 3])
def test_ssd_on_the_group_prep_gives_the_triton_sweeps_bits(stages, monkeypatch):
    """The twin gating the group prep's scores per value head (GATE_SCORES): 16 heads a group, a
    partial last chunk, an initial state and the final states; and varlen with a one-token
    sequence."""
    a, kw = ssd_args(2, 3000, G=1, seed=7)
    h0 = torch.randn(2, 16, 64, 128, device=DEV)
    y, hT = run_both(monkeypatch, lambda: recurscan.mamba_chunk_scan_combined(
        *a, **kw, initial_states=h0, return_final_states=True), group_prep=True, stages=stages)
    assert torch.isfinite(y).all() and torch.isfinite(hT).all()
    a, kw = ssd_args(1, 4100, G=1, seed=8)
    cu = torch.tensor([0, 1, 2000, 2001, 4100], device=DEV, dtype=torch.int32)
    run_both(monkeypatch, lambda: recurscan.mamba_chunk_scan_combined(*a, **kw, cu_seqlens=cu,
                                                                      return_varlen_states=True),
             group_prep=True, stages=stages)


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("per_channel", [False, True], ids=["D per head", "D per channel"])
def test_ssd_on_the_warp_specialised_sweep_gives_the_triton_sweeps_bits(per_channel, stages, monkeypatch):
    """The warp-specialised twin (the chain, the outputs and the loads on partitions of their own):
    16 heads a group, a partial last chunk, an initial state and the final states; varlen with a
    one-token sequence and an empty one; a state cache with a padding slot (its outputs zero, no
    slot written)."""
    a, kw = ssd_args(2, 3000, G=1, per_channel=per_channel, seed=11)
    h0 = torch.randn(2, 16, 64, 128, device=DEV)
    y, hT = run_both(monkeypatch, lambda: recurscan.mamba_chunk_scan_combined(
        *a, **kw, initial_states=h0, return_final_states=True), group_prep=True, stages=stages, specialized=True)
    assert torch.isfinite(y).all() and torch.isfinite(hT).all()
    a, kw = ssd_args(1, 4100, G=1, per_channel=per_channel, seed=12)
    cu = torch.tensor([0, 1, 2000, 2000, 2001, 4100], device=DEV, dtype=torch.int32)
    run_both(monkeypatch, lambda: recurscan.mamba_chunk_scan_combined(*a, **kw, cu_seqlens=cu,
                                                                      return_varlen_states=True),
             group_prep=True, stages=stages, specialized=True)
    cache = torch.randn(6, 16, 64, 128, device=DEV)
    slots = torch.tensor([3, -1, 0, 5, 1], device=DEV, dtype=torch.int32)

    def with_cache():
        state = cache.clone()
        y = recurscan.mamba_chunk_scan_combined(*a, **kw, cu_seqlens=cu, state=state, state_indices=slots)
        return y, state
    y, state = run_both(monkeypatch, with_cache, group_prep=True, stages=stages, specialized=True)
    assert torch.equal(y[:, 1:2000], torch.zeros_like(y[:, 1:2000]))  # the padding slot's sequence
    assert torch.equal(state[[2, 4]], cache[[2, 4]])  # slots no sequence owns


@pytest.mark.parametrize("phases", [3, 6])
def test_ssd_on_the_warp_specialised_sweep_in_phases_gives_the_triton_sweeps_bits(phases, monkeypatch):
    """The warp-specialised twin in phases (PASS 3: each phase's group prep beside the sweep before
    it, the state between phases in seg_n): 16 heads a group, a partial last chunk, an initial state
    and the final states; a state cache with a padding slot (its outputs zero, no other slot
    written); a NaN in x in the middle phase's chunks, replayed from the last phase's flags (the
    tokens before it finite)."""
    a, kw = ssd_args(2, 3000, G=1, seed=13)
    h0 = torch.randn(2, 16, 64, 128, device=DEV)
    y, hT = run_both(monkeypatch, lambda: recurscan.mamba_chunk_scan_combined(
        *a, **kw, initial_states=h0, return_final_states=True), phases, group_prep=True, specialized=True)
    assert torch.isfinite(y).all() and torch.isfinite(hT).all()
    cache = torch.randn(6, 16, 64, 128, device=DEV)
    slots = torch.tensor([4, -1], device=DEV, dtype=torch.int32)

    def with_cache():
        state = cache.clone()
        y = recurscan.mamba_chunk_scan_combined(*a, **kw, state=state, state_indices=slots)
        return y, state
    y, state = run_both(monkeypatch, with_cache, phases, group_prep=True, specialized=True)
    assert torch.equal(y[1], torch.zeros_like(y[1]))  # the padding slot's sequence
    assert torch.equal(state[[0, 1, 2, 3, 5]], cache[[0, 1, 2, 3, 5]]) and torch.isfinite(state[4]).all()
    x = a[0].clone()
    x[0, 1500, 3, 5] = float("nan")
    y = run_both(monkeypatch, lambda: recurscan.mamba_chunk_scan_combined(x, *a[1:], **kw), phases,
                 group_prep=True, specialized=True)[0]
    assert torch.isfinite(y[0, :1500]).all() and torch.isfinite(y[1]).all() and torch.isnan(y[0, 1500:, 3, 5]).all()


def test_the_benchmark_ssd_on_the_warp_specialised_sweep_against_the_oracle(monkeypatch):
    """80 heads x 64, one group, dstate 128 (benchmarks/gpu_gla.py's inputs) at B4 T4096 on the
    warp-specialised twin: the Triton sweep's bits, and the float64 PyTorch form's values."""
    from benchmarks.gpu_gla import ssd_inputs
    a, kw = ssd_inputs(4, 4096)
    y = run_both(monkeypatch, lambda: recurscan.mamba_chunk_scan_combined(*a, **kw), group_prep=True, stages=3,
                 specialized=True)[0]
    want = recurscan.mamba_chunk_scan_combined(*(t.double() for t in a), **{
        k: (v.double() if torch.is_tensor(v) else v) for k, v in kw.items()}, backend="torch")
    err = relative_rms(y.double(), want)
    print(f"SSD B4 T4096 on the warp-specialised twin: relative RMS {err:.2e}")
    assert err < 1e-2


def test_simple_gla_gives_the_triton_sweeps_bits(monkeypatch):
    gen = torch.Generator(device=DEV).manual_seed(4)
    rn = lambda *s: torch.randn(*s, device=DEV, generator=gen)  # noqa: E731
    q, k, v = (rn(2, 2500, 4, 128).bfloat16() for _ in range(3))
    g = torch.nn.functional.logsigmoid(rn(2, 2500, 4) + 3.0)
    o, ht = run_both(monkeypatch, lambda: recurscan.chunk_simple_gla(q, k, v, g, output_final_state=True), 6)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()


def gla_args(B, T, H, HV, seed, K=128, V=128):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    rn = lambda *s: torch.randn(*s, device=DEV, generator=gen)  # noqa: E731
    q, k = (rn(B, T, H, K).bfloat16() for _ in range(2))
    v = rn(B, T, HV, V).bfloat16()
    return q, k, v, torch.nn.functional.logsigmoid(rn(B, T, HV) + 3.0)


@pytest.mark.parametrize("stages", [2, 3])
def test_simple_gla_forming_its_scores_on_the_warp_specialised_sweep_gives_the_triton_sweeps_bits(stages,
                                                                                                   monkeypatch):
    """DeltaShape.sweep_scores (the sweep forms Q K^T from its tiles; the group prep writes the coef
    alone), warp-specialised against the Triton sweep in the same form: dense with a partial last
    chunk, resets (decay 0) mid-chunk, an initial state and the final state; varlen under GVA with a
    one-token and an empty sequence; a state cache with a padding slot."""
    q, k, v, g = gla_args(2, 2500, 4, 4, seed=21)
    g[:, 700, 1] = float("-inf")
    h0 = torch.randn(2, 4, 128, 128, device=DEV)
    o, ht = run_both(monkeypatch, lambda: recurscan.chunk_simple_gla(q, k, v, g, scale=0.2, initial_state=h0,
                                                                     output_final_state=True),
                     group_prep=True, stages=stages, specialized=True, sweep_scores=True)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    q, k, v, g = gla_args(1, 4100, 2, 4, seed=22)
    cu = torch.tensor([0, 1, 2000, 2000, 2001, 4100], device=DEV, dtype=torch.int32)
    run_both(monkeypatch, lambda: recurscan.chunk_simple_gla(q, k, v, g, output_final_state=True, cu_seqlens=cu),
             group_prep=True, stages=stages, specialized=True, sweep_scores=True)
    cache = torch.randn(6, 4, 128, 128, device=DEV)
    slots = torch.tensor([3, -1, 0, 5, 1], device=DEV, dtype=torch.int32)

    def with_cache():
        state = cache.clone()
        o = recurscan.chunk_simple_gla(q, k, v, g, cu_seqlens=cu, state=state, state_indices=slots)[0]
        return o, state
    o, state = run_both(monkeypatch, with_cache, group_prep=True, stages=stages, specialized=True, sweep_scores=True)
    assert torch.equal(o[:, 1:2000], torch.zeros_like(o[:, 1:2000]))  # the padding slot's sequence
    assert torch.equal(state[[2, 4]], cache[[2, 4]])  # slots no sequence owns


@pytest.mark.parametrize("per_channel", [False, True], ids=["D per head", "D per channel"])
def test_ssd_with_a_group_a_head_forming_its_scores_gives_the_triton_sweeps_bits(per_channel, monkeypatch):
    """SSD with as many groups as heads (nothing for a group prep to share) on the warp-specialised
    sweep forming its scores, against the Triton sweep in that form: a partial last chunk, an
    initial state and the final states."""
    a, kw = ssd_args(2, 3000, G=16, per_channel=per_channel, seed=25)
    h0 = torch.randn(2, 16, 64, 128, device=DEV)
    y, hT = run_both(monkeypatch, lambda: recurscan.mamba_chunk_scan_combined(
        *a, **kw, initial_states=h0, return_final_states=True), group_prep=True, specialized=True, sweep_scores=True)
    assert torch.isfinite(y).all() and torch.isfinite(hT).all()


def test_simple_gla_forming_its_scores_with_a_nan_key_replays_its_program(monkeypatch):
    """A NaN key, and a reset (decay 0) ten rows later in its chunk: its program's state comes out
    non-finite, the Triton replay (SWEEP_SCORES too) writes its outputs again; the two forms agree
    bit for bit; the outputs before the NaN, and the other sequence's, are finite, and every output
    of its head from the NaN on is not, across the reset (the token loop's 0 x NaN: the sweep keeps
    a non-finite score past a reset); of the head's final state, the key's row alone is NaN, as in
    the token loop."""
    q, k, v, g = gla_args(1, 3000, 2, 2, seed=23)
    k[0, 1500, 1, 5] = float("nan")
    g[0, 1510, 1] = float("-inf")
    cu = torch.tensor([0, 2000, 3000], device=DEV, dtype=torch.int32)
    o, ht = run_both(monkeypatch, lambda: recurscan.chunk_simple_gla(q, k, v, g, output_final_state=True,
                                                                     cu_seqlens=cu),
                     group_prep=True, specialized=True, sweep_scores=True)
    assert torch.isfinite(o[:, :1500]).all() and torch.isfinite(o[:, 2000:]).all() and torch.isfinite(ht[1]).all()
    assert not torch.isfinite(o[0, 1500:2000, 1]).any()
    assert torch.isnan(ht[0, 1, 5]).all() and torch.isfinite(ht[0, 1, :5]).all() and torch.isfinite(ht[0, 1, 6:]).all()


def test_the_benchmark_simple_gla_forming_its_scores_against_the_oracle(monkeypatch):
    """B4 T4096 H16 K = V = 128 (issue 20's simple GLA row) with the sweep forming its scores,
    warp-specialised: the Triton sweep's bits in that form, and the float64 PyTorch form's values."""
    q, k, v, g = gla_args(4, 4096, 16, 16, seed=24)
    o = run_both(monkeypatch, lambda: recurscan.chunk_simple_gla(q, k, v, g), group_prep=True, specialized=True,
                 sweep_scores=True)[0]
    want = recurscan.chunk_simple_gla(q.double(), k.double(), v.double(), g.double(), backend="torch")[0]
    err = relative_rms(o.double(), want)
    print(f"simple GLA B4 T4096 forming its scores, warp-specialised: relative RMS {err:.2e}")
    assert err < 1e-2


def test_a_gate_z_runs_the_triton_sweep(monkeypatch):
    """The twin has no gate: with z the launch layer picks the Triton sweep for a planned twin."""
    picked = sweep_kernels(monkeypatch)
    planned = plan_gla.gla_sweep_shape
    monkeypatch.setattr(plan_gla, "gla_sweep_shape", lambda problem, device, gluon=True: dataclasses.replace(
        planned(problem, device, gluon=False), block_v=64, num_warps=4, num_stages=3, tma_store=True,
        group_prep=False, calm_gates=False, prep_heads=1, phases=6, segments=1, gluon_sweep=True))
    clear_caches()
    a, kw = ssd_args(1, 1024)
    y = recurscan.mamba_chunk_scan_combined(*a, **kw, z=torch.randn_like(a[0]))
    assert picked and "GluonJITFunction" not in picked, picked
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("Bt, T, launch", [(1, 16384, dict(phases=6)), (4, 4096, dict(group_prep=True, stages=2))],
                         ids=["B1 T16384, the delta prep in 6 phases", "B4 T4096, the group prep at two stages"])
def test_the_benchmark_ssd_on_the_twin_against_the_oracle(Bt, T, launch, monkeypatch):
    """80 heads x 64, one group, dstate 128 (benchmarks/gpu_gla.py's inputs) on the twin, against
    the float64 PyTorch form."""
    from benchmarks.gpu_gla import ssd_inputs
    a, kw = ssd_inputs(Bt, T)
    y = run_both(monkeypatch, lambda: recurscan.mamba_chunk_scan_combined(*a, **kw), **launch)[0]
    want = recurscan.mamba_chunk_scan_combined(*(t.double() for t in a), **{
        k: (v.double() if torch.is_tensor(v) else v) for k, v in kw.items()}, backend="torch")
    err = relative_rms(y.double(), want)
    print(f"SSD B{Bt} T{T} on the twin: relative RMS {err:.2e}")
    assert err < 1e-2


def test_training_on_the_twin_gives_the_same_gradients(monkeypatch):
    """SSD forward + backward with the forward's sweep on the twin or the Triton kernel: the same
    output and gradients, bit for bit (the backward's recompute on the Triton sweep in both: its
    twin is the next test's)."""
    from benchmarks.gpu_gla import SSD_GRADS, train_step
    monkeypatch.setattr(plan_gla, "GLUON_GLA_RECOMPUTE_SWEEP",
                        dataclasses.replace(plan_gla.GLUON_GLA_RECOMPUTE_SWEEP, on=False))
    a, kw = ssd_args(1, 4096, H=16, G=1, seed=5)
    dy = torch.randn(a[0].shape, device=DEV, generator=torch.Generator(device=DEV).manual_seed(6)).bfloat16()
    run_both(monkeypatch, lambda: train_step(recurscan.mamba_chunk_scan_combined, a, kw, SSD_GRADS, dy), 6)


def test_the_recompute_on_the_twin_gives_the_same_gradients(monkeypatch):
    """SSD forward + backward with the backward's recompute of the chunk states on the twin (outputs
    off; plan.gla.GLUON_GLA_RECOMPUTE_SWEEP) or on the Triton sweep: the same gradients, bit for
    bit. A group of 80 value heads takes the group prep with its calm gates there (the reverse
    sweep reads its scores); B2 T1000 plans the forward's row of the twin's kind (64 value columns
    on one warpgroup), whose shape the recompute's follows."""
    from benchmarks.gpu_gla import SSD_GRADS, train_step
    a, kw = ssd_args(2, 1000, H=80, G=1, seed=8)
    dy = torch.randn(a[0].shape, device=DEV, generator=torch.Generator(device=DEV).manual_seed(9)).bfloat16()
    same_bits_with_row(monkeypatch, "GLUON_GLA_RECOMPUTE_SWEEP", sweep_kernels(monkeypatch),  # the recompute's
                       lambda: train_step(recurscan.mamba_chunk_scan_combined, a, kw, SSD_GRADS, dy))  # built last


def same_bits_with_row(monkeypatch, row: str, picked: list, run) -> None:
    """``run()``'s tensors with plan.gla's Gluon row ``row`` off, then on: the kernel the launch
    layer recorded last in ``picked`` is the Triton kernel, then the Gluon twin; the tensors are
    finite and agree bit for bit."""
    out = {}
    for twin in (False, True):
        monkeypatch.setattr(plan_gla, row, dataclasses.replace(getattr(plan_gla, row), on=twin))
        clear_caches()
        picked.clear()
        out[twin] = [t.clone() for t in run()]
        assert picked[-1] == ("GluonJITFunction" if twin else "JITFunction"), picked
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(out[False], out[True])):
        assert torch.isfinite(b).all(), f"tensor {i}"
        assert torch.equal(bits(a), bits(b)), f"tensor {i}: {int((a != b).sum())} elements differ"


def ssd_training_case(form):
    """SSD training inputs for the reverse sweep's tests: 80 value heads of one group (the group prep
    with its calm gates, whose scores the reverse sweep reads); mamba's seq_idx changing inside
    chunks makes them stormy (the whole gate tile), the rest are calm; a partial last chunk; dense
    with an initial state and the final states' gradient, or varlen with a one-token sequence.
    Returns ``grads()``: every gradient of one forward + backward."""
    gen = torch.Generator(device=DEV).manual_seed(11)
    if form.startswith("dense"):
        (x, dt, A, B, C), kw = ssd_args(2, 1000, H=80, G=1, seed=12)
        seq_idx = torch.zeros(2, 1000, dtype=torch.int32, device=DEV)
        seq_idx[:, 300:] = 1
        seq_idx[1, 333:] = 2
        h0 = torch.randn(2, 80, 64, 128, device=DEV, generator=gen) * 0.1
        leaves = [x, dt, A, B, C, kw.pop("D"), kw.pop("dt_bias"), h0]
        kw.update(seq_idx=seq_idx, return_final_states=True)
        upstream = (torch.randn(x.shape, device=DEV, generator=gen).bfloat16(),
                    torch.randn(h0.shape, device=DEV, generator=gen))
    else:
        (x, dt, A, B, C), kw = ssd_args(1, 2100, H=80, G=1, seed=13)
        kw["cu_seqlens"] = torch.tensor([0, 1, 1000, 1001, 2100], device=DEV, dtype=torch.int32)
        leaves = [x, dt, A, B, C, kw.pop("D"), kw.pop("dt_bias"), None]
        upstream = torch.randn(x.shape, device=DEV, generator=gen).bfloat16()

    def grads():
        mine = [None if t is None else t.detach().clone().requires_grad_() for t in leaves]
        x_, dt_, A_, B_, C_, D_, bias_, h0_ = mine
        out = recurscan.mamba_chunk_scan_combined(x_, dt_, A_, B_, C_, D=D_, dt_bias=bias_, initial_states=h0_, **kw)
        return torch.autograd.grad(out, [t for t in mine if t is not None], upstream)
    return grads


def record_reverse_sweeps(monkeypatch, by_name=False):
    """The kinds (or function names) of the reverse sweep kernels launch.gla picks from now on."""
    import recurscan.launch.gla as launch_gla
    picked = []
    choose = launch_gla._reverse_sweep_twin

    def recording(*a, **kw):
        step = choose(*a, **kw)
        picked.append(getattr(step.kernel, "fn", step.kernel).__name__ if by_name else type(step.kernel).__name__)
        return step
    monkeypatch.setattr(launch_gla, "_reverse_sweep_twin", recording)
    return picked


REVERSE_FORMS = ["dense, seq_idx resets, initial and final states", "varlen, a one-token sequence"]


@pytest.mark.parametrize("form", REVERSE_FORMS)
def test_the_reverse_sweep_twin_gives_the_triton_sweeps_gradients(form, monkeypatch):
    """SSD forward + backward with the backward's reverse sweep on its Gluon twin
    (kernels/gluon/gla_backward_sweep.py; plan.gla.GLUON_GLA_REVERSE_SWEEP) or on the Triton kernel
    at the twin's 64 value columns on 4 warps: every gradient bit for bit (:func:`ssd_training_case`).
    Both write dV (plan.gla.GLA_REVERSE_SSD_GRADS off: the twin leaves SSD_GRADS to the Triton kernel)."""
    monkeypatch.setattr(plan_gla, "GLA_REVERSE_SSD_GRADS", False)
    picked = record_reverse_sweeps(monkeypatch)
    monkeypatch.setattr(plan_gla, "REVERSE_SWEEP", (64, 4))
    same_bits_with_row(monkeypatch, "GLUON_GLA_REVERSE_SWEEP", picked, ssd_training_case(form))


@pytest.mark.parametrize("form", REVERSE_FORMS)
def test_the_warp_specialised_reverse_sweep_gives_the_twins_gradients(form, monkeypatch):
    """plan.gla.GLUON_GLA_REVERSE_SPECIALIZED (kernels/gluon/gla_backward_sweep_specialized.py)
    against the twin it splits over partitions: every gradient of SSD's forward + backward bit for
    bit and finite (:func:`ssd_training_case`), both writing dV (plan.gla.GLA_REVERSE_SSD_GRADS off:
    the twin leaves SSD_GRADS to the Triton kernel; test_x_and_dt_formed_in_the_warp_specialised_reverse_sweep
    checks the specialised form's)."""
    monkeypatch.setattr(plan_gla, "GLA_REVERSE_SSD_GRADS", False)
    picked = record_reverse_sweeps(monkeypatch, by_name=True)
    grads = ssd_training_case(form)
    out = {}
    for on in (False, True):
        monkeypatch.setattr(plan_gla, "GLUON_GLA_REVERSE_SPECIALIZED",
                            dataclasses.replace(plan_gla.GLUON_GLA_REVERSE_SPECIALIZED, on=on))
        clear_caches()
        picked.clear()
        out[on] = [t.clone() for t in grads()]
        assert picked[-1] == ("gluon_gla_bwd_sweep_specialized_kernel" if on else "gluon_gla_bwd_sweep_kernel"), picked
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(out[False], out[True])):
        assert torch.isfinite(b).all(), f"tensor {i}"
        assert torch.equal(bits(a), bits(b)), f"tensor {i}: {int((a != b).sum())} elements differ"


def kept_states_forward(sweep, a, kw, cu=None, h0=None, ssd=True):
    """launch.gla.chunk_simple_gla_fwd as a training forward that keeps its chunk states
    (``states_for_backward``: bf16, unfilled) on the delta sweep in ``sweep``: SSD's ``(x, dt, A,
    B, C)`` with D per head, dt_bias and softplus, or simple GLA's ``(q, k, v, g)``. Returns
    ``(o, final, chunk_states)``."""
    from recurscan.launch.gla import SsdPrologue, chunk_simple_gla_fwd
    shape = dataclasses.replace(plan_gla.GLA_LAUNCH, sweep=sweep)
    desc = None if cu is None else recurscan.build_chunk_descriptors(cu, device=DEV)
    if ssd:
        x, dt, A, B, C = a
        q, k, v, g = C, B, x, None
        prologue = SsdPrologue(dt, A, kw["dt_bias"], kw["D"], None, True, (0.0, float("inf")))
        scale = 1.0
    else:
        (q, k, v, g), prologue, scale = a, None, 0.2
    rows = q.shape[0] * -(-q.shape[1] // 64) if cu is None else desc.chunk_indices.shape[0]
    return chunk_simple_gla_fwd(q, k, v, g, scale=scale, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                shape=shape, ssd=prologue, chunk_state_rows=rows, states_for_backward=True,
                                chunk_indices=None if cu is None else desc.chunk_indices,
                                chunk_offsets=None if cu is None else desc.chunk_offsets)


@pytest.mark.parametrize("form", ["SSD dense", "SSD varlen", "SSD in phases", "simple GLA dense", "simple GLA varlen"])
def test_the_warp_specialised_sweep_keeps_the_triton_sweeps_chunk_states(form, monkeypatch):
    """plan.gla.GLA_FORWARD_STATES's forward: the warp-specialised sweep stores each chunk's entering
    state from its chain's hand-over buffer (held as S [K, BV], one bulk store a chunk), in bf16
    as the backward reads them, with no fill first (buffers poisoned with NaN here). Against the
    Triton sweep in the same form, bit for bit: outputs, final states and chunk states, every
    chunk's row written (dense, 16 heads a group, an initial state and a partial last chunk; varlen with
    a one-token and an empty sequence; in 3 phases; simple GLA forming its scores, GVA in varlen)."""
    picked = sweep_kernels(monkeypatch, by_name=True)
    phases = 3 if form.endswith("phases") else 1
    ssd = form.startswith("SSD")
    cu = torch.tensor([0, 1, 2000, 2000, 2001, 4100], device=DEV, dtype=torch.int32) if form.endswith("varlen") \
        else None
    if ssd:
        a, kw = ssd_args(1 if cu is not None else 2, 4100 if cu is not None else 3000, G=1, seed=31)
        h0 = None if cu is not None else torch.randn(2, 16, 128, 64, device=DEV)
    elif cu is not None:
        a, kw, h0 = gla_args(1, 4100, 2, 4, seed=32), {}, None
    else:
        a, kw, h0 = gla_args(2, 2500, 4, 4, seed=33), {}, torch.randn(2, 4, 128, 128, device=DEV)
    out = {}
    for twin in (False, True):
        sweep = DeltaShape(64, 4, 3, 4, "tests: the forward keeping its chunk states", tma_store=True,
                           group_prep=True, phases=phases, gluon_sweep=twin, specialized=twin, sweep_scores=not ssd)
        clear_caches()
        picked.clear()
        out[twin] = [t.clone() for t in kept_states_forward(sweep, a, kw, cu=cu, h0=h0, ssd=ssd)]
        assert ("gluon_gla_sweep_specialized_kernel" in picked) == twin, picked
    torch.cuda.synchronize()
    # every chunk's row written (varlen: the descriptors' rows past the last sequence's are padding)
    written = out[True][2].shape[0] if cu is None else int(recurscan.build_chunk_descriptors(cu).chunk_offsets[-1])
    assert out[True][2].dtype == torch.bfloat16 and torch.isfinite(out[True][2][:written]).all()
    for name, x, y in zip(("outputs", "final states", "chunk states"), out[False], out[True]):
        assert torch.equal(bits(x), bits(y)), f"{name}: {int((x != y).sum())} elements differ"


@pytest.mark.parametrize("op", ["SSD", "SSD, x and dt in the sweeps", "SSD, x and dt in the sweeps, v formed nowhere",
                                "simple GLA"])
def test_training_from_the_kept_chunk_states_against_the_recompute(op, monkeypatch):
    """plan.gla.GLA_FORWARD_STATES on the planned rows: SSD at the benchmark's 80 heads x 64, dstate
    128 (B1 T4096: the group prep, the warp-specialised sweep keeping the chunk states, the
    backward running the recompute's group prep alone), simple GLA B2 T2048 H16 (its whole
    recompute skipped): every gradient finite and within bf16 rounding of the recompute's (SSD's
    kept states come from x raw with dt in the gates, the recompute's from v = dt x in bf16).
    "x and dt in the sweeps": with plan.gla.GLA_REVERSE_SSD_GRADS too, so that x's and dt's
    gradients come from the reverse sweep; "v formed nowhere": and plan.gla.GLA_PARALLEL_V_FROM_X,
    the parallel stage forming v = dt x in its factors."""
    import recurscan.launch.gla as launch_gla
    from benchmarks.gpu_gla import SSD_GRADS, ssd_inputs, train_step
    if op.startswith("SSD"):
        a, kw = ssd_inputs(1, 4096)
        dy = torch.randn(a[0].shape, device=DEV, generator=torch.Generator(device=DEV).manual_seed(41)).bfloat16()
        run = lambda: train_step(recurscan.mamba_chunk_scan_combined, a, kw, SSD_GRADS, dy)  # noqa: E731
    else:
        a = gla_args(2, 2048, 16, 16, seed=42)
        dy = torch.randn(a[2].shape, device=DEV, generator=torch.Generator(device=DEV).manual_seed(43)).bfloat16()
        run = lambda: train_step(lambda *x: recurscan.chunk_simple_gla(*x)[0], a, {}, (0, 1, 2, 3), dy)  # noqa: E731
    out = {}
    for kept in (False, True):
        monkeypatch.setattr(plan_gla, "GLA_FORWARD_STATES", kept)
        monkeypatch.setattr(plan_gla, "GLA_REVERSE_SSD_GRADS", kept and "sweeps" in op)
        monkeypatch.setattr(plan_gla, "GLA_PARALLEL_V_FROM_X", kept and op.endswith("nowhere"))
        clear_caches()
        out[kept] = [t.clone() for t in run()]
        if "sweeps" in op:
            (built,) = launch_gla.GLA_BACKWARD_LAUNCHES.values()
            assert built.v_from_x == (kept and op.endswith("nowhere")) and built.steps[0].kwargs["SSD_GRADS"] == kept
    torch.cuda.synchronize()
    for i, (x, y) in enumerate(zip(out[False], out[True])):
        assert torch.isfinite(y).all(), f"gradient {i}"
        err = relative_rms(y.double(), x.double())
        print(f"{op} gradient {i}: relative RMS {err:.2e} between the kept chunk states and the recompute")
        assert err < 1e-2, f"gradient {i}: {err:.2e}"


@pytest.mark.parametrize("form", REVERSE_FORMS)
def test_x_and_dt_formed_in_the_warp_specialised_reverse_sweep(form, monkeypatch):
    """plan.gla.GLA_REVERSE_SSD_GRADS: SSD without a gate z forms x's gradient, dt's through v = dt x
    and D's sums in the warp-specialised reverse sweep (SSD_GRADS: x's tiles in its ring, dx from
    its outputs warpgroups, D's sums on the chain) in place of dV and the elementwise pass after
    it: every gradient finite and the same as without it to float32 rounding (dx: the same float32
    sums rounded once to bf16) (:func:`ssd_training_case`)."""
    import recurscan.launch.gla as launch_gla
    picked = record_reverse_sweeps(monkeypatch, by_name=True)
    grads = ssd_training_case(form)
    out = {}
    for on in (False, True):
        monkeypatch.setattr(plan_gla, "GLA_REVERSE_SSD_GRADS", on)
        clear_caches()
        picked.clear()
        out[on] = [t.clone() for t in grads()]
        assert picked[-1] == "gluon_gla_bwd_sweep_specialized_kernel", picked
        (built,) = launch_gla.GLA_BACKWARD_LAUNCHES.values()
        assert built.steps[0].kwargs["SSD_GRADS"] == on
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(out[False], out[True])):
        assert torch.isfinite(b).all(), f"gradient {i}"
        err = relative_rms(b.double(), a.double())
        print(f"{form}, gradient {i}: relative RMS {err:.2e} with x and dt formed in the reverse sweep")
        assert err < (1e-3 if b.dtype == torch.bfloat16 else 2e-5), f"gradient {i}: {err:.2e}"
