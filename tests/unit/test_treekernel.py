"""The tree's kernel model: kernel formats on read-back, byte-identical trees after write-back."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.cpulist import format_cpulist, format_mask
from gputuned.sim.cgroups import format_controllers
from gputuned.sim.devices import kstrtobool
from gputuned.sim.files import STATE_FILE
from tests.conftest import ALL_TREES, TREES_DIR
from tests.fakeproc import add_process
from tests.faults import FaultKernel, WriteRecord, tree_kernel

CG = "/sys/fs/cgroup"
POLICY = "/sys/module/pcie_aspm/parameters/policy"


def tree(name: str, tmp_path: Path) -> Path:
    root = tmp_path / name
    shutil.copytree(TREES_DIR / name, root, symlinks=True)
    return root


def digest(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + str(p.readlink())
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def read(root: Path, hpath: str) -> str:
    return (root / hpath.lstrip("/")).read_text()


def movable_irq(root: Path) -> int:
    meta = json.loads((root / "gputuned-tree.json").read_text())
    refused = set(meta.get("write_errors", {}))
    irqs = sorted(int(p.name) for p in (root / "proc/irq").iterdir() if p.name.isdigit())
    return next(n for n in irqs if f"/proc/irq/{n}/smp_affinity_list" not in refused)


# -- ASPM ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dual-socket-8gpu", "degraded-link"])
def test_aspm_policy_round_trip(name: str, tmp_path: Path) -> None:
    root = tree(name, tmp_path)
    before = digest(root)
    old = read(root, POLICY)
    host = tree_kernel(root)
    host.write_text(POLICY, "performance")
    assert read(root, POLICY) == "default [performance] powersave powersupersave \n"
    host.write_text(POLICY, "powersupersave\n")  # echo's newline is accepted
    assert read(root, POLICY) == "default performance powersave [powersupersave] \n"
    with pytest.raises(errors.InvalidValue, match="'fast' is not one of default, performance"):
        host.write_text(POLICY, "fast")
    assert read(root, POLICY) == "default performance powersave [powersupersave] \n"
    current = old.split("[")[1].split("]")[0]
    host.write_text(POLICY, current)
    assert digest(root) == before
    assert host.writes[0] == WriteRecord(POLICY, b"performance")


def test_aspm_policy_fault_fires_before_the_model(tmp_path: Path) -> None:
    root = tree("h200-vm", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    with pytest.raises(errors.PermissionDenied):  # EPERM recorded at capture: firmware owns ASPM
        host.write_text(POLICY, "performance")
    assert digest(root) == before and host.writes == []


def test_link_aspm_both_ends_and_round_trip(tmp_path: Path) -> None:
    root = tree("degraded-link", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    gpu = "/sys/bus/pci/devices/0000:01:00.0/link/l1_aspm"
    port = "/sys/devices/pci0000:00/0000:00:02.0/link/l1_aspm"
    assert host.read_value(gpu) == host.read_value(port) == "1"
    host.write_text(gpu, "0")
    assert read(root, port) == "0\n"  # one link, one state: both ends show it
    assert host.read_text(gpu) == "0\n"
    for bad in ("2", "maybe", ""):
        with pytest.raises(errors.InvalidValue):
            host.write_text(gpu, bad)
    host.write_text(port, "1\n")
    assert digest(root) == before


def test_kstrtobool_matches_the_kernel() -> None:
    assert [kstrtobool(s) for s in ("1", "y", "Yes", "on", "0", "n", "off", "of", "2", "")] == [
        True,
        True,
        True,
        True,
        False,
        False,
        False,
        False,
        None,
        None,
    ]


def test_config_space_write_is_in_place(tmp_path: Path) -> None:
    root = tree("h200-vm", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    cfg = "/sys/bus/pci/devices/0000:00:06.0/config"
    old = host.read_bytes(cfg, 0x78, 2)
    host.write_bytes(cfg, b"\x10\x20", offset=0x78)
    assert host.read_bytes(cfg, 0x78, 2) == b"\x10\x20"
    host.write_bytes(cfg, old, offset=0x78)
    assert digest(root) == before


# -- IRQs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_TREES)
def test_irq_affinity_list_round_trip(name: str, tmp_path: Path) -> None:
    root = tree(name, tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    irq = movable_irq(root)
    base = f"/proc/irq/{irq}"
    old = host.read_value(f"{base}/smp_affinity_list")
    nr = max(int(c) for c in read(root, "/sys/devices/system/cpu/possible").strip().split("-")) + 1
    host.write_text(f"{base}/smp_affinity_list", "1")
    assert read(root, f"{base}/smp_affinity_list") == "1\n"
    assert read(root, f"{base}/smp_affinity") == format_mask({1}, nr) + "\n"
    if (root / f"proc/irq/{irq}/effective_affinity_list").exists():
        assert read(root, f"{base}/effective_affinity_list") == "1\n"
    host.write_text(f"{base}/smp_affinity_list", old)
    assert digest(root) == before


def test_irq_mask_updates_the_list(tmp_path: Path) -> None:
    root = tree("dual-socket-8gpu", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    # Nine hex digits with no comma overflow a 32-bit group: the kernel says EOVERFLOW
    # (bitmap_get_x32_reverse(), lib/bitmap-str.c), and nothing changes.
    with pytest.raises(errors.InvalidValue, match="EOVERFLOW"):
        host.write_text("/proc/irq/121/smp_affinity", "ff00000000")
    assert digest(root) == before
    host.write_text("/proc/irq/121/smp_affinity", "ff,00000000")
    assert read(root, "/proc/irq/121/smp_affinity_list") == "32-39\n"
    assert read(root, "/proc/irq/121/smp_affinity") == "000000ff,00000000\n"
    host.write_text("/proc/irq/121/smp_affinity", "ffffffff,ffffffff")
    assert digest(root) == before


def test_effective_affinity_follows_x86_and_comes_back(tmp_path: Path) -> None:
    root = tree("h200-captured", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    lst, eff = "/proc/irq/42/smp_affinity_list", "/proc/irq/42/effective_affinity_list"
    assert (host.read_value(lst), host.read_value(eff)) == ("0-15", "14")
    host.write_text(lst, "12-15")
    assert host.read_value(eff) == "14"  # still allowed: the vector stays where it is
    assert (root / STATE_FILE).exists()
    host.write_text(lst, "1-3")
    assert host.read_value(eff) == "1"
    host.write_text(lst, "0-15")  # the captured affinity: the captured target comes back
    assert host.read_value(eff) == "14"
    assert digest(root) == before


def test_irq_affinity_errors(tmp_path: Path) -> None:
    root = tree("dual-socket-8gpu", tmp_path)
    (root / "sys/devices/system/cpu/online").write_text("0-31\n")
    before = digest(root)
    host = tree_kernel(root)
    target = "/proc/irq/121/smp_affinity_list"
    with pytest.raises(errors.InvalidValue, match="no online CPU"):
        host.write_text(target, "40-45")
    with pytest.raises(errors.InvalidValue, match="ERANGE"):
        host.write_text(target, "64")
    with pytest.raises(errors.InvalidValue, match="is not a CPU list"):
        host.write_text(target, "one")
    with pytest.raises(errors.InvalidValue, match="EOVERFLOW"):
        host.write_text("/proc/irq/121/smp_affinity", "1,00000000,00000000")
    assert digest(root) == before and host.writes == []
    host.write_text(target, "30-40")  # one online CPU is enough; the mask is kept as written
    assert read(root, target) == "30-40\n"


def test_irq_write_error_recorded_at_capture(tmp_path: Path) -> None:
    root = tree("h200-vm", tmp_path)
    before = digest(root)
    with pytest.raises(errors.PermissionDenied):
        tree_kernel(root).write_text("/proc/irq/31/smp_affinity_list", "1")
    assert digest(root) == before


@pytest.mark.parametrize(
    ("name", "new", "shown"),
    [("h200-vm", "3", "0003\n"), ("dual-socket-8gpu", "1", "00000000,00000001\n")],
)
def test_default_affinity_round_trip(name: str, new: str, shown: str, tmp_path: Path) -> None:
    root = tree(name, tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    path = "/proc/irq/default_smp_affinity"
    old = host.read_value(path)
    host.write_text(path, new)
    assert read(root, path) == shown
    for bad in ("0", "xyz"):
        with pytest.raises(errors.InvalidValue):
            host.write_text(path, bad)
    host.write_text(path, old)
    assert digest(root) == before


# -- cgroup v2: mkdir, rmdir, controllers --------------------------------------------------------


def test_mkdir_makes_what_the_kernel_makes_and_rmdir_removes_it(tmp_path: Path) -> None:
    root = tree("h200-vm", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    host.mkdir(f"{CG}/gputuned.inference")
    made = {p.name: p.read_text() for p in (root / "sys/fs/cgroup/gputuned.inference").iterdir()}
    assert made == {
        "cgroup.controllers": "cpuset cpu io memory hugetlb pids\n",
        "cgroup.procs": "",
        "cgroup.subtree_control": "",
        "cgroup.type": "domain\n",
        "cpu.max": "max 100000\n",  # the root enables cpu for its children too
        "cpu.weight": "100\n",
        "cpuset.cpus": "\n",
        "cpuset.cpus.effective": "0-15\n",
        "cpuset.cpus.partition": "member\n",
        "cpuset.mems": "\n",
        "cpuset.mems.effective": "0\n",
    }  # no cpuset.cpus.exclusive: no cgroup of this tree shows it (kernel before 6.7)
    host.rmdir(f"{CG}/gputuned.inference")
    assert digest(root) == before
    assert [w.path for w in host.writes] == [
        f"{CG}/gputuned.inference:mkdir",
        f"{CG}/gputuned.inference:rmdir",
    ]


def test_mkdir_on_a_67_kernel_has_exclusive_files(tmp_path: Path) -> None:
    root = tree("h200-captured", tmp_path)
    host = tree_kernel(root)
    host.mkdir(f"{CG}/g")
    assert read(root, f"{CG}/g/cpuset.cpus.exclusive") == "\n"
    assert read(root, f"{CG}/g/cpuset.cpus.exclusive.effective") == "\n"
    # Under a parent without cpuset in its subtree_control: no cpuset files at all.
    host.mkdir(f"{CG}/process_api/new")
    assert sorted(p.name for p in (root / "sys/fs/cgroup/process_api/new").iterdir()) == [
        "cgroup.controllers",
        "cgroup.procs",
        "cgroup.subtree_control",
        "cgroup.type",
    ]
    assert read(root, f"{CG}/process_api/new/cgroup.controllers") == "memory\n"


def test_rmdir_refuses_while_busy(tmp_path: Path) -> None:
    root = tree("h200-vm", tmp_path)
    host = tree_kernel(root)
    host.mkdir(f"{CG}/g")
    host.mkdir(f"{CG}/g/child")
    with pytest.raises(errors.Busy, match="child cgroups"):
        host.rmdir(f"{CG}/g")
    host.rmdir(f"{CG}/g/child")
    add_process(
        root, 4242, comm="python3", cmdline=["python3"], exe=None, start_time=1, cgroup="/g"
    )
    assert read(root, f"{CG}/g/cgroup.procs") == "4242\n"
    with pytest.raises(errors.Busy, match=r"processes are still in the cgroup"):
        host.rmdir(f"{CG}/g")
    assert (root / "sys/fs/cgroup/g").is_dir()
    host.move_to_cgroup(4242, CG)
    assert read(root, f"{CG}/g/cgroup.procs") == ""
    host.rmdir(f"{CG}/g")
    assert not (root / "sys/fs/cgroup/g").exists()
    with pytest.raises(errors.TargetGone):
        host.rmdir(f"{CG}/g")


def test_subtree_control_round_trip(tmp_path: Path) -> None:
    root = tree("h200-captured", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    api = f"{CG}/process_api"
    host.write_text(f"{api}/cgroup.subtree_control", "+cpuset")
    assert read(root, f"{api}/cgroup.subtree_control") == "cpuset memory\n"
    for kid in ("core", "8e95281a31c74315ed0207cbaa5221d7"):
        assert read(root, f"{api}/{kid}/cgroup.controllers") == "cpuset memory\n"
        assert read(root, f"{api}/{kid}/cpuset.cpus.effective") == "0-15\n"
        assert read(root, f"{api}/{kid}/cpuset.cpus.exclusive") == "\n"
    host.write_text(f"{api}/cgroup.subtree_control", "-cpuset")
    assert digest(root) == before


def test_subtree_control_errors(tmp_path: Path) -> None:
    root = tree("h200-captured", tmp_path)
    host = tree_kernel(root)
    with pytest.raises(errors.InvalidValue):
        host.write_text(f"{CG}/process_api/cgroup.subtree_control", "cpuset")
    with pytest.raises(errors.InvalidValue):
        host.write_text(f"{CG}/process_api/cgroup.subtree_control", "+bogus")
    with pytest.raises(errors.TargetGone, match=r"rdma not in cgroup\.controllers"):
        host.write_text(f"{CG}/process_api/cgroup.subtree_control", "+rdma")
    with pytest.raises(errors.Busy, match="still enables it"):
        host.write_text(f"{CG}/cgroup.subtree_control", "-memory")
    add_process(
        root, 7, comm="w", cmdline=["w"], exe=None, start_time=1, cgroup="/process_api/core"
    )
    with pytest.raises(errors.Busy, match="no internal processes"):
        host.write_text(f"{CG}/process_api/core/cgroup.subtree_control", "+memory")
    assert format_controllers({"pids", "cpuset", "memory"}) == "cpuset memory pids\n"
    assert format_controllers(set()) == ""


def test_hybrid_tree_stray_file_is_a_plain_file(tmp_path: Path) -> None:
    # ci-vm: cgroup2 is at /sys/fs/cgroup/unified; /sys/fs/cgroup is a tmpfs (by /proc/mounts).
    root = tree("ci-vm", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    host.write_text(f"{CG}/cgroup.subtree_control", "+cpu")
    assert read(root, f"{CG}/cgroup.subtree_control") == "+cpu"
    host.write_text(f"{CG}/cgroup.subtree_control", "+cpuset\n")
    assert digest(root) == before


def test_read_only_and_faults(tmp_path: Path) -> None:
    root = tree("h200-vm", tmp_path)
    host = tree_kernel(root)
    with pytest.raises(errors.PermissionDenied, match="read-only kernel file"):
        host.write_text(f"{CG}/cpuset.cpus.effective", "0-3")
    host.inject(f"{CG}/g", "mkdir", errno.ENOSPC)
    with pytest.raises(errors.NoSpace):
        host.mkdir(f"{CG}/g")
    assert not (root / "sys/fs/cgroup/g").exists() and host.writes == []


def test_a_read_only_mount_refuses_writes_under_it(tmp_path: Path) -> None:
    """A container's /proc/irq is a read-only bind mount (Docker's ReadonlyPaths): every write
    under it fails with EROFS (fs/open.c do_dentry_open(): mnt_get_write_access()), a write
    beside it does not."""
    root = tree("h200-captured", tmp_path)
    with (root / "proc/self/mountinfo").open("a") as f:
        f.write("600 580 0:64 /irq /proc/irq ro,nosuid,nodev,noexec,relatime - proc proc rw\n")
    host = tree_kernel(root)
    irq = movable_irq(root)
    before = digest(root)
    for path in (f"/proc/irq/{irq}/smp_affinity_list", "/proc/irq/default_smp_affinity"):
        with pytest.raises(errors.PermissionDenied) as err:
            host.write_text(path, "1")
        assert err.value.errno == errno.EROFS
    assert digest(root) == before
    host.write_text(f"{CG}/cgroup.subtree_control", "+cpu")  # /sys/fs/cgroup is writable


# -- cgroup v2: cpuset partitions ----------------------------------------------------------------


def partition(host: FaultKernel, cg: str, cpus: str, mode: str, *, exclusive: bool = True) -> str:
    if not host.is_dir(cg):
        host.mkdir(cg)
    host.write_text(f"{cg}/cpuset.cpus", cpus)
    if exclusive and host.exists(f"{cg}/cpuset.cpus.exclusive"):
        host.write_text(f"{cg}/cpuset.cpus.exclusive", cpus)
    host.write_text(f"{cg}/cpuset.cpus.partition", mode)
    return host.read_text(f"{cg}/cpuset.cpus.partition")


@pytest.mark.parametrize("name", ["h200-vm", "h200-captured"])
def test_isolated_partition_round_trip(name: str, tmp_path: Path) -> None:
    root = tree(name, tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    g = f"{CG}/gputuned.inference"
    assert partition(host, g, "0-3", "isolated") == "isolated\n"
    assert read(root, f"{CG}/cpuset.cpus.effective") == "4-15\n"
    assert read(root, f"{g}/cpuset.cpus.effective") == "0-3\n"
    if name == "h200-captured":  # every other cgroup loses the CPUs too
        assert read(root, f"{CG}/process_api/cpuset.cpus.effective") == "4-15\n"
        assert read(root, f"{g}/cpuset.cpus.exclusive.effective") == "0-3\n"
    host.write_text(f"{g}/cpuset.cpus.partition", "root")  # type change keeps it valid
    assert read(root, f"{g}/cpuset.cpus.partition") == "root\n"
    # Revert newest first, as the journal does.
    host.write_text(f"{g}/cpuset.cpus.partition", "isolated")
    host.write_text(f"{g}/cpuset.cpus.partition", "member")
    assert read(root, f"{CG}/cpuset.cpus.effective") == "0-15\n"
    if host.exists(f"{g}/cpuset.cpus.exclusive"):
        host.write_text(f"{g}/cpuset.cpus.exclusive", "\n")
    host.write_text(f"{g}/cpuset.cpus", "\n")
    host.rmdir(g)
    assert digest(root) == before


def test_rmdir_of_a_valid_partition_gives_cpus_back(tmp_path: Path) -> None:
    root = tree("h200-captured", tmp_path)
    host = tree_kernel(root)
    assert partition(host, f"{CG}/g", "8-15", "root") == "root\n"
    assert read(root, f"{CG}/cpuset.cpus.effective") == "0-7\n"
    host.rmdir(f"{CG}/g")
    assert read(root, f"{CG}/cpuset.cpus.effective") == "0-15\n"
    assert read(root, f"{CG}/process_api/cpuset.cpus.effective") == "0-15\n"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("h200-captured", "root invalid (cpuset.cpus and cpuset.cpus.exclusive are empty)\n"),
        ("h200-vm", "root invalid (cpuset.cpus is empty)\n"),  # no 6.7 files: older wording
    ],
)
def test_partition_without_cpus(name: str, message: str, tmp_path: Path) -> None:
    root = tree(name, tmp_path)
    host = tree_kernel(root)
    host.mkdir(f"{CG}/g")
    host.write_text(f"{CG}/g/cpuset.cpus.partition", "root")
    assert read(root, f"{CG}/g/cpuset.cpus.partition") == message
    assert read(root, f"{CG}/cpuset.cpus.effective") == "0-15\n"
    host.write_text(f"{CG}/g/cpuset.cpus", "2-3")  # now valid: the kernel re-validates
    assert read(root, f"{CG}/g/cpuset.cpus.partition") == "root\n"
    assert read(root, f"{CG}/cpuset.cpus.effective") == "0-1,4-15\n"


def test_partition_taking_every_cpu(tmp_path: Path) -> None:
    root = tree("h200-captured", tmp_path)
    host = tree_kernel(root)
    got = partition(host, f"{CG}/g", "0-15", "isolated")
    assert got == "isolated invalid (Parent unable to distribute cpu downstream)\n"
    assert read(root, f"{CG}/cpuset.cpus.effective") == "0-15\n"
    assert read(root, f"{CG}/g/cpuset.cpus.exclusive.effective") == "0-15\n"  # member-like


def test_overlapping_siblings(tmp_path: Path) -> None:
    root = tree("h200-captured", tmp_path)
    host = tree_kernel(root)
    assert partition(host, f"{CG}/a", "0-3", "root") == "root\n"
    assert read(root, f"{CG}/cpuset.cpus.effective") == "4-15\n"
    host.mkdir(f"{CG}/b")
    # A sibling whose cpuset.cpus overlap a partition makes it invalid (update_cpumask()); the
    # kernel gives no reason then and keeps its exclusive.effective (seen on the H200's 6.18).
    host.write_text(f"{CG}/b/cpuset.cpus", "2-5")
    assert read(root, f"{CG}/a/cpuset.cpus.partition") == "root invalid\n"
    assert read(root, f"{CG}/a/cpuset.cpus.exclusive.effective") == "0-3\n"
    assert read(root, f"{CG}/cpuset.cpus.effective") == "0-15\n"
    assert read(root, f"{CG}/b/cpuset.cpus.effective") == "2-5\n"
    host.write_text(f"{CG}/b/cpuset.cpus", "")
    assert read(root, f"{CG}/a/cpuset.cpus.partition") == "root invalid\n"  # not looked at again
    host.write_text(f"{CG}/a/cpuset.cpus.partition", "root")
    assert read(root, f"{CG}/a/cpuset.cpus.partition") == "root\n"
    with pytest.raises(errors.InvalidValue, match=r"overlaps cpuset\.cpus\.exclusive"):
        host.write_text(f"{CG}/b/cpuset.cpus.exclusive", "3")
    # Two partitions: the one valid before keeps its CPUs, the new one is refused.
    host.write_text(f"{CG}/b/cpuset.cpus.partition", "root")
    assert read(root, f"{CG}/b/cpuset.cpus.partition") == (
        "root invalid (cpuset.cpus and cpuset.cpus.exclusive are empty)\n"
    )
    assert read(root, f"{CG}/a/cpuset.cpus.partition") == "root\n"


def test_own_cpus_update_reasons_and_refusals(tmp_path: Path) -> None:
    root = tree("h200-captured", tmp_path)
    host = tree_kernel(root)
    assert partition(host, f"{CG}/a", "1-2", "isolated", exclusive=False) == "isolated\n"
    host.mkdir(f"{CG}/b")
    host.write_text(f"{CG}/b/cpuset.cpus", "3-4")  # no overlap yet
    host.write_text(f"{CG}/a/cpuset.cpus", "0-15")  # overlaps b and takes all: NOCPUS first
    assert read(root, f"{CG}/a/cpuset.cpus.partition") == (
        "isolated invalid (Parent unable to distribute cpu downstream)\n"
    )
    host.write_text(f"{CG}/a/cpuset.cpus", "5-6")
    host.write_text(f"{CG}/a/cpuset.cpus.partition", "root")
    assert read(root, f"{CG}/a/cpuset.cpus.partition") == "root\n"
    before = digest(root)
    with pytest.raises(errors.Busy, match="cannot lose all its CPUs"):
        host.write_text(f"{CG}/a/cpuset.cpus", "")  # EBUSY on 6.18: deadline bandwidth
    assert digest(root) == before


def test_nested_partitions(tmp_path: Path) -> None:
    root = tree("h200-captured", tmp_path)
    host = tree_kernel(root)
    host.mkdir(f"{CG}/m")
    host.write_text(f"{CG}/m/cgroup.subtree_control", "+cpuset")
    got = partition(host, f"{CG}/m/p", "1", "root")
    # A member parent: a remote partition (6.7+), whose exclusive CPUs must be handed down by
    # every ancestor first; m hands none (remote_partition_enable(): PERR_INVCPUS).
    assert got == "root invalid (Invalid cpu list in cpuset.cpus.exclusive)\n"

    host.write_text(f"{CG}/m/cpuset.cpus.partition", "root")  # no CPUs: invalid parent
    assert read(root, f"{CG}/m/p/cpuset.cpus.partition") == (
        "root invalid (Parent is an invalid partition root)\n"
    )
    host.write_text(f"{CG}/m/cpuset.cpus", "0-3")
    assert read(root, f"{CG}/m/cpuset.cpus.partition") == "root\n"
    assert read(root, f"{CG}/m/p/cpuset.cpus.partition") == "root\n"
    assert read(root, f"{CG}/m/cpuset.cpus.effective") == "0,2-3\n"
    assert read(root, f"{CG}/m/p/cpuset.cpus.effective") == "1\n"
    got = partition(host, f"{CG}/m/q", "4-5", "root")
    assert got == "root invalid (Invalid cpu list in cpuset.cpus.exclusive)\n"
    # The parent partition has no tasks: a child may take all that is left.
    assert partition(host, f"{CG}/m/q", "0,2-3", "root") == "root\n"
    assert read(root, f"{CG}/m/cpuset.cpus.effective") == "\n"


def test_cpuset_cpus_errors(tmp_path: Path) -> None:
    root = tree("h200-vm", tmp_path)
    host = tree_kernel(root)
    host.mkdir(f"{CG}/g")
    with pytest.raises(errors.InvalidValue):
        host.write_text(f"{CG}/g/cpuset.cpus", "0-16")
    with pytest.raises(errors.InvalidValue):
        host.write_text(f"{CG}/g/cpuset.cpus.partition", "exclusive")
    host.write_text(f"{CG}/g/cpuset.cpus", "3,1-2")
    assert read(root, f"{CG}/g/cpuset.cpus") == "1-3\n"
    assert read(root, f"{CG}/g/cpuset.cpus.effective") == "1-3\n"
    add_process(root, 9, comm="w", cmdline=["w"], exe=None, start_time=1, cgroup="/g")
    host.write_text(f"{CG}/g/cpuset.cpus.partition", "root")
    with pytest.raises(errors.NoSpace, match="would have no CPU"):
        host.write_text(f"{CG}/g/cpuset.cpus", "")
    # A member may on cgroup v2 (validate_change() refuses it on the legacy hierarchy only):
    # it takes its parent's CPUs, as a unit whose AllowedCPUs= systemd resets.
    host.write_text(f"{CG}/g/cpuset.cpus.partition", "member")
    host.write_text(f"{CG}/g/cpuset.cpus", "")
    assert read(root, f"{CG}/g/cpuset.cpus.effective") == read(root, f"{CG}/cpuset.cpus.effective")


def test_a_remote_partition_takes_its_cpus_from_the_top_and_gives_them_back(
    tmp_path: Path,
) -> None:
    """cgroup-v2.rst "cpuset.cpus.partition": the exclusive CPUs written down the hierarchy
    first; the partition's CPUs leave every other cgroup; a member again, they come back."""
    root = tree("h200-captured", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    host.mkdir(f"{CG}/s")
    host.write_text(f"{CG}/s/cgroup.subtree_control", "+cpuset")
    host.mkdir(f"{CG}/s/u")
    host.write_text(f"{CG}/s/cpuset.cpus.exclusive", "2-3")
    assert read(root, f"{CG}/s/cpuset.cpus.exclusive.effective") == "2-3\n"
    host.write_text(f"{CG}/s/u/cpuset.cpus.exclusive", "2-3")
    host.write_text(f"{CG}/s/u/cpuset.cpus.partition", "root")
    assert read(root, f"{CG}/s/u/cpuset.cpus.partition") == "root\n"
    assert read(root, f"{CG}/s/u/cpuset.cpus.effective") == "2-3\n"
    assert read(root, f"{CG}/cpuset.cpus.effective") == "0-1,4-15\n"
    assert read(root, f"{CG}/s/cpuset.cpus.effective") == "0-1,4-15\n"
    assert read(root, f"{CG}/s/cpuset.cpus.exclusive.effective") == "2-3\n"
    # A sibling of s may not claim them.
    host.mkdir(f"{CG}/t")
    with pytest.raises(errors.InvalidValue):
        host.write_text(f"{CG}/t/cpuset.cpus.exclusive", "3")
    host.rmdir(f"{CG}/t")
    host.write_text(f"{CG}/s/u/cpuset.cpus.partition", "member")
    assert read(root, f"{CG}/cpuset.cpus.effective") == "0-15\n"
    host.rmdir(f"{CG}/s/u")
    host.write_text(f"{CG}/s/cpuset.cpus.exclusive", "")
    host.write_text(f"{CG}/s/cgroup.subtree_control", "-cpuset")
    host.rmdir(f"{CG}/s")
    assert digest(root) == before


def test_format_helpers_agree_with_trees() -> None:
    assert format_mask({0}, 16) == "0001" and format_cpulist({0, 1, 2, 5}) == "0-2,5"


# -- a partition next to another (finding F1, docs/dev/reliability.md) -------------------------------


@pytest.mark.parametrize("with_exclusive", [True, False])
def test_exclusive_claim_on_a_neighbours_cpus_is_refused_before_anything_changes(
    with_exclusive: bool, tmp_path: Path
) -> None:
    """update_exclusive_cpumask(): EINVAL against a sibling's exclusive(.effective) CPUs, also
    those of a partition made with cpuset.cpus alone; the neighbour stays valid."""
    root = tree("h200-captured", tmp_path)
    host = tree_kernel(root)
    n = f"{CG}/neighbour"
    assert partition(host, n, "1-2", "root", exclusive=with_exclusive) == "root\n"
    host.mkdir(f"{CG}/g")
    before = digest(root)
    which = "cpuset.cpus.exclusive" if with_exclusive else "cpuset.cpus.exclusive.effective"
    with pytest.raises(errors.InvalidValue, match=rf"overlaps {which} of {n} \(1-2\)"):
        host.write_text(f"{CG}/g/cpuset.cpus.exclusive", "1-4")
    assert digest(root) == before
    host.write_text(f"{CG}/g/cpuset.cpus.exclusive", "3-4")  # CPUs nobody holds: taken
    assert read(root, f"{n}/cpuset.cpus.partition") == "root\n"


def test_cpuset_cpus_over_a_neighbours_partition_invalidates_it(tmp_path: Path) -> None:
    """update_cpumask() on cgroup v2 takes the write and turns the sibling partition 'root
    invalid' for good (seen on the H200's 6.18): the old write order's damage."""
    root = tree("h200-captured", tmp_path)
    host = tree_kernel(root)
    n = f"{CG}/neighbour"
    partition(host, n, "1-2", "root")
    host.mkdir(f"{CG}/g")
    host.write_text(f"{CG}/g/cpuset.cpus", "1-4")
    assert read(root, f"{n}/cpuset.cpus.partition") == "root invalid\n"
    assert read(root, f"{CG}/cpuset.cpus.effective") == "0-15\n"
    with pytest.raises(errors.InvalidValue):
        host.write_text(f"{CG}/g/cpuset.cpus.exclusive", "1-4")  # its exclusive.effective stays
    host.write_text(f"{CG}/g/cpuset.cpus", "")
    host.rmdir(f"{CG}/g")
    assert read(root, f"{n}/cpuset.cpus.partition") == "root invalid\n"  # and stays so


def test_exclusive_claim_may_not_leave_a_sibling_none_of_its_cpus(tmp_path: Path) -> None:
    root = tree("h200-captured", tmp_path)
    host = tree_kernel(root)
    host.mkdir(f"{CG}/m")
    host.write_text(f"{CG}/m/cpuset.cpus", "2-3")
    host.mkdir(f"{CG}/g")
    with pytest.raises(errors.InvalidValue, match=f"would leave {CG}/m none of its cpuset.cpus"):
        host.write_text(f"{CG}/g/cpuset.cpus.exclusive", "1-4")
    host.write_text(f"{CG}/m/cpuset.cpus", "2-5")  # CPUs 5 left to it: allowed
    host.write_text(f"{CG}/g/cpuset.cpus.exclusive", "1-4")
    assert read(root, f"{CG}/g/cpuset.cpus.exclusive") == "1-4\n"


def test_exclusive_first_order_and_reverse_revert_round_trip(tmp_path: Path) -> None:
    """gputuned's order: exclusive CPUs, cpuset.cpus, type; revert newest first."""
    root = tree("h200-captured", tmp_path)
    before = digest(root)
    host = tree_kernel(root)
    g = f"{CG}/gputuned.inference"
    host.mkdir(g)
    host.write_text(f"{g}/cpuset.cpus.exclusive", "1-4")
    assert read(root, f"{CG}/cpuset.cpus.effective") == "0-15\n"  # a claim takes nothing yet
    host.write_text(f"{g}/cpuset.cpus", "1-4")
    host.write_text(f"{g}/cpuset.cpus.partition", "isolated")
    assert read(root, f"{g}/cpuset.cpus.partition") == "isolated\n"
    assert read(root, f"{CG}/cpuset.cpus.effective") == "0,5-15\n"
    host.write_text(f"{g}/cpuset.cpus.partition", "member")
    host.write_text(f"{g}/cpuset.cpus", "\n")
    host.write_text(f"{g}/cpuset.cpus.exclusive", "\n")
    host.rmdir(g)
    assert digest(root) == before
