"""[pcie_payload]: MPS and MRRS planned, written into Device Control, read back and reverted.

Every register here is decoded by this file itself from the config space bytes, as DESIGN.md's
table gives them (PCIe capability found by walking the capability list from 0x34; DevCap at
+0x04, bits 2:0 MPS supported; DevCtl at +0x08, bit 4 relaxed ordering, bits 7:5 MPS, bit 11
no snoop, bits 14:12 MRRS; codes 0..5 = 128..4096 bytes), never with gputuned's own helpers, so
a wrong bit position in gputuned cannot agree with itself here.

The trees: ``four-gpu-one-socket`` (two root ports, 00:02.0 and 00:03.0, each with a switch
whose two downstream ports lead to one H200 each; every function supports and runs MPS 256),
``dual-socket-8gpu`` (the same on two sockets; under root port 00:02.0 the downstream port
02:10.0 supports only MPS 128 and the whole hierarchy runs 128) and ``degraded-link`` (one GPU
directly under root port 00:02.0).
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gputuned.engine.apply import apply_profile, apply_settings, revert_all
from gputuned.engine.applyreport import ApplyReport
from gputuned.engine.journal import Journal
from gputuned.engine.plan import PlanResult, plan_profile
from gputuned.engine.verify import verify_plan
from gputuned.errors import ProfileError
from gputuned.profile.load import parse_profile
from gputuned.profile.model import Profile
from gputuned.store.state import JOURNAL
from tests.conftest import TREES_DIR
from tests.faults import FaultKernel, tree_kernel

# four-gpu-one-socket, by root port: the root port, the switch's upstream port, its two
# downstream ports, the GPU below each.
UNDER_02 = ["0000:00:02.0", "0000:01:00.0", "0000:02:08.0", "0000:02:10.0"]
UNDER_03 = ["0000:00:03.0", "0000:05:00.0", "0000:06:08.0", "0000:06:10.0"]
GPUS_02 = ["0000:03:00.0", "0000:04:00.0"]
GPUS_03 = ["0000:07:00.0", "0000:08:00.0"]
FOUR_GPU = UNDER_02 + GPUS_02 + UNDER_03 + GPUS_03
SIZES = (128, 256, 512, 1024, 2048, 4096)

# -- trees -------------------------------------------------------------------------------------

_hosts: list[FaultKernel] = []


def tree(name: str, tmp_path: Path) -> Path:
    """A copy of a committed tree to change."""
    root = tmp_path / name
    shutil.copytree(TREES_DIR / name, root, symlinks=True)
    return root


def kernel(root: Path) -> FaultKernel:
    host = tree_kernel(root)
    _hosts.append(host)
    return host


@pytest.fixture(autouse=True)
def _writes_stay_in_the_copies() -> Iterator[None]:
    """Every write went to a copied config space or to gputuned's own state under /run:
    nothing reached a file linked to the committed tree."""
    _hosts.clear()
    yield
    stray = [w.path for h in _hosts for w in h.writes]
    assert not [p for p in stray if not (p.endswith("/config") or p.startswith("/run/"))]


# -- config space, decoded here --------------------------------------------------------------

RELAXED_ORDERING, NO_SNOOP = 1 << 4, 1 << 11
MPS_BITS, MRRS_BITS = 0b111 << 5, 0b111 << 12


def config_file(root: Path, bdf: str) -> Path:
    return next((root / "sys" / "devices").rglob(f"{bdf}/config"))


def express_at(raw: bytes) -> int:
    """Offset of the PCI Express capability (ID 0x10): the list starts at 0x34 when Status
    bit 4 says there is one; each entry is (ID, next pointer)."""
    assert raw[0x06] & 0x10, "no capability list"
    ptr = raw[0x34] & 0xFC
    while ptr:
        if raw[ptr] == 0x10:
            return ptr
        ptr = raw[ptr + 1] & 0xFC
    raise AssertionError("no PCI Express capability")


def devctl_at(root: Path, bdf: str) -> int:
    return express_at(config_file(root, bdf).read_bytes()) + 0x08


def devctl(root: Path, bdf: str) -> int:
    raw = config_file(root, bdf).read_bytes()
    at = express_at(raw) + 0x08
    return raw[at] | raw[at + 1] << 8


def set_devctl(root: Path, bdf: str, value: int) -> None:
    path = config_file(root, bdf)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, express_at(bytes(raw)) + 0x08, value)
    path.write_bytes(bytes(raw))


def set_devcap_mps(root: Path, bdf: str, size: int) -> None:
    path = config_file(root, bdf)
    raw = bytearray(path.read_bytes())
    at = express_at(bytes(raw)) + 0x04
    raw[at] = (raw[at] & ~0b111) | SIZES.index(size)
    path.write_bytes(bytes(raw))


def mps(reg: int) -> int:
    return 128 << ((reg >> 5) & 0b111)


def mrrs(reg: int) -> int:
    return 128 << ((reg >> 12) & 0b111)


def with_mps(reg: int, size: int) -> int:
    return (reg & ~MPS_BITS) | SIZES.index(size) << 5


def configs(root: Path, bdfs: list[str]) -> dict[str, bytes]:
    return {bdf: config_file(root, bdf).read_bytes() for bdf in bdfs}


def all_ones(root: Path, bdf: str) -> None:
    """What a function that fell off the bus (or sits in D3cold) returns for every read."""
    path = config_file(root, bdf)
    path.write_bytes(b"\xff" * len(path.read_bytes()))


def pcie_writes(host: FaultKernel) -> list[tuple[str, int, int]]:
    """(BDF, offset, length) of every config-space write, in order."""
    return [
        (Path(w.path).parent.name, w.offset or 0, len(w.data))
        for w in host.writes
        if w.path.endswith("/config")
    ]


# -- profiles, NVML ------------------------------------------------------------------------------


def payload(**table: Any) -> Profile:
    return parse_profile({"name": "payload", "pcie_payload": table}, "test")


def busy_gpus(root: Path, pids: dict[str, list[int]]) -> None:
    """NVML's view, as a capture records it: every GPU of four-gpu-one-socket, with the PIDs
    that have it open."""
    meta_file = root / "gputuned-tree.json"
    meta = json.loads(meta_file.read_text())
    meta["nvml"] = [
        {"index": i, "bdf": bdf, "name": "NVIDIA H200", "pids": pids.get(bdf, [])}
        for i, bdf in enumerate(GPUS_02 + GPUS_03)
    ]
    meta_file.write_text(json.dumps(meta))


def refused(plan: PlanResult) -> dict[str, str]:
    return {r.target: r.reason for r in plan.refused if r.tuner == "pcie_payload"}


def planned(plan: PlanResult, what: str = "MPS") -> dict[str, tuple[str, str]]:
    """BDF -> (current, wanted) of every change of ``what`` (MPS or MRRS) plan would write."""
    return {
        c.target.split()[0]: (c.current, c.wanted)
        for c in plan.changes
        if c.tuner == "pcie_payload" and c.target.endswith(what)
    }


def lowered_to_128(root: Path, bdfs: list[str]) -> None:
    """MPS 128 on ``bdfs``, every other bit kept: what the kernel leaves with
    pci=pcie_bus_peer2peer, or before anything raised it."""
    for bdf in bdfs:
        set_devctl(root, bdf, with_mps(devctl(root, bdf), 128))


# -- apply and read back -------------------------------------------------------------------------


def test_apply_sets_exactly_the_planned_fields_and_revert_puts_the_bytes_back(
    tmp_path: Path,
) -> None:
    """A user lowering MPS and MRRS through a PCIe switch relies on each function's Device
    Control register then holding exactly those sizes (MPS on every function under the root
    port, MRRS on the GPUs only), every other control bit as it was (relaxed ordering and no
    snoop among them: turning those off costs GPU throughput), nothing else in config space
    touched, a second apply writing nothing, and revert putting back the very bytes."""
    root = tree("four-gpu-one-socket", tmp_path)
    before = configs(root, FOUR_GPU)
    regs = {bdf: devctl(root, bdf) for bdf in FOUR_GPU}
    # The bits that must survive are set here: RO on every GPU and switch port, NS on the ports.
    assert all(
        regs[b] & RELAXED_ORDERING for b in FOUR_GPU if b not in ("0000:00:02.0", "0000:00:03.0")
    )
    assert all(regs[b] & NO_SNOOP for b in ("0000:01:00.0", "0000:02:08.0", "0000:06:10.0"))
    host = kernel(root)

    plan, report = apply_profile(host, payload(mps=128, mrrs=512, allow_mps_change=True))

    assert report.failed == [] and refused(plan) == {}
    # One MPS setting per function, whichever of the root port's two GPUs planned it.
    mps_keys = [c.key for c in plan.settings if c.key.endswith(":MPS")]
    assert sorted(mps_keys) == sorted(f"pcie:{bdf}:MPS" for bdf in FOUR_GPU)
    assert planned(plan, "MRRS") == {gpu: ("4096", "512") for gpu in GPUS_02 + GPUS_03}
    for bdf in FOUR_GPU:
        now, was = devctl(root, bdf), regs[bdf]
        gpu = bdf in GPUS_02 + GPUS_03
        assert mps(now) == 128, bdf
        assert mrrs(now) == (512 if gpu else mrrs(was)), bdf
        kept = ~(MPS_BITS | (MRRS_BITS if gpu else 0)) & 0xFFFF
        assert now & kept == was & kept, f"{bdf}: {was:#06x} -> {now:#06x}"
        at = devctl_at(root, bdf)
        raw, old = config_file(root, bdf).read_bytes(), before[bdf]
        assert raw[:at] + raw[at + 2 :] == old[:at] + old[at + 2 :], f"{bdf}: only DevCtl"
    assert {(bdf, off, n) for bdf, off, n in pcie_writes(host)} == {
        (bdf, devctl_at(root, bdf), 2) for bdf in FOUR_GPU
    } and len(pcie_writes(host)) == len(FOUR_GPU) + 4, "each write: DevCtl's 2 bytes"

    again = kernel(root)
    _plan, report2 = apply_profile(again, payload(mps=128, mrrs=512, allow_mps_change=True))
    assert report2.written == [] and again.writes == []

    assert revert_all(kernel(root)).failed == []
    assert configs(root, FOUR_GPU) == before


def test_raising_mps_writes_the_root_port_first_and_the_gpus_last(tmp_path: Path) -> None:
    """Raising MPS is safe only if no device sends a TLP larger than its receiver accepts:
    the user relies on the ports nearest the root port accepting 256 before anything below
    them sends it, the GPUs (the big DMA writers) last, one root port's hierarchy at a time,
    and on max-safe finding 256 (every DevCap there supports it)."""
    root = tree("four-gpu-one-socket", tmp_path)
    lowered_to_128(root, FOUR_GPU)
    host = kernel(root)

    plan, report = apply_profile(host, payload(mps="max-safe", allow_mps_change=True))

    assert report.failed == [] and refused(plan) == {} and plan.notes == []
    assert [bdf for bdf, _, _ in pcie_writes(host)] == UNDER_02 + GPUS_02 + UNDER_03 + GPUS_03
    assert all(mps(devctl(root, bdf)) == 256 for bdf in FOUR_GPU)


def test_lowering_mps_writes_the_gpus_first_and_the_root_port_last(tmp_path: Path) -> None:
    """Lowering is the reverse: the GPUs stop sending large TLPs before the ports above them
    stop accepting them, deepest functions first."""
    root = tree("four-gpu-one-socket", tmp_path)
    host = kernel(root)

    _plan, report = apply_profile(host, payload(mps=128, allow_mps_change=True))

    assert report.failed == []
    deepest_first = [
        "0000:04:00.0", "0000:03:00.0", "0000:02:10.0", "0000:02:08.0", "0000:01:00.0",
        "0000:00:02.0", "0000:08:00.0", "0000:07:00.0", "0000:06:10.0", "0000:06:08.0",
        "0000:05:00.0", "0000:00:03.0",
    ]  # fmt: skip
    assert [bdf for bdf, _, _ in pcie_writes(host)] == deepest_first


def test_lowering_the_ports_above_a_gpu_already_lowered_goes_bottom_up(tmp_path: Path) -> None:
    """After a reset put one side back, the GPUs may already run the target MPS while the
    ports above still run 256: what remains is a lowering, and it must still go from the
    bottom up."""
    root = tree("four-gpu-one-socket", tmp_path)
    lowered_to_128(root, GPUS_02 + GPUS_03)
    host = kernel(root)

    _plan, report = apply_profile(host, payload(mps=128, allow_mps_change=True))

    assert report.failed == []
    assert [bdf for bdf, _, _ in pcie_writes(host)] == [
        "0000:02:10.0", "0000:02:08.0", "0000:01:00.0", "0000:00:02.0",
        "0000:06:10.0", "0000:06:08.0", "0000:05:00.0", "0000:00:03.0",
    ]  # fmt: skip


# -- max-safe and DevCap ---------------------------------------------------------------------


def test_max_safe_is_the_smallest_devcap_anywhere_under_the_root_port(tmp_path: Path) -> None:
    """The shared ports above a GPU carry its siblings' traffic too, so max-safe is the
    smallest DevCap MPS of every function under the root port, not just on the GPU's own
    path: a downstream port beside GPU 03:00.0's path, and the switch above both GPUs of the
    other root port, each supporting only 128, bring their whole hierarchy to 128. The user is
    told when the GPU's own path would allow more."""
    root = tree("four-gpu-one-socket", tmp_path)
    set_devcap_mps(root, "0000:02:10.0", 128)  # beside 03:00.0's path, on 04:00.0's
    set_devcap_mps(root, "0000:05:00.0", 128)  # above both 07:00.0 and 08:00.0
    host = kernel(root)

    plan, report = apply_profile(host, payload(mps="max-safe", allow_mps_change=True))

    assert refused(plan) == {} and report.failed == []
    assert planned(plan) == {bdf: ("256", "128") for bdf in FOUR_GPU}
    assert plan.notes == [
        "pcie_payload: 0000:03:00.0: max-safe MPS is 128, not the path's 256: a device "
        "elsewhere under the same root port supports only that"
    ]
    assert all(mps(devctl(root, bdf)) == 128 for bdf in FOUR_GPU)


def test_an_mps_above_a_devcap_on_the_way_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    """A receiver drops TLPs larger than it supports as malformed (AER errors, a GPU lost):
    a size above the smallest DevCap on the path is refused, naming the function that limits
    it, and one above the smallest under the root port is refused too; the hierarchies that
    can take it already run it, so nothing at all is written."""
    root = tree("dual-socket-8gpu", tmp_path)
    host = kernel(root)

    plan, report = apply_profile(host, payload(mps=256, allow_mps_change=True))

    assert refused(plan) == {
        "0000:04:00.0 MPS": "MPS 256 is above the path's minimum DevCap MPS 128 (0000:02:10.0 "
        "supports 128): a receiver drops larger TLPs as malformed",
        "0000:03:00.0 MPS": "MPS 256 is above 128, the smallest DevCap MPS under this GPU's "
        "root port: the shared ports above it also carry its siblings' traffic",
    }
    assert plan.notes == [] and planned(plan) == {}
    assert report.written == [] and host.writes == []


def test_a_size_every_devcap_supports_is_planned_without_a_note(tmp_path: Path) -> None:
    """A size equal to the smallest DevCap is safe and is planned; a size the user named
    (not max-safe) gets no note about what max-safe would pick."""
    root = tree("four-gpu-one-socket", tmp_path)
    lowered_to_128(root, FOUR_GPU)
    plan = plan_profile(kernel(root), payload(mps=256, allow_mps_change=True))
    assert refused(plan) == {} and plan.notes == []
    assert planned(plan) == {bdf: ("128", "256") for bdf in FOUR_GPU}

    dual = tree("dual-socket-8gpu", tmp_path)
    plan = plan_profile(kernel(dual), payload(mps=128, allow_mps_change=True))
    assert plan.notes == [] and "0000:03:00.0 MPS" not in refused(plan)


def test_a_function_whose_mps_cannot_be_read_keeps_its_root_port_as_it_is(
    tmp_path: Path,
) -> None:
    """One unknown MPS makes any choice for its hierarchy a guess: a root port whose DevCap
    shows a reserved encoding refuses MPS for both GPUs below it, naming the port; the other
    root port is planned as usual."""
    root = tree("four-gpu-one-socket", tmp_path)
    path = config_file(root, "0000:00:02.0")
    raw = bytearray(path.read_bytes())
    raw[express_at(bytes(raw)) + 0x04] |= 0b111
    path.write_bytes(bytes(raw))

    plan = plan_profile(kernel(root), payload(mps=128, allow_mps_change=True))

    reasons = refused(plan)
    assert sorted(reasons) == ["0000:03:00.0 MPS", "0000:04:00.0 MPS"]
    for why in reasons.values():
        assert why.startswith("0000:00:02.0 DevCap Max_Payload_Size unreadable")
        assert why.endswith("MPS is left as it is under root port 0000:00:02.0")
    assert planned(plan) == {bdf: ("256", "128") for bdf in UNDER_03 + GPUS_03}


# -- opting in, report only, in sync ---------------------------------------------------------


def test_mps_is_only_reported_unless_the_profile_allows_changing_it(tmp_path: Path) -> None:
    """A wrong MPS takes a GPU off the bus, so a profile that does not say
    allow_mps_change = true gets the difference reported and MPS left as it is; MRRS, which
    is per requester, is still written."""
    root = tree("four-gpu-one-socket", tmp_path)
    host = kernel(root)

    plan, report = apply_profile(host, payload(mps=128, mrrs=1024))

    why = "MPS would change to 128 on 6 function(s) under root port {}; set "
    why += "pcie_payload.allow_mps_change = true to allow it"
    assert refused(plan) == {
        **{f"{gpu} MPS": why.format("0000:00:02.0") for gpu in GPUS_02},
        **{f"{gpu} MPS": why.format("0000:00:03.0") for gpu in GPUS_03},
    }
    assert report.failed == []
    assert all(mps(devctl(root, bdf)) == 256 for bdf in FOUR_GPU)
    assert all(mrrs(devctl(root, gpu)) == 1024 for gpu in GPUS_02 + GPUS_03)


def test_settings_already_right_are_in_sync_not_refused_and_verify_passes(
    tmp_path: Path,
) -> None:
    """Plan lists only real differences: where every function already runs the asked MPS
    and the GPUs the asked MRRS, nothing is planned or refused (not even for want of
    allow_mps_change), apply writes nothing and verify passes every setting."""
    root = tree("four-gpu-one-socket", tmp_path)
    prof = payload(mps=256, mrrs=4096)
    host = kernel(root)

    plan, report = apply_profile(host, prof)

    assert refused(plan) == {} and plan.changes == []
    assert len(plan.settings) == len(FOUR_GPU) + 4 and all(c.in_sync for c in plan.settings)
    assert report.written == [] and host.writes == []
    result = verify_plan(plan_profile(kernel(root), prof), {})
    assert result.exit_code == 0 and result.count("passed") == len(FOUR_GPU) + 4


def test_report_only_lists_the_changes_and_writes_nothing(tmp_path: Path) -> None:
    """report_only = true shows what would change and changes nothing."""
    root = tree("degraded-link", tmp_path)
    host = kernel(root)
    prof = payload(mps=128, mrrs=512, allow_mps_change=True, report_only=True)

    plan, report = apply_profile(host, prof)

    assert [(c.target, c.current, c.wanted) for c in plan.report_only] == [
        ("0000:01:00.0 MRRS", "4096", "512"),
        ("0000:01:00.0 MPS", "256", "128"),
        ("0000:00:02.0 MPS", "256", "128"),
    ]
    assert report.written == [] and host.writes == []


# -- GPUs in use -----------------------------------------------------------------------------


@pytest.mark.parametrize("busy", GPUS_02)
def test_a_gpu_in_use_keeps_mps_on_its_whole_root_port(tmp_path: Path, busy: str) -> None:
    """Changing MPS under live DMA is unsafe, and the ports whose MPS changes carry the DMA of
    every GPU below them: with one GPU in use (NVML lists its PIDs), MPS stays as it is for the
    whole root port, whichever GPU comes first, and the refusal names the PIDs (and the GPU,
    when it is the other one). MRRS is still written; the idle root port is changed."""
    root = tree("four-gpu-one-socket", tmp_path)
    busy_gpus(root, {busy: [4242, 4343]})
    host = kernel(root)

    plan, report = apply_profile(host, payload(mps=128, mrrs=512, allow_mps_change=True))

    idle = next(g for g in GPUS_02 if g != busy)
    tail = ": MPS changes only on an idle GPU"
    assert refused(plan) == {
        f"{busy} MPS": "GPU in use by PID(s) 4242, 4343" + tail,
        f"{idle} MPS": f"GPU in use by PID(s) 4242 (on {busy}), 4343 (on {busy})" + tail,
    }
    assert report.failed == []
    assert all(mps(devctl(root, bdf)) == 256 for bdf in UNDER_02 + GPUS_02)
    assert all(mps(devctl(root, bdf)) == 128 for bdf in UNDER_03 + GPUS_03)
    assert all(mrrs(devctl(root, gpu)) == 512 for gpu in GPUS_02 + GPUS_03)


def test_a_gpu_in_use_is_no_obstacle_when_mps_is_already_right(tmp_path: Path) -> None:
    """Nothing to change means nothing to refuse: a busy GPU whose hierarchy already runs the
    asked MPS is in sync, and an idle one (NVML lists no PIDs) is changed."""
    root = tree("four-gpu-one-socket", tmp_path)
    busy_gpus(root, {"0000:03:00.0": [4242]})
    lowered_to_128(root, UNDER_02 + GPUS_02)

    plan = plan_profile(kernel(root), payload(mps=128, allow_mps_change=True))

    assert refused(plan) == {}
    assert planned(plan) == {bdf: ("256", "128") for bdf in UNDER_03 + GPUS_03}


# -- devices that do not answer ----------------------------------------------------------------


def test_a_gpu_reading_all_ones_is_refused_only_what_the_profile_asks(tmp_path: Path) -> None:
    """A GPU that fell off the bus reads all-ones: the user is told, for each size the
    profile sets (not for those it keeps), that it is left as it is; its sibling keeps MPS
    too (its hierarchy holds an unknown value) but gets MRRS; nothing is written to it."""
    root = tree("four-gpu-one-socket", tmp_path)
    dead = "0000:03:00.0"
    all_ones(root, dead)

    plan = plan_profile(kernel(root), payload(mrrs=512))
    assert list(refused(plan)) == [f"{dead} MRRS"] and plan.notes == []
    assert "not responding" in refused(plan)[f"{dead} MRRS"]

    host = kernel(root)
    plan, report = apply_profile(host, payload(mps=128, mrrs=512, allow_mps_change=True))
    reasons = refused(plan)
    assert sorted(reasons) == [f"{dead} MPS", f"{dead} MRRS", "0000:04:00.0 MPS"]
    assert all("not responding" in why for why in reasons.values())
    assert report.failed == []
    assert config_file(root, dead).read_bytes() == b"\xff" * 4096
    assert dead not in {bdf for bdf, _, _ in pcie_writes(host)}
    assert mrrs(devctl(root, "0000:04:00.0")) == 512


def test_a_gpu_that_stops_answering_after_plan_is_never_written(tmp_path: Path) -> None:
    """A GPU can fall off the bus between plan and write (the daemon applies a plan it made
    earlier). Its config space then reads all-ones; writing one field into that would set
    every other Device Control bit, Initiate Function Level Reset (bit 15) among them. The
    user relies on nothing being written to it, the failure naming it, and the rest done."""
    root = tree("four-gpu-one-socket", tmp_path)
    host = kernel(root)
    plan = plan_profile(host, payload(mps=128, mrrs=512, allow_mps_change=True))
    dead = "0000:03:00.0"
    all_ones(root, dead)
    report = ApplyReport()

    apply_settings(host, Journal(host), plan.settings, report, keep_going=True)

    assert config_file(root, dead).read_bytes() == b"\xff" * 4096
    assert dead not in {bdf for bdf, _, _ in pcie_writes(host)}
    assert [f["target"] for f in report.failed] == [f"{dead} MRRS", f"{dead} MPS"]
    assert all("reads all-ones" in f["error"] for f in report.failed)
    others = [bdf for bdf in FOUR_GPU if bdf != dead]
    assert all(mps(devctl(root, bdf)) == 128 for bdf in others)


def test_revert_leaves_a_gpu_that_does_not_answer_and_restores_it_once_it_does(
    tmp_path: Path,
) -> None:
    """Revert never writes into a function that reads all-ones: its entries stay in the
    journal, reported as failed, and the next revert, once the GPU answers again, puts its
    original bytes back."""
    root = tree("four-gpu-one-socket", tmp_path)
    before = configs(root, FOUR_GPU)
    apply_profile(kernel(root), payload(mps=128, mrrs=512, allow_mps_change=True))
    dead = "0000:03:00.0"
    applied = config_file(root, dead).read_bytes()
    all_ones(root, dead)
    host = kernel(root)

    report = revert_all(host)

    assert config_file(root, dead).read_bytes() == b"\xff" * 4096
    assert dead not in {bdf for bdf, _, _ in pcie_writes(host)}
    assert sorted(f["target"] for f in report.failed) == [f"{dead} MPS", f"{dead} MRRS"]
    assert sorted(e.op.key for e in Journal(kernel(root)).entries()) == [
        f"pcie:{dead}:MPS",
        f"pcie:{dead}:MRRS",
    ]
    config_file(root, dead).write_bytes(applied)  # it answers again
    assert revert_all(kernel(root)).failed == []
    assert configs(root, FOUR_GPU) == before


@pytest.mark.xfail(
    strict=True,
    reason="gputuned/kernel/pci.py mps_unreadable() names only GPUs that read all-ones: a "
    "dead bridge drops out of the hierarchy and the MPS around it is planned (reported to "
    "the lead)",
)
def test_a_switch_port_reading_all_ones_keeps_mps_for_its_root_port(tmp_path: Path) -> None:
    """A downstream port that reads all-ones has an unknown MPS: the GPUs of its root port
    keep theirs, and nothing under that root port is written."""
    root = tree("four-gpu-one-socket", tmp_path)
    all_ones(root, "0000:02:08.0")
    host = kernel(root)
    before = configs(root, UNDER_02 + GPUS_02)

    plan, _report = apply_profile(host, payload(mps=128, allow_mps_change=True))

    assert sorted(refused(plan)) == [f"{gpu} MPS" for gpu in GPUS_02]
    assert configs(root, UNDER_02 + GPUS_02) == before


def test_a_gpu_without_a_pcie_capability_is_noted_and_left_alone(tmp_path: Path) -> None:
    """A GPU in a conventional PCI slot has no Device Control register to tune: plan says so
    and plans nothing for it, without an error."""
    root = tree("h200-vm", tmp_path)
    path = config_file(root, "0000:00:06.0")
    raw = bytearray(path.read_bytes())
    express = express_at(bytes(raw))
    prev = next(p for p in (0x40, 0x48) if raw[p + 1] & 0xFC == express)
    raw[prev + 1] = raw[express + 1]  # the list skips the Express capability
    path.write_bytes(bytes(raw))

    plan = plan_profile(kernel(root), payload(mps=128, mrrs=512, allow_mps_change=True))

    assert plan.notes == ["pcie_payload: GPU 0000:00:06.0 has no PCIe capability"]
    assert refused(plan) == {} and plan.settings == []


def test_a_register_the_device_keeps_read_only_is_not_possible_here(tmp_path: Path) -> None:
    """Some devices hardwire MRRS: a write that does not stick is reported as a limit of the
    device, not as a failure of gputuned, and the rest is applied."""
    root = tree("degraded-link", tmp_path)
    host = kernel(root)
    gpu_config = "/" + str(config_file(root, "0000:01:00.0").relative_to(root))
    host.inject(gpu_config, "drop", 0)

    _plan, report = apply_profile(host, payload(mrrs=512))

    assert report.failed == []
    (why,) = report.not_possible.values()
    assert why["target"] == "0000:01:00.0 MRRS"
    assert why["reason"].startswith("the device keeps this register field read-only")


# -- revert trusts only Device Control payload fields ------------------------------------------


def test_revert_restores_a_port_whose_express_capability_is_the_first(tmp_path: Path) -> None:
    """Many root ports (Intel PCH ones among them) list the PCI Express capability first, at
    0x40, right after the header, so their Device Control sits at 0x48: revert must accept
    and restore that register."""
    root = tree("degraded-link", tmp_path)
    port = config_file(root, "0000:00:02.0")
    raw = bytearray(port.read_bytes())
    express = express_at(bytes(raw))
    raw[0x40 : 0x40 + 0x3C] = raw[express : express + 0x3C]
    raw[0x41] = 0xE0  # then the power management capability, as before
    raw[0x34] = 0x40
    port.write_bytes(bytes(raw))
    before = configs(root, ["0000:00:02.0", "0000:01:00.0"])

    apply_profile(kernel(root), payload(mps=128, allow_mps_change=True))
    assert devctl_at(root, "0000:00:02.0") == 0x48 and mps(devctl(root, "0000:00:02.0")) == 128

    assert revert_all(kernel(root)).failed == []
    assert configs(root, ["0000:00:02.0", "0000:01:00.0"]) == before


def _journal_lines(root: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (root / JOURNAL.lstrip("/")).read_text().splitlines()]


FORGED: dict[str, dict[str, Any]] = {
    "not config space": {"path": "/sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0/resource0"},
    "outside sysfs": {"path": "/etc/gputuned/config"},
    "the Command register": {"data": {"offset": 0x04}},
    "inside the header": {"data": {"offset": 0x46}},
    "an odd offset": {"data": {"offset": 0x69}},
    "extended config space": {"data": {"offset": 0x100}},
    "an offset as text": {"data": {"offset": "0x68"}},
    "a whole register": {"data": {"mask": 0xFFFF, "shift": 0}},
    "MRRS bits with MPS shift": {"data": {"mask": 0x7000, "shift": 5}},
    "MPS bits with MRRS shift": {"data": {"mask": 0x00E0, "shift": 12}},
    "reserved code 6": {"old": "6"},
    "reserved code 7": {"old": "7"},
    "a code past the field": {"old": "8"},
    "not a number": {"old": "1; reboot"},
}


@pytest.mark.parametrize("name", sorted(FORGED))
def test_revert_refuses_a_journal_entry_gputuned_never_writes(tmp_path: Path, name: str) -> None:
    """Revert writes journal entries as root, so an entry that names anything but an MPS or
    MRRS field of a Device Control register with a payload code is refused: nothing is
    written, the line is reported and kept for a person to see."""
    root = tree("degraded-link", tmp_path)
    apply_profile(kernel(root), payload(mrrs=512))
    (line,) = _journal_lines(root)
    entry = line["entry"]
    assert entry["data"]["offset"] == 0x68 and entry["old"] == "5"  # the real one, first
    forged = FORGED[name]
    entry.update({k: v for k, v in forged.items() if k != "data"})
    entry["data"].update(forged.get("data", {}))
    journal = root / JOURNAL.lstrip("/")
    journal.write_text(json.dumps(line) + "\n")
    text = journal.read_text()
    gpu = config_file(root, "0000:01:00.0").read_bytes()
    host = kernel(root)

    report = revert_all(host)

    assert host.writes == [] and config_file(root, "0000:01:00.0").read_bytes() == gpu
    assert [f["target"] for f in report.failed] == [f"{JOURNAL} line 1"]
    assert "refused, not restored" in report.failed[0]["error"]
    assert journal.read_text() == text


def test_revert_restores_the_largest_mrrs(tmp_path: Path) -> None:
    """The GPUs' MRRS of 4096 (code 5, the largest) is what revert puts back after a profile
    lowered it: the check on journal entries accepts every payload code."""
    root = tree("degraded-link", tmp_path)
    before = configs(root, ["0000:01:00.0"])
    apply_profile(kernel(root), payload(mrrs=128))
    assert mrrs(devctl(root, "0000:01:00.0")) == 128
    assert revert_all(kernel(root)).failed == []
    assert configs(root, ["0000:01:00.0"]) == before


# -- the table -------------------------------------------------------------------------------


def test_every_size_the_field_encodes_is_accepted_and_nothing_else(tmp_path: Path) -> None:
    """The user may write any size the 3-bit fields encode (128..4096 bytes) for either knob,
    and is told what is allowed when a value is not: 'max-safe' is for MPS only, booleans
    are named as TOML writes them, and a mistyped key is not silently ignored."""
    for size in SIZES:
        table = payload(mps=size, mrrs=size).pcie_payload
        assert table is not None and (table.mps, table.mrrs) == (size, size)
    sizes = "a size in bytes: 128, 256, 512, 1024, 2048 or 4096"
    cases = [
        ("mrrs", "max-safe", f"'max-safe' is not allowed; use 'keep' or {sizes}"),
        ("mps", False, f"false is not allowed; use 'keep', 'max-safe' or {sizes}"),
        ("mps", True, f"true is not allowed; use 'keep', 'max-safe' or {sizes}"),
        ("mrrs", 100, f"100 is not allowed; use 'keep' or {sizes}"),
    ]
    for key, value, message in cases:
        with pytest.raises(ProfileError) as exc:
            payload(**{key: value})
        assert exc.value.problems == [(f"pcie_payload.{key}", message)]
    with pytest.raises(ProfileError) as exc:
        payload(mrr=512)
    assert [key for key, _ in exc.value.problems] == ["pcie_payload.mrr"]


def test_a_loaded_table_cannot_be_changed_behind_validation() -> None:
    """The daemon plans again and again from the profile it loaded: its [pcie_payload] table
    is frozen (and hashable), so nothing changes a size after validation checked it."""
    table = payload(mps=256).pcie_payload
    assert table is not None
    with pytest.raises(ValueError, match="frozen"):
        table.mps = 4096  # type: ignore[misc]
    assert hash(table) == hash(payload(mps=256).pcie_payload)
