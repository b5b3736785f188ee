"""QEMU with TCG: the e2e guest's PCIe machine, booted on a per-run overlay of the cached image.

What /work/shared/E2E.md found on the CI machine kind, and what this module therefore does:

- KVM cannot boot a stock kernel here: ``-accel tcg,thread=single -cpu max`` (one host thread
  runs the 4 vCPUs in turn). Not ``thread=multi``: with a host thread per vCPU the guest kernel
  died now and then in the middle of a boot with "Oops: int3" in ordinary kernel code
  (kmem_cache_alloc_node in kthreadd, after userspace had started), most likely the int3
  that x86 text patching (static keys, which nohz_full and cpuset partitions toggle) plants
  for a moment, run by another vCPU whose translated code had not caught up (not proven). One
  thread runs one vCPU at a time, so a patch is seen by all before any runs on; the lane
  passed 16 of 16 phases so.
- Direct kernel boot (``-kernel``/``-initrd``/``-append``): the kernel command line is ours to
  set, which is the "bootloader configuration" this guest has (``gputunectl bootargs`` output
  is appended for the boot-arguments step).
- ``-no-reboot``: a guest reboot ends QEMU, and :meth:`Machine.boot` starts it again on the same
  overlay. ``-nic none``: the guest has no network and the host's is never touched (the e1000e
  below has no backend at all).
- Commands go through qemu-guest-agent on a virtio-serial port (:mod:`tests.e2e.vm.qga`).

The PCIe tree (``-machine q35``)::

    00:03.0 pcie-root-port rp1
      01:00.0 x3130-upstream (switch upstream port)
        02:00.0 xio3130-downstream -> 03:00.0 nvme          (endpoint, kernel-managed IRQs)
        02:01.0 xio3130-downstream -> 04:00.0 e1000e        (endpoint; reads as a GPU, fakegpu)
    00:04.0 pcie-root-port rp2 -> 05:00.0 virtio-serial     (the guest agent's channel)
    00:05.0 virtio-blk (root disk, on the root bus)
    00:06.0 pxb-pcie (NUMA node 0): root bus 20
      20:00.0 pcie-root-port -> 21:00.0 e1000e            (a GPU of node 0 in the NUMA phase)
    00:07.0 pxb-pcie (NUMA node 1): root bus 40
      40:00.0 pcie-root-port -> 41:00.0 e1000e            (a GPU of node 1 in the NUMA phase)

Two NUMA nodes (``-numa``): CPUs 0 and 2 with 512 MiB on node 0, CPUs 1 and 3 with 512 MiB on
node 1 (four sockets of one CPU, so no socket is split between nodes). Interleaved, so that the
partition of CPUs 2-3 the lane's first phases make leaves a CPU of each node outside it
(gputuned refuses a layout that leaves a node no housekeeping core). A PCIe expander bridge
(``pxb-pcie``) is a host bridge of its own with a ``numa_node``, which QEMU's ACPI tables give
as the bridge's proximity domain (_PXM): the guest kernel puts the functions behind it on that
node (sysfs ``numa_node``, ``local_cpulist``). The functions on the main root bus have no
proximity domain (``numa_node`` -1, local to every CPU), so the first phases see what they saw
on a one-node guest.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.vm.image import USERSPACE_MARK, Image, run
from tests.e2e.vm.qga import AgentError, GuestAgent, GuestResult

BASE_APPEND = (
    "console=ttyS0",
    "root=/dev/vda",
    "rw",
    "panic=-1",
    # Boot time under TCG: no TSC calibration, no speculation mitigations (every syscall pays
    # for them in emulation), no fsck, kernel and systemd messages at warning level and up only.
    "tsc=reliable",
    "mitigations=off",
    "fsck.mode=skip",
    "quiet",
)
PCIE_TOPOLOGY = (
    "-device", "pcie-root-port,id=rp1,bus=pcie.0,chassis=1,slot=1,addr=0x3",
    "-device", "x3130-upstream,id=up1,bus=rp1",
    "-device", "xio3130-downstream,id=dn1,bus=up1,chassis=2,slot=0",
    "-device", "xio3130-downstream,id=dn2,bus=up1,chassis=3,slot=1",
    "-device", "nvme,bus=dn1,drive=nvm,serial=gputuned0",
    "-device", "e1000e,bus=dn2",
    "-device", "pcie-root-port,id=rp2,bus=pcie.0,chassis=4,slot=2,addr=0x4",
    "-device", "virtio-serial-pci,bus=rp2",
)  # fmt: skip
#: One expander bridge per NUMA node, each with an e1000e behind a root port of its own.
NUMA_PCIE = (
    "-device", "pxb-pcie,id=pxb0,bus_nr=0x20,numa_node=0,bus=pcie.0,addr=0x6",
    "-device", "pcie-root-port,id=rp3,bus=pxb0,chassis=5,slot=3,addr=0x0",
    "-device", "e1000e,bus=rp3",
    "-device", "pxb-pcie,id=pxb1,bus_nr=0x40,numa_node=1,bus=pcie.0,addr=0x7",
    "-device", "pcie-root-port,id=rp4,bus=pxb1,chassis=6,slot=4,addr=0x0",
    "-device", "e1000e,bus=rp4",
)  # fmt: skip


def numa_args(smp: int, mem_mb: int, nodes: bool = True) -> list[str]:
    """Two NUMA nodes, CPUs interleaved (even CPUs on node 0, odd on node 1), memory halved;
    ``nodes`` False: plain ``-smp`` (a caller that lays out nodes of its own)."""
    if not nodes:
        return ["-smp", str(smp)]
    out = ["-smp", f"{smp},sockets={smp},cores=1,threads=1"]
    for node in (0, 1):
        out += ["-object", f"memory-backend-ram,id=mem{node},size={mem_mb // 2}M"]
        cpus = ",".join(f"cpus={c}" for c in range(node, smp, 2))
        out += ["-numa", f"node,nodeid={node},{cpus},memdev=mem{node}"]
    return out


class MachineError(AssertionError):
    pass


def remove_stale_runs(runs: Path) -> list[str]:
    """Run folders of earlier runs whose QEMU is gone (a killed pytest): removed; returns them.

    A folder whose recorded QEMU still runs belongs to a run going on now, and stays.
    """
    removed = []
    for d in sorted(runs.glob("run-*")):
        try:
            pid = int((d / "qemu.pid").read_text())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(d).encode() in f.read():
                    continue
        except (OSError, ValueError):
            pass
        if time.time() - d.stat().st_mtime < 60 and not (d / "qemu.pid").exists():
            continue  # just created by a run that has not started QEMU yet
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d.name)
    return removed


#: Seconds a boot may take to print USERSPACE_MARK before it counts as dead in the kernel
#: (under TCG the mark comes 5-15 s after QEMU starts).
EARLY_DEATH_S = 120.0


@dataclass
class Boot:
    number: int
    append: str
    qemu_to_agent_s: float = 0.0
    qemu_to_running_s: float = 0.0
    state: str = ""
    #: Why an earlier attempt of this boot was given up (it died before userspace), if one was.
    retried: str = ""


class EarlyDeath(MachineError):
    """The guest died (or hung) in its kernel before any program of it ran."""


@dataclass
class Machine:
    image: Image
    workdir: Path
    smp: int = 4
    mem_mb: int = 1024
    #: Two NUMA nodes (numa_args); tests/data/topology/capture.py lays out its own.
    numa: bool = True
    proc: subprocess.Popen[bytes] | None = None
    agent: GuestAgent | None = None
    boots: list[Boot] = field(default_factory=list)
    #: Every command run in the guest, with its exit code and seconds (commands.log of a run).
    history: list[GuestResult] = field(default_factory=list)

    @property
    def overlay(self) -> Path:
        return self.workdir / "overlay.qcow2"

    @property
    def socket(self) -> Path:
        return self.workdir / "qga.sock"

    def create_disks(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        run(
            [
                "qemu-img", "create", "-q", "-f", "qcow2",
                "-b", self.image.root, "-F", "raw", self.overlay,
            ]
        )  # fmt: skip
        with (self.workdir / "nvme.img").open("wb") as f:
            f.truncate(64 << 20)

    def argv(self, append: str, console: Path) -> list[str]:
        w = self.workdir
        return [
            "qemu-system-x86_64",
            "-name", "gputuned-e2e-vm",
            "-nodefaults", "-no-user-config", "-display", "none",
            "-machine", "q35", "-accel", "tcg,thread=single", "-cpu", "max",
            *numa_args(self.smp, self.mem_mb, self.numa), "-m", str(self.mem_mb),
            "-no-reboot", "-nic", "none",
            "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd),
            "-append", append,
            "-serial", f"file:{console}",
            "-drive", f"file={self.overlay},if=none,id=root,format=qcow2,cache=unsafe,discard=unmap",
            "-device", "virtio-blk-pci,drive=root,bus=pcie.0,addr=0x5",
            "-drive", f"file={w / 'nvme.img'},if=none,id=nvm,format=raw,cache=unsafe",
            *PCIE_TOPOLOGY,
            *(NUMA_PCIE if self.numa else ()),
            "-chardev", f"socket,path={self.socket},server=on,wait=off,id=qga0",
            "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
        ]  # fmt: skip

    # ---- life cycle -------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def boot(self, extra_append: str = "", timeout: float = 300) -> Boot:
        """Start QEMU and wait for the agent and ``systemctl is-system-running --wait``.

        A boot that dies in the kernel before the guest's first program runs (no
        USERSPACE_MARK on its console: a TCG-only oops such as an int3 in sched_clock_cpu was
        seen once at 3.8 s uptime) is retried once on the same overlay, and ``Boot.retried``
        says why: nothing of the guest, gputuned included, ran in it. A boot that reached
        userspace is never retried; its failure is the test's.
        """
        append = " ".join([*BASE_APPEND, *extra_append.split()])
        b = Boot(len(self.boots) + 1, append)
        self.boots.append(b)
        try:
            self._start(b, timeout, attempt=1)
        except EarlyDeath as exc:
            b.retried = str(exc).splitlines()[0]
            self.kill()
            self._start(b, timeout, attempt=2)
        return b

    def _start(self, b: Boot, timeout: float, attempt: int) -> None:
        if self.alive:
            raise MachineError("boot: QEMU is still running")
        self.socket.unlink(missing_ok=True)
        suffix = f"-{attempt}" if attempt > 1 else ""
        console = self.workdir / f"console-{b.number}{suffix}.log"
        log = (self.workdir / f"qemu-{b.number}{suffix}.log").open("wb")
        t0 = time.monotonic()
        # setpriv --pdeathsig: QEMU gets SIGKILL when the test process dies, however it dies,
        # so a killed pytest leaves no QEMU behind either (setpriv execs QEMU: same PID).
        self.proc = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "--", *self.argv(b.append, console)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        (self.workdir / "qemu.pid").write_text(f"{self.proc.pid}\n")
        deadline = t0 + timeout
        while not self.socket.exists():
            if not self.alive:
                raise MachineError(f"QEMU exited at start:\n{self.qemu_log(b.number)}")
            if time.monotonic() > deadline:
                raise MachineError("QEMU made no agent socket")
            time.sleep(0.05)
        self.agent = GuestAgent(self.socket)

        def going() -> bool:
            """QEMU runs, and the guest reached userspace or still may in time."""
            early = time.monotonic() - t0 < EARLY_DEATH_S or _userspace_seen(console)
            return self.alive and early

        try:
            self.agent.sync(timeout=max(1.0, deadline - time.monotonic()), alive=going)
        except AgentError as exc:
            tail = self.console_tail(path=console)
            if not _userspace_seen(console):
                state = "exited" if not self.alive else f"hung {EARLY_DEATH_S:.0f} s"
                raise EarlyDeath(
                    f"boot {b.number} attempt {attempt}: the guest kernel {state} before "
                    f"userspace ({_kernel_fault(console)})\n{tail}"
                ) from exc
            raise MachineError(f"boot {b.number}: {exc}\n{tail}") from exc
        b.qemu_to_agent_s = time.monotonic() - t0
        res = self.agent.run(
            ["systemctl", "is-system-running", "--wait"],
            timeout=max(1.0, deadline - time.monotonic()),
        )
        b.state = res.out.strip()
        b.qemu_to_running_s = time.monotonic() - t0

    def wait_exit(self, timeout: float = 180) -> float:
        """Wait for QEMU to end by itself (guest reboot or poweroff); seconds waited."""
        assert self.proc is not None
        t0 = time.monotonic()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise MachineError(
                f"QEMU still running {timeout:.0f} s after the guest was told to stop\n"
                f"{self.console_tail()}"
            ) from exc
        if self.agent is not None:
            self.agent.close()
            self.agent = None
        return time.monotonic() - t0

    def reboot(self, extra_append: str = "", *, poweroff: bool = False) -> tuple[float, Boot]:
        """``systemctl reboot`` (or poweroff) in the guest, then boot again on the same overlay."""
        verb = "poweroff" if poweroff else "reboot"
        self.agent_or_fail().spawn(["systemctl", verb])
        down = self.wait_exit()
        return down, self.boot(extra_append)

    def kill(self) -> None:
        """SIGKILL our QEMU by its PID (never by name) and reap it."""
        if self.agent is not None:
            self.agent.close()
            self.agent = None
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    # ---- commands ---------------------------------------------------------------------------

    def agent_or_fail(self) -> GuestAgent:
        if self.agent is None or not self.alive:
            raise MachineError("the guest is not running")
        return self.agent

    def sh(self, script: str, *, timeout: float = 120, check: bool = True) -> GuestResult:
        res = self.agent_or_fail().sh(script, timeout=timeout)
        self.history.append(res)
        if check and res.rc != 0:
            raise MachineError(f"command failed in the guest:\n{res}")
        return res

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None:
        agent = self.agent_or_fail()
        agent.sh(f"mkdir -p '{os.path.dirname(path)}'")
        agent.write_file(path, data, mode)

    def get(self, path: str) -> bytes:
        return self.agent_or_fail().read_file(path)

    # ---- logs -------------------------------------------------------------------------------

    def console_tail(self, lines: int = 40, path: Path | None = None) -> str:
        p = path or self.workdir / f"console-{len(self.boots)}.log"
        if not p.exists():
            return "(no console log)"
        text = p.read_text(errors="replace").splitlines()
        return "--- guest console (last lines)\n" + "\n".join(text[-lines:])

    def write_history(self, path: Path) -> None:
        with path.open("w") as f:
            for r in self.history:
                f.write(f"{r.seconds:7.2f} s  exit {r.rc:3d}  {r.cmd}\n")

    def qemu_log(self, number: int) -> str:
        p = self.workdir / f"qemu-{number}.log"
        return p.read_text(errors="replace") if p.exists() else ""


def _userspace_seen(console: Path) -> bool:
    try:
        return USERSPACE_MARK.encode() in console.read_bytes()
    except OSError:
        return False


def _kernel_fault(console: Path) -> str:
    """The console's first line that names a kernel fault, for the report."""
    try:
        lines = console.read_text(errors="replace").splitlines()
    except OSError:
        return "no console log"
    signs = ("Oops", "BUG:", "Kernel panic", "general protection", "int3", "RIP:")
    return next((ln.strip() for ln in lines if any(s in ln for s in signs)), "no fault printed")
