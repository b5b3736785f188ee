"""A table is one declaration: `[irq_pin]`, declared in this file and nowhere in gputuned/,
is checked, planned, applied, verified and reverted on a captured tree through the commands a
user runs, and shows up in the schema and the manual (docs/dev/add-a-kind.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from gputuned.changes import Change, TunerPlan
from gputuned.cli import main as cli
from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.profile import tables as declared
from gputuned.profile.schema import profile_schema, render_profile_docs
from gputuned.profile.tables import Ref, Table
from gputuned.tuners.context import PlanContext
from tests.unit.test_apply import digest, tree_copy


class Config(BaseModel):
    """The `[irq_pin]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    irq: int = Field(ge=0, description="The IRQ to pin.")
    cpus: StrictStr = Field(description="CPU set (a [cpusets] name) it goes to.")


def _refs(cfg: Config) -> list[Ref]:
    return [("irq_pin.cpus", cfg.cpus, False)]


TABLE = Table(
    key="irq_pin",
    model=Config,
    summary="One IRQ pinned to a set.",
    manual="Pins one IRQ to the CPUs of a set (a kind declared by a test).",
    position=1000,
    tuner=f"{__name__}:PinTuner",
    plan_rank=1000,
    refs=_refs,
)


class PinTuner:
    name = "irq_pin"

    def plan(self, ctx: PlanContext, planned: Sequence[Change] = ()) -> TunerPlan:
        out = TunerPlan()
        cfg = TABLE.present(ctx.profile)
        if cfg is None:
            return out
        path = f"/proc/irq/{cfg.irq}/smp_affinity_list"
        now = ctx.kernel.read_text(path).strip()
        want = ctx.sets.sets[cfg.cpus]
        out.changes.append(
            Change(
                self.name,
                f"irq {cfg.irq}",
                now,
                format_cpulist(want),
                "profile irq_pin",
                path,
                compare="cpulist",
                in_sync=parse_cpulist(now) == want,
            )
        )
        return out


PROFILE = """name = "pin"
[cpusets.housekeeping]
cpus = "0"
[irq_pin]
irq = 42
cpus = "housekeeping"
"""


@pytest.fixture
def with_table(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    found = declared.tables()
    monkeypatch.setattr(declared, "tables", lambda: (*found, TABLE))
    yield


def _run(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    rc = cli.main([*args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_the_table_is_unknown_without_its_declaration(tmp_path: Path) -> None:
    prof = tmp_path / "pin.toml"
    prof.write_text(PROFILE)
    assert cli.main(["plan", str(prof), "--root", str(tree_copy("h200-captured", tmp_path))]) == 4


def test_a_declared_table_plans_applies_verifies_and_reverts(
    with_table: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_copy("h200-captured", tmp_path)
    irq = root / "proc/irq/42/smp_affinity_list"
    assert irq.read_text() != "0\n"
    before = digest(root)
    prof = tmp_path / "pin.toml"
    prof.write_text(PROFILE)

    rc, plan = _run("plan", str(prof), "--root", str(root), capsys=capsys)
    assert rc == 0
    assert [(c["tuner"], c["wanted"]) for c in plan["changes"]] == [("irq_pin", "0")]  # type: ignore[index, union-attr]
    assert digest(root) == before, "plan writes nothing"

    rc, _ = _run("apply", str(prof), "--root", str(root), capsys=capsys)
    assert rc == 0
    assert irq.read_text() == "0\n"

    rc, report = _run("verify", str(prof), "--root", str(root), capsys=capsys)
    assert rc == 0, report
    irq.write_text("1\n")  # drift
    rc, report = _run("verify", str(prof), "--root", str(root), capsys=capsys)
    assert rc == 1, report

    assert cli.main(["revert", "--root", str(root)]) == 0
    capsys.readouterr()
    assert digest(root) == before


def test_a_declared_table_is_checked_and_documented(with_table: None, tmp_path: Path) -> None:
    prof = tmp_path / "pin.toml"
    prof.write_text(PROFILE.replace('cpus = "housekeeping"', 'cpus = "nosuch"'))
    assert cli.main(["plan", str(prof), "--root", str(tree_copy("h200-captured", tmp_path))]) == 4
    schema = profile_schema()
    assert "irq_pin" in schema["properties"]
    docs = render_profile_docs()
    assert "## `[irq_pin]`" in docs and "Pins one IRQ to the CPUs of a set" in docs
    assert "- `irq_pin`: table; default: not set. One IRQ pinned to a set." in docs


def test_the_tuners_run_in_the_declared_order() -> None:
    from gputuned.engine.plan import all_tuners

    names = [t.name for t in all_tuners()]
    assert sorted(names) == sorted(t.key for t in declared.tables())
    # cpuset before irq (the partition made in place decides where IRQs may go); neighbours
    # after every tuner that places the server; the daemon's refusals last.
    assert names.index("cpuset") < names.index("irq")
    assert names[-2:] == ["neighbours", "daemon"]


def test_what_mypy_sees_of_the_profile_agrees_with_the_declarations() -> None:
    """gputuned/profile/model.py spells the tables' fields once more for mypy only (under
    TYPE_CHECKING); each line there must be a declared table, with its model and its shape."""
    import ast

    from gputuned.profile import model

    tree = ast.parse(Path(model.__file__).read_text())
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    imports = {
        a.asname or a.name: f"{n.module}"
        for n in block.body
        if isinstance(n, ast.ImportFrom)
        for a in n.names
    }
    typed = next(
        n
        for n in tree.body
        if isinstance(n, ast.If)
        and any(isinstance(c, ast.ClassDef) and c.name == "Profile" for c in n.body)
    )
    cls = next(c for c in typed.body if isinstance(c, ast.ClassDef))
    seen = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            seen[stmt.target.id] = ast.unparse(stmt.annotation)
    by_key = {t.key: t for t in declared.tables()}
    assert seen, "the typed view lists the tables"
    for key, text in seen.items():
        table = by_key[key]
        alias = next(a for a in imports if a in text)
        assert imports[alias] == table.model.__module__, key
        shape = (
            f"tuple[{alias}, ...]" if table.many else alias if table.always else f"{alias} | None"
        )
        assert text == shape, key
