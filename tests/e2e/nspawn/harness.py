"""Boot a Debian bookworm container with systemd-nspawn and run commands in it.

What /work/shared/E2E.md found on the CI machine kind, and what this module therefore does:

- The host's PID 1 is not systemd and there is no D-Bus, so nspawn runs with ``--register=no
  --keep-unit`` (without them: "Failed to open system bus"). ``--private-network`` keeps the
  container off the host's NICs.
- There is no machinectl: commands run through ``nsenter -t PID -a``, where PID is the container's
  init as the host sees it (the descendant of nspawn whose ``NSpid:`` ends in 1). Such commands
  are not in the container's cgroup tree: processes whose placement a test checks must be started
  as units inside the container.
- ``systemctl reboot`` inside makes nspawn exit with 133; booting again on the same directory is
  what systemd-nspawn@.service does.
- nspawn leaves empty ``payload/`` and ``supervisor/`` cgroups on the host: removed afterwards.

The root file system is built once with debootstrap (plus a venv holding gputuned's
dependencies) and cached under ``/var/cache/gputuned-e2e``, keyed by a hash of the package and
dependency lists. Each run boots an overlayfs on top of the cache, so the cache stays pristine
and a run costs no copy. One run at a time per machine (a lock file): two nspawn instances
started from the same cgroup would share ``payload/``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("GPUTUNED_E2E_CACHE", "/var/cache/gputuned-e2e"))
SUITE = "bookworm"  # its python3 is 3.11, the version gputuned is built for
MIRROR = os.environ.get("GPUTUNED_E2E_MIRROR", "http://deb.debian.org/debian")
#: What E2E.md's rootfs had. No procps: a minimal Debian has no /bin/kill, and the unit's
#: ExecReload= must work without it (test_nspawn.py's reload check proves that it does).
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "python3",
    "python3-venv",
    "dbus",
    "udev",
    "iproute2",
)
#: Bump when the base layout built below changes, so old caches are not reused.
BASE_FORMAT = 1
VENV = "/opt/gputuned/venv"
E2E_DIR = "/opt/gputuned-e2e"  # inside the container: wheels, probe script, profile
CONTAINER_PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What nspawn exits with when the container asked for a reboot (src/nspawn/nspawn.c).
EXIT_REBOOT = 133
TOOLS = ("systemd-nspawn", "debootstrap", "nsenter", "chroot", "mount", "umount")
COMPLETE = ".gputuned-e2e-complete"


class E2EError(AssertionError):
    """A step of the harness failed; the message carries the command, its output and log tail."""


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    rc: int
    out: str
    err: str
    seconds: float

    def __str__(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\n(exit {self.rc} after {self.seconds:.2f} s)\n"
            f"--- stdout\n{self.out.rstrip()}\n--- stderr\n{self.err.rstrip()}"
        )


#: The sbin folders too: debootstrap, chroot and nsenter live there and a CI job's PATH may
#: lack them.
HOST_PATH = ":".join(
    dict.fromkeys(
        [
            *os.environ.get("PATH", "").split(":"),
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
        ]
    )
)


def tool(name: str) -> str:
    found = shutil.which(name, path=HOST_PATH)
    if found is None:
        raise E2EError(f"{name} is not installed: scripts/test installs what the e2e tests need")
    return found


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t, path=HOST_PATH) is None]


def host_run(
    argv: Sequence[str | Path],
    *,
    check: bool = True,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Result:
    args = tuple(str(a) for a in argv)
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            args,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            env=env if env is not None else dict(os.environ, PATH=HOST_PATH),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise E2EError(f"$ {' '.join(args)}: still running after {timeout} s") from exc
    res = Result(args, p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
    if check and res.rc != 0:
        raise E2EError(f"command failed on the host:\n{res}")
    return res


@contextlib.contextmanager
def flock(path: Path, timeout: float = 900) -> Iterator[float]:
    """Hold an exclusive lock on ``path``; yields the seconds spent waiting for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with path.open("a") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - t0 > timeout:
                    raise E2EError(
                        f"another e2e run has held {path} for {timeout:.0f} s; wait for it, or "
                        "end it if it hangs"
                    ) from None
                time.sleep(0.5)
        try:
            yield time.monotonic() - t0
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---- what goes into the container ----------------------------------------------------------


def project_dependencies() -> list[str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return sorted(data["project"]["dependencies"])


def cache_key() -> str:
    spec = {
        "suite": SUITE,
        "packages": sorted(PACKAGES),
        "deps": project_dependencies(),
        "arch": platform.machine(),
        "format": BASE_FORMAT,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def chroot(root: Path, *argv: str, timeout: float = 300) -> Result:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    return host_run([tool("chroot"), str(root), *argv], env=env, timeout=timeout)


def base_rootfs(progress: list[str]) -> Path:
    """The cached root file system for this package list, built if missing (debootstrap ~60 s)."""
    key = cache_key()
    final = CACHE / f"rootfs-{key}"
    if (final / COMPLETE).is_file():
        progress.append(f"rootfs: cached {final}")
        return final
    with flock(CACHE / "build.lock"):
        if (final / COMPLETE).is_file():
            return final
        t0 = time.monotonic()
        tmp = CACHE / f"rootfs-{key}.partial"
        if not (tmp / ".debootstrap-done").is_file():  # a later step's failure keeps this part
            if tmp.exists():
                shutil.rmtree(tmp)
            host_run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    SUITE,
                    tmp,
                    MIRROR,
                ],
                timeout=900,
            )
            (tmp / ".debootstrap-done").touch()
            progress.append(f"rootfs: debootstrap {time.monotonic() - t0:.0f} s")
        chroot(tmp, "passwd", "-d", "root")
        (tmp / "etc/hostname").write_text("gputuned-e2e\n")
        # The container has no network: nothing should wait for one.
        for unit in ("systemd-networkd-wait-online.service", "apt-daily.timer"):
            (tmp / "etc/systemd/system" / unit).unlink(missing_ok=True)
            (tmp / "etc/systemd/system" / unit).symlink_to("/dev/null")
        chroot(tmp, "python3", "-m", "venv", VENV)
        deps = tmp / E2E_DIR.lstrip("/") / "deps"
        download_dependencies(deps)
        chroot(
            tmp,
            f"{VENV}/bin/python",
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-index",
            "--find-links",
            f"{E2E_DIR}/deps",
            *project_dependencies(),
        )
        shutil.rmtree(tmp / "var/cache/apt/archives", ignore_errors=True)
        (tmp / "var/cache/apt/archives/partial").mkdir(parents=True)
        (tmp / COMPLETE).write_text(json.dumps({"key": key, "built": time.time()}) + "\n")
        tmp.rename(final)
        for old in CACHE.glob("rootfs-*"):
            if old != final and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        progress.append(f"rootfs: built in {time.monotonic() - t0:.0f} s")
    return final


def download_dependencies(dest: Path) -> None:
    """Wheels of gputuned's dependencies for the container's CPython 3.11 (bookworm).

    ``pip wheel`` with this interpreter: binary wheels as they are, and a wheel built from any
    dependency published only as an sdist. That needs the same Python minor version on both
    sides, as on the CI machine kind (Debian 12, CPython 3.11).
    """
    if sys.version_info[:2] != (3, 11):
        raise E2EError(
            f"the container runs CPython 3.11 (bookworm); these tests need 3.11 too to build "
            f"its dependency wheels, not {platform.python_version()}"
        )
    dest.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--disable-pip-version-check",
        "-w",
        str(dest),
        *project_dependencies(),
    ]
    host_run(argv, timeout=600)


def build_wheel(dest: Path) -> Path:
    """gputuned's wheel from the working tree as it is (committed or not).

    Built from a copy of the files git would commit, so that the build's own files (build/,
    *.egg-info) never land in the working tree another process may be editing.
    """
    src = dest / "src"
    files = host_run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO
    ).out.split("\0")
    for rel in filter(None, files):
        a, b = REPO / rel, src / rel
        if not a.exists() and not a.is_symlink():
            continue  # deleted in the working tree, not yet in the index
        b.parent.mkdir(parents=True, exist_ok=True)
        if a.is_symlink():
            b.symlink_to(os.readlink(a))
        else:
            shutil.copy2(a, b)
    out = dest / "wheel"
    host_run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "-w",
            out,
            src,
        ],
        timeout=300,
    )
    wheels = sorted(out.glob("gputuned-*.whl"))
    if len(wheels) != 1:
        raise E2EError(f"expected one gputuned wheel in {out}, found {wheels}")
    return wheels[0]


# ---- a root file system for one run ---------------------------------------------------------


@dataclass
class RunRoot:
    """An overlayfs over the cached base: the container writes only to ``upper``."""

    base: Path
    workdir: Path
    mounted: bool = False

    @property
    def root(self) -> Path:
        return self.workdir / "root"

    def __enter__(self) -> RunRoot:
        for d in ("upper", "work", "root"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        opts = f"lowerdir={self.base},upperdir={self.workdir / 'upper'},workdir={self.workdir / 'work'}"
        host_run(["mount", "-t", "overlay", "overlay", "-o", opts, self.root])
        self.mounted = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self.mounted:
            if host_run(["umount", self.root], check=False).rc != 0:
                host_run(["umount", "--lazy", self.root], check=False)
            self.mounted = False
        shutil.rmtree(self.workdir, ignore_errors=True)

    def put(self, path: str, data: bytes | str, mode: int = 0o644) -> Path:
        """Write a file into the container's tree (its absolute path inside the container)."""
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        target.chmod(mode)
        return target

    def install_project(self, wheel: Path) -> None:
        """Install gputuned's wheel into the venv (the dependencies are in the base already)."""
        self.put(f"{E2E_DIR}/{wheel.name}", wheel.read_bytes())
        chroot(
            self.root,
            f"{VENV}/bin/python",
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
            f"{E2E_DIR}/{wheel.name}",
        )


# ---- the container ----------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The comm field may hold spaces and parentheses: the PPid is after the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(name))
    return out


def descendants(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        for c in _children(todo.pop()):
            seen.append(c)
            todo.append(c)
    return seen


def ns_pids(pid: int) -> list[int]:
    """The ``NSpid:`` line of /proc/PID/status: the PID as each nested PID namespace sees it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return []


def container_init(nspawn_pid: int) -> int | None:
    """The container's PID 1 as the host sees it: nspawn's descendant whose inner PID is 1."""
    for pid in descendants(nspawn_pid):
        ids = ns_pids(pid)
        if len(ids) >= 2 and ids[-1] == 1:
            return pid
    return None


def own_cgroups() -> dict[Path, str]:
    """Each mounted cgroup hierarchy of this process: mount point -> our path in it."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, ctrls, path = line.rstrip("\n").split(":", 2)
            paths["" if hid == "0" else ctrls] = path
    out: dict[Path, str] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fstype, _src, opts = post.split()[:3]
            mnt = Path(pre.split()[4])
            if fstype == "cgroup2" and "" in paths:
                out[mnt] = paths[""]
            elif fstype == "cgroup":
                for key, path in paths.items():
                    if key and set(key.split(",")) <= set(opts.split(",")):
                        out[mnt] = path
    return out


def remove_nspawn_cgroups() -> tuple[list[str], list[str]]:
    """Remove the ``payload``/``supervisor`` cgroups nspawn leaves: (removed, left with why)."""
    removed, left = [], []
    for mnt, path in own_cgroups().items():
        for name in ("payload", "supervisor"):
            top = mnt / path.lstrip("/") / name
            if not top.is_dir():
                continue
            for dirpath, _dirs, _files in sorted(
                os.walk(top), key=lambda t: t[0].count("/"), reverse=True
            ):
                try:
                    os.rmdir(dirpath)
                except OSError as exc:
                    left.append(f"{dirpath}: {exc.strerror}")
            if not top.exists():
                removed.append(str(top))
    return removed, left


def _stamp_lines(src: IO[bytes], dst: IO[bytes], t0: float) -> None:
    """Copy ``src`` to ``dst`` line by line, each with the seconds since ``t0``; close both."""
    with src, dst:
        for line in src:
            dst.write(b"[%8.2f] %s" % (time.monotonic() - t0, line))
            dst.flush()


def remove_stale_runs() -> None:
    """Run folders a killed earlier run left (the caller holds the run lock: none is in use)."""
    for d in sorted((CACHE / "runs").glob("*")):
        root = d / "root"
        if os.path.ismount(root):
            host_run(["umount", "--lazy", root], check=False)
        shutil.rmtree(d, ignore_errors=True)


@dataclass
class Container:
    """One booted systemd-nspawn container over ``root``."""

    root: Path
    logs: Path
    name: str = "gputuned-e2e"
    proc: subprocess.Popen[bytes] | None = None
    pid1: int | None = None
    boots: int = 0
    history: list[Result] = field(default_factory=list)
    #: Every container init this object started, as the host sees it (one per boot).
    inits: list[int] = field(default_factory=list)

    # ---- lifecycle ----

    def boot(self, timeout: float = 90) -> float:
        """Start nspawn and wait for ``systemctl is-system-running --wait``; seconds taken."""
        if self.alive:
            raise E2EError("boot: the container is already running")
        self.boots += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"console-{self.boots}.log").open("wb")
        t0 = time.monotonic()
        deadline = t0 + timeout
        self.proc = subprocess.Popen(
            [
                tool("systemd-nspawn"),
                "--boot",
                "--register=no",
                "--keep-unit",
                "--private-network",
                "--console=read-only",
                f"--machine={self.name}",
                "-D",
                str(self.root),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # Each console line with its second since nspawn started: a slow shutdown says where.
        threading.Thread(target=_stamp_lines, args=(self.proc.stdout, log, t0), daemon=True).start()
        self.pid1 = None
        while self.pid1 is None:
            if self.proc.poll() is not None:
                raise E2EError(f"systemd-nspawn exited with {self.proc.returncode}\n{self.tail()}")
            if time.monotonic() > deadline:
                raise E2EError(f"no container init after {timeout} s\n{self.tail()}")
            self.pid1 = container_init(self.proc.pid)
            if self.pid1 is None:
                time.sleep(0.02)
        self.inits.append(self.pid1)
        state = ""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise E2EError(f"systemctl is-system-running: {state!r} after {timeout} s")
            r = self.run(
                "systemctl", "is-system-running", "--wait", check=False, timeout=max(left, 1)
            )
            state = r.out.strip()
            if state in ("running", "degraded"):
                break
            if self.proc.poll() is not None:
                raise E2EError(f"nspawn exited with {self.proc.returncode}\n{r}\n{self.tail()}")
            time.sleep(0.1)  # systemd not yet listening on its private socket
        if state != "running":
            failed = self.run("systemctl", "--failed", "--no-legend", check=False).out
            raise E2EError(f"the container booted {state}, failed units:\n{failed}")
        return time.monotonic() - t0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise E2EError(
                f"systemd-nspawn still running after {timeout} s\n{self.processes()}\n{self.tail()}"
            ) from exc

    def reboot(self, timeout: float = 150) -> int:
        """``systemctl reboot`` inside; returns nspawn's exit code (133 for a reboot). The wait
        outlasts the container's own stop timeout (DefaultTimeoutStopSec=, 90 s), so that a unit
        that hangs on stop shows in the console log as systemd's kill, not as our timeout."""
        self.run("systemctl", "reboot", check=False, timeout=60)
        return self.wait_exit(timeout)

    def processes(self) -> str:
        """nspawn and every process of the container as the host sees them: PID (inner PID),
        state, kernel wait channel, nice, allowed CPUs, command name and cgroup; for an error
        message (a process that may run only on a CPU others hold is slow to die)."""
        if self.proc is None:
            return "(not started)"
        lines = ["host PID (inner) state wchan nice CPUs comm cgroup"]
        for pid in [self.proc.pid, *descendants(self.proc.pid)]:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                wchan = Path(f"/proc/{pid}/wchan").read_text() or "-"
                status = Path(f"/proc/{pid}/status").read_text()
                cgroup = Path(f"/proc/{pid}/cgroup").read_text().splitlines()[-1]
            except OSError:
                continue
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            cpus = next(
                (ln.split()[1] for ln in status.splitlines() if ln.startswith("Cpus_allowed_list")),
                "?",
            )
            inner = ns_pids(pid)[-1:] or ["?"]
            lines.append(
                f"{pid} ({inner[0]}) {fields[0]} {wchan} {fields[16]} {cpus} {comm} {cgroup}"
            )
        return "\n".join(lines)

    def shutdown(self, timeout: float = 20) -> None:
        """Power off (SIGTERM makes nspawn ask the container's init for a clean shutdown); kill
        whatever is left when that takes too long. Never leaves a process behind."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                if self.pid1 is not None:
                    # Killing the init of a PID namespace kills every process in it.
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid1, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.pid1 = None

    def leftovers(self) -> list[str]:
        """Processes of this container still alive (none after :meth:`shutdown`)."""
        out = []
        if self.proc is not None and self.proc.poll() is None:
            out.append(f"systemd-nspawn (PID {self.proc.pid})")
        for pid in self.inits:
            try:
                with open(f"/proc/{pid}/status") as f:
                    if any(line.startswith("NSpid:") and line.split()[-1] == "1" for line in f):
                        out.append(f"container init (PID {pid})")
            except OSError:
                continue
        return out

    def tail(self, lines: int = 40) -> str:
        log = self.logs / f"console-{self.boots}.log"
        if not log.exists():
            return "(no console log)"
        raw = log.read_bytes().decode(errors="replace")  # the console ends lines in \r\r\n
        text = raw.replace("\r", "").splitlines()[-lines:]
        return f"--- last lines of {log}\n" + "\n".join(text)

    # ---- commands ----

    def run(
        self, *argv: str, check: bool = True, timeout: float = 60, input: str | None = None
    ) -> Result:
        """Run a command in the container's namespaces (not in its cgroup tree)."""
        if self.pid1 is None:
            raise E2EError(f"{' '.join(argv)}: the container is not running")
        full = (
            tool("nsenter"),
            "-t",
            str(self.pid1),
            "-a",
            "env",
            "-i",
            f"PATH={CONTAINER_PATH}",
            "LANG=C.UTF-8",
            "HOME=/root",
            "SYSTEMD_PAGER=",
            "SYSTEMD_COLORS=0",
            *argv,
        )
        t0 = time.monotonic()
        try:
            p = subprocess.run(
                full,
                input=input,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise E2EError(
                f"in the container: {' '.join(argv)}: still running after {timeout} s"
            ) from exc
        res = Result(tuple(argv), p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
        self.history.append(res)
        if check and res.rc != 0:
            raise E2EError(f"command failed in the container:\n{res}")
        return res

    def sh(self, script: str, **kw: object) -> Result:
        return self.run("sh", "-ec", script, **kw)  # type: ignore[arg-type]

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """``systemctl show -p ...`` as a dict."""
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in props)).out
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def path(self, inside: str) -> Path:
        """A path inside the container as the host sees it."""
        return self.root / inside.lstrip("/")


def main_pid(ct: Container, unit: str) -> int:
    """The main process of a unit in the container; fails when it is not running."""
    pid = int(ct.show(unit, "MainPID")["MainPID"])
    if pid <= 0:
        raise E2EError(f"{unit} is not running")
    return pid


def placement(ct: Container, pid: int) -> tuple[int, str]:
    """(nice, Cpus_allowed_list) of a process in the container, as its kernel reports them."""
    stat = ct.run("cat", f"/proc/{pid}/stat").out
    nice = int(stat.rsplit(")", 1)[1].split()[16])  # field 19 of proc(5)
    status = ct.run("cat", f"/proc/{pid}/status").out
    for line in status.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return nice, line.split(":", 1)[1].strip()
    raise E2EError(f"no Cpus_allowed_list in /proc/{pid}/status:\n{status}")


#: The stand-in for an inference server in the lanes' containers (nspawn/gputuned-e2e-workload.service).
WORKLOAD = "gputuned-e2e-workload.service"


@dataclass
class Scenario:
    """What a lane's steps share: the container, the steps that passed, facts for later."""

    ct: Container
    rr: RunRoot
    passed: set[str] = field(default_factory=set)
    facts: dict[str, object] = field(default_factory=dict)

    def need(self, *steps: str) -> None:
        import pytest

        for s in steps:
            if s not in self.passed:
                pytest.fail(f"not checked: needs the step {s!r}, which failed or did not run")

    def workload_pid(self) -> int:
        return main_pid(self.ct, WORKLOAD)

    def placement(self) -> tuple[int, str]:
        """(nice, Cpus_allowed_list) of the workload's process, as the kernel reports them."""
        return placement(self.ct, self.workload_pid())


@contextlib.contextmanager
def booted_container(workdir: Path, progress: list[str]) -> Iterator[tuple[Container, RunRoot]]:
    """Everything from the cached rootfs to a running container; cleaned up on the way out."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with flock(CACHE / "run.lock") as waited:
        if waited > 1:
            progress.append(f"waited {waited:.0f} s for another e2e run on this machine")
        t0 = time.monotonic()
        wheel = build_wheel(workdir / "build")
        progress.append(f"wheel: {wheel.name} in {time.monotonic() - t0:.1f} s")
        base = base_rootfs(progress)
        remove_stale_runs()
        run_dir = CACHE / "runs" / str(os.getpid())
        with RunRoot(base, run_dir) as rr:
            t1 = time.monotonic()
            rr.install_project(wheel)
            progress.append(f"install wheel into the container: {time.monotonic() - t1:.1f} s")
            ct = Container(rr.root, workdir / "logs")
            try:
                yield ct, rr
            finally:
                ct.shutdown()
                removed, left = remove_nspawn_cgroups()
                progress.append(f"cgroups nspawn left on the host, removed: {len(removed)}")
                if left:
                    progress.append(f"cgroups that could not be removed: {left}")


# ---- what was checked, for the summary at the end of the run ---------------------------------


@dataclass
class Check:
    name: str
    ok: bool = False
    seconds: float = 0.0
    detail: str = ""


#: Every check of this pytest run, in order; tests/e2e/conftest.py prints them at the end.
CHECKS: list[Check] = []
#: Lines about the set-up (wheel, cached rootfs, boot times), printed with the checks.
NOTES: list[str] = []


@contextlib.contextmanager
def checking(name: str) -> Iterator[Check]:
    """Time one scenario step and record whether it passed (its assertions did not raise)."""
    c = Check(name)
    CHECKS.append(c)
    t0 = time.monotonic()
    try:
        yield c
        c.ok = True
    except BaseException as exc:
        if not c.detail:
            c.detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise
    finally:
        c.seconds = time.monotonic() - t0
