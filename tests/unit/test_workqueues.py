"""`[workqueues]`: the unbound workqueues' CPU mask and each WQ_SYSFS workqueue's own, planned,
applied, verified and reverted on copies of the H200 tree (which has 16 CPUs; the workqueue
files are added here as Linux 6.8+ shows them: every CPU, none isolated)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputuned.cli import main as cli
from gputuned.cpulist import format_mask, parse_cpulist
from gputuned.engine.opcheck import refusal
from gputuned.errors import ProfileError
from gputuned.kernel.masks import PF_NO_SETAFFINITY, WORKQUEUES
from gputuned.kernel.procfs import FLAGS, PF_KTHREAD, edit_stat, parse_status
from gputuned.profile.load import parse_profile
from gputuned.settings.base import Op
from tests.fakeproc import add_process, remove_process
from tests.unit.test_apply import digest, tree_copy

WQ = WORKQUEUES.lstrip("/")
PROFILE = """name = "wq"
[cpusets.housekeeping]
cpus = "0,8"
[workqueues]
cpus = "housekeeping"
"""


def tree(tmp_path: Path, *, isolated: str = "0000") -> Path:
    root = tree_copy("h200-vm", tmp_path)
    wq = root / WQ
    for folder in ("", "writeback", "blkcg_punt_bio"):
        (wq / folder).mkdir(parents=True, exist_ok=True)
        (wq / folder / "cpumask").write_text("ffff\n")
    (wq / "events_unbound").mkdir()  # a workqueue without WQ_SYSFS: no cpumask of its own
    (wq / "cpumask_isolated").write_text(isolated + "\n")
    return root


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    rc = cli.main([*args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def planned(
    capsys: pytest.CaptureFixture[str], prof: str, root: Path
) -> tuple[dict[str, object], list[dict[str, str]]]:
    """The plan of ``prof`` on the tree ``root`` (exit 0), and its changes."""
    rc, plan = run(capsys, "plan", prof, "--root", str(root))
    assert rc == 0
    changes = plan["changes"]
    assert isinstance(changes, list)
    return plan, changes


def profile_file(tmp_path: Path, text: str = PROFILE) -> str:
    path = tmp_path / "wq.toml"
    path.write_text(text)
    return str(path)


def test_unbound_work_moves_to_the_set_and_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree(tmp_path)
    before = digest(root)
    prof = profile_file(tmp_path)
    _, changes = planned(capsys, prof, root)
    assert [(c["target"], c["current"], c["wanted"]) for c in changes] == [
        ("unbound workqueues", "ffff", "0101"),
        ("workqueue blkcg_punt_bio", "ffff", "0101"),
        ("workqueue writeback", "ffff", "0101"),
    ]
    assert digest(root) == before

    assert run(capsys, "apply", prof, "--root", str(root))[0] == 0
    for folder in ("", "writeback", "blkcg_punt_bio"):
        assert (root / WQ / folder / "cpumask").read_text().strip() == "0101"
    assert not (root / WQ / "events_unbound" / "cpumask").exists()
    assert run(capsys, "verify", prof, "--root", str(root))[0] == 0

    (root / WQ / "writeback" / "cpumask").write_text("ffff\n")  # someone widened it again
    rc, report = run(capsys, "verify", prof, "--root", str(root))
    assert rc == 1, report

    assert cli.main(["revert", "--root", str(root)]) == 0
    capsys.readouterr()
    assert digest(root) == before


def test_what_the_kernel_already_keeps_off_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree(tmp_path, isolated="00fe")
    rc, plan = run(capsys, "plan", profile_file(tmp_path), "--root", str(root))
    assert rc == 0
    assert (
        "workqueues: the kernel already keeps unbound work off CPUs 1-7 "
        "(isolated partitions or isolcpus=)"
    ) in plan["notes"]  # type: ignore[operator]


def test_a_kernel_without_the_files_is_told_not_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_copy("h200-vm", tmp_path)
    rc, plan = run(capsys, "plan", profile_file(tmp_path), "--root", str(root))
    assert rc == 0
    refused = plan["refused"]
    assert isinstance(refused, list)
    assert [(r["tuner"], r["target"]) for r in refused] == [("workqueues", "unbound workqueues")]
    assert "Linux before 4.2" in refused[0]["reason"]
    assert plan["changes"] == []


def test_keep_and_report_only_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree(tmp_path)
    before = digest(root)
    keep = PROFILE.replace('cpus = "housekeeping"\n', 'cpus = "keep"\n')
    assert (
        run(capsys, "plan", profile_file(tmp_path, keep), "--root", str(root))[1]["changes"] == []
    )
    report_only = PROFILE + "report_only = true\n"
    assert run(capsys, "apply", profile_file(tmp_path, report_only), "--root", str(root))[0] == 0
    assert digest(root) == before


def test_the_set_must_exist() -> None:
    with pytest.raises(ProfileError) as exc:
        parse_profile({"name": "x", "workqueues": {"cpus": "nosuch"}}, "t")
    assert exc.value.problems == [
        (
            "workqueues.cpus",
            "unknown CPU set 'nosuch'; no set is defined; define it first as [cpusets.nosuch]; "
            "or 'keep', to leave it as it is",
        )
    ]


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/sys/devices/virtual/workqueue/cpumask", True),
        ("/sys/devices/virtual/workqueue/writeback/cpumask", True),
        ("/sys/devices/virtual/workqueue/../cpumask", False),
        ("/sys/devices/virtual/workqueue/a/b/cpumask", False),
        ("/sys/devices/virtual/workqueue/writeback/max_active", False),
        ("/sys/devices/virtual/workqueue/cpumask_requested", False),
    ],
)
def test_a_journal_names_only_workqueue_masks(path: str, ok: bool) -> None:
    """The user relies on revert writing only a workqueue's CPU mask, whatever a journal says."""
    op = Op("k", "workqueues", "t", "sysfs", path, "ffff", compare="mask")
    assert (refusal(op, "ffff") is None) is ok


# ---- kernel threads (kthreads = true) ---------------------------------------------------------

#: (pid, comm, CPUs, flags, start time): kthreadd and a kswapd that may move, two the kernel
#: binds to one CPU (PF_NO_SETAFFINITY: sched_setaffinity refuses them), one already on the set.
KTHREADS = [
    (2, "kthreadd", "0-15", PF_KTHREAD, 3),
    (47, "kswapd0", "0-15", PF_KTHREAD, 80),
    (20, "migration/0", "0", PF_KTHREAD | PF_NO_SETAFFINITY, 11),
    (30, "ksoftirqd/3", "3", PF_KTHREAD | PF_NO_SETAFFINITY, 12),
    (52, "irq/24-ACPI:Ged", "0,8", PF_KTHREAD, 90),
]


def add_kthread(root: Path, pid: int, comm: str, cpus: str, flags: int, start: int) -> None:
    """A kernel thread as /proc shows one: PF_KTHREAD in stat's flags, no command line, no
    exe, in the root cgroup, started by kthreadd (kthreadd itself by nobody, PPid 0)."""
    add_process(
        root,
        pid,
        comm=comm,
        cmdline=[],
        exe=None,
        start_time=start,
        cgroup="/",
        cpus=cpus,
        ppid=0 if pid == 2 else 2,
    )
    for stat in (root / f"proc/{pid}/stat", root / f"proc/{pid}/task/{pid}/stat"):
        stat.write_text(edit_stat(stat.read_text(), {FLAGS: flags}))


def kthread_tree(tmp_path: Path) -> Path:
    root = tree(tmp_path)
    for pid, comm, cpus, flags, start in KTHREADS:
        add_kthread(root, pid, comm, cpus, flags, start)
    return root


def allowed(root: Path, pid: int) -> str:
    status = (root / f"proc/{pid}/task/{pid}/status").read_text()
    return parse_status(status)["Cpus_allowed_list"]


def test_movable_kthreads_move_to_the_set_and_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = kthread_tree(tmp_path)
    before = digest(root)
    prof = profile_file(tmp_path)
    plan, changes = planned(capsys, prof, root)
    assert [(c["target"], c["current"], c["wanted"]) for c in changes][3:] == [
        ("kernel thread kthreadd (pid 2)", "0-15", "0,8"),
        ("kernel thread kswapd0 (pid 47)", "0-15", "0,8"),
    ]
    assert (
        "workqueues: 3 movable kernel thread(s) kept on CPUs 0,8 (1 there already); 2 "
        "bound to their CPUs by the kernel left where they are"
    ) in plan["notes"]  # type: ignore[operator]

    assert run(capsys, "apply", prof, "--root", str(root))[0] == 0
    assert [allowed(root, pid) for pid, *_ in KTHREADS] == ["0,8", "0,8", "0", "3", "0,8"]
    rc, report = run(capsys, "verify", prof, "--root", str(root))
    assert rc == 0, report

    set_affinity(root, 47, "0-15")  # the kernel, or someone, widened it again
    assert run(capsys, "verify", prof, "--root", str(root))[0] == 1

    # Revert puts back what it changed and nothing else: not the bound ones, nor the one that
    # was on the set already, though they show CPUs kthreadd was given (kthreadd's children
    # inherit nothing from it: kernel/kthread.c kthread() resets each one's mask).
    assert cli.main(["revert", "--root", str(root)]) == 0
    capsys.readouterr()
    assert digest(root) == before


def test_what_partitions_already_keep_kthreads_off_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = kthread_tree(tmp_path)
    (root / "sys/fs/cgroup/cpuset.cpus.effective").write_text("0-3,8\n")  # 4-7 partitioned
    rc, plan = run(capsys, "plan", profile_file(tmp_path), "--root", str(root))
    assert rc == 0
    assert (
        "workqueues: cpuset partitions already keep movable kernel threads off CPUs 4-7,9-15"
    ) in plan["notes"]  # type: ignore[operator]


def test_a_kthread_that_ended_or_whose_pid_was_reused_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = kthread_tree(tmp_path)
    prof = profile_file(tmp_path)
    assert run(capsys, "apply", prof, "--root", str(root))[0] == 0
    assert allowed(root, 47) == allowed(root, 2) == "0,8"
    remove_process(root, 47)  # kswapd0 ended, and its pid went to a user's process
    add_process(root, 47, comm="bash", cmdline=["bash"], exe="/bin/bash", start_time=99000)
    rc, report = run(capsys, "verify", prof, "--root", str(root))
    assert rc == 0, report
    settings = report["settings"]
    assert isinstance(settings, list)
    assert not any("47" in s["target"] for s in settings)

    assert cli.main(["revert", "--root", str(root)]) == 0
    capsys.readouterr()
    assert allowed(root, 47) == "0-15"  # the new process's own, never written
    assert allowed(root, 2) == "0-15"


def test_kthreads_false_leaves_kernel_threads_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = kthread_tree(tmp_path)
    before = digest(root)
    prof = profile_file(tmp_path, PROFILE + "kthreads = false\n")
    _, changes = planned(capsys, prof, root)
    assert not any("kernel thread" in c["target"] for c in changes)
    assert run(capsys, "apply", prof, "--root", str(root))[0] == 0
    assert [allowed(root, pid) for pid, *_ in KTHREADS] == ["0-15", "0-15", "0", "3", "0,8"]
    assert cli.main(["revert", "--root", str(root)]) == 0
    capsys.readouterr()
    assert digest(root) == before


def set_affinity(root: Path, pid: int, cpus: str) -> None:
    """Someone else sets ``pid``'s CPUs (the tree's 16 CPUs: 4 hex digits of mask)."""
    rows = {
        "Cpus_allowed": format_mask(parse_cpulist(cpus), 16),
        "Cpus_allowed_list": cpus,
    }
    for status in (root / f"proc/{pid}/status", root / f"proc/{pid}/task/{pid}/status"):
        lines = status.read_text().splitlines(keepends=True)
        status.write_text(
            "".join(
                f"{key}:\t{rows[key]}\n" if (key := ln.partition(":")[0]) in rows else ln
                for ln in lines
            )
        )
