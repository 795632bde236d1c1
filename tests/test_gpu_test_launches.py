"""The GPU tests that launch kernels directly (not through the launch layer, which CI runs under
the interpreter) pass every argument their kernels take and none they do not: each such launch is
made here on CPU tensors with the kernels' ``run`` replaced by a binding of the arguments to the
kernel's signature, so nothing runs. (At 1786dda the reverse sweep and the dg kernels had gained
arguments these launches lacked, and 16 GPU tests failed on the H200 alone.)"""
import inspect

import pytest
import torch

from tests.gpu import test_gluon_gla_dg_gpu as dg_tests
from tests.gpu import test_gluon_gla_reverse_sweep_gpu as sweep_tests

#: Launch options a kernel call may carry beside its arguments.
OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg"}


@pytest.fixture
def bound_launches(monkeypatch):
    """Each direct launch's kernel name, after its arguments bound to the kernel's signature."""
    from recurscan.kernels.gla import backward
    from recurscan.kernels.gluon import (gla_backward_dg, gla_backward_dg_specialized, gla_backward_sweep,
                                         gla_backward_sweep_specialized)
    kernels = [backward.chunk_simple_gla_bwd_sweep_kernel, backward.chunk_simple_gla_bwd_grads_kernel,
               gla_backward_sweep.gluon_gla_bwd_sweep_kernel,
               gla_backward_sweep_specialized.gluon_gla_bwd_sweep_specialized_kernel,
               gla_backward_dg.gluon_gla_bwd_dg_kernel, gla_backward_dg_specialized.gluon_gla_bwd_dg_specialized_kernel]
    launched = []
    for kernel in kernels:
        fn = getattr(kernel, "fn", kernel)
        signature = inspect.signature(fn)

        def bind(*args, grid=None, warmup=False, _signature=signature, _name=fn.__name__, **kwargs):
            arguments = {k: v for k, v in kwargs.items() if k not in OPTIONS}
            _signature.bind(*args, **arguments)  # TypeError: a missing or unknown argument
            launched.append(_name)
        monkeypatch.setattr(kernel, "run", bind)
    for module in (dg_tests, sweep_tests):
        monkeypatch.setattr(module, "DEV", "cpu")
    return launched


@pytest.mark.parametrize("varlen", [False, True])
def test_the_reverse_sweep_tests_launch_every_form_with_its_arguments(bound_launches, varlen):
    B, T, H, HV, K, V = 1, 130, 1, 8, 128, 64
    q = k = torch.zeros(B, T, H, K, dtype=torch.bfloat16)
    do = torch.zeros(B, T, HV, V, dtype=torch.bfloat16)
    scores, coef = torch.zeros(B * T, H, 64, dtype=torch.bfloat16), torch.zeros(8, HV, 64, 8)
    cu = torch.tensor([0, 1, T], dtype=torch.int32) if varlen else None
    offsets = torch.tensor([0, 1], dtype=torch.int32) if varlen else None
    for form in (False, True, "specialized"):
        sweep_tests.run(form, q, k, do, scores, coef, None, None, cu, offsets, 4, T)
    assert bound_launches == ["chunk_simple_gla_bwd_sweep_kernel", "gluon_gla_bwd_sweep_kernel",
                              "gluon_gla_bwd_sweep_specialized_kernel"]


@pytest.mark.parametrize("varlen", [False, True])
def test_the_dg_tests_launch_every_form_with_its_arguments(bound_launches, varlen):
    B, T, H, HV, K, V = 1, 130, 1, 8, 128, 64
    q = k = torch.zeros(B, T, H, K, dtype=torch.bfloat16)
    v = do = torch.zeros(B, T, HV, V, dtype=torch.bfloat16)
    g = torch.zeros(B, T, HV)
    states = dstates = torch.zeros(4, HV, K, V, dtype=torch.bfloat16)
    cu = torch.tensor([0, 1, T], dtype=torch.int32) if varlen else None
    indices = torch.zeros(4, 2, dtype=torch.int32) if varlen else None
    offsets = torch.tensor([0, 1], dtype=torch.int32) if varlen else None
    for gluon, specialized in ((False, False), (True, False), (True, True)):
        dg_tests.dg_of(gluon, q, k, v, g, do, states, dstates, cu, indices, offsets, 4, specialized=specialized)
    assert bound_launches == ["chunk_simple_gla_bwd_grads_kernel", "gluon_gla_bwd_dg_kernel",
                              "gluon_gla_bwd_dg_specialized_kernel"]
