"""The guest image: Debian 13 (trixie) with systemd, qemu-guest-agent and its own kernel.

Built once per set of inputs and cached under ``/var/cache/gputuned-e2e/vm/<key>/``:

- ``root.img``: an ext4 file system (``mkfs.ext4 -d``) holding an mmdebstrap minbase root with
  the packages below, a venv at /opt/gputuned/venv with gputuned's dependencies and pytest
  (wheels for the guest's CPython 3.13, pinned to the versions installed on this machine), and the
  gputuned_fakegpu module (fakegpu/fakegpu.c) built against the guest's kernel;
- ``vmlinuz`` and ``initrd.img`` for QEMU's direct kernel boot (the initramfs holds only
  virtio_pci, virtio_blk and ext4: 10 MB instead of 35);
- ``meta.json``: the key's inputs, kernel version, package versions and build timings.

The key is a hash of everything that goes in: suite, package list, pinned wheel versions,
this file and the module's sources. A run never writes the image: QEMU boots a qcow2 overlay.
Downloaded .debs are kept in ``debs/`` beside the images, so a rebuild after an edit here
does not download them again (a cold CI cache downloads them once, ~230 MB). mmdebstrap
rather than debootstrap: one apt run instead of one dpkg call per package, 60 s instead of 150.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
CACHE = Path(os.environ.get("GPUTUNED_E2E_VM_CACHE", "/var/cache/gputuned-e2e/vm"))
MIRROR = os.environ.get("GPUTUNED_E2E_MIRROR", "http://deb.debian.org/debian")
SUITE = "trixie"  # Linux 6.12: cpuset.cpus.exclusive (6.7+), isolated partitions (6.1+)
GUEST_PYTHON = "3.13"  # trixie's python3
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "kmod",
    "procps",  # ps and kill for looking around in the guest (not needed by gputuned)
    "iproute2",  # ip link set up: the e1000e requests its MSI-X vectors when opened
    "pciutils",  # lspci -vv: the independent reading inspect is compared with
    "python3",
    "python3-venv",
    "qemu-guest-agent",
    "linux-image-amd64",
    "initramfs-tools",
    "zstd",
    "linux-headers-amd64",  # to build gputuned_fakegpu; brings gcc and make along
    "make",
    # The container phase (issue 17): a server in a podman container, its libpod scope made the
    # partition in place. crun is podman's default runtime; no network is used (--network none).
    "podman",
    "crun",
)
#: Modules the initramfs needs to mount the root (virtio-blk, ext4); the rest load from the root.
INITRD_MODULES = ("virtio_pci", "virtio_blk", "ext4")
VENV = "/opt/gputuned/venv"
#: Installed in the guest's venv beside gputuned's dependencies: the phase "sim vs kernel" of
#: tests/e2e/test_vm.py runs tests/integration/test_procctl_live.py there, as it is.
GUEST_TEST_TOOLS = ("pytest",)
IMAGE_SIZE = "3G"  # sparse; the file system holds ~900 MB
#: Bump when the layout built below changes in a way the hashed files do not show.
FORMAT = 1
#: The function gputuned_fakegpu presents as a GPU: the e1000e on the switch's second
#: downstream port (machine.py builds that topology; the BDF is fixed by it).
FAKE_GPU_BDF = "0000:04:00.0"
COMPLETE = "meta.json"
MASKED_UNITS = (
    # No network in the guest (QEMU runs with -nic none): nothing may wait for one, and no timer
    # may start apt or a scrub while a test runs.
    "systemd-networkd-wait-online.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    # No VGA, no logins: the test talks to the guest agent only.
    "getty@tty1.service",
    "serial-getty@ttyS0.service",
    "systemd-logind.service",
    "modprobe@drm.service",
    # File systems and static nodes the test never uses: under TCG each costs 2-4 s of boot.
    "dev-hugepages.mount",
    "dev-mqueue.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "sys-kernel-config.mount",
    "sys-fs-fuse-connections.mount",
    "modprobe@fuse.service",
    "modprobe@configfs.service",
    "proc-sys-fs-binfmt_misc.automount",
    "systemd-binfmt.service",
    "kmod-static-nodes.service",
    "systemd-pstore.service",
    # Services podman and netavark enable that start at boot and end by themselves a little
    # later (netavark's DHCP proxy after 30 s idle, podman's API service after 5 s) or on a
    # timer: a cgroup in system.slice that is there in one capture and gone in the next. The
    # container phase runs podman itself, with --network none.
    "netavark-dhcp-proxy.service",
    "netavark-dhcp-proxy.socket",
    "podman.service",
    "podman.socket",
    "podman-auto-update.service",
    "podman-auto-update.timer",
)
BLACKLIST = (
    "ahci", "libahci", "lpc_ich", "i2c_i801", "i2c_smbus", "iTCO_wdt", "iTCO_vendor_support",
    "watchdog", "kvm", "kvm_amd", "kvm_intel", "powernow_k8", "k10temp", "edac_mce_amd",
    "amd64_edac", "ccp", "sp5100_tco", "intel_rapl_msr", "intel_rapl_common", "aesni_intel",
    "ghash_clmulni_intel", "sha1_ssse3", "sha256_ssse3", "sha512_ssse3", "cryptd",
    "polyval_clmulni", "polyval_generic", "crc32_pclmul", "crct10dif_pclmul", "drm", "bochs",
    "qemu_fw_cfg", "efi_pstore", "pcspkr", "serio_raw", "joydev", "evdev", "button", "sg",
    "sr_mod", "psmouse",
    # The "GPU" (fakegpu) reads as NVIDIA: keep nouveau from probing an e1000e.
    "nouveau",
)  # fmt: skip
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageError(AssertionError):
    pass


@dataclass(frozen=True)
class Image:
    dir: Path
    meta: dict[str, object]

    @property
    def root(self) -> Path:
        return self.dir / "root.img"

    @property
    def kernel(self) -> Path:
        return self.dir / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.dir / "initrd.img"


def run(
    argv: Sequence[str | Path],
    *,
    timeout: float = 900,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> str:
    args = [str(a) for a in argv]
    if env is None:  # this environment, with the sbin folders a CI job's PATH may lack
        path = ":".join(
            dict.fromkeys([*os.environ.get("PATH", "").split(":"), *HOST_PATH.split(":")])
        )
        env = dict(os.environ, PATH=path)
    try:
        p = subprocess.run(
            args,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"$ {' '.join(args)}: still running after {timeout} s") from exc
    if p.returncode != 0:
        raise ImageError(
            f"$ {' '.join(args)}\n(exit {p.returncode})\n--- stdout\n{p.stdout[-3000:]}"
            f"\n--- stderr\n{p.stderr[-3000:]}"
        )
    return p.stdout


def host_env(**extra: str) -> dict[str, str]:
    """A clean environment: nothing of this machine's pip or Python settings leaks into the
    chroot (PIP_* find-links, pyenv shims), but the proxy settings apt needs stay."""
    keep = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(PATH=HOST_PATH, LANG="C.UTF-8", HOME="/root", **extra)
    return env


def chroot(root: Path, *argv: str, timeout: float = 600) -> str:
    return run(["chroot", str(root), *argv], env=host_env(), timeout=timeout)


@contextlib.contextmanager
def flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---- what goes in ------------------------------------------------------------------------------


def pinned_dependencies() -> list[str]:
    """gputuned's runtime dependencies, GUEST_TEST_TOOLS and theirs, pinned to what this machine
    has installed.

    The guest then runs the versions the rest of the suite tested, and the image is rebuilt
    exactly when one of them changes (the pins are part of the cache key).
    """
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    todo = [Requirement(r) for r in [*data["project"]["dependencies"], *GUEST_TEST_TOOLS]]
    env = {"python_version": GUEST_PYTHON, "python_full_version": f"{GUEST_PYTHON}.0", "extra": ""}
    pins: dict[str, str] = {}
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in pins:
            continue
        try:
            version = md.version(name)
        except md.PackageNotFoundError as exc:
            raise ImageError(
                f"{name} is not installed here; scripts/test installs gputuned with its "
                "dependencies (pip install -e .[test]) before the tests run"
            ) from exc
        pins[name] = version
        todo += [Requirement(r) for r in md.requires(name) or []]
    return sorted(f"{n}=={v}" for n, v in pins.items())


def _hashed_files() -> list[Path]:
    return [HERE / "image.py", *sorted((HERE / "fakegpu").iterdir())]


def cache_spec() -> dict[str, object]:
    return {
        "suite": SUITE,
        "packages": sorted(PACKAGES),
        "initrd_modules": list(INITRD_MODULES),
        "wheels": pinned_dependencies(),
        "guest_python": GUEST_PYTHON,
        "fake_gpu": FAKE_GPU_BDF,
        "format": FORMAT,
        "files": {
            str(p.relative_to(HERE)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in _hashed_files()
            if p.is_file()
        },
    }


def cache_key(spec: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


# ---- the build ---------------------------------------------------------------------------------


def ensure_image(say: Callable[[str], None] = lambda _m: None) -> tuple[Image, bool]:
    """The cached image for the current inputs, built first if missing: (image, was cached)."""
    spec = cache_spec()
    key = cache_key(spec)
    final = CACHE / key
    if (final / COMPLETE).is_file():
        return Image(final, json.loads((final / COMPLETE).read_text())), True
    with flock(CACHE / "build.lock"):
        if (final / COMPLETE).is_file():
            return Image(final, json.loads((final / COMPLETE).read_text())), True
        meta = _build(key, spec, final, say)
    return Image(final, meta), False


def _build(
    key: str, spec: dict[str, object], final: Path, say: Callable[[str], None]
) -> dict[str, object]:
    t_all = time.monotonic()
    timings: dict[str, float] = {}
    tmp = CACHE / f"{key}.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    rootfs = tmp / "rootfs"
    tmp.mkdir(parents=True)
    debs, new_debs = CACHE / "debs", CACHE / "debs.new"
    shutil.rmtree(new_debs, ignore_errors=True)
    new_debs.mkdir(parents=True)

    t0 = time.monotonic()
    say(f"image {key}: mmdebstrap {SUITE} ({len(PACKAGES)} packages and their dependencies)")
    run(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--mode=root",
            f"--include={','.join(PACKAGES)}",
            # Downloaded .debs are kept beside the images (the local-cache recipe of mmdebstrap(1))
            # so that a rebuild after an edit here downloads nothing; only this build's are kept.
            "--skip=essential/unlink",
            f'--setup-hook=mkdir -p "$1"/var/cache/apt/archives {debs}',
            f"--setup-hook=sync-in {debs} /var/cache/apt/archives/",
            f"--customize-hook=sync-out /var/cache/apt/archives {new_debs}",
            SUITE,
            rootfs,
            MIRROR,
        ],
        # INITRD=No: the kernel's postinst skips its initramfs (MODULES=most, 35 MB, ~15 s);
        # the small one is made below once the configuration is in place.
        env=host_env(INITRD="No", DEBIAN_FRONTEND="noninteractive"),
        timeout=1500,
    )
    timings["mmdebstrap"] = time.monotonic() - t0
    shutil.rmtree(debs, ignore_errors=True)
    new_debs.rename(debs)

    t0 = time.monotonic()
    kver = _kernel_version(rootfs)
    _configure(rootfs)
    conf = rootfs / "etc/initramfs-tools/initramfs.conf"
    conf.write_text(re.sub(r"(?m)^MODULES=.*$", "MODULES=list", conf.read_text()))
    with (rootfs / "etc/initramfs-tools/modules").open("a") as f:
        f.write("".join(f"{m}\n" for m in INITRD_MODULES))
    _userspace_mark(rootfs)
    chroot(rootfs, "update-initramfs", "-c", "-k", kver)
    timings["configure+initramfs"] = time.monotonic() - t0

    t0 = time.monotonic()
    _build_fakegpu(rootfs, kver)
    timings["fakegpu module"] = time.monotonic() - t0

    t0 = time.monotonic()
    wheels = spec["wheels"]
    assert isinstance(wheels, list)
    _venv(rootfs, [str(w) for w in wheels], tmp / "wheels")
    timings["venv"] = time.monotonic() - t0

    t0 = time.monotonic()
    # /etc and /var newer than /usr: ConditionNeedsUpdate= is false, so ldconfig, hwdb and
    # catalog updates do not run at every boot of a fresh overlay (2-4 s each under TCG).
    for d in ("etc", "var"):
        (rootfs / d / ".updated").write_text("# gputuned e2e image: up to date\n")
    packages = chroot(rootfs, "dpkg-query", "-W", "-f", "${Package} ${Version}\\n").splitlines()
    for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (rootfs / d).glob("*"):
            if p.is_file():
                p.unlink()
    (rootfs / "etc/resolv.conf").unlink(missing_ok=True)
    shutil.copy2(rootfs / f"boot/vmlinuz-{kver}", tmp / "vmlinuz")
    shutil.copy2(rootfs / f"boot/initrd.img-{kver}", tmp / "initrd.img")
    run(["mkfs.ext4", "-q", "-F", "-L", "gputuned-vm", "-d", rootfs, tmp / "root.img", IMAGE_SIZE])
    shutil.rmtree(rootfs)
    timings["mkfs.ext4 -d"] = time.monotonic() - t0

    meta: dict[str, object] = {
        "key": key,
        "spec": spec,
        "kernel": kver,
        "packages": packages,
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "build_s": round(time.monotonic() - t_all, 1),
    }
    (tmp / COMPLETE).write_text(json.dumps(meta, indent=2) + "\n")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in CACHE.iterdir():  # images of earlier inputs: one image is kept
        if old.is_dir() and old != final and re.fullmatch(r"[0-9a-f]{16}(\.partial)?", old.name):
            shutil.rmtree(old, ignore_errors=True)
    say(f"image {key}: built in {meta['build_s']} s ({meta['timings_s']})")
    return meta


def _kernel_version(rootfs: Path) -> str:
    found = sorted(p.name.removeprefix("vmlinuz-") for p in (rootfs / "boot").glob("vmlinuz-*"))
    if len(found) != 1:
        raise ImageError(f"expected one kernel in {rootfs}/boot, found {found}")
    return found[0]


def _configure(rootfs: Path) -> None:
    (rootfs / "etc/hostname").write_text("gputuned-vm\n")
    (rootfs / "etc/hosts").write_text("127.0.0.1 localhost\n127.0.1.1 gputuned-vm\n")
    # fsck pass 0: a fresh overlay of a clean image every run; fsck under TCG costs seconds.
    (rootfs / "etc/fstab").write_text("/dev/vda / ext4 rw,relatime 0 0\n")
    # Not a first boot: a machine ID (the same for every run; the guest has no network), so
    # systemd applies no presets at boot. (/etc/.updated and /var/.updated: see _build.)
    (rootfs / "etc/machine-id").write_text("6770757475e2e5e2e76d0000000000ff\n")
    chroot(rootfs, "passwd", "-d", "root")
    for unit in MASKED_UNITS:
        link = rootfs / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    # Drivers udev would load for what q35 and "-cpu max" bring along (AHCI, LPC, SMBus,
    # watchdog, KVM, CPU frequency, crypto accelerators) but the test never uses: under TCG each
    # module load costs about a second of boot.
    (rootfs / "etc/modprobe.d/gputuned-vm-blacklist.conf").write_text(
        "# gputuned e2e guest: modules the test does not need (tests/e2e/vm/image.py)\n"
        + "".join(f"blacklist {m}\n" for m in BLACKLIST)
    )
    # Journal in /run only: the disk overlay stays small and the boot does not wait for a flush.
    dropin = rootfs / "etc/systemd/journald.conf.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "gputuned-vm.conf").write_text("[Journal]\nStorage=volatile\n")


#: Printed on the guest console by the first userspace program (the initramfs's init-top
#: stage), at KERN_ERR so that "quiet" keeps it: a boot whose console lacks it died in the
#: kernel, before any program of the guest ran (machine.py retries such a boot once).
USERSPACE_MARK = "gputuned-vm: userspace started"


def _userspace_mark(rootfs: Path) -> None:
    script = rootfs / "etc/initramfs-tools/scripts/init-top/gputuned-vm-mark"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(
        "#!/bin/sh\n"
        "# gputuned e2e guest (tests/e2e/vm/image.py): userspace has started.\n"
        'PREREQ=""\n'
        'prereqs() { echo "$PREREQ"; }\n'
        'case "$1" in prereqs) prereqs; exit 0;; esac\n'
        f'echo "<3>{USERSPACE_MARK}" > /dev/kmsg\n'
    )
    script.chmod(0o755)


def _build_fakegpu(rootfs: Path, kver: str) -> None:
    src = rootfs / "usr/src/gputuned-fakegpu"
    shutil.copytree(HERE / "fakegpu", src)
    inside = f"/{src.relative_to(rootfs).as_posix()}"
    chroot(rootfs, "make", "-s", "-C", f"/usr/src/linux-headers-{kver}", f"M={inside}", "modules")
    dest = rootfs / f"usr/lib/modules/{kver}/updates"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "gputuned_fakegpu.ko", dest / "gputuned_fakegpu.ko")
    chroot(rootfs, "depmod", kver)
    # Loaded by the test's gputuned-vm-gpu-up.service once e1000e has bound to the device.
    (rootfs / "etc/modprobe.d/gputuned-fakegpu.conf").write_text(
        f"options gputuned_fakegpu bdf={FAKE_GPU_BDF}\n"
    )


def _venv(rootfs: Path, wheels: list[str], dl: Path) -> None:
    """A venv with gputuned's dependencies for the guest's CPython, from wheels only.

    Binary wheels for CPython 3.13 come from ``pip download --only-binary``: every dependency
    of gputuned has one.
    """
    dl.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    quiet = ["-q", "--disable-pip-version-check"]
    run(
        [
            *pip, "download", *quiet, "--no-deps", "--only-binary=:all:",
            "--python-version", GUEST_PYTHON, "--implementation", "cp",
            "--abi", f"cp{GUEST_PYTHON.replace('.', '')}", "--abi", "abi3", "--abi", "none",
            "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
            "--platform", "any", "-d", dl, *wheels,
        ],
        timeout=600,
    )  # fmt: skip
    inside = "/opt/gputuned/wheels"
    shutil.copytree(dl, rootfs / inside.lstrip("/"))
    chroot(rootfs, "python3", "-m", "venv", VENV)
    chroot(
        rootfs,
        f"{VENV}/bin/python",
        "-m",
        "pip",
        "install",
        *quiet,
        "--no-index",
        "--no-deps",
        "--find-links",
        inside,
        *wheels,
    )
    shutil.rmtree(rootfs / inside.lstrip("/"))
