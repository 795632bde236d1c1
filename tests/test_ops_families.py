"""Public CPU ops of SSD, GLA and the diagonal scan: peers' signatures and return conventions,
results equal to the token loop, state caches, and clear errors naming the argument.

Tolerance: the ops run the chunked oracle; in float64 they equal the token loop up to
reassociation (1e-10 relative to the largest magnitude)."""
import pytest
import torch

import recurscan
from recurscan.cli import main
from recurscan.reference.diagonal import diagonal_naive
from recurscan.reference.gla import gla_naive
from recurscan.reference.ssd import ssd_naive
from tests.helpers.tolerances import assert_reassociation_close, bits

F64 = torch.float64


def ssd_inputs(T=130, H=4, P=12, G=2, N=10, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    return dict(x=r(1, T, H, P), dt=r(1, T, H), A=-torch.rand(H, generator=gen, dtype=F64) * 3, B=r(1, T, G, N),
                C=r(1, T, G, N), D=r(H, P), z=r(1, T, H, P), dt_bias=r(H))


def test_ssd_mamba_returns_and_values():
    x = ssd_inputs()
    cu = torch.tensor([0, 1, 65, 130])
    S0 = torch.randn(3, 4, 12, 10, dtype=F64)
    y = recurscan.mamba_chunk_scan_combined(**x, chunk_size=64, dt_softplus=True)
    assert isinstance(y, torch.Tensor)
    y, final, varlen = recurscan.mamba_chunk_scan_combined(
        **x, chunk_size=16, initial_states=S0, cu_seqlens=cu, seq_idx=torch.zeros(1, 130, dtype=torch.int32),
        dt_softplus=True, dt_limit=(0.01, 5.0), return_final_states=True, return_varlen_states=True)
    want_y, want_S = ssd_naive(**x, dt_softplus=True, dt_limit=(0.01, 5.0), initial_state=S0, cu_seqlens=cu)
    assert_reassociation_close(y, want_y)
    assert_reassociation_close(final, want_S)
    assert varlen is final


def test_ssd_state_cache_leaves_other_slots_bit_identical():
    x = ssd_inputs()
    cu = torch.tensor([0, 1, 65, 130])
    cache = torch.full((5, 4, 12, 10), float("nan"), dtype=F64)
    cache[4], cache[0] = torch.randn(4, 12, 10, dtype=F64), torch.randn(4, 12, 10, dtype=F64)
    before = cache.clone()
    y = recurscan.mamba_chunk_scan_combined(**x, chunk_size=64, cu_seqlens=cu, state=cache,
                                            state_indices=torch.tensor([4, -1, 0]))
    S0 = torch.zeros(3, 4, 12, 10, dtype=F64)
    S0[0], S0[2] = before[4], before[0]
    want_y, want_S = ssd_naive(**x, initial_state=S0, cu_seqlens=cu)
    want_y[:, 1:65] = 0
    assert_reassociation_close(y, want_y)
    assert_reassociation_close(cache[4], want_S[0])
    assert_reassociation_close(cache[0], want_S[2])
    assert torch.equal(bits(cache[1:4]), bits(before[1:4]))


@pytest.mark.parametrize("per_key", [False, True])
def test_gla_ops_match_token_loop(per_key):
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 130, 2, 12, generator=gen, dtype=F64), torch.randn(1, 130, 2, 12, generator=gen, dtype=F64)
    v = torch.randn(1, 130, 4, 20, generator=gen, dtype=F64)
    g = torch.nn.functional.logsigmoid(torch.randn(1, 130, 4, *((12,) if per_key else ()), generator=gen, dtype=F64))
    g[:, 70] = float("-inf")
    cu = torch.tensor([0, 1, 2, 66, 130])
    S0 = torch.randn(4, 4, 12, 20, dtype=F64)
    op = recurscan.chunk_gla if per_key else recurscan.chunk_simple_gla
    o, S = op(q, k, v, g, initial_state=S0, output_final_state=True, cu_seqlens=cu)
    want = gla_naive(q, k, v, g, initial_state=S0, cu_seqlens=cu)
    assert_reassociation_close(o, want[0])
    assert_reassociation_close(S, want[1])
    assert op(q, k, v, g)[1] is None


def test_diagonal_scan_matches_token_loop():
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(2, 130, 7, generator=gen, dtype=F64)  # negative, > 1, anything
    a[:, 5], a[:, 6] = 0.0, 1.0
    b = torch.randn(2, 130, 7, generator=gen, dtype=F64)
    h, last = recurscan.diagonal_scan(a, b, initial_state=torch.ones(2, 7, dtype=F64), output_final_state=True)
    want_h, want_last = diagonal_naive(a, b, initial_state=torch.ones(2, 7, dtype=F64))
    assert_reassociation_close(h, want_h)
    assert_reassociation_close(last, want_last)


@pytest.mark.parametrize("call, error, match", [
    (lambda x: recurscan.mamba_chunk_scan_combined(**(x | dict(A=torch.randn(3))), chunk_size=64),
     ValueError, r"A: expected shape \[H\] = \[4\], got \[3\]"),
    (lambda x: recurscan.mamba_chunk_scan_combined(
        **(x | dict(B=torch.randn(1, 130, 3, 10, dtype=F64), C=torch.randn(1, 130, 3, 10, dtype=F64))), chunk_size=64),
     ValueError, r"B: groups G = 3 must divide the heads H = 4"),
    (lambda x: recurscan.mamba_chunk_scan_combined(**x, chunk_size=64, dt_limit=(1.0,)),
     TypeError, r"dt_limit: expected a pair"),
    (lambda x: recurscan.mamba_chunk_scan_combined(**x, chunk_size=64, dt_limit=(float("nan"), 1.0)),
     ValueError, r"dt_limit: expected a pair \(min, max\) without NaN, got \(nan, 1.0\)"),
    (lambda x: recurscan.mamba_chunk_scan_combined(**x, chunk_size=64, dt_limit=(0.0, float("nan"))),
     ValueError, r"dt_limit: expected a pair \(min, max\) without NaN"),
    (lambda x: recurscan.mamba_chunk_scan_combined(**x, chunk_size=64, dt_limit=(0.0, 10 ** 400)),
     ValueError, r"dt_limit: expected bounds within float's range"),
    (lambda x: recurscan.mamba_chunk_scan_combined(**x, chunk_size=0), ValueError, r"chunk_size: expected an int >= 1"),
    (lambda x: recurscan.mamba_chunk_scan_combined(**x, chunk_size=64, dt_softplus="no"),
     TypeError, r"dt_softplus: expected a bool, got str 'no'"),
    (lambda x: recurscan.mamba_chunk_scan_combined(**x, chunk_size=64, dt_softplus=1),
     TypeError, r"dt_softplus: expected a bool, got int 1"),
    (lambda x: recurscan.mamba_chunk_scan_combined(**x, chunk_size=64, seq_idx=torch.zeros(1, 130)),
     TypeError, r"seq_idx: expected dtype"),
    (lambda x: recurscan.mamba_chunk_scan_combined(**(x | dict(D=torch.randn(4, 3, dtype=F64))), chunk_size=64),
     ValueError, r"D: expected shape \[H, P\] = \[4, 12\]"),
    (lambda x: recurscan.chunk_gla(torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 4),
                                   torch.randn(1, 5, 2)), ValueError, r"g: expected 4 dimensions \[B, T, HV, K\]"),
    (lambda x: recurscan.chunk_simple_gla(torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 4),
                                          torch.randn(1, 5, 2), cu_seqlens=torch.tensor([0, 5]),
                                          initial_state=torch.zeros(2, 2, 4, 4)),
     ValueError, r"initial_state: expected shape \[N, HV, K, V\] = \[1, 2, 4, 4\]"),
    (lambda x: recurscan.diagonal_scan(torch.randn(1, 5, 3), torch.randn(1, 5, 4)), ValueError, r"a: expected shape \[B, T, D\]"),
    (lambda x: recurscan.diagonal_scan([1.0], torch.randn(1, 5, 4)), TypeError, r"a: expected a torch.Tensor"),
])
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call(ssd_inputs())


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("grad_on", ["x", "cache"])
def test_ssd_state_cache_is_refused_with_grad_on_every_backend(grad_on, backend):
    """As the delta-rule ops (test_ops_delta): a state cache is inference-only on both backends, refused
    before it is touched, where an input or the cache itself requires grad; under no_grad the torch
    call writes it."""
    x = {n: t.float() for n, t in ssd_inputs(T=20).items()}
    cache = torch.randn(3, 4, 12, 10)
    (cache if grad_on == "cache" else x["x"]).requires_grad_()
    before = cache.detach().clone()
    kw = dict(chunk_size=64, state=cache, state_indices=torch.tensor([1]), backend=backend)
    with pytest.raises(NotImplementedError, match=r"state cache \(state, state_indices\) is inference-only"):
        recurscan.mamba_chunk_scan_combined(**x, **kw)
    assert torch.equal(bits(cache.detach()), bits(before)) and cache.requires_grad == (grad_on == "cache")
    if backend == "torch" and grad_on == "x":
        with torch.no_grad():
            recurscan.mamba_chunk_scan_combined(**x, **kw)
        assert not torch.equal(cache[1], before[1]) and torch.equal(cache[[0, 2]], before[[0, 2]])


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("grad_on", ["q", "cache"])
def test_gla_state_cache_is_refused_with_grad_on_every_backend(grad_on, backend):
    """chunk_simple_gla with a state cache: an input or the cache that requires grad is refused on
    both backends before the cache is touched."""
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 9, 2, 8, generator=gen), torch.randn(1, 9, 2, 8, generator=gen)
    v, g = torch.randn(1, 9, 2, 8, generator=gen), -torch.rand(1, 9, 2, generator=gen)
    cache = torch.randn(3, 2, 8, 8, generator=gen)
    if grad_on == "cache":
        cache.requires_grad_()
    else:
        q.requires_grad_()
    before = cache.detach().clone()
    with pytest.raises(NotImplementedError, match=r"state cache \(state, state_indices\) .*inference-only"):
        recurscan.chunk_simple_gla(q, k, v, g, state=cache, state_indices=torch.tensor([1]), backend=backend)
    assert torch.equal(bits(cache.detach()), bits(before))


def test_traced_ssd_checks_dt_softplus(monkeypatch):
    """The traced path (torch.compile, torch.export) takes dt_softplus as the scan node's bool: it
    is checked before that, as on the eager path ("no" would otherwise be True)."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(TypeError, match=r"dt_softplus: expected a bool, got str 'no'"):
        recurscan.mamba_chunk_scan_combined(**ssd_inputs(T=20), chunk_size=64, dt_softplus="no")


def test_dt_limit_takes_infinite_bounds():
    """NaN bounds are refused (the table above); infinite ones are bounds: (-inf, inf) clamps nothing."""
    x = ssd_inputs(T=20)
    inf = float("inf")
    want = recurscan.mamba_chunk_scan_combined(**x, chunk_size=64)
    for limit in ((-inf, inf), (0.0, inf), (-inf, 1e9)):
        assert torch.equal(recurscan.mamba_chunk_scan_combined(**x, chunk_size=64, dt_limit=limit), want)


def test_command_line_checks_every_family(capsys):
    assert main(["--tokens", "70", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for family in ("gdn", "gdp (M=2)", "ssd", "gla scalar", "gla per-key", "diagonal", "gdn decode"):
        assert f"\n{family} " in out
    assert "FAIL" not in out
