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
first, JIT, launch). Where that does not apply (a launch hook is set, the kernel needs scratch
or launch attributes, an argument kind not handled here) it calls Triton's compiled launcher.

Per-call values are named: a kernel argument given as ``CallArg("q")`` is filled from the value
named "q" of the call (``names`` says the order of the call's ``values``); anything else is a
constant of the signature. Under the interpreter (CPU tensors) there is no compiled kernel and
every call goes through the JIT.
"""
from __future__ import annotations

import ctypes

import torch

try:  # Triton >= 3.2 keeps the launch hooks (profilers) in knobs
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older Triton: never take the direct path
    _knobs = None


class CallArg(str):
    """A kernel argument filled per call, by name (a plain ``str`` stays a constant: kernels take
    string constexprs such as ``"tf32"``)."""


def _hooked() -> bool:
    """Whether a launch hook is set (a profiler's). Triton 3.6 keeps the hooks in a HookChain that
    is never None: an empty chain is no hook (and passing it to the launcher costs a Python call
    per launch, plus Triton's launch metadata: ~20 us a launch measured on the H200's host)."""
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
_LIBCUDA = None


def _cu_launch_kernel():
    """The driver's cuLaunchKernel, with its argument types declared once. Loaded through PyDLL,
    which keeps the GIL held during the call: filling the shared parameter block and launching
    from it are then one step that another Python thread cannot interleave (CDLL would release the
    GIL inside the call, while the driver still reads the block)."""
    global _LIBCUDA
    if _LIBCUDA is None:
        lib = ctypes.PyDLL("libcuda.so.1")
        fn = lib.cuLaunchKernel
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        fn.restype = ctypes.c_int
        _LIBCUDA = fn
    return _LIBCUDA


def _current_stream() -> int:
    """The current CUDA stream of the current device (Triton launches on the same one)."""
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())


class _DriverCall:
    """The kernel's parameter block, built once (every constant packed where the kernel reads it)
    and launched with ``cuLaunchKernel``: a call writes its pointers into their slots and makes one
    driver call. Triton's own launcher would parse all of the kernel's arguments (about a hundred
    here) on every call: ~16 us measured on the H200's host for the streaming kernel."""

    __slots__ = ("fn", "function", "grid", "block", "shared", "pointers", "scalars", "storage", "params")

    def __init__(self, compiled, grid, template, positions: dict):
        """``positions``: argument index -> index in the call's values, for the per-call arguments."""
        md = compiled.metadata
        if (getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0)
                or getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False)
                or getattr(md, "launch_pdl", False)):
            raise NotImplementedError("launch needs scratch, clusters or launch attributes")
        kinds = list(compiled.src.signature.values())
        if len(kinds) != len(template):
            raise NotImplementedError("signature and arguments differ in length")
        self.storage, self.pointers, self.scalars = [], [], []
        for i, (kind, value) in enumerate(zip(kinds, template)):
            if kind == "constexpr":
                continue
            if not isinstance(kind, str):
                raise NotImplementedError(f"argument {i} of kind {kind!r}")
            if kind.startswith("*"):
                if i not in positions:
                    raise NotImplementedError(f"pointer argument {i} is not filled per call")
                cell = ctypes.c_uint64(0)
                self.pointers.append((cell, positions[i]))
            elif kind in _CTYPES:
                cell = _CTYPES[kind](0 if value is None else value)
                if i in positions:
                    self.scalars.append((cell, positions[i]))
            else:
                raise NotImplementedError(f"argument {i} of kind {kind!r}")
            self.storage.append(cell)
        self.storage += [ctypes.c_uint64(0), ctypes.c_uint64(0)]  # global and profile scratch: none
        self.params = (ctypes.c_void_p * len(self.storage))(*[ctypes.addressof(c) for c in self.storage])
        self.fn = _cu_launch_kernel()
        self.function, self.grid = compiled.function, grid
        self.block = 32 * md.num_warps
        self.shared = md.shared

    def __call__(self, values) -> int:
        """Launch with the call's ``values``; returns the driver's status (0: launched)."""
        for cell, source in self.pointers:
            cell.value = values[source].data_ptr()
        for cell, source in self.scalars:
            cell.value = values[source]
        g = self.grid
        return self.fn(self.function, g[0], g[1], g[2], self.block, 1, 1, self.shared, _current_stream(), self.params,
                       None)


class DirectLaunch:
    """One launch of a known call signature: the compiled kernel, its 3-d grid, the full argument
    list with the per-call positions left empty, and the index in the call's values of each."""

    __slots__ = ("compiled", "grid", "template", "positions", "sources", "driver")

    def __init__(self, compiled, grid, template, positions, sources):
        self.compiled, self.grid, self.template = compiled, grid, template
        self.positions, self.sources = positions, sources
        try:
            self.driver = _DriverCall(compiled, grid, template, dict(zip(positions, sources)))
        except (NotImplementedError, AttributeError, OSError):
            self.driver = None

    def __call__(self, values) -> None:
        if self.driver is not None and not _hooked():
            if self.driver(values) == 0:
                return
            # A driver error: Triton's launcher below repeats the launch and raises its own error.
        args = self.template.copy()
        for i, s in zip(self.positions, self.sources):
            args[i] = values[s]
        self.compiled[self.grid](*args)


def jit_launch(kernel, grid: tuple, kwargs: dict, options: dict, names: tuple, values: tuple) -> DirectLaunch | None:
    """Launch ``kernel`` through Triton's JIT (compiling on first use) with ``kwargs`` (every
    kernel argument; :class:`CallArg` entries taken from ``values``, in the order of ``names``).
    Returns the :class:`DirectLaunch` that repeats it on other values of the same signature, or
    None where there is none (the interpreter, or an older Triton)."""
    compiled = kernel[grid](**resolve(kwargs, names, values), **options)
    if _knobs is None or compiled is None or not hasattr(compiled, "packed_metadata"):
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
    return DirectLaunch(compiled, grid3, template, tuple(positions), tuple(sources))
