"""Property test of the training paths: random problems through every family's public op with
gradients (GDN, GDP, simple GLA, per-key GLA, Mamba2 SSD) on both backends, every gradient
against autograd through the float64 token loop. Seeded as ``test_property_ops.py`` is: case i is
drawn from seed i, ``RECURSCAN_PROPERTY_SEED=i`` replays it, CI runs seeds in order until
``RECURSCAN_PROPERTY_SECONDS`` (default 40 s) is spent.

Each case draws the family, dense or varlen (empty and one-token sequences among them), head
counts (grouped value heads, SSD's groups), head dims that are not powers of two, lengths around
the chunk size, an initial state or none, the optional inputs (g, beta, SSD's D per head or per
channel, z, dt_bias, dt_softplus, dt_limit), and for every tensor a memory layout (contiguous, a
slice of a wider buffer, leading dims swapped). The loss reads the outputs and the final states,
the outputs alone or the final states alone (:data:`READS`, by the case's cotangent seed), each
cotangent in a drawn layout too; a gradient the oracle's autograd leaves None (a leaf the loss
does not read, as q under the final states alone) must be None or exact zeros.

Tolerance, float32 inputs: the oracle's own float32 error bounds ours (``assert_like_fp32``), per
gradient: on the PyTorch path at most 4x the float32 token loop's error against float64 plus 1e-6
of the reference's scale; on the Triton path 64x plus 1e-5 (:data:`TRITON_FP32`). The Triton
kernels work from each chunk's cumulative log2 decays G (|G| up to 32 in a calm chunk) and form
decay gradients in closed form (reverse cumulative sums of q . dq - k . dk, then sums over
tokens): exp2 of a rounded G carries about |G| ln 2 ulps, and the closed form's terms cancel,
neither of which the token loop's autograd does. (The seeds cited here were drawn with the loss
reading both outputs, before :data:`READS`; ``benchmarks/cpu_gradient_precision.py`` replays them
so.) On 1000 random cases (the loop below with a
900 s budget) they measured up to ~15x the float32 loop's maximum error on per-key GLA's dq and
~90x its relative RMS on SSD's dA (1.1e-5), while a bug gives errors of 1e-3 and more. SSD's
per-head parameters (A, D, dt_bias: sums over every token, whose terms cancel) get a floor of
1e-4 of their scale instead (:data:`TRITON_FP32_SHARED`): the float32 loop's own error there
says little about ours, its sum cancelling in another order (seed 2558: dA 1.9e-5 where the loop
lost 5.5e-8).

16-bit inputs: relative RMS 1e-2 against the float64 oracle on the same rounded inputs
(METHOD.md's band for 16-bit operands; dq, dk, dv come back in the inputs' dtype), and 2e-2 for
the Triton kernels under the interpreter, whose float32 -> bfloat16 conversion truncates (relative
RMS 3.3e-3 of a rounding against 1.7e-3 for the GPU's and PyTorch's round-to-nearest on Triton
3.6.0; each figure here: ``python -m benchmarks.cpu_gradient_precision``): the products' 16-bit operands carry twice the GPU's rounding error there,
and so do the gradients the kernels store in 16 bits themselves (GLA's and SSD's dq and dk since
dd65286: seed 902's dB 1.13e-2 where the cast after gave 8.5e-3).
SSD's per-head parameters (A, D, dt_bias) are sums over every token of terms that carry those
roundings, so with 16-bit inputs their relative error is the rounding times the draw's
cancellation, which has no bound (seed 902: the float64 ddt sum over 200 tokens of a head 0.10
where the sum of |ddt| is 937; our relative error 0.38 there, an absolute 0.04). With 16-bit
inputs they are checked finite; their values are checked in the float32 cases. So are the
initial states' gradients: carried back through every chunk's 16-bit state, they are the smallest
where the writes span the state and nothing decays (seed 2112: K 8, 70 tokens, no decay; dh0 at
2.03e-2 under the interpreter).

The delta rule without beta (beta = 1: every write a full projection) is drawn with float32
inputs alone: with 16-bit ones and no decay its gradients leave the band (seed 1512 before this
rule: dh0 3.8e-2 and dk 1.3e-2 under the interpreter, at K 16, where the same draw with a beta in
(0, 1) and a decay gives 7.7e-4 and 8.4e-3; in float32 both are within 4x the float32 loop's
error). Traced under the interpreter (4 draws, K = V = 16, 130 tokens, L2-normed keys, bf16, both
outputs read): the Triton path's dh0 1.8e-2, dk 1.7e-2, dv 1.1e-2 there, against 1.7e-3 on the
PyTorch path (which carries float32 and more between its products). With the prep's WY factor
(``wy``, kept as a product operand in the inputs' dtype) in float32 they fall to 6.2e-3, 1.1e-2
and 4.9e-3; the backward's 16-bit chunk states, dS and dY in float32 change them by under 10%.
With beta = 1, unit keys and no decay each chunk's inverse has the largest entries and nothing
shrinks an earlier chunk's rounding. fla keeps the same factor in 16 bits; it was not run on it.

Where the loss reads the final states alone, the initial states' gradient is the cotangent carried
back through every chunk's transition, which can shrink it by orders of magnitude; both paths
compute each chunk's transition whole (the WY form: a difference of terms the size of the chunk's
decay, whatever the product's own size), the token loop a step at a time, so the chunked forms'
relative error grows with how much each chunk contracts, with no bound in terms of the loop's.
Seed 633 (GDN over two sequences of 65 tokens, K 8, unit keys, beta = 1, float32): dh0's RMS 2.1e-7
of the cotangent's 1, its relative RMS error 4.2e-5 on the PyTorch path and 3.8e-5 on the Triton
path against the loop's 4.7e-7 (seed 97, GDP M = 2 over 63 tokens: 9.6e-6 and 9.5e-6 against
6.0e-7). There (:func:`_contracted`)
dh0 passes within the Triton path's bound or with an absolute RMS error under one float32 rounding
of the cotangent (2^-23, its RMS being 1; seed 633's 8.7e-12): a dh0 that small is below what a
chunked float32 form resolves, and is checked to be that small and finite.
"""

import torch

import recurscan
from recurscan.reference import delta, gla, ssd
from tests.helpers.seeded import run_seeds
from tests.helpers.tolerances import assert_like_fp32, relative_rms
from tests.test_property_ops import lengths, pick, strided

RMS16 = 1e-2
RMS16_INTERPRETED = 2e-2
SHARED = {"A", "D", "dt_bias"}  # SSD's per-head parameters: sums over every token
#: With 16-bit inputs checked finite alone (the docstring): the per-head sums, and the initial
#: states' gradients, carried back through every chunk's 16-bit state.
CHAIN16 = SHARED | {"initial_state"}
#: (factor, floor) of ``assert_like_fp32`` for the Triton path's float32 gradients.
TRITON_FP32 = (64, 1e-5)
TRITON_FP32_SHARED = (64, 1e-4)
#: Where the loss reads the final states alone: the largest absolute RMS error of the initial
#: states' gradient that needs no relative bound, one float32 rounding of the cotangent (RMS 1).
CONTRACTED_FLOOR = 2.0 ** -23


def _contracted(got, want64, ref32, what):
    """The initial states' gradient where the loss reads the final states alone (the docstring):
    within the Triton path's bound, or under :data:`CONTRACTED_FLOOR` absolute."""
    if (got.double() - want64.double()).pow(2).mean().sqrt() > CONTRACTED_FLOOR:
        assert_like_fp32(got, want64, ref32, what, *TRITON_FP32)


def _delta(rng):
    M = int(pick(rng, [1, 1, 2, 3]))
    cu, T = lengths(rng, M > 1 or bool(torch.randint(2, (1,), generator=rng)))
    B = 1 if cu is not None else int(pick(rng, [1, 2]))
    N = B if cu is None else len(cu) - 1
    H = int(pick(rng, [1, 2])); HV = H * int(pick(rng, [1, 2]))
    K, V = int(pick(rng, [8, 16, 24])), int(pick(rng, [8, 16, 24]))
    r = lambda *s: torch.randn(*s, generator=rng)  # noqa: E731
    x = dict(q=r(B, T, H, K), k=r(B, T * M, H, K), v=r(B, T * M, HV, V))
    if M > 1 or pick(rng, [True, True, False]):
        x["g"] = torch.nn.functional.logsigmoid(r(B, T, HV) + 2)
    if M > 1 or pick(rng, [True, True, False]):
        x["beta"] = torch.rand(B, T * M, HV, generator=rng)
    if pick(rng, [True, False]):
        x["initial_state"] = r(N, HV, K, V)
    l2norm = bool(pick(rng, [True, True, False]))
    if not l2norm:  # unit keys from the caller, as fla's users pass them: the delta rule then contracts
        x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
    kw = dict(use_qk_l2norm_in_kernel=l2norm, scale=float(pick(rng, [0.3, K ** -0.5])), cu_seqlens=cu,
              output_final_state=True)
    if M == 1:
        return x, kw, recurscan.chunk_gated_delta_rule, delta.gated_delta_rule_naive, {}
    return x, kw, lambda **a: recurscan.chunk_gated_delta_product_varlen(**a, num_householder=M), \
        delta.gated_delta_product_naive, dict(num_householder=M)


def _gla(rng, per_key):
    cu, T = lengths(rng, bool(torch.randint(2, (1,), generator=rng)))
    B = 1 if cu is not None else int(pick(rng, [1, 2]))
    N = B if cu is None else len(cu) - 1
    H, K, V = int(pick(rng, [1, 2])), int(pick(rng, [8, 16, 24])), int(pick(rng, [8, 16, 24]))
    r = lambda *s: torch.randn(*s, generator=rng)  # noqa: E731
    g = torch.nn.functional.logsigmoid(r(B, T, H, K) + 2) if per_key else torch.nn.functional.logsigmoid(r(B, T, H) + 2)
    x = dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, H, V), g=g)
    if pick(rng, [True, False]):
        x["initial_state"] = r(N, H, K, V)
    kw = dict(scale=float(pick(rng, [0.3, K ** -0.5])), cu_seqlens=cu, output_final_state=True)
    return x, kw, recurscan.chunk_gla if per_key else recurscan.chunk_simple_gla, gla.gla_naive, {}


def _ssd(rng):
    cu, T = lengths(rng, bool(torch.randint(2, (1,), generator=rng)))
    B = 1 if cu is not None else int(pick(rng, [1, 2]))
    N = B if cu is None else len(cu) - 1
    G = int(pick(rng, [1, 2])); H = G * int(pick(rng, [1, 2])); P, Nst = int(pick(rng, [8, 12])), int(pick(rng, [8, 16]))
    r = lambda *s: torch.randn(*s, generator=rng)  # noqa: E731
    x = dict(x=r(B, T, H, P), dt=torch.rand(B, T, H, generator=rng) - 0.3, A=-torch.rand(H, generator=rng) - 0.1,
             B=r(B, T, G, Nst), C=r(B, T, G, Nst))
    softplus = bool(pick(rng, [True, False]))
    if not softplus:
        x["dt"] = x["dt"].abs() + 0.01
    if pick(rng, [True, False]):
        x["D"] = r(H) if pick(rng, [True, False]) else r(H, P)
    if pick(rng, [True, False]):
        x["z"] = r(B, T, H, P)
    if pick(rng, [True, False]):
        x["dt_bias"] = torch.rand(H, generator=rng)
    if pick(rng, [True, False]):
        x["initial_state"] = r(N, H, P, Nst)
    limit = pick(rng, [(0.0, float("inf")), (0.05, 0.6)])
    kw = dict(dt_softplus=softplus, dt_limit=limit, cu_seqlens=cu)

    def op(initial_state=None, cu_seqlens=None, **a):
        extra = dict(return_final_states=True) if cu_seqlens is None else dict(
            return_varlen_states=True,
            seq_idx=torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1), cu_seqlens.diff())[None].int())
        out = recurscan.mamba_chunk_scan_combined(**a, chunk_size=64, initial_states=initial_state,
                                                  cu_seqlens=cu_seqlens, **extra)
        return out[0], out[-1]
    return x, kw, op, ssd.ssd_naive, {}


FAMILIES = [("delta", _delta), ("simple_gla", lambda rng: _gla(rng, False)), ("gla", lambda rng: _gla(rng, True)),
            ("ssd", _ssd)]


#: What the loss reads, case by case (its cotangent seed modulo 3): an output it does not read
#: reaches the backward as None (the Functions do not materialise its zeros).
READS = ((0, 1), (0,), (1,))


def _grads(fn, leaves: dict, kw, seed, low, read):
    """Every leaf's gradient of the outputs ``read`` (indices into ``fn``'s (output, final
    states)), for cotangents drawn from ``seed``, the same values on every path: rounded to what the
    op under test returns (the output in the 16-bit dtype ``low`` where the inputs are, the final
    states in float32), since a cotangent the oracle alone held unrounded would differ from ours by
    a rounding. None: the leaf does not reach what the loss reads."""
    o, final = fn(**leaves, **kw)[:2]
    gen = torch.Generator().manual_seed(seed)
    cot = (torch.randn(o.shape, generator=gen, dtype=torch.float64).to(low or torch.float32).to(o.dtype),
           torch.randn(final.shape, generator=gen, dtype=torch.float64).float().to(final.dtype))
    cot = tuple(strided(c, gen) for c in cot)  # a loss downstream may hand them over in any layout
    outputs, cot = tuple((o, final)[i] for i in read), tuple(cot[i] for i in read)
    return dict(zip(leaves, torch.autograd.grad(outputs, list(leaves.values()), cot, allow_unused=True)))


def run_case(rng, family, backend):
    x, kw, op, naive, naive_kw = dict(FAMILIES)[family](rng)
    low = pick(rng, [None, None, torch.bfloat16])
    sixteen = ("q", "k", "v", "x", "B", "C", "z")
    if low is not None:  # the 16-bit inputs rounded once: the oracle runs on the same values
        x = {n: t.to(low) if n in sixteen else t for n, t in x.items()}
        if family == "delta" and "beta" not in x:  # beta = 1 is drawn in float32 alone (the docstring)
            x["beta"] = torch.rand(x["v"].shape[:3], generator=rng)
    leaves = {n: strided(t, rng).requires_grad_() for n, t in x.items()}
    seed = int(torch.randint(2 ** 31, (1,), generator=rng))
    read = READS[seed % len(READS)]
    got = _grads(lambda **a: op(**a, backend=backend), leaves, kw, seed, low, read)
    naive_kw = dict(naive_kw, **{k: v for k, v in kw.items() if k != "output_final_state"})
    ref = {}
    for dtype in (torch.float64, torch.float32):
        ref_leaves = {n: t.detach().to(dtype).requires_grad_() for n, t in x.items()}
        ref[dtype] = _grads(naive, ref_leaves, naive_kw, seed, low, read)
    for n, g in got.items():
        if ref[torch.float64][n] is None:  # the loss does not read this leaf: None or exact zeros
            assert g is None or (g.shape == x[n].shape and not g.any()), f"d{n}: nonzero where the loss does not read {n}"
            continue
        assert g is not None and g.shape == x[n].shape, f"d{n}: {None if g is None else tuple(g.shape)}"
        assert torch.isfinite(g).all(), f"d{n}: non-finite"
        if low is not None and n in CHAIN16:
            continue  # finite, as checked above
        if low is not None:
            band = RMS16_INTERPRETED if backend == "triton" and g.device.type == "cpu" else RMS16
            err = relative_rms(g, ref[torch.float64][n])
            assert err <= band, f"d{n}: relative RMS {err:.2e} > {band:.0e} (16-bit inputs)"
        elif n == "initial_state" and read == (1,):
            _contracted(g, ref[torch.float64][n], ref[torch.float32][n], f"d{n}")
        elif backend == "triton":
            factor, floor = TRITON_FP32_SHARED if n in SHARED else TRITON_FP32
            assert_like_fp32(g, ref[torch.float64][n], ref[torch.float32][n], f"d{n}", factor=factor, floor=floor)
        else:
            assert_like_fp32(g, ref[torch.float64][n], ref[torch.float32][n], f"d{n}")


CASES = [(family, backend) for family, _ in FAMILIES for backend in ("triton", "torch")]


def test_random_training_problems_match_autograd_through_the_oracle():
    ran = run_seeds(CASES, lambda rng, case: run_case(rng, *case), __file__)
    print(f"{ran} random training cases passed")
