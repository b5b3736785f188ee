"""How ``gputunectl install-system`` and ``uninstall-system`` show their report (what they do is
gputuned/install/system.py's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gputuned.install.system import UNIT_NAME, Report, Step

if TYPE_CHECKING:
    from rich.console import Console


def render(report: Report) -> None:
    from rich.markup import escape

    from gputuned.cli.render import console

    out = console()
    head = f"{report.command} (prefix {report.prefix})"
    out.print(f"[bold]{escape(head)}{', dry run: nothing changed' if report.dry_run else ''}[/]")
    if report.exec_start:
        out.print(f"  ExecStart={escape(report.exec_start)}")
    for s in report.steps:
        if s.phase == "before":
            _render_step(out, s)
    for f in report.files:
        colour = "yellow" if f.action == "keep" else "default"
        tail = f": {f.detail}" if f.detail and f.action == "keep" else ""
        out.print(f"  [{colour}]{f.action:<9}[/] {escape(f.path + tail)}")
    for s in report.steps:
        if s.phase != "before":
            _render_step(out, s)
    if report.command == "install-system" and not report.dry_run and report.ok:
        out.print(f"next: systemctl enable --now {UNIT_NAME}")


def _render_step(out: Console, s: Step) -> None:
    from rich.markup import escape

    colour = {"failed": "red", "skipped": "yellow"}.get(s.result, "default")
    tail = f": {s.detail}" if s.detail and s.result != "ok" else ""
    out.print(f"  [{colour}]{s.result:<9}[/] {escape(s.command + tail)}")
