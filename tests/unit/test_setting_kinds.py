"""The setting classes, kind by kind: how each reads, writes, says whether the machine holds a
value, puts the old one back and refuses journal entries it never writes.

Against copies of the H200 tree (cgroup v2 with cpuset and cpu enabled at the root, 16 CPUs)
with a vLLM-like server (tests/unit/test_apply.py tree_copy: PID 4242, three more threads), the
kinds found through the registry as apply and revert find them, and written through the
engine's own steps (engine/commit.py write_one, engine/writer.py, engine/revert.py revert_all)
where a behaviour is theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.changes import Change
from gputuned.engine.applyreport import ApplyError, ApplyReport
from gputuned.engine.commit import write_one
from gputuned.engine.journal import Journal
from gputuned.engine.opcheck import refusal
from gputuned.engine.revert import revert_all
from gputuned.engine.writer import Writer
from gputuned.kernel.systemd import dropin
from gputuned.kernel.tasks import where
from gputuned.settings.base import ABSENT, Op, ReadBackMismatch, Reused, SetBack, Setting
from gputuned.settings.registry import expand, setting, start_write
from gputuned.settings.threads import DEFAULT_AFFINITY, ThreadAttribute
from tests.fakeproc import add_process, remove_process
from tests.faults import FaultKernel, tree_kernel
from tests.unit.test_apply import SERVER_PID, tree_copy

PID = SERVER_PID
START = 123456  # the server's start time (tree_copy)
CG = "/sys/fs/cgroup"
HOME = "/user.slice/user-0.slice/session-1.scope"  # the server's cgroup (fakeproc's default)
UNIT = "inference.service"
UNIT_CG = f"{CG}/system.slice/{UNIT}"


def host(tmp_path: Path, *, systemd: bool = False) -> tuple[Path, FaultKernel]:
    """A copy of the H200 tree with the server; ``systemd``: systemd is PID 1, with the
    folder gputuned.service mounts for runtime drop-ins, and a service unit's cgroup."""
    root = tree_copy("h200-vm", tmp_path)
    kernel = tree_kernel(root)
    if systemd:
        (root / "run/systemd/system").mkdir(parents=True)
        (root / "run/systemd/system.control").mkdir()
        kernel.mkdir(f"{CG}/system.slice")
        kernel.mkdir(UNIT_CG)
    return root, kernel


def fresh(kernel: FaultKernel) -> FaultKernel:
    """The same tree, an empty write log."""
    return tree_kernel(kernel.root)


def thread_ops(attr: str, threads: dict[int, str], **data: Any) -> list[Op]:
    """A plan's change of one attribute of the server's threads, as tuners/procwrite.py makes
    it, expanded into its ops."""
    ch = Change(
        "process",
        f"server {attr}",
        "",
        "",
        "test",
        key=f"thread:{PID}:{START}:{attr}",
        kind="thread",
        data={
            "pid": PID,
            "start": START,
            "attr": attr,
            "threads": threads,
            "cgmount": CG,
            **data,
        },
    )
    return expand(ch)


def thread_op(attr: str, value: str, tid: int = PID, **data: Any) -> Op:
    return thread_ops(attr, {tid: value}, **data)[0]


def cgroup_op(value: str = "/gputuned.inference", **data: Any) -> Op:
    ch = Change(
        "process",
        "server cgroup",
        HOME,
        value,
        "test",
        key=f"proc_cgroup:{PID}:{START}",
        kind="proc_cgroup",
        data={"pid": PID, "start": START, "mount": CG, **data},
    )
    return expand(ch)[0]


def op_of(kind: str, path: str, value: str, **data: Any) -> Op:
    return expand(Change("test", path, "", value, "test", path, kind=kind, data=data))[0]


def reuse_pid(root: Path) -> None:
    """The server exits and another process gets its PID (another start time)."""
    remove_process(root, PID)
    add_process(
        root,
        PID,
        comm="sshd",
        cmdline=["/usr/sbin/sshd", "-D"],
        exe="/usr/sbin/sshd",
        start_time=START + 777,
        threads=[PID + 1],
    )


def read_file(root: Path, hpath: str) -> str:
    return (root / hpath.lstrip("/")).read_text().strip()


def writes(kernel: FaultKernel) -> list[tuple[str, str]]:
    return [(w.path, w.data.decode()) for w in kernel.writes]


def apply_ops(kernel: FaultKernel, ops: list[Op], *, keep_going: bool = True) -> ApplyReport:
    """Apply's writer, one op after another, as for a plan's changes."""
    report = ApplyReport()
    ch = Change("test", "t", "", "", "test")
    Writer(kernel, Journal(kernel), report, keep_going).one_by_one([(ch, op) for op in ops])
    return report


# ---- a process's identity ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "value"),
    [
        (thread_op("nice", "-5"), "-5"),
        (thread_op("policy", "batch"), "batch"),
        (thread_op("affinity", "2-3"), "2-3"),
        (cgroup_op(), "/"),
    ],
    ids=["nice", "policy", "affinity", "cgroup"],
)
def test_a_reused_pid_is_never_read_or_written(tmp_path: Path, op: Op, value: str) -> None:
    """The user relies on gputuned never touching another process that got the PID of one it
    tuned: PID and start time are checked before every read and every write (Reused)."""
    root, kernel = host(tmp_path)
    reuse_pid(root)
    kind = setting(op.kind)
    with pytest.raises(Reused, match=f"PID {PID} was reused"):
        kind.read(kernel, op)
    with pytest.raises(Reused):
        kind.write(kernel, op, value)
    assert kernel.writes == []


def test_revert_leaves_a_reused_pid_alone_and_is_not_a_failure(tmp_path: Path) -> None:
    """The user relies on revert after the server restarted (its PID taken by another process)
    neither touching that process nor failing: its settings ended with the server."""
    root, kernel = host(tmp_path)
    journal = Journal(kernel)
    journal.save(thread_op("nice", "-5"), "0")
    journal.save(thread_op("affinity", "2-3"), "0-15")
    journal.save(cgroup_op(), HOME)
    reuse_pid(root)
    before = (root / f"proc/{PID}/stat").read_bytes()
    report = revert_all(kernel)
    assert report.failed == []
    assert len(Journal(kernel)) == 0
    assert (root / f"proc/{PID}/stat").read_bytes() == before
    assert not [w for w in kernel.writes if w.path.startswith((f"/proc/{PID}", f"{CG}/"))]


def test_apply_skips_what_went_with_its_owner_and_fails_the_rest(tmp_path: Path) -> None:
    """The user relies on apply skipping, not failing, a setting whose owner went meanwhile: a
    process that exited, a unit that stopped, a unit's cgroup that was removed; while a cgroup
    gputuned manages itself that vanished is a failure it reports."""
    root, kernel = host(tmp_path, systemd=True)
    scope = f"{CG}/user.slice/user-1000.slice/session-9.scope"
    remove_process(root, PID)
    gone = [
        thread_op("nice", "-5"),
        cgroup_op(),
        op_of(
            "unit_property",
            dropin("session-9.scope"),
            "2-3",
            unit="session-9.scope",
            property="AllowedCPUs",
        ),
        op_of("borrowed_cpuset", f"{scope}/cpuset.cpus", "2-3"),
    ]
    report = apply_ops(kernel, gone, keep_going=False)
    assert [s["target"] for s in report.skipped] == [op.target for op in gone]
    assert report.failed == [] and report.written == []
    mine = op_of("controller", f"{CG}/gone/cgroup.subtree_control", "+cpuset", controller="cpuset")
    with pytest.raises(ApplyError):
        apply_ops(kernel, [mine], keep_going=False)


# ---- nice, policy, affinity -------------------------------------------------------------------


def test_a_thread_change_becomes_one_op_per_thread_in_thread_order() -> None:
    """The user relies on every thread of a process getting its own journal entry (one per
    thread, keyed by PID, start time and thread), written in thread order, each with what the
    plan knew about it."""
    ops = thread_ops(
        "nice",
        {10010: "-2", 9999: "-1", PID: "-3"},
        old={PID: "0", 9999: "5", 10010: "0"},
        origin={9999: "5"},
    )
    assert [op.key for op in ops] == [
        f"thread:{PID}:{START}:{PID}:nice",
        f"thread:{PID}:{START}:9999:nice",
        f"thread:{PID}:{START}:10010:nice",
    ]
    assert [op.value for op in ops] == ["-3", "-1", "-2"]
    assert [op.kind for op in ops] == ["nice"] * 3
    assert [op.data["tid"] for op in ops] == [PID, 9999, 10010]
    assert [op.data["planned_old"] for op in ops] == ["0", "5", "0"]
    assert [op.data["origin"] for op in ops] == [None, "5", None]
    assert {op.data["ppid"] for op in ops} == {0}  # a plan that knew no parent
    assert ops[1].target == "server nice (thread 9999)"


def test_nice_is_written_per_thread_read_back_and_restored(tmp_path: Path) -> None:
    """The user relies on a nice level reaching exactly the threads named, reading back as
    written, and the old one going back."""
    _, kernel = host(tmp_path)
    ops = thread_ops("nice", {PID: "-10", PID + 2: "5"})
    nice = setting("nice")
    assert [nice.original(kernel, op) for op in ops] == ["0", "0"]
    for op in ops:
        nice.write(kernel, op, op.value)
    assert [nice.holds(kernel, op, op.value) for op in ops] == [(True, "-10"), (True, "5")]
    assert nice.read(kernel, thread_op("nice", "0", PID + 1)) == "0"  # not named: untouched
    assert writes(kernel) == [
        (where(PID, PID, "nice"), "-10"),
        (where(PID, PID + 2, "nice"), "5"),
    ]
    for op in ops:
        nice.write(kernel, op, "0")
    assert nice.holds(kernel, ops[1], "5") == (False, "0")


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("-20", True),
        ("19", True),
        ("0", True),
        ("-21", False),
        ("20", False),
        ("abc", False),
        ("5.0", False),
        ("", False),
    ],
)
def test_nice_levels_outside_the_kernels_range_are_refused(value: str, ok: bool) -> None:
    """The user relies on revert writing only nice levels the kernel has (-20..19) from a
    journal entry."""
    op = thread_op("nice", "0")
    assert (refusal(op, value) is None) is ok


def test_policies_are_written_with_their_priority_and_read_back(tmp_path: Path) -> None:
    """The user relies on a real-time policy being set with its priority and read back in the
    journal's form ("fifo:10"), and the normal policies without one."""
    _, kernel = host(tmp_path)
    kernel.move_to_cgroup(PID, CG)  # the root cgroup: real-time allowed there
    kernel = fresh(kernel)
    policy = setting("policy")
    op = thread_op("policy", "fifo:10", PID + 1)
    assert policy.original(kernel, op) == "other"
    for value in ("fifo:10", "rr:5", "batch", "idle", "other"):
        policy.write(kernel, op, value)
        assert policy.holds(kernel, op, value) == (True, value)
    assert writes(kernel) == [
        (where(PID, PID + 1, "scheduler"), "fifo 10"),
        (where(PID, PID + 1, "scheduler"), "rr 5"),
        (where(PID, PID + 1, "scheduler"), "batch 0"),
        (where(PID, PID + 1, "scheduler"), "idle 0"),
        (where(PID, PID + 1, "scheduler"), "other 0"),
    ]


def test_real_time_refused_for_lack_of_an_rt_budget_is_a_limit_of_the_host(
    tmp_path: Path,
) -> None:
    """The user relies on a real-time policy the kernel refuses in a cgroup without an RT
    budget being reported as not possible here (with the kernel's reason), not as a failure of
    gputuned; other errors are not excused."""
    _, kernel = host(tmp_path)  # the server's session cgroup: cpu enabled, no RT runtime
    policy = setting("policy")
    op = thread_op("policy", "fifo:10")
    with pytest.raises(errors.PermissionDenied) as refused:
        policy.write(kernel, op, "fifo:10")
    assert policy.not_possible(op, refused.value) == str(refused.value)
    assert policy.not_possible(op, errors.TargetGone("gone")) is None
    assert setting("nice").not_possible(op, refused.value) is None


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("other", True),
        ("batch", True),
        ("idle", True),
        ("fifo:1", True),
        ("rr:99", True),
        ("fifo", False),
        ("fifo:100", False),
        ("other:0", False),
        ("deadline", False),
    ],
)
def test_policies_gputuned_never_sets_are_refused(value: str, ok: bool) -> None:
    """The user relies on revert setting only the policies gputuned writes."""
    assert (refusal(thread_op("policy", "other"), value) is None) is ok


def test_an_affinity_is_written_and_read_back_as_a_cpu_list(tmp_path: Path) -> None:
    """The user relies on a thread's CPUs reading back in the kernel's list form, so that a
    value written reads back the same, and the old CPUs going back on revert."""
    _, kernel = host(tmp_path)
    affinity = setting("affinity")
    op = thread_op("affinity", "2-3,5", PID + 3)
    assert affinity.original(kernel, op) == "0-15"
    affinity.write(kernel, op, "5,3,2")
    assert affinity.holds(kernel, op, "2-3,5") == (True, "2-3,5")
    assert affinity.holds_already(kernel, op, "2-3,5")
    affinity.write(kernel, op, "0-15")
    assert affinity.holds(kernel, op, "2-3,5") == (False, "0-15")
    assert not affinity.holds_already(kernel, op, "2-3,5")
    assert writes(kernel) == [
        (where(PID, PID + 3, "affinity"), "2-3,5"),
        (where(PID, PID + 3, "affinity"), "0-15"),
    ]


def test_the_cgroup_default_affinity_allows_every_cpu(tmp_path: Path) -> None:
    """The user relies on a thread that never chose its CPUs getting back "every CPU" (the
    kernel narrows it to its cpuset and widens it again), and on that holding whenever the
    thread restricts nothing its cgroup allows."""
    _, kernel = host(tmp_path)
    affinity = setting("affinity")
    op = thread_op("affinity", "2-3")
    affinity.write(kernel, op, "2-3")
    assert affinity.holds(kernel, op, DEFAULT_AFFINITY) == (False, "2-3")
    affinity.write(kernel, op, DEFAULT_AFFINITY)
    assert writes(kernel)[-1] == (where(PID, PID, "affinity"), "0-15")
    assert affinity.holds(kernel, op, DEFAULT_AFFINITY) == (True, "0-15")
    # It is always written: a pin to exactly the cgroup's CPUs would read the same.
    assert not affinity.holds_already(kernel, op, DEFAULT_AFFINITY)


def test_a_thread_narrowed_by_its_cpuset_holds_the_default_affinity(tmp_path: Path) -> None:
    """The user relies on a thread inside a partition, whose affinity the kernel shows as its
    cpuset's CPUs, counting as holding "every CPU its cgroup allows" (no endless drift repair),
    while one pinned to fewer CPUs does not."""
    _, kernel = host(tmp_path)
    kernel.mkdir(f"{CG}/gputuned.inference")
    kernel.write_text(f"{CG}/gputuned.inference/cpuset.cpus", "8-15")
    kernel.move_to_cgroup(PID, f"{CG}/gputuned.inference")
    affinity = setting("affinity")
    main, other = thread_op("affinity", "8-15"), thread_op("affinity", "8-15", PID + 1)
    affinity.write(kernel, main, "8-15")
    affinity.write(kernel, other, "8-11")
    assert affinity.holds(kernel, main, DEFAULT_AFFINITY) == (True, "8-15")
    assert affinity.holds(kernel, other, DEFAULT_AFFINITY) == (False, "8-11")
    # Without the cgroup mount known, every online CPU is what it must allow.
    bare = thread_op("affinity", "8-15", cgmount=None)
    assert affinity.holds(kernel, bare, DEFAULT_AFFINITY) == (False, "8-15")


def test_a_thread_that_never_chose_its_cpus_journals_the_default(tmp_path: Path) -> None:
    """The user relies on revert giving a thread that never set its CPUs "every CPU" back,
    not the CPUs it happened to show when gputuned planned (a move narrows them)."""
    _, kernel = host(tmp_path)
    affinity = setting("affinity")
    assert affinity.original(kernel, thread_op("affinity", "2-3")) == "0-15"
    unset = thread_op("affinity", "2-3", old={PID: DEFAULT_AFFINITY})
    assert affinity.original(kernel, unset) == DEFAULT_AFFINITY


def test_a_thread_is_said_to_set_its_cpus_back_only_when_it_is_on_the_old_ones(
    tmp_path: Path,
) -> None:
    """The user relies on a write the thread undid at once (an engine binding its own CPUs)
    being told apart from one the kernel did not take: only a thread back on its old CPUs set
    them back."""
    _, kernel = host(tmp_path)
    op = thread_op("affinity", "2-3")
    kernel.inject(where(PID, PID, "affinity"), "drop", 0)
    with pytest.raises(SetBack):
        write_one(kernel, Journal(kernel), op)
    affinity = setting("affinity")
    assert affinity.set_back(kernel, op, "0-15")
    assert not affinity.set_back(kernel, op, "4-7")


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("0-3,8", True),
        ("", True),
        (DEFAULT_AFFINITY, True),
        ("all", False),
        ("0-3; reboot", False),
        ("1" * 4097, False),
    ],
)
def test_affinities_that_are_no_cpu_list_are_refused(value: str, ok: bool) -> None:
    """The user relies on revert writing only CPU lists (or the cgroup default) as a thread's
    affinity."""
    assert (refusal(thread_op("affinity", "0"), value) is None) is ok


@pytest.mark.parametrize(
    ("data", "ok"),
    [
        ({}, True),
        ({"start": 0}, True),  # started at boot
        ({"pid": 0}, False),
        ({"pid": -4242}, False),
        ({"start": -1}, False),
        ({"tid": -1}, False),
        ({"pid": True}, False),
        ({"pid": "4242"}, False),
        ({"tid": None}, False),
    ],
)
def test_thread_entries_must_name_a_process_and_a_thread(data: dict[str, Any], ok: bool) -> None:
    """The user relies on revert refusing a journaled thread setting that does not name a real
    process (PID, start time) and thread: it could write to any task."""
    op = thread_op("nice", "-5")
    op = Op(**{**op.to_json(), "data": {**op.data, **data}})
    assert (refusal(op, "0") is None) is ok


# ---- a whole process's cgroup -------------------------------------------------------------------


def test_a_process_moves_between_cgroups_and_back(tmp_path: Path) -> None:
    """The user relies on a process moving (all its threads) into the cgroup named, reading
    back as /proc shows it, and going back where it came from, the root cgroup too."""
    root, kernel = host(tmp_path)
    kernel.mkdir(f"{CG}/gputuned.inference")
    kernel = fresh(kernel)
    proc = setting("proc_cgroup")
    op = cgroup_op()
    assert proc.original(kernel, op) == HOME
    proc.write(kernel, op, "/gputuned.inference")
    assert proc.holds(kernel, op, "/gputuned.inference") == (True, "/gputuned.inference")
    assert read_file(root, f"/proc/{PID}/task/{PID + 3}/cgroup") == "0::/gputuned.inference"
    proc.write(kernel, op, "/")
    assert proc.read(kernel, op) == "/"
    assert read_file(root, f"/proc/{PID}/task/{PID + 3}/cgroup") == "0::/"
    assert writes(kernel) == [
        (f"{CG}/gputuned.inference/cgroup.procs", str(PID)),
        (f"{CG}/cgroup.procs", str(PID)),
    ]


def test_a_process_without_a_cgroup_v2_line_reads_as_the_root(tmp_path: Path) -> None:
    """The user relies on a process /proc shows in no cgroup v2 (a v1 hierarchy only) reading
    as the root cgroup rather than failing."""
    root, kernel = host(tmp_path)
    (root / f"proc/{PID}/cgroup").write_text("12:cpuset:/\n")
    assert setting("proc_cgroup").read(kernel, cgroup_op()) == "/"


def test_a_process_goes_back_to_the_nearest_cgroup_left(tmp_path: Path) -> None:
    """The user relies on revert moving a process whose original cgroup was removed meanwhile
    (a unit restarted) to that cgroup's nearest existing ancestor."""
    _, kernel = host(tmp_path)
    op = cgroup_op()
    proc = setting("proc_cgroup")
    assert proc.restoring(kernel, op, HOME) == (op, HOME)
    assert proc.restoring(kernel, op, f"{HOME}/gone/deeper") == (op, HOME)
    assert proc.restoring(kernel, op, "/nothing/here") == (op, "/")


@pytest.mark.parametrize(
    ("value", "data", "ok"),
    [
        ("/gputuned.inference", {}, True),
        ("/", {}, True),
        ("/system.slice/x.service", {"start": 0}, True),
        ("/a/../../etc", {}, False),
        ("/..", {}, False),
        ("gputuned.inference", {}, False),
        ("/a//b", {}, False),
        ("/gputuned.inference", {"mount": "/etc"}, False),
        ("/gputuned.inference", {"mount": None}, False),
        ("/gputuned.inference", {"pid": 0}, False),
        ("/gputuned.inference", {"start": -5}, False),
    ],
)
def test_process_cgroup_entries_are_only_cgroups_under_the_mount(
    value: str, data: dict[str, Any], ok: bool
) -> None:
    """The user relies on revert moving a process only into a cgroup under the cgroup v2
    mount, never climbing out with '..', and only for an entry naming a process."""
    op = cgroup_op()
    op = Op(**{**op.to_json(), "data": {**op.data, **data}})
    assert "tid" not in op.data  # a whole process: no thread named
    assert (refusal(op, value) is None) is ok


# ---- cgroups gputuned makes, controllers, neighbours' cpu files ------------------------------------


def test_a_cgroup_is_made_once_and_removed_on_revert(tmp_path: Path) -> None:
    """The user relies on apply making the partition's cgroup only where it is missing, the
    journal knowing it was absent, and revert removing only that cgroup."""
    root, kernel = host(tmp_path)
    part = f"{CG}/gputuned.inference"
    op = op_of("cgroup", part, "present")
    journal = Journal(kernel)
    assert write_one(kernel, journal, op) == (ABSENT, True)
    assert (root / part.lstrip("/")).is_dir()
    assert write_one(kernel, journal, op) is None  # there: nothing to do
    assert writes(kernel) == [(f"{part}:mkdir", "")]
    assert not revert_all(kernel).failed
    assert not (root / part.lstrip("/")).exists()
    assert writes(kernel)[1:] == [(f"{part}:rmdir", "")]


def test_a_cgroup_that_was_there_before_is_left_and_a_missing_one_not_removed(
    tmp_path: Path,
) -> None:
    """The user relies on putting back "present" never removing a cgroup, and putting back
    "absent" where it has already gone writing nothing."""
    _, kernel = host(tmp_path)
    cgdir = setting("cgroup")
    home = op_of("cgroup", f"{CG}{HOME}", "present")
    cgdir.write(kernel, home, "present")
    gone = op_of("cgroup", f"{CG}/never", "present")
    cgdir.write(kernel, gone, ABSENT)
    assert kernel.writes == []
    assert cgdir.read(kernel, home) == "present" and cgdir.read(kernel, gone) == ABSENT


def test_a_kind_written_at_once_is_done_when_started(tmp_path: Path) -> None:
    """The user relies on every write but a remount being complete when apply goes on to the
    next one (only a remount runs in the background)."""
    root, kernel = host(tmp_path)
    part = f"{CG}/gputuned.inference"
    finish = start_write(kernel, op_of("cgroup", part, "present"), "present")
    assert (root / part.lstrip("/")).is_dir()
    finish()
    assert not setting("cgroup").in_background and setting("mount").in_background


@pytest.mark.parametrize(
    ("path", "value", "ok"),
    [
        (f"{CG}/gputuned.inference", "present", True),
        (f"{CG}/gputuned.inference", ABSENT, True),
        (f"{CG}/gputuned.inference", "maybe", False),
        (CG, ABSENT, False),  # the root cgroup: never removed
        ("/etc/gputuned", ABSENT, False),
    ],
)
def test_cgroup_entries_name_a_cgroup_below_the_root(path: str, value: str, ok: bool) -> None:
    """The user relies on revert removing only a cgroup below the cgroup v2 root, and only a
    present/absent state."""
    assert (refusal(op_of("cgroup", path, "present"), value) is None) is ok


def test_a_controller_is_enabled_for_children_and_disabled_on_revert(tmp_path: Path) -> None:
    """The user relies on gputuned enabling a controller in a cgroup's subtree_control,
    reading it back as present, and disabling it again where it was off before."""
    root, kernel = host(tmp_path)
    kernel.mkdir(f"{CG}/gputuned.inference")
    kernel = fresh(kernel)
    path = f"{CG}/gputuned.inference/cgroup.subtree_control"
    ch = Change(
        "cpuset", "t", "", "+cpuset", "w", path, kind="controller", data={"controller": "cpuset"}
    )
    (op,) = expand(ch)
    assert op.value == "present"
    ctl = setting("controller")
    assert ctl.read(kernel, op) == ABSENT
    ctl.write(kernel, op, "present")
    assert ctl.holds(kernel, op, "present") == (True, "present")
    assert read_file(root, path) == "cpuset"
    ctl.write(kernel, op, ABSENT)
    assert ctl.read(kernel, op) == ABSENT
    assert writes(kernel) == [(path, "+cpuset"), (path, "-cpuset")]
    gone = op_of("controller", f"{CG}/gone/cgroup.subtree_control", "+cpu", controller="cpu")
    assert ctl.read(kernel, gone) == ABSENT


@pytest.mark.parametrize(
    ("path", "controller", "value", "ok"),
    [
        (f"{CG}/cgroup.subtree_control", "cpuset", "present", True),
        (f"{CG}/user.slice/cgroup.subtree_control", "cpu", ABSENT, True),
        (f"{CG}/cgroup.subtree_control", "memory", ABSENT, False),
        (f"{CG}/cgroup.subtree_control", "cpuset", "+cpuset", False),
        (f"{CG}/cgroup.procs", "cpuset", ABSENT, False),
    ],
)
def test_controller_entries_are_cpuset_or_cpu_in_a_subtree_control(
    path: str, controller: str, value: str, ok: bool
) -> None:
    """The user relies on revert switching only the controllers gputuned enables, only in a
    cgroup.subtree_control."""
    op = op_of("controller", path, "+cpuset", controller=controller)
    assert (refusal(op, value) is None) is ok


def test_a_neighbours_cpu_weight_is_written_read_back_and_restored(tmp_path: Path) -> None:
    """The user relies on a neighbour cgroup's cpu.weight being journaled as it was, reading
    back as written, and the old weight going back."""
    _, kernel = host(tmp_path)
    path = f"{CG}/user.slice/cpu.weight"
    cpu = setting("cgroup_cpu")
    op = op_of("cgroup_cpu", path, "50")
    assert cpu.original(kernel, op) == "100"
    assert cpu.holds(kernel, op, "50") == (False, "100")
    cpu.write(kernel, op, "50")
    assert cpu.holds(kernel, op, "50") == (True, "50")
    cpu.write(kernel, op, "100")
    assert writes(kernel) == [(path, "50"), (path, "100")]


def test_a_neighbour_cgroup_that_has_gone_holds_anything(tmp_path: Path) -> None:
    """The user relies on a neighbour's cgroup that went (a session ended) needing nothing
    written or put back, while one that is there without the cpu controller does not hold."""
    _, kernel = host(tmp_path)
    cpu = setting("cgroup_cpu")
    ended = op_of("cgroup_cpu", f"{CG}/user.slice/session-7.scope/cpu.weight", "50")
    assert cpu.holds(kernel, ended, "50") == (True, "(the cgroup has gone)")
    assert cpu.holds_already(kernel, ended, "100")
    off = op_of("cgroup_cpu", f"{CG}/user.slice/user-0.slice/cpu.weight", "50")
    assert cpu.holds(kernel, off, "50") == (False, "")


def test_a_value_the_kernel_does_not_keep_fails_as_a_read_back(tmp_path: Path) -> None:
    """The user relies on a cgroup file that does not read back as written failing the apply
    with what it read (its other writes undone, nothing after it written), not being blamed on
    a process setting its own value back."""
    root, kernel = host(tmp_path)
    first, second = f"{CG}/user.slice/cpu.weight", f"{CG}/user.slice/user-0.slice/cpu.weight"
    kernel.write_text(f"{CG}/user.slice/cgroup.subtree_control", "+cpu")
    kernel = fresh(kernel)
    kernel.inject(first, "drop", 0)
    ops = [op_of("cgroup_cpu", first, "50"), op_of("cgroup_cpu", second, "50")]
    with pytest.raises(ApplyError, match="reads back '100'") as failed:
        apply_ops(kernel, ops, keep_going=False)
    assert not isinstance(failed.value.__cause__, SetBack)
    assert isinstance(failed.value.__cause__, ReadBackMismatch)
    assert not setting("cgroup_cpu").set_back(kernel, ops[0], "100")
    assert [w.path for w in kernel.writes] == [first, first]  # the write, then its undo
    assert read_file(root, second) == "100"


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("cpu.weight", "50", True),
        ("cpu.weight", "100000", False),
        ("cpu.weight", "max", False),
        ("cpu.max", "max 100000", True),
        ("cpu.max", "800000 100000", True),
        ("cpu.max", "max", False),
        ("cpu.max", "50", False),
        ("cpu.stat", "50", False),
    ],
)
def test_neighbour_entries_are_a_weight_or_a_cap(name: str, value: str, ok: bool) -> None:
    """The user relies on revert writing only a weight or a cap, each in its own form, and only
    to cpu.weight or cpu.max."""
    op = op_of("cgroup_cpu", f"{CG}/user.slice/{name}", "50")
    assert (refusal(op, value) is None) is ok


# ---- systemd units: CPUQuota/CPUWeight, AllowedCPUs ------------------------------------------------


def unit_cpu_op(unit: str = "user.slice", prop: str = "CPUQuota", value: str = "400%") -> Op:
    return expand(
        Change(
            "neighbours",
            f"{unit} {prop}",
            "",
            value,
            "test",
            path=unit,
            key=f"unit_cpu:{unit}:{prop}",
            kind="unit_cpu",
            data={"property": prop, "cgroup": f"{CG}/{unit}"},
        )
    )[0]


def test_a_units_cpu_quota_is_set_through_systemd_and_read_from_its_cgroup(
    tmp_path: Path,
) -> None:
    """The user relies on a unit's CPUQuota= going through systemd (so that its view agrees),
    reading back from the cgroup file systemd writes, and the old value going back."""
    root, kernel = host(tmp_path, systemd=True)
    kernel = fresh(kernel)
    quota = setting("unit_cpu")
    op = unit_cpu_op()
    assert quota.original(kernel, op) == ""
    quota.write(kernel, op, "400%")
    assert read_file(root, f"{CG}/user.slice/cpu.max") == "400000 100000"
    assert quota.read(kernel, op) == "400%"
    assert quota.holds(kernel, op, "400%") == (True, "400%")
    assert quota.holds(kernel, op, "") == (False, "400%")
    quota.write(kernel, op, "")
    assert quota.holds(kernel, op, "") == (True, "(default)")
    assert [w for w, _ in writes(kernel)] == ["user.slice:CPUQuota"] * 2


def test_a_stopped_unit_holds_anything_and_cannot_be_capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user relies on a unit that stopped (a session's scope) needing nothing put back,
    and a cap on it being reported as not possible rather than a failure."""
    _, kernel = host(tmp_path, systemd=True)
    quota = setting("unit_cpu")
    op = unit_cpu_op("session-9.scope")
    assert quota.holds(kernel, op, "400%") == (True, "(the unit has stopped)")
    monkeypatch.setattr(kernel, "unit_property", lambda unit, name: None)  # not loaded
    with pytest.raises(errors.TargetGone, match=r"session-9\.scope: not loaded"):
        quota.read(kernel, op)
    assert quota.not_possible(op, errors.TargetGone("x")) is not None
    assert quota.not_possible(op, errors.InvalidValue("x")) is None


@pytest.mark.parametrize(
    ("unit", "prop", "value", "cgroup", "ok"),
    [
        ("user.slice", "CPUQuota", "400%", f"{CG}/user.slice", True),
        ("user.slice", "CPUQuota", "", f"{CG}/user.slice", True),
        ("user.slice", "CPUQuota", "400", f"{CG}/user.slice", False),
        ("cron.service", "CPUWeight", "50", f"{CG}/system.slice/cron.service", True),
        ("cron.service", "CPUWeight", "fifty", f"{CG}/system.slice/cron.service", False),
        ("user.slice", "AllowedCPUs", "2-3", f"{CG}/user.slice", False),
        ("user slice", "CPUQuota", "400%", f"{CG}/user.slice", False),
        ("user.slice", "CPUQuota", "400%", None, False),
        ("user.slice", "CPUQuota", "400%", "/etc/passwd", False),
    ],
)
def test_unit_cpu_entries_are_a_units_quota_or_weight(
    unit: str, prop: str, value: str, cgroup: str | None, ok: bool
) -> None:
    """The user relies on revert setting only CPUQuota= or CPUWeight= of a unit, in their
    forms, with the unit's cgroup known."""
    op = unit_cpu_op(unit, prop)
    op = Op(**{**op.to_json(), "data": {"property": prop, "cgroup": cgroup}})
    assert (refusal(op, value) is None) is ok


def allowed_op(kept: list[str] | None = None, unit: str = UNIT, path: str | None = None) -> Op:
    ch = Change(
        "cpuset",
        f"unit {unit} AllowedCPUs",
        "-",
        "2-3",
        "test",
        path or dropin(unit),
        kind="unit_property",
        data={"unit": unit, "property": "AllowedCPUs", "cpuset_kept": kept or []},
    )
    return expand(ch)[0]


def test_a_units_allowed_cpus_dropin_is_written_and_removed_again(tmp_path: Path) -> None:
    """The user relies on a unit's AllowedCPUs= set at run time (systemd writes its drop-in and
    the unit's cpuset.cpus), and on revert leaving /run as it was: the drop-in and its folder
    gone, the folder gputuned.service mounts kept, the root's cpuset controller back."""
    root, kernel = host(tmp_path, systemd=True)
    kernel = fresh(kernel)
    prop = setting("unit_property")
    op = allowed_op([CG])
    assert op.value == "2-3|present"
    assert prop.original(kernel, op) == "|absent"
    prop.write(kernel, op, op.value)
    assert "AllowedCPUs=2-3" in read_file(root, op.path)
    assert read_file(root, f"{UNIT_CG}/cpuset.cpus") == "2-3"
    assert prop.holds(kernel, op, "3,2|present") == (True, "2-3|present")
    assert prop.holds(kernel, op, "2-3|absent") == (False, "2-3|present")
    assert prop.holds(kernel, op, "2-4|present") == (False, "2-3|present")
    # the root enables cpuset already: nothing more written than the property
    assert writes(kernel) == [(f"{UNIT}:AllowedCPUs", "2-3")]
    prop.write(kernel, op, "|absent")
    assert prop.holds(kernel, op, "|absent") == (True, "|absent")
    assert not (root / op.path.lstrip("/")).exists()
    assert not (root / op.path.lstrip("/")).parent.exists()
    assert (root / "run/systemd/system.control").is_dir()
    assert "cpuset" in read_file(root, f"{CG}/cgroup.subtree_control").split()
    assert writes(kernel)[1:] == [
        (f"{UNIT}:AllowedCPUs", ""),
        (f"{CG}/cgroup.subtree_control", "+cpuset"),
    ]


def test_putting_allowed_cpus_back_keeps_the_dropin_that_was_there(tmp_path: Path) -> None:
    """The user relies on revert leaving a unit's drop-in that existed before gputuned, with
    its old CPUs, and not touching parents that never had the cpuset controller."""
    root, kernel = host(tmp_path, systemd=True)
    prop = setting("unit_property")
    op = allowed_op()
    prop.write(kernel, op, "4-5|present")
    kernel = fresh(kernel)
    prop.write(kernel, op, "2-3|present")
    prop.write(kernel, op, "4-5|present")
    assert prop.read(kernel, op) == "4-5|present"
    assert "AllowedCPUs=4-5" in read_file(root, op.path)
    assert [p for p, _ in writes(kernel)] == [f"{UNIT}:AllowedCPUs"] * 2


def test_a_unit_that_is_not_loaded_has_no_allowed_cpus(tmp_path: Path) -> None:
    """The user relies on a unit that stopped being reported as gone rather than read as
    allowing every CPU."""
    _, kernel = host(tmp_path, systemd=True)
    with pytest.raises(errors.TargetGone, match="not loaded"):
        setting("unit_property").read(kernel, allowed_op(unit="session-9.scope"))


@pytest.mark.parametrize(
    ("change", "value", "ok"),
    [
        ({}, "2-3|present", True),
        ({}, "|absent", True),
        ({"path": dropin(UNIT, transient=True)}, "2-3|absent", True),
        ({"cpuset_kept": [f"{CG}/x"] * 64}, "2-3|present", True),
        ({"cpuset_kept": [f"{CG}/x"] * 65}, "2-3|present", False),
        ({"cpuset_kept": "/sys/fs/cgroup"}, "2-3|present", False),
        ({"cpuset_kept": ["/etc"]}, "2-3|present", False),
        ({"cpuset_kept": [7]}, "2-3|present", False),
        ({"path": "/etc/systemd/system/x.conf"}, "2-3|present", False),
        ({"unit": None}, "2-3|present", False),
        ({"unit": "a b.service"}, "2-3|present", False),
        ({"property": "CPUQuota", "path": dropin(UNIT, "CPUQuota")}, "2-3|present", False),
        ({}, "2-3", False),
        ({}, "2-3|maybe", False),
        ({}, "all|present", False),
    ],
)
def test_allowed_cpus_entries_are_a_units_own_dropin(
    change: dict[str, Any], value: str, ok: bool
) -> None:
    """The user relies on revert setting only a unit's AllowedCPUs=, removing only that unit's
    runtime drop-in, and writing +cpuset only in cgroup folders."""
    op = allowed_op()
    data = {**op.data, **{k: v for k, v in change.items() if k != "path"}}
    op = Op(**{**op.to_json(), "path": change.get("path", op.path), "data": data})
    assert (refusal(op, value) is None) is ok


@pytest.mark.parametrize(
    ("path", "value", "ok"),
    [
        (f"{UNIT_CG}/cpuset.cpus.partition", "isolated", True),
        (f"{CG}/system.slice/cpuset.cpus.exclusive", "2-3", True),
        (f"{UNIT_CG}/cpuset.cpus", "1" * 4096, True),
        (f"{UNIT_CG}/cpuset.cpus", "1" * 4097, False),
        (f"{CG}/cpuset.cpus", "2-3", False),
        (f"{CG}/cpuset.cpus.partition", "root", False),
        ("/etc/passwd", "x", False),
    ],
)
def test_borrowed_cpuset_entries_are_cpuset_files_below_the_root(
    path: str, value: str, ok: bool
) -> None:
    """The user relies on revert writing only the cpuset files of a cgroup below the root of
    one it borrowed, never the root cgroup's."""
    assert (refusal(op_of("borrowed_cpuset", path, "x"), value) is None) is ok


# ---- what every kind shares ------------------------------------------------------------------------


def test_ops_are_values_whatever_the_plan_noted() -> None:
    """The user relies on an op being the same write whatever notes its plan carried (the
    process's parent, what the plan saw): equal, and usable as a key."""
    a, b = thread_op("nice", "-5", ppid=1), thread_op("nice", "-5", ppid=77)
    assert a.data != b.data
    assert a == b and len({a, b}) == 1
    assert Op.from_json(a.to_json()) == a and Op.from_json(a.to_json()).data == a.data


def test_a_kind_that_forgets_a_method_fails_loudly(
    tree_host: Callable[[str], FaultKernel],
) -> None:
    """The user relies on a setting kind that does not say how to read, write or refuse, or a
    thread attribute that does not say which values are valid, failing at once rather than
    journaling, writing or accepting nothing."""

    class Bare(Setting):  # no kind: never registered
        pass

    class HalfThread(ThreadAttribute):
        pass

    kernel = tree_host("h200-vm")
    op = Op("k", "t", "x", "bare", "", "0")
    with pytest.raises(NotImplementedError):
        Bare().read(kernel, op)
    with pytest.raises(NotImplementedError):
        Bare().write(kernel, op, "0")
    with pytest.raises(NotImplementedError):
        Bare().refusal(op, "0")
    with pytest.raises(NotImplementedError):
        HalfThread().valid("0")
    assert kernel.writes == []


def test_a_missing_thread_is_gone_not_an_error(tmp_path: Path) -> None:
    """The user relies on a thread that exited being reported as gone (skipped), not as a
    failure."""
    _, kernel = host(tmp_path)
    op = thread_op("nice", "-5", PID + 7)
    with pytest.raises(errors.TargetGone):
        setting("nice").read(kernel, op)
    report = apply_ops(kernel, [op], keep_going=False)
    assert [s["target"] for s in report.skipped] == [op.target]
    assert report.failed == [] and kernel.writes == []
