"""NVML adapter: GPU names, utilisation and processes as plain data.

NVML is optional. Any failure to load or initialise it (no driver, no library, a tree rather
than the live host) yields ``None``, and callers carry on with what sysfs says.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gputuned.cpulist import CpuListError, parse_cpulist
from gputuned.kernel import Kernel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    bdf: str  # lower-case, 4-digit domain, as sysfs names it
    name: str
    utilization_gpu: int | None  # percent over the driver's last sample period
    pids: tuple[int, ...]  # compute and graphics processes using it
    #: CPUs NVML calls ideal for this GPU (nvmlDeviceGetCpuAffinity); None if it did not say.
    cpu_affinity: frozenset[int] | None = None
    #: "GPU-8f3c..." (nvmlDeviceGetUUID): what CUDA_VISIBLE_DEVICES may name it by.
    uuid: str | None = None
    #: Minor number of its /dev/nvidiaN node (nvmlDeviceGetMinorNumber).
    minor: int | None = None


def _norm_bdf(bus_id: str) -> str:
    # NVML prints "00000000:00:06.0" (8-digit domain); sysfs uses 4 digits.
    dom, bus, devfn = bus_id.lower().split(":")
    return f"{int(dom, 16):04x}:{bus}:{devfn}"


def _cpu_affinity(pynvml: Any, handle: Any, index: int, nr_cpus: int) -> frozenset[int] | None:
    """nvmlDeviceGetCpuAffinity: the GPU's ideal CPUs as 64-bit words (nvml.h: an array of
    unsigned long, CPU n at bit n % 64 of word n // 64)."""
    try:
        words = pynvml.nvmlDeviceGetCpuAffinity(handle, (nr_cpus + 63) // 64)
    except Exception as exc:
        log.debug("nvml: nvmlDeviceGetCpuAffinity failed for GPU %d: %s", index, exc)
        return None
    return frozenset(
        64 * w + bit for w, value in enumerate(words) for bit in range(64) if int(value) >> bit & 1
    )


def _optional(pynvml: Any, getter: str, handle: Any) -> Any:
    """One more NVML answer, None where the driver or the binding has none."""
    try:
        value = getattr(pynvml, getter)(handle)
    except Exception as exc:
        log.debug("nvml: %s failed: %s", getter, exc)
        return None
    return value.decode() if isinstance(value, bytes) else value


def _saved_affinity(value: object) -> frozenset[int] | None:
    """A tree's saved affinity (a cpulist, as capture writes it); anything else is unknown."""
    if not isinstance(value, str):
        return None
    try:
        return parse_cpulist(value)
    except CpuListError:
        return None


def read_gpus(kernel: Kernel) -> list[NvmlGpu] | None:
    """GPUs as NVML sees them, or ``None`` when NVML is unavailable.

    On a tree, what NVML said at capture time (``nvml`` in gputuned-tree.json), if anything.
    """
    if not kernel.nvml:
        saved = kernel.recorded_nvml
        if saved is None:
            return None
        return [
            NvmlGpu(
                g["index"],
                g["bdf"],
                g["name"],
                g.get("utilization_gpu"),
                tuple(g.get("pids", ())),
                _saved_affinity(g.get("cpu_affinity")),
                g.get("uuid"),
                g.get("minor"),
            )
            for g in saved
        ]
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses for every cause
        log.debug("nvml: not available: %s", exc)
        return None
    possible = kernel.read_optional("/sys/devices/system/cpu/possible")
    nr_cpus = max(parse_cpulist(possible), default=1023) + 1 if possible else 1024
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            bus = bus.decode() if isinstance(bus, bytes) else bus
            try:
                util: int | None = int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:
                util = None
            pids: set[int] = set()
            for getter in (
                "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetGraphicsRunningProcesses",
            ):
                try:
                    pids.update(p.pid for p in getattr(pynvml, getter)(h))
                except Exception as exc:
                    log.debug("nvml: %s failed for GPU %d: %s", getter, i, exc)
            out.append(
                NvmlGpu(
                    i,
                    _norm_bdf(bus),
                    name.decode() if isinstance(name, bytes) else str(name),
                    util,
                    tuple(sorted(pids)),
                    _cpu_affinity(pynvml, h, i, nr_cpus),
                    _optional(pynvml, "nvmlDeviceGetUUID", h),
                    _optional(pynvml, "nvmlDeviceGetMinorNumber", h),
                )
            )
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvml: shutdown failed: %s", exc)
