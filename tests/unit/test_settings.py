"""The settings registry: one class per kind, covering every kind the tuners emit and every kind
the journal accepts; each class with its own read, write, read-back and journal check."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gputuned.engine.opcheck import refusal
from gputuned.engine.plan import plan_profile
from gputuned.settings.base import Op, Setting
from gputuned.settings.registry import change_kinds, expand, settings
from tests.faults import tree_kernel
from tests.unit.test_apply import full_profile
from tests.unit.test_architecture import cycles, import_graph
from tests.unit.test_irqbalance import FakeIrqbalance, tree  # noqa: F401  (the fixture)

PKG = Path(__file__).resolve().parents[2] / "gputuned"
#: Every kind of setting the journal holds, one class each in gputuned/settings/.
KINDS = {
    "sysfs",
    "cgroup_cpu",
    "unit_cpu",
    "pcie",
    "cgroup",
    "controller",
    "file",
    "mount",
    "nice",
    "affinity",
    "policy",
    "proc_cgroup",
    "irqbalance",
    "borrowed_cpuset",
    "unit_property",
}


def test_the_registry_has_every_kind_once() -> None:
    assert set(settings()) == KINDS
    assert set(change_kinds()) == KINDS - {"nice", "affinity", "policy"} | {"thread"}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_reads_writes_and_checks_its_own(kind: str) -> None:
    cls = type(settings()[kind])
    for method in ("read", "write", "refusal"):
        assert getattr(cls, method) is not getattr(Setting, method), f"{kind}: no {method}"
    assert cls.what, f"{kind}: say what it writes"


def _literal_kinds(call: str, position: int) -> set[str]:
    """Kind strings written in the source: ``call(..., kind="...")`` or its positional one."""
    out: set[str] = set()
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == call):
                continue
            args = [k.value for k in node.keywords if k.arg == "kind"]
            args += node.args[position : position + 1]
            out |= {a.value for a in args if isinstance(a, ast.Constant)}
    return out


def test_every_kind_written_in_gputuned_is_registered() -> None:
    """Every Change(kind=...) a tuner writes and every op built outside a setting."""
    changes = _literal_kinds("Change", 8)
    ops = _literal_kinds("Op", 3) | _literal_kinds("_op", 1)  # revert's give-backs: _op()
    assert {"pcie", "controller", "mount", "thread", "proc_cgroup", "irqbalance"} <= changes
    assert {"file", "proc_cgroup"} <= ops  # bootargs' drop-in, revert's give-backs
    assert changes <= set(change_kinds()) and ops <= set(settings())


def test_every_kind_a_full_plan_emits_is_registered(
    tree: tuple[Path, FakeIrqbalance],  # noqa: F811  (test_irqbalance's fixture)
) -> None:
    """The widest profile on a tree with a server and a running irqbalance."""
    root, _irqbalance = tree
    plan = plan_profile(tree_kernel(root), full_profile())
    kinds = {c.kind for c in plan.settings}
    assert kinds >= {"sysfs", "pcie", "cgroup", "controller", "mount", "thread"}
    assert kinds >= {"proc_cgroup", "irqbalance"}
    assert kinds <= set(change_kinds())
    ops = {op.kind for c in plan.settings for op in expand(c)}
    assert ops >= {"nice", "affinity", "policy"} and ops <= set(settings())


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_journal_knows_every_kind(kind: str) -> None:
    op = Op("k", "t", "target", kind, "/etc/passwd", "x")
    why = refusal(op, "x")
    assert why is not None and "unknown kind" not in why  # its class refuses it, by its form


def test_the_journal_refuses_a_kind_gputuned_does_not_have() -> None:
    assert (
        refusal(Op("k", "t", "target", "shell", "/bin/sh", "x"), "x") == "an unknown kind 'shell'"
    )


def test_the_registry_imports_make_no_cycle() -> None:
    """The registry imports the settings modules by name (importlib), which the import graph of
    test_architecture cannot see: with those edges added, there is still no cycle."""
    graph = import_graph()
    modules = {m for m in graph if m.startswith("gputuned.settings.")}
    graph["gputuned.settings.registry"] |= modules - {"gputuned.settings.registry"}
    assert cycles(graph) == []
