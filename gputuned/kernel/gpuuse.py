"""Which GPUs a process uses, as the kernel shows it: its open files and its environment.

NVML's process list (host/nvml.py) names the processes that have a context on a GPU. Two more
signals come from /proc, for hosts without NVML and for processes that have not made a context
yet:

- ``/proc/PID/fd``: the NVIDIA driver's per-GPU device nodes are character devices of major 195
  with the GPU's minor number (``/dev/nvidiaN``: minor N). The same major carries the control
  node ``nvidiactl`` (minor 255) and ``nvidia-modeset`` (minor 254), which name no GPU;
  ``nvidia-uvm`` has a major of its own. The device number is read from the open file itself
  (stat(2) follows the ``fd`` link to the inode), so a container's own ``/dev`` names do not
  matter. A CUDA process may hold nodes of GPUs it does not compute on (the driver opens the
  visible ones as it enumerates them), so this is an upper bound.
- ``/proc/PID/environ``: the environment the process was started with (proc(5): it does not
  change after exec). ``CUDA_VISIBLE_DEVICES``, ``NVIDIA_VISIBLE_DEVICES`` and
  ``CUDA_DEVICE_ORDER`` say which GPUs it may use, before it has opened any.

Other users' processes are hostile input: a process can hold many thousands of descriptors and
an environment of megabytes. Both reads are bounded (:data:`FD_LIMIT`, :data:`ENVIRON_LIMIT`),
and a process that exits or that gputuned may not read yields nothing, never an error.

The driver maps minor numbers to PCI functions in ``/proc/driver/nvidia/gpus/BDF/information``
("Device Minor:"); :func:`driver_minors` reads it for hosts without NVML.

On a tree (not the live host) an ``fd`` entry is a symbolic link to the device's path, and
``char_devices`` in gputuned-tree.json gives each path's ``[major, minor]``: a tree cannot
hold device nodes, and following the link would leave the tree.
"""

from __future__ import annotations

from gputuned import errors
from gputuned.kernel import Kernel

#: The NVIDIA driver's character major (Documentation/admin-guide/devices.txt: 195 "Nvidia
#: graphics devices"); minors 254 (nvidia-modeset) and 255 (nvidiactl) are no GPU.
NVIDIA_MAJOR = 195
FIRST_NON_GPU_MINOR = 254
#: Descriptors examined per process: a server holds a few hundred; past this, the rest are
#: not looked at (a process with more is not read further, whatever it holds).
FD_LIMIT = 8192
#: Bytes of /proc/PID/environ read: the kernel lets an environment be far larger (up to a
#: quarter of the stack limit); the variables that matter sit among the first few KiB.
ENVIRON_LIMIT = 256 * 1024
#: The variables read from the environment.
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
#: Longest value kept of one of them (a list of 64 UUIDs is about 2.6 KiB).
VALUE_LIMIT = 4096


def device_minors(host: Kernel, pid: int) -> frozenset[int]:
    """Minor numbers of the per-GPU device nodes ``pid`` has open (``/dev/nvidiaN``: N).

    Empty when the process has none, has exited, or its descriptors are not ours to read.
    """
    base = f"/proc/{pid}/fd"
    try:
        names = host.listdir(base)
    except errors.HostError:
        return frozenset()
    found = set()
    for name in names[:FD_LIMIT]:
        if not name.isdigit():
            continue
        num = host.char_device(f"{base}/{name}")
        if num is not None and num[0] == NVIDIA_MAJOR and num[1] < FIRST_NON_GPU_MINOR:
            found.add(num[1])
    return frozenset(found)


def gpu_environ(host: Kernel, pid: int) -> dict[str, str]:
    """The GPU variables of ``pid``'s environment at exec (:data:`GPU_VARIABLES`); empty when
    unreadable. Values are cut to :data:`VALUE_LIMIT` and must be printable ASCII."""
    return environ_values(host, pid, GPU_VARIABLES)


def environ_values(host: Kernel, pid: int, names: tuple[str, ...]) -> dict[str, str]:
    """The variables ``names`` of ``pid``'s environment at exec, the first of each; empty when
    unreadable. Any user writes their own environment: at most :data:`ENVIRON_LIMIT` bytes are
    read, values are cut to :data:`VALUE_LIMIT` and must be printable ASCII."""
    try:
        data = host.read_bytes(f"/proc/{pid}/environ", size=ENVIRON_LIMIT)
    except errors.HostError:
        return {}  # exited, or another user's (environ needs ptrace access: proc(5))
    out: dict[str, str] = {}
    for entry in data.split(b"\0"):
        key, eq, value = entry.partition(b"=")
        if not eq:
            continue
        name = key.decode("ascii", errors="replace")
        if name in names and name not in out:
            text = value[:VALUE_LIMIT].decode("ascii", errors="replace")
            if text.isprintable():
                out[name] = text
    return out


def driver_minors(host: Kernel) -> dict[int, str]:
    """Minor number -> PCI address of each GPU the NVIDIA driver lists in
    /proc/driver/nvidia/gpus/BDF/information ("Device Minor:"); empty without the driver."""
    base = "/proc/driver/nvidia/gpus"
    try:
        bdfs = host.listdir(base)
    except errors.HostError:
        return {}
    out: dict[int, str] = {}
    for bdf in bdfs:
        try:
            text = host.read_text(f"{base}/{bdf}/information")
        except errors.HostError:
            continue
        for line in text.splitlines()[:64]:
            key, _, value = line.partition(":")
            if key.strip() == "Device Minor" and value.strip().isdigit():
                out[int(value.strip())] = bdf.lower()
    return out
