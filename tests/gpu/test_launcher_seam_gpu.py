"""The launcher seam on the GPU machine: the direct launch is on for this Triton, and the driver's
parameter layout reads the same through cuda.bindings and through libcuda."""
import pytest
import torch
import triton
import triton.language as tl

from recurscan.runtime import launcher

pytestmark = pytest.mark.gpu


@triton.jit
def _axpy(x, y, a, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(y + o, a * tl.load(x + o, mask=m) + tl.load(y + o, mask=m), mask=m)


def test_direct_launch_is_on_for_the_tested_triton():
    assert launcher.DIRECT_LAUNCH, f"Triton {triton.__version__} is not in {launcher.TESTED_TRITON}"


def test_parameter_layout_agrees_across_the_seam(monkeypatch):
    x, y = torch.randn(1000, device="cuda"), torch.zeros(1000, device="cuda")
    kwargs = dict(x=launcher.CallArg("x"), y=launcher.CallArg("y"), a=2.0, n=1000, BLOCK=256)
    direct = launcher.jit_launch(_axpy, (4,), kwargs, {}, ("x", "y"), (x, y))
    assert direct is not None and direct.driver is not None
    function, count = direct.compiled.function, len(direct.driver.storage)
    via_default = launcher._param_layout(function, count)
    monkeypatch.setattr(launcher, "_cuda_driver", None)
    via_libcuda = launcher._param_layout(function, count)
    assert via_default is not None and via_default == via_libcuda
    y2 = torch.zeros_like(y)
    direct((x, y2))
    torch.testing.assert_close(y2, 2.0 * x)
