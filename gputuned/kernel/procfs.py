"""The text formats of ``/proc/PID`` files (proc(5)): one parser for each.

- ``stat``: one line, ``pid (comm) state ppid ...``. ``comm`` is in parentheses and may itself
  hold spaces and ``)``, so the line is split at the *last* ``)``; the fields after it are
  numbered as proc(5) numbers them (3 is ``state``, 4 ``ppid``, ...).
- ``status``: ``Key:<tab>value`` lines (fs/proc/array.c).
- ``cgroup``: ``hierarchy-ID:controllers:path`` lines; on cgroup v2 the line ``0::PATH``
  (Documentation/admin-guide/cgroup-v2.rst, "Processes").

Every reader of these files goes through here: the process scan, the polling watcher, the
samplers behind ``top`` and the metrics, the identity check before a write, and the simulated
kernel, which edits ``stat`` in place.
"""

from __future__ import annotations

# proc(5) /proc/PID/stat field numbers.
STATE, PPID, FLAGS, UTIME, STIME = 3, 4, 9, 14, 15
PRIORITY, NICE, NUM_THREADS, STARTTIME = 18, 19, 20, 22
RT_PRIORITY, POLICY = 40, 41
#: include/linux/sched.h: the flags field (9) of a kernel thread.
PF_KTHREAD = 0x00200000


class Stat:
    """One parsed ``/proc/PID/stat`` (or ``/proc/PID/task/TID/stat``) line."""

    __slots__ = ("comm", "fields")

    def __init__(self, comm: str, fields: list[str]) -> None:
        self.comm = comm
        #: The fields after comm: field N of proc(5) is ``fields[N - 3]``.
        self.fields = fields

    def field(self, number: int) -> int:
        """Numeric field ``number`` as proc(5) numbers it."""
        return int(self.fields[number - 3])

    @property
    def state(self) -> str:
        return self.fields[0]

    @property
    def ppid(self) -> int:
        return self.field(PPID)

    @property
    def start_time(self) -> int:
        """Clock ticks since boot: with the PID, the process's identity (PIDs are reused)."""
        return self.field(STARTTIME)

    @property
    def kernel_thread(self) -> bool:
        return bool(self.field(FLAGS) & PF_KTHREAD)


def parse_stat(text: str) -> Stat:
    head, _, rest = text.rpartition(")")
    return Stat(head.partition("(")[2], rest.split())


def edit_stat(text: str, values: dict[int, int]) -> str:
    """``text`` with the numbered fields in ``values`` replaced, every other byte kept."""
    cut = text.rindex(")") + 1
    body, newline = (text[cut:-1], "\n") if text.endswith("\n") else (text[cut:], "")
    fields = body.split(" ")  # fields[0] is "" (the space after comm): field N is [N - 2]
    for number, value in values.items():
        fields[number - 2] = str(value)
    return text[:cut] + " ".join(fields) + newline


def parse_status(text: str) -> dict[str, str]:
    """``/proc/PID/status`` as key -> value, the value stripped of its padding."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def cgroup_path(text: str) -> str | None:
    """The cgroup v2 path of ``/proc/PID/cgroup`` (its ``0::`` line), None when it has none."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None
