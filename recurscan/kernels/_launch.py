"""Direct launches of compiled Triton kernels: the host path of a call signature seen before.

Why. A launch through Triton's JIT (``kernel[grid](**kwargs)``) binds every argument in Python,
computes the specialization key and looks the compiled kernel up, on every call: 20-60 us for the
kernels here, which have 30-120 arguments. Its compiled-kernel launcher then asks the driver about
every tensor argument (``cuPointerGetAttribute``, one call per pointer). When an op has already
seen a call's signature (``launch_key``: shapes, strides, dtypes, devices, 16-byte alignment, all
that Triton specializes on), the compiled kernel, the grid and every constant argument are known;
only the per-call values change (data pointers, a scale). :class:`DirectLaunch` keeps the three and
launches the compiled kernel with the pointers passed as integers, which the launcher takes as
they are (it checked them on the signature's first, JIT, launch).

Per-call values are named: a kernel argument given as ``CallArg("q")`` is filled from the value
named "q" of the call (``names`` says the order of the call's ``values``); anything else is a
constant of the signature. Under the interpreter (CPU tensors) there is no compiled kernel and
every call goes through the JIT.
"""
from __future__ import annotations

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


class DirectLaunch:
    """One launch of a known call signature: the compiled kernel, its 3-d grid, the full argument
    list with the per-call positions left empty, and the index in the call's values of each."""

    __slots__ = ("compiled", "grid", "template", "positions", "sources")

    def __init__(self, compiled, grid, template, positions, sources):
        self.compiled, self.grid, self.template = compiled, grid, template
        self.positions, self.sources = positions, sources

    def __call__(self, values) -> None:
        args = self.template.copy()
        c = self.compiled
        if _hooked():
            for i, s in zip(self.positions, self.sources):  # a profiler's hooks: Triton's own runner
                args[i] = values[s]
            c[self.grid](*args)
            return
        for i, s in zip(self.positions, self.sources):
            a = values[s]
            args[i] = a.data_ptr() if isinstance(a, torch.Tensor) else a
        stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
        c.run(self.grid[0], self.grid[1], self.grid[2], stream, c.function, c.packed_metadata, None, None, None,
              *args)


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
