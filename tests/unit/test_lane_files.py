"""The QEMU lane copies a few test files into its guest (tests/e2e/test_vm.py SIM_FILES) to run
the simulator against the guest's kernel: every module of tests/ that those files import must be
among them, or the guest's pytest stops at collection (it did once, after a conftest import)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_architecture import imported_names

REPO = Path(__file__).resolve().parents[2]


def sim_files() -> tuple[str, ...]:
    tree = ast.parse((REPO / "tests/e2e/test_vm.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "SIM_FILES" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple)
            return tuple(str(v) for v in value)
    raise AssertionError("tests/e2e/test_vm.py has no SIM_FILES")


def imported_test_modules(rel: str) -> set[str]:
    """The files of tests/ that ``rel`` imports (any depth, lazy ones too)."""
    out = set()
    for name in imported_names(ast.parse((REPO / rel).read_text())):
        if name.startswith("tests."):
            path = name.replace(".", "/")
            out.add(f"{path}.py" if (REPO / f"{path}.py").is_file() else f"{path}/__init__.py")
    return out


def test_the_guest_gets_every_test_module_its_files_import() -> None:
    files = set(sim_files())
    missing = {
        f"{rel} imports {dep}" for rel in files for dep in imported_test_modules(rel) - files
    }
    assert missing == set()


def test_the_check_sees_a_missing_import() -> None:
    files = set(sim_files()) - {"tests/integration/machine.py"}
    assert "tests/integration/machine.py" in set().union(*(imported_test_modules(f) for f in files))
