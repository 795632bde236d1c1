"""The tolerances every oracle comparison uses, in one place.

DESIGN.md: a result is compared with the oracle relative to the oracle's own error, never with a
tolerance loosened to pass.

- Both sides in float64, differing only in the order of operations (chunked vs token loop):
  max abs error <= 1e-10 * (1 + max |reference|).
- A float32 (or lower) computation against the float64 reference: an RMS ratio, with the bound
  stated and justified at the call site.
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
