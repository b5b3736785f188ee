"""Fault matrix: one injected fault per row, every tuner; the host ends fully applied or fully reverted.

Each row copies a tree, plans the widest profile (every tuner writing, tests/unit/test_apply.py
``full_profile``), and then, after plan and before the first write, injects one fault: a
``FaultKernel.inject`` errno on one path, a write the kernel drops (``op="drop"``), or a change another
actor makes to the tree (a device or IRQ disappears, a process exits, a PID is reused, a
neighbour cgroup claims the CPUs); a few outside changes are made before plan instead, where
plan must see them. Then ``apply`` runs. The proof, by tree digest:

- **fully reverted**: apply raised ``ApplyError`` and the tree is byte-identical to the tree
  before apply (plus the outside change, made the same way on a second copy); any journal entry
  left (a "drop" record that could not be written) names a value already in place;
- **fully applied**: ``verify`` finds nothing drifted, every planned write is either done or
  reported (not possible here / skipped process), and ``revert`` then restores the tree exactly;
- **refused**: plan refused the profile (PlanError), the apply's Host made no write, and the tree
  is byte-identical to the tree before apply plus the outside change.

``test_fault_matrix`` prints the table that docs/dev/reliability.md quotes; the real-kernel rows are
in ``test_fault_matrix_real_kernel`` (root only).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.engine import apply as apply_mod
from gputuned.engine.apply import ApplyError, ApplyReport, apply_profile, read_state, revert_all
from gputuned.engine.plan import PlanResult, plan_profile
from gputuned.engine.verify import verify_plan
from gputuned.kernel.pci import ASPM_POLICY
from gputuned.profile.load import parse_profile
from gputuned.profile.model import Profile
from gputuned.settings.base import Op
from gputuned.settings.registry import expand
from gputuned.store.state import JOURNAL
from tests.fakeproc import add_process, remove_process
from tests.faults import FaultKernel, live_kernel, tree_kernel
from tests.reliability.conftest import (
    diff_keys,
    fingerprint,
    journal_only_names_values_in_place,
)
from tests.unit.test_apply import SERVER_PID, digest, full_profile, tree_copy

Outside = Callable[[Path], None]


@dataclass
class Ctx:
    """What a fault hook sees: the Host apply uses, its tree, and the plan just made."""

    host: FaultKernel
    root: Path
    plan: PlanResult

    def ops(self) -> list[Op]:
        return [op for ch in self.plan.changes if not ch.report_only for op in expand(ch)]

    def first(self, pred: Callable[[Op], bool]) -> Op:
        return next(op for op in self.ops() if pred(op))

    def inject(self, path: str, op: str, code: int) -> str:
        self.host.inject(path, op, code)
        name = errno.errorcode.get(code, "") if op != "drop" else "write dropped"
        return f"{op} {path}: {name}" if op != "drop" else f"{path}: {name}"


#: A hook injects the fault; it returns where, and the outside change (if any) so that the same
#: change can be made to the reference tree.
Hook = Callable[[Ctx], tuple[str, Outside | None]]


@dataclass(frozen=True)
class Case:
    tuner: str
    fault: str
    tree: str
    expect: str  # "applied" | "reverted" | "refused"
    hook: Hook
    #: Extra fixtures: "tmpfs" (a tiny tmpfs on the tree's /run/gputuned), "fsync" (EIO).
    needs: str = ""
    #: A known side effect outside gputuned's own writes: (files that differ, explanation).
    known: tuple[frozenset[str], str] | None = None
    #: The hook runs before apply's plan (given a plan of its own to read values from), so
    #: that plan sees the change: a state plan must refuse, not a race.
    before_plan: bool = False


@dataclass
class Row:
    case: Case
    where: str = ""
    said: str = ""
    end: str = ""
    proof: str = ""
    problems: list[str] = field(default_factory=list)


# -- hooks --------------------------------------------------------------------------------------


def on_path(
    pred: Callable[[Op], bool], op: str, code: int, *, attr: Callable[[Op], str] | None = None
) -> Hook:
    """Inject ``op``/``code`` on the path of the first planned op matching ``pred``."""

    def hook(c: Ctx) -> tuple[str, Outside | None]:
        target = c.first(pred)
        return c.inject(attr(target) if attr else target.path, op, code), None

    return hook


def is_aspm_policy(op: Op) -> bool:
    return op.path == ASPM_POLICY


def is_link(op: Op) -> bool:
    return "/link/" in op.path


def is_pcie(op: Op) -> bool:
    return op.kind == "pcie"


def is_gpu_irq(op: Op) -> bool:
    return op.path.startswith("/proc/irq/") and "nvidia" in op.target


def cg_file(name: str) -> Callable[[Op], bool]:
    return lambda op: op.path.endswith(f"/{name}")


def is_cgroup(op: Op) -> bool:
    return op.kind == "cgroup"


def thread_op(kind: str, n: int = 1) -> Callable[[Op], bool]:
    """The ``n``-th thread (by TID order) of the server for a ``kind`` op."""
    return lambda op: op.kind == kind and op.data.get("tid") == SERVER_PID + n


def thread_where(what: str) -> Callable[[Op], str]:
    return lambda op: f"/proc/{op.data['pid']}/task/{op.data['tid']}:{what}"


def procs_file(op: Op) -> str:
    return f"{op.data['mount']}{op.value}/cgroup.procs"


def remove_device(c: Ctx) -> tuple[str, Outside | None]:
    """The GPU disappears (hot unplug, or the driver's remove) after plan, before its write."""
    dev = c.host.resolve(c.first(is_pcie).path).rsplit("/", 1)[0]

    def outside(root: Path) -> None:
        shutil.rmtree(tree_kernel(root).path(dev))

    outside(c.root)
    return f"rm -r {dev}", outside


def remove_irq(c: Ctx) -> tuple[str, Outside | None]:
    irq_dir = c.first(is_gpu_irq).path.rsplit("/", 1)[0]

    def outside(root: Path) -> None:
        shutil.rmtree(tree_kernel(root).path(irq_dir))

    outside(c.root)
    return f"rm -r {irq_dir} (vector freed)", outside


def sibling_overlaps(c: Ctx) -> tuple[str, Outside | None]:
    """Another cgroup's cpuset.cpus overlap the partition's CPUs and one more, after plan: the
    exclusive claim is allowed (it leaves the neighbour a CPU), the partition is not."""
    part = parse_cpulist(c.first(cg_file("cpuset.cpus")).value)
    cpus = format_cpulist(part | {max(part) + 1})
    return _sibling_cpus(c, cpus)


def sibling_within(c: Ctx) -> tuple[str, Outside | None]:
    """Another cgroup's cpuset.cpus are the partition's CPUs, after plan: the kernel refuses
    the exclusive claim, which would leave it none."""
    return _sibling_cpus(c, c.first(cg_file("cpuset.cpus")).value)


def _sibling_cpus(c: Ctx, cpus: str) -> tuple[str, Outside | None]:
    mount = c.first(is_cgroup).path.rsplit("/", 1)[0]

    def outside(root: Path) -> None:
        h = tree_kernel(root)
        h.mkdir(f"{mount}/neighbour")
        h.write_text(f"{mount}/neighbour/cpuset.cpus", cpus)

    outside(c.root)
    return f"{mount}/neighbour: cpuset.cpus = {cpus}", outside


def sibling_partition(c: Ctx) -> tuple[str, Outside | None]:
    """Another cgroup is a partition holding the same CPUs exclusively (before plan: plan
    refuses the profile; after plan: the kernel refuses gputuned's exclusive claim)."""
    cpus = c.first(cg_file("cpuset.cpus")).value
    mount = c.first(is_cgroup).path.rsplit("/", 1)[0]

    def outside(root: Path) -> None:
        h = tree_kernel(root)
        h.mkdir(f"{mount}/neighbour")
        h.write_text(f"{mount}/neighbour/cpuset.cpus", cpus)
        h.write_text(f"{mount}/neighbour/cpuset.cpus.exclusive", cpus)
        h.write_text(f"{mount}/neighbour/cpuset.cpus.partition", "root")

    outside(c.root)
    return f"{mount}/neighbour: root partition of {cpus}", outside


def process_exits(c: Ctx) -> tuple[str, Outside | None]:
    def outside(root: Path) -> None:
        remove_process(root, SERVER_PID)

    outside(c.root)
    return f"/proc/{SERVER_PID} gone (exit)", outside


def pid_reused(c: Ctx) -> tuple[str, Outside | None]:
    def outside(root: Path) -> None:
        remove_process(root, SERVER_PID)
        add_process(
            root,
            SERVER_PID,
            comm="bash",
            cmdline=["/bin/bash"],
            exe="/usr/bin/bash",
            start_time=999999,
            cpus=(root / "sys/devices/system/cpu/online").read_text().strip(),
        )

    outside(c.root)
    return f"/proc/{SERVER_PID} now bash (start time 999999)", outside


def thread_exits(c: Ctx) -> tuple[str, Outside | None]:
    tid = SERVER_PID + 3

    def outside(root: Path) -> None:
        shutil.rmtree(root / f"proc/{SERVER_PID}/task/{tid}")

    outside(c.root)
    return f"/proc/{SERVER_PID}/task/{tid} gone", outside


def journal_full(c: Ctx) -> tuple[str, Outside | None]:
    return f"{JOURNAL}: tmpfs of 8 KiB (real ENOSPC)", None


def journal_fsync(c: Ctx) -> tuple[str, Outside | None]:
    return f"fsync({JOURNAL}) after the 5th append: EIO", None


E = errno
CASES: tuple[Case, ...] = (
    # PCIe ASPM (degraded-link: policy and per-link files writable)
    Case("pcie_aspm", "EPERM: firmware owns ASPM", "degraded-link", "applied",
         on_path(is_aspm_policy, "write", E.EPERM)),
    Case("pcie_aspm", "EIO on the policy", "degraded-link", "reverted",
         on_path(is_aspm_policy, "write", E.EIO)),
    Case("pcie_aspm", "EINVAL: policy unknown to the kernel", "degraded-link", "reverted",
         on_path(is_aspm_policy, "write", E.EINVAL)),
    Case("pcie_aspm", "EPERM on a link's l1_aspm", "degraded-link", "reverted",
         on_path(is_link, "write", E.EPERM)),
    Case("pcie_aspm", "ENOENT: link files gone", "degraded-link", "reverted",
         on_path(is_link, "write", E.ENOENT)),
    # PCIe payload
    Case("pcie_payload", "EIO on config space", "degraded-link", "reverted",
         on_path(is_pcie, "write", E.EIO)),
    Case("pcie_payload", "EBUSY on config space", "degraded-link", "reverted",
         on_path(is_pcie, "write", E.EBUSY)),
    Case("pcie_payload", "ENODEV: device removed", "degraded-link", "reverted",
         on_path(is_pcie, "write", E.ENODEV)),
    Case("pcie_payload", "EIO reading config space", "degraded-link", "reverted",
         on_path(is_pcie, "read", E.EIO)),
    Case("pcie_payload", "device's sysfs dir removed", "h200-captured", "reverted",
         remove_device),
    Case("pcie_payload", "read-back disagrees (field read-only)", "h200-captured", "applied",
         on_path(is_pcie, "drop", 0)),
    # cgroup v2 partition
    Case("cpuset", "EACCES on mkdir", "h200-captured", "reverted",
         on_path(is_cgroup, "mkdir", E.EACCES)),
    Case("cpuset", "ENOSPC on mkdir", "h200-captured", "reverted",
         on_path(is_cgroup, "mkdir", E.ENOSPC)),
    Case("cpuset", "EROFS: cgroupfs mounted read-only", "h200-captured", "reverted",
         on_path(is_cgroup, "mkdir", E.EROFS)),
    Case("cpuset", "EINVAL on cpuset.cpus", "h200-captured", "reverted",
         on_path(cg_file("cpuset.cpus"), "write", E.EINVAL)),
    Case("cpuset", "EBUSY on cpuset.cpus.exclusive", "h200-captured", "reverted",
         on_path(cg_file("cpuset.cpus.exclusive"), "write", E.EBUSY)),
    Case("cpuset", "EIO on cpuset.cpus.partition", "h200-captured", "reverted",
         on_path(cg_file("cpuset.cpus.partition"), "write", E.EIO)),
    Case("cpuset", "partition goes invalid: neighbour overlaps", "h200-captured", "reverted",
         sibling_overlaps),
    Case("cpuset", "neighbour's cpuset.cpus within the CPUs", "h200-captured", "reverted",
         sibling_within),
    Case("cpuset", "neighbour partition holds the CPUs", "h200-captured", "refused",
         sibling_partition, before_plan=True),
    Case("cpuset", "neighbour partition made between plan and apply", "h200-captured",
         "reverted", sibling_partition),
    Case("cpuset", "partition write dropped", "h200-captured", "reverted",
         on_path(cg_file("cpuset.cpus.partition"), "drop", 0)),
    # IRQ affinity
    Case("irq", "EIO: kernel-managed vector", "h200-captured", "applied",
         on_path(is_gpu_irq, "write", E.EIO)),
    Case("irq", "EPERM: unmovable vector", "h200-captured", "applied",
         on_path(is_gpu_irq, "write", E.EPERM)),
    Case("irq", "EBUSY on affinity", "h200-captured", "reverted",
         on_path(is_gpu_irq, "write", E.EBUSY)),
    Case("irq", "ENOSPC: no vector space on the CPU", "h200-captured", "reverted",
         on_path(is_gpu_irq, "write", E.ENOSPC)),
    Case("irq", "EINVAL on affinity", "h200-captured", "reverted",
         on_path(is_gpu_irq, "write", E.EINVAL)),
    Case("irq", "IRQ freed (driver unbound)", "h200-captured", "reverted", remove_irq),
    Case("irq", "write dropped (read-back disagrees)", "h200-captured", "reverted",
         on_path(is_gpu_irq, "drop", 0)),
    Case("irq", "EINVAL on default_smp_affinity", "h200-captured", "reverted",
         on_path(lambda op: op.path.endswith("default_smp_affinity"), "write", E.EINVAL)),
    Case("irq", "EIO reading affinity", "h200-captured", "reverted",
         on_path(is_gpu_irq, "read", E.EIO)),
    # processes
    Case("process", "process exits mid-placement", "h200-captured", "applied", process_exits),
    Case("process", "PID reused between plan and apply", "h200-captured", "applied", pid_reused),
    Case("process", "a thread exits mid-placement", "h200-captured", "applied", thread_exits),
    Case("process", "EPERM on nice", "h200-captured", "reverted",
         on_path(thread_op("nice", 2), "write", E.EPERM, attr=thread_where("nice"))),
    Case("process", "EPERM on sched policy (no RT budget)", "h200-captured", "applied",
         on_path(thread_op("policy", 2), "write", E.EPERM, attr=thread_where("scheduler"))),
    Case("process", "EINVAL on affinity", "h200-captured", "reverted",
         on_path(thread_op("affinity", 2), "write", E.EINVAL, attr=thread_where("affinity"))),
    Case("process", "ENOSPC moving into the partition", "h200-captured", "reverted",
         on_path(lambda op: op.kind == "proc_cgroup", "write", E.ENOSPC, attr=procs_file)),
    Case("process", "EBUSY moving into the partition", "h200-captured", "reverted",
         on_path(lambda op: op.kind == "proc_cgroup", "write", E.EBUSY, attr=procs_file)),
    Case("process", "EIO reading /proc/PID/stat", "h200-captured", "reverted",
         on_path(thread_op("nice", 0), "read", E.EIO, attr=lambda op: f"/proc/{op.data['pid']}/stat")),
    # the journal
    Case("journal", "ENOSPC: /run full", "h200-captured", "reverted", journal_full, "tmpfs"),
    Case("journal", "EIO from fsync", "h200-captured", "reverted", journal_fsync, "fsync"),
)  # fmt: skip


# -- running one row ----------------------------------------------------------------------------


@contextlib.contextmanager
def fault_after_plan(
    host: FaultKernel,
    root: Path,
    hook: Hook,
    got: list[tuple[str, Outside | None]],
    *,
    before: bool = False,
) -> Iterator[None]:
    """Run ``hook`` right after apply's plan of ``host`` (before its first write), or with
    ``before``, right before that plan (the hook reads values from a plan of its own)."""
    real = apply_mod.plan_profile  # type: ignore[attr-defined]

    def planned(h: FaultKernel, profile: Profile, **kw: object) -> PlanResult:
        if before and h is host and not got:
            got.append(hook(Ctx(host, root, real(tree_kernel(root), profile, **kw))))  # type: ignore[arg-type]
        plan = real(h, profile, **kw)  # type: ignore[arg-type]
        if h is host and not got:
            got.append(hook(Ctx(host, root, plan)))
        return plan

    setattr(apply_mod, "plan_profile", planned)  # noqa: B010
    try:
        yield
    finally:
        setattr(apply_mod, "plan_profile", real)  # noqa: B010


def can_mount_tmpfs(where: Path) -> bool:
    if os.geteuid() != 0:
        return False
    where.mkdir(parents=True)
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8k", "gputuned-test", str(where)],
        check=False,
        capture_output=True,
    ).returncode:
        return False
    subprocess.run(["umount", str(where)], check=True)
    return True


@contextlib.contextmanager
def journal_on_tmpfs(root: Path) -> Iterator[None]:
    run = root / "run/gputuned"
    run.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8k,mode=0700", "gputuned-test", str(run)], check=True
    )
    try:
        yield
    finally:
        subprocess.run(["umount", str(run)], check=True)


@contextlib.contextmanager
def fsync_fails_after(n: int) -> Iterator[None]:
    real = os.fsync
    calls = [0]

    def fsync(fd: int) -> None:
        calls[0] += 1
        if calls[0] > n:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    setattr(os, "fsync", fsync)  # noqa: B010
    try:
        yield
    finally:
        setattr(os, "fsync", real)  # noqa: B010


def run_case(case: Case, work: Path, profile: Profile) -> Row:
    row = Row(case)
    root = tree_copy(case.tree, work / "tree")
    before = digest(root)
    host = tree_kernel(root)
    got: list[tuple[str, Outside | None]] = []
    with contextlib.ExitStack() as stack:
        if case.needs == "tmpfs":
            stack.enter_context(journal_on_tmpfs(root))
        if case.needs == "fsync":
            stack.enter_context(fsync_fails_after(5))
        stack.enter_context(fault_after_plan(host, root, case.hook, got, before=case.before_plan))
        report: ApplyReport | None = None
        try:
            plan, report = apply_profile(host, profile)
        except ApplyError as exc:
            row.end = "fully reverted"
            row.said = str(exc).split("\n")[0].removeprefix(f"apply {profile.name}: ")
            left_over = journal_only_names_values_in_place(root)
        except errors.PlanError as exc:
            row.end = "refused, nothing written"
            row.said = "plan refused: " + " ".join(str(exc).split("\n")[1:]).strip()
            left_over = journal_only_names_values_in_place(root)
            if host.writes:
                row.problems.append(f"{len(host.writes)} write(s) after a refused plan")
        row.where, outside = got[0] if got else ("(hook never ran)", None)
        base = before
        if outside is not None:
            ref = tree_copy(case.tree, work / "ref")
            outside(ref)
            base = digest(ref)
        if report is None:
            after = digest(root)
            differ = set(diff_keys(base, after))
            if case.known is not None:
                if differ != case.known[0]:
                    row.problems.append(f"known side effect changed: {sorted(differ)}")
                row.end += f"; {case.known[1]}"
            elif differ:
                row.problems.append(f"not byte-exact after rollback: {sorted(differ)[:5]}")
            if left_over:
                row.problems.append(f"journal names values not in place: {left_over}")
            said = "before" if outside is None else "before + outside change"
            row.proof = (
                f"after = {said} = {fingerprint(after)}"
                if not differ
                else f"after {fingerprint(after)} != {said} {fingerprint(base)} in {len(differ)} files"
            )
            if row.end.startswith("refused"):
                row.proof += f"; apply's writes: {len(host.writes)}"
        else:
            row.end = "fully applied"
            row.said = said_for(report)
            row.proof = prove_applied(root, profile, plan, report, base, row.problems)
    expected = {
        "applied": "fully applied",
        "reverted": "fully reverted",
        "refused": "refused, nothing written",
    }[case.expect]
    if not row.end.startswith(expected):
        row.problems.append(f"expected {case.expect}, got {row.end}")
    return row


def said_for(report: ApplyReport) -> str:
    """Skipped processes first (a process fault), then what was not possible here."""
    parts = [f"skipped {s['target']}: {s['reason']}" for s in report.skipped[:1]]
    if len(report.skipped) > 1:
        parts.append(f"(+{len(report.skipped) - 1} more skipped)")
    parts += [f"not possible here: {v['reason']}" for v in report.not_possible.values()]
    return "; ".join(parts) or "nothing to report"


def prove_applied(
    root: Path,
    profile: Profile,
    plan: PlanResult,
    report: ApplyReport,
    base: dict[str, str],
    problems: list[str],
) -> str:
    """Everything applied is in place, everything else is reported, and revert is exact."""
    ver = verify_plan(plan_profile(tree_kernel(root), profile), read_state(tree_kernel(root)))
    if ver.count("drifted"):
        problems.append(f"verify: {[ln.target for ln in ver.lines if ln.status == 'drifted']}")
    done = {w["target"] for w in report.written} | {s["target"] for s in report.skipped}
    for ch in plan.changes:
        if ch.report_only or ch.key in report.not_possible:
            continue
        missing = [op.target for op in expand(ch) if op.target not in done]
        if missing:
            problems.append(f"planned but neither written nor reported: {missing}")
    applied = fingerprint(digest(root))
    rev = revert_all(tree_kernel(root))
    after = digest(root)
    if rev.failed or after != base:
        problems.append(f"revert not exact: {rev.failed} {diff_keys(base, after)[:5]}")
    return f"verify: 0 drifted; applied {applied}; after revert = reference = {fingerprint(after)}"


def table(rows: list[Row], title: str) -> list[str]:
    out = [title, "", "| # | tuner | fault | where injected | what gputuned reported | end state | proof |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for i, r in enumerate(rows, 1):
        said = r.said if len(r.said) <= 160 else r.said[:157] + "..."
        cells = [
            str(i),
            r.case.tuner,
            r.case.fault,
            f"`{r.where}`",
            said.replace("|", "/"),
            r.end,
            r.proof,
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def test_fault_matrix(tmp_path: Path, terminal: list[str]) -> None:
    profile = full_profile()
    rows = []
    tmpfs = can_mount_tmpfs(tmp_path / "probe")
    for i, case in enumerate(CASES):
        if case.needs == "tmpfs" and not tmpfs:
            continue  # mounting a tmpfs needs root (CI runs as root) and CAP_SYS_ADMIN
        rows.append(run_case(case, tmp_path / f"case{i}", profile))
    terminal += table(rows, f"fault matrix (trees): {len(rows)} faults")
    applied = sum(r.end == "fully applied" for r in rows)
    refused = sum(r.end.startswith("refused") for r in rows)
    known = sum(r.case.known is not None for r in rows)
    terminal.append(
        f"faults: {len(rows)} injected, {applied} fully applied, "
        f"{len(rows) - applied - refused} fully reverted, {refused} refused before any write "
        f"({known} with a known side effect outside gputuned's writes), "
        f"{sum(bool(r.problems) for r in rows)} half"
    )
    assert len({(c.tuner, c.fault) for c in CASES}) == len(CASES), "every row is a distinct fault"
    assert len(rows) >= 30
    bad = [(r.case.fault, r.problems) for r in rows if r.problems]
    assert not bad, bad


# -- the real kernel ---------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys, threading, time
    stop = threading.Event()
    def quitter():  # exits when told through stdin
        sys.stdin.readline()
    threading.Thread(target=quitter).start()
    for _ in range(2):
        threading.Thread(target=time.sleep, args=(300,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(300)
    """
)


@dataclass
class Child:
    proc: subprocess.Popen[str]
    token: str

    @property
    def pid(self) -> int:
        return self.proc.pid


@contextlib.contextmanager
def child_process(token: str) -> Iterator[Child]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, token],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    try:
        yield Child(proc, token)
    finally:
        proc.kill()
        proc.wait()


def live_state(pids: list[int]) -> dict[str, str]:
    out = {}
    for irq in sorted(os.listdir("/proc/irq")):
        p = Path("/proc/irq") / irq / "smp_affinity_list"
        if p.exists():
            out[str(p)] = p.read_text()
    out["default"] = Path("/proc/irq/default_smp_affinity").read_text()
    for pid in pids:
        for tid in sorted(os.listdir(f"/proc/{pid}/task")) if os.path.isdir(f"/proc/{pid}") else []:
            with contextlib.suppress(ProcessLookupError):
                out[f"thread {tid}"] = (
                    f"{os.getpriority(os.PRIO_PROCESS, int(tid))} "
                    f"{sorted(os.sched_getaffinity(int(tid)))}"
                )
    return out


def live_profile(token: str) -> Profile:
    return parse_profile(
        {
            "name": "rk",
            "cpusets": {"housekeeping": {"cpus": "0"}, "work": {"cpus": "1"}},
            "irq": {"others_cpus": "housekeeping", "default_affinity": "housekeeping"},
            "process": [
                {"name": "child", "match": {"cmdline": token, "uid": 0}, "cpus": "work", "nice": 5}
            ],
        },
        "rk",
    )


def refusing_irq() -> str | None:
    """An IRQ of this machine whose affinity the kernel will not change (probed with its own value)."""
    for irq in sorted(os.listdir("/proc/irq")):
        p = Path("/proc/irq") / irq / "smp_affinity_list"
        if not p.exists():
            continue
        try:
            p.write_text(p.read_text())
        except OSError:
            return str(p)
    return None


@pytest.mark.integration
@pytest.mark.usefixtures("as_root")
def test_fault_matrix_real_kernel(tmp_path: Path, terminal: list[str]) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs")
    if Path(JOURNAL).exists():
        pytest.skip(f"{JOURNAL} exists: something else is applied on this host")
    rows: list[Row] = []

    def live_row(
        fault: str, tuner: str, hook: Hook, expect: str, pids: Callable[[], list[int]], token: str
    ) -> Row:
        case = Case(tuner, fault, "this machine", expect, hook)
        row = Row(case)
        host = live_kernel()
        before = live_state(pids())
        got: list[tuple[str, Outside | None]] = []
        profile = live_profile(token)
        try:
            with fault_after_plan(host, Path("/"), hook, got):
                _plan, report = apply_profile(host, profile)
            row.end = "fully applied"
            row.said = said_for(report)
            ver = verify_plan(plan_profile(live_kernel(), profile), read_state(live_kernel()))
            if ver.count("drifted"):
                row.problems.append(
                    f"drifted: {[ln.target for ln in ver.lines if ln.status == 'drifted']}"
                )
        except ApplyError as exc:
            row.end = "fully reverted"
            row.said = str(exc).split("\n")[0]
        finally:
            rev = revert_all(live_kernel())
        row.where = got[0][0] if got else "(hook never ran)"
        after = live_state(pids())
        # Threads and processes that exited are gone from "after"; everything else is compared.
        if (
            rev.failed
            or after != {k: v for k, v in before.items() if k in after}
            or after.keys() - before.keys()
        ):
            row.problems.append(f"not exact: {rev.failed} {diff_keys(before, after)[:5]}")
        row.proof = f"live state after revert = before ({fingerprint(after)})"
        if row.end != {"applied": "fully applied", "reverted": "fully reverted"}[expect]:
            row.problems.append(f"expected {expect}, got {row.end}")
        return row

    # 1. An IRQ this kernel refuses to move (or, where none does, EIO injected on a real one).
    refused = refusing_irq()
    with child_process(f"gputuned-rk-{os.getpid()}-a") as ch:

        def irq_hook(c: Ctx) -> tuple[str, Outside | None]:
            if refused is not None:
                return f"{refused}: refused by this kernel", None
            target = c.first(
                lambda op: op.path.startswith("/proc/irq/") and "default" not in op.path
            )
            return c.inject(target.path, "write", errno.EIO), None

        rows.append(
            live_row("an IRQ that refuses", "irq", irq_hook, "applied", lambda: [ch.pid], ch.token)
        )

    # 2. The matched process exits between plan and apply.
    with child_process(f"gputuned-rk-{os.getpid()}-b") as ch:

        def exit_hook(c: Ctx) -> tuple[str, Outside | None]:
            ch.proc.kill()
            ch.proc.wait()
            return f"SIGKILL pid {ch.pid} after plan", None

        rows.append(
            live_row(
                "process exits mid-placement", "process", exit_hook, "applied", lambda: [], ch.token
            )
        )

    # 3. One thread of the matched process exits between plan and apply.
    with child_process(f"gputuned-rk-{os.getpid()}-c") as ch:
        tids_before = sorted(os.listdir(f"/proc/{ch.pid}/task"))

        def thread_hook(c: Ctx) -> tuple[str, Outside | None]:
            assert ch.proc.stdin is not None
            ch.proc.stdin.write("quit\n")
            ch.proc.stdin.flush()
            deadline = time.monotonic() + 10
            while len(os.listdir(f"/proc/{ch.pid}/task")) == len(tids_before):
                assert time.monotonic() < deadline, "the thread did not exit"
                time.sleep(0.01)
            gone = sorted(set(tids_before) - set(os.listdir(f"/proc/{ch.pid}/task")))
            return f"thread {gone[0]} of pid {ch.pid} exited after plan", None

        rows.append(
            live_row(
                "a thread exits mid-placement",
                "process",
                thread_hook,
                "applied",
                lambda: [ch.pid],
                ch.token,
            )
        )

    terminal += table(rows, f"fault matrix (real kernel, {os.uname().release}): {len(rows)} faults")
    bad = [(r.case.fault, r.problems) for r in rows if r.problems]
    assert not bad, bad
