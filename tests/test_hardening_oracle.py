"""Hardening of the PyTorch oracle's chunked forms (issue 17), written as a specification.

A. Causality under non-finite input. A NaN or +-inf at token t of any input (q, k, v, g, beta;
   x, dt, B, C, z; a, b) of one sequence leaves
   - every output before t of that sequence, and
   - every output and the final state of every other sequence (a batch row, a varlen sequence)
   BIT-IDENTICAL (torch.equal) to the clean run of the same op, and
   - the outputs at and after t and the final state are non-finite exactly where the token
     loop's (the ``*_naive`` ground truth) are: a NaN is never hidden (the state after it stays
     non-finite), and it spreads no further than the recurrence spreads it (a NaN in q at t
     reaches only output t; a NaN in one value column only that column).
   ``g = -inf`` is not garbage: it is a decay of exactly 0 (a reset) and keeps working.
B. Growth (g > 0; for SSD A * dt > 0): outputs are right wherever float32 (float64) can hold
   the result: finite and equal to the token loop (in float64) before the true values overflow,
   non-finite where the true values overflow, and every finite output equal to the true value
   (no silently finite garbage after the overflow).
   Every test of A and B fails on the code before this hardening except test_reset_is_legal
   (a guard: resets worked and must keep working); of the parametrized cases, those already
   causal before (the diagonal scan, q in every family, g in GLA, C and z in SSD, ...) pass
   there too, and growth was already right for GLA, SSD and the diagonal scan.
C. Domains: a non-finite ``scale`` is a ValueError naming ``scale``; ``num_accepted_tokens``
   outside ``[0, snapshots]`` (``snapshots = intermediate_states.shape[1]``) is a ValueError
   naming it and the range, on CPU tensors.

The ops are called with CPU tensors (``backend="torch"`` where the op takes a backend), so they
run the oracle's chunked forms; windows of 64 tokens, positions t chosen around the window
boundaries (63, 64, 65) and inside windows.
"""
from __future__ import annotations

import functools
import math

import pytest
import torch

import recurscan
from recurscan.reference.delta import gated_delta_product_naive, gated_delta_rule_naive
from recurscan.reference.diagonal import diagonal_naive
from recurscan.reference.gla import gla_naive
from recurscan.reference.ssd import ssd_naive

F32, F64 = torch.float32, torch.float64
NAN, INF = float("nan"), float("inf")
H, HV, K, V = 2, 4, 16, 8  # grouped value heads: q/k head 0 serves value heads 0 and 1
P, G, NS = 8, 1, 8  # SSD: head dim, groups, state dim
M = 2  # Gated Delta Product: Householder copies per token
T = 200  # tokens of the sequence that carries the bad value
T0 = 70  # varlen: the first sequence (clean), before the second (T tokens)
POSITIONS = [0, 40, 63, 64, 65, 130]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread for this module: its windows are tiny (64 tokens, 16 x 8 states), so
    threads only add synchronisation (on a busy two-core machine the file runs 4x slower with
    two). Both runs of every comparison are made here, under the same setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------------
# The families: inputs, the op (chunked oracle) and the token loop
# ------------------------------------------------------------------------------------------------


def _randn(gen, dtype, *shape):
    return torch.randn(*shape, generator=gen, dtype=F64).to(dtype)


def _rand(gen, dtype, *shape):
    return torch.rand(*shape, generator=gen, dtype=F64).to(dtype)


def _delta_inputs(gen, dtype, Bt, Tt, per_column_beta=False, m=1):
    return dict(q=_randn(gen, dtype, Bt, Tt, H, K), k=_randn(gen, dtype, Bt, Tt * m, H, K),
                v=_randn(gen, dtype, Bt, Tt * m, HV, V), g=-0.3 * _rand(gen, dtype, Bt, Tt, HV),
                beta=_rand(gen, dtype, Bt, Tt * m, HV, *((V,) if per_column_beta else ())))


def _gla_inputs(gen, dtype, Bt, Tt, per_key):
    return dict(q=_randn(gen, dtype, Bt, Tt, H, K), k=_randn(gen, dtype, Bt, Tt, H, K),
                v=_randn(gen, dtype, Bt, Tt, HV, V),
                g=-0.3 * _rand(gen, dtype, Bt, Tt, HV, *((K,) if per_key else ())))


def _ssd_inputs(gen, dtype, Bt, Tt):
    return dict(x=_randn(gen, dtype, Bt, Tt, HV, P), dt=_randn(gen, dtype, Bt, Tt, HV),
                B=_randn(gen, dtype, Bt, Tt, G, NS), C=_randn(gen, dtype, Bt, Tt, G, NS),
                z=_randn(gen, dtype, Bt, Tt, HV, P))


def _ssd_constants(gen, dtype):
    return dict(A=-_rand(gen, dtype, HV) - 0.1, D=_randn(gen, dtype, HV), dt_bias=_randn(gen, dtype, HV) - 1)


class Family:
    """One family: how to build its inputs, run its public op and its token loop.

    ``stream[name]``: how many rows of input ``name`` a token has (M for GDP's expanded stream).
    ``run`` and ``loop`` return ``(o [B, T, ...], final_state [N, ...])``."""

    def __init__(self, name, make, run, loop, stream=None, initial_shape=None, varlen_only=False):
        self.name, self.make, self.run, self.loop = name, make, run, loop
        self.stream = stream or {}
        self.initial_shape = initial_shape
        self.varlen_only = varlen_only


def _gdn_run(x, cu, S0):
    o, S = recurscan.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=S0,
                                            output_final_state=True, use_qk_l2norm_in_kernel=True,
                                            cu_seqlens=cu, backend="torch")
    return o, S


def _gdn_loop(x, cu, S0):
    return gated_delta_rule_naive(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=S0,
                                  use_qk_l2norm_in_kernel=True, cu_seqlens=cu)


def _gdp_run(x, cu, S0):
    o, S = recurscan.chunk_gated_delta_product_varlen(x["q"], x["k"], x["v"], x["g"], x["beta"], M, cu,
                                                      initial_state=S0, output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True, backend="torch")
    return o, S


def _gdp_loop(x, cu, S0):
    return gated_delta_product_naive(x["q"], x["k"], x["v"], x["g"], x["beta"], M, initial_state=S0,
                                     use_qk_l2norm_in_kernel=True, cu_seqlens=cu)


def _gla_run(per_key):
    op = recurscan.chunk_gla if per_key else recurscan.chunk_simple_gla

    def run(x, cu, S0):
        return op(x["q"], x["k"], x["v"], x["g"], initial_state=S0, output_final_state=True, cu_seqlens=cu)
    return run


def _gla_loop(x, cu, S0):
    return gla_naive(x["q"], x["k"], x["v"], x["g"], initial_state=S0, cu_seqlens=cu)


def _ssd_run(x, cu, S0):
    return recurscan.mamba_chunk_scan_combined(x["x"], x["dt"], x["A"], x["B"], x["C"], chunk_size=64, D=x["D"],
                                               z=x["z"], dt_bias=x["dt_bias"], initial_states=S0, cu_seqlens=cu,
                                               dt_softplus=True, return_final_states=True)


def _ssd_loop(x, cu, S0):
    return ssd_naive(x["x"], x["dt"], x["A"], x["B"], x["C"], D=x["D"], z=x["z"], dt_bias=x["dt_bias"],
                     dt_softplus=True, initial_state=S0, cu_seqlens=cu)


def _diag_run(x, cu, S0):
    return recurscan.diagonal_scan(x["a"], x["b"], initial_state=S0, output_final_state=True, cu_seqlens=cu)


def _diag_loop(x, cu, S0):
    return diagonal_naive(x["a"], x["b"], initial_state=S0, cu_seqlens=cu)


def _diag_inputs(gen, dtype, Bt, Tt):
    return dict(a=2 * _rand(gen, dtype, Bt, Tt, V) - 1, b=_randn(gen, dtype, Bt, Tt, V))


FAMILIES = {
    "gdn": Family("gdn", lambda gen, d, Bt, Tt: _delta_inputs(gen, d, Bt, Tt), _gdn_run, _gdn_loop,
                  initial_shape=(HV, K, V)),
    "gdn-beta-per-column": Family("gdn-beta-per-column",
                                  lambda gen, d, Bt, Tt: _delta_inputs(gen, d, Bt, Tt, per_column_beta=True),
                                  _gdn_run, _gdn_loop, initial_shape=(HV, K, V)),
    "gdp": Family("gdp", lambda gen, d, Bt, Tt: _delta_inputs(gen, d, Bt, Tt, m=M), _gdp_run, _gdp_loop,
                  stream=dict(k=M, v=M, beta=M), initial_shape=(HV, K, V), varlen_only=True),
    "gla": Family("gla", lambda gen, d, Bt, Tt: _gla_inputs(gen, d, Bt, Tt, False), _gla_run(False), _gla_loop,
                  initial_shape=(HV, K, V)),
    "gla-per-key": Family("gla-per-key", lambda gen, d, Bt, Tt: _gla_inputs(gen, d, Bt, Tt, True), _gla_run(True),
                          _gla_loop, initial_shape=(HV, K, V)),
    "ssd": Family("ssd", _ssd_inputs, _ssd_run, _ssd_loop, initial_shape=(HV, P, NS)),
    "diagonal": Family("diagonal", _diag_inputs, _diag_run, _diag_loop, initial_shape=(V,)),
}
# The inputs indexed by token, per family: each one carries the bad value in turn.
TOKEN_INPUTS = {
    "gdn": ["q", "k", "v", "g", "beta"],
    "gdn-beta-per-column": ["v", "beta"],
    "gdp": ["q", "k", "v", "g", "beta"],
    "gla": ["q", "k", "v", "g"],
    "gla-per-key": ["q", "k", "v", "g"],
    "ssd": ["x", "dt", "B", "C", "z"],
    "diagonal": ["a", "b"],
}


class Case:
    """Inputs of one family in one layout, the sequences' token ranges, and the clean run."""

    def __init__(self, family: Family, layout: str, dtype):
        gen = torch.Generator().manual_seed(17)
        self.family, self.layout, self.dtype = family, layout, dtype
        if layout == "batch":  # two rows of T tokens; the second carries the bad value
            Bt, Tt, self.cu = 2, T, None
            self.seqs = [(0, 0, T), (1, 0, T)]  # (batch row, first token, end)
        else:  # one row, two sequences: T0 clean tokens, then T tokens carrying the bad value
            Bt, Tt, self.cu = 1, T0 + T, torch.tensor([0, T0, T0 + T])
            self.seqs = [(0, 0, T0), (0, T0, T0 + T)]
        self.inputs = family.make(gen, dtype, Bt, Tt)
        if family.name == "ssd":
            self.inputs.update(_ssd_constants(gen, dtype))
        self.S0 = _randn(gen, dtype, 2, *family.initial_shape)
        self.clean = self.run(self.inputs)

    def run(self, inputs):
        return self.family.run(inputs, self.cu, self.S0)

    def loop(self, inputs):
        return self.family.loop(inputs, self.cu, self.S0)

    def with_value(self, name: str, t: int, value: float):
        """The inputs with ``value`` at token t of the second sequence, in one element of ``name``
        (head 0; feature 1 where the input has a feature dimension). On GDP's expanded stream the
        element is one of token t's Householder copies (copy t % M)."""
        b, start, _ = self.seqs[1]
        m = self.family.stream.get(name, 1)
        row = (start + t) * m + (t % m)
        x = self.inputs[name].clone()
        x[(b, row, 0) + (1,) * (x.dim() - 3)] = value
        return dict(self.inputs, **{name: x})


@functools.lru_cache(maxsize=None)
def case(family: str, layout: str, dtype) -> Case:
    return Case(FAMILIES[family], layout, dtype)


def _params(positions):
    out = []
    for fam, names in TOKEN_INPUTS.items():
        for layout in ("batch", "varlen"):
            if layout == "batch" and FAMILIES[fam].varlen_only:
                continue  # the GDP op is varlen by signature: B = 1
            for name in names:
                for t in positions:
                    out.append(pytest.param(fam, layout, name, t, id=f"{fam}-{layout}-{name}-t{t}"))
    return out


def _check_causal(c: Case, name: str, t: int, value: float):
    o0, S0 = c.clean
    bad = c.with_value(name, t, value)
    o, S = c.run(bad)
    (b0, s0, e0), (b1, s1, e1) = c.seqs
    what = f"{c.family.name} {c.layout} {name}[t={t}] = {value}"
    # The other sequence: bit-identical output and final state.
    assert torch.equal(o[b0, s0:e0], o0[b0, s0:e0]), f"{what}: the other sequence's output changed"
    assert torch.equal(S[0], S0[0]), f"{what}: the other sequence's final state changed"
    # Before t: bit-identical.
    bad_rows = (~torch.isfinite(o[b1, s1:s1 + t])).flatten(1).any(-1).nonzero().flatten().tolist()
    assert torch.equal(o[b1, s1:s1 + t], o0[b1, s1:s1 + t]), \
        f"{what}: outputs before t changed (non-finite at rows {bad_rows[:8]}...)"
    # At and after t, and the final state: non-finite exactly where the token loop's are.
    lo, lS = c.loop(bad)
    got, want = torch.isfinite(o[b1, s1 + t:e1]), torch.isfinite(lo[b1, s1 + t:e1])
    hidden = (got & ~want).flatten(1).any(-1).nonzero().flatten().add(t).tolist()
    spread = (~got & want).flatten(1).any(-1).nonzero().flatten().add(t).tolist()
    assert torch.equal(got, want), (f"{what}: finite where the token loop is not at tokens {hidden[:8]}, "
                                    f"non-finite where it is finite at {spread[:8]}")
    assert torch.equal(torch.isfinite(S[1]), torch.isfinite(lS[1])), \
        f"{what}: the final state's non-finite entries differ from the token loop's"


# ------------------------------------------------------------------------------------------------
# A. Causality
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("family, layout, name, t", _params(POSITIONS))
def test_nan_at_token_t_leaves_earlier_outputs_and_other_sequences_bit_identical(family, layout, name, t, dtype):
    _check_causal(case(family, layout, dtype), name, t, NAN)


def _inf_params():
    """+inf and -inf in every input at two positions, varlen layout, float32; not g = -inf, which
    is a legal reset (test_reset_is_legal)."""
    out = []
    for p in _params([40, 65]):
        family, layout, name, t = p.values
        if layout == "varlen":
            for value, sign in ((INF, "+inf"), (-INF, "-inf")):
                if not (name == "g" and value == -INF):
                    out.append(pytest.param(family, name, t, value, id=f"{p.id.replace('-varlen', '')}-{sign}"))
    return out


@pytest.mark.parametrize("family, name, t, value", _inf_params())
def test_inf_at_token_t_leaves_earlier_outputs_and_other_sequences_bit_identical(family, name, t, value):
    _check_causal(case(family, "varlen", F32), name, t, value)


def test_nan_in_the_first_varlen_sequence_leaves_the_second_bit_identical():
    """Garbage in one sequence never reaches the next one packed after it."""
    bad_input = {"gdn": "v", "gdn-beta-per-column": "beta", "gdp": "k", "gla": "v", "gla-per-key": "k", "ssd": "x",
                 "diagonal": "b"}
    for fam, name in bad_input.items():
        c = case(fam, "varlen", F32)
        x = c.inputs[name].clone()
        m = c.family.stream.get(name, 1)
        x[0, (T0 - 1) * m:T0 * m] = NAN  # the first sequence's last token
        o, S = c.run(dict(c.inputs, **{name: x}))
        o0, S0 = c.clean
        assert torch.equal(o[0, T0:], o0[0, T0:]), fam
        assert torch.equal(S[1], S0[1]), fam
        assert torch.equal(o[0, :T0 - 1], o0[0, :T0 - 1]), fam
        assert not torch.isfinite(o[0, T0 - 1]).all(), fam


@pytest.mark.parametrize("family", ["gdn", "gdp", "gla", "gla-per-key"])
@pytest.mark.parametrize("t", [0, 40, 64, 130])
def test_reset_is_legal(family, t):
    """g = -inf at token t (a decay of exactly 0) is a reset, not garbage: everything stays finite
    and equals the token loop (float64: up to reassociation); outputs before t are the clean run's."""
    c = case(family, "varlen", F64)
    b, start, _ = c.seqs[1]
    g = c.inputs["g"].clone()
    g[b, start + t] = -INF  # every head (and key) of token t
    bad = dict(c.inputs, g=g)
    o, S = c.run(bad)
    lo, lS = c.loop(bad)
    for got, want in ((o, lo), (S, lS)):
        assert torch.isfinite(got).all()
        err = (got - want).abs().max().item()
        assert err <= 1e-10 * (1 + want.abs().max().item())
    assert torch.equal(o[b, :start + t], c.clean[0][b, :start + t])


# ------------------------------------------------------------------------------------------------
# B. Growth
# ------------------------------------------------------------------------------------------------


def _growth_inputs(family, dtype, pattern):
    """Inputs whose decays grow: the log decay is +2 per token ("uniform"), or +3 over tokens
    70..109 inside a slow decay of -0.1 ("burst"); float64 grows by +6 and +20 to leave its own
    range. SSD: raw dt (no softplus) equal to that log and A = 1, so A * dt > 0; the diagonal
    scan: a = exp of it."""
    gen = torch.Generator().manual_seed(3)
    fam = FAMILIES[family]
    x = fam.make(gen, dtype, 1, T)
    if pattern == "uniform":
        grow = torch.full((T,), 2.0 if dtype == F32 else 6.0, dtype=F64)
    else:
        grow = torch.full((T,), -0.1, dtype=F64)
        grow[70:110] = 3.0 if dtype == F32 else 20.0
    if family == "ssd":
        x.update(_ssd_constants(gen, dtype), A=torch.ones(HV, dtype=dtype), dt_bias=None)
        x["dt"] = grow.to(dtype).view(1, T, 1).expand_as(x["dt"]).clone()
    elif family == "diagonal":
        x["a"] = grow.exp().to(dtype).view(1, T, 1).expand_as(x["a"]).clone()
    else:
        x["g"] = grow.to(dtype).view(1, T, *([1] * (x["g"].dim() - 2))).expand_as(x["g"]).clone()
    S0 = _randn(gen, dtype, 1, *fam.initial_shape)
    return fam, x, S0


def _ssd_growth_run(x, cu, S0):  # raw dt (no softplus): dA = dt exactly
    return recurscan.mamba_chunk_scan_combined(x["x"], x["dt"], x["A"], x["B"], x["C"], chunk_size=64, D=x["D"],
                                               z=x["z"], initial_states=S0, return_final_states=True)


def _ssd_growth_loop(x, cu, S0):
    return ssd_naive(x["x"], x["dt"], x["A"], x["B"], x["C"], D=x["D"], z=x["z"], initial_state=S0)


def _row_rms(x):
    """RMS of each row of a float64 ``[T, F]``, scaled by the row's largest entry first (squares
    of values past 1e154 would overflow)."""
    m = x.abs().amax(-1, keepdim=True).clamp(min=1e-300)
    return m.squeeze(-1) * (x / m).pow(2).mean(-1).sqrt()


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("pattern", ["uniform", "burst"])
@pytest.mark.parametrize("family", ["gdn", "gdp", "gla", "gla-per-key", "ssd", "diagonal"])
def test_growth_is_right_until_the_true_values_overflow(family, pattern, dtype):
    """The truth is the token loop in float64 (where it is finite: for a float64 run past its
    own overflow the truth is unknown and nothing is asserted there).

    - Tokens before the true values come within 1e-6 of the dtype's largest number: finite and
      equal to the truth (float32: relative RMS error <= 2e-5 at every token, the float32 bound
      of a chunked form against the float64 loop (tests/test_reference_delta.py); measured
      <= 1e-5. float64: 1e-10, the reassociation bound; measured <= 2e-13).
    - Elements whose true value exceeds the dtype's range tenfold: non-finite.
    - Every finite element, before or after the overflow: the true value (error <= 1e-4 of its
      magnitude plus its token's RMS, float64 1e-10; measured 2e-5 and 3e-13): no silently
      finite garbage. (Past the overflow, outputs whose true value fits stay finite where the
      chunked form reaches them without the overflowing state: right, not garbage.)"""
    fam, x, S0 = _growth_inputs(family, dtype, pattern)
    run, loop = fam.run, fam.loop
    if family == "ssd":
        run, loop = _ssd_growth_run, _ssd_growth_loop
    cu = torch.tensor([0, T]) if family == "gdp" else None
    o = run(x, cu, S0)[0][0].flatten(1).double()  # [T, features]
    wide = {n: (None if v is None else v.double()) for n, v in x.items()}
    truth = loop(wide, cu, S0.double())[0][0].flatten(1)
    fmax = torch.finfo(dtype).max
    known = torch.isfinite(truth)
    mag = torch.where(known, truth.abs(), math.inf)
    safe = mag.amax(-1).cummax(0).values < fmax * 1e-6  # before the true values come near the range's end
    assert safe[0] and not safe.all(), "the test's inputs should overflow, not at once"
    rows = safe.nonzero().flatten()
    ok = torch.isfinite(o[rows])
    assert ok.all(), f"non-finite before the overflow at tokens {(~ok).any(-1).nonzero().flatten()[:8].tolist()}"
    err = _row_rms(o[rows] - truth[rows]) / _row_rms(truth[rows]).clamp(min=1e-300)
    bound = 2e-5 if dtype == F32 else 1e-10
    assert err.max() <= bound, f"relative error {err.max():.2e} at token {int(err.argmax())}"
    over = known & (mag > 10 * fmax)
    assert not torch.isfinite(o[over]).any(), "finite where the true value is beyond the range"
    t0 = torch.where(known, truth, 0)
    finite = torch.isfinite(o) & known
    bound = (1e-4 if dtype == F32 else 1e-10) * (t0.abs() + _row_rms(t0).unsqueeze(-1))
    garbage = finite & ((o - t0).abs() > bound)
    assert not garbage.any(), f"finite garbage at tokens {garbage.any(-1).nonzero().flatten()[:8].tolist()}"


# ------------------------------------------------------------------------------------------------
# C. Domains in validation
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [NAN, INF, -INF])
@pytest.mark.parametrize("op", ["chunk_gated_delta_rule", "chunk_gated_delta_product_varlen", "chunk_simple_gla",
                                "chunk_gla", "fused_recurrent_gated_delta_rule_update"])
def test_non_finite_scale_is_refused(op, scale):
    gen = torch.Generator().manual_seed(0)
    x = _delta_inputs(gen, F32, 1, 8)
    fn = getattr(recurscan, op)
    with pytest.raises(ValueError, match=r"^scale: .*finite"):
        if op == "chunk_gated_delta_product_varlen":
            fn(x["q"][:, :4], x["k"], x["v"], x["g"][:, :4], x["beta"], 2, torch.tensor([0, 4]), scale=scale,
               backend="torch")
        elif op == "chunk_gla":
            fn(x["q"], x["k"], x["v"], x["g"].unsqueeze(-1).expand(1, 8, HV, K), scale=scale)
        elif op == "chunk_simple_gla":
            fn(x["q"], x["k"], x["v"], x["g"], scale=scale)
        else:
            fn(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=scale, backend="torch")


def _decode_call(accepted, drafts=3, spt=1):
    gen = torch.Generator().manual_seed(1)
    x = _delta_inputs(gen, F32, 2, drafts * spt)
    cache = torch.zeros(4, HV, K, V)
    snaps = torch.zeros(4, drafts, HV, K, V)
    return recurscan.fused_recurrent_gated_delta_rule_update(
        x["q"], x["k"], x["v"], x["g"], x["beta"], state=cache, state_indices=torch.tensor([3, 1]),
        intermediate_states=snaps, steps_per_token=spt, num_accepted_tokens=torch.tensor(accepted), backend="torch")


def _mamba_call(accepted, drafts=3):
    gen = torch.Generator().manual_seed(2)
    b, Hm, Pm, Nm = 2, 2, 4, 8
    state = torch.zeros(4, Hm, Pm, Nm)
    snaps = torch.zeros(4, drafts, Hm, Pm, Nm)
    x, dt = _randn(gen, F32, b, drafts, Hm, Pm), _rand(gen, F32, b, drafts, Hm, Pm)
    A = -torch.ones(Hm, Pm, Nm)
    B, C = _randn(gen, F32, b, drafts, 1, Nm), _randn(gen, F32, b, drafts, 1, Nm)
    return recurscan.selective_state_update(state, x, dt, A, B, C, state_batch_indices=torch.tensor([2, 0]),
                                            intermediate_states=snaps, num_accepted_tokens=torch.tensor(accepted),
                                            backend="torch")


@pytest.mark.parametrize("call", [_decode_call, _mamba_call], ids=["gated_delta_rule_update", "selective_state_update"])
@pytest.mark.parametrize("accepted", [[1, 4], [-1, 0], [0, 100]])
def test_num_accepted_tokens_outside_the_snapshots_is_refused(call, accepted):
    """Three snapshots: a request restarts from its cache slot (0) or from snapshot a - 1
    (a = 1..3); anything else was silently clamped."""
    with pytest.raises(ValueError, match=r"^num_accepted_tokens: .*\[0, 3\]"):
        call(accepted)


@pytest.mark.parametrize("call", [_decode_call, _mamba_call], ids=["gated_delta_rule_update", "selective_state_update"])
def test_num_accepted_tokens_at_the_ends_of_its_range_is_accepted(call):
    call([0, 3])
    call([3, 0])
