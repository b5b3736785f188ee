"""Plans the `[neighbours]` table (its keys and manual: gputuned/profile/tables/neighbours.py):
the CPU weight and cap of every cgroup and unit that is not the server's, after the other
tuners (their settings say which cgroups are the server's)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from gputuned import errors
from gputuned.changes import Change, Refusal, TunerPlan
from gputuned.kernel import Kernel, units
from gputuned.profile.tables.neighbours import Config
from gputuned.settings.registry import of_change
from gputuned.tuners.context import PlanContext

#: cpu.max's period: the kernel's default (100 ms), kept as it is.
PERIOD_US = 100_000
#: A cgroup's interface files (cgroup.procs, cpu.max, memory.high, ...): not stat'ed one by one
#: while looking for child cgroups (a systemd slice holds dozens of them per child).
_INTERFACE_FILE = re.compile(
    r"(?!.*\.(slice|service|scope)$)"  # a unit's cgroup (cpu.slice) is looked at
    r"(cgroup|cpu|cpuset|memory|io|pids|hugetlb|rdma|misc|dmem|irq)\.[a-z_.]+"
)
#: A user's own service manager: the units below it are the user's (systemd.special(7)).
_USER_MANAGER = re.compile(r"user@\d+\.service")
#: gputuned's own unit: the daemon is never capped. Its cgroup where systemd puts a system
#: service without Slice= (systemd.special(7): system.slice).
OWN_UNIT = "gputuned.service"
OWN_UNIT_CGROUP = f"system.slice/{OWN_UNIT}"


class NeighboursTuner:
    """The `[neighbours]` table's tuner: planned after the others, whose settings say which
    processes are the server's."""

    name = "neighbours"

    def plan(self, ctx: PlanContext, planned: Sequence[Change] = ()) -> TunerPlan:
        return plan_neighbours(ctx, planned)


def plan_neighbours(ctx: PlanContext, settings: Sequence[Change]) -> TunerPlan:
    """The neighbours' cgroups and their cpu.weight / cpu.max (or unit properties), given every
    other tuner's ``settings`` (which processes are the server's, where they go)."""
    cfg = ctx.profile.neighbours
    tp = TunerPlan()
    if cfg is None:
        return tp
    layout = ctx.cgroup
    if layout.mode != "v2" or layout.v2_mount is None or "cpu" not in layout.v2_controllers:
        tp.refused.append(Refusal("neighbours", "*", why_no_cpu(layout.mode)))
        return tp
    quota = _quota(ctx, cfg, tp)
    if quota is None and cfg.weight is None:
        return tp
    mount = layout.v2_mount
    protected = _protected(ctx, settings, cfg)
    walk = _Walk(ctx, mount, protected)
    walk.visit("")
    tp.notes += walk.notes
    tp.refused += walk.refused
    tp.changes += walk.controllers
    for rel in walk.neighbours:
        unit = system_unit(ctx.kernel, rel)
        if unit is not None:
            tp.changes += _unit_changes(ctx, cfg, rel, unit, quota, mount)
        else:
            tp.changes += _file_changes(ctx, cfg, rel, quota, mount)
    what = ", ".join(walk.neighbours) if walk.neighbours else "none"
    tp.notes.append(f"neighbours: {len(walk.neighbours)} cgroup(s) weighted or capped: {what}")
    if cfg.report_only:
        tp.changes = [_report_only(c) for c in tp.changes]
    return tp


def why_no_cpu(mode: str) -> str:
    if mode in ("v1", "hybrid"):
        return (
            f"cgroup {mode} host: the cpu controller is on cgroup v1; [neighbours] needs "
            "cgroup v2 (boot with systemd.unified_cgroup_hierarchy=1)"
        )
    if mode == "v2":
        return (
            "the cpu controller is not in the cgroup v2 root's cgroup.controllers (a kernel "
            "without CONFIG_CGROUP_SCHED, or cpu bound to a v1 hierarchy): nothing to weight "
            "or cap with"
        )
    return "no cgroup filesystem mounted: nothing to weight or cap with"


def _quota(ctx: PlanContext, cfg: Config, tp: TunerPlan) -> int | None:
    """cpu.max's quota in microseconds per period, None without a cap."""
    cap = cfg.cap_cpus
    if cap is None:
        return None
    if isinstance(cap, str):
        cpus = ctx.sets.sets.get(cap)
        if not cpus:
            tp.refused.append(
                Refusal("neighbours", "cap_cpus", f"set {cap!r} has no CPUs on this host")
            )
            return None
        cap = len(cpus)
    return max(1000, round(float(cap) * PERIOD_US))


def _protected(ctx: PlanContext, settings: Sequence[Change], cfg: Config) -> set[str]:
    """cgroups (paths under the mount, no leading '/') never weighted or capped."""
    mount = ctx.cgroup.v2_mount or ""
    out = {k.strip("/") for k in cfg.keep}
    if ctx.profile.cpuset is not None:
        out.add(ctx.profile.cpuset.cgroup.strip("/"))
    moved: set[int] = set()
    placed: set[int] = set()
    for ch in settings:
        if ch.kind == "cgroup" and ch.path.startswith(mount + "/"):
            out.add(ch.path[len(mount) + 1 :])
        elif ch.kind == "proc_cgroup":
            out.add(ch.wanted.strip("/"))
            moved.add(int(ch.data.get("pid", 0)))
        elif of_change(ch).placement and isinstance(ch.data.get("pid"), int):
            placed.add(int(ch.data["pid"]))
    for pid in sorted(placed - moved):
        try:
            line = ctx.kernel.read_text(f"/proc/{pid}/cgroup")
        except errors.HostError:
            continue  # gone since the plan read it
        for entry in line.splitlines():
            if entry.startswith("0::"):
                out.add(entry[3:].strip("/"))
    if ctx.kernel.is_dir(f"{mount}/{OWN_UNIT_CGROUP}"):
        out.add(OWN_UNIT_CGROUP)  # the daemon: system.slice is walked through, not capped
    # PID 1 (systemd's init.scope): it starts every login and unit; capping it buys nothing.
    out.add("init.scope")
    out.discard("")
    return out


class _Walk:
    """From the root down: children that hold nothing protected are neighbours; a child on
    the way to a protected cgroup is walked through instead."""

    def __init__(self, ctx: PlanContext, mount: str, protected: set[str]) -> None:
        self.ctx, self.mount, self.protected = ctx, mount, protected
        self.kernel = ctx.kernel
        self.neighbours: list[str] = []
        self.notes: list[str] = []
        self.refused: list[Refusal] = []
        self.controllers: list[Change] = []
        self.kthreads = {p.pid for p in ctx.processes if p.kernel_thread}

    def visit(self, rel: str) -> None:
        base = f"{self.mount}/{rel}" if rel else self.mount
        try:
            names = self.kernel.listdir(base)
        except errors.HostError:
            return  # removed while we looked
        kids: list[str] = []
        through: list[str] = []
        for name in names:
            child = f"{rel}/{name}" if rel else name
            if _INTERFACE_FILE.fullmatch(name) or not self.kernel.is_dir(f"{self.mount}/{child}"):
                continue
            if child in self.protected or name == OWN_UNIT:
                continue
            if any(p.startswith(child + "/") for p in self.protected):
                through.append(child)
            else:
                kids.append(child)
        self._own_processes(rel, base)
        if kids and self._controller(rel, base, kids):
            self.neighbours += kids
        for child in through:
            self.visit(child)

    def _own_processes(self, rel: str, base: str) -> None:
        pids = [int(p) for p in (self.kernel.read_optional(f"{base}/cgroup.procs") or "").split()]
        if not pids:
            return
        if not rel:
            k = sum(1 for p in pids if p in self.kthreads)
            self.notes.append(
                f"neighbours: {len(pids)} process(es) run in the root cgroup itself ({k} of "
                "them kernel threads): cgroup v2 cannot weight or cap the root cgroup, so "
                "[neighbours] leaves them alone; start such work in a cgroup of its own "
                "(systemd-run, a slice) to cap it"
            )
        else:
            self.notes.append(
                f"neighbours: {len(pids)} process(es) run in /{rel} itself, which holds the "
                "server or gputuned further down: they are not capped (capping /"
                f"{rel} would cap the server too)"
            )

    def _controller(self, rel: str, base: str, kids: list[str]) -> bool:
        """The cpu controller for ``base``'s children: on, or planned on; False when it cannot
        be, with a refusal."""
        sub = (self.kernel.read_optional(f"{base}/cgroup.subtree_control") or "").split()
        if "cpu" in sub:
            return True
        where = f"/{rel}" if rel else "the root cgroup"
        if all(system_unit(self.kernel, k) for k in kids):
            self.notes.append(
                f"neighbours: the cpu controller is not enabled in {where} "
                "(cgroup.subtree_control); systemd enables it when it sets the first "
                "CPUQuota=/CPUWeight=, and its children then share CPU time by cpu.weight "
                "(100 each unless set) instead of thread by thread"
            )
            return True
        if rel and (self.kernel.read_optional(f"{base}/cgroup.procs") or "").split():
            for k in kids:
                self.refused.append(
                    Refusal(
                        "neighbours",
                        f"/{k}",
                        f"the cpu controller is not enabled in {where} and {where} has "
                        "processes of its own, so it cannot be (cgroup v2's no internal "
                        f"processes rule): /{k} is not weighted or capped; add /{rel} to "
                        "keep, or move those processes into a child cgroup",
                    )
                )
            return False
        self.notes.append(
            f"neighbours: the cpu controller is not enabled in {where} (cgroup.subtree_control):"
            " apply enables it (+cpu), and its children then share CPU time by cpu.weight "
            "(100 each unless set) instead of thread by thread; revert disables it again"
        )
        self.controllers.append(
            Change(
                "neighbours",
                f"{where} cpu controller",
                "off",
                "+cpu",
                "the children's cpu.weight and cpu.max exist only with it",
                path=f"{base}/cgroup.subtree_control",
                # Not the default key: [cpuset] may enable cpuset in the same file.
                key=f"controller:{base}/cgroup.subtree_control:cpu",
                kind="controller",
                data={"controller": "cpu"},
            )
        )
        return True


def system_unit(kernel: Kernel, rel: str) -> str | None:
    """The system manager's unit whose cgroup ``rel`` is, or None: no systemd as PID 1, a
    cgroup no unit makes, or one inside a user's own manager (``user@1000.service``: its units
    are the user manager's, and ``systemctl set-property`` would name a system unit of the same
    name instead)."""
    if not kernel.systemd or any(_USER_MANAGER.fullmatch(p) for p in rel.split("/")[:-1]):
        return None
    return units.unit_of(rel)


def _file_changes(
    ctx: PlanContext, cfg: Config, rel: str, quota: int | None, mount: str
) -> list[Change]:
    out = []
    wanted = {}
    if quota is not None:
        wanted["cpu.max"] = (f"{quota} {PERIOD_US}", f"capped at {quota / PERIOD_US:g} CPU(s)")
    if cfg.weight is not None:
        wanted["cpu.weight"] = (str(cfg.weight), f"weight {cfg.weight} (default 100)")
    for name, (value, why) in wanted.items():
        path = f"{mount}/{rel}/{name}"
        now = ctx.kernel.read_optional(path)
        out.append(
            Change(
                "neighbours",
                f"/{rel} {name}",
                now if now is not None else "(cpu controller off)",
                value,
                f"a neighbour of the server: {why}",
                path=path,
                kind="cgroup_cpu",
            )
        )
    return out


def _unit_changes(
    ctx: PlanContext, cfg: Config, rel: str, unit: str, quota: int | None, mount: str
) -> list[Change]:
    out = []
    wanted = {}
    if quota is not None:
        wanted["CPUQuota"] = units.cpu_quota(quota / PERIOD_US)
    if cfg.weight is not None:
        wanted["CPUWeight"] = str(cfg.weight)
    for prop, value in wanted.items():
        # Read from the cgroup file systemd writes: no systemctl per unit in every plan.
        text = ctx.kernel.read_optional(f"{mount}/{rel}/{units.CGROUP_FILE[prop]}")
        out.append(
            Change(
                "neighbours",
                f"{unit} {prop}",
                units.file_form(prop, text),
                value,
                "a neighbour of the server, through systemd so that its view agrees",
                path=unit,
                key=f"unit_cpu:{unit}:{prop}",
                kind="unit_cpu",
                data={"property": prop, "cgroup": f"{mount}/{rel}"},
            )
        )
    return out


def _report_only(ch: Change) -> Change:
    return replace(ch, report_only=True, why=f"{ch.why} (report only: not applied)")


def capped_servers(kernel: Kernel, applied: list[Change], placed: list[Change]) -> list[int]:
    """Processes of ``placed`` (a placement's settings) that run in, or below, a cgroup that
    ``applied`` (the settings in force) weights or caps as a neighbour: a server that started
    after the neighbours were planned, in a cgroup they took for another's. The daemon plans
    again in full when there is one (the server's cgroup is then left alone)."""
    capped = {_cgroup_of_change(c) for c in applied if c.tuner == "neighbours"} - {None}
    if not capped:
        return []
    moved = {int(c.data.get("pid", 0)) for c in placed if c.kind == "proc_cgroup"}
    out = []
    for pid in sorted({int(c.data["pid"]) for c in placed if isinstance(c.data.get("pid"), int)}):
        if pid in moved:
            continue  # into gputuned's own cgroup
        try:
            line = kernel.read_text(f"/proc/{pid}/cgroup")
        except errors.HostError:
            continue
        for entry in line.splitlines():
            if entry.startswith("0::"):
                path = entry[3:].rstrip("/")
                if any(path == c or path.startswith(c + "/") for c in capped if c):
                    out.append(pid)
    return out


def _cgroup_of_change(ch: Change) -> str | None:
    """The cgroup (as /proc/PID/cgroup names it, from the mount) a neighbour change is on."""
    if ch.kind == "cgroup_cpu":
        host_path = ch.path.rsplit("/", 1)[0]
    elif ch.kind == "unit_cpu":
        host_path = str(ch.data.get("cgroup", ""))
    else:
        return None
    m = re.match(r"/sys/fs/cgroup(/.*)", host_path)
    return m.group(1) if m else None
