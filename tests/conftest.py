import os
import sys

import torch

# Without a GPU, Triton kernels run on CPU tensors under the interpreter. It must be switched on
# before triton is first imported; a GPU machine (pytest -m gpu) compiles them for real.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests import each other's input builders (test_ops_delta uses test_reference_delta's).
sys.path.insert(0, os.path.dirname(__file__))
