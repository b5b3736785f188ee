"""The kernel's answer to writes of device files in a tree: PCIe ASPM and IRQ affinity.

- ``/sys/module/pcie_aspm/parameters/policy`` and per-link ``link/*aspm``/``clkpm`` files
- ``/proc/irq/N/smp_affinity{,_list}`` (+ ``effective_affinity{,_list}``), ``default_smp_affinity``

Not modelled: the config-space side effects of ASPM changes (LnkCtl).
"""

from __future__ import annotations

import errno as E
import os
import re

from gputuned.cpulist import format_cpulist, format_mask, parse_cpulist, parse_mask
from gputuned.kernel.pciconfig import parse_config
from gputuned.sim.files import TreeFiles, fail

_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_DOWNSTREAM_PORTS = (0x4, 0x6)  # PCI_EXP_TYPE_ROOT_PORT, PCI_EXP_TYPE_DOWNSTREAM


def kstrtobool(text: str) -> bool | None:
    """lib/kstrtox.c kstrtobool: y/Y/t/T/1, n/N/f/F/0, on/off by the first characters."""
    if text[:1] in ("y", "Y", "t", "T", "1"):
        return True
    if text[:1] in ("n", "N", "f", "F", "0"):
        return False
    if text[:1] in ("o", "O") and len(text) > 1:
        return {"n": True, "f": False}.get(text[1].lower())
    return None


# -- PCIe ASPM ---------------------------------------------------------------------------------


def aspm_policy(tf: TreeFiles, hpath: str, text: str) -> None:
    """drivers/pci/pcie/aspm.c pcie_aspm_set_policy(): sysfs_match_string over the choices.

    pcie_aspm_get_policy() prints every choice followed by a space, the current one in
    brackets, then a newline; the file's own trailing whitespace is kept as it was.
    Simplified: the kernel also reprograms every link's ASPM control (LnkCtl); not done here.
    """
    cur = tf.get(hpath) or ""
    choices = [w.strip("[]") for w in cur.split()]
    want = text.removesuffix("\n")
    if want not in choices:
        raise fail(E.EINVAL, f"{want!r} is not one of {', '.join(choices)}")
    tail = cur[len(cur.rstrip()) :]
    tf.put(hpath, " ".join(f"[{c}]" if c == want else c for c in choices) + tail)


def link_aspm(tf: TreeFiles, hpath: str, text: str) -> None:
    """drivers/pci/pcie/aspm.c aspm_attr_store_common(): kstrtobool, then the link's state.

    Both ends of a link show the same state, so the peer's file changes too. Simplified: the
    kernel shows what the link has enabled (L1 off also turns L1 substates off, and the policy
    can keep a state off); here the file holds what was written.
    """
    on = kstrtobool(text)
    if on is None:
        raise fail(E.EINVAL, "write 1 or 0")
    for path in _link_peers(tf, hpath):
        tf.put(path, "1\n" if on else "0\n")


def _link_peers(tf: TreeFiles, hpath: str) -> list[str]:
    dev, _link, name = hpath.rsplit("/", 2)
    port: str | None = dev  # pcie_aspm_get_link(): a downstream port owns the link below it
    if not _is_downstream_port(tf, dev):
        parent = dev.rsplit("/", 1)[0]
        port = parent if _BDF.fullmatch(parent.rsplit("/", 1)[-1]) else None
    out = [hpath]
    if port is not None:
        out.append(f"{port}/link/{name}")
        real = tf.real(port)
        out += [f"{port}/{c}/link/{name}" for c in sorted(os.listdir(real)) if _BDF.fullmatch(c)]
    return list(dict.fromkeys(out))


def _is_downstream_port(tf: TreeFiles, dev: str) -> bool:
    try:
        cfg = parse_config(tf.real(f"{dev}/config").read_bytes())
    except (OSError, ValueError):
        return False
    return cfg.pcie is not None and cfg.pcie.port_type in _DOWNSTREAM_PORTS


# -- IRQ affinity ------------------------------------------------------------------------------


def irq_affinity(tf: TreeFiles, irq: int, text: str, *, as_list: bool) -> None:
    """kernel/irq/proc.c write_irq_affinity(): a list or mask with at least one online CPU.

    Both views are stored as the kernel prints them (``%*pbl`` / ``%*pb`` for nr_cpu_ids),
    and the effective target follows (see :func:`_irq_effective`).
    """
    cpus = tf.parse_cpus(text, as_list=as_list)
    if not cpus & tf.online():
        raise fail(E.EINVAL, "the set has no online CPU")
    base = f"/proc/irq/{irq}"
    old = _irq_current(tf, base)
    tf.put(f"{base}/smp_affinity_list", format_cpulist(cpus) + "\n")
    tf.put(f"{base}/smp_affinity", format_mask(cpus, tf.nr_cpu_ids()) + "\n")
    _irq_effective(tf, base, old, cpus)


def _irq_current(tf: TreeFiles, base: str) -> frozenset[int] | None:
    raw = tf.get(f"{base}/smp_affinity_list")
    if raw is not None:
        return parse_cpulist(raw)
    raw = tf.get(f"{base}/smp_affinity")
    return parse_mask(raw) if raw is not None else None


def _irq_effective(
    tf: TreeFiles, base: str, old: frozenset[int] | None, new: frozenset[int]
) -> None:
    """Move the effective target as x86 does, and give the captured one back on revert.

    arch/x86/kernel/apic/vector.c assign_vector_locked() keeps the current target CPU when it
    is online and in the new mask; otherwise it takes the CPU with the fewest vectors in use,
    which a tree cannot know: the first online CPU of the set stands in. Because that choice
    is not reversible, the captured target is remembered in STATE_FILE when the affinity
    first changes and restored when that affinity is written back.
    """
    files = {
        "effective_affinity_list": f"{base}/effective_affinity_list",
        "effective_affinity": f"{base}/effective_affinity",
    }
    have = {k: tf.get(p) for k, p in files.items()}
    if all(v is None for v in have.values()):
        return
    state = tf.load_state()
    saved = state.get(base)
    if saved is None and old is not None and old != new:
        saved = state[base] = {"affinity": format_cpulist(old), **have}
    if saved is not None and parse_cpulist(saved["affinity"] or "") == new:
        for key, path in files.items():
            if saved.get(key) is not None:
                tf.put(path, saved[key] or "")
        del state[base]
    else:
        lst, mask = have["effective_affinity_list"], have["effective_affinity"]
        cur = parse_cpulist(lst) if lst is not None else parse_mask(mask or "0")
        usable = new & tf.online()
        if not cur or not cur <= usable:
            target = frozenset({min(usable)})
            tf.put(files["effective_affinity_list"], format_cpulist(target) + "\n")
            tf.put(files["effective_affinity"], format_mask(target, tf.nr_cpu_ids()) + "\n")
    tf.save_state(state)


def cpu_mask(tf: TreeFiles, hpath: str, text: str) -> None:
    """A CPU mask file (gputuned/kernel/masks.py), such as kernel/irq/proc.c
    default_affinity_write(): a mask with at least one online CPU."""
    cpus = tf.parse_cpus(text, as_list=False)
    if not cpus & tf.online():
        raise fail(E.EINVAL, "the mask has no online CPU")
    tf.put(hpath, format_mask(cpus, tf.nr_cpu_ids()) + "\n")
