"""The tolerances every oracle comparison uses, in one place.

DESIGN.md: a result is compared with the oracle relative to the oracle's own error, never with a
tolerance loosened to pass.

- Both sides in float64, differing only in the order of operations (chunked vs token loop):
  max abs error <= 1e-10 * (1 + max |reference|).
- A float32 (or lower) computation against the float64 reference: an RMS ratio, with the bound
  stated and justified at the call site.
- The streaming kernel (tests/test_kernels_recurrent.py, tests/gpu/test_recurrent_gpu.py): against
  the float64 oracle, at most 4x the error of the float32 oracle on the same inputs
  (:func:`assert_like_fp32`, the pair from :func:`both`), plus a floor.
"""
import torch


def assert_reassociation_close(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    if want.numel() == 0:
        return
    err = (got.double() - want.double()).abs().max().item()
    bound = 1e-10 * (1 + want.abs().max().item())
    assert err <= bound, f"{what}: max abs error {err:.3e} > {bound:.3e}"


def relative_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    """RMS of the error over the RMS of the reference (float64 arithmetic)."""
    diff = got.double() - want.double()
    return (diff.pow(2).mean().sqrt() / want.double().pow(2).mean().sqrt().clamp(min=1e-300)).item()


def assert_rms_close(got: torch.Tensor, want: torch.Tensor, rel: float, what: str = "") -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    err = relative_rms(got, want)
    assert err <= rel, f"{what}: relative RMS error {err:.2e} > {rel:.0e}"


def bits(x: torch.Tensor) -> torch.Tensor:
    """The bit pattern, so NaN-poisoned slots compare equal to themselves in torch.equal."""
    return x.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[x.element_size()])


def assert_like_fp32(got, want64, ref32, what="", factor=4.0, floor=1e-6):
    """got (float32 kernel) vs want64 (float64 oracle), bounded by the float32 oracle ref32's error."""
    assert got.shape == want64.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want64.shape)}"
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    got, want64, ref32 = got.double(), want64.double(), ref32.double()
    rms_bound = factor * relative_rms(ref32, want64) + floor
    assert relative_rms(got, want64) <= rms_bound, f"{what}: rel RMS {relative_rms(got, want64):.2e} > {rms_bound:.2e}"
    scale = want64.abs().max().item() if want64.numel() else 0.0
    max_bound = factor * (ref32 - want64).abs().max().item() + floor * (1 + scale)
    err = (got - want64).abs().max().item()
    assert err <= max_bound, f"{what}: max abs error {err:.2e} > {max_bound:.2e}"


def both(fn, *args, **kw):
    """The oracle in float64 and in float32 on the same inputs."""
    d = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    f = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    kw64 = {n: (a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a) for n, a in kw.items()}
    kw32 = {n: (a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a) for n, a in kw.items()}
    return fn(*d, **kw64), fn(*f, **kw32)
