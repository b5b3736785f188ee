"""The noise: CPU burners, loopback TCP streams and fsync'd writers, each a process of its own
(``noisy_neighbor.py --role cpu|net|disk``), bounded in time, counting the work it did."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness.children import Children
from harness.repo import ROLE_SCRIPT

#: "none": the noisy windows run on a quiet host (the matrix's baseline, benchmarks/matrix.py).
NOISE_PARTS: dict[str, tuple[str, ...]] = {
    "none": (),
    "cpu": ("cpu",),
    "net": ("net",),
    "disk": ("disk",),
    "heavy": ("cpu", "net", "disk"),
}


class WorkCounter:
    """The work a noise process did (iterations, bytes sent, bytes fsync'd): a 64-bit count in
    a shared-memory file that the process adds to and the benchmark reads (issue 20, item 3)."""

    def __init__(self, path: str | None) -> None:
        import mmap

        self.map = None
        if path:
            with open(path, "r+b") as f:  # noqa: PTH123
                self.map = mmap.mmap(f.fileno(), 8)
        self.n = 0

    def add(self, n: int) -> None:
        self.n += n
        if self.map is not None:
            self.map[:8] = self.n.to_bytes(8, "little")


def role_cpu(deadline: float, work: WorkCounter) -> None:
    while time.time() < deadline:
        for _ in range(200_000):
            pass
        work.add(200_000)


def role_net(deadline: float, work: WorkCounter) -> None:
    """One loopback TCP stream, sender and receiver in this process (127.0.0.1 only)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        cli = socket.create_connection(srv.getsockname())
        conn, _ = srv.accept()

    def sink() -> None:
        while conn.recv(1 << 20):
            pass

    threading.Thread(target=sink, daemon=True).start()
    chunk = b"n" * 65536
    while time.time() < deadline:
        cli.sendall(chunk)
        work.add(len(chunk))
    cli.close()


def role_disk(deadline: float, directory: str, work: WorkCounter) -> None:
    """1 MiB writes, each followed by fsync, over a 64 MiB file in ``directory``."""
    path = Path(directory) / f"noise-{os.getpid()}.bin"
    block = os.urandom(1 << 20)
    with path.open("wb", buffering=0) as f:
        while time.time() < deadline:
            f.write(block)
            os.fsync(f.fileno())
            work.add(len(block))
            if f.tell() >= 64 << 20:
                f.seek(0)
    path.unlink()


class Noise:
    """One noise kind: ``cpu``, ``net``, ``disk`` or ``heavy`` (all three).

    ``cgroup`` (``--noise-cgroup NAME``): the noise runs in the top-level cgroup v2 ``NAME``,
    made for it and removed after, as a real host's neighbours run in cgroups of their own
    (user.slice, a container); ``[neighbours]`` then weights or caps it. Without it the noise
    stays in this benchmark's cgroup.
    """

    cgroup: str | None = None

    def __init__(self, children: Children, kind: str, counts: dict[str, int], disk_dir: str):
        self.children, self.kind, self.counts, self.disk_dir = children, kind, counts, disk_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.work_dir = ""

    def start(self, seconds: float) -> None:
        deadline = time.time() + seconds  # bounded even if nobody stops it
        # Counters are mmap'd: updates stay in the page cache (8 bytes a process, no I/O of note).
        self.work_dir = tempfile.mkdtemp(prefix="nn-work-")
        for part in NOISE_PARTS[self.kind]:
            for i in range(self.counts[part]):
                counter = os.path.join(self.work_dir, f"{part}-{i}")  # noqa: PTH118
                Path(counter).write_bytes(bytes(8))
                argv = [sys.executable, str(ROLE_SCRIPT), "--role", part]
                argv += ["--deadline", f"{deadline:.0f}", "--counter", counter]
                if part == "disk":
                    argv += ["--disk-dir", self.disk_dir]
                self.procs.append(self.children.start(argv, stdin=subprocess.DEVNULL))
        if self.cgroup:
            from gputuned.kernel.live import LiveKernel
            from gputuned.kernel.system import read_cgroup_layout

            kernel, where = LiveKernel(), f"/sys/fs/cgroup/{self.cgroup}"
            if read_cgroup_layout(kernel).mode != "v2":
                print("  --noise-cgroup: no cgroup v2 hierarchy here; the noise stays put")
                Noise.cgroup = None
                return
            if not kernel.is_dir(where):
                kernel.mkdir(where)
            for proc in self.procs:
                kernel.move_to_cgroup(proc.pid, where)

    def work(self) -> dict[str, int]:
        """The work done so far per part: burner iterations, bytes sent, bytes fsync'd."""
        out = dict.fromkeys(NOISE_PARTS[self.kind], 0)
        for f in Path(self.work_dir).iterdir() if self.work_dir else ():
            part = f.name.split("-")[0]
            out[part] += int.from_bytes(f.read_bytes()[:8], "little")
        return out

    def stop(self) -> None:
        for p in self.procs:
            self.children.stop(p, wait=3.0)
        self.procs = []
        if self.cgroup:
            from gputuned import errors
            from gputuned.kernel.live import LiveKernel

            with contextlib.suppress(errors.GputunedError):  # busy: a process not yet reaped
                LiveKernel().rmdir(f"/sys/fs/cgroup/{self.cgroup}")
        if self.work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = ""


def add_noise_args(ap: argparse.ArgumentParser) -> None:
    """How many noise processes of each part (benchmarks/reaction.py takes the same)."""
    counts = default_noise_counts()
    ap.add_argument("--cpu-burners", type=int, default=counts["cpu"])
    ap.add_argument("--net-streams", type=int, default=counts["net"])
    ap.add_argument("--disk-writers", type=int, default=counts["disk"])
    ap.add_argument("--disk-dir", help="where the disk noise writes (default: a temp dir)")


def default_noise_counts(cpus: int | None = None) -> dict[str, int]:
    """A burner per CPU, a loopback stream per 4 CPUs, an fsync'd writer per 8 (at least 1)."""
    n = cpus or os.cpu_count() or 1
    return {"cpu": n, "net": max(1, n // 4), "disk": max(1, n // 8)}


def noise_counts(args: argparse.Namespace) -> dict[str, int]:
    return {"cpu": args.cpu_burners, "net": args.net_streams, "disk": args.disk_writers}
