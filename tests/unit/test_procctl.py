"""Thread and process operations on fake processes in trees: read back, restore byte-exact."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.kernel import tasks as procctl
from gputuned.kernel.proc import ThreadInfo, read_process
from tests.conftest import TREES_DIR
from tests.fakeproc import add_process
from tests.faults import FaultKernel, WriteRecord, tree_kernel
from tests.unit.test_treekernel import digest

PID = 4242
THREADS = [4243, 4244]
CG = "/sys/fs/cgroup"


def setup(tmp_path: Path, name: str = "h200-captured", **kw: object) -> tuple[Path, FaultKernel]:
    root = tmp_path / name
    shutil.copytree(TREES_DIR / name, root, symlinks=True)
    add_process(
        root,
        PID,
        comm="python3",
        cmdline=["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"],
        exe="/usr/bin/python3.11",
        start_time=123456,
        threads=THREADS,
        **kw,  # type: ignore[arg-type]
    )
    return root, tree_kernel(root)


def thread(host: FaultKernel, tid: int) -> ThreadInfo:
    (t,) = [t for t in read_process(host, PID).threads if t.tid == tid]
    return t


def stat_fields(root: Path, rel: str) -> list[str]:
    text = (root / rel).read_text()
    return text[text.rindex(")") + 2 :].split()  # field 3 first


def test_fake_process_reads_back(tmp_path: Path) -> None:
    root, host = setup(tmp_path)
    info = read_process(host, PID)
    assert (info.comm, info.exe, info.start_time) == ("python3", "/usr/bin/python3.11", 123456)
    assert info.cmdline == "/usr/bin/python3 -m vllm.entrypoints.openai.api_server"
    assert info.cgroup == "/user.slice/user-0.slice/session-1.scope"
    assert [t.tid for t in info.threads] == [PID, *THREADS]
    assert {(t.nice, t.policy, t.rt_priority) for t in info.threads} == {(0, "other", 0)}
    assert {t.affinity for t in info.threads} == {frozenset(range(16))}
    assert len(stat_fields(root, f"proc/{PID}/stat")) == 50  # 52 with pid and comm
    # The process's cgroup exists now, made like the kernel makes cgroups, and lists it.
    scope = root / "sys/fs/cgroup/user.slice/user-0.slice/session-1.scope"
    assert (scope / "cgroup.procs").read_text() == f"{PID}\n"


def test_nice_round_trip(tmp_path: Path) -> None:
    root, host = setup(tmp_path)
    before = digest(root)
    host.set_nice(THREADS[0], -10)
    assert thread(host, THREADS[0]).nice == -10
    assert stat_fields(root, f"proc/{PID}/task/{THREADS[0]}/stat")[18 - 3] == "10"  # priority
    assert thread(host, PID).nice == 0
    assert host.writes == [WriteRecord(f"/proc/{PID}/task/{THREADS[0]}:nice", b"-10")]
    host.set_nice(PID, 5)  # the main thread: /proc/PID/stat shows the leader too
    assert stat_fields(root, f"proc/{PID}/stat")[19 - 3] == "5"
    host.set_nice(PID, 0)
    host.set_nice(THREADS[0], 0)
    assert digest(root) == before


def test_nice_is_clamped_like_setpriority(tmp_path: Path) -> None:
    _root, host = setup(tmp_path)
    host.set_nice(PID, -99)
    assert thread(host, PID).nice == -20


def test_affinity_round_trip(tmp_path: Path) -> None:
    root, host = setup(tmp_path)
    before = digest(root)
    for tid in (PID, *THREADS):
        host.set_affinity(tid, frozenset({0, 1, 2, 3}))
    status = (root / f"proc/{PID}/status").read_text()
    assert "Cpus_allowed:\t000f\n" in status and "Cpus_allowed_list:\t0-3\n" in status
    assert {t.affinity for t in read_process(host, PID).threads} == {frozenset({0, 1, 2, 3})}
    assert host.writes[-1] == WriteRecord(f"/proc/{PID}/task/{THREADS[1]}:affinity", b"0-3")
    host.set_affinity(THREADS[0], frozenset({5, 100}))  # CPUs past nr_cpu_ids are not read
    assert thread(host, THREADS[0]).affinity == frozenset({5})
    for tid in (PID, *THREADS):
        host.set_affinity(tid, frozenset(range(16)))
    assert digest(root) == before


def test_affinity_outside_the_cpuset(tmp_path: Path) -> None:
    root, host = setup(tmp_path, "h200-vm", cgroup="/")
    host.mkdir(f"{CG}/small")
    host.write_text(f"{CG}/small/cpuset.cpus", "0-3")
    host.move_to_cgroup(PID, f"{CG}/small")
    before = digest(root)
    with pytest.raises(errors.InvalidValue, match=r"no CPU of 8-9 is online and allowed by"):
        host.set_affinity(PID, frozenset({8, 9}))
    assert digest(root) == before
    host.set_affinity(PID, frozenset({3, 8}))  # meets the cpuset: accepted
    assert thread(host, PID).affinity == frozenset({3, 8})


@pytest.mark.parametrize(("policy", "prio", "shown"), [("batch", 0, "20"), ("fifo", 10, "-11")])
def test_scheduler_round_trip(policy: str, prio: int, shown: str, tmp_path: Path) -> None:
    root, host = setup(tmp_path, cgroup="/")  # the root cgroup has the RT budget
    before = digest(root)
    host.set_scheduler(THREADS[1], policy, prio)
    t = thread(host, THREADS[1])
    assert (t.policy, t.rt_priority) == (policy, prio)
    assert stat_fields(root, f"proc/{PID}/task/{THREADS[1]}/stat")[18 - 3] == shown
    assert host.writes == [
        WriteRecord(f"/proc/{PID}/task/{THREADS[1]}:scheduler", f"{policy} {prio}".encode())
    ]
    host.set_scheduler(THREADS[1], "other", 0)
    assert digest(root) == before


def test_realtime_refused_in_a_cgroup_with_the_cpu_controller(tmp_path: Path) -> None:
    root, host = setup(tmp_path)  # user.slice: the root enables cpu for it
    before = digest(root)
    with pytest.raises(errors.PermissionDenied, match=r"no RT budget \(cpu.rt_runtime_us\)"):
        host.set_scheduler(PID, "fifo", 10)
    assert digest(root) == before and host.writes == []
    host.move_to_cgroup(PID, CG)  # the DESIGN.md workaround: the root cgroup
    host.set_scheduler(PID, "fifo", 10)
    assert thread(host, PID).policy == "fifo"


def test_realtime_allowed_without_cpu_controller(tmp_path: Path) -> None:
    _root, host = setup(tmp_path, "ci-vm", cpus="0-1")  # cgroup2 there has no controllers
    host.set_scheduler(PID, "rr", 1)
    assert thread(host, PID).policy == "rr"


def test_scheduler_and_thread_errors(tmp_path: Path) -> None:
    root, host = setup(tmp_path, cgroup="/")
    before = digest(root)
    for policy, prio in (("deadline", 0), ("fifo", 0), ("rr", 100), ("batch", 5), ("x", 0)):
        with pytest.raises(errors.InvalidValue):
            host.set_scheduler(PID, policy, prio)
    with pytest.raises(errors.TargetGone, match="ESRCH"):
        host.set_nice(999, 1)
    host.inject(f"/proc/{PID}/task/{THREADS[0]}:nice", "write", errno.EPERM)
    with pytest.raises(errors.PermissionDenied):
        host.set_nice(THREADS[0], -5)
    assert digest(root) == before and host.writes == []


def test_move_round_trip(tmp_path: Path) -> None:
    root, host = setup(tmp_path)
    host.mkdir(f"{CG}/gputuned.inference")
    before = digest(root)
    home = f"{CG}{read_process(host, PID).cgroup}"
    host.move_to_cgroup(PID, f"{CG}/gputuned.inference")
    assert read_process(host, PID).cgroup == "/gputuned.inference"
    for tid in (PID, *THREADS):
        assert (root / f"proc/{PID}/task/{tid}/cgroup").read_text() == "0::/gputuned.inference\n"
    assert (root / "sys/fs/cgroup/gputuned.inference/cgroup.procs").read_text() == f"{PID}\n"
    assert host.writes[-1] == WriteRecord(f"{CG}/gputuned.inference/cgroup.procs", b"4242")
    host.move_to_cgroup(PID, home)
    assert digest(root) == before


def test_move_errors_say_why(tmp_path: Path) -> None:
    root, host = setup(tmp_path)
    before = digest(root)
    with pytest.raises(errors.Busy, match="no internal processes"):
        host.move_to_cgroup(PID, f"{CG}/process_api")  # it enables memory for its children
    with pytest.raises(errors.TargetGone, match="the process has exited"):
        host.move_to_cgroup(31337, f"{CG}/process_api/core")
    with pytest.raises(errors.TargetGone):
        host.move_to_cgroup(PID, f"{CG}/nonexistent")
    assert digest(root) == before


def test_live_errors_are_explained() -> None:
    at = procctl.where(1, 2, "scheduler")
    err = procctl.explain(OSError(errno.EPERM, os.strerror(errno.EPERM)), at, policy="fifo")
    assert isinstance(err, errors.PermissionDenied)
    if os.geteuid() == 0:
        assert procctl.RT_REFUSED in str(err)
    else:
        assert "CAP_SYS_NICE" in str(err)
    err = procctl.explain(
        OSError(errno.EINVAL, "Invalid argument"),
        procctl.where(1, 2, "affinity"),
        cpus=frozenset({7}),
    )
    assert isinstance(err, errors.InvalidValue) and "cpuset.cpus.effective" in str(err)
    gone = procctl.explain(OSError(errno.ESRCH, "No such process"), at)
    assert isinstance(gone, errors.TargetGone) and "the thread has exited" in str(gone)
