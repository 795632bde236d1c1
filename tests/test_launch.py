"""The direct launcher's parameter block (recurscan/kernels/_launch.py), checked without a GPU:
a stand-in compiled kernel and a stand-in cuLaunchKernel that decodes the block it is given.
(On the H200, tests/gpu check that direct launches compute what Triton's JIT launches compute.)"""
import ctypes
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")
from recurscan.kernels import _launch as L  # noqa: E402


def fake_compiled(signature, num_warps=4, shared=1024, **meta):
    md = SimpleNamespace(num_warps=num_warps, shared=shared, global_scratch_size=0, profile_scratch_size=0,
                         num_ctas=1, launch_cooperative_grid=False, launch_pdl=False)
    md.__dict__.update(meta)
    return SimpleNamespace(metadata=md, src=SimpleNamespace(signature=signature), function=0xF00)


SIGNATURE = {"x": "*fp32", "y": "*bf16", "n": "i32", "stride": "i64", "scale": "fp32", "BLOCK": "constexpr",
             "flag": "i1"}


def launch_with(values, monkeypatch):
    calls = []

    def cu_launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        kinds = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_int8,
                 ctypes.c_uint64, ctypes.c_uint64]  # the non-constexpr arguments, then the two scratch pointers
        decoded = [ctypes.cast(params[i], ctypes.POINTER(kind)).contents.value for i, kind in enumerate(kinds)]
        calls.append(dict(function=function, grid=(gx, gy, gz), block=(bx, by, bz), shared=shared, stream=stream,
                          params=decoded, extra=extra))
        return 0
    monkeypatch.setattr(L, "_cu_launch_kernel", lambda: cu_launch)
    monkeypatch.setattr(L, "_current_stream", lambda: 77)
    kwargs = dict(x=L.CallArg("a"), y=L.CallArg("b"), n=1000, stride=1 << 40, scale=L.CallArg("s"), BLOCK=64, flag=True)
    template = [None if isinstance(kwargs[n], L.CallArg) else kwargs[n] for n in SIGNATURE]
    positions, sources = (0, 1, 4), (0, 1, 2)
    d = L.DirectLaunch(fake_compiled(SIGNATURE), (5, 2, 1), template, positions, sources)
    assert d.driver is not None
    d(values)
    return calls


def test_parameter_block_holds_constants_and_per_call_values(monkeypatch):
    a, b = torch.zeros(4), torch.zeros(8, dtype=torch.bfloat16)
    (call,) = launch_with((a, b, 0.25), monkeypatch)
    assert call["params"] == [a.data_ptr(), b.data_ptr(), 1000, 1 << 40, 0.25, 1, 0, 0]
    assert call["grid"] == (5, 2, 1) and call["block"] == (128, 1, 1) and call["shared"] == 1024
    assert call["function"] == 0xF00 and call["stream"] == 77 and call["extra"] is None


def test_second_call_rewrites_only_its_own_values(monkeypatch):
    a, b = torch.zeros(4), torch.zeros(8, dtype=torch.bfloat16)
    a2 = torch.zeros(16)
    calls = launch_with((a, b, 0.5), monkeypatch)
    assert calls[0]["params"][:2] == [a.data_ptr(), b.data_ptr()]
    calls = launch_with((a2, b, 2.0), monkeypatch)
    assert calls[0]["params"] == [a2.data_ptr(), b.data_ptr(), 1000, 1 << 40, 2.0, 1, 0, 0]


@pytest.mark.parametrize("meta", [dict(global_scratch_size=64), dict(num_ctas=2), dict(launch_pdl=True)])
def test_launches_needing_more_than_a_parameter_block_use_tritons_launcher(meta):
    d = L.DirectLaunch(fake_compiled(SIGNATURE, **meta), (1, 1, 1), [None] * 7, (0, 1, 4), (0, 1, 2))
    assert d.driver is None


def test_driver_errors_fall_back_to_tritons_launcher(monkeypatch):
    """A failed driver launch (status != 0) is repeated through Triton's launcher, which raises
    its own error for a real fault: never a silent no-op."""
    monkeypatch.setattr(L, "_cu_launch_kernel", lambda: (lambda *args: 201))  # CUDA_ERROR_INVALID_CONTEXT
    monkeypatch.setattr(L, "_current_stream", lambda: 0)
    ran = []
    base = fake_compiled(SIGNATURE)

    class Compiled(SimpleNamespace):
        def __getitem__(self, grid):  # Triton's runner: compiled[grid](*args)
            return lambda *args: ran.append((grid, args))
    compiled = Compiled(**vars(base))
    template = [None, None, 1000, 1 << 40, None, 64, True]
    a, b = torch.zeros(4), torch.zeros(8, dtype=torch.bfloat16)
    L.DirectLaunch(compiled, (5, 1, 1), template, (0, 1, 4), (0, 1, 2))((a, b, 0.5))
    assert ran == [((5, 1, 1), (a, b, 1000, 1 << 40, 0.5, 64, True))]


def test_a_constant_pointer_is_refused():
    template = [torch.zeros(1), None, 1, 1, 1.0, 64, True]  # x constant: not filled per call
    d = L.DirectLaunch(fake_compiled(SIGNATURE), (1, 1, 1), template, (1, 4), (0, 1))
    assert d.driver is None
