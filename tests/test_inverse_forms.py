"""The forms of the chunk's WY inverse that benchmarks/inverse_forms.py times (issue 21): each
equals the float64 inverse of I + A to the rounding of its fp16 operands, on the prep's systems
(unit keys, beta in (0, 1)) and on strongly correlated keys, A read or formed from k and beta."""
import pytest
import torch

from benchmarks.inverse_forms import BT, FORMS, inverse, system, unit_keys


@pytest.mark.parametrize("correlated", [False, True], ids=["random keys", "correlated keys"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_inverse_form_is_the_inverse(form, correlated):
    k, beta = unit_keys(3, "cpu", seed=5, correlated=correlated)
    A = system(k, beta).double()
    want = torch.linalg.inv(torch.eye(BT, dtype=torch.float64) + A)
    got = inverse(form, k, beta).double()
    assert torch.isfinite(got).all()
    assert torch.equal(torch.triu(got, 1), torch.zeros_like(got)), "Tinv is lower triangular"
    err = (got - want).norm() / want.norm()
    assert err < 2e-3, f"{form}: relative error {err:.2e}"
    # the product with I + A is the identity to the same rounding
    eye = torch.eye(BT, dtype=torch.float64)
    assert ((eye + A) @ got - eye).abs().max() < 2e-2
