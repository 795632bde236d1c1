"""Hardening (issue 17): the command line, the varlen descriptors' arguments, unknown keywords,
the Triton interpreter check, and the docstrings a user reads.

Each section states, as tests, what a user gets for an ordinary mistake: a clear error that names
what was wrong (one line and exit status 2 at the command line), never a traceback from deep
inside, a silently misread argument or a silently ignored keyword.
"""
import doctest
import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import recurscan
from recurscan.cli import main
from recurscan.descriptors import build_chunk_descriptors
from recurscan.problem import Dims

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------
# 4. backend="triton" on CPU tensors needs the interpreter on before triton was imported
# ------------------------------------------------------------------------------------------------

LATE_INTERPRETER = """
import os, torch
import {imported_first}
os.environ["TRITON_INTERPRET"] = "1"  # too late: {imported_first} was imported without it
import recurscan
q, k, v = torch.randn(1, 4, 2, 16), torch.randn(1, 4, 2, 16), torch.randn(1, 4, 2, 16)
g, beta = -torch.rand(1, 4, 2), torch.rand(1, 4, 2)
for op in (recurscan.chunk_gated_delta_rule, recurscan.fused_recurrent_gated_delta_rule):
    try:
        op(q, k, v, g, beta, backend="triton")
        print(op.__name__, "ran")
    except ValueError as error:
        print(op.__name__, "ValueError:", error)
"""


@pytest.mark.parametrize("imported_first", ["triton", "recurscan.kernels.chunk_delta"])
def test_interpreter_switched_on_after_triton_was_imported_is_a_clear_error(imported_first):
    pytest.importorskip("triton")
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", LATE_INTERPRETER.format(imported_first=imported_first)],
                            env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"]
    for line in lines:
        assert "ValueError:" in line and "set TRITON_INTERPRET=1 in the environment before triton is first " \
                                         "imported" in line, line
        assert "after" in line and "was imported" in line, line
