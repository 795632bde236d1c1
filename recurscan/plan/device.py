"""What the planner asks of the device: multiprocessors, whether Triton can run at all (CUDA, or
CPU tensors under a working interpreter), and whether Gluon twins may (recurscan/kernels/gluon)."""
from __future__ import annotations

import os
import sys
from functools import lru_cache

import torch

#: The modules whose kernels a late ``TRITON_INTERPRET=1`` would find built for the GPU.
KERNEL_MODULES = ("recurscan.kernels.delta.prep", "recurscan.kernels.delta.sweep", "recurscan.kernels.delta.fixup",
                  "recurscan.kernels.delta.backward",
                  "recurscan.kernels.stream.recurrence")


@lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (1 for any other device), read once per device; the
    launch rules size grids by it."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


@lru_cache(maxsize=None)
def device_name(device: torch.device) -> str:
    """The device's name as CUDA reports it ("cpu" for any other device), read once per device."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def interpreter_off_reason() -> str | None:
    """Why Triton's interpreter cannot run kernels on CPU tensors in this process, or None if it can.

    Asking for it is ``TRITON_INTERPRET=1`` in the environment. Triton also reads that variable
    when its ``@triton.jit`` decorators run: for its own library functions (``triton.language``)
    when triton is first imported, and for recurscan's kernels when ``recurscan.kernels.*`` is
    first imported. A function decorated while the variable was unset is built for the GPU
    compiler and fails inside the interpreter ("Cannot call @triton.jit'd outside of the scope of
    a kernel"), so the variable set only after that import is not enough: this looks at what
    the decorators already built.
    """
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return "TRITON_INTERPRET is not 1 in the environment"
    if "triton" not in sys.modules:
        return None  # the decorators will run under the interpreter
    try:
        from triton.runtime.interpreter import InterpretedFunction
        import triton.language.standard as triton_standard
    except ImportError:  # a Triton without these modules: trust the environment
        return None
    if not isinstance(triton_standard.cdiv, InterpretedFunction):
        return "TRITON_INTERPRET=1 was set after triton was imported (triton's functions were built for the GPU)"
    for name in KERNEL_MODULES:
        module = sys.modules.get(name)
        jitted = [f for f in vars(module).values() if type(f).__name__ == "JITFunction"] if module else []
        if jitted:
            return f"TRITON_INTERPRET=1 was set after {name} was imported (its kernels were built for the GPU)"
    return None


def interpreter_on() -> bool:
    """Triton's interpreter runs kernels on CPU tensors here (see :func:`interpreter_off_reason`)."""
    return interpreter_off_reason() is None


def check_triton_device(device: torch.device) -> None:
    """``backend="triton"`` can run on ``device``: CUDA, or CPU under a working interpreter."""
    if device.type == "cuda":
        return
    if device.type != "cpu":
        raise ValueError(f"backend='triton': no Triton kernels for device {device}")
    why = interpreter_off_reason()
    if why is not None:
        raise ValueError(f"backend='triton' on CPU tensors runs under Triton's interpreter, but {why}: set "
                         "TRITON_INTERPRET=1 in the environment before triton is first imported")


#: The Triton versions the Gluon twins (recurscan/kernels/gluon) were compiled and tested on, on
#: the H200. Gluon's API is experimental: on any other version the planner takes the Triton twins.
GLUON_TESTED_TRITON = ((3, 6),)


@lru_cache(maxsize=None)
def _gluon_imports() -> bool:
    try:
        import triton
        from triton.experimental import gluon  # noqa: F401
        from triton.experimental.gluon.language.nvidia.hopper import tma
    except ImportError:
        return False
    try:
        version = tuple(int(p) for p in triton.__version__.split(".")[:2])
    except ValueError:  # a version string we cannot read
        return False
    return version in GLUON_TESTED_TRITON and hasattr(tma, "make_tensor_descriptor")


@lru_cache(maxsize=None)
def gluon_usable(device: torch.device) -> bool:
    """Whether a Gluon twin may run on ``device``: Gluon imports on one of
    :data:`GLUON_TESTED_TRITON`, the interpreter is off (no Gluon kernel runs under it), and the
    device is a CUDA GPU of compute capability 9.0 (the twins use Hopper's wgmma and bulk tensor
    copies)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1" or not _gluon_imports():
        return False
    return torch.cuda.get_device_capability(device) == (9, 0)
