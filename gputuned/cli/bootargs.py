"""``gputunectl bootargs``: the kernel arguments a profile wants, and optionally a grub drop-in.

Boot arguments (nohz_full, rcu_nocbs, irqaffinity, ...) take effect only at the next boot, so
gputuned never changes them behind the user's back: it prints them, and writes
/etc/default/grub.d/gputuned.cfg only when asked, recorded under /etc/gputuned so that
``gputunectl revert`` puts it back, after a reboot too (gputuned/engine/grub.py).
"""

from __future__ import annotations

import json
import sys

from gputuned.cli.render import console, shown
from gputuned.engine.grub import write_dropin
from gputuned.engine.plan import read_context
from gputuned.kernel import Kernel
from gputuned.profile.model import Profile
from gputuned.store.state import GRUB_DROPIN, HostLock
from gputuned.tuners.bootargs import BootargsTuner


def grub_dropin(args: list[str]) -> str:
    joined = " ".join(args)
    return (
        "# Written by gputunectl bootargs --write-grub; removed by gputunectl revert.\n"
        "# Run update-grub (Debian) or grub2-mkconfig -o ... afterwards, then reboot.\n"
        f'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT {joined}"\n'
    )


def bootargs(
    kernel: Kernel, profile: Profile, *, write_grub: bool, as_json: bool, again: str = ""
) -> int:
    """Print (and with ``write_grub`` write) the arguments; ``again``: the options a command
    it suggests keeps (`` --root DIR``)."""
    ctx = read_context(kernel, profile)
    tuner = BootargsTuner()
    wanted = tuner.wanted(ctx)
    missing = tuner.plan(ctx).pending_boot
    written: list[dict[str, str]] = []
    if write_grub and wanted:
        text = grub_dropin(wanted)
        with HostLock(kernel):
            old = kernel.read_text(GRUB_DROPIN) if kernel.exists(GRUB_DROPIN) else "absent"
            if write_dropin(kernel, text):
                written.append({"target": GRUB_DROPIN, "old": old, "new": text})
    if as_json:
        sys.stdout.write(
            json.dumps({"wanted": wanted, "missing": missing, "written": written}, indent=2) + "\n"
        )
        return 0
    out = console()
    if not wanted:
        out.print(f"Profile {profile.name} wants no kernel arguments.")
        return 0
    out.print(" ".join(wanted))
    for m in missing:
        out.print(f"missing from /proc/cmdline: {m}")
    if written:
        out.print(f"wrote {GRUB_DROPIN}; run update-grub and reboot for it to take effect")
    elif write_grub:
        out.print(f"{GRUB_DROPIN} already holds these arguments")
    else:
        out.print(f"(gputunectl bootargs --write-grub{shown(again)} writes {GRUB_DROPIN} for you)")
    return 0
