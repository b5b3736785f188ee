"""scripts/mutate.py, the project's mutation testing: its mutants are real changes, and the
equivalent mutants the docs name still exist (a stale entry would hide a new survivor)."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

TOP = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutate", TOP / "scripts" / "mutate.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mutate"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


mutate = _script()


@pytest.mark.parametrize("module", mutate.CORE)
def test_every_mutant_compiles_and_changes_the_code(module: str) -> None:
    """A mutant that does not compile would count as killed for nothing; one that leaves the
    text as it was would survive for nothing."""
    text = (TOP / module).read_text()
    mutants = mutate.mutants_of(module)
    assert mutants, f"{module}: no mutants"
    for m in mutants:
        changed = m.apply(text)
        assert changed != text, m.key
        compile(changed, module, "exec", dont_inherit=True)


def test_mutant_kinds_cover_the_operators_the_docs_name() -> None:
    """revert.py has comparisons, boolean operators, `not`, constants and statements to drop."""
    kinds = {m.kind for m in mutate.mutants_of("gputuned/engine/revert.py")}
    assert {"cmp", "bool", "not", "const", "drop"} <= kinds


def test_log_calls_docstrings_and_messages_are_not_mutated() -> None:
    """Only behaviour is mutated: removing a log call or rewording a message is no bug a unit
    test should pin."""
    for m in mutate.mutants_of("gputuned/engine/revert.py"):
        assert not m.before.startswith(("log.", "logger.")), m.key
        assert not m.before.startswith(('"""', 'f"')), m.key


def test_equivalent_mutants_named_in_the_docs_still_exist() -> None:
    """Each entry of scripts/mutate-equivalent/*.toml names a mutant the script still makes and
    says why no test can tell it apart."""
    live = {m.key for mod in mutate.CORE for m in mutate.mutants_of(mod)}
    entries = [
        (f.name, e)
        for f in sorted((TOP / "scripts" / "mutate-equivalent").glob("*.toml"))
        for e in tomllib.loads(f.read_text()).get("equivalent", [])
    ]
    stale = [(name, e["mutant"]) for name, e in entries if e["mutant"] not in live]
    assert stale == []
    assert all(len(e.get("why", "").split()) >= 5 for _, e in entries)


def test_each_modules_file_names_a_core_module_and_tests_that_exist() -> None:
    """A file of scripts/mutate-equivalent/ belongs to a module the script mutates (one left
    behind by a move would hold nothing), and its ``also`` tests exist and are run first for
    that module's mutants outside functions."""
    for f in sorted((TOP / "scripts" / "mutate-equivalent").glob("*.toml")):
        owner = [m for m in mutate.CORE if mutate._toml_of(m) == f]
        assert owner, f"{f.name}: no module of CORE"
        also = tomllib.loads(f.read_text()).get("also", [])
        assert all((TOP / t.split("::")[0]).is_file() for t in also), (f.name, also)
        assert mutate._declared_tests(owner[0]) == also
    assert mutate._declared_tests("gputuned/profile/tables/irq.py") == [
        "tests/unit/test_profile.py"
    ]
