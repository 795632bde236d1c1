"""The package's layout as a specification (docs/architecture.md): imports run one way, and no
module grows past what one reader holds in mind.

    ops -> autograd -> launch -> kernels;  plan, problem, descriptors below them;
    reference imports neither Triton nor kernels; kernels import nothing of the package;
    plan never launches (imports no launch, runtime, kernels or ops).
"""
import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "recurscan"


def _imports(path: pathlib.Path) -> set[str]:
    """The absolute module names a file imports (relative imports resolved against its package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)  # `from . import x` names a module
    return names


def _room(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


FORBIDDEN = {  # room -> the package modules (prefixes) it must not import
    "reference": ("recurscan.kernels", "recurscan.launch", "recurscan.runtime", "recurscan.ops", "recurscan.plan",
                  "recurscan.autograd", "triton"),
    "kernels": ("recurscan.ops", "recurscan.plan", "recurscan.launch", "recurscan.runtime", "recurscan.autograd",
                "recurscan.problem", "recurscan.reference"),
    "plan": ("recurscan.launch", "recurscan.runtime", "recurscan.kernels", "recurscan.ops", "recurscan.autograd"),
    "launch": ("recurscan.ops", "recurscan.autograd"),
    "runtime": ("recurscan.ops", "recurscan.launch", "recurscan.autograd", "recurscan.plan"),
    "problem": ("recurscan.ops", "recurscan.launch", "recurscan.kernels", "recurscan.runtime", "triton"),
    "descriptors": ("recurscan.ops", "recurscan.launch", "recurscan.kernels", "recurscan.runtime", "triton"),
    "algebra": ("recurscan.",),
}

FILES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_one_way(path):
    banned = FORBIDDEN.get(_room(path), ())
    bad = sorted(m for m in _imports(path) if any(m == b or m.startswith(b.rstrip(".") + ".") or
                                                   (b.endswith(".") and m.startswith(b)) for b in banned))
    assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_800_lines(path):
    assert len(path.read_text().splitlines()) <= 800
