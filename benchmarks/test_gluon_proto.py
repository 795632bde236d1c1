"""The Gluon sweep prototype (benchmarks/gluon_sweep_proto.py) compiles for sm_90 with no GPU.

Gluon kernels do not run under the Triton interpreter, so CI cannot run them; this keeps them
compiling (a layout or API mistake fails here) and checks what ptxas made of them: no spills, and
the shared memory within the H200's 227 KB a program. Their results are checked on the GPU, against
the Triton sweep, by the benchmark itself.

Not part of the default test run (pyproject's testpaths are tests/ and recurscan/): it sits next to
the prototype and runs by hand, with or without a GPU,
``python -m pytest benchmarks/test_gluon_proto.py`` from the repository root.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

# Imported, not import-or-skipped: a prototype that no longer imports must fail here, not skip.
from benchmarks import gluon_sweep_proto as gluon_proto

MAX_SHARED = 227 * 1024


def _desc_sig(block):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)
    return f"tensordesc<bf16[{block[0]}, {block[1]}],{layout!r}>"


def _compile(kernel, const):
    sig = dict(k_desc=_desc_sig([64, 128]), q_desc=_desc_sig([64, 128]), v_desc=_desc_sig([64, 64]),
               wy_desc=_desc_sig([64, 64]), aqk_desc=_desc_sig([64, 64]), o_desc=_desc_sig([64, 64]),
               coef="*fp32", ht="*fp32", seg_n="*fp32", T="i32", tc_first="i32", tc_count="i32",
               trigger_dependents="i32", **{name: "constexpr" for name in const})
    names = kernel.arg_names
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("coef", "ht", "seg_n", "T")}
    src = GluonASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in const.items()}, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    return compiled, stack


@pytest.mark.parametrize("kernel, const", [
    ("gluon_sweep_kernel", dict(STAGES=3)),
    ("gluon_sweep_kernel", dict(STAGES=2)),
    ("gluon_ws_sweep_kernel", dict(STAGES=3, OUT_REGS=168)),
], ids=["one_warpgroup_3_stages", "one_warpgroup_2_stages", "two_warpgroups_3_stages"])
def test_gluon_sweep_compiles_for_sm90_without_spills(kernel, const):
    compiled, stack = _compile(getattr(gluon_proto, kernel), dict(H=16, HV=32, K=128, V=128, **const))
    assert stack == 0, f"{kernel}: {stack} B of stack (spills)"
    assert compiled.metadata.shared <= MAX_SHARED, f"{kernel}: {compiled.metadata.shared} B of shared memory"
    assert "wgmma.mma_async" in compiled.asm["ptx"]
