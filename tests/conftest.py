import os

import torch

# Without a GPU, Triton kernels run on CPU tensors under the interpreter. It must be switched on
# before triton is first imported; a GPU machine (pytest -m gpu) compiles them for real.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# What tests share (tolerances, input builders) lives in tests/helpers: ``from tests.helpers...``
# (tests/ is a package, so pytest puts the repository root on sys.path).
