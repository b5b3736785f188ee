"""The journal of original values (gputuned/engine/journal.py), on copies of a host tree.

What a user relies on: every original is on disk, fsynced, before the setting it protects is
written; it survives a restart of gputuned and comes back exactly (the first original wins);
a journal that cannot be read, or an entry that is not one of gputuned's, is never acted on in
silence; and the file of a daemon that places processes for weeks does not grow without bound.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.engine.journal import Journal
from gputuned.settings.base import Op
from gputuned.store import state
from gputuned.store.state import JOURNAL
from tests.conftest import TREES_DIR
from tests.faults import tree_kernel

#: A line as gputuned 1 wrote it (an apply of the full profile on h200-captured): the format
#: documented in journal.py, which a newer gputuned must still read after an upgrade.
V1_LINE = (
    '{"v": 1, "op": "save", "entry": {"key": "sysfs:/proc/irq/42/smp_affinity_list", '
    '"tuner": "irq", "target": "irq 42 (nvidia)", "kind": "sysfs", '
    '"path": "/proc/irq/42/smp_affinity_list", "value": "1", "compare": "cpulist", '
    '"data": {}, "old": "0-15"}}'
)


def copy_tree(dest: Path) -> Path:
    shutil.copytree(TREES_DIR / "h200-captured", dest, symlinks=True)
    return dest


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy of h200-captured for the tests that write only the journal."""
    return copy_tree(tmp_path_factory.mktemp("journal") / "h200-captured")


@pytest.fixture
def root(tree: Path) -> Path:
    """The copy, with no journal yet (the tests using it write nothing but the journal)."""
    shutil.rmtree(tree / "run/gputuned", ignore_errors=True)
    return tree


def irq(n: int, cpus: str = "0") -> Op:
    """The op the IRQ tuner makes for IRQ ``n`` (as in a real journal)."""
    path = f"/proc/irq/{n}/smp_affinity_list"
    return Op(f"sysfs:{path}", "irq", f"irq {n}", "sysfs", path, cpus, "cpulist")


def nice(pid: int, tid: int | None = None) -> Op:
    """A placed process's nice value: a process setting (ends with its process)."""
    tid = pid if tid is None else tid
    return Op(
        f"thread:{pid}:1000:{tid}:nice",
        "process",
        f"pid {pid} nice (thread {tid})",
        "nice",
        "",
        "-10",
        data={"pid": pid, "start": 1000, "tid": tid},
    )


def save(op: Op, old: str) -> dict[str, Any]:
    return {"v": 1, "op": "save", "entry": {**op.to_json(), "old": old}}


def drop(key: str) -> dict[str, Any]:
    return {"v": 1, "op": "drop", "key": key}


def journal_file(root: Path) -> Path:
    return root / JOURNAL.lstrip("/")


def write_journal(root: Path, records: list[dict[str, Any] | str], *, end: str = "\n") -> Path:
    """The journal file as a crash or a person left it: records (dicts) or raw lines."""
    path = journal_file(root)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + end)
    path.chmod(0o600)
    return path


def lines_of(root: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in journal_file(root).read_text().splitlines()]


def keys(journal: Journal) -> list[str]:
    return [e.op.key for e in journal.entries()]


class Disk:
    """The ``os`` that gputuned's state files are appended through (store/state.py), with each
    fsync recorded (what the write before it wrote) and, on demand, fsync failing with EIO or
    /run full (ENOSPC)."""

    def __init__(self) -> None:
        self.fsynced: list[bytes] = []
        self.writes: list[bytes] = []
        self.fail_fsync: Callable[[bytes], bool] = lambda data: False
        self.full = False

    def write(self, fd: int, data: bytes) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.writes.append(bytes(data))
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        last = self.writes[-1] if self.writes else b""
        if self.fail_fsync(last):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.fsync(fd)
        self.fsynced.append(last)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    d = Disk()
    monkeypatch.setattr(state, "os", d)
    return d


# -- what is saved comes back ---------------------------------------------------------------


def test_a_host_never_tuned_has_an_empty_journal_and_no_file(root: Path) -> None:
    """Reading the journal of a host gputuned never touched (status, plan) finds nothing to
    revert and creates no file."""
    journal = Journal(tree_kernel(root))
    assert len(journal) == 0 and journal.entries() == [] and list(journal.newest_first()) == []
    assert journal.rejected == [] and journal.rejected_report() == []
    assert not journal_file(root).exists()


def test_a_saved_original_and_its_new_value_survive_a_restart(root: Path) -> None:
    """What a revert after a crash or a restart needs is in the file, in the documented format
    (version 1): the op with the value gputuned wrote, and the value from before it."""
    op = irq(42, "1")
    assert Journal(tree_kernel(root)).save(op, "0-15") is True
    assert lines_of(root) == [save(op, "0-15")]
    again = Journal(tree_kernel(root))
    assert op.key in again and len(again) == 1
    entry = again.get(op.key)
    assert entry is not None and entry.old == "0-15"
    assert entry.op == op and entry.op.value == "1" and entry.op.compare == "cpulist"
    assert again.get("sysfs:/proc/irq/43/smp_affinity_list") is None
    assert "sysfs:/proc/irq/43/smp_affinity_list" not in again


def test_a_journal_written_by_gputuned_1_is_read_after_an_upgrade(root: Path) -> None:
    """A daemon upgraded while the host is tuned reads the journal the old one wrote."""
    write_journal(root, [V1_LINE])
    entry = Journal(tree_kernel(root)).get("sysfs:/proc/irq/42/smp_affinity_list")
    assert entry is not None and (entry.old, entry.op.value) == ("0-15", "1")


def test_the_first_original_wins(root: Path) -> None:
    """Re-applying, or switching profiles, never overwrites the value from before gputuned
    touched a setting: a second save of the key records nothing, in memory or on disk, and a
    file that holds two saves of one key gives the first."""
    journal = Journal(tree_kernel(root))
    assert journal.save(irq(42, "1"), "0-15") is True
    text = journal_file(root).read_text()
    assert journal.save(irq(42, "2"), "1") is False
    assert journal_file(root).read_text() == text
    entry = journal.get(irq(42).key)
    assert entry is not None and (entry.old, entry.op.value) == ("0-15", "1")

    write_journal(root, [save(irq(42, "1"), "0-15"), save(irq(42, "2"), "1")])
    entry = Journal(tree_kernel(root)).get(irq(42).key)
    assert entry is not None and (entry.old, entry.op.value) == ("0-15", "1")


def test_a_value_put_back_is_forgotten_for_good(root: Path) -> None:
    """Once revert has put a value back, the key is dropped: a restart does not restore it
    again, and the next apply records the original it finds then."""
    journal = Journal(tree_kernel(root))
    journal.save(irq(42, "1"), "0-15")
    journal.save(irq(43, "2"), "0-15")
    journal.drop(irq(42).key)
    assert irq(42).key not in journal and keys(journal) == [irq(43).key]
    assert keys(Journal(tree_kernel(root))) == [irq(43).key]

    text = journal_file(root).read_text()
    journal.drop(irq(42).key)  # already gone: nothing to record
    journal.drop("sysfs:/proc/irq/99/smp_affinity_list")
    assert journal_file(root).read_text() == text

    assert journal.save(irq(42, "3"), "0-7") is True
    entry = Journal(tree_kernel(root)).get(irq(42).key)
    assert entry is not None and entry.old == "0-7"


def test_revert_undoes_the_newest_change_first(tmp_path: Path) -> None:
    """Entries are kept in the order they were saved, also across a restart, and revert walks
    them newest first (a later write may rest on an earlier one)."""
    from gputuned.engine.revert import revert_all

    root = copy_tree(tmp_path / "h200-captured")
    host = tree_kernel(root)
    journal = Journal(host)
    for n in (24, 25, 26):
        journal.save(irq(n, "0"), "0-15")
        host.write_text(irq(n).path, "0")
    loaded = Journal(tree_kernel(root))
    assert keys(loaded) == [irq(n).key for n in (24, 25, 26)]
    assert [e.op.key for e in loaded.newest_first()] == [irq(n).key for n in (26, 25, 24)]

    host = tree_kernel(root)
    report = revert_all(host)
    assert report.failed == []
    assert [w.path for w in host.writes] == [irq(n).path for n in (26, 25, 24)]
    assert (root / "proc/irq/24/smp_affinity_list").read_text() == "0-15\n"


def test_drop_many_records_each_ended_key_once(root: Path) -> None:
    """The threads of a process that ended are forgotten in one append, one drop per key
    however often it is named; keys the journal does not hold are not recorded."""
    journal = Journal(tree_kernel(root))
    for tid in (5000, 5001, 5002):
        journal.save(nice(5000, tid), "0")
    before = len(lines_of(root))
    journal.drop_many([nice(5000, 5000).key, nice(5000, 5000).key, "nope", nice(5000, 5001).key])
    added = lines_of(root)[before:]
    assert added == [drop(nice(5000, 5000).key), drop(nice(5000, 5001).key)]
    assert keys(journal) == [nice(5000, 5002).key]
    assert keys(Journal(tree_kernel(root))) == [nice(5000, 5002).key]

    text = journal_file(root).read_text()
    journal.drop_many(["nope", nice(5000, 5000).key])
    assert journal_file(root).read_text() == text


# -- durability -----------------------------------------------------------------------------


def test_a_saved_original_is_fsynced_before_save_returns(root: Path, disk: Disk) -> None:
    """The original of a host setting is on disk before the caller may write the setting; a
    process's setting, which ends with its process, is appended without fsync; so are the
    records of values put back (losing one only makes a revert find the value in place)."""
    journal = Journal(tree_kernel(root))
    journal.save(irq(42, "1"), "0-15")
    assert disk.fsynced == [json.dumps(save(irq(42, "1"), "0-15")).encode() + b"\n"]
    journal.save(nice(5000), "0")
    journal.drop(irq(42).key)
    journal.drop_many([nice(5000).key])
    assert len(disk.fsynced) == 1 and len(disk.writes) == 4


def test_deferred_saves_reach_the_disk_in_one_append_at_flush(root: Path, disk: Disk) -> None:
    """A run of IRQ writes is journaled with one append and one fsync (flush), before any of
    them is written; deferred process settings alone are appended without fsync."""
    journal = Journal(tree_kernel(root))
    journal.flush()  # nothing deferred: nothing written
    assert disk.writes == []
    for n in (24, 25, 26):
        assert journal.save(irq(n), "0-15", defer=True) is True
        assert irq(n).key in journal
    assert journal.save(irq(24), "0-15", defer=True) is False
    assert not journal_file(root).exists(), "nothing on disk before flush"
    journal.flush()
    batch = b"".join(json.dumps(save(irq(n), "0-15")).encode() + b"\n" for n in (24, 25, 26))
    assert disk.writes == [batch] and disk.fsynced == [batch]
    assert keys(Journal(tree_kernel(root))) == [irq(n).key for n in (24, 25, 26)]

    journal.save(nice(5000, 5000), "0", defer=True)
    journal.save(nice(5000, 5001), "0", defer=True)
    journal.flush()
    assert len(disk.writes) == 2 and len(disk.fsynced) == 1
    assert len(Journal(tree_kernel(root))) == 5


def test_a_failed_flush_forgets_its_records_and_raises(root: Path, disk: Disk) -> None:
    """When the fsync of deferred saves fails, flush raises and the journal no longer claims
    to hold them: nothing they protect may be written, and a later try journals them again."""
    journal = Journal(tree_kernel(root))
    journal.save(irq(42, "1"), "0-15")
    disk.fail_fsync = lambda data: data.count(b"\n") > 1
    journal.save(irq(24), "0-15", defer=True)
    journal.save(irq(25), "0-15", defer=True)
    with pytest.raises(errors.HostError, match=r"EIO|Input/output"):
        journal.flush()
    assert keys(journal) == [irq(42).key]

    disk.fail_fsync = lambda data: False
    assert journal.save(irq(24), "0-15", defer=True) is True
    journal.flush()
    assert irq(24).key in Journal(tree_kernel(root))


def test_an_fsync_error_on_the_irq_batch_stops_apply_before_any_irq_is_written(
    tmp_path: Path, disk: Disk
) -> None:
    """The journal is fsynced before each write it protects: when the fsync of the IRQ
    batch fails, apply fails without having moved a single IRQ."""
    from gputuned.engine.apply import ApplyError, apply_profile, revert_all
    from gputuned.profile.load import parse_profile

    root = copy_tree(tmp_path / "h200-captured")
    irqs = {p: p.read_bytes() for p in (root / "proc/irq").rglob("*") if p.is_file()}
    profile = {
        "name": "irq",
        "cpusets": {"housekeeping": {"cpus": "0"}, "gpu": {"cpus": "1-4"}},
        "irq": {"gpu_cpus": "gpu", "others_cpus": "housekeeping"},
    }
    disk.fail_fsync = lambda data: data.count(b"\n") > 1
    host = tree_kernel(root)
    with pytest.raises(ApplyError, match="irq"):
        apply_profile(host, parse_profile(profile, "test"))
    assert [w.path for w in host.writes if w.path.startswith("/proc/irq/")] == []
    assert {p: p.read_bytes() for p in irqs} == irqs
    # The batch's lines may be in the file (the fsync failed, not the write): a revert finds
    # those values in place and writes nothing.
    later = tree_kernel(root)
    assert revert_all(later).failed == [] and later.writes == []


def test_a_full_run_does_not_stop_values_being_put_back(
    root: Path, disk: Disk, caplog: pytest.LogCaptureFixture
) -> None:
    """Recording that a value is back may fail (/run full): the value is forgotten all the
    same and the revert goes on, with a warning; the file is left as it was."""
    journal = Journal(tree_kernel(root))
    for n in (24, 25, 26):
        journal.save(irq(n), "0-15")
    text = journal_file(root).read_text()
    disk.full = True
    with caplog.at_level(logging.WARNING, logger="gputuned.engine.journal"):
        journal.drop(irq(24).key)
        journal.drop_many([irq(25).key])
    assert keys(journal) == [irq(26).key]
    assert journal_file(root).read_text() == text
    assert "could not record that sysfs:/proc/irq/24/smp_affinity_list is restored" in caplog.text
    assert "could not record that 1 entries are gone" in caplog.text


# -- a journal that is not as gputuned left it ----------------------------------------------


def test_a_torn_last_line_is_ignored(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A crash during an append leaves part of a line at the end: its write had not started,
    so it is ignored (with a warning) and every line before it is kept."""
    torn = json.dumps(save(irq(25), "0-15"))[:40]
    write_journal(root, [save(irq(24), "0-15"), torn], end="")
    with caplog.at_level(logging.WARNING, logger="gputuned.engine.journal"):
        journal = Journal(tree_kernel(root))
    assert keys(journal) == [irq(24).key] and journal.rejected == []
    assert "ignoring a torn last line" in caplog.text


def _save(journal: Journal) -> None:
    journal.save(irq(26), "0-15")


def _flush(journal: Journal) -> None:
    journal.save(irq(26), "0-15", defer=True)
    journal.flush()


def _drop(journal: Journal) -> None:
    journal.drop(irq(24).key)


def _drop_many(journal: Journal) -> None:
    journal.drop_many([irq(24).key])


#: The first append after a restart, and the IRQs the journal holds after it.
APPENDS: dict[str, tuple[Callable[[Journal], None], list[int]]] = {
    "save": (_save, [24, 26]),
    "flush": (_flush, [24, 26]),
    "drop": (_drop, []),
    "drop_many": (_drop_many, []),
}


@pytest.mark.parametrize("append", sorted(APPENDS))
def test_the_record_after_a_torn_line_is_not_lost(root: Path, append: str) -> None:
    """The first record appended after a torn line is readable, and so is the journal: the
    torn line is cut off first. (Appended to, it took the record with it, and the next one
    made the journal unreadable: revert refused to run until a person fixed it.)"""
    write_journal(root, [save(irq(24), "0-15"), json.dumps(save(irq(25), "0-15"))[:40]], end="")
    first, held = APPENDS[append]
    journal = Journal(tree_kernel(root))
    first(journal)
    wanted = [irq(n).key for n in held]
    assert keys(Journal(tree_kernel(root))) == wanted
    journal.save(irq(27), "0-15")
    assert keys(Journal(tree_kernel(root))) == [*wanted, irq(27).key]
    journal.drop(irq(27).key)  # appended as usual once the torn line is gone
    journal.save(irq(28), "0-15")
    assert lines_of(root)[-3:] == [save(irq(27), "0-15"), drop(irq(27).key), save(irq(28), "0-15")]


def test_a_crash_during_the_first_append_leaves_an_empty_journal(root: Path) -> None:
    """Torn in its first line, the journal holds nothing yet, and reads as empty."""
    write_journal(root, [json.dumps(save(irq(24), "0-15"))[:40]], end="")
    journal = Journal(tree_kernel(root))
    assert journal.entries() == [] and journal.rejected == []


def test_a_corrupt_line_in_the_middle_is_refused_and_named(root: Path) -> None:
    """A line that is not JSON anywhere but at the end is not a crash of gputuned's: the
    journal is refused (gputuned cannot revert what it cannot read) with the line number and
    what to do; once that line is removed by hand, the lines around it load, blank line and
    all."""
    records: list[dict[str, Any] | str] = [
        save(irq(24), "0-15"),
        '{"v": 1, "op": "sa',
        save(irq(25), "0-15"),
    ]
    write_journal(root, records)
    with pytest.raises(
        errors.GputunedError, match=r"journal.jsonl line 2 is corrupt; fix or remove"
    ):
        Journal(tree_kernel(root))
    write_journal(root, [records[0], "", records[2]])
    assert keys(Journal(tree_kernel(root))) == [irq(24).key, irq(25).key]


@pytest.mark.parametrize(
    ("line", "version"),
    [
        ({**save(irq(24), "0-15"), "v": 2}, "2"),
        ({"op": "save", "entry": save(irq(24), "0-15")["entry"]}, "None"),
        ('["save", 1]', "None"),
        ('"save"', "None"),
    ],
    ids=["version-2", "no-version", "a-list", "a-string"],
)
def test_a_journal_of_another_format_is_refused_not_misread(
    root: Path, line: dict[str, Any] | str, version: str
) -> None:
    """A journal of another format version (a downgrade) or a line that is not a record is
    refused as a whole, rather than read as if it were version 1."""
    write_journal(root, [save(irq(25), "0-15"), line])
    with pytest.raises(errors.GputunedError, match=f"unknown journal version {version}"):
        Journal(tree_kernel(root))


def test_records_it_does_not_understand_forget_nothing(root: Path) -> None:
    """A drop must name a key: a drop without one, with a key that is not a string, or a
    record of an operation this version does not know forgets no entry (and stops no load)."""
    write_journal(
        root,
        [
            save(irq(24), "0-15"),
            {"v": 1, "op": "drop"},
            {"v": 1, "op": "drop", "key": [irq(24).key]},
            {"v": 1, "op": "forget", "key": irq(24).key},
        ],
    )
    assert keys(Journal(tree_kernel(root))) == [irq(24).key]


def _entry(**change: Any) -> dict[str, Any]:
    rec = save(irq(24, "0"), "0-15")
    rec["entry"].update(change)
    return rec


REFUSED = {
    "no-entry": ({"v": 1, "op": "save", "entry": None}, "no 'old' value"),
    "no-old": (
        {"v": 1, "op": "save", "entry": irq(24).to_json()},
        "no 'old' value",
    ),
    "old-a-number": (_entry(old=5), "no 'old' value"),
    "unknown-field": (_entry(shell="sh"), "unexpected keyword argument 'shell'"),
    "missing-field": (
        {"v": 1, "op": "save", "entry": {"key": "k", "old": "x"}},
        "missing",
    ),
    "data-a-list": (_entry(data=["pid"]), "data or value of the wrong type"),
    "value-a-number": (_entry(value=3), "data or value of the wrong type"),
    "old-too-long": (_entry(old="0," * 2049), "a value too long"),
    "value-too-long": (_entry(value="0," * 2049), "a value too long"),
    "not-gputuneds": (_entry(path="/etc/passwd"), "is no file gputuned writes"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_entry_is_reported_and_the_rest_still_loads(
    root: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A save that is not a well-formed entry, or names something gputuned does not write, is
    never restored: it is reported with its line number and what to do, logged, and the
    entries around it load."""
    line, why = REFUSED[name]
    write_journal(root, [save(irq(25), "0-15"), line, save(irq(26), "0-15")])
    with caplog.at_level(logging.ERROR, logger="gputuned.engine.journal"):
        journal = Journal(tree_kernel(root))
    assert keys(journal) == [irq(25).key, irq(26).key]
    ((n, reason, raw),) = journal.rejected
    assert n == 2 and why in reason and raw == json.dumps(line).encode()
    ((report,),) = [journal.rejected_report()]
    assert report["target"] == f"{JOURNAL} line 2"
    assert report["error"].startswith(f"refused, not restored: {reason}")
    assert "remove the line by hand" in report["error"]
    assert "line 2 refused, never restored" in caplog.text


# -- compaction ----------------------------------------------------------------------------


def test_compaction_keeps_the_live_entries_and_the_refused_lines(root: Path) -> None:
    """Compaction rewrites the file with what a revert still needs, oldest first, and keeps a
    refused line word for word for a person to look at."""
    bad = json.dumps(_entry(path="/etc/passwd"))
    write_journal(
        root,
        [bad, save(irq(24), "0-15"), save(irq(25), "0-15"), drop(irq(24).key), save(irq(26), "7")],
    )
    journal = Journal(tree_kernel(root))
    journal.compact()
    assert journal_file(root).read_text().splitlines() == [
        bad,
        json.dumps(save(irq(25), "0-15")),
        json.dumps(save(irq(26), "7")),
    ]
    again = Journal(tree_kernel(root))
    assert keys(again) == [irq(25).key, irq(26).key]
    assert [n for n, _, _ in again.rejected] == [1]


def test_compacting_a_journal_with_nothing_left_removes_it(root: Path) -> None:
    """After a full revert the file goes; one with only refused lines left stays."""
    journal = Journal(tree_kernel(root))
    journal.save(irq(24), "0-15")
    journal.drop(irq(24).key)
    journal.compact()
    assert not journal_file(root).exists()

    bad = json.dumps(_entry(path="/etc/passwd"))
    write_journal(root, [bad, save(irq(24), "0-15"), drop(irq(24).key)])
    Journal(tree_kernel(root)).compact()
    assert journal_file(root).read_text() == bad + "\n"


def test_compaction_waits_for_unflushed_records(root: Path) -> None:
    """Compaction never runs while deferred records are not yet on disk: asked directly it
    refuses (a bug in the caller); asked by the daemon's check it waits for the flush."""
    write_journal(root, [save(irq(24), "0-15"), *churn(200)])
    journal = Journal(tree_kernel(root))
    journal.save(irq(25), "0-15", defer=True)
    with pytest.raises(errors.GputunedError, match="unflushed"):
        journal.compact()
    assert journal.compact_if_grown() is False
    journal.flush()
    assert journal.compact_if_grown() is True
    assert keys(Journal(tree_kernel(root))) == [irq(24).key, irq(25).key]


def churn(processes: int) -> list[dict[str, Any]]:
    """What a daemon appends for short-lived processes it placed: a save and a drop each."""
    out: list[dict[str, Any]] = []
    for pid in range(6000, 6000 + processes):
        out += [save(nice(pid), "0"), drop(nice(pid).key)]
    return out


@pytest.mark.parametrize(("extra", "compacted"), [([drop("gone")], False), (churn(1), True)])
def test_a_daemons_journal_is_compacted_once_it_outgrows_its_slack(
    root: Path, extra: list[dict[str, Any]], compacted: bool
) -> None:
    """The daemon's journal is rewritten once it holds more than 256 lines beyond twice its
    live entries, and not before: here 3 live entries, 262 lines (kept) or 263 (compacted)."""
    live = [save(irq(n), "0-15") for n in (24, 25, 26)]
    write_journal(root, live + churn(129) + extra)
    assert len(lines_of(root)) == (263 if compacted else 262)
    journal = Journal(tree_kernel(root))
    assert journal.compact_if_grown() is compacted
    assert len(lines_of(root)) == (3 if compacted else 262)
    assert keys(Journal(tree_kernel(root))) == [irq(n).key for n in (24, 25, 26)]


def test_compaction_counts_the_lines_this_daemon_appended(root: Path) -> None:
    """The count of lines follows every save, flush and drop of this process, and starts again
    after a compaction: the file is rewritten when it has grown past the slack, and not again
    on the next check."""
    journal = Journal(tree_kernel(root))
    journal.save(irq(24), "0-15")
    journal.save(irq(25), "0-15", defer=True)
    journal.save(irq(26), "0-15", defer=True)
    journal.flush()
    journal.drop(irq(24).key)
    journal.drop_many([irq(25).key])
    assert len(lines_of(root)) == 5  # 1 live entry
    assert journal.compact_if_grown(slack=3) is False
    assert journal.compact_if_grown(slack=2) is True
    assert lines_of(root) == [save(irq(26), "0-15")]
    assert journal.compact_if_grown(slack=0) is False, "1 line, 1 entry: nothing to gain"

    journal.drop(irq(26).key)  # 2 lines, none live
    assert journal.compact_if_grown(slack=2) is False
    assert journal.compact_if_grown(slack=1) is True
    assert not journal_file(root).exists()

    journal.save(irq(27), "0-15")
    journal.drop(irq(27).key)
    assert journal.compact_if_grown(slack=2) is False
    assert journal.compact_if_grown(slack=1) is True


def test_a_journal_read_from_disk_counts_its_lines(root: Path) -> None:
    """A daemon restarted on a grown journal counts the lines already there (blank ones not)."""
    write_journal(root, [save(irq(24), "0-15"), "", *churn(2)])
    journal = Journal(tree_kernel(root))
    assert journal.compact_if_grown(slack=3) is False  # 5 lines, 1 entry
    assert journal.compact_if_grown(slack=2) is True
