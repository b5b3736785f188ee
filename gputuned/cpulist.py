"""CPU lists and masks in the kernel's text formats.

The kernel prints CPU sets two ways: cpulists (``0-3,8``; ``bitmap_print_list_to_buf`` in
lib/bitmap-str.c) and hex masks in 32-bit groups separated by commas (``ffff,00000000``;
``bitmap_print_bitmask_to_buf``). ``/proc/irq/N/smp_affinity`` and
``/proc/irq/default_smp_affinity`` use masks; ``*_list`` files and cgroup ``cpuset.*`` use lists.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+)/(\d+))?)?$")
#: CPU numbers run below this: the largest NR_CPUS Linux builds with (x86 CONFIG_MAXSMP,
#: arch/x86/Kconfig NR_CPUS_RANGE_END). A profile's "0-99999999" allocated 2.3 GB before it was
#: refused (issue 14, finding 14).
MAX_CPUS = 8192


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57] + "...")


def _too_high(text: str, cpu: int) -> CpuListError:
    return CpuListError(
        f"{_shown(text)} names CPU {cpu}, past CPU {MAX_CPUS - 1}: no Linux has more than "
        f"{MAX_CPUS} CPUs"
    )


class CpuListError(ValueError):
    """A cpulist or mask is malformed; the message quotes it and shows the accepted form."""


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse ``"0-3,8,10-15:2/4"`` (the kernel's ``bitmap_parselist`` grammar) into a set.

    An empty string (or only whitespace) is the empty set, as the kernel prints it.
    """
    text = text.strip()
    if not text:
        return frozenset()
    cpus: set[int] = set()
    for part in text.split(","):
        m = _RANGE.match(part.strip()) if len(part) <= 64 else None
        if not m:
            raise CpuListError(
                f"{_shown(text)} is not a CPU list; write CPUs and ranges like '0-3,8' or "
                "'0-15:2/4'"
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi >= MAX_CPUS:
            raise _too_high(text, hi)
        if hi < lo:
            raise CpuListError(f"{_shown(text)}: range {part!r} runs backwards; write it low-high")
        if m.group(3) is not None:
            used, group = int(m.group(3)), int(m.group(4))
            if group == 0 or used > group:
                raise CpuListError(f"{_shown(text)}: in {part!r} need 0 < used <= group size")
            cpus.update(c for c in range(lo, hi + 1) if (c - lo) % group < used)
        else:
            cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format a set as the kernel does: sorted, ranges of two or more joined with ``-``."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cpus)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(_fmt_run(run))
        run = [c]
    if run:
        out.append(_fmt_run(run))
    return ",".join(out)


def _fmt_run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def parse_mask(text: str) -> frozenset[int]:
    """Parse a hex mask such as ``ffff`` or ``00000001,00000000`` into a set of CPUs."""
    digits = text.strip().replace(",", "")
    if not re.fullmatch(r"[0-9a-fA-F]+", digits):
        raise CpuListError(f"{_shown(text)} is not a hex CPU mask such as 'ff' or '1,00000000'")
    digits = digits.lstrip("0") or "0"
    if len(digits) > MAX_CPUS // 4:
        raise _too_high(text, 4 * len(digits) - 1)
    value = int(digits, 16)
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def format_mask(cpus: Iterable[int], nr_cpus: int) -> str:
    """Format as the kernel prints masks for ``nr_cpus`` CPUs: 32-bit comma-separated groups.

    The first group is trimmed to the digits ``nr_cpus`` needs (``ffff`` on 16 CPUs, ``3`` on 2),
    as ``bitmap_print_bitmask_to_buf`` does with ``nr_cpu_ids``.
    """
    value = 0
    for c in cpus:
        value |= 1 << c
    groups = max(1, (nr_cpus + 31) // 32)
    words = [(value >> (32 * i)) & 0xFFFFFFFF for i in reversed(range(groups))]
    first_digits = max(1, ((nr_cpus - 32 * (groups - 1)) + 3) // 4)
    parts = [f"{words[0]:0{first_digits}x}"] + [f"{w:08x}" for w in words[1:]]
    return ",".join(parts)
