"""apply → verify → revert on copies of every tree: round trips, idempotence, switching, failure."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.engine import apply as apply_mod
from gputuned.engine.apply import ApplyError, apply_profile, read_state, revert_all
from gputuned.engine.journal import Journal
from gputuned.engine.plan import plan_profile
from gputuned.engine.verify import verify_plan
from gputuned.profile.load import load_profile, parse_profile
from gputuned.profile.model import Profile
from gputuned.settings.registry import expand, placement_kinds
from gputuned.store.state import JOURNAL, HostLock
from tests.conftest import ALL_TREES, TREES_DIR
from tests.fakeproc import add_process, add_user, remove_process
from tests.faults import FaultKernel, tree_kernel

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
SERVER_PID = 4242


def digest(root: Path) -> dict[str, str]:
    """Every file, link and directory of a tree except gputuned's own state."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel in ("run", "etc") or rel.startswith(("run/gputuned", "etc/gputuned")):
            continue
        if p.is_symlink():
            out[rel] = "-> " + str(p.readlink())
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


#: The account the shipped profiles' first rule names (match.user), as the trees have it.
SERVER_USER, SERVER_UID = "inference", 990


def tree_copy(name: str, tmp_path: Path, *, server: bool = True) -> Path:
    root = tmp_path / name
    shutil.copytree(TREES_DIR / name, root, symlinks=True)
    add_user(root, SERVER_USER, SERVER_UID)
    if server:
        # A vLLM-like server with 4 threads, as the shipped rule matches it.
        cpus = (root / "sys/devices/system/cpu/online").read_text().strip()
        add_process(
            root,
            SERVER_PID,
            comm="python3",
            cmdline=["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"],
            exe="/usr/bin/python3.11",
            start_time=123456,
            threads=[SERVER_PID, SERVER_PID + 1, SERVER_PID + 2, SERVER_PID + 3],
            cpus=cpus,
            uid=SERVER_UID,
        )
    return root


def full_profile(**over: Any) -> Profile:
    """Every tuner on and writing (PCIe too): the widest round trip."""
    data: dict[str, Any] = {
        "name": "full",
        "cpusets": {
            "housekeeping": {"cpus": "0"},
            "inference": {"gpu_local": 0, "exclude": ["housekeeping"], "count": 4},
        },
        "cpuset": {"mode": "isolated", "cpus": "inference", "favordynmods": True},
        "irq": {
            "gpu_cpus": "inference",
            "others_cpus": "housekeeping",
            "default_affinity": "housekeeping",
        },
        "pcie_aspm": {"policy": "performance", "gpu_links": "disable"},
        "pcie_payload": {"mps": "max-safe", "mrrs": 512, "allow_mps_change": True},
        "process": [
            {
                "name": "server",
                "match": {"cmdline": "vllm", "user": SERVER_USER},
                "cpus": "inference",
                "nice": -10,
                "policy": "batch",
                "move_to_partition": True,
                "spread_threads": True,
            }
        ],
    }
    data.update(over)
    return parse_profile(data, "test")


@pytest.mark.parametrize("tree", ALL_TREES)
def test_round_trip_is_byte_identical(tree: str, tmp_path: Path) -> None:
    root = tree_copy(tree, tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    _plan, report = apply_profile(host, full_profile())
    assert report.failed == []
    assert report.written, "the full profile changes something on every tree"
    assert len(host.writes) >= len(report.written)
    assert digest(root) != before
    assert Journal(tree_kernel(root)).entries(), "every write is journaled"

    again = tree_kernel(root)
    _plan2, report2 = apply_profile(again, full_profile())
    assert report2.written == [] and again.writes == [], "re-applying writes nothing"

    rev = revert_all(tree_kernel(root))
    assert rev.failed == []
    assert digest(root) == before
    assert not (root / JOURNAL.lstrip("/")).exists()


def test_apply_h200_places_everything_and_verifies(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path)
    host = tree_kernel(root)
    plan, report = apply_profile(host, load_profile(PROFILES / "shared-host.toml"))
    assert report.failed == []
    # IRQs 31 and 33 are unmovable on that host (EPERM recorded at capture): refused in plan.
    assert {r.target for r in plan.refused if r.tuner == "irq"} == {
        "irq 31 (virtio0-req.0)",
        "irq 33 (virtio1-req.0)",
    }
    assert (root / "proc/irq/42/smp_affinity_list").read_text() == "1\n"
    assert (root / "proc/irq/49/smp_affinity_list").read_text() == "8\n"
    assert (root / "proc/irq/default_smp_affinity").read_text() == "0001\n"
    cg = root / "sys/fs/cgroup/gputuned.inference"
    assert (cg / "cpuset.cpus.partition").read_text().strip() == "root"
    assert (cg / "cpuset.cpus").read_text().strip() == "1-8"
    assert "0::/gputuned.inference" in (root / f"proc/{SERVER_PID}/cgroup").read_text()
    for tid in range(SERVER_PID, SERVER_PID + 4):
        stat = (root / f"proc/{SERVER_PID}/task/{tid}/stat").read_text()
        assert stat.rpartition(")")[2].split()[19 - 3] == "-10"
    prof = load_profile(PROFILES / "shared-host.toml")
    result = verify_plan(plan_profile(tree_kernel(root), prof), read_state(tree_kernel(root)))
    assert result.exit_code == 0
    assert result.count("drifted") == 0 and result.count("passed") > 10
    # MRRS already 4096, policy refused; [neighbours] is report only in the shipped profile:
    # the two other top-level cgroups (the server's session slice once it has moved out).
    report_only = [(ln.tuner, ln.target) for ln in result.lines if ln.status == "report only"]
    assert report_only == [
        ("neighbours", "/process_api cpu.max"),
        ("neighbours", "/user.slice cpu.max"),
    ]


def test_verify_reports_drift_and_strict(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path)
    prof = load_profile(PROFILES / "shared-host.toml")
    apply_profile(tree_kernel(root), prof)
    (root / "proc/irq/45/smp_affinity_list").write_text("0-15\n")  # irqbalance moved it back
    rep = verify_plan(plan_profile(tree_kernel(root), prof), read_state(tree_kernel(root)))
    drifted = [ln for ln in rep.lines if ln.status == "drifted"]
    assert [(ln.target, ln.live, ln.wanted) for ln in drifted] == [("irq 45 (nvidia)", "0-15", "4")]
    assert rep.exit_code == 1
    (root / "proc/irq/45/smp_affinity_list").write_text("4\n")
    rep = verify_plan(plan_profile(tree_kernel(root), prof), read_state(tree_kernel(root)))
    assert rep.exit_code == 0 and rep.count("not possible here") >= 3
    strict = verify_plan(
        plan_profile(tree_kernel(root), prof), read_state(tree_kernel(root)), strict=True
    )
    assert strict.exit_code == 1
    text = rep.prometheus()
    assert 'gputuned_settings{profile="shared-host",status="drifted"} 0' in text
    assert "# TYPE gputuned_verify_exit_code gauge" in text


def test_verify_pending_reboot_exit_2(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path)
    prof = load_profile(PROFILES / "latency-critical.toml")
    apply_profile(tree_kernel(root), prof)
    rep = verify_plan(plan_profile(tree_kernel(root), prof), read_state(tree_kernel(root)))
    assert rep.count("drifted") == 0
    assert rep.count("pending reboot") == 4
    assert rep.exit_code == 2
    (root / "proc/cmdline").write_text(
        (root / "proc/cmdline").read_text().strip()
        + " nohz_full=2-15 rcu_nocbs=2-15 irqaffinity=0-1 pcie_aspm.policy=performance\n"
    )
    rep = verify_plan(plan_profile(tree_kernel(root), prof), read_state(tree_kernel(root)))
    assert rep.exit_code == 0


def test_switching_profiles_writes_only_the_difference(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    a = full_profile()
    b = full_profile(
        name="b",
        cpusets={
            "housekeeping": {"cpus": "0"},
            "inference": {"gpu_local": 0, "exclude": ["housekeeping"], "count": 6},
        },
        pcie_aspm=None,
    )
    apply_profile(tree_kernel(root), a)
    mid = digest(root)
    host = tree_kernel(root)
    plan_b = plan_profile(tree_kernel(root), b)
    _, report = apply_profile(host, b)
    after = digest(root)
    changed = {k for k, v in after.items() if v != mid.get(k)}
    # IRQ 42 -> CPU 1 and IRQ 43 -> CPU 2 are the same under both profiles: never touched.
    assert "proc/irq/42/smp_affinity_list" not in changed
    assert not [w for w in host.writes if w.path == "/proc/irq/42/smp_affinity_list"]
    # IRQ 46 moves from CPU 1 (4 CPUs: 42..45 -> 1..4, 46 -> 1) to CPU 5 (6 CPUs).
    assert (root / "proc/irq/46/smp_affinity_list").read_text() == "5\n"
    # Only B's differences are written, plus A's leftovers restored (none here: B manages
    # every key A did, except the ASPM policy, which the tree refuses anyway).
    b_targets = {op.target for c in plan_b.changes for op in expand(c)}
    assert report.written and {w["target"] for w in report.written} <= b_targets
    assert report.restored == []
    revert_all(tree_kernel(root))
    assert digest(root) == before


def test_failure_mid_apply_rolls_back(tmp_path: Path) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    host.inject("/proc/irq/150/smp_affinity_list", "write", errno.EBUSY)
    with pytest.raises(ApplyError) as info:
        apply_profile(host, full_profile())
    msg = str(info.value)
    assert "irq 150" in msg and "busy (EBUSY)" in msg and "were reverted" in msg
    assert info.value.report.rolled_back
    assert digest(root) == before
    assert Journal(tree_kernel(root)).entries() == []


def test_keep_going_continues_and_revert_restores(tmp_path: Path) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    host.inject("/proc/irq/150/smp_affinity_list", "write", errno.EBUSY)
    _, report = apply_profile(host, full_profile(), keep_going=True)
    assert [f["target"] for f in report.failed] == ["irq 150 (nvidia)"]
    assert len(report.written) > 20
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before


def test_unmovable_irq_on_live_style_eio_is_not_possible(tmp_path: Path) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path)
    host = tree_kernel(root)
    host.inject("/proc/irq/121/smp_affinity_list", "write", errno.EIO)  # kernel-managed
    _, report = apply_profile(host, full_profile())
    assert report.failed == []
    (np,) = [v for v in report.not_possible.values() if v["target"].startswith("irq 121")]
    assert np["reason"].startswith("unmovable (EIO)")
    rep = verify_plan(
        plan_profile(tree_kernel(root), full_profile()), read_state(tree_kernel(root))
    )
    line = next(ln for ln in rep.lines if ln.target.startswith("irq 121"))
    assert line.status == "not possible here" and rep.exit_code == 0


def test_read_error_on_irq_affinity_is_a_failure_not_an_unmovable_irq(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a refused write means "unmovable"; the kernel gives no read error for it."""
    root = tree_copy("dual-socket-8gpu", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    real = apply_mod.plan_profile  # type: ignore[attr-defined]

    def plan_then_fault(h: FaultKernel, profile: Profile, **kw: Any) -> Any:
        plan = real(h, profile, **kw)
        h.inject("/proc/irq/121/smp_affinity_list", "read", errno.EIO)  # after plan read it
        return plan

    monkeypatch.setattr(apply_mod, "plan_profile", plan_then_fault)
    with pytest.raises(ApplyError) as info:
        apply_profile(host, full_profile())
    msg = str(info.value)
    assert "read /proc/irq/121/smp_affinity_list: Input/output error (EIO)" in msg, msg
    assert "kernel-managed" not in msg and info.value.report.not_possible == {}
    assert digest(root) == before


def test_enospc_on_irq_affinity_names_interrupt_vectors(tmp_path: Path) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path)
    host = tree_kernel(root)
    host.inject("/proc/irq/150/smp_affinity_list", "write", errno.ENOSPC)
    with pytest.raises(ApplyError) as info:
        apply_profile(host, full_profile())
    msg = str(info.value)
    assert "no space left (ENOSPC); no free interrupt vector on the target CPUs" in msg, msg
    assert "filesystem" not in msg
    other = tree_kernel(root)
    other.inject("/sys/fs/cgroup/x", "mkdir", errno.ENOSPC)
    with pytest.raises(errors.NoSpace, match="free space on that filesystem"):
        other.mkdir("/sys/fs/cgroup/x")


def test_second_apply_is_refused_while_one_runs(tmp_path: Path) -> None:
    root = tree_copy("ci-vm", tmp_path, server=False)
    with (
        HostLock(tree_kernel(root)),
        pytest.raises(errors.Busy, match="another gputuned apply or revert is running"),
    ):
        apply_profile(tree_kernel(root), load_profile(PROFILES / "shared-host.toml"))


def test_exited_process_is_dropped_quietly_and_reused_pid_untouched(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    apply_profile(tree_kernel(root), load_profile(PROFILES / "shared-host.toml"))
    # The server's PID now belongs to a different process (new start time): revert must not
    # touch it; its journal entries are dropped.
    remove_process(root, SERVER_PID)
    add_process(
        root,
        SERVER_PID,
        comm="bash",
        cmdline=["bash"],
        exe="/usr/bin/bash",
        start_time=999999,
        nice=3,
    )
    reused = digest(root)
    rev = revert_all(tree_kernel(root))
    assert rev.failed == []
    after = digest(root)
    assert {k: v for k, v in after.items() if k.startswith(f"proc/{SERVER_PID}")} == {
        k: v for k, v in reused.items() if k.startswith(f"proc/{SERVER_PID}")
    }
    assert {k: v for k, v in after.items() if not k.startswith(f"proc/{SERVER_PID}")} == {
        k: v for k, v in before.items() if not k.startswith(f"proc/{SERVER_PID}")
    }


def test_stale_journal_is_replayed_by_revert(tmp_path: Path) -> None:
    root = tree_copy("degraded-link", tmp_path)
    before = digest(root)
    apply_profile(tree_kernel(root), full_profile())
    # A killed process leaves its journal (plus, here, a torn half-line from a crash).
    with (root / JOURNAL.lstrip("/")).open("a") as f:
        f.write('{"v": 1, "op": "sa')
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before


def test_status_and_active_profile_recorded(tmp_path: Path) -> None:
    root = tree_copy("ci-vm", tmp_path, server=False)
    apply_profile(
        tree_kernel(root), load_profile(PROFILES / "shared-host.toml"), source="/x/shared-host.toml"
    )
    active = json.loads((root / "etc/gputuned/active.json").read_text())
    assert active["source"] == "/x/shared-host.toml" and active["profile"]["name"] == "shared-host"
    assert parse_profile(active["profile"], "copy").name == "shared-host"
    revert_all(tree_kernel(root))
    assert not (root / "etc/gputuned/active.json").exists()


def test_stable_captures_before_and_after_a_round_trip_are_identical(tmp_path: Path) -> None:
    from gputuned.kernel.capture import capture

    root = tree_copy("h200-captured", tmp_path)
    capture(tree_kernel(root), tmp_path / "a", stable=True)
    apply_profile(tree_kernel(root), load_profile(PROFILES / "shared-host.toml"))
    mid = tmp_path / "mid"
    capture(tree_kernel(root), mid, stable=True)
    revert_all(tree_kernel(root))
    capture(tree_kernel(root), tmp_path / "b", stable=True)
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert digest(tmp_path / "a") != digest(mid)
    text = (tmp_path / "a/proc/interrupts").read_text()
    assert text.splitlines()[1].split()[1:3] == ["0", "0"]
    assert not list((tmp_path / "a/proc/irq").glob("*/effective_affinity_list"))


def test_read_only_proc_irq_is_not_possible_not_a_failure(tmp_path: Path) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path)
    host = tree_kernel(root)
    host.inject("/proc/irq/121/smp_affinity_list", "write", errno.EROFS)  # a container's /proc
    _, report = apply_profile(host, full_profile())
    assert report.failed == []
    (np,) = [v for v in report.not_possible.values() if v["target"].startswith("irq 121")]
    assert np["reason"].startswith("read-only here (EROFS)")


def test_affinity_narrowed_by_an_existing_partition_is_restored_as_cgroup_default(
    tmp_path: Path,
) -> None:
    """A process that starts while the partition exists has the CPUs the partition left it
    (0,9-15 here), though it never chose them; its original is "what its cgroup allows",
    looked up through ancestors when its own cgroup has no cpuset files (seen on the H200
    host: /process_api/<id> without the cpuset controller)."""
    import json as _json

    root = tree_copy("h200-captured", tmp_path, server=False)
    prof = load_profile(PROFILES / "shared-host.toml")
    apply_profile(tree_kernel(root), prof)  # the partition 1-8 exists before the server starts
    add_process(
        root,
        SERVER_PID,
        comm="python3",
        cmdline=["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"],
        exe="/usr/bin/python3.11",
        start_time=123456,
        threads=[SERVER_PID + 1],
        cpus="0,9-15",
        uid=SERVER_UID,
    )
    assert not (root / "sys/fs/cgroup/user.slice/user-0.slice/cpuset.cpus.effective").exists()
    apply_profile(tree_kernel(root), prof)
    olds = {
        e["entry"]["key"]: e["entry"]["old"]
        for e in map(_json.loads, (root / JOURNAL.lstrip("/")).read_text().splitlines())
        if e["op"] == "save"
    }
    aff = {k: v for k, v in olds.items() if k.endswith(":affinity")}
    assert set(aff.values()) == {"cgroup-default"}, aff


def test_irq_writes_are_journaled_with_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of IRQ affinity writes is journaled with one append + fsync, not one each; every
    other write still has its own append, before it, and its fsync unless it is a process
    setting (gputuned/engine/journal.py: those end with the process)."""
    import gputuned.engine.journal as journal_mod

    root = tree_copy("dual-socket-8gpu", tmp_path)
    synced: list[int] = []
    unsynced: list[str] = []
    real = journal_mod.append_durable

    def counting(host: FaultKernel, hpath: str, line: bytes, *, sync: bool = True) -> None:
        if sync:
            synced.append(line.count(b"\n"))
        elif b'"op": "save"' in line:
            unsynced.extend(json.loads(x)["entry"]["kind"] for x in line.splitlines())
        real(host, hpath, line, sync=sync)

    monkeypatch.setattr(journal_mod, "append_durable", counting)
    _, report = apply_profile(tree_kernel(root), full_profile())
    irq = [w for w in report.written if w["target"].startswith("irq ")]
    assert len(irq) > 20
    batches = [n for n in synced if n > 1]
    assert len(batches) == 1 and batches[0] >= len(irq)
    assert unsynced and set(unsynced) <= placement_kinds(), unsynced
    assert len(synced) + len(unsynced) == len(report.written) - batches[0] + 1
    assert revert_all(tree_kernel(root)).failed == []


def test_stable_captures_ignore_what_a_new_mount_namespace_renumbers(tmp_path: Path) -> None:
    """Mount IDs, device numbers, peer groups and the order of mounts change with every boot
    (the deb lane compares captures across a reboot, issue 19); --stable leaves them out, and
    the tree still works."""
    from gputuned.kernel import mounts
    from gputuned.kernel.capture import capture

    root = tree_copy("h200-captured", tmp_path)
    info = root / "proc/self/mountinfo"
    original = info.read_text()
    v1 = [f"{n} 30 0:{n} / /sys/fs/cgroup/{c} ro,relatime - cgroup cgroup rw,{c}\n"
          for n, c in ((40, "cpu"), (41, "memory"))]  # fmt: skip
    info.write_text("20 1 0:21 / / rw,relatime - overlay overlay rw\n" + original + "".join(v1))
    capture(tree_kernel(root), tmp_path / "a", stable=True)
    info.write_text(
        "61 1 0:33 / / rw,relatime - overlay overlay rw\n"
        + "".join(reversed(v1)).replace("40 30 0:40", "52 31 0:55")
        + original.replace("32 23 0:28 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime -",
                           "57 61 0:31 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 -")
    )  # fmt: skip
    capture(tree_kernel(root), tmp_path / "b", stable=True)
    capture(tree_kernel(root), tmp_path / "c")
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert "shared:9" in (tmp_path / "c/proc/self/mountinfo").read_text()  # only --stable drops it
    m = mounts.find(tree_kernel(tmp_path / "b"), "/sys/fs/cgroup", "cgroup2")
    assert m.super_options == "rw,nsdelegate,memory_recursiveprot"
