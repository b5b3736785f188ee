"""The GRUB drop-in of ``gputunectl bootargs --write-grub``: written with a record under
/etc/gputuned, removed by ``gputunectl revert`` (issue 19, item 5).

The drop-in is boot configuration: it is meant to outlive the boot, so it is not in the
journal, which lives in /run and dies with the boot (a revert after a reboot could not remove
it), and which the daemon replays when it stops (at every shutdown it would have taken the
kernel arguments away again). The record (``GRUB_RECORD``) keeps what the file held before
gputuned first wrote it and the SHA-256 of what it wrote; it is written durably before the
file. Only an explicit revert (``gputunectl revert``, one-shot or through the daemon) puts the
file back, and only if it still holds what gputuned wrote: an edited drop-in is left, and said.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from gputuned import errors
from gputuned.settings.base import ABSENT, Op
from gputuned.settings.registry import write
from gputuned.store.state import (
    GRUB_DROPIN,
    GRUB_RECORD,
    read_optional_bytes,
    remove,
    replace_durable,
)

if TYPE_CHECKING:
    from gputuned.engine.applyreport import RevertReport
    from gputuned.kernel import Kernel

_OP = Op("file:" + GRUB_DROPIN, "bootargs", GRUB_DROPIN, "file", GRUB_DROPIN, "")
#: update-grub on Debian and Ubuntu; grub2-mkconfig on Fedora and RHEL.
REGENERATE = "run update-grub (or grub2-mkconfig -o /boot/grub2/grub.cfg) and reboot"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _current(kernel: Kernel) -> str | None:
    return kernel.read_text(GRUB_DROPIN) if kernel.exists(GRUB_DROPIN) else None


def read_record(kernel: Kernel) -> dict[str, Any] | None:
    """The record, checked: ``old`` (text or None: no file) and ``sha256``; None if none."""
    raw = read_optional_bytes(kernel, GRUB_RECORD)
    if raw is None:
        return None
    try:
        rec = json.loads(raw)
        ok = (
            isinstance(rec, dict)
            and isinstance(rec.get("sha256"), str)
            and (rec.get("old") is None or isinstance(rec.get("old"), str))
        )
    except ValueError:
        ok = False
    if not ok:
        raise errors.GputunedError(
            f"{GRUB_RECORD} is damaged; gputuned cannot tell what {GRUB_DROPIN} held before "
            f"it wrote it: check {GRUB_DROPIN} by hand, then remove {GRUB_RECORD}"
        )
    return dict(rec)


def write_dropin(kernel: Kernel, text: str) -> bool:
    """Put ``text`` in the drop-in, recorded first; False when it already holds it."""
    current = _current(kernel)
    if current == text:
        return False
    rec = read_record(kernel)
    # A second write keeps what the file held before the first: that is what revert restores.
    old = rec["old"] if rec is not None else current
    data = {"path": GRUB_DROPIN, "old": old, "sha256": _sha(text)}
    replace_durable(kernel, GRUB_RECORD, json.dumps(data, indent=1).encode())
    write(kernel, _OP, text)
    return True


def revert_dropin(kernel: Kernel, report: RevertReport) -> None:
    """Put the drop-in back as it was before ``bootargs --write-grub``, if it is still ours."""
    rec = read_record(kernel)
    if rec is None:
        return
    current, old = _current(kernel), rec["old"]
    if current is not None and _sha(current) == rec["sha256"]:
        try:
            write(kernel, _OP, ABSENT if old is None else old)
        except errors.GputunedError as exc:
            report.failed.append({"target": GRUB_DROPIN, "error": str(exc)})
            return  # the record stays: the next revert tries again
        report.restored.append({"target": GRUB_DROPIN, "value": "absent" if old is None else old})
        report.notes.append(
            f"put back {GRUB_DROPIN} as it was before gputunectl bootargs --write-grub; "
            f"{REGENERATE}: the kernel arguments stay in the boot menu until then"
        )
    elif current is not None and current != old:
        report.notes.append(
            f"{GRUB_DROPIN} changed since gputunectl bootargs --write-grub wrote it, so it "
            f"was left as it is: edit or remove it yourself, then {REGENERATE}"
        )
    remove(kernel, GRUB_RECORD)
