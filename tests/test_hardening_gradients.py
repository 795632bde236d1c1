"""Hardening of the training paths, as a specification: a NaN or inf in one sequence of a varlen
batch leaves every other sequence's gradients, outputs and final states bit-identical to the
clean run's, for every family with a backward (GDN, GDP, simple GLA, per-key GLA, Mamba2 SSD).

The exceptions are the gradients of parameters every sequence shares (SSD's A, D and dt_bias):
they sum over all tokens, so a non-finite token makes them non-finite, as PyTorch's own autograd
does. And a loss that reads the outputs alone or the final states alone (the unread one reaches
the backward as None, its zeros never made) gets the bits of a zero cotangent for the unread one.

Each case runs on CPU tensors under the interpreter (CI) and, marked ``gpu``, on the H200 at
the models' head sizes in bf16 through the planner (the Gluon twins where it takes them):
``python -m pytest -m gpu tests/test_hardening_gradients.py``.
"""
import pytest
import torch

import recurscan

CU = [0, 1, 40, 120, 150]  # a one-token sequence, and the poisoned one, [40, 120), between others
BAD_SEQ = 2
BAD_TOKEN = 110  # inside the poisoned sequence, in its second chunk
T = CU[-1]


def _dims(device):  # small under the interpreter, the models' head sizes on the GPU
    if device == "cpu":
        return dict(H=2, HV=4, K=16, V=16, ssd_heads=4, headdim=16, dstate=16, groups=2)
    return dict(H=4, HV=8, K=128, V=128, ssd_heads=8, headdim=64, dstate=128, groups=1)


def _dtype(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


def _inputs(family, device):
    """The leaves of one call (on ``device``) and, for each, how many rows of the stream it has a
    token (GDP's keys, values and betas live on the expanded stream: M rows a token)."""
    d, gen = _dims(device), torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=gen)  # noqa: E731
    N = len(CU) - 1
    M = 2 if family == "gdp" else 1
    if family in ("gdn", "gdp"):
        x = dict(q=r(1, T, d["H"], d["K"]), k=r(1, T * M, d["H"], d["K"]), v=r(1, T * M, d["HV"], d["V"]),
                 g=-u(1, T, d["HV"]), beta=u(1, T * M, d["HV"]), initial_state=r(N, d["HV"], d["K"], d["V"]))
    elif family in ("simple_gla", "gla"):
        g_shape = (1, T, d["H"], d["K"]) if family == "gla" else (1, T, d["H"])
        x = dict(q=r(1, T, d["H"], d["K"]), k=r(1, T, d["H"], d["K"]), v=r(1, T, d["H"], d["V"]),
                 g=-u(*g_shape), initial_state=r(N, d["H"], d["K"], d["V"]))
    else:
        h, p, n, grp = d["ssd_heads"], d["headdim"], d["dstate"], d["groups"]
        x = dict(x=r(1, T, h, p), dt=u(1, T, h) * 0.5, A=-u(h) - 0.5, B=r(1, T, grp, n), C=r(1, T, grp, n),
                 D=r(h), z=r(1, T, h, p), dt_bias=u(h), initial_states=r(N, h, p, n))
    low_precision = ("q", "k", "v", "x", "B", "C", "z")  # the 16-bit inputs on the GPU; the rest float32
    x = {n: t.to(device=device, dtype=_dtype(device) if n in low_precision else torch.float32) for n, t in x.items()}
    rows = {n: (M if n in ("k", "v", "beta") else 1) for n in x}
    return x, rows


def _call(family, x, device):
    """(output, final states) of the family's public op on the Triton path, varlen over CU."""
    cu = torch.tensor(CU, device=device)
    if family == "gdn":
        return recurscan.chunk_gated_delta_rule(**x, use_qk_l2norm_in_kernel=True, output_final_state=True,
                                                cu_seqlens=cu, backend="triton")
    if family == "gdp":
        return recurscan.chunk_gated_delta_product_varlen(**x, num_householder=2, use_qk_l2norm_in_kernel=True,
                                                          output_final_state=True, cu_seqlens=cu, backend="triton")
    if family == "simple_gla":
        return recurscan.chunk_simple_gla(**x, output_final_state=True, cu_seqlens=cu, backend="triton")
    if family == "gla":
        return recurscan.chunk_gla(**x, output_final_state=True, cu_seqlens=cu, backend="triton")
    seq_idx = torch.repeat_interleave(torch.arange(len(CU) - 1), torch.tensor(CU).diff())[None]
    out = recurscan.mamba_chunk_scan_combined(**x, chunk_size=64, seq_idx=seq_idx.to(device=device, dtype=torch.int32),
                                              cu_seqlens=cu, dt_softplus=True, return_varlen_states=True,
                                              backend="triton")
    return out[0], out[-1]


#: Per family: the inputs a test poisons at one token (or, for the initial state, the bad
#: sequence's whole state), and the shared parameters whose gradients may follow it.
POISONED = {
    "gdn": ("q", "k", "v", "g", "beta", "initial_state"),
    "gdp": ("q", "k", "v", "g", "beta", "initial_state"),
    "simple_gla": ("q", "k", "v", "g", "initial_state"),
    "gla": ("q", "k", "v", "g", "initial_state"),
    "ssd": ("x", "dt", "B", "C", "z", "initial_states"),
}
SHARED = {"A", "D", "dt_bias"}
#: Where the interpreter also runs an inf (inf - inf and 0 x inf are NaN on paths a NaN skips).
INF_TOO = {("gdn", "k"), ("gdn", "g"), ("simple_gla", "g"), ("ssd", "dt")}


def _cases():
    for family, names in POISONED.items():
        for name in names:
            for value in (float("nan"), float("inf")) if (family, name) in INF_TOO else (float("nan"),):
                yield pytest.param("cpu", family, name, value, id=f"cpu-{family}-{name}-{value}")
            yield pytest.param("cuda", family, name, float("nan"), marks=pytest.mark.gpu,
                               id=f"cuda-{family}-{name}-nan")


_CLEAN = {}  # (family, device): the clean run, shared by the cases that poison its inputs


def _run(family, x, device):
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    o, final = _call(family, leaves, device)
    # A fixed cotangent for the outputs and the final states: every sequence's gradients are formed.
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(o.shape, generator=gen).to(o)
    dfinal = torch.randn(final.shape, generator=gen).to(final)
    grads = torch.autograd.grad((o, final), list(leaves.values()), (do, dfinal), allow_unused=True)
    return o.detach(), final.detach(), dict(zip(leaves, grads))


@pytest.mark.parametrize("device, family, name, value", list(_cases()))
def test_nonfinite_input_leaves_other_sequences_gradients(device, family, name, value):
    x, rows = _inputs(family, device)
    bad = {n: t.clone() for n, t in x.items()}
    if name in ("initial_state", "initial_states"):
        bad[name][BAD_SEQ] = value
    else:
        bad[name][0, BAD_TOKEN * rows[name]] = value
    if (family, device) not in _CLEAN:
        _CLEAN[family, device] = _run(family, x, device)
    o, final, grads = _CLEAN[family, device]
    o_bad, final_bad, grads_bad = _run(family, bad, device)

    others = [i for i in range(len(CU) - 1) if i != BAD_SEQ]
    outside = torch.ones(T, dtype=torch.bool, device=device)
    outside[CU[BAD_SEQ]:CU[BAD_SEQ + 1]] = False
    assert torch.equal(o_bad[:, outside], o[:, outside]), "another sequence's output changed"
    assert torch.equal(final_bad[others], final[others]), "another sequence's final state changed"
    assert not torch.isfinite(o_bad[0, BAD_TOKEN]).all(), "the poisoned token's output is finite"
    for n, grad in grads.items():
        if n in SHARED:
            continue
        grad_bad = grads_bad[n]
        if n in ("initial_state", "initial_states"):
            assert torch.equal(grad_bad[others], grad[others]), f"d{n}: another sequence's gradient changed"
            continue
        m = rows[n]
        within = outside.repeat_interleave(m)
        assert torch.equal(grad_bad[:, within], grad[:, within]), f"d{n}: another sequence's gradient changed"
    assert all(torch.isfinite(grads[n]).all() for n in grads), "the clean run's gradients are not finite"


def _unread_cases():
    for family in POISONED:
        for read in ("output", "final"):
            yield pytest.param("cpu", family, read, id=f"cpu-{family}-{read}")
            yield pytest.param("cuda", family, read, marks=pytest.mark.gpu, id=f"cuda-{family}-{read}")


@pytest.mark.parametrize("device, family, read", list(_unread_cases()))
def test_an_unread_output_is_a_zero_cotangent(device, family, read):
    x, _ = _inputs(family, device)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    o, final = _call(family, leaves, device)
    gen = torch.Generator().manual_seed(1)
    cot = {"output": torch.randn(o.shape, generator=gen).to(o), "final": torch.randn(final.shape, generator=gen).to(final)}
    alone = torch.autograd.grad({"output": o, "final": final}[read], list(leaves.values()), cot[read],
                                retain_graph=True, allow_unused=True)
    zeros = {"output": torch.zeros_like(o), "final": torch.zeros_like(final), read: cot[read]}
    both = torch.autograd.grad((o, final), list(leaves.values()), (zeros["output"], zeros["final"]), allow_unused=True)
    for n, a, b in zip(leaves, alone, both):
        a, b = (torch.zeros_like(leaves[n]) if t is None else t for t in (a, b))  # None: the leaf is not reached
        assert torch.equal(a, b), f"d{n}: reading the {read} alone differs from a zero cotangent for the other"
        assert torch.isfinite(a).all(), f"d{n}: non-finite"
