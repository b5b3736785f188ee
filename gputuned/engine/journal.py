"""The journal of original values: written and fsynced before each write it protects.

Format: JSON lines in /run/gputuned/journal.jsonl, version 1.

    {"v": 1, "op": "save", "entry": {<Op fields>, "old": "<value before the first change>"}}
    {"v": 1, "op": "drop", "key": "<op key>"}

Folding the lines gives the entries: the first ``save`` of a key wins (it holds the value from
before gputuned touched the setting; re-applying or switching profiles never overwrites it), and a
``drop`` forgets the key once its old value is back. Appending only, with fsync, means a crash
at any point leaves a journal that names every setting that may have changed. A truncated last
line (a crash mid-append, before fsync returned) is ignored: its write had not started; the
next append first rewrites the file without it, or its record would continue the torn line.

Records of process settings (nice, CPUs, policy, cgroup of a process) are appended without the
fsync: such a setting ends with its process, and every process ends when the kernel does, so
the record need only outlive the daemon, and a daemon killed after ``write`` returned leaves
the line in the page cache for the next start. Where /run is on a disk that others write to,
that fsync was most of a placement's time (issue 20, docs/dev/benchmarks.md).

A ``save`` that names anything gputuned does not write (:mod:`gputuned.engine.opcheck`), or that is not
a well-formed entry, is *rejected*: it is never restored, revert reports it, and compaction keeps
its line for a person to look at (issue 14, finding 13).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gputuned import errors
from gputuned.engine.opcheck import refusal
from gputuned.kernel import Kernel
from gputuned.settings.base import Op
from gputuned.settings.registry import placement_kinds
from gputuned.store.state import (
    JOURNAL,
    append_durable,
    read_optional_bytes,
    remove,
    replace_durable,
)

log = logging.getLogger(__name__)
VERSION = 1


@dataclass(frozen=True)
class Entry:
    op: Op
    old: str

    def to_json(self) -> dict[str, Any]:
        return {**self.op.to_json(), "old": self.old}


class Journal:
    """The folded journal of one host, kept in step with the file."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self._entries: dict[str, Entry] = {}
        self._pending: list[tuple[str, bytes, bool]] = []  # deferred: (key, line, fsync it)
        #: (line number, why, the line) of saves refused on load: never restored.
        self.rejected: list[tuple[int, str, bytes]] = []
        self.lines = 0  # lines in the file: compact when far more than the live entries
        self._torn = False  # the file ends in a torn line: cut it off before appending
        self._load()

    def _load(self) -> None:
        raw = read_optional_bytes(self.kernel, JOURNAL)
        if raw is None:
            return
        lines = raw.split(b"\n")
        self.lines = sum(1 for line in lines if line.strip())
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines):  # torn last line: the append never completed
                    log.warning("journal: ignoring a torn last line (crash during append)")
                    self._torn = True
                    continue
                raise errors.GputunedError(
                    f"{JOURNAL} line {n} is corrupt; fix or remove it by hand after checking "
                    "what it held (gputuned cannot revert what it cannot read)"
                ) from None
            if not isinstance(rec, dict) or rec.get("v") != VERSION:
                v = rec.get("v") if isinstance(rec, dict) else None
                raise errors.GputunedError(f"{JOURNAL}: unknown journal version {v!r}")
            if rec.get("op") == "save":
                entry, why = _entry(rec.get("entry"))
                if entry is None:
                    log.error("journal: line %d refused, never restored: %s", n, why)
                    self.rejected.append((n, str(why), line))
                else:
                    self._entries.setdefault(entry.op.key, entry)
            elif rec.get("op") == "drop" and isinstance(rec.get("key"), str):
                self._entries.pop(rec["key"], None)

    def rejected_report(self) -> list[dict[str, str]]:
        """The refused lines as revert reports a failure: what, and what to do."""
        return [
            {
                "target": f"{JOURNAL} line {n}",
                "error": f"refused, not restored: {why}; check what it names and remove the "
                "line by hand",
            }
            for n, why, _ in self.rejected
        ]

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Entry]:
        """Oldest first."""
        return list(self._entries.values())

    def newest_first(self) -> Iterator[Entry]:
        return reversed(list(self._entries.values()))

    def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def save(self, op: Op, old: str, *, defer: bool = False) -> bool:
        """Record ``old`` for ``op`` durably, unless the key is already journaled. True if new.

        ``defer=True`` holds the record until :meth:`flush`, which appends every deferred
        record with one fsync: the caller must not write the setting before that.
        """
        if op.key in self._entries:
            return False
        entry = Entry(op, old)
        line = (json.dumps({"v": VERSION, "op": "save", "entry": entry.to_json()}) + "\n").encode()
        # Settings of one process or thread end with it (see above): no fsync.
        sync = op.kind not in placement_kinds()
        if defer:
            self._pending.append((op.key, line, sync))
        else:
            self._append(line, sync=sync)
            self.lines += 1
        self._entries[op.key] = entry
        return True

    def flush(self) -> None:
        """Make the deferred saves durable: one append, one fsync (none when they are all
        process settings). On failure they are forgotten again (nothing they protect may be
        written) and the error raised."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        try:
            self._append(
                b"".join(line for _, line, _ in pending), sync=any(sync for _, _, sync in pending)
            )
        except BaseException:
            for key, _, _ in pending:
                self._entries.pop(key, None)
            raise
        self.lines += len(pending)

    def drop(self, key: str) -> None:
        if key not in self._entries:
            return
        line = json.dumps({"v": VERSION, "op": "drop", "key": key}) + "\n"
        # Not fsynced: a lost "drop" only makes a later revert find the value already back.
        # For the same reason a failed one must not stop a rollback or revert half-way (a full
        # /run would otherwise leave the host half applied).
        try:
            self._append(line.encode(), sync=False)
            self.lines += 1
        except errors.HostError as exc:
            log.warning("journal: could not record that %s is restored: %s", key, exc)
        del self._entries[key]

    def drop_many(self, keys: list[str]) -> None:
        """:meth:`drop` for many keys, in one append (the threads of a process that end)."""
        live = [k for k in dict.fromkeys(keys) if k in self._entries]
        if not live:
            return
        data = "".join(json.dumps({"v": VERSION, "op": "drop", "key": k}) + "\n" for k in live)
        try:  # not fsynced, and a failure stops nothing: see drop()
            self._append(data.encode(), sync=False)
            self.lines += len(live)
        except errors.HostError as exc:
            log.warning("journal: could not record that %d entries are gone: %s", len(live), exc)
        for k in live:
            del self._entries[k]

    def _append(self, data: bytes, *, sync: bool) -> None:
        if self._torn:  # appended to, the torn line would take this record with it
            self.compact()
            self._torn = False
        append_durable(self.kernel, JOURNAL, data, sync=sync)

    def compact_if_grown(self, slack: int = 256) -> bool:
        """Compact when the file holds ``slack`` more lines than twice the live entries: a
        daemon placing short-lived processes appends a save and a drop for each, forever."""
        if self._pending or self.lines <= 2 * len(self._entries) + slack:
            return False
        self.compact()
        return True

    def compact(self) -> None:
        """Rewrite the file with only live entries (atomically), or remove it when empty."""
        if self._pending:
            raise errors.GputunedError("journal: compact with unflushed records (a bug)")
        kept = [raw.decode("utf-8", "replace") for _, _, raw in self.rejected]
        if not self._entries and not kept:
            remove(self.kernel, JOURNAL)
            self.lines = 0
            return
        lines = kept + [
            json.dumps({"v": VERSION, "op": "save", "entry": e.to_json()}) for e in self.entries()
        ]
        replace_durable(self.kernel, JOURNAL, ("\n".join(lines) + "\n").encode())
        self.lines = len(lines)


def _entry(raw: object) -> tuple[Entry | None, str | None]:
    """The entry of a ``save`` record, or why it is refused."""
    if not isinstance(raw, dict) or not isinstance(raw.get("old"), str):
        return None, "not a journal entry (no 'old' value)"
    d = dict(raw)
    old = d.pop("old")
    try:
        op = Op.from_json(d)
    except TypeError as exc:
        return None, f"not a journal entry ({exc})"
    if not isinstance(op.data, dict) or not isinstance(op.value, str):
        return None, "not a journal entry (data or value of the wrong type)"
    why = refusal(op, old) or refusal(op, op.value)
    return (None, f"{op.kind} {op.path!r}: {why}") if why else (Entry(op, old), None)
