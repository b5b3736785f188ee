"""The setting classes of whole files, sysfs/procfs attributes and mounts, and the registry
that finds every kind (gputuned/settings/files.py, sysfs.py, mounts.py, registry.py).

Each kind is driven through the registry, as apply, verify, revert and the daemon call it, on
copies of host trees (degraded-link: the OS owns ASPM, cgroup v2; h200-captured for what its
kernel refused when it was captured). What a user relies on: a value read is the value that
puts the setting back exactly; a read-back says "holds" when the kernel shows the same value
in a form of its own, and only then; a journal entry that names anything else is refused.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.settings.base import ABSENT, Op
from gputuned.settings.registry import (
    change_kinds,
    expand,
    holds,
    not_possible,
    of_change,
    placement_kinds,
    setting,
    settings,
    start_write,
    write,
)
from gputuned.store.state import GRUB_DROPIN
from tests.conftest import TREES_DIR
from tests.faults import FaultKernel, tree_kernel

TOP = Path(__file__).resolve().parents[2]
CG = "/sys/fs/cgroup"
POLICY = "/sys/module/pcie_aspm/parameters/policy"
LINK = "/sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0/link/l1_aspm"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy of degraded-link to write to."""
    dest = tmp_path / "degraded-link"
    shutil.copytree(TREES_DIR / "degraded-link", dest, symlinks=True)
    return dest


def sysfs(path: str, value: str = "", compare: str = "text") -> Op:
    return Op(f"sysfs:{path}", "t", path, "sysfs", path, value, compare)


def irq(n: int | str, value: str = "", compare: str = "cpulist") -> Op:
    return sysfs(f"/proc/irq/{n}/smp_affinity_list", value, compare)


def read_old(kernel: FaultKernel, op: Op) -> str:
    """The current value, in the form ``write`` takes to put it back exactly."""
    return setting(op.kind).read(kernel, op)


def failure(host: FaultKernel, op: Op, how: str, code: int) -> errors.GputunedError:
    """The error the kernel gives for ``how`` ("read" or "write") of ``op`` with ``code``."""
    host.inject(op.path, how, code)
    with pytest.raises(errors.HostError) as info:
        if how == "read":
            read_old(host, op)
        else:
            write(host, op, op.value)
    return info.value


# -- sysfs and procfs attributes -------------------------------------------------------------


def test_the_aspm_policy_is_read_as_its_choice_and_put_back_exactly(root: Path) -> None:
    """The policy file lists every choice with the current one in brackets: gputuned reads the
    choice (what revert writes), sees a write it made as holding, and writing the original
    back leaves the file as it was."""
    host = tree_kernel(root)
    before = (root / POLICY.lstrip("/")).read_bytes()
    op = sysfs(POLICY, "performance", "policy")
    assert read_old(host, op) == "powersave"
    assert holds(host, op, "performance") == (
        False,
        "default performance [powersave] powersupersave",
    )
    write(host, op, "performance")
    assert holds(host, op, "performance") == (
        True,
        "default [performance] powersave powersupersave",
    )
    assert read_old(host, op) == "performance"
    write(host, op, "powersave")
    assert (root / POLICY.lstrip("/")).read_bytes() == before


def test_a_text_attribute_holds_only_its_own_value(root: Path) -> None:
    """A link's ASPM state is compared as text, after the kernel's newline."""
    host = tree_kernel(root)
    op = sysfs(LINK, "0")
    was = read_old(host, op)
    assert holds(host, op, was) == (True, was) and holds(host, op, "0")[0] is (was == "0")
    write(host, op, "0")
    assert holds(host, op, "0") == (True, "0") and holds(host, op, "1") == (False, "0")


def test_an_irq_affinity_is_compared_as_a_set_of_cpus(root: Path) -> None:
    """The kernel prints a CPU list in its own form (2-3 for 2,3): the same CPUs hold, others
    do not. An IRQ that need only stay inside a set holds on any part of it, and on all of it."""
    host = tree_kernel(root)
    assert read_old(host, irq(40)) == "0-7"
    write(host, irq(40), "2,3")
    assert (root / "proc/irq/40/smp_affinity_list").read_text() == "2-3\n"
    assert holds(host, irq(40, compare="cpulist"), "2,3") == (True, "2-3")
    assert holds(host, irq(40, compare="cpulist"), "2-4")[0] is False
    assert holds(host, irq(40, compare="cpulist"), "2")[0] is False
    inside = irq(40, compare="cpulist_subset")
    assert holds(host, inside, "1-4") == (True, "2-3")
    assert holds(host, inside, "2,3") == (True, "2-3")
    assert holds(host, inside, "3-7")[0] is False


def test_revert_gives_an_irq_back_exactly_its_old_cpus(root: Path) -> None:
    """An IRQ that had to stay inside a set is put back to exactly its old CPUs: the op revert
    checks compares whole sets, so an IRQ now on part of its old CPUs is written back."""
    host = tree_kernel(root)
    write(host, irq(40), "2-3")
    op, old = setting("sysfs").restoring(host, irq(40, "1-4", "cpulist_subset"), "0-7")
    assert (op.compare, old) == ("cpulist", "0-7")
    assert holds(host, op, old) == (False, "2-3")
    same = irq(40, "1-4", "cpulist")
    assert setting("sysfs").restoring(host, same, "0-7") == (same, "0-7")


def test_the_default_irq_affinity_is_compared_as_a_mask(root: Path) -> None:
    """default_smp_affinity is a hex mask, read back without the leading zeros written."""
    host = tree_kernel(root)
    op = sysfs("/proc/irq/default_smp_affinity", "01", "mask")
    assert read_old(host, op) == "ff"
    assert holds(host, op, "000000ff") == (True, "ff")
    assert holds(host, op, "01")[0] is False


def _cgroup(root: Path) -> FaultKernel:
    host = tree_kernel(root)
    host.mkdir(f"{CG}/gt")  # the root enables cpuset for its children (subtree_control)
    return host


def test_a_partition_the_kernel_made_invalid_never_holds(root: Path) -> None:
    """cpuset.cpus.partition reads "isolated invalid (<why>)" where the kernel could not make
    the partition: that is no partition, whatever was written; once valid it holds. Read, an
    invalid partition gives what to write to ask for it again."""
    host = _cgroup(root)
    op = sysfs(f"{CG}/gt/cpuset.cpus.partition", "isolated", "partition")
    assert read_old(host, op) == "member"
    assert holds(host, op, "member") == (True, "member")
    write(host, op, "isolated")
    assert holds(host, op, "isolated") == (False, "isolated invalid (cpuset.cpus is empty)")
    assert read_old(host, op) == "isolated"
    write(host, sysfs(f"{CG}/gt/cpuset.cpus"), "2-3")
    assert holds(host, op, "isolated") == (True, "isolated")
    assert holds(host, op, "member") == (False, "isolated")


def test_an_empty_cpu_list_is_put_back_as_empty(root: Path) -> None:
    """A new cgroup's cpuset.cpus was empty: revert writes it back empty (a newline; an empty
    write would change nothing)."""
    host = _cgroup(root)
    op = sysfs(f"{CG}/gt/cpuset.cpus", "2-3", "cpulist")
    write(host, op, "2-3")
    write(host, op, "")
    assert read_old(host, op) == "" and holds(host, op, "") == (True, "")


def test_a_cpuset_file_whose_cgroup_went_has_nothing_to_put_back(root: Path) -> None:
    """Revert skips a cpuset file of a cgroup that was removed, or whose parent no longer
    enables cpuset for it (its value went with it), and says why; it does not skip one that
    is still there."""
    host = _cgroup(root)
    gone = setting("sysfs").gone
    op = sysfs(f"{CG}/gt/cpuset.cpus", "2-3", "cpulist")
    assert gone(host, op) is None
    assert gone(host, irq(40)) is None
    host.write_text(f"{CG}/cgroup.subtree_control", "-cpuset")
    assert gone(host, op) == f"{CG}/gt has no cpuset controller now (its parent disabled it)"
    host.rmdir(f"{CG}/gt")
    assert gone(host, op) == f"its cgroup {CG}/gt no longer exists (its values went with it)"


def test_a_cpuset_file_of_a_v1_hierarchy_is_not_taken_for_gone(
    tree_host: Callable[[str], FaultKernel],
) -> None:
    """cgroup v1 has no cgroup.controllers: its cpuset files are not thereby gone."""
    host = tree_host("ci-vm")
    assert setting("sysfs").gone(host, sysfs(f"{CG}/cpuset/cpuset.cpus", "0", "cpulist")) is None


@pytest.mark.parametrize(
    ("op", "how", "code", "reason"),
    [
        (irq(40, "1"), "write", errno.EIO, "unmovable (EIO): a kernel-managed IRQ"),
        (irq(40, "1"), "write", errno.EPERM, "unmovable (EPERM): the kernel refuses"),
        (irq(40, "1"), "write", errno.EACCES, "unmovable (EACCES): the kernel refuses"),
        (irq(40, "1"), "write", errno.EROFS, "read-only here (EROFS)"),
        (irq(40, "1"), "write", errno.EBUSY, None),
        (irq(40, "1"), "read", errno.EIO, None),
        (sysfs(POLICY, "performance", "policy"), "write", errno.EPERM, "firmware owns ASPM"),
        (sysfs(POLICY, "performance", "policy"), "write", errno.EIO, None),
        (sysfs(f"{CG}/cpuset.cpus", "1", "cpulist"), "write", errno.EPERM, None),
        (sysfs(f"{CG}/cpuset.cpus", "1", "cpulist"), "write", errno.EIO, None),
    ],
    ids=[
        "irq-eio",
        "irq-eperm",
        "irq-eacces",
        "irq-erofs",
        "irq-ebusy",
        "irq-read-eio",
        "policy-eperm",
        "policy-eio",
        "cpuset-eperm",
        "cpuset-eio",
    ],
)
def test_what_the_kernel_refuses_here_is_told_apart_from_a_failure(
    tree_host: Callable[[str], FaultKernel], op: Op, how: str, code: int, reason: str | None
) -> None:
    """An IRQ the kernel will not move and an ASPM policy firmware owns are limits of this
    machine: skipped and said why. Any other error (a read, another file) is a failure."""
    exc = failure(tree_host("degraded-link"), op, how, code)
    said = not_possible(op, exc)
    assert (said is None) if reason is None else (said is not None and said.startswith(reason))


def test_a_refusal_recorded_on_the_captured_host_is_not_possible_here(
    tree_host: Callable[[str], FaultKernel],
) -> None:
    """On the H200 as captured, firmware owned ASPM and two IRQs would not move."""
    host = tree_host("h200-captured")
    for op, start in (
        (sysfs(POLICY, "performance", "policy"), "firmware"),
        (irq(31, "1"), "unmovable"),
    ):
        with pytest.raises(errors.PermissionDenied) as info:
            write(host, op, op.value)
        assert (not_possible(op, info.value) or "").startswith(start)
    assert host.writes == []


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        (POLICY, True),
        (LINK, True),
        ("/sys/devices/pci10000:00/10000:00:02.0/10000:01:00.0/link/l1_2_aspm", True),
        ("/proc/irq/40/smp_affinity_list", True),
        ("/proc/irq/default_smp_affinity", True),
        (f"{CG}/gputuned.inference/cpuset.cpus", True),
        (f"{CG}/a/b/cpuset.cpus.exclusive", True),
        (f"{CG}/cpuset.cpus.partition", True),
        ("/etc/passwd", False),
        ("/proc/irq/40/smp_affinity", False),
        ("/proc/irq/12345678/smp_affinity_list", False),
        (f"{CG}/a/cgroup.procs", False),
        (f"{CG}/a/cpuset.mems", False),
        ("/sys/devices/pci0000:00/0000:00:02.0/link/clkpm", False),
        ("/sys/devices/pci0000:00/00:02.0/link/l1_aspm", False),
    ],
)
def test_a_journal_entry_may_name_only_the_attributes_gputuned_writes(path: str, ok: bool) -> None:
    """Revert writes, as root, what the journal names: a sysfs entry must be one of the files
    the tuners write (ASPM, IRQ affinities, cpuset files), else it is refused and named."""
    why = setting("sysfs").refusal(sysfs(path, "1"), "1")
    assert (why is None) if ok else why == f"{path!r} is no file gputuned writes"


def test_a_sysfs_value_longer_than_a_page_is_refused() -> None:
    """A sysfs attribute takes at most a page (4096 bytes): a longer journaled value is no
    value gputuned wrote."""
    refusal = setting("sysfs").refusal
    assert refusal(irq(40), "0," * 2048) is None
    assert refusal(irq(40), "0," * 2048 + "1") == "a value too long for the file it names"


# -- the GRUB drop-in, a whole file gputuned owns ---------------------------------------------


def test_the_grub_dropin_is_written_whole_and_removed_on_revert(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bootargs --write-grub`` writes the drop-in whole, world-readable for update-grub and
    fsynced before it is renamed into place; its original is "absent", and putting that back
    removes the file."""
    import gputuned.kernel.sysinstall as sysinstall

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(sysinstall.os, "fsync", fsync)
    host = tree_kernel(root)
    op = Op("file:grub", "bootargs", "GRUB drop-in", "file", GRUB_DROPIN, "GRUB_CMDLINE=x\n")
    real = root / GRUB_DROPIN.lstrip("/")
    assert read_old(host, op) == ABSENT
    text = 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT nohz_full=2-15"\n'
    write(host, op, text)
    assert real.read_text() == text and read_old(host, op) == text
    assert stat.S_IMODE(real.stat().st_mode) == 0o644
    assert holds(host, op, text) == (True, text)
    assert str(real.parent) in synced and any(s.startswith(str(real.parent) + "/") for s in synced)
    assert sorted(p.name for p in real.parent.iterdir()) == ["gputuned.cfg"], "no temporary left"
    write(host, op, ABSENT)
    assert not real.exists() and read_old(host, op) == ABSENT
    assert holds(host, op, ABSENT) == (True, ABSENT)


def test_the_grub_dropin_is_the_one_file_gputuned_writes() -> None:
    """A journal entry of kind "file" may name only the GRUB drop-in, with at most 64 KiB."""
    refusal = setting("file").refusal
    op = Op("file:x", "bootargs", "x", "file", GRUB_DROPIN, "")
    assert refusal(op, "x" * 65536) is None
    assert refusal(op, "x" * 65537) == "a value too long for the GRUB drop-in"
    other = Op("file:x", "bootargs", "x", "file", "/etc/cron.d/gputuned", "")
    assert (
        refusal(other, "x")
        == f"'/etc/cron.d/gputuned' is not {GRUB_DROPIN}, the one file gputuned writes"
    )


# -- the cgroup2 mount's options ----------------------------------------------------------------


def mount(value: str = "", point: str = CG, fstype: str = "cgroup2") -> Op:
    return Op(
        f"mount:{point}", "cpuset", "cgroup2", "mount", point, value, "options", {"fstype": fstype}
    )


def test_the_cgroup2_options_are_compared_as_a_set_and_put_back_exactly(root: Path) -> None:
    """The kernel prints mount options in an order of its own: the same options in any order
    hold, one missing does not; a remount with the original puts mountinfo back byte for
    byte."""
    host = tree_kernel(root)
    info = root / "proc/self/mountinfo"
    before = info.read_bytes()
    old = read_old(host, mount())
    assert old == "rw,nsdelegate,memory_recursiveprot"
    assert holds(host, mount(), "memory_recursiveprot,rw,nsdelegate") == (True, old)
    wanted = "rw,favordynmods,nsdelegate,memory_recursiveprot"
    assert holds(host, mount(), wanted) == (False, old)
    write(host, mount(wanted), wanted)
    assert holds(host, mount(wanted), wanted)[0] is True
    assert "favordynmods" in info.read_text()
    start_write(host, mount(old), old)()
    assert info.read_bytes() == before


def test_an_option_the_kernel_does_not_know_is_not_possible_here(
    root: Path, tree_host: Callable[[str], FaultKernel]
) -> None:
    """EINVAL from the remount means this kernel lacks an option (favordynmods before Linux
    6.0): skipped and said so. Any other refusal of the remount is a failure."""
    host = tree_kernel(root)
    op = mount("rw,nsdelegate,no_such_option")
    with pytest.raises(errors.InvalidValue) as info:
        write(host, op, op.value)
    assert (not_possible(op, info.value) or "").startswith(
        "the kernel does not know one of these mount options (EINVAL)"
    )
    busy = tree_host("degraded-link")
    busy.inject(f"{CG}:remount", "write", errno.EBUSY)
    with pytest.raises(errors.HostError) as info:
        write(busy, mount("rw"), "rw")
    assert not_possible(mount("rw"), info.value) is None


def test_apply_goes_on_while_the_remount_runs(root: Path) -> None:
    """A remount (favordynmods waits for an RCU grace period) runs beside the writes after it:
    they reach the kernel before the remount is done and counted."""
    from gputuned.engine.apply import apply_profile
    from gputuned.profile.load import parse_profile

    profile = {
        "name": "fdm",
        "cpuset": {"favordynmods": True},
        "cpusets": {"housekeeping": {"cpus": "0"}, "gpu": {"cpus": "1-4"}},
        "irq": {"gpu_cpus": "gpu", "others_cpus": "housekeeping"},
    }
    host = tree_kernel(root)
    _plan, report = apply_profile(host, parse_profile(profile, "test"))
    assert report.failed == []
    order = [w.path for w in host.writes]
    assert order[-1] == f"{CG}:remount" and len(order) > 1


@pytest.mark.parametrize(
    ("op", "value", "why"),
    [
        (mount(), "rw,nsdelegate,favordynmods", None),
        (mount(point=f"{CG}/unified"), "rw,memory_localevents=1", None),
        (mount(fstype="ext4"), "rw", "a mount that is not the cgroup2 hierarchy"),
        (mount(point="/"), "rw", "a mount that is not the cgroup2 hierarchy"),
        (mount(point="/", fstype="ext4"), "rw", "a mount that is not the cgroup2 hierarchy"),
        (mount(), "rw,nsdelegate;reboot", "'rw,nsdelegate;reboot' are not mount options"),
        (mount(), "", "'' are not mount options"),
    ],
)
def test_a_journal_entry_may_remount_only_the_cgroup2_hierarchy(
    op: Op, value: str, why: str | None
) -> None:
    """Revert remounts, as root, what the journal names: only the cgroup2 hierarchy, with
    options in the form mount(2) takes."""
    assert setting("mount").refusal(op, value) == why


# -- the registry ------------------------------------------------------------------------------


def test_a_fresh_process_finds_every_kind_without_importing_them() -> None:
    """``gputunectl revert`` in a new process finds the class of every kind the journal may
    hold, though nothing it ran imported their modules."""
    code = "from gputuned.settings.registry import settings; print(' '.join(settings()))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=TOP, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == sorted(settings()) and {"sysfs", "file", "mount", "nice"} <= set(out)


def test_kinds_defined_below_another_kind_are_found_too() -> None:
    """The thread kinds (nice, policy, affinity) and a borrowed cpuset are subclasses of other
    settings' classes; each is its own kind, with the change kind that expands to it, and the
    placement kinds are the process's settings."""
    assert {"nice", "policy", "affinity", "borrowed_cpuset", "sysfs", "file", "mount"} <= set(
        settings()
    )
    assert change_kinds()["thread"].change_kind == "thread"
    assert change_kinds()["borrowed_cpuset"] is settings()["borrowed_cpuset"]
    assert placement_kinds() == {"nice", "policy", "affinity", "proc_cgroup"}


def test_a_kind_gputuned_does_not_have_is_an_error_naming_it() -> None:
    """An op or a change of an unknown kind (a journal of a newer gputuned) is refused by
    name, never passed on to a class that would write it."""
    from gputuned.changes import Change

    with pytest.raises(ValueError, match="unknown op kind 'shell'"):
        setting("shell")
    with pytest.raises(ValueError, match="unknown change kind 'shell'"):
        of_change(Change("t", "x", "", "y", "", kind="shell"))


def test_a_change_expands_to_the_op_of_its_kind() -> None:
    """A plan's change becomes the op apply journals and writes: same key, path, value and
    comparison (a mount's compared as options), its data copied, not shared."""
    from gputuned.changes import Change

    ch = Change("irq", "irq 40", "0-7", "1", "", path=irq(40).path, compare="cpulist")
    (op,) = expand(ch)
    assert (op.key, op.kind, op.path, op.value, op.compare) == (
        f"sysfs:{irq(40).path}",
        "sysfs",
        irq(40).path,
        "1",
        "cpulist",
    )
    data = {"fstype": "cgroup2"}
    ch = Change("cpuset", "cgroup2", "rw", "rw,favordynmods", "", path=CG, kind="mount", data=data)
    (op,) = expand(ch)
    assert (op.kind, op.compare, op.data) == ("mount", "options", data)
    assert op.data is not data


def test_a_check_outside_a_write_asks_the_target(tree_host: Callable[[str], FaultKernel]) -> None:
    """The daemon's periodic check (holds, not right after a write) reads the target itself:
    an irqbalance that has gone is found gone, not taken to hold what gputuned asked of it.
    Only right after a write is irqbalance's answer taken on trust (it rescans later)."""
    op = Op(
        "irqbalance:700:cpus",
        "irq",
        "irqbalance 700",
        "irqbalance",
        "",
        "1-4",
        data={"pid": 700, "start": 1, "attr": "cpus"},
    )
    host = tree_host("degraded-link")
    with pytest.raises(errors.TargetGone):
        holds(host, op, "1-4")
    assert holds(host, op, "1-4", just_written=True) == (True, "1-4")
