"""Direct launches of compiled Triton kernels: the host path of a call signature seen before.

Why. A launch through Triton's JIT (``kernel[grid](**kwargs)``) binds every argument in Python,
computes the specialization key and looks the compiled kernel up, on every call: 20-60 us for the
kernels here, which have 30-120 arguments. Its compiled-kernel launcher then asks the driver about
every tensor argument (``cuPointerGetAttribute``, one call per pointer). When an op has already
seen a call's signature (``launch_key``: shapes, strides, dtypes, devices, 16-byte alignment, all
that Triton specializes on), the compiled kernel, the grid and every constant argument are known;
only the per-call values change (data pointers, a scale). :class:`DirectLaunch` keeps the three;
it packs the kernel's parameter block once and, per call, writes the data pointers into it and
calls the driver's ``cuLaunchKernel`` (the pointers were checked by Triton on the signature's
first, JIT, launch). A kernel that builds tensor descriptors on the device needs a global scratch
(``global_scratch_size`` bytes per program): the call allocates it from PyTorch's caching
allocator on the launch stream, as Triton's launcher does through ``triton.set_allocator``
(:func:`scratch_allocator` serves the JIT launches when no allocator is set). A kernel compiled
with ``launch_pdl``, or a launch asked to be ``programmatic`` (a programmatic dependent of the
previous launch in the stream), goes through ``cuLaunchKernelEx`` with that attribute; the same
compiled kernel serves both kinds of launch. Where none of this applies (a launch hook is set, the
kernel needs profile scratch, clusters or a cooperative grid, an argument kind not handled here)
it calls Triton's compiled launcher.

The seam. This module is the one place that reads Triton's internals (a compiled kernel's metadata
and launcher, the launch hooks, the scratch allocator): it does so only on the Triton versions in
:data:`TESTED_TRITON`, and elsewhere every launch goes through Triton's own launcher. The driver's
definitions (the programmatic-launch attribute, each kernel's parameter layout) come from
``cuda.bindings.driver`` where it is installed, else from libcuda; the per-call launch is libcuda's
entry point called with prebuilt ctypes arguments (the path measured at 8-14 us a launch).

Per-call values are named: a kernel argument given as ``CallArg("q")`` is filled from the value
named "q" of the call (``names`` says the order of the call's ``values``); anything else is a
constant of the signature. Under the interpreter (CPU tensors) there is no compiled kernel and
every call goes through the JIT.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
from concurrent.futures import ThreadPoolExecutor

import torch

try:  # Triton >= 3.2 keeps the launch hooks (profilers) in knobs
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older Triton: never take the direct path
    _knobs = None
try:  # Triton >= 3.4: the allocator of device-side scratch is a context variable
    from triton.runtime import _allocation
except ImportError:  # pragma: no cover
    _allocation = None
try:  # Triton >= 3.5: compiles submitted to an executor, each launch waiting for its own
    from triton.runtime._async_compile import AsyncCompileMode, active_mode
except ImportError:  # pragma: no cover - older Triton: a first call compiles its kernels in turn
    AsyncCompileMode = None
try:  # NVIDIA's Python bindings: the driver's own definitions, where installed
    from cuda.bindings import driver as _cuda_driver
except ImportError:
    _cuda_driver = None

#: The Triton versions the direct launch reads the internals of (a compiled kernel's metadata and
#: launcher, the launch hooks, the scratch allocator) and was tested on. On any other version every
#: launch goes through Triton's own launcher: correct, 10-15 us slower a launch.
TESTED_TRITON = ((3, 4), (3, 5), (3, 6))


def _triton_tested() -> bool:
    import triton
    try:
        major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    except ValueError:  # pragma: no cover - a version string we cannot read
        return False
    return (major, minor) in TESTED_TRITON


#: Whether this process launches kernels of a known signature directly (see the module docstring).
DIRECT_LAUNCH = _triton_tested() and _knobs is not None


class CallArg(str):
    """A kernel argument filled per call, by name (a plain ``str`` stays a constant: kernels take
    string constexprs such as ``"tf32"``)."""


def _hooked() -> bool:
    """Whether a launch hook is set (a profiler's). Triton 3.6 keeps the hooks in a HookChain that
    is never None: an empty chain is no hook (and passing it to the launcher costs a Python call
    per launch, plus Triton's launch metadata)."""
    rt = _knobs.runtime
    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))


def resolve(kwargs: dict, names: tuple, values: tuple) -> dict:
    """``kwargs`` with every :class:`CallArg` replaced by the call's value of that name."""
    index = {n: i for i, n in enumerate(names)}
    return {k: (values[index[a]] if isinstance(a, CallArg) else a) for k, a in kwargs.items()}


_CTYPES = {"i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
           "i64": ctypes.c_int64, "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16,
           "u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "f32": ctypes.c_float,
           "fp64": ctypes.c_double}


_DRIVER_FUNCTIONS: dict = {}


def _driver_function(name: str):
    """A driver entry point, loaded through PyDLL, which keeps the GIL held during the call:
    filling the shared parameter block and launching from it are then one step that another Python
    thread cannot interleave (CDLL would release the GIL inside the call, while the driver still
    reads the block). No ``argtypes``: every argument is passed as a prebuilt ctypes object, which
    skips ctypes' per-argument conversion (half of the call's host time)."""
    fn = _DRIVER_FUNCTIONS.get(name)
    if fn is None:
        fn = getattr(ctypes.PyDLL("libcuda.so.1"), name)
        fn.restype = ctypes.c_int
        _DRIVER_FUNCTIONS[name] = fn
    return fn


def _cu_launch_kernel():
    """The driver's cuLaunchKernel (:func:`_driver_function`)."""
    return _driver_function("cuLaunchKernel")


#: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the launch may begin once every program
#: of the previous kernel in the stream has started (or called launch_dependents). From
#: cuda.bindings where installed, else cuda.h's value.
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = (
    int(_cuda_driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    if _cuda_driver is not None else 6)


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: id, padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("value_rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def _cu_launch_kernel_ex():
    """The driver's cuLaunchKernelEx (launches with attributes: programmatic dependent launch)."""
    return _driver_function("cuLaunchKernelEx")


def _scratch(nbytes: int) -> torch.Tensor:
    """``nbytes`` of device memory for one launch's global scratch, from PyTorch's caching
    allocator on the current stream (so reusing it after the launch is stream-ordered, and inside
    a CUDA-graph capture it comes from the graph's pool). Its blocks are 512-byte aligned."""
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", torch._C._cuda_getDevice()))


def _torch_allocator(size: int, alignment: int, stream):
    buf = _scratch(size)
    if buf.data_ptr() % alignment:  # pragma: no cover - the caching allocator aligns to 512
        raise RuntimeError(f"scratch: {alignment}-byte alignment expected, got address {buf.data_ptr():#x}")
    return buf


class scratch_allocator:
    """Context for a JIT launch: PyTorch's allocator serves Triton's device-side scratch where the
    caller has set none (a user's ``triton.set_allocator`` is left in place)."""

    def __enter__(self):
        self.token = None
        null = getattr(_allocation, "_NULL_ALLOCATOR", None)
        if null is not None and _allocation._allocator.get() is null:
            self.token = _allocation._allocator.set(_torch_allocator)

    def __exit__(self, *exc):
        if self.token is not None:
            _allocation._allocator.reset(self.token)


def _current_stream() -> int:
    """The current CUDA stream of the current device (Triton launches on the same one). The
    device is read with ``_cuda_getDevice``: the signature's first launch initialised CUDA."""
    return torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())


#: The driver's status of the last direct launch that failed (that launch then went through
#: Triton's launcher, which raises for a real fault, and the signature keeps Triton's launcher); None
#: is expected and the GPU tests assert it.
DRIVER_ERROR: int | None = None


def _param_info_bindings(function: int, index: int):
    """(status, offset, size) of parameter ``index`` through cuda.bindings."""
    err, offset, size = _cuda_driver.cuFuncGetParamInfo(_cuda_driver.CUfunction(function), index)
    return int(err), int(offset), int(size)


def _param_layout(function: int, count: int):
    """``[(offset, size)]`` of the kernel's ``count`` parameters as the driver lays them out, or
    None where the driver cannot say (older than CUDA 12.4) or the count differs. Asked through
    cuda.bindings where installed, else libcuda's entry point."""
    if _cuda_driver is not None:
        try:
            layout = []
            for i in range(count + 1):  # one past the last must fail: the kernel has exactly ``count``
                status, offset, size = _param_info_bindings(function, i)
                if i == count:
                    return layout if status != 0 else None
                if status != 0:
                    return None
                layout.append((offset, size))
        except (AttributeError, TypeError):  # bindings without cuFuncGetParamInfo: ask libcuda
            pass
    try:
        info = ctypes.CDLL("libcuda.so.1").cuFuncGetParamInfo
    except (OSError, AttributeError):
        return None
    offset, size = ctypes.c_size_t(), ctypes.c_size_t()
    layout = []
    for i in range(count + 1):  # one past the last must fail: the kernel has exactly ``count``
        status = info(ctypes.c_void_p(function), ctypes.c_size_t(i), ctypes.byref(offset), ctypes.byref(size))
        if i == count:
            return layout if status != 0 else None
        if status != 0:
            return None
        layout.append((offset.value, size.value))


class _DriverCall:
    """The kernel's parameter block, built once (every constant packed where the kernel reads it)
    and launched with ``cuLaunchKernel``: a call writes its pointers into their slots and makes one
    driver call. Triton's own launcher would parse all of the kernel's arguments (about a hundred
    here) on every call."""

    __slots__ = ("fn", "head", "stream", "tail", "pointers", "scalars", "storage", "params", "extra",
                 "scratch_bytes", "scratch_cell", "config", "attribute")

    def __init__(self, compiled, grid, template, positions: dict, programmatic: bool = False, min_shared: int = 0):
        """``positions``: argument index -> index in the call's values, for the per-call arguments;
        ``programmatic``: launch as a programmatic dependent of the stream's previous kernel;
        ``min_shared``: shared memory reserved per program, at least (<= 48 KB, which needs no opt-in)."""
        md = compiled.metadata
        shared = max(md.shared, min_shared)
        if (getattr(md, "profile_scratch_size", 0) or getattr(md, "num_ctas", 1) != 1
                or getattr(md, "launch_cooperative_grid", False)):
            raise NotImplementedError("launch needs profile scratch, clusters or a cooperative grid")
        # Device-side tensor descriptors: global_scratch_size bytes per program (Triton's launcher
        # allocates grid x num_ctas x size; num_ctas is 1 here).
        self.scratch_bytes = grid[0] * grid[1] * grid[2] * getattr(md, "global_scratch_size", 0)
        kinds = list(compiled.src.signature.values())
        if len(kinds) != len(template):
            raise NotImplementedError("signature and arguments differ in length")
        self.storage, self.scalars = [], []
        pointer_cells: dict[int, list] = {}  # value index -> the slots of the pointers taken from it
        for i, (kind, value) in enumerate(zip(kinds, template)):
            if kind == "constexpr":
                continue
            if not isinstance(kind, str):
                raise NotImplementedError(f"argument {i} of kind {kind!r}")
            if kind.startswith("*"):
                if i not in positions:
                    raise NotImplementedError(f"pointer argument {i} is not filled per call")
                cell = ctypes.c_uint64(0)
                pointer_cells.setdefault(positions[i], []).append(cell)
            elif kind in _CTYPES:
                cell = _CTYPES[kind](0 if value is None else value)
                if i in positions:
                    self.scalars.append((cell, positions[i]))
            else:
                raise NotImplementedError(f"argument {i} of kind {kind!r}")
            self.storage.append(cell)
        # one data_ptr() a tensor, however many arguments point at it (absent tensors all point at o)
        self.pointers = tuple((source, tuple(cells)) for source, cells in pointer_cells.items())
        self.scratch_cell = ctypes.c_uint64(0)
        self.storage += [self.scratch_cell, ctypes.c_uint64(0)]  # global scratch (filled per call), profile: none
        # One packed buffer at the driver's offsets, or (where it cannot report them) an array of
        # one pointer per parameter.
        layout = _param_layout(compiled.function, len(self.storage))
        if layout is not None and all(ctypes.sizeof(c) == size for c, (_, size) in zip(self.storage, layout)):
            self._pack(layout)
        else:  # kernelParams: an array of pointers, one per parameter
            self.params = (ctypes.c_void_p * len(self.storage))(*[ctypes.addressof(c) for c in self.storage])
            self.tail = (self.params, None)
        u = ctypes.c_uint
        self.config = None
        if programmatic or getattr(md, "launch_pdl", False):  # cuLaunchKernelEx(&config, kernelParams, extra)
            self.attribute = _LaunchAttribute(id=_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
            self.config = _LaunchConfig(grid[0], grid[1], grid[2], 32 * md.num_warps, 1, 1, shared, None,
                                        ctypes.pointer(self.attribute), 1)
            self.fn = _cu_launch_kernel_ex()
            self.head = (ctypes.c_void_p(compiled.function),)
        else:
            self.fn = _cu_launch_kernel()
            self.head = (ctypes.c_void_p(compiled.function), u(grid[0]), u(grid[1]), u(grid[2]),
                         u(32 * md.num_warps), u(1), u(1), u(shared))
        self.stream = ctypes.c_void_p(0)

    def _pack(self, layout):
        """Move every parameter into one buffer at the driver's offsets (the cells are re-made as
        views of the buffer, so a call's writes land in it) and launch with ``extra``: the driver
        then copies one block instead of following a pointer per parameter."""
        total = max(offset + size for offset, size in layout)
        buffer = (ctypes.c_char * total)()
        moved = {}
        for cell, (offset, _) in zip(self.storage, layout):
            view = type(cell).from_buffer(buffer, offset)
            view.value = cell.value
            moved[id(cell)] = view
        self.storage = [moved[id(c)] for c in self.storage]
        self.pointers = tuple((source, tuple(moved[id(c)] for c in cells)) for source, cells in self.pointers)
        self.scalars = [(moved[id(c)], source) for c, source in self.scalars]
        self.scratch_cell = moved[id(self.scratch_cell)]
        self.params = (buffer, ctypes.c_size_t(total))
        # CU_LAUNCH_PARAM_BUFFER_POINTER, the buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END
        self.extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buffer), 2, ctypes.addressof(self.params[1]), 0)
        self.tail = (None, self.extra)

    def __call__(self, values) -> int:
        """Launch with the call's ``values``; returns the driver's status (0: launched)."""
        for source, cells in self.pointers:
            ptr = values[source].data_ptr()
            for cell in cells:
                cell.value = ptr
        for cell, source in self.scalars:
            cell.value = values[source]
        self.stream.value = _current_stream()
        if self.scratch_bytes:
            # Freed when this returns: the caching allocator hands it out again only to work
            # enqueued later on this stream (or, in a capture, later in the same graph).
            scratch = _scratch(self.scratch_bytes)
            self.scratch_cell.value = scratch.data_ptr()
        if self.config is not None:
            self.config.hStream = self.stream.value
            return self.fn(ctypes.byref(self.config), self.head[0], *self.tail)
        return self.fn(*self.head, self.stream, *self.tail)


class DirectLaunch:
    """One launch of a known call signature: the compiled kernel, its 3-d grid, the full argument
    list with the per-call positions left empty, and the index in the call's values of each."""

    __slots__ = ("compiled", "grid", "template", "positions", "sources", "driver")

    def __init__(self, compiled, grid, template, positions, sources, programmatic=False, min_shared=0):
        """``programmatic``: later launches are programmatic dependents of the stream's previous
        kernel (where this falls back to Triton's launcher they are plain launches: correct, only
        serial). ``min_shared``: bytes of shared memory reserved per program at least, whatever the
        kernel needs (so that its programs do not share a multiprocessor with another kernel's
        large ones; Triton's launcher, the fallback, reserves only what the kernel needs)."""
        self.compiled, self.grid, self.template = compiled, grid, template
        self.positions, self.sources = positions, sources
        try:
            self.driver = _DriverCall(compiled, grid, template, dict(zip(positions, sources)), programmatic,
                                      min_shared)
        except (NotImplementedError, AttributeError, OSError):
            self.driver = None

    def __call__(self, values) -> None:
        global DRIVER_ERROR
        if self.driver is not None and not _hooked():
            status = self.driver(values)
            if status == 0:
                return
            # A driver error: Triton's launcher below repeats the launch and raises its own error;
            # the signature keeps Triton's launcher from now on (recorded, never silently).
            DRIVER_ERROR, self.driver = status, None
        args = self.template.copy()
        for i, s in zip(self.positions, self.sources):
            args[i] = values[s]
        with scratch_allocator():
            self.compiled[self.grid](*args)


@contextlib.contextmanager
def compile_together(launches: list, names: tuple, values: tuple):
    """Context for a call's first launches through the JIT: every kernel of ``launches``
    (``(kernel, grid, kwargs, options)``, arguments as :func:`jit_launch` takes them) starts
    compiling at once, in threads (Triton's AsyncCompileMode; the compiler and ptxas run outside
    Python's lock), and each launch inside waits for its own kernel only: the call waits for its
    slowest compile rather than for their sum (docs/perf-history.md). A plain context on a Triton
    without it, or for one kernel."""
    if AsyncCompileMode is None or len(launches) < 2:
        yield
        return
    try:
        with ThreadPoolExecutor(len(launches)) as pool, AsyncCompileMode(pool):
            for kernel, grid, kwargs, options in launches:
                kernel.warmup(grid=grid, **resolve(kwargs, names, values), **options)
            yield
    finally:
        # Triton's AsyncCompileMode leaves itself active in this thread when a compile raised on
        # its exit: every later first call here would then fail ("Another AsyncCompileMode is
        # already active", or a shut-down pool) instead of compiling.
        active_mode.set(None)


def compile_in_background(launches: list, names: tuple, values: tuple, device: torch.device):
    """Start compiling ``launches`` (as :func:`compile_together` takes them) on a thread of their
    own, beside whatever the calling thread compiles meanwhile (Triton's AsyncCompileMode is per
    thread); returns a function that waits for them, and for each kernel's module loaded and its
    launcher built (:func:`_load`). For a first call whose later kernels need the earlier ones'
    outputs: those kernels' compiles need only their arguments' dtypes and alignment, so
    placeholders stand in for the outputs. A compile that fails here is left to the launch that
    follows, which compiles again and raises there."""
    if AsyncCompileMode is None or not launches:
        return lambda: None
    import threading

    def work():
        try:
            with _on(device), ThreadPoolExecutor(len(launches)) as pool:
                with AsyncCompileMode(pool, ignore_errors=True):
                    compiled = [kernel.warmup(grid=grid, **resolve(kwargs, names, values), **options)
                                for kernel, grid, kwargs, options in launches]
                list(pool.map(functools.partial(_load, device=device), compiled))
        except Exception:  # noqa: BLE001 (the launch compiles again and reports it)
            pass

    thread = threading.Thread(target=work, name="recurscan-compile", daemon=True)
    thread.start()
    return thread.join


def _on(device: torch.device):
    """``device`` current in this thread (a CUDA device), or nothing."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _load(compiled, device: torch.device) -> None:
    """Load a compiled kernel's module and build its launcher now. Triton does both on the kernel's
    first launch, one after another in the launching thread, and the launcher is a C module
    compiled for its signature: on one H200 machine lent, 4.4 s of a cold backward went to its
    first launches after every compile had finished (docs/perf-history.md, 2026-12-03). Nothing
    where Triton's compiled kernel has no such step (the launch does it)."""
    compiled = compiled.result() if hasattr(compiled, "result") else compiled
    init = getattr(compiled, "_init_handles", None)
    if init is not None:
        with _on(device):
            init()


def launches_programmatically(*launches) -> bool:
    """Whether every one of ``launches`` (DirectLaunch or None) goes through the driver's launch,
    which honours a ``programmatic`` one's attribute: none is missing (a first call), fell back to
    Triton's launcher or is held by a profiler's launch hook."""
    return all(d is not None and d.driver is not None for d in launches) and not _hooked()


def jit_launch(kernel, grid: tuple, kwargs: dict, options: dict, names: tuple, values: tuple,
               programmatic: bool = False, min_shared: int = 0) -> DirectLaunch | None:
    """Launch ``kernel`` through Triton's JIT (compiling on first use) with ``kwargs`` (every
    kernel argument; :class:`CallArg` entries taken from ``values``, in the order of ``names``).
    Returns the :class:`DirectLaunch` that repeats it on other values of the same signature, or
    None where there is none (the interpreter, or an older Triton). ``programmatic``: the direct
    launches go as programmatic dependents of the stream's previous kernel (this first one is a
    plain launch). ``min_shared``: the direct launches' shared memory per program, at least."""
    with scratch_allocator():
        compiled = kernel[grid](**resolve(kwargs, names, values), **options)
    if not DIRECT_LAUNCH or compiled is None or not hasattr(compiled, "packed_metadata"):
        return None
    index = {n: i for i, n in enumerate(names)}
    template, positions, sources = [], [], []
    for i, arg_name in enumerate(kernel.arg_names):
        a = kwargs[arg_name]
        if isinstance(a, CallArg):
            positions.append(i)
            sources.append(index[a])
            a = None
        template.append(a)
    grid3 = tuple(grid) + (1,) * (3 - len(grid))
    return DirectLaunch(compiled, grid3, template, tuple(positions), tuple(sources), programmatic, min_shared)
