"""[cpuset] favordynmods: a remount of the cgroup2 hierarchy, planned, applied, read back, reverted.

On copies of the trees: the tree's kernel model rewrites its /proc/self/mountinfo and /proc/mounts
lines as the kernel shows them after the same mount(2) call (gputuned.sim.mounts).
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.changes import Change
from gputuned.engine.apply import ApplyError, apply_profile, read_state, revert_all
from gputuned.engine.journal import Journal
from gputuned.engine.plan import PlanResult, plan_profile
from gputuned.engine.verify import verify_plan
from gputuned.kernel import mounts
from gputuned.kernel.capture import capture
from gputuned.profile.load import load_profile, parse_profile
from gputuned.profile.model import Profile
from gputuned.sim.model import TreeModel
from gputuned.sim.tree import SimKernel
from tests.faults import FaultKernel, tree_kernel
from tests.unit.test_apply import PROFILES, digest, tree_copy

CG = "/sys/fs/cgroup"
TARGET = f"cgroup2 mount options ({CG})"
H200_SUPER = "rw,nsdelegate,memory_recursiveprot"
H200_WANTED = "rw,nsdelegate,favordynmods,memory_recursiveprot"
H200_OWN = ("rw", "nosuid", "nodev", "noexec", "relatime")
SHARED = load_profile(PROFILES / "shared-host.toml")


def only(**cpuset: object) -> Profile:
    return parse_profile({"name": "fdm", "cpuset": {"favordynmods": True, **cpuset}}, "test")


def mount_change(plan: PlanResult) -> Change:
    (ch,) = [c for c in plan.settings if c.kind == "mount"]
    return ch


def refusal(plan: PlanResult) -> str:
    (r,) = [r for r in plan.refused if r.target.startswith("cgroup2 mount options")]
    return r.reason


def cgroup2(root: Path, point: str = CG) -> mounts.Mount:
    return mounts.find(tree_kernel(root), point, "cgroup2")


def edit(root: Path, hpath: str, old: str, new: str) -> None:
    f = root / hpath.lstrip("/")
    text = f.read_text()
    assert old in text, (hpath, old)
    f.write_text(text.replace(old, new))


# -- plan ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", ["h200-captured", "h200-vm", "dual-socket-8gpu"])
def test_plan_shows_the_remount(tree: str, tree_host: Callable[[str], FaultKernel]) -> None:
    plan = plan_profile(tree_host(tree), SHARED)
    ch = mount_change(plan)
    assert (ch.tuner, ch.target, ch.current, ch.wanted) == (
        "cpuset",
        TARGET,
        H200_SUPER,
        H200_WANTED,
    )
    assert (ch.path, ch.key, ch.in_sync, ch.report_only) == (CG, f"mount:{CG}", False, False)
    assert "RCU grace period" in ch.why
    assert ch in plan.changes and TARGET in [c["target"] for c in plan.to_json()["changes"]]


def test_hybrid_host_skips_it_where_the_partition_falls_back(tmp_path: Path) -> None:
    """ci-vm: cgroup v1 controllers, cgroup2 without controllers at /sys/fs/cgroup/unified.
    shared-host's partition falls back to pinning threads there, so nothing moves between v2
    cgroups: no remount, a note says why. Asked for alone (mode "none"), it is remounted."""
    root = tree_copy("ci-vm", tmp_path)
    before = digest(root)
    plan = plan_profile(tree_kernel(root), SHARED)
    assert [c for c in plan.settings if c.kind == "mount"] == []
    assert any(r.target == "partition gputuned.inference" for r in plan.refused)
    assert any(n.startswith("cpuset.favordynmods: not planned") for n in plan.notes), plan.notes
    _plan, report = apply_profile(tree_kernel(root), SHARED)
    assert not [w for w in report.written if w["target"].startswith("cgroup2 mount options")]
    assert cgroup2(root, "/sys/fs/cgroup/unified").super_options == "rw"
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before

    ch = mount_change(plan_profile(tree_kernel(root), only(mode="none")))
    assert (ch.target, ch.current, ch.wanted) == (
        "cgroup2 mount options (/sys/fs/cgroup/unified)",
        "rw",
        "rw,favordynmods",
    )
    _plan, report = apply_profile(tree_kernel(root), only(mode="none"))
    assert {"target": ch.target, "old": "rw", "new": "rw,favordynmods"} in report.written
    assert cgroup2(root, "/sys/fs/cgroup/unified").super_options == "rw,favordynmods"
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before


def test_it_applies_in_mode_none_and_alone(tree_host: Callable[[str], FaultKernel]) -> None:
    plan = plan_profile(tree_host("h200-vm"), only())
    assert [c.target for c in plan.settings] == [TARGET]
    assert plan.refused == []


def test_already_there_is_in_sync_and_nothing_is_written(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path)
    edit(root, mounts.MOUNTINFO, f"cgroup2 {H200_SUPER}", f"cgroup2 {H200_WANTED}")
    host = tree_kernel(root)
    _plan, report = apply_profile(host, only())
    ch = mount_change(_plan)
    assert ch.in_sync and ch.current == H200_WANTED
    assert report.written == [] and not any(w.path.endswith(":remount") for w in host.writes)
    assert Journal(tree_kernel(root)).get(f"mount:{CG}") is None, "nothing to put back"


def test_report_only_lists_it_and_writes_nothing(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    plan, report = apply_profile(host, only(report_only=True))
    assert mount_change(plan).report_only
    assert report.written == [] and digest(root) == before
    assert verify_plan(plan, read_state(tree_kernel(root))).lines[0].status == "report only"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("no-cgroup2", "not possible here: no cgroup v2 hierarchy is mounted (cgroup mode: v1)"),
        ("old-kernel", "not possible here: this kernel has no favordynmods (Linux 6.0+;"),
        ("cgroup-ns", "not possible here: gputuned runs in a cgroup namespace of its own"),
        ("ro-bind", "one remount cannot keep both (is it a read-only bind mount, such as"),
        ("no-mountinfo", "a tree needs proc/self/mountinfo (gputunectl capture writes it)"),
    ],
)
def test_not_possible_here(change: str, reason: str, tmp_path: Path) -> None:
    root = tree_copy("ci-vm" if change == "no-cgroup2" else "h200-captured", tmp_path)
    if change == "no-cgroup2":
        edit(root, "/proc/mounts", "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n", "")
    elif change == "old-kernel":  # features of Linux 5.19: favordynmods came in 6.0
        features = root / mounts.CGROUP_FEATURES.lstrip("/")
        features.parent.mkdir(parents=True, exist_ok=True)
        features.write_text("nsdelegate\nmemory_localevents\nmemory_recursiveprot\n")
    elif change == "cgroup-ns":
        (root / "proc/self/ns").mkdir(parents=True)
        (root / "proc/self/ns/cgroup").symlink_to("cgroup:[4026532711]")
    elif change == "ro-bind":  # what ProtectControlGroups=yes makes of /sys/fs/cgroup
        edit(
            root,
            mounts.MOUNTINFO,
            " rw,nosuid,nodev,noexec,relatime ",
            " ro,nosuid,nodev,noexec,relatime ",
        )
    else:
        (root / mounts.MOUNTINFO.lstrip("/")).unlink()
    before = digest(root)
    # On ci-vm shared-host's partition falls back and favordynmods is not even planned there
    # (test_hybrid_host_skips_it_where_the_partition_falls_back): ask for it alone.
    plan = plan_profile(tree_kernel(root), only(mode="none") if change == "no-cgroup2" else SHARED)
    assert reason in refusal(plan)
    assert not [c for c in plan.settings if c.kind == "mount"]
    assert not any(r.blocking for r in plan.refused)
    if change != "no-cgroup2":  # the partition is still made; only the remount is left out
        host = tree_kernel(root)
        _plan, report = apply_profile(host, SHARED)
        assert report.failed == [] and not any(w.path.endswith(":remount") for w in host.writes)
        # ...unless the hierarchy is read-only: then no cgroup write can be made either, and
        # plan and apply say so (issue 31, item 7).
        under = [w for w in host.writes if w.path.startswith(f"{CG}/")]
        assert (under == []) == (change == "ro-bind")
        if change == "ro-bind":
            assert all(
                c.not_possible.startswith("read-only here (EROFS): /sys/fs/cgroup is mounted")
                for c in _plan.changes
                if c.kind in ("cgroup", "controller", "proc_cgroup")
            )
        assert revert_all(tree_kernel(root)).failed == []
        assert digest(root) == before


# -- apply, read back, revert -------------------------------------------------------------------


def test_apply_writes_it_keeps_every_other_option_and_revert_is_byte_exact(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    mounts_line = (root / "proc/mounts").read_text()
    host = tree_kernel(root)
    _plan, report = apply_profile(host, SHARED)
    assert report.failed == []
    assert {"target": TARGET, "old": H200_SUPER, "new": H200_WANTED} in report.written
    assert [w.data for w in host.writes if w.path == f"{CG}:remount"] == [H200_WANTED.encode()]
    now = cgroup2(root)
    assert now.super_options == H200_WANTED, "in the kernel's order"
    assert now.options == H200_OWN, "nosuid, nodev, noexec and relatime are kept"
    assert (root / "proc/mounts").read_text() == mounts_line.replace(
        "nsdelegate,memory_recursiveprot", "nsdelegate,favordynmods,memory_recursiveprot"
    )
    entry = Journal(tree_kernel(root)).get(f"mount:{CG}")
    assert entry is not None and entry.old == H200_SUPER
    assert entry.op.kind == "mount" and entry.op.data == {"fstype": "cgroup2"}

    again = tree_kernel(root)
    _plan, report2 = apply_profile(again, SHARED)
    assert report2.written == [] and again.writes == [], "re-applying writes nothing"
    rep = verify_plan(plan_profile(tree_kernel(root), SHARED), read_state(tree_kernel(root)))
    (line,) = [ln for ln in rep.lines if ln.target == TARGET]
    assert (line.status, line.live) == ("passed", H200_WANTED)

    rev = revert_all(tree_kernel(root))
    assert rev.failed == []
    assert {"target": TARGET, "value": H200_SUPER} in rev.restored
    assert digest(root) == before


def test_the_remount_is_journaled_before_it_is_written(tmp_path: Path) -> None:
    """When mount(2) is called, the old options are in the journal already."""
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    seen: list[object] = []
    real = host.start_remount

    def start_remount(point: str, fstype: str, options: str) -> Callable[[], None]:
        seen.append(Journal(tree_kernel(root)).get(f"mount:{CG}"))
        return real(point, fstype, options)

    host.start_remount = start_remount  # type: ignore[method-assign]
    apply_profile(host, only())
    (entry,) = seen
    assert entry is not None and entry.old == H200_SUPER  # type: ignore[attr-defined]
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before


def test_a_refused_remount_fails_and_rolls_back(tmp_path: Path) -> None:
    """EPERM (no CAP_SYS_ADMIN, or a seccomp filter): a failure, what was written is undone."""
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    host.inject(f"{CG}:remount", "write", errno.EPERM)
    with pytest.raises(ApplyError) as info:
        apply_profile(host, SHARED)
    assert f"cpuset {TARGET} failed" in str(info.value)
    assert digest(root) == before
    assert Journal(tree_kernel(root)).entries() == []


def test_einval_from_the_kernel_is_not_possible_here(tmp_path: Path) -> None:
    """An option the kernel does not know (favordynmods before 6.0) is refused with EINVAL."""
    root = tree_copy("h200-captured", tmp_path)
    host = tree_kernel(root)
    host.inject(f"{CG}:remount", "write", errno.EINVAL)
    _plan, report = apply_profile(host, SHARED)
    assert report.failed == []
    why = report.not_possible[f"mount:{CG}"]
    assert why["target"] == TARGET and "EINVAL" in why["reason"]
    assert cgroup2(root).super_options == H200_SUPER
    rep = verify_plan(plan_profile(tree_kernel(root), SHARED), read_state(tree_kernel(root)))
    (line,) = [ln for ln in rep.lines if ln.target == TARGET]
    assert line.status == "not possible here"
    assert revert_all(tree_kernel(root)).failed == []


def test_a_readback_that_lacks_the_option_is_a_failure(tmp_path: Path) -> None:
    """The kernel ignores the options from a cgroup namespace other than the initial one
    (apply_cgroup_root_flags()): the remount succeeds and nothing changes. Read back says so."""
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    host.inject(f"{CG}:remount", "drop", 0)
    with pytest.raises(ApplyError) as info:
        apply_profile(host, only())
    assert f"{TARGET}: wrote {H200_WANTED!r}, reads back {H200_SUPER!r}" in str(info.value)
    assert digest(root) == before


# -- the mechanism: mountinfo, mount(2) arguments, the tree's kernel ------------------------------


def test_remount_call_keeps_the_mounts_own_flags() -> None:
    line = (
        f"35 24 0:30 / {CG} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 {H200_SUPER}"
    )
    m = mounts.parse_line(line)
    assert m is not None and (m.point, m.fstype, m.source) == (CG, "cgroup2", "cgroup2")
    flags, data = mounts.remount_call(m, H200_WANTED)
    want = mounts.MS_REMOUNT | mounts.MS_NOSUID | mounts.MS_NODEV | mounts.MS_NOEXEC
    assert flags == want | mounts.MS_RELATIME
    assert data == "nsdelegate,favordynmods,memory_recursiveprot"
    assert mounts.remount_call(m, "rw") == (want | mounts.MS_RELATIME, "")
    with pytest.raises(errors.NotSupported):
        mounts.remount_call(m, "ro,nsdelegate")  # would make the hierarchy read-only


def test_mountinfo_fields_are_unescaped_and_the_top_mount_wins(tmp_path: Path) -> None:
    root = tmp_path / "t"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text(
        "30 1 0:26 / /mnt/a\\040b rw - cgroup2 none rw\n"
        "31 1 0:27 / /x rw - tmpfs tmpfs rw\n"
        "32 1 0:28 / /x rw,nosuid - cgroup2 cgroup2 rw,favordynmods\n"
    )
    assert mounts.find(tree_kernel(root), "/mnt/a b", "cgroup2").source == "none"
    assert mounts.find(tree_kernel(root), "/x", "cgroup2").super_options == "rw,favordynmods"
    with pytest.raises(errors.TargetGone):
        mounts.find(tree_kernel(root), "/mnt", "cgroup2")


@pytest.mark.parametrize(
    ("have", "add", "want"),
    [
        ("rw", "favordynmods", "rw,favordynmods"),
        (H200_SUPER, "favordynmods", H200_WANTED),
        ("rw,nsdelegate", "favordynmods", "rw,nsdelegate,favordynmods"),
        (
            "rw,memory_localevents,pids_localevents",
            "favordynmods",
            "rw,favordynmods,memory_localevents,pids_localevents",
        ),
        (H200_WANTED, "favordynmods", H200_WANTED),
    ],
)
def test_with_option_uses_the_kernels_order(have: str, add: str, want: str) -> None:
    assert mounts.with_option(have, add) == want


def test_tree_kernel_remount_is_the_kernels(tmp_path: Path) -> None:
    """Exactly the options given (none kept from before); the mount's flags from the call's."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    tk = TreeModel(root)
    tk.remount(CG, mounts.MS_REMOUNT, "memory_localevents,nsdelegate")
    m = cgroup2(root)
    # No MS_NOSUID/NODEV/NOEXEC passed: they are gone (set_mount_attributes()); no atime flag
    # passed: relatime stays ("The default atime for remount is preservation").
    assert (m.options, m.super_options) == (("rw", "relatime"), "rw,nsdelegate,memory_localevents")
    line = [ln for ln in (root / "proc/mounts").read_text().splitlines() if " cgroup2 " in ln]
    assert line == [f"cgroup2 {CG} cgroup2 rw,relatime,nsdelegate,memory_localevents 0 0"]
    tk.remount(CG, mounts.MS_REMOUNT | mounts.MS_NOATIME | mounts.MS_NODEV, "")
    assert cgroup2(root).options == ("rw", "nodev", "noatime")
    for bad in ("nofavordynmods", "favordynmods,bogus"):
        with pytest.raises(OSError) as info:
            tk.remount(CG, mounts.MS_REMOUNT, bad)
        assert info.value.errno == errno.EINVAL
    features = root / mounts.CGROUP_FEATURES.lstrip("/")
    features.parent.mkdir(parents=True, exist_ok=True)
    features.write_text("nsdelegate\n")
    with pytest.raises(OSError, match="Unknown parameter 'favordynmods'"):
        tk.remount(CG, mounts.MS_REMOUNT, "favordynmods")
    with pytest.raises(OSError, match="not a mount point"):
        tk.remount(f"{CG}/x", mounts.MS_REMOUNT, "")


def test_capture_keeps_the_cgroup_lines_of_mountinfo_and_the_features(tmp_path: Path) -> None:
    root = tree_copy("ci-vm", tmp_path, server=False)
    (root / "proc/self/mountinfo").write_text(
        "22 1 0:21 / /proc rw - proc proc rw\n" + (root / "proc/self/mountinfo").read_text()
    )
    capture(tree_kernel(root), tmp_path / "cap")
    got = (tmp_path / "cap/proc/self/mountinfo").read_text()
    assert got == (root / "proc/self/mountinfo").read_text().split("\n", 1)[1]
    assert (tmp_path / "cap/sys/kernel/cgroup/features").read_text().split()[1] == "favordynmods"
    meta = json.loads((tmp_path / "cap/gputuned-tree.json").read_text())
    assert meta["source"] == "capture"


# -- the remount runs beside the writes that follow it -------------------------------------------


def slow_remount(monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[str]:
    """The remount's mount(2) taking ``seconds`` (the kernel's grace period); logs start and end."""
    import threading
    import time

    log: list[str] = []
    real = SimKernel._mount

    def mount(kernel: SimKernel, m: mounts.Mount, flags: int, data: str) -> None:
        log.append(f"start {threading.current_thread().name}")
        time.sleep(seconds)
        real(kernel, m, flags, data)
        log.append("end")

    monkeypatch.setattr(SimKernel, "_mount", mount)
    return log


def test_the_remount_overlaps_the_writes_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Journaled first, started in a thread, read back before the server is moved (the move is
    what favordynmods speeds up) and before apply returns; revert is exact."""
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    log = slow_remount(monkeypatch, 0.3)
    host = tree_kernel(root)
    _plan, report = apply_profile(host, SHARED)
    assert report.failed == []
    assert log == ["start gputuned-remount", "end"]
    order = [w.path for w in host.writes]
    remount = order.index(f"{CG}:remount")
    move = next(i for i, p in enumerate(order) if p.endswith("/cgroup.procs"))
    assert any(p.startswith("/proc/irq/") for p in order[:remount]), "IRQs written meanwhile"
    assert remount < move, "the process moves only once the remount is done"
    assert "favordynmods" in cgroup2(root).super_options.split(",")
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before


def test_a_failure_while_the_remount_runs_undoes_it_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    slow_remount(monkeypatch, 0.2)
    host = tree_kernel(root)
    host.inject("/proc/irq/44/smp_affinity_list", "write", errno.EBUSY)
    with pytest.raises(ApplyError) as info:
        apply_profile(host, SHARED)
    assert "irq 44" in str(info.value)
    assert info.value.report.rolled_back
    assert {w["target"] for w in info.value.report.written} >= {TARGET}
    assert "favordynmods" not in cgroup2(root).super_options.split(",")
    assert digest(root) == before
    assert Journal(tree_kernel(root)).entries() == []


def test_a_remount_that_fails_in_its_thread_rolls_back_what_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)

    def busy(kernel: SimKernel, mount: mounts.Mount, flags: int, data: str) -> None:
        raise OSError(errno.EBUSY, "busy")

    monkeypatch.setattr(SimKernel, "_mount", busy)
    with pytest.raises(ApplyError) as info:
        apply_profile(tree_kernel(root), SHARED)
    assert f"cpuset {TARGET} failed" in str(info.value)
    assert digest(root) == before
    assert Journal(tree_kernel(root)).entries() == []


def test_a_failpoint_kill_waits_for_the_remount_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGKILL takes effect only once the mount(2) in progress returns; killing the tree
    model's remount half-way left a temporary mountinfo behind (seen once in the crash-point
    gauntlet, killed before the write after the remount)."""
    import tests.faults as faults_mod

    root = tree_copy("h200-captured", tmp_path)
    log = slow_remount(monkeypatch, 0.3)
    seen: list[tuple[list[str], list[str]]] = []

    def die(where: str) -> None:  # instead of SIGKILL: what the kill would leave
        seen.append((list(log), sorted(p.name for p in (root / "proc/self").iterdir())))

    monkeypatch.setattr(faults_mod, "_die", die)
    host = tree_kernel(root)
    old = cgroup2(root).super_options
    finish = host.start_remount(CG, "cgroup2", f"{old},favordynmods")
    host._kill("before write 2")
    assert seen == [(["start gputuned-remount", "end"], ["mountinfo"])]  # no temporary left
    assert "favordynmods" in cgroup2(root).super_options.split(",")
    finish()
