"""A whole file gputuned owns: the GRUB drop-in of ``gputunectl bootargs --write-grub``.

Absent before gputuned wrote it, so revert removes it; written atomically and durably, as
gputuned's own state files are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gputuned.settings.base import ABSENT, Op, Setting
from gputuned.store import state

if TYPE_CHECKING:
    from gputuned.kernel import Kernel


class OwnedFile(Setting):
    kind = change_kind = "file"
    what = "a whole file gputuned writes (the GRUB drop-in), absent before"

    def read(self, kernel: Kernel, op: Op) -> str:
        return kernel.read_text(op.path) if kernel.exists(op.path) else ABSENT

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        if value == ABSENT:
            state.remove(kernel, op.path)
        else:
            state.replace_durable(kernel, op.path, value.encode(), mode=0o644)

    def refusal(self, op: Op, value: str) -> str | None:
        if op.path != state.GRUB_DROPIN:
            return f"{op.path!r} is not {state.GRUB_DROPIN}, the one file gputuned writes"
        return None if len(value) <= 65536 else "a value too long for the GRUB drop-in"
