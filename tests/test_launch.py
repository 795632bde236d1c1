"""The direct launcher's parameter block (recurscan/runtime/launcher.py), checked without a GPU:
a stand-in compiled kernel and a stand-in cuLaunchKernel that decodes the block it is given.
(On the H200, tests/gpu check that direct launches compute what Triton's JIT launches compute.)"""
import ctypes
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")
from recurscan.runtime import launcher as L  # noqa: E402


def fake_compiled(signature, num_warps=4, shared=1024, **meta):
    md = SimpleNamespace(num_warps=num_warps, shared=shared, global_scratch_size=0, profile_scratch_size=0,
                         num_ctas=1, launch_cooperative_grid=False, launch_pdl=False)
    md.__dict__.update(meta)
    return SimpleNamespace(metadata=md, src=SimpleNamespace(signature=signature), function=0xF00)


SIGNATURE = {"x": "*fp32", "y": "*bf16", "n": "i32", "stride": "i64", "scale": "fp32", "BLOCK": "constexpr",
             "flag": "i1"}


def launch_with(values, monkeypatch, sources=(0, 1, 2)):
    calls = []

    def cu_launch(*args):  # the launcher passes prebuilt ctypes objects (no argtypes): unwrap them
        function, gx, gy, gz, bx, by, bz, shared, stream, params, extra = (getattr(a, "value", a) for a in args)
        params = args[9]
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
    positions = (0, 1, 4)
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


def test_pointer_arguments_sharing_a_value_are_filled_from_it(monkeypatch):
    """Absent tensors all point at one present tensor (their flags keep them unread): the block
    must hold that tensor's address in every such slot, read once."""
    a = torch.zeros(4)
    (call,) = launch_with((a, None, 0.5), monkeypatch, sources=(0, 0, 2))
    assert call["params"][:2] == [a.data_ptr(), a.data_ptr()]


def test_second_call_rewrites_only_its_own_values(monkeypatch):
    a, b = torch.zeros(4), torch.zeros(8, dtype=torch.bfloat16)
    a2 = torch.zeros(16)
    calls = launch_with((a, b, 0.5), monkeypatch)
    assert calls[0]["params"][:2] == [a.data_ptr(), b.data_ptr()]
    calls = launch_with((a2, b, 2.0), monkeypatch)
    assert calls[0]["params"] == [a2.data_ptr(), b.data_ptr(), 1000, 1 << 40, 2.0, 1, 0, 0]


@pytest.mark.parametrize("meta", [dict(profile_scratch_size=64), dict(num_ctas=2)])
def test_launches_needing_more_than_a_parameter_block_use_tritons_launcher(meta, monkeypatch):
    monkeypatch.setattr(L, "_cu_launch_kernel", lambda: (lambda *args: 0))
    d = L.DirectLaunch(fake_compiled(SIGNATURE, **meta), (1, 1, 1), [None] * 7, (0, 1, 4), (0, 1, 2))
    assert d.driver is None


@pytest.mark.parametrize("how", ["programmatic", "compiled_launch_pdl"])
def test_programmatic_dependent_launch_goes_through_cuLaunchKernelEx(how, monkeypatch):
    """A launch asked to be programmatic (or a kernel compiled with launch_pdl) calls
    cuLaunchKernelEx with the grid, block, shared memory and stream in its config and one
    attribute, programmatic stream serialization (id 6) = 1; the parameter block is the same."""
    calls = []

    def cu_launch_ex(config, function, params, extra):
        c = config._obj
        attr = c.attrs.contents
        calls.append(dict(grid=(c.gridDimX, c.gridDimY, c.gridDimZ), block=(c.blockDimX, c.blockDimY, c.blockDimZ),
                          shared=c.sharedMemBytes, stream=c.hStream, attr=(attr.id, attr.value), n=c.numAttrs,
                          function=function.value))
        return 0
    monkeypatch.setattr(L, "_cu_launch_kernel_ex", lambda: cu_launch_ex)
    monkeypatch.setattr(L, "_cu_launch_kernel", lambda: (lambda *args: pytest.fail("plain launch")))
    monkeypatch.setattr(L, "_current_stream", lambda: 77)
    monkeypatch.setattr(L, "_param_layout", lambda function, count: None)  # a driver that cannot report offsets
    meta = dict(launch_pdl=True) if how == "compiled_launch_pdl" else {}
    template = [None, None, 1000, 1 << 40, None, 64, True]
    d = L.DirectLaunch(fake_compiled(SIGNATURE, **meta), (5, 2, 1), template, (0, 1, 4), (0, 1, 2),
                       programmatic=how == "programmatic")
    assert d.driver is not None
    d((torch.zeros(4), torch.zeros(4), 0.5))
    assert calls == [dict(grid=(5, 2, 1), block=(128, 1, 1), shared=1024, stream=77, attr=(6, 1), n=1,
                          function=0xF00)]


def test_global_scratch_is_allocated_per_call_for_the_whole_grid(monkeypatch):
    """Kernels that build tensor descriptors on the device need global_scratch_size bytes per
    program: each call allocates grid x size bytes (as Triton's launcher does) and passes its
    address in the global-scratch slot; the profile slot stays 0."""
    made = []

    def scratch(nbytes):
        made.append(torch.empty(nbytes, dtype=torch.uint8))
        return made[-1]
    monkeypatch.setattr(L, "_scratch", scratch)
    calls = []

    def cu_launch(*args):
        params = args[9]
        kinds = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_int8,
                 ctypes.c_uint64, ctypes.c_uint64]
        calls.append([ctypes.cast(params[i], ctypes.POINTER(k)).contents.value for i, k in enumerate(kinds)])
        return 0
    monkeypatch.setattr(L, "_cu_launch_kernel", lambda: cu_launch)
    monkeypatch.setattr(L, "_current_stream", lambda: 0)
    template = [None, None, 1000, 1 << 40, None, 64, True]
    d = L.DirectLaunch(fake_compiled(SIGNATURE, global_scratch_size=128), (5, 2, 1), template, (0, 1, 4), (0, 1, 2))
    assert d.driver is not None
    a, b = torch.zeros(4), torch.zeros(8, dtype=torch.bfloat16)
    d((a, b, 0.5))
    d((a, b, 0.5))
    assert [t.numel() for t in made] == [5 * 2 * 128] * 2
    assert [c[6:] for c in calls] == [[made[0].data_ptr(), 0], [made[1].data_ptr(), 0]]
    assert calls[0][:6] == [a.data_ptr(), b.data_ptr(), 1000, 1 << 40, 0.5, 1]


def test_jit_launches_get_an_allocator_only_where_none_is_set():
    """Triton's JIT launcher asks triton.set_allocator's allocator for device-side scratch; inside
    scratch_allocator() PyTorch's serves where the caller set none, and a caller's stays."""
    from triton.runtime import _allocation
    assert _allocation._allocator.get() is _allocation._NULL_ALLOCATOR
    with L.scratch_allocator():
        assert _allocation._allocator.get() is L._torch_allocator
    assert _allocation._allocator.get() is _allocation._NULL_ALLOCATOR
    mine = lambda size, alignment, stream: None  # noqa: E731
    token = _allocation._allocator.set(mine)
    try:
        with L.scratch_allocator():
            assert _allocation._allocator.get() is mine
    finally:
        _allocation._allocator.reset(token)


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
    monkeypatch.setattr(L, "DRIVER_ERROR", None)
    d = L.DirectLaunch(compiled, (5, 1, 1), template, (0, 1, 4), (0, 1, 2))
    d((a, b, 0.5))
    assert ran == [((5, 1, 1), (a, b, 1000, 1 << 40, 0.5, 64, True))]
    assert L.DRIVER_ERROR == 201 and d.driver is None  # recorded; this signature keeps Triton's launcher
    d((a, b, 0.5))
    assert len(ran) == 2


# The parameters' offsets as a C compiler lays them out (what cuFuncGetParamInfo reports for them):
# x, y at 0 and 8; n at 16; stride at 24 (8-aligned); scale at 32; flag at 36; the scratch pointers
# at 40 and 48.
PACKED_LAYOUT = [(0, 8), (8, 8), (16, 4), (24, 8), (32, 4), (36, 1), (40, 8), (48, 8)]


@pytest.mark.parametrize("scratch_size", [0, 64])
def test_packed_parameter_buffer_at_the_drivers_offsets(monkeypatch, scratch_size):
    """With the driver's offsets, the launcher passes one buffer through ``extra`` (no pointer
    array); constants and per-call values (the global scratch's address among them) must sit at
    those offsets, and a second call must rewrite only its own values."""
    made = []
    monkeypatch.setattr(L, "_scratch", lambda n: made.append(torch.empty(n, dtype=torch.uint8)) or made[-1])
    calls = []

    def cu_launch(*args):
        assert args[9] is None  # kernelParams unused
        extra = args[10]
        assert [extra[0], extra[2], extra[4]] == [1, 2, None]  # BUFFER_POINTER, BUFFER_SIZE, END
        size = ctypes.c_size_t.from_address(extra[3]).value
        raw = ctypes.string_at(extra[1], size)
        kinds = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_int8,
                 ctypes.c_uint64, ctypes.c_uint64]
        buf = ctypes.create_string_buffer(raw, size)
        calls.append((size, [kind.from_buffer(buf, off).value for kind, (off, _) in zip(kinds, PACKED_LAYOUT)]))
        return 0
    monkeypatch.setattr(L, "_cu_launch_kernel", lambda: cu_launch)
    monkeypatch.setattr(L, "_current_stream", lambda: 77)
    monkeypatch.setattr(L, "_param_layout", lambda function, count: PACKED_LAYOUT if count == 8 else None)
    template = [None, None, 1000, 1 << 40, None, 64, True]
    d = L.DirectLaunch(fake_compiled(SIGNATURE, global_scratch_size=scratch_size), (5, 2, 1), template, (0, 1, 4),
                       (0, 1, 2))
    a, b, a2 = torch.zeros(4), torch.zeros(8, dtype=torch.bfloat16), torch.zeros(16)
    d((a, b, 0.25))
    d((a2, b, 2.0))
    scratch = [t.data_ptr() for t in made] if scratch_size else [0, 0]
    assert [t.numel() for t in made] == ([10 * scratch_size] * 2 if scratch_size else [])
    assert calls[0] == (56, [a.data_ptr(), b.data_ptr(), 1000, 1 << 40, 0.25, 1, scratch[0], 0])
    assert calls[1] == (56, [a2.data_ptr(), b.data_ptr(), 1000, 1 << 40, 2.0, 1, scratch[1], 0])


def test_a_layout_that_disagrees_with_the_signature_keeps_the_pointer_array(monkeypatch):
    wrong = list(PACKED_LAYOUT)
    wrong[2] = (16, 8)  # n reported 8 bytes wide: not the i32 the signature says
    monkeypatch.setattr(L, "_param_layout", lambda function, count: wrong)
    monkeypatch.setattr(L, "_cu_launch_kernel", lambda: (lambda *args: 0))
    d = L.DirectLaunch(fake_compiled(SIGNATURE), (1, 1, 1), [None, None, 1, 1, None, 64, True], (0, 1, 4), (0, 1, 2))
    assert d.driver is not None and d.driver.tail[0] is not None and d.driver.tail[1] is None


def test_a_constant_pointer_is_refused():
    template = [torch.zeros(1), None, 1, 1, 1.0, 64, True]  # x constant: not filled per call
    d = L.DirectLaunch(fake_compiled(SIGNATURE), (1, 1, 1), template, (1, 4), (0, 1))
    assert d.driver is None


@pytest.mark.parametrize("programmatic", [False, True])
@pytest.mark.parametrize("kernel_shared,min_shared,want", [(1024, 0, 1024), (1024, 49152, 49152), (60000, 49152, 60000)])
def test_a_launch_reserves_at_least_its_min_shared(programmatic, kernel_shared, min_shared, want, monkeypatch):
    """``min_shared`` raises the shared memory a program reserves (so that it cannot share a
    multiprocessor with another kernel's large programs), plain or programmatic; never lowers it."""
    got = []
    monkeypatch.setattr(L, "_cu_launch_kernel_ex", lambda: lambda config, *rest: got.append(config._obj.sharedMemBytes) or 0)
    monkeypatch.setattr(L, "_cu_launch_kernel", lambda: lambda *args: got.append(args[7].value) or 0)
    monkeypatch.setattr(L, "_current_stream", lambda: 77)
    template = [None, None, 1000, 1 << 40, None, 64, True]
    d = L.DirectLaunch(fake_compiled(SIGNATURE, shared=kernel_shared), (5, 2, 1), template, (0, 1, 4), (0, 1, 2),
                       programmatic=programmatic, min_shared=min_shared)
    assert d.driver is not None
    d((torch.zeros(4), torch.zeros(4), 0.5))
    assert got == [want]


def test_compile_together_warms_every_kernel_before_the_first_launch(monkeypatch):
    """A first call's kernels are all submitted for compilation (warmup, under Triton's
    AsyncCompileMode) before the first launch, each with the call's own values for its CallArgs
    and its launch options; one kernel, or no AsyncCompileMode, is a plain context."""
    events = []

    class Mode:  # stands in for triton.runtime._async_compile.AsyncCompileMode
        def __init__(self, executor):
            events.append("mode")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            events.append("finalised")

    def kernel(name):
        return SimpleNamespace(warmup=lambda grid, **kw: events.append((name, grid, kw)))

    monkeypatch.setattr(L, "AsyncCompileMode", Mode)
    names, values = ("x", "y"), ("X", "Y")
    launches = [(kernel("prep"), (4,), {"a": L.CallArg("x"), "B": 2}, {"num_warps": 4}),
                (kernel("sweep"), (8,), {"a": L.CallArg("y"), "B": 3}, {"num_warps": 8})]
    with L.compile_together(launches, names, values):
        events.append("launches")
    assert events == ["mode", ("prep", (4,), {"a": "X", "B": 2, "num_warps": 4}),
                      ("sweep", (8,), {"a": "Y", "B": 3, "num_warps": 8}), "launches", "finalised"]
    events.clear()
    with L.compile_together(launches[:1], names, values):
        events.append("launches")
    assert events == ["launches"]
    monkeypatch.setattr(L, "AsyncCompileMode", None)
    with L.compile_together(launches, names, values):
        events.append("plain")
    assert events == ["launches", "plain"]


@pytest.mark.skipif(L.AsyncCompileMode is None, reason="this Triton has no AsyncCompileMode")
def test_a_failed_compile_leaves_no_async_compile_mode_active():
    """A kernel that fails to compile inside a first call raises there, and the next first call
    in the same thread still compiles: Triton's AsyncCompileMode re-raises the failure on its exit
    before it resets itself, which left every later call in the process failing."""
    def failing_compile():
        raise RuntimeError("the kernel does not compile")

    def kernel(key):  # warmup submits its compile to the active mode, as Triton's JIT does under it
        return SimpleNamespace(warmup=lambda grid, **kw: L.active_mode.get().submit(key, failing_compile,
                                                                                     lambda k: None))

    launches = [(kernel("a"), (1,), {}, {}), (kernel("b"), (1,), {}, {})]
    with pytest.raises(RuntimeError, match="does not compile"):
        with L.compile_together(launches, (), ()):
            pass
    assert L.active_mode.get() is None
    ok = [(SimpleNamespace(warmup=lambda grid, **kw: None), (1,), {}, {})] * 2
    with L.compile_together(ok, (), ()):
        assert L.active_mode.get() is not None
    assert L.active_mode.get() is None


@pytest.mark.skipif(L.AsyncCompileMode is None, reason="this Triton has no AsyncCompileMode")
def test_kernels_compiled_in_the_background_are_loaded_there():
    """compile_in_background loads each compiled kernel's module and builds its launcher in its own
    pool (Triton does both on a kernel's first launch, one after another in the launching
    thread): every kernel's handles are made once the wait returns, also where a compile gives a
    future (resolved first) or an object with no such step."""
    made = []

    class Compiled:
        def __init__(self, name):
            self.name = name

        def _init_handles(self):
            made.append(self.name)

    class Future:
        def result(self):
            return Compiled("from a future")

    kernels = [SimpleNamespace(warmup=lambda grid, **kw: Compiled("plain")),
               SimpleNamespace(warmup=lambda grid, **kw: Future()),
               SimpleNamespace(warmup=lambda grid, **kw: object())]
    wait = L.compile_in_background([(k, (1,), {}, {}) for k in kernels], (), (), torch.device("cpu"))
    wait()
    assert sorted(made) == ["from a future", "plain"]
