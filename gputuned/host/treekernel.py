"""The kernel's side of writes to a captured tree.

On the live machine, writing ``/proc/irq/N/smp_affinity_list`` makes the kernel reformat the
value, update ``smp_affinity`` and pick an effective CPU; on a tree nothing but a file write would
happen. :class:`TreeKernel` plays the kernel for the files gputuned writes, so that reading back
after a write shows what the kernel would show, and writing the old value back leaves the tree
byte-identical. :class:`~gputuned.host.fs.Host` routes every tree write, ``mkdir`` and ``rmdir``
through here (injected faults fire before); anything not listed below is a plain file write.

- ``/sys/module/pcie_aspm/parameters/policy`` and per-link ``link/*aspm``/``clkpm`` files
- ``/proc/irq/N/smp_affinity{,_list}`` (+ ``effective_affinity{,_list}``), ``default_smp_affinity``
- cgroup v2 (by the tree's ``/proc/mounts``): ``cgroup.subtree_control``, ``cgroup.procs``,
  ``cpuset.cpus``, ``cpuset.cpus.exclusive``, ``cpuset.cpus.partition``, ``mkdir`` and ``rmdir``
- a remount of the cgroup2 hierarchy (:meth:`TreeKernel.remount`): its lines in
  ``/proc/self/mountinfo`` and ``/proc/mounts``

Entry points raise ``OSError`` with the errno the kernel returns; where the user needs a reason it
rides in ``strerror`` and ``gputuned.host.fs.translate`` shows it. Simplifications are named where
they are made. Not modelled at all: interface files of controllers other than cpuset, cgroup
events, the config-space side effects of ASPM changes (LnkCtl), and cpuset changes reaching task
affinities (the kernel re-applies ``cpuset.cpus.effective`` to every task; see procctl).
"""

from __future__ import annotations

import errno as E
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gputuned.cpulist import CpuListError, format_cpulist, format_mask, parse_cpulist, parse_mask
from gputuned.host import mounts as mt
from gputuned.host.fs import write_file
from gputuned.host.pci import ASPM_POLICY, LINK_ASPM_FILES
from gputuned.host.pciconfig import parse_config

CPU_DIR = "/sys/devices/system/cpu"
#: Remembers what a tree cannot derive (the captured effective CPU of an IRQ, see _irq_effective)
#: beside the tree; deleted as soon as nothing is remembered, so a reverted tree is identical.
STATE_FILE = ".gputuned-kernel-state.json"
#: cgroup v2 controllers in the kernel's print order (enum order of include/linux/cgroup_subsys.h).
CONTROLLERS = ("cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc", "dmem")
_CGROUP_READ_ONLY = frozenset(
    {"cgroup.controllers", "cgroup.events", "cgroup.stat", "cpuset.cpus.effective"}
    | {"cpuset.mems.effective", "cpuset.cpus.exclusive.effective", "cpuset.cpus.isolated"}
)
_IRQ_FILE = re.compile(r"/proc/irq/(\d+)/(smp_affinity|smp_affinity_list)")
_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_DOWNSTREAM_PORTS = (0x4, 0x6)  # PCI_EXP_TYPE_ROOT_PORT, PCI_EXP_TYPE_DOWNSTREAM
# perr_strings[] of kernel/cgroup/cpuset.c; two changed wording in 6.7 (cpuset.cpus.exclusive).
_PERR = {
    "INVPARENT": "Parent is an invalid partition root",
    "NOTPART": "Parent is not a partition root",
    "NOTEXCL": "Cpu list in cpuset.cpus not exclusive",
    "NOCPUS": "Parent unable to distribute cpu downstream",
}
_PERR_67 = {
    "INVCPUS": ("Invalid cpu list in cpuset.cpus", "Invalid cpu list in cpuset.cpus.exclusive"),
    "CPUSEMPTY": ("cpuset.cpus is empty", "cpuset.cpus and cpuset.cpus.exclusive are empty"),
}

Handler = Callable[[str, str], None]


def _fail(code: int, reason: str | None = None) -> OSError:
    return OSError(code, reason or os.strerror(code))


def _ctrls(text: str | None) -> set[str]:
    return set((text or "").split())


def format_controllers(names: set[str]) -> str:
    """cgroup_print_ss_mask(): names in subsystem order, a newline only if any was printed."""
    ordered = [c for c in CONTROLLERS if c in names] + sorted(names - set(CONTROLLERS))
    return " ".join(ordered) + "\n" if ordered else ""


def kstrtobool(text: str) -> bool | None:
    """lib/kstrtox.c kstrtobool: y/Y/t/T/1, n/N/f/F/0, on/off by the first characters."""
    if text[:1] in ("y", "Y", "t", "T", "1"):
        return True
    if text[:1] in ("n", "N", "f", "F", "0"):
        return False
    if text[:1] in ("o", "O") and len(text) > 1:
        return {"n": True, "f": False}.get(text[1].lower())
    return None


@dataclass
class _Cpuset:
    """One cgroup with the cpuset controller, as its files say before a change."""

    path: str
    cpus: frozenset[int]
    exclusive: frozenset[int]
    want: str  # member | root | isolated (the requested type, valid or not)
    valid_now: bool
    effective_now: frozenset[int]
    xeff_now: frozenset[int]
    tasks: bool
    children: list[_Cpuset] = field(default_factory=list)

    @property
    def user_x(self) -> frozenset[int]:
        """user_xcpus(): the exclusive CPUs if set, else cpuset.cpus."""
        return self.exclusive or self.cpus

    def held(self) -> frozenset[int]:
        """CPUs a valid partition holds from its parent now (its effective_xcpus)."""
        if self.xeff_now:
            return self.xeff_now
        out = set(self.effective_now)
        for c in self.children:
            if c.valid_now:
                out |= c.held()
        return frozenset(out)

    def populated(self) -> bool:
        return self.tasks or any(c.populated() for c in self.children)


class TreeKernel:
    """The kernel model for the tree at ``root`` (state lives in the tree's files only)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    # -- tree files ------------------------------------------------------------------------

    def real(self, hpath: str) -> Path:
        return self.root.joinpath(*[p for p in hpath.split("/") if p])

    def get(self, hpath: str) -> str | None:
        try:
            return self.real(hpath).read_text(errors="replace")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def put(self, hpath: str, text: str, *, create: bool = False) -> None:
        """Give an existing (or, with ``create``, new) file the text; equal content is untouched."""
        real = self.real(hpath)
        exists = real.is_file()
        if (exists or create) and not (exists and real.read_bytes() == text.encode()):
            real.write_bytes(text.encode())

    def _put_whole(self, hpath: str, text: str) -> None:
        """put(), replacing the file in one step (same mode): a reader in another thread sees
        the old text or the new, never a half-written file, as with the kernel's own files.
        apply remounts in a thread while it goes on (see Host.start_remount)."""
        real = self.real(hpath)
        if not real.is_file() or real.read_bytes() == text.encode():
            return
        tmp = real.with_name(f".{real.name}.gputuned-new")
        tmp.write_bytes(text.encode())
        shutil.copymode(real, tmp)
        tmp.replace(real)

    def _put_cpus(self, hpath: str, cpus: frozenset[int]) -> None:
        # Rewritten only when the meaning changes, so files the model agrees with keep their bytes.
        cur = self.get(hpath)
        try:
            same = cur is not None and parse_cpulist(cur) == cpus
        except CpuListError:
            same = False
        if not same:
            self.put(hpath, format_cpulist(cpus) + "\n")

    def nr_cpu_ids(self) -> int:
        for name in ("possible", "present", "online"):
            raw = (self.get(f"{CPU_DIR}/{name}") or "").strip()
            if raw:
                return max(parse_cpulist(raw)) + 1
        return 1

    def possible(self) -> frozenset[int]:
        return frozenset(range(self.nr_cpu_ids()))

    def online(self) -> frozenset[int]:
        raw = self.get(f"{CPU_DIR}/online")
        return parse_cpulist(raw) if raw is not None else self.possible()

    def cgroup2_mounts(self) -> list[str]:
        out = []
        for line in (self.get("/proc/mounts") or "").splitlines():
            f = line.split()
            if len(f) >= 3 and f[2] == "cgroup2":
                out.append(f[1])
        return out

    def cgroup2_mount(self, hpath: str) -> str | None:
        """The cgroup v2 mount holding ``hpath`` (longest match), None outside any."""
        hits = [m for m in self.cgroup2_mounts() if hpath == m or hpath.startswith(m + "/")]
        return max(hits, key=len) if hits else None

    def _parse_cpus(self, text: str, *, as_list: bool) -> frozenset[int]:
        try:
            cpus = parse_cpulist(text) if as_list else parse_mask(text)
        except CpuListError as exc:
            raise _fail(E.EINVAL, str(exc)) from exc
        if cpus and max(cpus) >= self.nr_cpu_ids():
            # bitmap_parselist() answers ERANGE, bitmap_parse() EOVERFLOW (lib/bitmap-str.c).
            raise _fail(E.ERANGE if as_list else E.EOVERFLOW)
        return cpus

    # -- entry points ----------------------------------------------------------------------

    def write(self, hpath: str, data: bytes, offset: int | None = None) -> None:
        """``write(2)`` of ``data`` to the canonical (link-free) host path ``hpath``."""
        handler = self._handler(hpath) if offset is None else None
        if handler is None:
            write_file(self.real(hpath), data, offset)
            return
        # Every cgroup has cgroup.procs; captured trees often leave the root's out.
        real = self.real(hpath)
        if not (real.is_file() or (real.name == "cgroup.procs" and real.parent.is_dir())):
            raise _fail(E.ENOENT)
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError as exc:
            raise _fail(E.EINVAL) from exc
        handler(hpath, text)

    def _handler(self, hpath: str) -> Handler | None:
        if hpath == ASPM_POLICY:
            return self._aspm_policy
        if hpath == "/proc/irq/default_smp_affinity":
            return self._default_affinity
        m = _IRQ_FILE.fullmatch(hpath)
        if m:
            irq, as_list = int(m[1]), m[2] == "smp_affinity_list"
            return lambda hp, text: self._irq_affinity(irq, hp, text, as_list=as_list)
        parts = hpath.split("/")
        if hpath.startswith("/sys/") and parts[-2:-1] == ["link"] and parts[-1] in LINK_ASPM_FILES:
            return self._link_aspm
        mount = self.cgroup2_mount(hpath)
        if mount is None or hpath == mount:
            return None
        cg, name = hpath.rsplit("/", 1)
        if name in _CGROUP_READ_ONLY:
            return self._read_only
        cgroup_handlers: dict[str, Callable[[str, str, str], None]] = {
            "cgroup.subtree_control": self._subtree_control,
            "cgroup.procs": self._procs_write,
            "cpuset.cpus": self._cpuset_cpus,
            "cpuset.cpus.exclusive": self._cpuset_exclusive,
            "cpuset.cpus.partition": self._partition,
        }
        h = cgroup_handlers.get(name)
        return None if h is None else (lambda _hp, text: h(mount, cg, text))

    @staticmethod
    def _read_only(_hpath: str, _text: str) -> None:
        # kernfs_fop_open() refuses to open a file without a write method for writing.
        raise _fail(E.EACCES, "a read-only kernel file; the kernel computes it")

    # -- PCIe ASPM -------------------------------------------------------------------------

    def _aspm_policy(self, hpath: str, text: str) -> None:
        """drivers/pci/pcie/aspm.c pcie_aspm_set_policy(): sysfs_match_string over the choices.

        pcie_aspm_get_policy() prints every choice followed by a space, the current one in
        brackets, then a newline; the file's own trailing whitespace is kept as it was.
        Simplified: the kernel also reprograms every link's ASPM control (LnkCtl); not done here.
        """
        cur = self.get(hpath) or ""
        choices = [w.strip("[]") for w in cur.split()]
        want = text.removesuffix("\n")
        if want not in choices:
            raise _fail(E.EINVAL, f"{want!r} is not one of {', '.join(choices)}")
        tail = cur[len(cur.rstrip()) :]
        self.put(hpath, " ".join(f"[{c}]" if c == want else c for c in choices) + tail)

    def _link_aspm(self, hpath: str, text: str) -> None:
        """drivers/pci/pcie/aspm.c aspm_attr_store_common(): kstrtobool, then the link's state.

        Both ends of a link show the same state, so the peer's file changes too. Simplified: the
        kernel shows what the link has enabled (L1 off also turns L1 substates off, and the policy
        can keep a state off); here the file holds what was written.
        """
        on = kstrtobool(text)
        if on is None:
            raise _fail(E.EINVAL, "write 1 or 0")
        for path in self._link_peers(hpath):
            self.put(path, "1\n" if on else "0\n")

    def _link_peers(self, hpath: str) -> list[str]:
        dev, _link, name = hpath.rsplit("/", 2)
        port: str | None = dev  # pcie_aspm_get_link(): a downstream port owns the link below it
        if not self._is_downstream_port(dev):
            parent = dev.rsplit("/", 1)[0]
            port = parent if _BDF.fullmatch(parent.rsplit("/", 1)[-1]) else None
        out = [hpath]
        if port is not None:
            out.append(f"{port}/link/{name}")
            real = self.real(port)
            out += [
                f"{port}/{c}/link/{name}" for c in sorted(os.listdir(real)) if _BDF.fullmatch(c)
            ]
        return list(dict.fromkeys(out))

    def _is_downstream_port(self, dev: str) -> bool:
        try:
            cfg = parse_config(self.real(f"{dev}/config").read_bytes())
        except (OSError, ValueError):
            return False
        return cfg.pcie is not None and cfg.pcie.port_type in _DOWNSTREAM_PORTS

    # -- IRQ affinity ----------------------------------------------------------------------

    def _irq_affinity(self, irq: int, hpath: str, text: str, *, as_list: bool) -> None:
        """kernel/irq/proc.c write_irq_affinity(): a list or mask with at least one online CPU.

        Both views are stored as the kernel prints them (``%*pbl`` / ``%*pb`` for nr_cpu_ids),
        and the effective target follows (see :meth:`_irq_effective`).
        """
        cpus = self._parse_cpus(text, as_list=as_list)
        if not cpus & self.online():
            raise _fail(E.EINVAL, "the set has no online CPU")
        base = f"/proc/irq/{irq}"
        old = self._irq_current(base)
        self.put(f"{base}/smp_affinity_list", format_cpulist(cpus) + "\n")
        self.put(f"{base}/smp_affinity", format_mask(cpus, self.nr_cpu_ids()) + "\n")
        self._irq_effective(base, old, cpus)

    def _irq_current(self, base: str) -> frozenset[int] | None:
        raw = self.get(f"{base}/smp_affinity_list")
        if raw is not None:
            return parse_cpulist(raw)
        raw = self.get(f"{base}/smp_affinity")
        return parse_mask(raw) if raw is not None else None

    def _irq_effective(self, base: str, old: frozenset[int] | None, new: frozenset[int]) -> None:
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
        have = {k: self.get(p) for k, p in files.items()}
        if all(v is None for v in have.values()):
            return
        state = self._load_state()
        saved = state.get(base)
        if saved is None and old is not None and old != new:
            saved = state[base] = {"affinity": format_cpulist(old), **have}
        if saved is not None and parse_cpulist(saved["affinity"] or "") == new:
            for key, path in files.items():
                if saved.get(key) is not None:
                    self.put(path, saved[key] or "")
            del state[base]
        else:
            lst, mask = have["effective_affinity_list"], have["effective_affinity"]
            cur = parse_cpulist(lst) if lst is not None else parse_mask(mask or "0")
            usable = new & self.online()
            if not cur or not cur <= usable:
                target = frozenset({min(usable)})
                self.put(files["effective_affinity_list"], format_cpulist(target) + "\n")
                self.put(files["effective_affinity"], format_mask(target, self.nr_cpu_ids()) + "\n")
        self._save_state(state)

    def _default_affinity(self, hpath: str, text: str) -> None:
        """kernel/irq/proc.c default_affinity_write(): a mask with at least one online CPU."""
        cpus = self._parse_cpus(text, as_list=False)
        if not cpus & self.online():
            raise _fail(E.EINVAL, "the mask has no online CPU")
        self.put(hpath, format_mask(cpus, self.nr_cpu_ids()) + "\n")

    def _load_state(self) -> dict[str, dict[str, str | None]]:
        raw = self.get(f"/{STATE_FILE}")
        return dict(json.loads(raw)) if raw else {}

    def _save_state(self, state: dict[str, dict[str, str | None]]) -> None:
        real = self.real(f"/{STATE_FILE}")
        if state:
            real.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
        elif real.exists():
            real.unlink()

    # -- mounts ----------------------------------------------------------------------------

    def remount(self, point: str, flags: int, data: str) -> None:
        """mount(2) with MS_REMOUNT of the cgroup2 hierarchy at ``point`` (fs/namespace.c
        path_mount() -> do_remount(), kernel/cgroup/cgroup.c cgroup2_parse_param()).

        The super options become exactly ``data``, printed in cgroup_show_options() order; an
        option the kernel does not know is EINVAL (the tree's kernel knows those its
        /sys/kernel/cgroup/features lists, else all of CGROUP2_OPTIONS). The mount's own options
        follow ``flags``; its atime options are kept when ``flags`` gives none. Both the
        mountinfo line and the /proc/mounts line change. Simplified: only cgroup2 is modelled,
        and a remount from a cgroup namespace other than the initial one is not ignored as the
        kernel ignores it (apply_cgroup_root_flags()).
        """
        info = (self.get(mt.MOUNTINFO) or "").splitlines(keepends=True)
        at = [i for i, ln in enumerate(info) if (m := mt.parse_line(ln)) and m.point == point]
        if not at:
            raise _fail(E.EINVAL, f"{point} is not a mount point")  # do_remount(): not the root
        line = info[at[-1]]
        mount = mt.parse_line(line)
        assert mount is not None
        if mount.fstype != "cgroup2":
            raise _fail(E.EINVAL, f"the tree's kernel remounts cgroup2 only, not {mount.fstype}")
        known = (self.get(mt.CGROUP_FEATURES) or "").split() or mt.CGROUP2_OPTIONS
        given = [o for o in data.split(",") if o]
        for opt in given:
            if opt not in known:
                raise _fail(E.EINVAL, f"cgroup2: Unknown parameter '{opt}'")  # fs_parse()
        rw = "ro" if flags & mt.MS_RDONLY else "rw"
        fs_opts = [o for o in mt.CGROUP2_OPTIONS if o in given]
        own = [rw, *_mount_flags(flags, mount.options)]
        pre, _sep, post = line.rstrip("\n").partition(" - ")
        head, tail = pre.split(" "), post.split(" ")
        head[5], tail[2] = ",".join(own), ",".join([rw, *fs_opts])
        info[at[-1]] = " ".join(head) + " - " + " ".join(tail) + "\n"
        self._put_whole(mt.MOUNTINFO, "".join(info))
        # /proc/mounts (show_vfsmnt()): rw/ro, the mount's options, then the filesystem's.
        lines = (self.get("/proc/mounts") or "").splitlines(keepends=True)
        hits = [
            i
            for i, ln in enumerate(lines)
            if ln.split()[2:3] == ["cgroup2"] and mt.unescape(ln.split()[1]) == point
        ]
        if hits:
            f = lines[hits[-1]].rstrip("\n").split(" ")
            f[3] = ",".join([*own, *fs_opts])
            lines[hits[-1]] = " ".join(f) + "\n"
            self._put_whole("/proc/mounts", "".join(lines))

    # -- cgroup v2: directories, controllers, processes --------------------------------------

    def children(self, cg: str) -> list[str]:
        real = self.real(cg)
        return [
            f"{cg}/{n}"
            for n in sorted(os.listdir(real))
            if (real / n).is_dir() and not (real / n).is_symlink()
        ]

    def procs(self, cg: str) -> list[int]:
        return [int(p) for p in (self.get(f"{cg}/cgroup.procs") or "").split()]

    def _has_exclusive(self, mount: str) -> bool:
        """cpuset.cpus.exclusive exists from Linux 6.7: does any cgroup of this tree show it?"""
        return any("cpuset.cpus.exclusive" in files for _d, _s, files in os.walk(self.real(mount)))

    def mkdir(self, hpath: str) -> None:
        """kernel/cgroup/cgroup.c cgroup_mkdir(): a new cgroup comes with its interface files.

        Simplified: only the core files the tuners read and the cpuset files are made.
        """
        mount = self.cgroup2_mount(hpath)
        if mount is None or hpath == mount:
            os.mkdir(self.real(hpath))
            return
        parent = hpath.rsplit("/", 1)[0]
        exclusive = self._has_exclusive(mount)
        os.mkdir(self.real(hpath))
        sub = _ctrls(self.get(f"{parent}/cgroup.subtree_control"))
        self.put(f"{hpath}/cgroup.controllers", format_controllers(sub), create=True)
        self.put(f"{hpath}/cgroup.procs", "", create=True)
        self.put(f"{hpath}/cgroup.subtree_control", "", create=True)
        self.put(f"{hpath}/cgroup.type", "domain\n", create=True)
        if "cpuset" in sub:
            self._add_cpuset_files(hpath, parent, exclusive=exclusive)
            self.recompute_cpusets(mount)

    def rmdir(self, hpath: str) -> None:
        """cgroup_destroy_locked(): EBUSY while it has processes or child cgroups.

        A valid partition is turned back into a member first (cpuset_css_killed()), so its CPUs
        return to the parent.
        """
        mount = self.cgroup2_mount(hpath)
        real = self.real(hpath)
        if mount is None or hpath == mount:
            os.rmdir(real)
            return
        if not real.is_dir():
            raise _fail(E.ENOENT)
        if self.children(hpath):
            raise _fail(E.EBUSY, "the cgroup has child cgroups; remove them first")
        if self.procs(hpath):
            raise _fail(E.EBUSY, "processes are still in the cgroup (cgroup.procs); move them out")
        self.recompute_cpusets(mount, override={hpath: "member"})
        for entry in os.scandir(real):
            os.unlink(entry.path)
        os.rmdir(real)

    def _add_cpuset_files(self, cg: str, parent: str, *, exclusive: bool) -> None:
        files = {
            "cpuset.cpus": "\n",
            "cpuset.cpus.effective": self.get(f"{parent}/cpuset.cpus.effective") or "\n",
            "cpuset.cpus.partition": "member\n",
            "cpuset.mems": "\n",
            "cpuset.mems.effective": self.get(f"{parent}/cpuset.mems.effective") or "\n",
        }
        if exclusive:
            files |= {"cpuset.cpus.exclusive": "\n", "cpuset.cpus.exclusive.effective": "\n"}
        for name, text in files.items():
            if not self.real(f"{cg}/{name}").exists():
                self.put(f"{cg}/{name}", text, create=True)

    def _subtree_control(self, mount: str, cg: str, text: str) -> None:
        """cgroup_subtree_control_write(): "+name" / "-name" tokens, printed in kernel order."""
        enable: set[str] = set()
        disable: set[str] = set()
        for tok in text.split():
            if tok[0] not in "+-" or tok[1:] not in CONTROLLERS:
                raise _fail(E.EINVAL, f"{tok!r}: write +name or -name of a controller")
            (enable if tok[0] == "+" else disable).add(tok[1:])
        if enable & disable:
            raise _fail(E.EINVAL, "a controller is both enabled and disabled")
        missing = enable - _ctrls(self.get(f"{cg}/cgroup.controllers"))
        if missing:
            raise _fail(E.ENOENT, f"{' '.join(sorted(missing))} not in cgroup.controllers here")
        cur = _ctrls(self.get(f"{cg}/cgroup.subtree_control"))
        enable, disable = enable - cur, disable & cur
        kids = self.children(cg)
        for kid in kids:
            if disable & _ctrls(self.get(f"{kid}/cgroup.subtree_control")):
                raise _fail(E.EBUSY, f"{kid} still enables it for its own children")
        if enable and cg != mount and self.procs(cg):
            raise _fail(E.EBUSY, "the cgroup has processes (no internal processes rule)")
        if "cpuset" in disable:  # the children's cpusets go: partitions end first
            self.recompute_cpusets(mount, override=dict.fromkeys(kids, "member"))
        new = (cur | enable) - disable
        self.put(f"{cg}/cgroup.subtree_control", format_controllers(new))
        exclusive = self._has_exclusive(mount)
        for kid in kids:
            self.put(f"{kid}/cgroup.controllers", format_controllers(new))
            if "cpuset" in enable:
                self._add_cpuset_files(kid, cg, exclusive=exclusive)
            if "cpuset" in disable:
                for entry in os.scandir(self.real(kid)):
                    if entry.name.startswith("cpuset.") and entry.is_file():
                        os.unlink(entry.path)
        if "cpuset" in enable:
            self.recompute_cpusets(mount)

    def _procs_write(self, mount: str, cg: str, text: str) -> None:
        """__cgroup_procs_write(): the whole thread group moves to ``cg``.

        Updates the ``0::`` line of /proc/PID/cgroup and of every task, and both cgroup.procs
        files (kept in ascending order; the kernel prints css_set order). Simplified: tasks keep
        their CPU affinity (the kernel applies the new cpuset to them).
        """
        try:
            pid = int(text.strip())
        except ValueError as exc:
            raise _fail(E.EINVAL, "write one process ID") from exc
        base = f"/proc/{pid}"
        if pid <= 0 or not self.real(base).is_dir():
            raise _fail(E.ESRCH, f"no process {pid} in this tree")
        if cg != mount and _ctrls(self.get(f"{cg}/cgroup.subtree_control")):
            raise _fail(E.EBUSY, "controllers are enabled in its cgroup.subtree_control")
        eff = self.get(f"{cg}/cpuset.cpus.effective")
        if eff is not None and not parse_cpulist(eff):
            raise _fail(E.ENOSPC, "its cpuset.cpus.effective is empty")
        rel = "/" + cg[len(mount) :].strip("/")
        old = self.cgroup_of(pid)
        paths = [f"{base}/cgroup"]
        if self.real(f"{base}/task").is_dir():
            paths += [
                f"{base}/task/{t}/cgroup" for t in sorted(os.listdir(self.real(f"{base}/task")))
            ]
        for path in paths:
            lines = (self.get(path) or "").splitlines(keepends=True)
            self.put(path, "".join(f"0::{rel}\n" if ln.startswith("0::") else ln for ln in lines))
        if old is not None and old != rel:
            self._procs_edit(mount if old == "/" else mount + old, pid, add=False)
        self._procs_edit(cg, pid, add=True)

    def cgroup_of(self, pid: int) -> str | None:
        """The cgroup v2 path of a process (its ``0::`` line), None when it has none."""
        for line in (self.get(f"/proc/{pid}/cgroup") or "").splitlines():
            if line.startswith("0::"):
                return line[3:]
        return None

    def _procs_edit(self, cg: str, pid: int, *, add: bool) -> None:
        if self.get(f"{cg}/cgroup.procs") is None:
            return  # not captured in this tree
        pids = [p for p in self.procs(cg) if p != pid]
        if add:
            pids.insert(next((i for i, p in enumerate(pids) if p > pid), len(pids)), pid)
        self.put(f"{cg}/cgroup.procs", "".join(f"{p}\n" for p in pids))

    # -- cgroup v2 cpuset ------------------------------------------------------------------

    def _cpuset_cpus(self, mount: str, cg: str, text: str) -> None:
        """cpuset.c update_cpumask(): a cpulist within cpu_possible_mask."""
        cpus = self._cpuset_list(text)
        if not cpus and parse_cpulist(self.get(f"{cg}/cpuset.cpus") or "") and self._busy(cg):
            # validate_change(): a populated cpuset cannot lose all its CPUs.
            raise _fail(E.ENOSPC, "processes in the cgroup would have no CPU")
        self._refuse_empty_root(
            cg, cpus | parse_cpulist(self.get(f"{cg}/cpuset.cpus.exclusive") or "")
        )
        self.put(f"{cg}/cpuset.cpus", format_cpulist(cpus) + "\n")
        self.recompute_cpusets(mount, touched=cg)

    def _cpuset_exclusive(self, mount: str, cg: str, text: str) -> None:
        """cpuset.c update_exclusive_cpumask(): refused (EINVAL) before anything changes.

        Documentation/admin-guide/cgroup-v2.rst, "cpuset.cpus.exclusive" (and validate_change()):
        the CPUs may not overlap a sibling's cpuset.cpus.exclusive or .exclusive.effective (what
        a valid partition holds, even one made with cpuset.cpus alone), nor include all of the
        cpuset.cpus of a sibling without exclusive CPUs of its own (it would be left none).
        Unlike a cpuset.cpus write, which is taken and invalidates the partitions it overlaps.
        """
        cpus = self._cpuset_list(text)
        if cpus == parse_cpulist(self.get(f"{cg}/cpuset.cpus.exclusive") or ""):
            return  # "Nothing to do if the CPUs didn't change"
        parent = cg.rsplit("/", 1)[0]
        for sib in self.children(parent) if cpus else []:
            if sib == cg:
                continue
            theirs = {
                n: parse_cpulist(self.get(f"{sib}/{n}") or "")
                for n in ("cpuset.cpus.exclusive", "cpuset.cpus.exclusive.effective")
            }
            for name, held in theirs.items():
                if cpus & held:
                    why = f"overlaps {name} of {sib} ({format_cpulist(cpus & held)})"
                    raise _fail(E.EINVAL, why)
            sib_cpus = parse_cpulist(self.get(f"{sib}/cpuset.cpus") or "")
            if sib_cpus and sib_cpus <= cpus and not theirs["cpuset.cpus.exclusive"]:
                raise _fail(E.EINVAL, f"would leave {sib} none of its cpuset.cpus")
        self._refuse_empty_root(cg, cpus | parse_cpulist(self.get(f"{cg}/cpuset.cpus") or ""))
        self.put(f"{cg}/cpuset.cpus.exclusive", format_cpulist(cpus) + "\n")
        self.recompute_cpusets(mount, touched=cg)

    def _refuse_empty_root(self, cg: str, user_x: frozenset[int]) -> None:
        # validate_change(): a load-balanced partition must keep room for deadline bandwidth
        # (cpuset_cpumask_can_shrink(); the fair server's share counts): EBUSY when emptied,
        # as the H200 host's 6.18 kernel answered.
        if not user_x and self.get(f"{cg}/cpuset.cpus.partition") == "root\n":
            raise _fail(
                E.EBUSY, "a valid root partition cannot lose all its CPUs; make it a member first"
            )

    def _partition(self, mount: str, cg: str, text: str) -> None:
        """cpuset.c cpuset_partition_write(): member, root or isolated; validity is computed."""
        want = text.removesuffix("\n")
        if want not in ("member", "root", "isolated"):
            raise _fail(E.EINVAL, "write member, root or isolated")
        self.recompute_cpusets(mount, override={cg: want})

    def _cpuset_list(self, text: str) -> frozenset[int]:
        cpus = self._parse_cpus(text, as_list=True)
        if not cpus <= self.possible():
            raise _fail(E.EINVAL, "CPUs outside cpu/possible")
        return cpus

    def _busy(self, cg: str) -> bool:
        return bool(self.procs(cg)) or any(self._busy(k) for k in self.children(cg))

    def recompute_cpusets(
        self, mount: str, override: dict[str, str] | None = None, touched: str | None = None
    ) -> None:
        """Recompute the derived cpuset files after a write to ``touched`` (a cgroup).

        ``override`` gives requested partition types that replace what the files say (those
        cgroups count as touched). The root's pool is its effective set plus what valid
        partitions hold now, so a round trip restores every file exactly. Validity follows
        update_prstate(), update_parent_effective_cpumask() and validate_change() of
        kernel/cgroup/cpuset.c, for local partitions only (remote ones are not modelled): a
        partition needs a valid partition (or the root) as parent, CPUs that overlap no sibling
        and lie within the parent's, and must leave a parent with tasks a CPU (the root always
        has tasks). Where the kernel's answer depends on history, the files stand in for it, as
        checked against the 6.18 kernel of the H200 host (tests/integration):

        - an invalid partition is looked at again only when it or an ancestor is written;
        - a valid one that a sibling's new cpuset.cpus overlap turns "root invalid" with no
          reason and keeps its cpuset.cpus.exclusive.effective;
        - partitions valid before the change keep their CPUs before newcomers get any.
        """
        top = self._load_cpuset(mount, override or {}, top=True)
        if top is None:
            return
        pool = set(top.effective_now)
        for c in top.children:
            if c.valid_now:
                pool |= c.held()
        new = self._has_exclusive(mount)
        perr = _PERR | {k: v[1] if new else v[0] for k, v in _PERR_67.items()}
        touch = set(override or {}) | ({touched} if touched else set())
        self._settle(top, frozenset(pool), "top", _Pass(perr, touch))

    def _load_cpuset(self, cg: str, override: dict[str, str], *, top: bool) -> _Cpuset | None:
        if self.get(f"{cg}/cpuset.cpus.effective") is None:
            return None
        part = (self.get(f"{cg}/cpuset.cpus.partition") or "member").split()
        was = "root" if top else (part[0] if part else "member")
        valid_now = top or (was != "member" and "invalid" not in part)
        cs = _Cpuset(
            path=cg,
            cpus=parse_cpulist(self.get(f"{cg}/cpuset.cpus") or ""),
            exclusive=parse_cpulist(self.get(f"{cg}/cpuset.cpus.exclusive") or ""),
            want=override.get(cg, was),
            valid_now=valid_now,
            effective_now=parse_cpulist(self.get(f"{cg}/cpuset.cpus.effective") or ""),
            xeff_now=parse_cpulist(self.get(f"{cg}/cpuset.cpus.exclusive.effective") or ""),
            tasks=bool(self.procs(cg)),
        )
        for kid in self.children(cg):
            loaded = self._load_cpuset(kid, override, top=False)
            if loaded is not None:
                cs.children.append(loaded)
        return cs

    def _settle(self, cs: _Cpuset, pool: frozenset[int], kind: str, run: _Pass) -> None:
        """Decide ``cs``'s child partitions, then write effective sets down the tree.

        ``kind``: "top", "valid" (a valid partition), "invalid" or "member".
        """
        taken: set[int] = set()
        accepted: list[_Cpuset] = []
        verdict: dict[str, str | None] = {}
        for c in sorted(cs.children, key=lambda c: (not c.valid_now, c.path)):
            if c.want == "member" or not (c.valid_now or run.revisits(c.path)):
                continue  # stale invalid partitions stay as they are
            err = self._partition_error(cs, c, kind, pool - taken, accepted, run.revisits(c.path))
            if err is None:
                accepted.append(c)
                taken |= c.user_x
            verdict[c.path] = err
        effective = pool - taken if kind in ("top", "valid") else pool
        self._put_cpus(f"{cs.path}/cpuset.cpus.effective", effective)
        for c in cs.children:
            part = f"{c.path}/cpuset.cpus.partition"
            xeff = f"{c.path}/cpuset.cpus.exclusive.effective"
            sub = run.below(c.path)
            if c in accepted:
                self.put(part, f"{c.want}\n")
                self._put_cpus(xeff, c.user_x)
                self._settle(c, c.user_x, "valid", sub)
                continue
            err = verdict.get(c.path, "" if c.want != "member" else None)
            if err is None:  # a member
                self.put(part, "member\n")
                self._put_cpus(xeff, c.exclusive & effective)
            elif err == "SILENT":  # partcmd_invalidate: no reason given, effective_xcpus kept
                self.put(part, f"{c.want} invalid\n")
            elif err:
                self.put(part, f"{c.want} invalid ({run.perr[err]})\n")
                self._put_cpus(xeff, c.exclusive & effective)
            # cgroup v2: an empty or disjoint cpuset.cpus takes the parent's effective CPUs.
            mine = (c.cpus & effective) or effective
            self._settle(c, mine, "member" if c.want == "member" else "invalid", sub)

    @staticmethod
    def _partition_error(
        parent: _Cpuset,
        c: _Cpuset,
        kind: str,
        free: frozenset[int],
        accepted: list[_Cpuset],
        revisited: bool,
    ) -> str | None:
        """The perr_strings key for ``c`` under ``parent`` (None: valid; "SILENT": no reason)."""
        if kind in ("member", "invalid"):
            return "NOTPART" if kind == "member" else "INVPARENT"
        ux = c.user_x
        # validate_change(): an exclusive cpuset may not overlap a sibling. A partition that was
        # valid already only yields to members and to partitions accepted before it.
        overlap = any(
            s is not c
            and s.user_x & ux
            and (s.want == "member" or s in accepted or not c.valid_now)
            for s in parent.children
        )
        busy = parent.tasks or any(
            s.populated() for s in parent.children if s is not c and s not in accepted
        )
        failed = {
            "NOTEXCL": overlap,
            "CPUSEMPTY": not ux,
            "INVCPUS": bool(ux) and not ux <= free,
            "NOCPUS": bool(ux) and not free - ux and (kind == "top" or busy),
        }
        if c.valid_now and not revisited:
            return "SILENT" if overlap else None  # a sibling's write invalidated it
        # update_prstate() checks exclusivity first; a valid partition's own cpumask update
        # (update_cpumask()) reports it last.
        order = ("CPUSEMPTY", "INVCPUS", "NOCPUS", "NOTEXCL")
        if not c.valid_now:
            order = ("NOTEXCL", "CPUSEMPTY", "INVCPUS", "NOCPUS")
        return next((k for k in order if failed[k]), None)


def _mount_flags(flags: int, before: tuple[str, ...]) -> list[str]:
    """The mount's own options after path_mount() with ``flags`` (show_mnt_opts() order).

    relatime is the default unless MS_NOATIME, MS_STRICTATIME clears both, and a remount that
    names no atime flag keeps the mount's ("The default atime for remount is preservation").
    """
    atime = ("noatime", "nodiratime", "relatime")
    given = flags & (mt.MS_NOATIME | mt.MS_NODIRATIME | mt.MS_RELATIME | mt.MS_STRICTATIME)
    out = []
    for name, bit in mt.MOUNT_FLAGS.items():
        if name in atime and not given:
            on = name in before
        elif name == "relatime":
            on = not flags & (mt.MS_NOATIME | mt.MS_STRICTATIME)
        elif name == "noatime":
            on = bool(flags & bit) and not flags & mt.MS_STRICTATIME
        else:
            on = bool(flags & bit)
        if on:
            out.append(name)
    return out


@dataclass(frozen=True)
class _Pass:
    """One recompute: the reason strings, the cgroups written, whether we are below one."""

    perr: dict[str, str]
    touched: set[str]
    under: bool = False

    def revisits(self, path: str) -> bool:
        return self.under or path in self.touched

    def below(self, path: str) -> _Pass:
        return _Pass(self.perr, self.touched, True) if self.revisits(path) else self
