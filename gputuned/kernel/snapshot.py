"""The host's PCI tree, ASPM policy, kernel command line and (when asked) NVML's GPUs, read
once per command: what inspect and plan start from."""

from __future__ import annotations

from dataclasses import dataclass

from gputuned.kernel import Kernel
from gputuned.kernel.nvml import NvmlGpu, read_gpus
from gputuned.kernel.pci import AspmPolicy, PciTopology, read_aspm_policy, read_cmdline, scan


@dataclass(frozen=True)
class Snapshot:
    """Everything inspect and plan read once per command."""

    topo: PciTopology
    nvml: list[NvmlGpu] | None
    aspm: AspmPolicy
    cmdline: str


def snapshot(kernel: Kernel, *, nvml: bool = True, gpu_trees_only: bool = False) -> Snapshot:
    """Read the PCI tree, ASPM policy and command line; NVML only when ``nvml`` (it is slow to
    initialise, and plan needs it only for "uses GPU N" rules and the busy check before MPS)."""
    topo = scan(kernel, gpu_trees_only=gpu_trees_only)
    cmdline = read_cmdline(kernel)
    gpus = read_gpus(kernel) if nvml else None
    return Snapshot(topo, gpus, read_aspm_policy(kernel, topo, cmdline), cmdline)
