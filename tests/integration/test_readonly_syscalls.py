"""Read-only commands make no write system call: traced with ``strace -f`` (issue 14, finding 22).

``inspect``, ``plan``, ``verify`` and ``status`` run under strace on this machine (as root, on
its real /sys, /proc and cgroups) and on a tree with a profile applied. The trace must show no
open for writing (``O_WRONLY``, ``O_RDWR``, ``O_CREAT``, ``O_TRUNC``; the ``--prometheus``
target and its temporary file excepted), and no mkdir, rmdir, unlink, rename, mount,
setpriority, sched_setaffinity, sched_setscheduler or sched_setattr, chmod or chown: an attempt
counts, even one the kernel refuses. A write to ``cgroup.procs`` is an open for writing first.

strace is a test dependency (``scripts/test`` installs it); without it this module fails rather
than skips, as a check that did not run must not look like one that passed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.conftest import REPO, subprocess_env
from tests.unit.test_apply import PROFILES, tree_copy

pytestmark = pytest.mark.usefixtures("as_root")

_CALLS = (
    "open,openat,openat2,creat,truncate,ftruncate,mkdir,mkdirat,rmdir,unlink,unlinkat,rename,"
    "renameat,renameat2,link,linkat,symlink,symlinkat,chmod,fchmod,fchmodat,chown,fchown,"
    "lchown,fchownat,mount,umount2,setpriority,sched_setaffinity,sched_setscheduler,"
    "sched_setattr"
)
#: open(2) and creat(2) take no directory fd; openat(2) and openat2(2) do. (Python 3.13 on
#: Debian 13 reads /proc/sys/vm/overcommit_memory with a plain open().)
_OPEN = re.compile(r"^\d+\s+(open|openat|openat2|creat)\((?:(?:AT_FDCWD|\d+), )?\"([^\"]*)\"(.*)$")
_WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC")
#: NVML's ioctl interface: the driver wants its character devices opened O_RDWR for queries
#: too (nvmlInit opens /dev/nvidiactl and /dev/nvidiaN so); nothing is written through them.
_NVML_DEVICES = ("/dev/nvidiactl", "/dev/nvidia")


def strace() -> str:
    path = shutil.which("strace")
    assert path, "strace is missing: apt-get install strace (scripts/test installs it)"
    return path


def traced(tmp_path: Path, *args: str, allow: tuple[str, ...] = ()) -> list[str]:
    """Run ``gputunectl ARGS`` under strace; return the calls that change something."""
    out = tmp_path / f"trace-{args[0]}.txt"
    env = subprocess_env() | {"PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    run = subprocess.run(
        [strace(), "-f", "-qq", "-s", "256", "-e", f"trace={_CALLS}", "-o", str(out),
         sys.executable, "-m", "gputuned.cli", *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False,
    )  # fmt: skip
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode in (0, 1, 2), (args, run.returncode, run.stdout[-800:], run.stderr)
    bad = []
    allowed_fds: set[tuple[str, str]] = set()  # (pid, fd) opened under an allowed path
    for line in out.read_text().splitlines():
        m = _OPEN.match(line)
        if m:
            path, rest = m.group(2), m.group(3)
            flags = rest.split(")", 1)[0]
            if allow and path.startswith(allow) and (fd := re.search(r"= (\d+)$", line)):
                allowed_fds.add((line.split()[0], fd.group(1)))
            writes = m.group(1) == "creat" or any(f in flags for f in _WRITE_FLAGS)
            if writes and not path.startswith((*allow, *_NVML_DEVICES)):
                bad.append(line)
        elif re.match(r"^\d+\s+[a-z_0-9]+\(", line) and "resumed>" not in line:
            paths = re.findall(r'"([^"]*)"', line)
            on_fd = re.match(r"^(\d+)\s+f[a-z]+\((\d+),", line)
            if on_fd and (on_fd.group(1), on_fd.group(2)) in allowed_fds:
                continue  # fchmod/ftruncate of the --prometheus temporary file
            if not (allow and paths and all(p.startswith(allow) for p in paths)):
                bad.append(line)
    return bad


@pytest.fixture
def applied_tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tree_copy("h200-captured", tmp_path)
    prof = tmp_path / "shared-host.toml"
    shutil.copy(PROFILES / "shared-host.toml", prof)
    run = subprocess.run(
        [sys.executable, "-m", "gputuned.cli", "apply", "--root", str(root), str(prof)],
        capture_output=True, text=True, env=subprocess_env(), cwd=REPO, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return root, prof


def test_readonly_commands_on_this_machine(tmp_path: Path) -> None:
    prof = str(PROFILES / "shared-host.toml")
    prom_dir = tmp_path / "textfile"
    prom_dir.mkdir()
    for args, allow in (
        (("inspect",), ()),
        (("inspect", "--all", "--json"), ()),
        (("plan", prof), ()),
        (("verify", prof, "--prometheus", str(prom_dir / "gputuned.prom")), (str(prom_dir),)),
        (("status",), ()),
    ):
        assert traced(tmp_path, *args, allow=allow) == [], args
    assert (prom_dir / "gputuned.prom").is_file()


def test_readonly_commands_on_a_tuned_tree(tmp_path: Path, applied_tree: tuple[Path, Path]) -> None:
    root, prof = applied_tree
    for args in (
        ("inspect", "--all"),
        ("plan", str(prof)),
        ("verify",),
        ("verify", str(prof), "--json"),
        ("status", "--json"),
    ):
        assert traced(tmp_path, *args, "--root", str(root)) == [], args


def test_the_trace_sees_writes(tmp_path: Path, applied_tree: tuple[Path, Path]) -> None:
    """The check can fail: revert, which writes, shows in the same trace."""
    root, _prof = applied_tree
    found = traced(tmp_path, "revert", "--root", str(root))
    assert any("O_WRONLY" in line for line in found), found
    assert os.path.exists(root)
