"""One exit-code table for every gputunectl command, usage errors (64), errors under --json,
a stdout whose reader went away, and no traceback on any input (issue 19, item 3).

The commands run as a user runs them: ``python3 -m gputuned.cli ...`` in a child process
against a tree (``--root``), so argparse's own exits, the interpreter's flush of stdout at exit
and what reaches the terminal are all part of what is checked.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gputuned import exitcodes
from gputuned.cli import main as cli
from gputuned.cli.manpages import write_all
from gputuned.daemon.core import Daemon
from tests.faults import tree_kernel
from tests.unit.conftest import Events
from tests.unit.test_apply import PROFILES, tree_copy
from tests.unit.test_cpuset import neighbour
from tests.unit.test_daemon import profile_file

REPO = Path(__file__).resolve().parents[2]
SHARED = str(PROFILES / "shared-host.toml")


def gputunectl(*args: str, closed_stdout: bool = False) -> subprocess.CompletedProcess[str]:
    """Run gputunectl; ``closed_stdout``: with a stdout pipe nobody reads (as ``| head`` leaves
    it once head has exited), so the first write fails with EPIPE."""
    cmd = [sys.executable, "-m", "gputuned.cli", *args]
    if not closed_stdout:
        return subprocess.run(
            cmd, check=False, capture_output=True, text=True, cwd=REPO, timeout=120
        )
    r, w = os.pipe()
    os.close(r)  # no reader from the start: every write to w fails
    # stdout buffered as a user's shell has it: with PYTHONUNBUFFERED (set on some CI and
    # developer machines) nothing is left in the buffer for the exit's flush to fail on.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        proc = subprocess.run(
            cmd,
            check=False,
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            timeout=120,
            env=env,
        )
    finally:
        os.close(w)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", proc.stderr)


def no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    for text in (proc.stdout, proc.stderr):
        assert "Traceback" not in text and "Exception ignored" not in text, text


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tree_copy("h200-captured", tmp_path)


# ---- the table, and where it is printed ---------------------------------------------------------


def test_usage_md_prints_the_table_of_the_code() -> None:
    page = (REPO / "docs" / "usage.md").read_text()
    m = re.search(r"<!-- exit-codes:[^\n]*-->\n(.*?)\n<!-- end of exit-codes -->", page, re.S)
    assert m, "docs/usage.md lost its exit-codes block"
    assert m.group(1) == exitcodes.markdown_table()


def test_help_and_the_man_page_print_the_table(tmp_path: Path) -> None:
    proc = gputunectl("--help")
    assert proc.returncode == 0 and exitcodes.help_text() in proc.stdout
    page = {p.name: p.read_text() for p in write_all(tmp_path)}["gputunectl.8"]
    section = page.split(".SH EXIT STATUS\n", 1)[1].split(".SH ", 1)[0]
    assert [int(c) for c in re.findall(r"^\.B (\d+)$", section, re.M)] == [
        c.code for c in exitcodes.TABLE
    ]


def test_each_code_means_one_thing() -> None:
    codes = [c.code for c in exitcodes.TABLE]
    assert len(codes) == len(set(codes))
    # Results a script acts on are never what an error or a usage mistake returns.
    results = {exitcodes.DRIFTED, exitcodes.PENDING_REBOOT}
    assert exitcodes.USAGE not in results and exitcodes.ERROR not in results
    assert exitcodes.USAGE == 64  # EX_USAGE, sysexits.h


# ---- usage errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("verify", "--stirct"),  # exited 2, verify's "pending reboot"
        ("nosuch",),
        ("plan",),
        ("plan", SHARED, "--root", "relative/tree"),
        ("top", "--pid", "1", "--interval", "0"),
        ("top", "--pid", "0", "--once"),
        ("register", "0"),
        ("apply",),
    ],
)
def test_a_usage_error_exits_64(args: tuple[str, ...], root: Path) -> None:
    extra = ("--root", str(root)) if args[0] in ("top", "register") else ()
    proc = gputunectl(*args, *extra)
    no_traceback(proc)
    assert proc.returncode == 64, proc.stderr
    assert proc.stdout == "" and proc.stderr.startswith("gputunectl")


def test_a_usage_error_under_json_is_a_json_object() -> None:
    proc = gputunectl("verify", "--stirct", "--json")
    assert proc.returncode == 64
    data = json.loads(proc.stdout)
    assert data["ok"] is False and data["exit_code"] == 64
    assert data["error_class"] == "UsageError" and data["command"] == "verify"
    assert "--stirct" in data["error"] and data["usage"].startswith("usage: gputunectl verify ")
    # An abbreviation argparse takes counts as --json too.
    assert json.loads(gputunectl("nosuch", "--js").stdout)["exit_code"] == 64


# ---- errors under --json ------------------------------------------------------------------------


def test_every_error_under_json_is_a_json_object(root: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\n[irq]\ngpu_cpus = 3\n')
    cases = [
        (("verify", "--root", str(root)), 3, "none applied on this host"),
        (("bootargs", "--root", str(root)), 3, "gputunectl bootargs PROFILE"),
        (("plan", str(tmp_path / "missing.toml"), "--root", str(root)), None, "missing.toml"),
        (("apply", str(bad), "--root", str(root)), 4, "invalid profile"),
        (("top", "--pid", "999999", "--once", "--root", str(root)), 3, "no process 999999"),
        (("register", "999999", "--root", str(root)), 3, "no process 999999"),
        (("capture", str(bad), "--root", str(root)), 3, "not a folder"),
    ]
    for args, code, text in cases:
        proc = gputunectl(*args, "--json")
        no_traceback(proc)
        data = json.loads(proc.stdout)
        assert data["ok"] is False and data["exit_code"] == proc.returncode != 0, args
        assert code is None or proc.returncode == code, (args, proc.returncode)
        assert text in data["error"], (args, data["error"])
        assert data["command"] == args[0]
    problems = json.loads(gputunectl("apply", str(bad), "--root", str(root), "--json").stdout)
    assert [p["key"] for p in problems["problems"]] == ["irq.gpu_cpus"]


def test_an_unexpected_exception_is_a_bug_report_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(_args: object) -> int:
        raise KeyError("surprise")

    monkeypatch.setattr(cli, "cmd_schema", broken)
    assert cli.main(["schema"]) == exitcodes.INTERNAL == 70
    err = capsys.readouterr().err
    assert "internal error (KeyError: 'surprise'); this is a bug in gputunectl" in err
    assert "Traceback" not in err


# ---- the errors of issue 19 ---------------------------------------------------------------------


def test_capture_into_a_file_says_so(root: Path, tmp_path: Path) -> None:
    target = tmp_path / "capture.txt"
    target.write_text("mine\n")
    proc = gputunectl("capture", str(target), "--root", str(root))
    no_traceback(proc)
    assert proc.returncode == 3
    assert f"{target} is a file, not a folder; capture into a new or empty folder" in proc.stderr
    assert target.read_text() == "mine\n"


def test_top_of_a_process_that_is_not_there_fails(root: Path) -> None:
    proc = gputunectl("top", "--pid", "999999", "--once", "--root", str(root))
    no_traceback(proc)
    assert proc.returncode == 3 and "there is no process 999999" in proc.stderr


# ---- a reader that stops early (| head) ---------------------------------------------------------


def test_a_closed_stdout_keeps_the_commands_own_status(root: Path, tmp_path: Path) -> None:
    for extra in ((), ("--json",)):
        proc = gputunectl("plan", SHARED, "--root", str(root), *extra, closed_stdout=True)
        no_traceback(proc)
        assert proc.returncode == 0 and proc.stderr == ""

    blocked = tree_copy("h200-captured", tmp_path / "blocked")
    neighbour(blocked, "2", "isolated")  # another cgroup's partition holds CPU 2: exit 4
    proc = gputunectl("plan", SHARED, "--root", str(blocked), closed_stdout=True)
    no_traceback(proc)
    assert proc.returncode == 4

    proc = gputunectl("--help", closed_stdout=True)
    no_traceback(proc)
    assert proc.returncode == 0


def test_top_stops_when_nobody_reads(root: Path) -> None:
    # Without --once top refreshes until stopped; a closed pipe stops it.
    proc = gputunectl(
        "top", "--pid", "4242", "--interval", "0.01", "--root", str(root), closed_stdout=True
    )
    no_traceback(proc)
    assert proc.returncode == 0


# ---- one code whatever path the command takes (issue 31, item 3) ----------------------------------


def test_an_invalid_profile_exits_the_same_through_the_daemon(
    tmp_path: Path,
    events: Events,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``apply NAME`` of an invalid profile exited 4 one-shot and 3 through the daemon (the
    daemon loads a name itself), and the daemon logged nothing about the failed request."""
    root = tree_copy("h200-captured", tmp_path)
    mine = root / "etc/gputuned/profiles"
    mine.mkdir(parents=True)
    (mine / "broken.toml").write_text('name = "broken"\n[irq]\ngpu_cpus = 3\n')
    args = ["apply", "broken", "--root", str(root), "--json"]

    assert cli.main(args) == exitcodes.REFUSED  # one-shot: no daemon on the tree
    alone = json.loads(capsys.readouterr().out)

    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    got: list[int] = []
    worker = threading.Thread(target=lambda: got.append(cli.main(args)))
    with caplog.at_level(logging.INFO, logger="gputuned"):
        worker.start()
        while worker.is_alive():  # the daemon's turn, as Daemon.run takes it
            d.loop.run_once(0.02)
            assert d.control is not None
            d.control.serve()
    worker.join()
    d.stop()
    served = json.loads(capsys.readouterr().out)
    assert got == [exitcodes.REFUSED], served
    assert served["exit_code"] == alone["exit_code"] == exitcodes.REFUSED
    assert served["error_class"] == alone["error_class"] == "ProfileError"
    assert served["problems"] == alone["problems"]
    assert [p["key"] for p in served["problems"]] == ["irq.gpu_cpus"]
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING, caplog.text
    line = failed[0].getMessage()
    assert "apply" in line and "uid 0" in line and "irq.gpu_cpus" in line and "\n" not in line
