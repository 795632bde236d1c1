"""The Mamba2 SSD oracle: chunked form against the token loop, mamba_ssm's dt semantics, and the
SSD = GLA identity.

Tolerances (as in test_reference_gla.py):
- float64, same inputs: max abs error <= 1e-10 * (1 + max|ref|); the forms differ only by
  reassociation (~1e-14 relative in float64), a wrong decay is an O(1) error.
- float32 chunked against float64 naive: relative RMS < 1e-6. Each output sums ~C + N products
  with decays <= 1, each rounded to ~6e-8 relative in float32. Measured at T = 200: 0.6-1.4e-7
  for the chunked form, 0.8-2.3e-7 for the float32 token loop itself; 1e-6 is ~7x the worst.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recurscan.reference.common import chunk_offsets, sequences
from recurscan.reference.gla import gla_naive
from recurscan.reference.ssd import discretize_dt, skip_and_gate, ssd_chunked, ssd_naive
from tests.helpers.tolerances import assert_reassociation_close, relative_rms

F64 = torch.float64
INF = float("inf")
CU = [0, 1, 2, 66, 67, 200]

# Feature sets, each with its hostile decays:
#   raw:      raw positive dt (no softplus) with dt = 0 exactly at some tokens (decay 1, no write);
#             A = [-0.5, -1.5, -inf, 0]: head 2 resets at every token (log decay -inf), head 3
#             never decays; no D, no z.
#   softplus: dt_bias + softplus (some pre-activations above mamba's linear threshold 20),
#             D [H], z gate.
#   limit:    softplus then dt_limit clamp, D [H, P], no z.
VARIANTS = ["raw", "softplus", "limit"]


def make_inputs(variant, Bt=2, T=65, H=4, P=20, G=2, N=12, Nseq=None, dtype=F64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    x, B, C = rnd(Bt, T, H, P), rnd(Bt, T, G, N), rnd(Bt, T, G, N)
    Nseq = Bt if Nseq is None else Nseq
    kw = dict(initial_state=rnd(Nseq, H, P, N))
    if variant == "raw":
        dt = torch.rand(Bt, T, H, generator=gen, dtype=F64) * 0.5 + 0.05
        dt[:, ::4, [0, 1, 3]] = 0.0
        A = torch.tensor([-0.5, -1.5, -INF, 0.0], dtype=F64)
    else:
        dt = rnd(Bt, T, H) - 1.0
        dt[:, 3::29, 1] = 25.0  # softplus is linear above 20 (mamba's threshold): dt = 25 + bias
        A = -torch.rand(H, generator=gen, dtype=F64) * 2 - 0.1
        kw.update(dt_bias=rnd(H) * 0.5, dt_softplus=True)
        if variant == "softplus":
            kw.update(D=rnd(H), z=rnd(Bt, T, H, P))
        else:
            kw.update(D=rnd(H, P), dt_limit=(0.05, 0.7))
    kw = {key: (val.to(dtype) if isinstance(val, torch.Tensor) else val) for key, val in kw.items()}
    return [t.to(dtype) for t in (x, dt, A, B, C)], kw


@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_chunked_matches_naive_float64(T, variant, chunk_size):
    args, kw = make_inputs(variant, T=T)
    ref = ssd_naive(*args, **kw, chunk_size=chunk_size, return_chunk_states=True)
    got = ssd_chunked(*args, **kw, chunk_size=chunk_size, return_chunk_states=True)
    assert ref[2].shape[0] == 2 * -(-T // chunk_size)
    for name, a, b in zip(["y", "final", "chunk_states"], got, ref):
        assert a.dtype == F64
        assert_reassociation_close(a, b, name)


@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("variant", VARIANTS)
def test_varlen_matches_each_sequence_alone(variant, chunk_size):
    cu = torch.tensor(CU, dtype=torch.int64)
    (x, dt, A, B, C), kw = make_inputs(variant, Bt=1, T=CU[-1], Nseq=len(CU) - 1)
    ref = ssd_naive(x, dt, A, B, C, **kw, cu_seqlens=cu, chunk_size=chunk_size, return_chunk_states=True)
    got = ssd_chunked(x, dt, A, B, C, **kw, cu_seqlens=cu, chunk_size=chunk_size, return_chunk_states=True)
    for name, a, b in zip(["y", "final", "chunk_states"], got, ref):
        assert_reassociation_close(a, b, f"varlen {name}")

    offsets = chunk_offsets(sequences(1, CU[-1], cu), chunk_size)
    assert got[2].shape[0] == offsets[-1] == sum(-(-(e - s) // chunk_size) for s, e in zip(CU[:-1], CU[1:]))
    for n, (s, e) in enumerate(zip(CU[:-1], CU[1:])):
        one_kw = dict(kw, initial_state=kw["initial_state"][n : n + 1])
        if "z" in kw:
            one_kw["z"] = kw["z"][:, s:e]
        one = [t[:, s:e] for t in (x, dt, B, C)]
        for fn in (ssd_naive, ssd_chunked):
            y, fin, cs = fn(one[0], one[1], A, one[2], one[3], **one_kw, chunk_size=chunk_size,
                            return_chunk_states=True)
            assert_reassociation_close(got[0][:, s:e], y, f"seq {n} y ({fn.__name__})")
            assert_reassociation_close(got[1][n : n + 1], fin, f"seq {n} final ({fn.__name__})")
            assert_reassociation_close(got[2][offsets[n] : offsets[n + 1]], cs, f"seq {n} chunk states ({fn.__name__})")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_float32_chunked_against_float64_naive(variant, chunk_size):
    args, kw = make_inputs(variant, T=200, dtype=torch.float32)
    kw64 = {key: (v.to(F64) if isinstance(v, torch.Tensor) else v) for key, v in kw.items()}
    ref = ssd_naive(*(t.to(F64) for t in args), **kw64, chunk_size=chunk_size, return_chunk_states=True)
    got = ssd_chunked(*args, **kw, chunk_size=chunk_size, return_chunk_states=True)
    for name, a, b in zip(["y", "final", "chunk_states"], got, ref):
        assert a.dtype == torch.float32
        assert torch.isfinite(a).all()
        assert relative_rms(a, b) < 1e-6, f"{name}: rel RMS {relative_rms(a, b):.2e}"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_ssd_is_gla_with_q_C_k_B_v_xdt(variant, chunk_size):
    """SSD = GLA(q = C, k = B, v = x * dt, g = A * dt, scale = 1), then D * x and the z gate.
    GLA's state is [K = N, V = P], the transpose of mamba's [P, N]."""
    (x, dt_raw, A, B, C), kw = make_inputs(variant, T=70)
    y, fin, cs = ssd_naive(x, dt_raw, A, B, C, **kw, chunk_size=chunk_size, return_chunk_states=True)

    dt = discretize_dt(dt_raw, kw.get("dt_bias"), kw.get("dt_softplus", False), kw.get("dt_limit", (0.0, INF)))
    o, fin_g, cs_g = gla_naive(C, B, x * dt[..., None], A * dt, scale=1.0,
                               initial_state=kw["initial_state"].transpose(-1, -2), chunk_size=chunk_size,
                               return_chunk_states=True)
    assert_reassociation_close(y, skip_and_gate(o, x, kw.get("D"), kw.get("z")), "y")
    assert_reassociation_close(fin, fin_g.transpose(-1, -2), "final")
    assert_reassociation_close(cs, cs_g.transpose(-1, -2), "chunk states")


def test_one_step_is_mambas_selective_state_update():
    """T = 1, written out as mamba_ssm's selective_state_update_ref computes one decode step."""
    gen = torch.Generator().manual_seed(1)
    Bt, H, P, G, N = 3, 4, 5, 2, 6
    x, z = torch.randn(Bt, 1, H, P, generator=gen, dtype=F64), torch.randn(Bt, 1, H, P, generator=gen, dtype=F64)
    dt, dt_bias = torch.randn(Bt, 1, H, generator=gen, dtype=F64), torch.randn(H, generator=gen, dtype=F64)
    A, D = -torch.rand(H, generator=gen, dtype=F64), torch.randn(H, generator=gen, dtype=F64)
    B, C = torch.randn(Bt, 1, G, N, generator=gen, dtype=F64), torch.randn(Bt, 1, G, N, generator=gen, dtype=F64)
    h0 = torch.randn(Bt, H, P, N, generator=gen, dtype=F64)

    d = F.softplus(dt[:, 0] + dt_bias)  # [Bt, H]
    Bh, Ch = B[:, 0].repeat_interleave(2, dim=1), C[:, 0].repeat_interleave(2, dim=1)  # [Bt, H, N]
    h = torch.exp(d * A)[..., None, None] * h0 + d[..., None, None] * x[:, 0, :, :, None] * Bh[:, :, None, :]
    out = torch.einsum("bhpn,bhn->bhp", h, Ch) + x[:, 0] * D[:, None]
    out = out * z[:, 0] * torch.sigmoid(z[:, 0])

    for fn in (ssd_naive, ssd_chunked):
        y, fin = fn(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True, initial_state=h0)
        assert_reassociation_close(y[:, 0], out, fn.__name__)
        assert_reassociation_close(fin, h, fn.__name__)


def test_dt_discretization_follows_mamba():
    raw = torch.tensor([-2.0, -0.5, 0.0, 0.3, 19.0, 25.0], dtype=F64)
    # Default limit: no clamp at all, so raw negative dt stays negative (mamba's reference paths).
    assert torch.equal(discretize_dt(raw), raw)
    assert torch.equal(discretize_dt(raw, dt_limit=(0.0, float("inf"))), raw)
    # softplus: log(1 + e^x), linear above 20 like mamba's kernels.
    sp = discretize_dt(raw, dt_softplus=True)
    assert torch.allclose(sp[:5], torch.log1p(torch.exp(raw[:5])), rtol=1e-15, atol=0)
    assert sp[5] == 25.0
    # bias first, then softplus, then the clamp
    bias = torch.tensor(0.25, dtype=F64)
    got = discretize_dt(raw, dt_bias=bias, dt_softplus=True, dt_limit=(0.5, 2.0))
    assert torch.equal(got, F.softplus(raw + bias).clamp(0.5, 2.0))
    assert torch.equal(discretize_dt(raw, dt_limit=(0.0, 1.0)), raw.clamp(0.0, 1.0))


def test_D_per_head_equals_D_per_head_and_channel():
    (x, dt, A, B, C), kw = make_inputs("softplus", T=20)
    D = kw.pop("D")
    a = ssd_chunked(x, dt, A, B, C, D=D, **kw, chunk_size=16)
    b = ssd_chunked(x, dt, A, B, C, D=D[:, None].expand(-1, x.shape[-1]), **kw, chunk_size=16)
    for u, v in zip(a, b):
        assert_reassociation_close(u, v)


def test_groups_map_heads_to_group_h_over_ratio():
    """Head h uses B/C group h // (H // G): equal to repeating groups to heads by hand."""
    (x, dt, A, B, C), kw = make_inputs("raw", T=20, G=2, H=4)
    a = ssd_chunked(x, dt, A, B, C, **kw, chunk_size=16)
    b = ssd_naive(x, dt, A, B.repeat_interleave(2, dim=2), C.repeat_interleave(2, dim=2), **kw)
    for u, v in zip(a, b):
        assert_reassociation_close(u, v)


def test_dtypes_defaults_and_inputs_untouched():
    (x, dt, A, B, C), kw = make_inputs("softplus", T=70, dtype=torch.bfloat16)
    h0 = kw["initial_state"].clone()
    y, fin, cs = ssd_chunked(x, dt, A, B, C, **kw, return_chunk_states=True)
    assert y.dtype == fin.dtype == torch.float32
    assert cs.shape[0] == 2 * 2  # default chunk_size 64
    assert torch.equal(kw["initial_state"], h0)
    y, fin = ssd_naive(x.float(), dt.float(), A.to(F64), B.float(), C.float())
    assert y.dtype == fin.dtype == F64
    assert fin.shape == (2, 4, 20, 12)


def test_bad_shapes_are_refused():
    (x, dt, A, B, C), kw = make_inputs("raw", T=10, H=4, G=2)
    with pytest.raises(ValueError, match="multiple of groups"):
        ssd_naive(x[:, :, :3], dt[:, :, :3], A[:3], B, C)
    with pytest.raises(ValueError, match="D must be"):
        ssd_chunked(x, dt, A, B, C, D=torch.ones(3))
    with pytest.raises(ValueError, match="batch must be 1"):
        ssd_chunked(x, dt, A, B, C, cu_seqlens=torch.tensor([0, 5, 10]))
    with pytest.raises(ValueError, match="initial_state"):
        ssd_naive(x, dt, A, B, C, initial_state=torch.zeros(2, 4, 12, 20))


@pytest.mark.parametrize("variant", ["softplus", "limit"])
def test_gradients_of_chunked_match_naive(variant):
    """The public CPU path is the chunked form under autograd: its gradients equal the token
    loop's. (Not the "raw" variant: with A = -inf, d(dt * A)/d dt is -inf times a zero gradient,
    NaN in both forms and in mamba; a reset head has no meaningful dt gradient.)"""
    (x, dt, A, B, C), kw = make_inputs(variant, T=40)
    kw = dict(kw)
    names = ["x", "dt", "A", "B", "C", "D", "initial_state", "dt_bias"] + (["z"] if "z" in kw else [])
    base = dict(x=x, dt=dt, A=A, B=B, C=C, **kw)

    def grads(fn):
        leaves = {n: base[n].clone().requires_grad_(True) for n in names}
        out = fn(**{**base, **leaves}, chunk_size=16, return_chunk_states=True)
        gen = torch.Generator().manual_seed(1)
        loss = sum((o * torch.randn(o.shape, generator=gen, dtype=F64)).sum() for o in out)
        return torch.autograd.grad(loss, list(leaves.values()))

    for name, a, b in zip(names, grads(ssd_chunked), grads(ssd_naive)):
        assert_reassociation_close(a, b, f"d{name}")
