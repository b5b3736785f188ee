"""Revert writes only what gputuned writes: crafted journal entries are refused (finding 13).

Each entry below is valid JSON of the journal's format; before this check, revert wrote each of
them as root (here: into the tree). Real entries, from a real apply of the widest profile, all
pass the check (test_every_entry_apply_makes_passes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gputuned.engine.apply import apply_profile, revert_all
from gputuned.engine.journal import Journal
from gputuned.store.state import JOURNAL
from tests.faults import tree_kernel
from tests.unit.test_apply import digest, full_profile, tree_copy

GPU_CONFIG = "/sys/devices/pci0000:00/0000:00:06.0/config"


def entry(kind: str, path: str, old: str, new: str = "x", **data: Any) -> dict[str, Any]:
    return {
        "key": f"{kind}:{path}:{old[:8]}", "tuner": "t", "target": "t", "kind": kind,
        "path": path, "value": new, "compare": "text", "data": data, "old": old,
    }  # fmt: skip


CRAFTED = {
    "sysfs-etc": entry("sysfs", "/etc/passwd", "root::0:0::/:/bin/sh\n"),
    "sysfs-dotdot": entry("sysfs", "/proc/irq/../../etc/passwd", "x"),
    "file-cron": entry("file", "/etc/cron.d/pwn", "* * * * * root sh -c id\n"),
    "cgroup-etc": entry("cgroup", "/etc/ssh", "\0absent", "present"),
    "pcie-header": entry("pcie", GPU_CONFIG, "0", "0", offset=0x04, mask=0xFFFF, shift=0, value=0),
    "mount-root": entry("mount", "/", "rw,nosuid", "rw", fstype="ext4"),
    "controller-other": entry(
        "controller",
        "/sys/fs/cgroup/cgroup.subtree_control",
        "\0absent",
        "present",
        controller="memory",
    ),
    "nice-no-pid": entry("nice", "", "-20", "-20"),
    "malformed": {"key": "k", "old": "x"},
}


def craft(root: Path, records: list[dict[str, Any]]) -> Path:
    path = root / JOURNAL.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines = [json.dumps({"v": 1, "op": "save", "entry": r}) for r in records]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_a_crafted_entry_is_refused_and_reported(tmp_path: Path, name: str) -> None:
    root = tree_copy("h200-captured", tmp_path)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/passwd").write_text("root:x:0:0::/root:/bin/bash\n")
    before = digest(root)
    journal = craft(root, [CRAFTED[name]])
    text = journal.read_text()
    report = revert_all(tree_kernel(root))
    assert digest(root) == before, "nothing written"
    assert (root / "etc/passwd").read_text() == "root:x:0:0::/root:/bin/bash\n"
    assert not (root / "etc/cron.d").exists() and not (root / "etc/ssh").exists()
    assert [f["target"] for f in report.failed] == [f"{JOURNAL} line 1"]
    assert "refused, not restored" in report.failed[0]["error"]
    assert journal.read_text() == text, "kept for a person to look at"


def test_refused_lines_do_not_stop_the_others(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    apply_profile(tree_kernel(root), full_profile())
    good = (root / JOURNAL.lstrip("/")).read_text()
    bad = json.dumps({"v": 1, "op": "save", "entry": CRAFTED["sysfs-etc"]})
    (root / JOURNAL.lstrip("/")).write_text(bad + "\n" + good)
    report = revert_all(tree_kernel(root))
    assert digest(root) == before, "every real entry restored"
    assert len(report.failed) == 1 and report.restored


def test_every_entry_apply_makes_passes(tmp_path: Path) -> None:
    for tree in ("h200-captured", "dual-socket-8gpu", "degraded-link"):
        root = tree_copy(tree, tmp_path / tree)
        apply_profile(tree_kernel(root), full_profile())
        journal = Journal(tree_kernel(root))
        assert journal.rejected == [] and len(journal) > 10, tree
        assert revert_all(tree_kernel(root)).failed == []
