"""Fresh Debian roots for README's quick start, and the two commands taken from README.md.

A root is what a new server has: ``debootstrap --variant=minbase`` plus git, python3 and
ca-certificates, nothing else (no python3-venv, no pip, no sudo). One per release, built once and
cached under ``/var/cache/gputuned-e2e/quickstart/<suite>-<key>`` (the key hashes the inputs
below), as the other lanes cache theirs. Each run works on an overlayfs over the cached root, so
the cache stays pristine, and enters it with chroot, the machine's /proc, /sys and /dev bound in:
the suite's live tests need the real kernel interfaces (a PID namespace of its own would hide the
proc connector from them, as it would on no real server).

The root trusts the certificate authorities this machine trusts beyond the stock bundle
(/usr/local/share/ca-certificates: here, the network's egress proxy re-signs HTTPS), as a real
server trusts its own network's; nothing else of this machine goes in.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.nspawn.harness import (
    CACHE,
    HOST_PATH,
    MIRROR,
    E2EError,
    flock,
    host_run,
    tool,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
RELEASES = {"12": "bookworm", "13": "trixie"}
PACKAGES = ("git", "python3", "ca-certificates")
#: Bump when the layout built below changes in a way the key does not show.
FORMAT = 1
COMPLETE = ".gputuned-quickstart-complete"
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
INSIDE = "/root/gputuned"  # where the checkout lies in the root, as a user's clone would
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOOLS = ("debootstrap", "chroot", "mount", "umount", "git")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t, path=HOST_PATH) is None]


def readme_commands(readme: Path = REPO / "README.md") -> list[str]:
    """The commands of README's "Quick start" code block: its lines that are not comments.

    Fails unless there is such a block holding exactly two commands (the quick start's promise).
    """
    text = readme.read_text()
    section = re.search(r"^## Quick start.*?$(.*?)(?=^## )", text, re.M | re.S)
    if section is None:
        raise E2EError("README.md has no '## Quick start' section")
    block = re.search(r"^```(?:sh|bash|console)?\n(.*?)^```", section.group(1), re.M | re.S)
    if block is None:
        raise E2EError("README.md's quick start has no code block")
    commands = [
        ln.strip()
        for ln in block.group(1).splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    if len(commands) != 2:
        raise E2EError(f"README.md's quick start holds {len(commands)} commands, not 2: {commands}")
    return commands


def package_commands(doc: Path = REPO / "docs" / "systemd.md") -> list[str]:
    """How docs/systemd.md says to build and install the package: the ``scripts/build-deb`` and
    ``apt install`` lines of its "Debian package" code block, their comments cut off."""
    text = doc.read_text()
    section = re.search(r"^## The Debian package.*?$(.*?)(?=^## )", text, re.M | re.S)
    block = section and re.search(r"^```sh\n(.*?)^```", section.group(1), re.M | re.S)
    if not block:
        raise E2EError("docs/systemd.md has no code block under '## The Debian package'")
    lines = [ln.split("  #", 1)[0].strip() for ln in block.group(1).splitlines()]
    found = [ln for ln in lines if ln.startswith(("scripts/build-deb", "apt install"))]
    if [ln.split()[0] for ln in found] != ["scripts/build-deb", "apt"]:
        raise E2EError(f"docs/systemd.md's package block: no build, then install, in {lines}")
    return found


def cache_key(suite: str) -> str:
    spec = {
        "suite": suite,
        "packages": sorted(PACKAGES),
        "mirror": MIRROR,
        "arch": platform.machine(),
        "format": FORMAT,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def base_root(suite: str) -> tuple[Path, float | None]:
    """The cached root of ``suite``, built first if missing: (path, seconds built or None)."""
    final = CACHE / "quickstart" / f"{suite}-{cache_key(suite)}"
    if (final / COMPLETE).is_file():
        return final, None
    with flock(CACHE / "quickstart" / f"build-{suite}.lock"):
        if (final / COMPLETE).is_file():
            return final, None
        t0 = time.monotonic()
        tmp = final.with_name(final.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        host_run(
            [
                tool("debootstrap"),
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                suite,
                tmp,
                MIRROR,
            ],
            timeout=900,
        )
        (tmp / COMPLETE).write_text(json.dumps({"suite": suite, "packages": PACKAGES}) + "\n")
        tmp.rename(final)
        return final, time.monotonic() - t0


def checkout_files() -> list[str]:
    """The files a clone of this working tree would hold (tracked, and new ones git would add)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return [p for p in out.decode().split("\0") if p and (REPO / p).exists()]


@dataclass
class Ran:
    command: str
    rc: int
    seconds: float
    log: Path

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


@dataclass
class FreshRoot:
    """An overlay over a cached root, with a copy of the checkout in it, mounted and bound."""

    suite: str
    base: Path
    work: Path

    @property
    def root(self) -> Path:
        return self.work / "merged"

    def run(self, command: str, *, env: dict[str, str], log: Path, timeout: float) -> Ran:
        """``bash -c command`` as root in the checkout, with only ``env`` beyond the basics."""
        full = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb", **env}
        argv = [tool("chroot"), str(self.root), "/usr/bin/env", "-i"]
        argv += [f"{k}={v}" for k, v in full.items()]
        argv += ["/bin/bash", "-c", f"cd {INSIDE} && {command}"]
        t0 = time.monotonic()
        with log.open("wb") as out:
            try:
                rc = subprocess.run(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    timeout=timeout, check=False,
                ).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                rc = 124
                out.write(f"\n(quickstart lane: killed after {timeout:.0f} s)\n".encode())
        return Ran(command, rc, time.monotonic() - t0, log)


@contextlib.contextmanager
def fresh_root(suite: str, base: Path, runs: Path) -> Iterator[FreshRoot]:
    """Mount an overlay of ``base``, put the checkout and the local CAs in, bind the kernel's
    file systems; everything is unmounted and removed afterwards, the cache untouched."""
    runs.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{suite}-", dir=runs))
    fr = FreshRoot(suite, base, work)
    upper, wdir = work / "upper", work / "work"
    for d in (upper, wdir, fr.root):
        d.mkdir()
    mounted: list[Path] = []
    try:
        opts = f"lowerdir={base},upperdir={upper},workdir={wdir}"
        host_run(["mount", "-t", "overlay", "overlay", "-o", opts, fr.root])
        mounted.append(fr.root)
        _bind_kernel(fr.root, mounted)
        _put_checkout(fr.root / INSIDE.lstrip("/"))
        _trust_local_cas(fr)
        shutil.copy2("/etc/resolv.conf", fr.root / "etc/resolv.conf")
        yield fr
    finally:
        for m in reversed(mounted):
            host_run(["umount", "-R", m], check=False)
        remove_run(work)


def remove_run(work: Path) -> bool:
    """Unmount whatever is still mounted under ``work``, deepest first, then remove it.

    Nothing is removed while a mount remains below it: ``rmtree`` would follow the bind mounts
    into the machine's own /dev and /sys. Returns whether ``work`` is gone.
    """
    for point in sorted(mounts_under(work), key=lambda p: -len(p.parts)):
        host_run(["umount", "-R", point], check=False)
    if mounts_under(work):
        return False
    shutil.rmtree(work, ignore_errors=True)
    return not work.exists()


def remove_stale_runs(runs: Path) -> list[str]:
    """Run folders left by a killed run (the caller holds the run lock): unmounted, removed."""
    gone = []
    for d in sorted(runs.glob("*-*")) if runs.is_dir() else []:
        if d.is_dir() and remove_run(d):
            gone.append(d.name)
    return gone


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path`` (/proc/self/mountinfo, field 5; octal escapes)."""
    base = str(path.resolve())
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if point == base or point.startswith(base + "/"):
                out.append(Path(point))
    return out


def _bind_kernel(root: Path, mounted: list[Path]) -> None:
    for name, args in (
        ("proc", ["-t", "proc", "proc"]),
        ("sys", ["--rbind", "/sys"]),
        ("dev", ["--rbind", "/dev"]),
        ("run", ["-t", "tmpfs", "-o", "mode=0755", "tmpfs"]),
    ):
        target = root / name
        host_run(["mount", *args, target])
        mounted.append(target)
        if "--rbind" in args:  # an unmount inside must not reach the machine's own mounts
            host_run(["mount", "--make-rslave", target])


def _put_checkout(dest: Path) -> None:
    for rel in checkout_files():
        src = REPO / rel
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(src.readlink())
        else:
            shutil.copy2(src, target)
    # A new user has a clone, and the suite may ask git what it holds (tests/unit/
    # test_doc_links.py does): the copy is made a repository of one commit, this working tree.
    git = ["git", "-C", str(dest), "-c", "user.name=quickstart", "-c", "user.email=lane@localhost"]
    host_run([*git, "init", "-q"])
    host_run([*git, "add", "-A"])
    host_run([*git, "commit", "-q", "--no-verify", "-m", "the working tree under test"])


def _trust_local_cas(fr: FreshRoot) -> None:
    cas = sorted(LOCAL_CAS.glob("*.crt")) if LOCAL_CAS.is_dir() else []
    if not cas:
        return
    dest = fr.root / LOCAL_CAS.relative_to("/")
    dest.mkdir(parents=True, exist_ok=True)
    for crt in cas:
        shutil.copy2(crt, dest / crt.name)
    host_run([tool("chroot"), fr.root, "update-ca-certificates"], env={"PATH": PATH})
