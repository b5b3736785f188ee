"""Thread and process operations through real syscalls on a child of this test (root only).

Each test starts its own child (three extra threads, sleeping), changes only that child and the
cgroup it makes, puts everything back and kills the child.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.cpulist import parse_cpulist
from gputuned.kernel import tasks as procctl
from gputuned.kernel.proc import ProcInfo, read_process
from gputuned.sim.model import TreeModel
from tests.faults import FaultKernel, live_kernel, tree_kernel

pytestmark = pytest.mark.integration

CHILD = (
    "import threading, time\n"
    "for _ in range(3):\n"
    "    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def child() -> Iterator[int]:
    if os.geteuid() != 0:
        pytest.skip("root is required: lowering nice, real-time policy and cgroup moves need it")
    proc = subprocess.Popen([sys.executable, "-c", CHILD])
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{proc.pid}/task")) < 4:
            assert time.monotonic() < deadline, "the child did not start its threads"
            time.sleep(0.01)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def sched(info: ProcInfo) -> dict[int, tuple[int, str, int, frozenset[int]]]:
    return {t.tid: (t.nice, t.policy, t.rt_priority, t.affinity) for t in info.threads}


def test_nice_affinity_policy_on_every_thread_and_back(child: int) -> None:
    host = live_kernel()
    before = read_process(host, child)
    assert len(before.threads) == 4
    original = sched(before)
    try:
        for t in before.threads:
            host.set_nice(t.tid, 5)
            host.set_affinity(t.tid, frozenset({0}))
            host.set_scheduler(t.tid, "batch", 0)
        assert set(sched(read_process(host, child)).values()) == {(5, "batch", 0, frozenset({0}))}
        assert host.writes[0].path == f"/proc/{child}/task/{child}:nice"
    finally:
        for t in before.threads:
            host.set_scheduler(t.tid, t.policy, t.rt_priority)
            host.set_nice(t.tid, t.nice)  # lowering nice again: needs root
            host.set_affinity(t.tid, t.affinity)
    assert sched(read_process(host, child)) == original


def test_fifo_applies_or_is_refused_with_the_reason(child: int) -> None:
    host = live_kernel()
    try:
        host.set_scheduler(child, "fifo", 1)
    except errors.PermissionDenied as exc:
        assert procctl.RT_REFUSED in str(exc)  # the cgroup's cpu controller has no RT budget
        return
    try:
        (main,) = [t for t in read_process(host, child).threads if t.tid == child]
        assert (main.policy, main.rt_priority) == ("fifo", 1)
    finally:
        host.set_scheduler(child, "other", 0)
    (main,) = [t for t in read_process(host, child).threads if t.tid == child]
    assert (main.policy, main.rt_priority) == ("other", 0)


def test_gone_thread_and_bad_affinity(child: int) -> None:
    host = live_kernel()
    with pytest.raises(errors.TargetGone):
        host.set_nice(2**22 + 1, 0)  # above pid_max's ceiling: no such thread
    with pytest.raises(errors.InvalidValue, match="allowed by the cpuset"):
        host.set_affinity(child, frozenset({(os.cpu_count() or 1) + 64}))
    assert read_process(host, child).threads[0].affinity == frozenset(os.sched_getaffinity(child))


def test_move_to_a_new_cgroup_and_back(child: int) -> None:
    host = live_kernel()
    mounts = TreeModel(Path("/")).cgroup2_mounts()
    if not mounts:
        pytest.skip("no cgroup v2 mount on this machine")
    mount = mounts[0]
    home = read_process(host, child).cgroup
    target = f"{mount}/gputuned-test-{os.getpid()}"
    host.mkdir(target)
    try:
        host.move_to_cgroup(child, target)
        assert read_process(host, child).cgroup == target.removeprefix(mount)
        assert host.read_text(f"{target}/cgroup.procs").split() == [str(child)]
    finally:
        host.move_to_cgroup(child, f"{mount}{home}".rstrip("/") or "/")
        host.rmdir(target)
    assert read_process(host, child).cgroup == home
    assert not host.exists(target)


# -- the tree's kernel model against this kernel: cpuset partitions -----------------------------

CG_FILES = (
    "cgroup.controllers", "cgroup.subtree_control", "cgroup.type", "cgroup.procs",
    "cpuset.cpus", "cpuset.cpus.effective", "cpuset.cpus.exclusive",
    "cpuset.cpus.exclusive.effective", "cpuset.cpus.partition", "cpuset.mems.effective",
)  # fmt: skip
SHOWN = ("cpuset.cpus.partition", "cpuset.cpus.effective", "cpuset.cpus.exclusive.effective")


def mirror(live: FaultKernel, dest: Path, mount: str) -> FaultKernel:
    """A tree of this machine's cgroup v2 top level: what the model needs to decide validity."""
    for name in ("online", "possible"):
        f = dest / "sys/devices/system/cpu" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(live.read_text(f"/sys/devices/system/cpu/{name}"))
    (dest / "proc").mkdir()
    (dest / "proc/mounts").write_text(f"cgroup2 {mount} cgroup2 rw 0 0\n")
    dirs = [mount] + [f"{mount}/{d}" for d in live.listdir(mount) if live.is_dir(f"{mount}/{d}")]
    for d in dirs:
        out = dest.joinpath(*d.split("/")[1:])
        out.mkdir(parents=True, exist_ok=True)
        for name in CG_FILES:
            text = live.read_optional(f"{d}/{name}")
            if text is not None:
                raw = live.read_text(f"{d}/{name}")
                (out / name).write_text("1\n" if name == "cgroup.procs" and raw.strip() else raw)
    return tree_kernel(dest)


def test_tree_model_matches_this_kernel_for_partitions(tmp_path: Path) -> None:
    """Run one sequence of cgroup writes on the kernel and on a mirror tree; compare read-back."""
    if os.geteuid() != 0:
        pytest.skip("root is required: it makes cgroups and cpuset partitions")
    live = live_kernel()
    mounts = TreeModel(Path("/")).cgroup2_mounts()
    if not mounts or "cpuset" not in live.read_text(f"{mounts[0]}/cgroup.subtree_control").split():
        pytest.skip("needs cgroup v2 with cpuset enabled at the root (not the CI machine kind)")
    mount = mounts[0]
    online = sorted(parse_cpulist(live.read_value("/sys/devices/system/cpu/online")))
    if len(online) < 6:
        pytest.skip("needs 6 CPUs or more")
    tree = mirror(live, tmp_path / "tree", mount)
    a, b, c = (f"{mount}/gputuned-test-{x}" for x in "abc")
    everything = f"{online[0]}-{online[-1]}"
    steps: list[tuple[str, str, str]] = [
        ("mkdir", a, ""),
        ("write", f"{a}/cpuset.cpus", "1-2"),
        ("write", f"{a}/cpuset.cpus.partition", "root"),
        ("mkdir", b, ""),
        ("write", f"{b}/cpuset.cpus", "2-3"),  # invalidates a, with no reason given
        ("write", f"{b}/cpuset.cpus", ""),  # a stays invalid
        ("write", f"{a}/cpuset.cpus.partition", "root"),
        ("write", f"{b}/cpuset.cpus.partition", "isolated"),  # no CPUs
        ("write", f"{b}/cpuset.cpus", "3-4"),  # now valid
        ("write", f"{b}/cpuset.cpus.partition", "member"),
        ("write", f"{a}/cpuset.cpus.partition", "isolated"),
        ("write", f"{a}/cpuset.cpus", everything),  # NOCPUS before NOTEXCL
        ("write", f"{a}/cpuset.cpus.partition", "member"),
        ("write", f"{a}/cpuset.cpus", "1-2"),
        ("write", f"{a}/cpuset.cpus.partition", "root"),
        ("write", f"{a}/cpuset.cpus", ""),  # EBUSY
        ("write", f"{a}/cpuset.cpus.partition", "member"),
        ("rmdir", b, ""),
        ("rmdir", a, ""),
        # The cpuset tuner's own sequence, and its revert.
        ("mkdir", c, ""),
        ("write", f"{c}/cpuset.cpus", "4-7"),
        ("write", f"{c}/cpuset.cpus.exclusive", "4-7"),
        ("write", f"{c}/cpuset.cpus.partition", "isolated"),
        ("write", f"{c}/cpuset.cpus.partition", "member"),
        ("write", f"{c}/cpuset.cpus.exclusive", ""),
        ("write", f"{c}/cpuset.cpus", ""),
        ("rmdir", c, ""),
    ]
    report: list[str] = []
    try:
        for op, path, value in steps:
            outcome = []
            for host in (live, tree):
                try:
                    if op == "mkdir":
                        host.mkdir(path)
                    elif op == "rmdir":
                        host.rmdir(path)
                    else:
                        host.write_text(path, value or "\n")
                    outcome.append("ok")
                except errors.HostError as exc:
                    outcome.append(type(exc).__name__)
            shown = {
                f"{d}/{n}": (live.read_optional(f"{d}/{n}"), tree.read_optional(f"{d}/{n}"))
                for d in (mount, a, b, c)
                for n in SHOWN
                if live.exists(f"{d}/{n}")
            }
            line = f"{op} {path} {value!r}: live {outcome[0]}, tree {outcome[1]}"
            diffs = [
                f"  {k}: live {lv!r}, tree {tv!r}" for k, (lv, tv) in shown.items() if lv != tv
            ]
            report.append(line + ("" if outcome[0] == outcome[1] and not diffs else "  MISMATCH"))
            report += diffs
    finally:
        for d in (b, a):
            if live.exists(f"{d}/cpuset.cpus.partition"):
                live.write_text(f"{d}/cpuset.cpus.partition", "member")
            if live.is_dir(d):
                live.rmdir(d)
    print("\n".join(report))
    assert not [r for r in report if "MISMATCH" in r or r.startswith("  ")], "\n".join(report)
