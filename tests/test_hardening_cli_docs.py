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
# 1. The command line: a usage mistake is one line on stderr and exit status 2
# ------------------------------------------------------------------------------------------------

FAMILY_NAMES = ("gdn", "gdp", "ssd", "gla-scalar", "gla-per-key", "diagonal", "gdn-decode")  # for --family
FAST = ["--tokens", "3", "--repeats", "1", "--family", "diagonal"]

USAGE_MISTAKES = {
    "no repeats": ["--repeats", "0"],
    "negative repeats": ["--repeats", "-2"],
    "no tokens": ["--tokens", "0"],
    "tokens not a number": ["--tokens", "many"],
    "device that does not exist": ["--device", "banana"],
    "device kind without kernels": ["--device", "meta"],
    "family by substring": ["--family", "gla"],
    "family misspelled": ["--family", "gdnn"],
    "unknown option": ["--tokenz", "4"],
}


def run_cli_expecting_usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{captured.err}"
    assert "Traceback" not in captured.err
    assert captured.out == ""
    return lines[0]


@pytest.mark.parametrize("argv", USAGE_MISTAKES.values(), ids=USAGE_MISTAKES.keys())
def test_a_usage_mistake_is_one_line_on_stderr_and_exit_status_2(argv, capsys):
    line = run_cli_expecting_usage_error(FAST + argv, capsys)
    assert line.startswith("recurscan: error: ")
    option = argv[0]
    assert option in line  # the line names the option that was wrong


def test_repeats_must_be_at_least_one(capsys):
    line = run_cli_expecting_usage_error(FAST + ["--repeats", "0"], capsys)
    assert "--repeats" in line and ">= 1" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_is_a_usage_error(device, capsys):
    line = run_cli_expecting_usage_error(FAST + ["--device", device], capsys)
    assert "no CUDA GPU" in line and "--device cpu" in line


def test_an_unknown_family_lists_the_valid_names(capsys):
    line = run_cli_expecting_usage_error(FAST + ["--family", "gla"], capsys)
    for name in FAMILY_NAMES:
        assert name in line


def test_family_matches_exactly_not_by_substring(capsys):
    assert main(["--device", "cpu", "--tokens", "3", "--repeats", "1", "--family", "gdn"]) == 0
    rows = [line.split()[0:2] for line in capsys.readouterr().out.splitlines()]
    assert ["gdn", "T3"] in rows
    assert ["gdn", "decode"] not in rows  # "gdn decode" is a family of its own: --family gdn-decode


@pytest.mark.parametrize("tokens", [1, 2, 3, 4])
def test_tiny_token_counts_run_every_workload(tokens, capsys):
    """The gdp workload packs three sequences into T tokens: below T = 3 the later ones are empty."""
    assert main(["--device", "cpu", "--tokens", str(tokens), "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    for family in ("gdn", "gdp (M=2)", "ssd", "gla scalar", "gla per-key", "diagonal", "gdn decode"):
        assert f"\n{family} " in out


def test_the_header_names_the_backend_and_device_that_ran(capsys):
    argv = ["--device", "cpu", "--tokens", "3", "--repeats", "1", "--family", "gdn", "--family", "gdn-decode"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "backend torch (PyTorch oracle, chunked form) on cpu: gdn" in out
    assert "backend torch (PyTorch oracle, token loop) on cpu: gdn decode" in out


# ------------------------------------------------------------------------------------------------
# 2. build_chunk_descriptors: a wrong argument is refused, naming the argument
# ------------------------------------------------------------------------------------------------

BAD_DESCRIPTOR_ARGUMENTS = [
    # (id, arguments, error type, how the message starts: the argument's name)
    ("fractional boundary", dict(cu_seqlens=[0, 1.5, 70]), TypeError, "cu_seqlens: "),
    ("float boundary", dict(cu_seqlens=[0, 64.0]), TypeError, "cu_seqlens: "),
    ("bool boundary", dict(cu_seqlens=[0, True, 70]), TypeError, "cu_seqlens: "),
    ("boundaries as a string", dict(cu_seqlens="0,64"), TypeError, "cu_seqlens: "),
    ("a 2-D tensor", dict(cu_seqlens=torch.tensor([[0, 64], [64, 128]])), ValueError, "cu_seqlens: expected a 1-D"),
    ("a float tensor", dict(cu_seqlens=torch.tensor([0.0, 64.0])), TypeError, "cu_seqlens: "),
    ("a bool tensor", dict(cu_seqlens=torch.tensor([False, True])), TypeError, "cu_seqlens: "),
    ("decreasing boundaries", dict(cu_seqlens=[0, 64, 10]), ValueError, "cu_seqlens: "),
    ("negative chunk_size", dict(cu_seqlens=[0, 70], chunk_size=-64), ValueError, "chunk_size: "),
    ("zero chunk_size", dict(cu_seqlens=[0, 70], chunk_size=0), ValueError, "chunk_size: "),
    ("float chunk_size", dict(cu_seqlens=[0, 70], chunk_size=64.0), TypeError, "chunk_size: "),
    ("zero num_householder", dict(cu_seqlens=[0, 70], num_householder=0), ValueError, "num_householder: "),
    ("float num_householder", dict(cu_seqlens=[0, 70], num_householder=2.0), TypeError, "num_householder: "),
    ("bool num_householder", dict(cu_seqlens=[0, 70], num_householder=True), TypeError, "num_householder: "),
    ("negative max_tokens", dict(cu_seqlens=[0, 70], max_tokens=-1), ValueError, "max_tokens: "),
    ("float max_tokens", dict(cu_seqlens=[0, 70], max_tokens=100.5), TypeError, "max_tokens: "),
    ("max_tokens as a string", dict(cu_seqlens=[0, 70], max_tokens="100"), TypeError, "max_tokens: "),
    ("max_tokens below the tokens", dict(cu_seqlens=[0, 70], max_tokens=69), ValueError, "max_tokens: "),
]


@pytest.mark.parametrize("arguments, error, starts", [case[1:] for case in BAD_DESCRIPTOR_ARGUMENTS],
                         ids=[case[0] for case in BAD_DESCRIPTOR_ARGUMENTS])
def test_build_chunk_descriptors_refuses_a_wrong_argument_by_name(arguments, error, starts):
    with pytest.raises(error, match=f"^{starts}"):
        build_chunk_descriptors(**arguments)


BOUNDARIES = [0, 1, 70, 70, 200]
ACCEPTED_BOUNDARIES = {
    "list": BOUNDARIES,
    "tuple": tuple(BOUNDARIES),
    "int32 tensor": torch.tensor(BOUNDARIES, dtype=torch.int32),
    "int64 tensor": torch.tensor(BOUNDARIES, dtype=torch.int64),
}
if torch.cuda.is_available():
    ACCEPTED_BOUNDARIES["CUDA int32 tensor"] = torch.tensor(BOUNDARIES, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("cu_seqlens", ACCEPTED_BOUNDARIES.values(), ids=ACCEPTED_BOUNDARIES.keys())
def test_build_chunk_descriptors_takes_int_sequences_and_1d_int_tensors_alike(cu_seqlens):
    got = build_chunk_descriptors(cu_seqlens, num_householder=3, max_tokens=256)
    want = build_chunk_descriptors(BOUNDARIES, num_householder=3, max_tokens=256)
    for name, a, b in zip(got._fields, got, want):
        assert torch.equal(a, b), name
    assert got.chunk_offsets.tolist() == [0, 1, 3, 3, 6]


# ------------------------------------------------------------------------------------------------
# 3. fused_recurrent_gated_delta_rule: an unknown keyword is a TypeError whatever its value
# ------------------------------------------------------------------------------------------------

def decode_inputs():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 3, 2, 8, generator=gen), torch.randn(1, 3, 2, 8, generator=gen)
    v = torch.randn(1, 3, 2, 8, generator=gen)
    return q, k, v, -torch.rand(1, 3, 2, generator=gen), torch.rand(1, 3, 2, generator=gen)


@pytest.mark.parametrize("name, value", [
    ("use_qk_l2norm_in_kernal", False),  # a misspelling, at a "harmless" value
    ("use_qk_l2norm_in_kernal", None),
    ("use_qk_l2norm_in_kernal", True),
    ("initial_states", None),
    ("x", 1),
])
def test_an_unknown_keyword_is_a_type_error_whatever_its_value(name, value):
    message = f"fused_recurrent_gated_delta_rule() got an unexpected keyword argument '{name}'"
    with pytest.raises(TypeError, match=re.escape(message)):
        recurscan.fused_recurrent_gated_delta_rule(*decode_inputs(), **{name: value})


FLA_OPTIONS = [
    # fla 0.6's options that recurscan does not implement: (name, its no-op default, a value that acts)
    ("gv", None, torch.zeros(1, 3, 2, 8)),
    ("use_gate_in_kernel", False, True),
    ("A_log", None, torch.zeros(2)),
    ("dt_bias", None, torch.zeros(2)),
    ("use_beta_sigmoid_in_kernel", False, True),
    ("allow_neg_eigval", False, True),
]


@pytest.mark.parametrize("name, default, acting", FLA_OPTIONS, ids=[o[0] for o in FLA_OPTIONS])
def test_fla_options_are_accepted_at_their_no_op_default_and_refused_when_set(name, default, acting):
    want, _ = recurscan.fused_recurrent_gated_delta_rule(*decode_inputs())
    got, _ = recurscan.fused_recurrent_gated_delta_rule(*decode_inputs(), **{name: default})
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match=f"{name}: fla option"):
        recurscan.fused_recurrent_gated_delta_rule(*decode_inputs(), **{name: acting})


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


@pytest.mark.parametrize("imported_first", ["triton", "recurscan.kernels.delta.prep"])
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


# ------------------------------------------------------------------------------------------------
# 5. What a user reads: error messages, docstring examples, no internal references
# ------------------------------------------------------------------------------------------------

def test_a_shape_error_names_the_dimensions_not_yet_known_instead_of_none():
    dims = Dims()
    dims.check("q", torch.zeros(1, 4, 2, 8), "B T H K")
    with pytest.raises(ValueError) as error:
        dims.check("v", torch.zeros(1, 5, 3, 8), "B T HV V")
    assert str(error.value) == "v: expected shape [B, T, HV, V] = [1, 4, HV, V], got [1, 5, 3, 8]"


# The Triton kernels and their launches (host side), the direct launcher, the ops' argument checks.
INTERNAL_MODULES = ("recurscan.kernels", "recurscan.launch", "recurscan.runtime.launcher", "recurscan.problem")


def user_facing_modules():
    """recurscan and the modules a user imports or reads about (every one but the internal ones)."""
    names = ["recurscan"] + [m.name for m in pkgutil.walk_packages(recurscan.__path__, "recurscan.")]
    return [name for name in names if not name.startswith(INTERNAL_MODULES)]


def docstring_examples():
    finder = doctest.DocTestFinder()
    tests = []
    for name in user_facing_modules():
        tests += [t for t in finder.find(importlib.import_module(name), name) if t.examples]
    return sorted(tests, key=lambda t: t.name)


EXAMPLES = docstring_examples()


def test_the_public_decode_functions_have_examples():
    documented = {t.name for t in EXAMPLES}
    for name in ("fused_recurrent_gated_delta_rule", "fused_recurrent_gated_delta_product_update",
                 "unfold_householder", "fold_householder"):
        assert f"recurscan.ops.decode.{name}" in documented


@pytest.mark.parametrize("example", EXAMPLES, ids=[t.name for t in EXAMPLES])
def test_a_docstring_example_runs_pasted_into_a_fresh_interpreter(example):
    """Doctest runs an example among its module's globals, which hides a missing import; here it
    runs with none, as in a fresh interpreter: the example imports what it uses."""
    example.globs = {}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = []
    result = runner.run(example, out=report.append)
    assert result.failed == 0, "".join(report)


INTERNAL_REFERENCES = re.compile(r"\bseeds? 00\d|\bshared/")


@pytest.mark.parametrize("module", user_facing_modules())
def test_docstrings_do_not_point_users_at_internal_seeds_or_a_shared_folder(module):
    found = []
    for test in doctest.DocTestFinder(exclude_empty=False).find(importlib.import_module(module), module):
        if test.docstring and INTERNAL_REFERENCES.search(test.docstring):
            found.append(f"{test.name}: {INTERNAL_REFERENCES.search(test.docstring).group()}")
    assert not found


def test_readme_does_not_point_users_at_internal_seeds_or_a_shared_folder():
    assert not INTERNAL_REFERENCES.search((ROOT / "README.md").read_text())


def test_readme_says_how_to_get_the_cpu_build_of_pytorch():
    readme = (ROOT / "README.md").read_text()
    assert "--index-url https://download.pytorch.org/whl/cpu" in readme
    # The two set-up commands CI runs (.ci/run) are unchanged.
    assert "    python3 -m pip install -r requirements/cpu.txt -e . && recurscan\n" in readme
    assert '    python3 -m pip install -r requirements/cpu.txt -e ".[test]" && python3 -m pytest -q -n auto\n' in readme
