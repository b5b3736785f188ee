"""The settings registry: one class per kind, covering every kind the tuners emit and every kind
the journal accepts; each class with its own read, write, read-back and journal check."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

from gputuned.engine.apply import apply_profile
from gputuned.engine.opcheck import refusal
from gputuned.engine.plan import plan_profile
from gputuned.errors import GputunedError
from gputuned.settings.base import Op, Setting
from gputuned.settings.registry import change_kinds, expand, holds, setting, settings
from gputuned.store.state import GRUB_DROPIN
from tests.faults import FaultKernel, tree_kernel
from tests.unit.test_apply import full_profile, tree_copy
from tests.unit.test_architecture import cycles, import_graph
from tests.unit.test_irqbalance import FakeIrqbalance, running_irqbalance, tree  # noqa: F401
from tests.unit.test_setting_kinds import (
    CG,
    UNIT_CG,
    allowed_op,
    apply_ops,
    fresh,
    host,
    op_of,
    unit_cpu_op,
)

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


# -- one truth: what verify calls in sync is what apply's read-back accepts ---------------------


def _agree(kernel: FaultKernel, op: Op, *, just_written: bool = True) -> tuple[bool, bool]:
    """(verify's answer: the planner's ``held``, per op; apply's read-back answer). A target
    that cannot be read (a cgroup not made yet) holds nothing. Before a write, the read-back
    is asked as it is of anything not just written: irqbalance takes a ban at its next rescan,
    so right after writing one its read-back trusts the write (gputuned/settings/irqbalance.py)."""
    try:
        verify = setting(op.kind).holds_already(kernel, op, op.value)
    except GputunedError:
        verify = False
    try:
        read_back = holds(kernel, op, op.value, just_written=just_written)[0]
    except GputunedError:
        read_back = False
    return verify, read_back


def test_verify_and_apply_read_back_agree_on_every_kind_a_full_plan_writes(
    tmp_path: Path,
) -> None:
    """The widest profile ([neighbours] too) on the H200 tree with a server and a running
    irqbalance: every change planned is written; then plan's in_sync (what verify reports) and
    apply's read-back both say each op holds, and planning again writes nothing."""
    root = tree_copy("h200-vm", tmp_path)
    fake = running_irqbalance(root)
    try:
        prof = full_profile(neighbours={"weight": 50})
        before = plan_profile(tree_kernel(root), prof)
        assert {c.kind for c in before.settings} == PLANNED_KINDS
        kernel = tree_kernel(root)
        written = {c.kind for c in before.settings if not c.in_sync}
        assert written == PLANNED_KINDS - {"controller"}  # the root has cpuset on this tree
        for c in before.settings:
            assert all(
                _agree(kernel, op, just_written=False) == (c.in_sync, c.in_sync) for op in expand(c)
            ), c
        _plan, report = apply_profile(tree_kernel(root), prof)
        assert report.failed == []
        after = plan_profile(tree_kernel(root), prof)
        assert [c.target for c in after.changes] == [], "verify: everything in sync"
        kernel = tree_kernel(root)
        assert all(_agree(kernel, op) == (True, True) for c in after.settings for op in expand(c))
    finally:
        fake.close()


#: The kinds the test above plans; the rest are written op by op below.
PLANNED_KINDS = {
    "sysfs", "pcie", "cgroup", "controller", "mount", "thread", "proc_cgroup", "irqbalance",
    "cgroup_cpu",
}  # fmt: skip


def _borrowed(root: Path) -> Op:
    (root / UNIT_CG.lstrip("/") / "cpuset.cpus").write_text("\n")  # the unit's, empty
    return op_of("borrowed_cpuset", f"{UNIT_CG}/cpuset.cpus", "2-3")


OP_CASES: dict[str, Callable[[Path], Op]] = {
    "unit_cpu": lambda _root: unit_cpu_op(),
    "unit_property": lambda _root: allowed_op([CG]),
    "borrowed_cpuset": _borrowed,
    "file": lambda _root: op_of("file", GRUB_DROPIN, "GRUB_CMDLINE_LINUX_DEFAULT=quiet\n"),
}


@pytest.mark.parametrize("kind", sorted(OP_CASES))
def test_verify_and_apply_read_back_agree_op_by_op(kind: str, tmp_path: Path) -> None:
    """Kinds a plan on a tree does not write (a unit's properties need systemd as PID 1, the
    GRUB drop-in is written by gputunectl bootargs): before the write neither answer says it
    holds; apply's writer writes and reads back; then both say it holds."""
    root, kernel = host(tmp_path, systemd=True)
    op = OP_CASES[kind](root)
    assert _agree(kernel, op, just_written=False) == (False, False)
    report = apply_ops(fresh(kernel), [op], keep_going=False)
    assert report.failed == [] and report.written
    assert _agree(fresh(kernel), op) == (True, True)


def test_every_kind_is_checked_for_agreement() -> None:
    assert PLANNED_KINDS | set(OP_CASES) == set(change_kinds())


def test_no_tuner_says_whether_the_host_holds_its_change() -> None:
    """in_sync is the setting's answer (registry ``held``, set by the planner), never a tuner's."""
    mentions = [p.name for p in (PKG / "tuners").glob("*.py") if "in_sync" in p.read_text()]
    assert mentions == []
