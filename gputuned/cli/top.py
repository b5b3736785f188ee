"""``gputunectl top``: the rows of gputuned/watch/top.py, once a second, as a table that is
redrawn in place on a terminal, or as JSON lines."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TextIO

from gputuned import errors
from gputuned.cli.output import reader_gone
from gputuned.kernel import Kernel
from gputuned.textsafe import printable
from gputuned.watch.top import (
    MAX_INTERVAL,
    Row,
    Snapshot,
    compute_rows,
    find_targets,
    take_snapshot,
    to_json,
)


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(rows: list[Row], snap: Snapshot, where: str) -> Any:
    """A rich renderable: one line per process, GPUs below."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=Text(f"gputunectl top: {printable(where)}"), title_justify="left", expand=False
    )
    for col, right in (
        ("PID", True),
        ("command", False),
        ("why", False),
        ("threads", True),
        ("CPUs", False),
        ("nice", True),
        ("run-queue ms/s", True),
        ("CPU %", True),
        ("invol. cs/s", True),
        ("vol. cs/s", True),
        ("IRQs/s on its CPUs", True),
        ("GPU %", True),
    ):
        table.add_column(col, justify="right" if right else "left")
    for r in rows:
        gpu = ", ".join(
            f"{g['index']}:{_num(g['utilization'], '{:.0f}')}" for g in r.gpus
        )  # fmt: skip
        table.add_row(
            str(r.pid),
            Text(printable(r.comm)),
            Text(printable(r.source)),
            str(r.threads),
            r.cpus,
            str(r.nice),
            _num(r.runq_ms_per_s, "{:.2f}"),
            _num(r.cpu_percent),
            _num(r.invol_cs_per_s),
            _num(r.vol_cs_per_s),
            _num(r.irqs_per_s, "{:.0f}"),
            gpu or "-",
        )
    parts: list[Any] = [table]
    if not rows:
        parts.append(Text("no process to watch yet (none placed, matched or alive)"))
    if snap.gpus:
        parts.append(
            Text(
                "GPUs: "
                + "; ".join(
                    f"{g.index} {printable(g.name)} {_num(g.utilization_gpu, '{:.0f}')} %"
                    for g in snap.gpus
                )
            )
        )
    return Group(*parts)


def run_top(
    kernel: Kernel,
    *,
    pids: list[int],
    once: bool,
    as_json: bool,
    interval: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    out: TextIO | None = None,
) -> int:
    """Refresh every ``interval`` seconds until interrupted; ``once``: one view, then return."""
    if not 0 < interval <= MAX_INTERVAL:  # NaN too; inf would overflow sleep()
        raise errors.UsageError(
            f"--interval must be above 0 and at most {MAX_INTERVAL} seconds, not {interval:g}"
        )
    stream = out if out is not None else sys.stdout
    targets = find_targets(kernel, pids)
    prev = take_snapshot(kernel, targets.procs, clock=clock)
    live = None
    from gputuned.cli.render import console

    if not as_json and not once and out is None and console().is_terminal:
        # Redrawn in place on a terminal only: into a pipe or a file rich's Live prints
        # nothing until it stops, so there each view is printed after the last.
        from rich.live import Live

        live = Live(console=console(), auto_refresh=False)
        live.start()
    try:
        n = 0
        while True:
            sleep(interval)
            n += 1
            cur = take_snapshot(kernel, targets.procs, clock=clock)
            rows = compute_rows(prev, cur, targets.procs)
            if as_json:
                doc = to_json(rows, cur, targets.where)
                stream.write(json.dumps(doc, indent=2 if once else None) + "\n")
                stream.flush()
            elif live is not None:
                live.update(render(rows, cur, targets.where), refresh=True)
            else:
                console().print(render(rows, cur, targets.where))
            if once or reader_gone():
                return 0  # one view; or nobody reads any more (| head): top's work is done
            if targets.refresh_every and n % targets.refresh_every == 0:
                # Servers start and exit: look again; a newcomer gets its rate next time.
                targets = find_targets(kernel, pids)
                added = [t for t in targets.procs if t.pid not in cur.procs]
                if added:
                    extra = take_snapshot(kernel, added, nvml=False, clock=clock).procs
                    cur = replace(cur, procs={**cur.procs, **extra})
            prev = cur
    finally:
        if live is not None:
            live.stop()
