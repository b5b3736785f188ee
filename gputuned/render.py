"""Human-readable output (rich tables) for inspect and plan. JSON output bypasses this."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from gputuned.engine import PlanResult


def console(*, stderr: bool = False) -> Console:
    out = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not out.is_terminal:
        out.width = 160  # piped into a log or a file: rich would assume 80 columns
    return out


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


def render_inspect(data: dict[str, Any], *, all_functions: bool) -> None:
    out = console()
    pol = data["aspm_policy"]
    writable = {True: "writable", False: "not writable", None: "writability unknown"}[
        pol["writable"]
    ]
    out.print(
        f"ASPM policy: [bold]{escape(str(pol['value']))}[/] ({writable}: {escape(pol['reason'])})"
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
            escape(f"{name}\n{d['port_type'] or ''}"),
            f"{d['numa_node'] if d['numa_node'] is not None else '-'} / {d['local_cpus'] or '-'}",
            _link(d),
            f"{mps['current']}/{mps['supported']}/{mps['path_max']}" if mps else "-",
            str(d["mrrs"] or "-"),
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
            out.print(f"[{style}]{f['level']}[/] {d['bdf']}: {escape(f['message'])}")


def render_plan(result: PlanResult) -> None:
    out = console()
    out.print(f"Profile [bold]{escape(result.profile)}[/] on {escape(result.root)}")
    for note in result.notes:
        out.print(f"[cyan]note[/] {escape(note)}")
    if result.changes:
        table = Table(title=f"{len(result.changes)} change(s)", show_lines=False)
        for col in ("tuner", "target", "current → wanted", "why"):
            table.add_column(col, overflow="fold")
        for c in result.changes:
            table.add_row(
                c.tuner, escape(c.target), escape(f"{c.current} → {c.wanted}"), escape(c.why)
            )
        out.print(table)
    else:
        out.print("No changes: the host already matches the profile.")
    for r in result.refused:
        out.print(f"[bold yellow]refused[/] {r.tuner} {escape(r.target)}: {escape(r.reason)}")
    for b in result.pending_boot:
        out.print(f"[magenta]boot[/] {escape(b)} (missing from /proc/cmdline; needs a reboot)")
