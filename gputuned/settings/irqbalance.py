"""What a running irqbalance must leave alone, told through its socket (``data``: its pid and
start time, ``attr``: ``cpus`` (the CPUs it must not use, a CPU list) or ``irqs`` (IRQ numbers
it must not move, separated by spaces)). The daemon's identity is checked before each read and
write, as a process's is.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.kernel import irqbalance
from gputuned.settings.base import Op, Setting, check_identity, process_ids_refusal

if TYPE_CHECKING:
    from gputuned.kernel import Kernel


class IrqbalanceBan(Setting):
    kind = change_kind = "irqbalance"
    what = "the CPUs or IRQs a running irqbalance must leave alone (its socket)"

    def read(self, kernel: Kernel, op: Op) -> str:
        check_identity(kernel, op)
        cpus, irqs = irqbalance.read_settings(kernel, int(op.data["pid"]))
        return format_cpulist(cpus) if op.data["attr"] == "cpus" else " ".join(map(str, irqs))

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        check_identity(kernel, op)
        pid = int(op.data["pid"])
        if op.data["attr"] == "cpus":
            irqbalance.ban_cpus(kernel, pid, parse_cpulist(value))
        else:
            irqbalance.ban_irqs(kernel, pid, tuple(int(n) for n in value.split()))

    def holds(
        self, kernel: Kernel, op: Op, value: str, *, just_written: bool = False
    ) -> tuple[bool, str]:
        if just_written:
            # irqbalance takes new settings at its next rescan (its sleep interval, 10 s by
            # default), so an immediate "setup" still shows the old ones; verify checks later.
            return True, value
        return super().holds(kernel, op, value)

    def refusal(self, op: Op, value: str) -> str | None:
        d = op.data
        missing = process_ids_refusal(op, thread=False)
        if missing:
            return missing
        ok = d.get("attr") in ("cpus", "irqs") and re.fullmatch(r"[0-9,\- ]{0,8192}", value)
        return None if ok else f"{value[:80]!r} is not a {op.kind} value gputuned writes"
