"""`[workqueues]` against this machine's real kernel: the unbound workqueues' mask and each
WQ_SYSFS workqueue's own move to CPU 0, and so does every kernel thread that may be moved
(kthreadd included), read back as the kernel shows them; verify passes, and revert puts every
mask and every kernel thread's CPUs back (the test puts them back itself if anything fails on
the way)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputuned.cpulist import parse_cpulist, parse_mask
from gputuned.engine.apply import apply_profile, read_state, revert_all
from gputuned.engine.plan import plan_profile
from gputuned.engine.verify import verify_plan
from gputuned.kernel.masks import PF_NO_SETAFFINITY, WORKQUEUES
from gputuned.kernel.procfs import FLAGS, PF_KTHREAD, parse_stat, parse_status
from gputuned.profile.load import parse_profile
from gputuned.store.state import ETC_DIR, JOURNAL
from tests.faults import live_kernel

pytestmark = [pytest.mark.usefixtures("as_root"), pytest.mark.needs("writable_workqueues")]

PROFILE = {
    "name": "workqueues-live",
    "cpusets": {"housekeeping": {"cpus": "0"}},
    "workqueues": {"cpus": "housekeeping"},
}

Kthreads = dict[int, tuple[int, str]]


def masks() -> dict[Path, str]:
    root = Path(WORKQUEUES)
    return {p: p.read_text() for p in [root / "cpumask", *sorted(root.glob("*/cpumask"))]}


def kthreads() -> Kthreads:
    """Each kernel thread that may be moved: pid -> (start time, Cpus_allowed_list)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            st = parse_stat((d / "stat").read_text())
            flags = st.field(FLAGS)
            if flags & PF_KTHREAD and not flags & PF_NO_SETAFFINITY:
                allowed = parse_status((d / "status").read_text())["Cpus_allowed_list"]
                out[int(d.name)] = (st.start_time, allowed)
    return out


def alive(was: Kthreads) -> Kthreads:
    """Those of ``was`` still running as the same thread (PID and start time), as they are now."""
    now = kthreads()
    return {pid: now[pid] for pid, (start, _) in was.items() if now.get(pid, (0,))[0] == start}


@pytest.fixture
def before() -> Iterator[tuple[dict[Path, str], Kthreads]]:
    if not Path(WORKQUEUES, "cpumask").exists():
        pytest.skip(f"this kernel has no {WORKQUEUES}/cpumask (Linux before 4.2)")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs: the masks must change for the test to mean anything")
    etc_existed = Path(ETC_DIR).exists()
    was, threads = masks(), kthreads()
    try:
        yield was, threads
    finally:
        if Path(JOURNAL).exists():
            revert_all(live_kernel())
        for path, text in was.items():  # in case revert itself failed
            if path.read_text() != text:
                path.write_text(text)
        for pid, (_start, cpus) in alive(threads).items():
            if cpus != threads[pid][1]:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(pid, parse_cpulist(threads[pid][1]))
        if not etc_existed:
            import shutil

            shutil.rmtree(ETC_DIR, ignore_errors=True)


def test_kernel_work_moves_to_cpu_0_and_back(before: tuple[dict[Path, str], Kthreads]) -> None:
    was, threads = before
    assert threads[2][1] != "0", "kthreadd must not be on CPU 0 alone already"
    profile = parse_profile(PROFILE, "test")
    _plan, report = apply_profile(live_kernel(), profile)
    assert report.failed == []
    after = masks()
    assert set(after) == set(was)
    assert {parse_mask(v) for v in after.values()} == {frozenset({0})}
    kernel_threads = [w for w in report.written if w["target"].startswith("kernel thread ")]
    assert len(report.written) - len(kernel_threads) == len(was), "the global mask, each own"
    assert any(w["target"].startswith("kernel thread kthreadd (pid 2)") for w in kernel_threads)
    moved = alive(threads)
    assert moved[2][1] == "0"
    assert {cpus for _start, cpus in moved.values()} == {"0"}, moved
    rep = verify_plan(plan_profile(live_kernel(), profile), read_state(live_kernel()))
    assert rep.exit_code == 0, rep.to_json()

    rev = revert_all(live_kernel())
    assert rev.failed == []
    assert masks() == was
    back = alive(threads)
    assert back == {pid: threads[pid] for pid in back}
