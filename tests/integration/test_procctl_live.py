"""Thread and process operations through real syscalls on a child of this test (root only).

Each test starts its own child (three extra threads, sleeping), changes only that child and the
cgroup it makes, puts everything back and kills the child.
"""

from __future__ import annotations

import errno as E
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.cpulist import CpuListError, format_cpulist, format_mask, parse_cpulist, parse_mask
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
IRQ_FILES = ("smp_affinity", "smp_affinity_list", "effective_affinity", "effective_affinity_list")


def outcome(fn: Callable[[], None]) -> str:
    """What a write (or mkdir, rmdir) came to: "ok", or the errno name of the HostError it
    raised (one error class can hide several errnos: EINVAL, ERANGE and EOVERFLOW are all
    InvalidValue)."""
    try:
        fn()
    except errors.HostError as exc:
        return E.errorcode.get(exc.errno or 0, type(exc).__name__)
    return "ok"


def mirror(live: FaultKernel, dest: Path, mount: str, irqs: tuple[int, ...] = ()) -> FaultKernel:
    """A tree of this machine's cgroup v2 top level: what the model needs to decide validity;
    with ``irqs``, also the default IRQ affinity and those IRQs' affinity files."""
    for hpath in [f"/proc/irq/{n}/{name}" for n in irqs for name in IRQ_FILES] + (
        ["/proc/irq/default_smp_affinity"] if irqs else []
    ):
        text = live.read_optional(hpath)
        if text is not None:
            copy = dest.joinpath(*hpath.split("/")[1:])
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(text)
    for name in ("online", "possible"):
        f = dest / "sys/devices/system/cpu" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(live.read_text(f"/sys/devices/system/cpu/{name}"))
    (dest / "proc").mkdir(exist_ok=True)
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
    if len(online) < 8:
        pytest.skip("needs 8 CPUs or more (the cpuset tuner's sequence takes CPUs 4-7)")
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
            got = []
            for host in (live, tree):
                if op == "mkdir":
                    got.append(outcome(functools.partial(host.mkdir, path)))
                elif op == "rmdir":
                    got.append(outcome(functools.partial(host.rmdir, path)))
                else:
                    got.append(outcome(functools.partial(host.write_text, path, value or "\n")))
            shown = {
                f"{d}/{n}": (live.read_optional(f"{d}/{n}"), tree.read_optional(f"{d}/{n}"))
                for d in (mount, a, b, c)
                for n in SHOWN
                if live.exists(f"{d}/{n}")
            }
            line = f"{op} {path} {value!r}: live {got[0]}, tree {got[1]}"
            diffs = [
                f"  {k}: live {lv!r}, tree {tv!r}" for k, (lv, tv) in shown.items() if lv != tv
            ]
            report.append(line + ("" if got[0] == got[1] and not diffs else "  MISMATCH"))
            report += diffs
    finally:
        for d in (c, b, a):
            if live.exists(f"{d}/cpuset.cpus.partition"):
                live.write_text(f"{d}/cpuset.cpus.partition", "member")
            if live.is_dir(d):
                live.rmdir(d)
    print("\n".join(report))
    bad = [r for r in report if "MISMATCH" in r]
    print(f"tree model vs kernel: {len(steps)} steps, {len(bad)} mismatched")
    assert not bad, "\n".join(report)


# -- CPU lists and masks: the kernel formats them itself ---------------------------------------


def cpu_texts(last: int, nr: int) -> tuple[list[str], list[str]]:
    """Lists and masks to write where CPUs 0..``last`` (7 or more) are online and ``nr`` are
    possible: unsorted, overlapping, single CPUs, ranges, strides, all CPUs, offline CPUs,
    spacing, the kernel's own mask format (several 32-bit groups once ``nr`` > 32), forms
    only the kernel's parsers take, and texts each parser must refuse."""
    top = nr - 1
    lists = [
        "3,1-2,2", "5,4,3,2,1", "0", str(last), f"{last},0", "1-1", "2-3,3-4", "0,1,2,3",
        "0-1,3-4,6", f"0-{last}", f"{last - 1}-{last},0-1", "0-7:2/4", f"1-{last}:1/2",
        " 2,4 ", f"0-{top}", f"{last}-{top}", str(top), "\n",
        "1,,2", "1 2", "N", "all", "0-N:1/2",  # bitmap_parselist() takes these
        str(nr), f"0-{nr}", "3-1", "1-", "x", "0-7:0/2", "0-7:3/2", "-1", "1;2", "4294967296",
    ]  # fmt: skip
    online = frozenset(range(last + 1))
    masks = [
        *(format_mask(s, nr) for s in ({0}, {last}, online, range(nr), {1, top}, {top})),
        "F", "0000000f", "a5", " 3 ", ",3", "3,", "1,5", "1 2",
        "000000003", format(1 << nr, "x"), "0," * ((nr + 31) // 32) + "3", "0", "g",
    ]  # fmt: skip
    return lists, masks


def cpulist_says(text: str, *, as_list: bool, nr: int) -> tuple[str, str] | None:
    """What gputuned.cpulist makes of a write: the list and mask the kernel should print for
    it, or None where it refuses the text."""
    try:
        cpus = parse_cpulist(text) if as_list else parse_mask(text)
    except CpuListError:
        return None
    return format_cpulist(cpus), format_mask(cpus, nr)


def short_groups(text: str) -> bool:
    """A mask with a group of fewer than 8 digits below the first: the kernel never prints
    one, and gputuned.cpulist reads it wrong (test_mask_groups_are_32_bits_each)."""
    groups = text.strip().split(",")
    return any(len(g.strip()) < 8 for g in groups[1:])


def movable_irq(live: FaultKernel) -> int | None:
    """An IRQ whose affinity can be written (its own CPUs written back are taken), one with no
    handler first: the test moves it for a moment."""
    found: list[tuple[bool, int]] = []
    for name in live.listdir("/proc/irq"):
        base = f"/proc/irq/{name}"
        if name.isdigit() and live.exists(f"{base}/smp_affinity_list"):
            used = any(live.is_dir(f"{base}/{d}") for d in live.listdir(base))
            found.append((used, int(name)))
    for _used, irq in sorted(found):
        base = f"/proc/irq/{irq}/smp_affinity_list"
        if outcome(functools.partial(live.write_text, base, live.read_text(base))) == "ok":
            return irq
    return None


@dataclass(frozen=True)
class Target:
    """A file the kernel prints a CPU set back from: written as a list or a mask, read back
    through its list view, its mask view or both, and set to ``reset`` (through ``reset_via``)
    before each write so that one write's outcome does not carry into the next."""

    path: str
    as_list: bool
    list_view: str | None
    mask_view: str | None
    reset_via: str
    reset: str


def compare_write(hosts: tuple[FaultKernel, FaultKernel], t: Target, text: str, nr: int) -> str:
    """One write of ``text`` on the kernel and on the tree: the report line, ending in
    MISMATCH where the tree's model or gputuned.cpulist disagrees with the kernel."""
    views = [v for v in (t.list_view, t.mask_view) if v]
    for h in hosts:
        h.write_text(t.reset_via, t.reset)
    got = [outcome(functools.partial(h.write_text, t.path, text)) for h in hosts]
    back = [tuple(h.read_value(v) for v in views) for h in hosts]
    says = cpulist_says(text, as_list=t.as_list, nr=nr)
    want = (
        None
        if says is None
        else tuple(s for s, v in zip(says, (t.list_view, t.mask_view), strict=True) if v)
    )
    wrong = []
    if got[0] != got[1] or back[0] != back[1]:
        wrong.append("tree model")
    # Judged where the kernel took the text: an empty set is each file's own business
    # (refused, or taken to mean something else), and cpulist may refuse what the kernel
    # takes (it reads what the kernel prints, and profiles, not every form the kernel reads).
    judged = got[0] == "ok" and want is not None and want[0] != ""
    known = ""
    if judged and back[0] != want:
        if not t.as_list and short_groups(text):
            known = "  (cpulist: known, test_mask_groups_are_32_bits_each)"
        else:
            wrong.append("gputuned.cpulist")
    line = (
        f"{t.path} <- {text!r}: kernel {got[0]} {back[0]}, tree {got[1]} {back[1]}, "
        f"cpulist {'refuses' if want is None else want}{known}"
    )
    return line + (f"  MISMATCH ({', '.join(wrong)})" if wrong else "")


def cpu_oracle(live: FaultKernel) -> tuple[str, int, int]:
    """(the cgroup v2 mount, the last online CPU, nr_cpu_ids), or a skip."""
    if os.geteuid() != 0:
        pytest.skip("root is required: it writes IRQ affinities and makes a cgroup")
    mounts = TreeModel(Path("/")).cgroup2_mounts()
    if not mounts or "cpuset" not in live.read_text(f"{mounts[0]}/cgroup.subtree_control").split():
        pytest.skip("needs cgroup v2 with cpuset enabled at the root (not the CI machine kind)")
    online = parse_cpulist(live.read_value("/sys/devices/system/cpu/online"))
    nr = max(parse_cpulist(live.read_value("/sys/devices/system/cpu/possible"))) + 1
    if len(online) < 8 or online != frozenset(range(len(online))):
        pytest.skip("needs 8 CPUs or more online, numbered from 0 without gaps")
    return mounts[0], max(online), nr


def test_cpu_lists_and_masks_match_this_kernel(tmp_path: Path) -> None:
    """The kernel as the oracle for CPU lists and masks: write awkward sets to files that
    print them back in the kernel's own format (a cgroup's cpuset.cpus, an IRQ's
    smp_affinity_list and smp_affinity, /proc/irq/default_smp_affinity); the read-back must
    be what gputuned.cpulist parses and formats, and what the tree's kernel model shows after
    the same write. Everything written is put back."""
    live = live_kernel()
    mount, last, nr = cpu_oracle(live)
    irq = movable_irq(live)
    if irq is None:
        pytest.skip("no IRQ here takes an affinity write")
    cg = f"{mount}/gputuned-test-cpulist"
    if live.is_dir(cg):  # left by a run that was killed
        live.rmdir(cg)
    live.mkdir(cg)
    default = "/proc/irq/default_smp_affinity"
    aff = f"/proc/irq/{irq}/smp_affinity"
    saved = {p: live.read_value(p) for p in (default, f"{aff}_list")}
    lists, masks = cpu_texts(last, nr)
    cpus = f"{cg}/cpuset.cpus"
    report: list[str] = []
    try:
        tree = mirror(live, tmp_path / "tree", mount, irqs=(irq,))
        for t, texts in (
            (Target(cpus, True, cpus, None, cpus, "\n"), lists),
            (
                Target(
                    f"{aff}_list", True, f"{aff}_list", aff, f"{aff}_list", saved[f"{aff}_list"]
                ),
                lists,
            ),
            (Target(aff, False, f"{aff}_list", aff, f"{aff}_list", saved[f"{aff}_list"]), masks),
            (Target(default, False, None, default, default, saved[default]), masks),
        ):
            report += [compare_write((live, tree), t, text, nr) for text in texts]
    finally:
        for p, value in saved.items():
            live.write_text(p, value)
        live.rmdir(cg)
    assert {p: live.read_value(p) for p in saved} == saved
    print("\n".join(report))
    bad = [r for r in report if "MISMATCH" in r]
    print(f"cpu lists and masks vs kernel: {len(report)} writes, {len(bad)} mismatched")
    assert not bad, "\n".join(bad)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="gputuned.cpulist.parse_mask joins a mask's comma groups into one number; the "
    "kernel (bitmap_parse(), lib/bitmap-str.c) reads each group as 32 bits: '1,5' is CPUs "
    "0, 2 and 32, parse_mask says 0, 2 and 4. Masks the kernel prints have full groups below "
    "the first, so gputuned's reads of kernel files are right",
)
def test_mask_groups_are_32_bits_each() -> None:
    """A mask with a short group below the first, written to default_smp_affinity (more than
    32 possible CPUs): gputuned.cpulist must read it as the kernel does. Put back after."""
    live = live_kernel()
    _mount, _last, nr = cpu_oracle(live)
    if nr <= 32:
        pytest.skip("needs more than 32 possible CPUs: a mask of one group has no short one")
    default = "/proc/irq/default_smp_affinity"
    saved = live.read_value(default)
    try:
        live.write_text(default, "1,5")
        back = live.read_value(default)
    finally:
        live.write_text(default, saved)
    assert live.read_value(default) == saved
    assert format_mask(parse_mask("1,5"), nr) == back


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="the tree's model (gputuned/sim/model.py) hands a write of no bytes to a cgroup "
    "file's handler as an empty value and clears cpuset.cpus; the kernel's "
    "cgroup_file_write() (kernel/cgroup/cgroup.c) returns 0 at once and nothing changes. "
    "gputuned itself writes '\\n' for an empty value (gputuned/settings/sysfs.py); "
    "tests/unit/test_treekernel.py writes '' where it means that",
)
def test_a_write_of_no_bytes_to_a_cgroup_file_changes_nothing(tmp_path: Path) -> None:
    """A zero-byte write(2) to cpuset.cpus: on the kernel and on a tree mirroring it."""
    live = live_kernel()
    mount, _last, _nr = cpu_oracle(live)
    cg = f"{mount}/gputuned-test-nobytes"
    if live.is_dir(cg):  # left by a run that was killed
        live.rmdir(cg)
    live.mkdir(cg)
    try:
        live.write_text(f"{cg}/cpuset.cpus", "1")
        tree = mirror(live, tmp_path / "tree", mount)
        for h in (live, tree):
            h.write_text(f"{cg}/cpuset.cpus", "")
        back = [h.read_value(f"{cg}/cpuset.cpus") for h in (live, tree)]
    finally:
        live.rmdir(cg)
    if back[0] != "1":
        pytest.fail(f"the kernel changed cpuset.cpus on a write of no bytes: {back[0]!r}")
    assert back[1] == back[0], f"kernel {back[0]!r}, tree {back[1]!r}"
