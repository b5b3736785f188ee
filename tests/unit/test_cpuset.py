"""The cpuset tuner next to another partition (finding F1, docs/dev/reliability.md), and its order.

Plan refuses CPUs that another valid partition holds, and then apply writes nothing at all;
the writes go exclusive CPUs, cpuset.cpus, partition type, and revert undoes them in reverse.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.cli import main as cli
from gputuned.engine.apply import apply_profile, revert_all
from gputuned.engine.plan import plan_profile
from gputuned.profile.load import load_profile
from gputuned.settings.registry import expand
from gputuned.store.state import JOURNAL
from tests.faults import tree_kernel
from tests.unit.test_apply import PROFILES, digest, full_profile, tree_copy

CG = "/sys/fs/cgroup"
NEIGHBOUR = f"{CG}/f1-neighbour"
SHARED = PROFILES / "shared-host.toml"  # partition 1-8 on h200-captured


def neighbour(root: Path, cpus: str, mode: str = "root", *, exclusive: bool = True) -> None:
    """Another cgroup's partition, made as its owner would (through the tree's kernel)."""
    h = tree_kernel(root)
    h.mkdir(NEIGHBOUR)
    h.write_text(f"{NEIGHBOUR}/cpuset.cpus", cpus)
    if exclusive:
        h.write_text(f"{NEIGHBOUR}/cpuset.cpus.exclusive", cpus)
    h.write_text(f"{NEIGHBOUR}/cpuset.cpus.partition", mode)
    assert h.read_value(f"{NEIGHBOUR}/cpuset.cpus.partition") == mode


def state(root: Path) -> str:
    return (root / NEIGHBOUR.lstrip("/") / "cpuset.cpus.partition").read_text()


@pytest.mark.parametrize("exclusive", [True, False])
def test_plan_refuses_cpus_another_partition_holds_and_apply_writes_nothing(
    exclusive: bool, tmp_path: Path
) -> None:
    root = tree_copy("h200-captured", tmp_path)
    neighbour(root, "1-2", exclusive=exclusive)
    before = digest(root)
    profile = load_profile(SHARED)

    with pytest.raises(errors.PlanError) as info:
        plan_profile(tree_kernel(root), profile)
    msg = str(info.value)
    assert msg.startswith("profile 'shared-host' cannot be applied on this host; nothing was")
    assert "CPUs 1-2 of set 'inference' (1-8) are held by another valid partition: " in msg
    assert f"{NEIGHBOUR} (root, holds 1-2)" in msg
    assert "Give [cpusets.inference] other CPUs (leave out 1-2)" in msg
    assert f"echo member > {NEIGHBOUR}/cpuset.cpus.partition" in msg
    assert info.value.exit_code == 4

    # Shown, not raised, for plan and verify: the partition's changes and the blocking refusal.
    shown = plan_profile(tree_kernel(root), profile, allow_blocked=True)
    (blocked,) = shown.blocked
    assert (blocked.tuner, blocked.target, blocked.blocking) == (
        "cpuset",
        "partition gputuned.inference",
        True,
    )
    assert any(c.target == "gputuned.inference cpuset.cpus" for c in shown.changes)
    assert shown.to_json()["blocked"] is True

    host = tree_kernel(root)
    with pytest.raises(errors.PlanError):
        apply_profile(host, profile)
    assert host.writes == []
    assert digest(root) == before
    assert not (root / JOURNAL.lstrip("/")).exists()
    assert state(root) == "root\n"


def test_partitions_that_do_not_count(tmp_path: Path) -> None:
    """Other CPUs, an invalid partition, our own partition, a report-only cpuset."""
    profile = load_profile(SHARED)
    root = tree_copy("h200-captured", tmp_path / "a")
    neighbour(root, "9-10")  # none of 1-8
    assert plan_profile(tree_kernel(root), profile).blocked == []

    root = tree_copy("h200-captured", tmp_path / "b")
    neighbour(root, "1-2")
    (root / NEIGHBOUR.lstrip("/") / "cpuset.cpus.partition").write_text("root invalid\n")
    assert (
        plan_profile(tree_kernel(root), profile).blocked == []
    )  # an invalid partition holds nothing

    root = tree_copy("h200-captured", tmp_path / "c")
    apply_profile(
        tree_kernel(root), profile
    )  # ours now holds 1-8: re-planning is not blocked by it
    assert plan_profile(tree_kernel(root), profile).blocked == []
    assert revert_all(tree_kernel(root)).failed == []

    root = tree_copy("h200-captured", tmp_path / "d")
    neighbour(root, "3")
    data = profile.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["cpuset"]["report_only"] = True
    quiet = type(profile).model_validate(data)
    plan = plan_profile(tree_kernel(root), quiet)
    (r,) = [r for r in plan.refused if r.tuner == "cpuset"]
    assert not r.blocking and r.reason.startswith("report only: CPUs 3 of set 'inference'")


def test_cli_plan_and_apply_on_a_neighbours_cpus_exit_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_copy("h200-captured", tmp_path)
    neighbour(root, "2", "isolated")
    before = digest(root)

    rc = cli.main(["plan", str(SHARED), "--root", str(root), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 4 and out["blocked"] is True
    (r,) = [r for r in out["refused"] if r["blocking"]]
    assert f"{NEIGHBOUR} (isolated, holds 2)" in r["reason"]

    rc = cli.main(["plan", str(SHARED), "--root", str(root)])
    text = " ".join(capsys.readouterr().out.split())
    assert rc == 4 and "blocked cpuset partition gputuned.inference: CPUs 2" in text
    assert "apply refuses this profile here and writes nothing" in text

    rc = cli.main(["apply", str(SHARED), "--root", str(root)])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 4 and "gputunectl apply: profile 'shared-host' cannot be applied" in err
    assert "Give [cpusets.inference] other CPUs" in err  # not eaten as console markup
    assert digest(root) == before and state(root) == "isolated\n"


def test_partition_writes_exclusive_first_and_revert_in_reverse(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    profile = full_profile()
    g = f"{CG}/gputuned.inference"
    names = {
        f"{g}:mkdir": "mkdir",
        f"{g}/cpuset.cpus.exclusive": "exclusive",
        f"{g}/cpuset.cpus": "cpus",
        f"{g}/cpuset.cpus.partition": "type",
        f"{g}:rmdir": "rmdir",
    }

    planned = [
        names[op.path] for ch in plan_profile(tree_kernel(root), profile).changes for op in expand(ch)
        if op.path in names
    ]  # fmt: skip
    assert planned == ["exclusive", "cpus", "type"]

    host = tree_kernel(root)
    apply_profile(host, profile)
    assert [names[w.path] for w in host.writes if w.path in names] == [
        "mkdir",
        "exclusive",
        "cpus",
        "type",
    ]
    undo = tree_kernel(root)
    assert revert_all(undo).failed == []
    # The partition ends first; the exclusive claim is let go after cpuset.cpus.
    assert [names[w.path] for w in undo.writes if w.path in names] == [
        "type",
        "cpus",
        "exclusive",
        "rmdir",
    ]
    assert digest(root) == before


def test_revert_of_a_removed_cgroups_files_counts_them_done(tmp_path: Path) -> None:
    """A cgroup of gputuned's that is gone (removed while its cpuset files were still
    journaled: the QEMU lane's in-place phase left such a journal) takes its values with it:
    revert says so and ends clean instead of failing on ENOENT and keeping the entries."""
    root = tree_copy("h200-captured", tmp_path)
    apply_profile(tree_kernel(root), full_profile())
    group = root / CG.lstrip("/") / "gputuned.inference"
    assert (group / "cpuset.cpus.partition").read_text().strip() == "isolated"
    for f in group.iterdir():
        f.unlink()
    group.rmdir()

    rep = revert_all(tree_kernel(root))
    assert rep.failed == []
    gone = [n for n in rep.notes if "gputuned.inference no longer exists" in n]
    assert len(gone) == 3, rep.notes  # cpuset.cpus, .exclusive and .partition
    assert not (root / JOURNAL.lstrip("/")).exists()  # nothing left for a later apply
    assert not group.exists()


def test_revert_when_the_root_no_longer_enables_cpuset_counts_the_files_done(
    tmp_path: Path,
) -> None:
    """systemd writes "-cpuset" at the root when no unit needs it any more (the QEMU lane's
    guest, after a unit's AllowedCPUs= went): the partition's cpuset files go with it."""
    root = tree_copy("h200-captured", tmp_path)
    apply_profile(tree_kernel(root), full_profile())
    tree_kernel(root).write_text(f"{CG}/cgroup.subtree_control", "-cpuset")
    assert not (root / CG.lstrip("/") / "gputuned.inference/cpuset.cpus").exists()

    rep = revert_all(tree_kernel(root))
    assert rep.failed == []
    said = [n for n in rep.notes if "has no cpuset controller now" in n]
    assert len(said) == 3, rep.notes
    assert not (root / CG.lstrip("/") / "gputuned.inference").exists()
