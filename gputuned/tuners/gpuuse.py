"""Which GPUs a process uses: NVML's process list, its open device nodes and its environment.

Three signals, strongest first (the reads are in host/gpuuse.py and host/nvml.py):

1. **NVML** lists the processes with a context on each GPU: the GPUs a process computes on.
2. **Open device nodes** ``/dev/nvidiaN`` (char major 195, minor N), mapped to a GPU by the minor
   number NVML reports for it, else by the driver's ``/proc/driver/nvidia/gpus/BDF/information``.
   The CUDA driver may hold nodes of every GPU the process can see, so where the environment
   names fewer GPUs, only those count.
3. **The environment at exec**: ``NVIDIA_VISIBLE_DEVICES`` (the GPUs a container was given: NVML
   indexes or UUIDs, "all"), then ``CUDA_VISIBLE_DEVICES`` among those (CUDA indexes or UUIDs,
   prefixes allowed, read up to the first entry that names no GPU, as CUDA does). A CUDA index
   counts in CUDA's order: PCI bus order with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, else "fastest
   first", which CUDA's documentation leaves unspecified among equal devices. gputuned takes
   PCI bus order where all visible GPUs are one model (equal devices, nothing to rank) and
   does not map CUDA indexes at all where models differ: such a process is placed once it
   opens its GPU (NVML or its device nodes), and the plan says so. ``MIG-`` UUIDs name a slice,
   not a GPU NVML lists here: not mapped either.

The first signal that names any GPU is the answer (the environment only narrows the device
nodes). A process that opens a GPU later than its exec is placed when gputuned next looks:
the daemon reads the device nodes of the processes it placed every ``[daemon]
gpu_scan_interval_s`` and NVML every ``nvml_interval_s`` (docs/multi-gpu.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gputuned.kernel import Kernel
from gputuned.kernel.gpuuse import device_minors, driver_minors, gpu_environ
from gputuned.kernel.nvml import NvmlGpu
from gputuned.kernel.topology import GpuRef


@dataclass(frozen=True)
class Gpu:
    """One GPU as the mapping sees it: gputuned's index, PCI address, NVML's UUID and minor."""

    index: int
    bdf: str
    uuid: str | None = None
    minor: int | None = None
    name: str = ""


def _entries(value: str) -> list[str]:
    return [e.strip() for e in value.split(",")]


def _index(entry: str) -> int | None:
    """A decimal index (ASCII digits only: str.isdigit() also takes "²", which int() refuses)."""
    return int(entry) if entry.isascii() and entry.isdigit() else None


def _by_uuid(entry: str, among: Sequence[Gpu]) -> Gpu | None:
    """The one GPU whose UUID starts with ``entry`` ("GPU-8f3c" or the whole UUID), as CUDA
    accepts a unique prefix; None for no GPU or several."""
    hits = [g for g in among if g.uuid and g.uuid.lower().startswith(entry.lower())]
    return hits[0] if len(hits) == 1 else None


def container_gpus(value: str | None, gpus: Sequence[Gpu]) -> tuple[list[Gpu], str]:
    """The GPUs ``NVIDIA_VISIBLE_DEVICES`` gives (the container runtime reads it with the host's
    NVML indexes or UUIDs), in PCI order, and a note when part of it could not be mapped."""
    bus = sorted(gpus, key=lambda g: g.bdf)
    if value is None or value.strip() in ("", "all"):
        return bus, ""
    if value.strip() in ("none", "void"):
        return [], ""
    out: list[Gpu] = []
    by_index = {g.index: g for g in gpus}
    for entry in _entries(value):
        n = _index(entry)
        g = by_index.get(n) if n is not None else _by_uuid(entry, gpus)
        if g is None:
            return sorted(out, key=lambda x: x.bdf), f"NVIDIA_VISIBLE_DEVICES entry {entry[:40]!r}"
        out.append(g)
    return sorted(set(out), key=lambda x: x.bdf), ""


def env_gpus(env: dict[str, str], gpus: Sequence[Gpu]) -> tuple[frozenset[int] | None, str]:
    """The GPUs (gputuned's indexes) a process's environment lets it use; None when it says
    nothing this host can map, with the reason ("" when the variables are simply unset)."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    nvd = env.get("NVIDIA_VISIBLE_DEVICES")
    if cvd is None and nvd is None:
        return None, ""
    visible, unmapped = container_gpus(nvd, gpus)
    if unmapped:
        return None, f"{unmapped} names no GPU of this host"
    if cvd is None:
        return frozenset(g.index for g in visible), ""
    if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID":
        order = visible
    elif len({g.name for g in visible}) <= 1:
        order = visible  # one model: nothing to rank "fastest"; see the module docstring
    else:
        order = []
    out: set[int] = set()
    for entry in _entries(cvd):
        n = _index(entry)
        if n is not None:
            if not order and visible:
                return None, (
                    "CUDA_VISIBLE_DEVICES counts in CUDA's fastest-first order, which gputuned "
                    "cannot know with GPUs of several models (set CUDA_DEVICE_ORDER=PCI_BUS_ID)"
                )
            if n >= len(order):
                break  # CUDA ignores an invalid entry and every one after it
            out.add(order[n].index)
            continue
        if entry.startswith("MIG-"):
            return None, "CUDA_VISIBLE_DEVICES names a MIG instance, not a whole GPU"
        g = _by_uuid(entry, visible)
        if g is None:
            break
        out.add(g.index)
    return frozenset(out), ""


@dataclass
class GpuUse:
    """GPU use of processes on one host, each read once (memoised), lazily: most processes a
    plan sees are never asked about."""

    host: Kernel
    gpus: tuple[Gpu, ...]
    nvml_pids: dict[int, frozenset[int]] = field(default_factory=dict)  # pid -> GPU indexes
    minor_index: dict[int, int] = field(default_factory=dict)  # device minor -> GPU index
    #: Why a process's environment was not mapped, by PID (the plan reports it).
    unmapped: dict[int, str] = field(default_factory=dict)
    #: PIDs whose answer came from NVML or an open device node: they have their GPU.
    opened: set[int] = field(default_factory=set)
    _memo: dict[int, frozenset[int]] = field(default_factory=dict)

    def of(self, pid: int) -> frozenset[int]:
        """The GPUs (gputuned's indexes) ``pid`` uses now; see the module docstring."""
        got = self._memo.get(pid)
        if got is None:
            got = self._memo[pid] = self._read(pid)
        return got

    def _read(self, pid: int) -> frozenset[int]:
        self.opened.discard(pid)
        by_nvml = self.nvml_pids.get(pid, frozenset())
        if by_nvml:
            self.opened.add(pid)
            return by_nvml
        if not self.gpus:
            return frozenset()
        nodes = frozenset(
            self.minor_index[m] for m in device_minors(self.host, pid) if m in self.minor_index
        )
        env, why = env_gpus(gpu_environ(self.host, pid), self.gpus)
        if why:
            self.unmapped[pid] = why
        if nodes:
            self.opened.add(pid)
            narrowed = nodes & env if env else nodes
            return narrowed or nodes
        return env or frozenset()

    def forget(self, pids: set[int] | None = None) -> None:
        """Read these processes (all: None) again when next asked: they may have opened a GPU."""
        if pids is None:
            self._memo.clear()
        else:
            for pid in pids:
                self._memo.pop(pid, None)


def gpu_use(host: Kernel, refs: Sequence[GpuRef], nvml: list[NvmlGpu] | None) -> GpuUse:
    """A :class:`GpuUse` for ``host``: its GPUs (``refs``, gputuned's indexes), NVML's answers
    where NVML is there, the driver's minor numbers where it is not."""
    by_bdf = {g.bdf: g for g in nvml or []}
    gpus = tuple(
        Gpu(
            r.index,
            r.bdf,
            by_bdf[r.bdf].uuid if r.bdf in by_bdf else None,
            by_bdf[r.bdf].minor if r.bdf in by_bdf else None,
            by_bdf[r.bdf].name if r.bdf in by_bdf else r.name,
        )
        for r in refs
    )
    index_of = {g.bdf: g.index for g in gpus}
    pids: dict[int, set[int]] = {}
    for n in nvml or []:
        if n.bdf in index_of:
            for pid in n.pids:
                pids.setdefault(pid, set()).add(index_of[n.bdf])
    minors = {g.minor: g.index for g in gpus if g.minor is not None}
    if not minors and refs:
        minors = {m: index_of[b] for m, b in driver_minors(host).items() if b in index_of}
    return GpuUse(host, gpus, {p: frozenset(s) for p, s in pids.items()}, minors)
