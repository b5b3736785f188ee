"""Human-readable output (rich tables) for inspect and plan. JSON output bypasses this.

rich is loaded where a table or a terminal needs it; status, verify and list print lines of
markup through :class:`gputuned.cli.markup.Lines`, which loads it only for a terminal (issue 31).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gputuned.changes import labelled
from gputuned.cli import markup
from gputuned.cli.markup import Lines, escape
from gputuned.textsafe import printable

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from gputuned.engine.apply import ApplyReport, RevertReport
    from gputuned.engine.plan import PlanResult
    from gputuned.engine.verify import Line, VerifyReport


def console(*, stderr: bool = False) -> Console:
    """gputunectl's rich console (made in gputuned/cli/markup.py)."""
    return markup.console(stderr=stderr)


def shown(value: object) -> str:
    """A value for rich markup: non-printable characters escaped (process names and command
    lines are other users' text: textsafe), then markup escaped."""
    return escape(printable(str(value), newlines=True))


def _gts(v: float | None) -> str:
    return "-" if v is None else f"{v:g} GT/s"


def _link(d: dict[str, Any]) -> str:
    link = d.get("link")
    if not link:
        return "-"
    return (
        f"{_gts(link['speed_gts'])} x{link['width']} "
        f"of {_gts(link['cap_speed_gts'])} x{link['cap_width']}"
    )


def _known(value: object) -> str:
    """A decoded value, or '?' where the register could not be read (a finding says why)."""
    return "?" if value is None else str(value)


def render_inspect(data: dict[str, Any], *, all_functions: bool) -> None:
    from rich.table import Table

    out = console()
    pol = data["aspm_policy"]
    writable = {True: "writable", False: "not writable", None: "writability unknown"}[
        pol["writable"]
    ]
    out.print(
        f"ASPM policy: [bold]{shown(str(pol['value']))}[/] ({writable}: {shown(pol['reason'])})"
    )
    if not data["devices"]:
        what = "PCIe functions" if all_functions else "GPUs"
        out.print(f"No {what} found on this host" + ("" if all_functions else " (try --all)") + ".")
        return
    table = Table(title="PCIe functions" if all_functions else "GPUs", show_lines=True)
    for col in (
        "BDF",
        "device",
        "NUMA / CPUs",
        "link",
        "MPS (cur/sup/path)",
        "MRRS",
        "ASPM",
        "IRQs",
        "path",
    ):
        table.add_column(col)
    for d in data["devices"]:
        mps = d["mps"]
        aspm = d["aspm"]
        irqs = ", ".join(f"{i['irq']}→{i['affinity']}" for i in d["irqs"]) or "-"
        name = d["name"] or f"{d['vendor']}:{d['device']}"
        table.add_row(
            d["bdf"],
            shown(f"{name}\n{d['port_type'] or ''}"),
            f"{d['numa_node'] if d['numa_node'] is not None else '-'} / {d['local_cpus'] or '-'}",
            _link(d),
            "/".join(_known(mps[k]) for k in ("current", "supported", "path_max")) if mps else "-",
            _known(d["mrrs"]) if mps else "-",
            (
                f"sup {'+'.join(aspm['supported']) or 'none'}\n"
                f"on {'+'.join(aspm['enabled']) or 'none'}"
                if aspm
                else "-"
            ),
            irqs,
            " → ".join(d["path"]),
        )
    out.print(table)
    for d in data["devices"]:
        for f in d["findings"]:
            style = "bold red" if f["level"] == "fault" else "yellow"
            out.print(f"[{style}]{f['level']}[/] {d['bdf']}: {shown(f['message'])}")
    if "topology" in data:
        render_topology(data["topology"])


def render_topology(topo: dict[str, Any]) -> None:
    """inspect's topology section: NUMA nodes, SMT, and per GPU its node and local CPUs."""
    from rich.table import Table

    out = console()
    out.print(f"CPUs {topo['online']}: {shown(topo['smt'])}")
    nodes = Table(title="NUMA nodes", show_lines=False)
    for col in ("node", "CPUs", "cores", "GPUs"):
        nodes.add_column(col)
    for n in topo["nodes"]:
        nodes.add_row(str(n["node"]), n["cpus"], n["cores"], ", ".join(map(str, n["gpus"])) or "-")
    out.print(nodes)
    if not topo["gpus"]:
        return
    gpus = Table(title="GPU placement", show_lines=False)
    nvml = "NVML CPU affinity" if topo["nvml"] else "NVML CPU affinity (no NVML)"
    for col in ("GPU", "BDF", "node", "local CPUs (sysfs)", "cores", nvml):
        gpus.add_column(col, overflow="fold")
    for g in topo["gpus"]:
        node = g["node"] if g["node"] is not None else "- (local CPUs span nodes)"
        if g["node"] is None and g["numa_node"] is None:
            node = "- (sysfs numa_node -1)"
        gpus.add_row(
            str(g["index"]),
            g["bdf"],
            str(node),
            g["local_cpus"] or "-",
            g["local_cores"] or "-",
            g["nvml_cpu_affinity"] or "-",
        )
    out.print(gpus)
    for g in topo["gpus"]:
        for f in g["findings"]:
            style = "yellow" if f["level"] == "warning" else "cyan"
            out.print(
                f"[{style}]{f['level']}[/] GPU {g['index']} {g['bdf']}: {shown(f['message'])}"
            )


def render_layout(layout: dict[str, Any]) -> None:
    """plan's CPU layout: the resolved sets per GPU and per NUMA node, and the partitions."""
    if not layout:
        return
    from rich.table import Table

    out = console()
    if layout["gpus"]:
        names = sorted({n for g in layout["gpus"] for n in g["sets"]})
        table = Table(title=f"Per GPU ({shown(layout['smt'])})", show_lines=False)
        for col in ("GPU", "BDF", "node", "local CPUs", *names, "vectors → CPUs"):
            table.add_column(shown(col), overflow="fold")
        for g in layout["gpus"]:
            vec = f"{g['vectors']} → {g['vector_cpus'] or '-'}" if g["vectors"] else "-"
            if g["off_node"]:
                vec += " (off its node)"
            table.add_row(
                str(g["index"]),
                g["bdf"],
                "-" if g["node"] is None else str(g["node"]),
                g["local_cpus"],
                *(g["sets"].get(n, "-") for n in names),
                vec,
            )
        out.print(table)
    names = sorted({n for node in layout["nodes"] for n in node["sets"]})
    table = Table(title="Per NUMA node", show_lines=False)
    for col in ("node", "CPUs", "GPUs", *names, "partition", "left for the rest"):
        table.add_column(shown(col), overflow="fold")
    for node in layout["nodes"]:
        table.add_row(
            str(node["node"]),
            node["cpus"],
            ", ".join(map(str, node["gpus"])) or "-",
            *(node["sets"].get(n) or "-" for n in names),
            shown("\n".join(node["partitions"]) or "-"),
            node["rest"] or "-",
        )
    out.print(table)


def render_plan(result: PlanResult) -> None:
    out = console()
    out.print(f"Profile [bold]{shown(result.profile)}[/] on {shown(result.root)}")
    for note in result.notes:
        out.print(f"[cyan]note[/] {shown(note)}")
    for warning in result.warnings:
        out.print(f"[yellow]warning[/] {shown(warning)}")
    render_layout(result.layout)
    if result.changes:
        out.print(_changes_table(result))
    else:
        out.print("No changes: the host already matches the profile.")
    for r in result.refused:
        tag = "[bold red]blocked[/]" if r.blocking else "[bold yellow]refused[/]"
        out.print(f"{tag} {shown(labelled(r.tuner, r.target))}: {shown(r.reason)}")
    for b in result.pending_boot:
        out.print(f"[magenta]boot[/] {shown(b)} (missing from /proc/cmdline; needs a reboot)")
    if result.blocked:
        out.print(
            "[bold red]apply refuses this profile here[/] and writes nothing until what is "
            "blocked above is resolved"
        )
    out.print(f"plan {shown(result.profile)}: {plan_counts(result)}")


def plan_counts(result: PlanResult) -> str:
    """The summary line's counts: what apply writes apart from what it only reports and
    what it cannot do here."""
    quiet, cannot = len(result.report_only), len(result.not_possible_here)
    counts = [
        f"{len(result.to_make)} change(s) apply makes",
        f"{quiet} report only (listed, never applied)" if quiet else "",
        f"{cannot} not possible here (listed, not tried)" if cannot else "",
        f"{len(result.settings) - len(result.changes)} already right",
        f"{len(result.refused)} refused" if result.refused else "",
        f"{len(result.pending_boot)} boot argument(s) missing" if result.pending_boot else "",
    ]
    return ", ".join(c for c in counts if c)


def _changes_table(result: PlanResult) -> Table:
    from rich.table import Table

    quiet, cannot = len(result.report_only), len(result.not_possible_here)
    title = f"{len(result.to_make)} change(s)"
    if quiet:
        title += f", {quiet} report only (never applied)"
    if cannot:
        title += f", {cannot} not possible here (not tried)"
    table = Table(title=title, show_lines=False)
    for col in ("tuner", "target", "current → wanted", "why"):
        table.add_column(col, overflow="fold")
    # Report-only and not-possible rows last and marked: they read like changes, and apply
    # makes none of them; a not-possible row's "why" is the reason it cannot be made.
    for c in sorted(result.changes, key=lambda c: (bool(c.not_possible), c.report_only)):
        tuner, why = c.tuner, c.why
        if c.report_only:
            tuner = f"{c.tuner} [yellow](report only)[/]"
        elif c.not_possible:
            tuner, why = f"{c.tuner} [yellow](not possible here)[/]", c.not_possible
        table.add_row(tuner, shown(c.target), shown(f"{c.current} → {c.wanted}"), shown(why))
    return table


def render_apply(plan: PlanResult, report: ApplyReport, root_option: str = "") -> None:
    out = console()
    quiet = plan.report_only
    out.print(
        f"Applied [bold]{shown(plan.profile)}[/]: {len(report.written)} write(s) in "
        f"{report.seconds * 1000:.1f} ms, {len(plan.settings) - len(plan.changes)} already right"
        + (f", {len(quiet)} report only (not applied)" if quiet else "")
    )
    for w in report.written:
        out.print(f"  [green]set[/] {shown(w['target'])}: {shown(w['old'])} → {shown(w['new'])}")
    for rs in report.restored:
        out.print(
            f"  [cyan]restored[/] {shown(rs['target'])} to {shown(rs['value'])} (not in this profile)"
        )
    for np in report.not_possible.values():
        out.print(f"  [yellow]not possible here[/] {shown(np['target'])}: {shown(np['reason'])}")
    for s in report.skipped:
        out.print(f"  [dim]skipped[/] {shown(s['target'])}: {shown(s['reason'])}")
    for c in quiet:
        out.print(
            f"  [yellow]report only[/] {shown(labelled(c.tuner, c.target))}: "
            f"{shown(c.current)} → {shown(c.wanted)} (not applied)"
        )
    for rf in plan.refused:
        out.print(
            f"  [yellow]refused[/] {shown(labelled(rf.tuner, rf.target))}: {shown(rf.reason)}"
        )
    for f in report.failed:
        out.print(f"  [bold red]failed[/] {shown(f['target'])}: {shown(f['error'])}")
    for b in plan.pending_boot:
        out.print(
            f"  [magenta]boot[/] {shown(b)} (gputunectl bootargs{shown(root_option)}; needs a reboot)"
        )
    out.print(f"Undo with: gputunectl revert{shown(root_option)}")


def render_revert(report: RevertReport, root_option: str = "") -> None:
    out = console()
    gone = (
        f"; profile {shown(report.deactivated)} is no longer active"
        if report.deactivated is not None
        else ""
    )
    if not report.restored and not report.failed:
        out.print(
            f"No values to put back (the journal is empty){gone}."
            if gone
            else "Nothing to revert: the journal is empty and no profile is active."
        )
        for n in report.notes:
            out.print(f"  note: {escape(n)}")
        return
    out.print(f"Restored {len(report.restored)} value(s) in {report.seconds * 1000:.1f} ms{gone}")
    for n in report.notes:
        out.print(f"  note: {escape(n)}")
    for f in report.failed:
        out.print(f"  [bold red]failed[/] {shown(f['target'])}: {shown(f['error'])}")
    if report.failed:
        out.print(
            "Not everything was put back (listed above); what failed stays in the journal and "
            f"gputunectl revert{shown(root_option)} tries it again."
        )


def render_verify(report: VerifyReport, *, verbose: bool) -> None:
    from gputuned.engine.verify import PASSED, STATUSES

    out = Lines()
    styles = {"passed": "green", "drifted": "bold red", "pending reboot": "magenta"}
    for group in _alike(ln for ln in report.lines if verbose or ln.status != PASSED):
        ln = group[0]
        style = styles.get(ln.status, "yellow")
        detail = f"live {ln.live}, wanted {ln.wanted}" if ln.live != "-" else ""
        reason = f" — {ln.reason}" if ln.reason else ""
        count = f" ({len(group)} settings)" if len(group) > 1 else ""
        out.print(
            f"[{style}]{ln.status:>17}[/] {shown(_targets(group))} {shown(detail)}"
            f"{shown(reason)}{count}"
        )
    counts = ", ".join(f"{report.count(s)} {s}" for s in STATUSES if report.count(s))
    out.print(
        f"verify {shown(report.profile)}: {counts or 'no settings'} (exit {report.exit_code})"
    )


def _alike(lines: Iterable[Line]) -> list[list[Line]]:
    """verify's lines grouped where all but the target is the same (19 IRQs drifted from and
    to the same CPUs for one reason: one line), in the order each group first appears."""
    groups: dict[tuple[str, ...], list[Line]] = {}
    for ln in lines:
        groups.setdefault((ln.status, ln.tuner, ln.live, ln.wanted, ln.reason), []).append(ln)
    return list(groups.values())


def _targets(group: list[Line]) -> str:
    """``irq 24 (ACPI:Ged), 25 (ttyS0)``: the tuner named once, where a target already starts
    with it not twice (``irq irq 24``)."""
    tuner = group[0].tuner
    names = [ln.target.removeprefix(f"{tuner} ") for ln in group]
    return f"{tuner} {', '.join(names)}"


def self_binding_line(sb: dict[str, Any]) -> str:
    """One process the daemon found binding itself (gputuned/daemon/selfbind.py)."""
    head = (
        f"pid {sb.get('pid')} (rule {shown(str(sb.get('rule')))}) set its own CPUs back twice "
        f"(now {shown(str(sb.get('cpus')))}, gputuned's {shown(str(sb.get('wanted')))}): "
    )
    if sb.get("mode") == "respect":
        return head + 'left to the process (self_binding = "respect"); nice and IRQs still applied'
    return head + 'repaired at every drift check (self_binding = "override")'


def render_status(data: dict[str, Any]) -> None:
    out = Lines()
    others = data.get("coexistence") or []
    if data.get("grub_dropin"):
        out.print(
            f"Boot: {shown(data['grub_dropin'])} holds the kernel arguments of gputunectl "
            "bootargs --write-grub (gputunectl revert puts it back)"
        )
    if data["active_profile"] is None and not data["journal_entries"]:
        out.print("No profile applied; the journal is empty.")
        for note in others:
            out.print(f"[yellow]note[/] {shown(note)}")
        return
    out.print(
        f"Active profile: [bold]{shown(str(data['active_profile']))}[/] ({shown(str(data['source']))})"
    )
    out.print(f"Journal: {data['journal_entries']} original value(s) kept for revert")
    d = data.get("daemon")
    if d:
        out.print(
            f"Daemon: PID {d['pid']}, {shown(d['status'])}; process events by {d['watcher']}; "
            f"{d['repairs']} drift repair(s), {d['replans']} udev re-plan(s), "
            f"{d['reloads']} reload(s)"
        )
        # Two counts that read as one: the processes placed now (by the last full apply or
        # as they started), and how many times a new process was placed since the start.
        placed = data.get("placed") or []
        now = f"{len(placed)} now ({', '.join(map(str, placed))})" if placed else "none now"
        out.print(
            f"Placed processes: {now}; {d['placements']} placement(s) of new processes since "
            "the daemon started"
        )
        for note in data.get("notes") or []:
            out.print(f"  [yellow]note[/] {shown(note)}")
        for sb in data.get("self_binding") or []:
            out.print(f"  [yellow]binds itself[/] {self_binding_line(sb)}")
        for warning in data.get("binding_warnings") or []:
            out.print(f"  [yellow]note[/] {shown(warning)}")
    else:
        out.print("Daemon: not running (one-shot mode)")
    for np in data["not_possible"].values():
        out.print(f"  [yellow]not possible here[/] {shown(np['target'])}: {shown(np['reason'])}")
    for r in data.get("refused") or []:
        out.print(
            f"  [yellow]refused[/] {shown(labelled(str(r['tuner']), str(r['target'])))}: {shown(r['reason'])}"
        )
    for note in others:
        out.print(f"[yellow]note[/] {shown(note)}")
