"""Text other users control never reaches root's terminal as escape sequences (finding 15).

Any user names their processes (prctl PR_SET_NAME, setproctitle) and writes their command lines.
A server process of the inference account, named with an OSC sequence that retitles the
terminal and with a command line that clears the screen, is matched by the shipped rule and
shown by plan, apply, verify, status and top: each character that is not printable must come
out as its escape. (Other accounts' processes match no shipped rule since the process-tree
issue; top --pid shows any, tests/reliability/test_local_users.py plays that one.)
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from gputuned.cli import main as cli
from gputuned.cli.top import render
from gputuned.textsafe import printable
from gputuned.watch.top import Target, compute_rows, take_snapshot
from tests.fakeproc import add_process
from tests.faults import tree_kernel
from tests.unit.test_apply import PROFILES, SERVER_UID, tree_copy

EVIL_COMM = "\x1b]0;own\x07py\u202e"  # 15 characters, as TASK_COMM_LEN allows
EVIL_PID = 5151
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tree_copy("h200-captured", tmp_path, server=False)
    add_process(
        root, EVIL_PID, comm=EVIL_COMM, uid=SERVER_UID,
        cmdline=["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "\x1b[2J"],
        exe="/usr/bin/python3.11", start_time=777, threads=[EVIL_PID, EVIL_PID + 1],
        cpus=(root / "sys/devices/system/cpu/online").read_text().strip(),
    )  # fmt: skip
    return root


def run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    cli.main(list(args))
    out, err = capsys.readouterr()
    return out + err


def test_printable() -> None:
    assert printable("plain text") == "plain text"
    assert printable(EVIL_COMM) == "\\x1b]0;own\\x07py\\u202e"
    assert printable("a\nb") == "a\\x0ab" and printable("a\nb", newlines=True) == "a\nb"


def test_plan_apply_verify_status_show_no_escape(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof = str(PROFILES / "shared-host.toml")
    for args in (
        ("plan", prof),
        ("apply", prof),
        ("verify",),
        ("status",),
        ("revert",),
    ):
        out = run(capsys, *args, "--root", str(tree))
        assert not RAW.search(out), (args, out[:2000])
    out = run(capsys, "plan", prof, "--root", str(tree))
    assert "\\x1b]0;own\\x07py\\u202e" in out, "shown, escaped"


def test_top_shows_no_escape(tree: Path) -> None:
    from rich.console import Console

    host = tree_kernel(tree)
    targets = [Target(EVIL_PID, "--pid")]
    a = take_snapshot(host, targets, nvml=False, clock=lambda: 0.0)
    b = take_snapshot(host, targets, nvml=False, clock=lambda: 1.0)
    buf = io.StringIO()
    Console(file=buf, width=200, force_terminal=False).print(
        render(compute_rows(a, b, targets), b, "test")
    )
    assert not RAW.search(buf.getvalue()), buf.getvalue()
    assert "\\x1b]0;own" in buf.getvalue()


def test_json_output_escapes_too(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "plan", str(PROFILES / "shared-host.toml"), "--root", str(tree), "--json")
    assert not RAW.search(out)
    assert any(EVIL_COMM in c["target"] for c in json.loads(out)["changes"])


def test_log_lines_show_no_escape() -> None:
    import logging

    from gputuned.service.notify import _PriorityPrefix
    from gputuned.textsafe import PrintableFormatter

    record = logging.LogRecord("gputuned", logging.INFO, "", 0, "placed %s", (EVIL_COMM,), None)
    for fmt in (PrintableFormatter("%(message)s"), _PriorityPrefix("%(message)s")):
        line = fmt.format(record)
        assert not RAW.search(line) and "\\x1b]0;own" in line


def test_a_log_line_cannot_be_forged_or_flood_the_journal() -> None:
    """Issue 30, item 2: journald reads stderr line by line and honours a <N> priority at the
    start of each. Text from a peer, a profile or /proc stays on its record's one line, a
    traceback's lines each carry the record's own priority, and a message is bounded."""
    import logging
    import sys

    from gputuned.service.notify import MAX_MESSAGE, _PriorityPrefix

    fmt = _PriorityPrefix("%(name)s: %(message)s")
    forged = "statusX\n<0>gputuned: daemon: FAKE revert complete"
    record = logging.LogRecord("gputuned", logging.INFO, "", 0, "control: %s", (forged,), None)
    assert fmt.format(record) == (
        "<6>gputuned: control: statusX\\x0a<0>gputuned: daemon: FAKE revert complete"
    )
    try:
        raise ValueError("boom\n<0>forged")
    except ValueError:
        exc = sys.exc_info()
    record = logging.LogRecord("gputuned", logging.ERROR, "", 0, "%s", ("x" * 5000,), exc)
    lines = fmt.format(record).split("\n")
    assert all(line.startswith("<3>") for line in lines) and lines[-1] == "<3><0>forged"
    assert lines[0].endswith(f"... ({5000 - MAX_MESSAGE} more characters)")
    assert len(lines[0]) < MAX_MESSAGE + 100


def test_one_peer_causes_a_bounded_number_of_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from gputuned.service.peerlog import PeerLogLimit

    now = [0.0]
    limit = PeerLogLimit(per_window=20, window_s=10.0, clock=lambda: now[0])
    assert sum(limit.allow(1000) for _ in range(100)) == 20
    assert sum(limit.allow(1001) for _ in range(5)) == 5, "each user has their own"
    assert all(limit.allow(0) for _ in range(100)), "root is not limited"
    now[0] = 11.0
    with caplog.at_level(logging.INFO, logger="gputuned"):
        assert limit.allow(1000)
    assert "80 log lines caused by uid 1000 in 11 s were left out" in caplog.text
