"""The seam itself: the kernel port stays inside its root, and nothing else reaches the machine."""

from __future__ import annotations

import ast
import errno
from pathlib import Path

import pytest

from gputuned import errors
from tests.faults import tree_kernel

PKG = Path(__file__).resolve().parents[2] / "gputuned"
HOST_ONLY_MODULES = {"os", "subprocess", "pyudev", "pynvml", "shutil", "socket", "ctypes", "fcntl"}


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [(node.module or "").split(".")[0]]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "open"
        ):
            names = ["open()"]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr
            in (
                "read_text",
                "read_bytes",
                "write_text",
                "write_bytes",
                "open",
                "iterdir",
            )
            and isinstance(node.value, ast.Call)
        ):
            # Path(...).read_text() style access; the port's methods are called on a name.
            names = [f"Path.{node.attr}"]
        else:
            continue
        out += [
            f"{path.relative_to(PKG.parent)}:{node.lineno}: {n}"
            for n in names
            if n in HOST_ONLY_MODULES or n in ("open()",) or n.startswith("Path.")
        ]
    return out


#: The packages whose job is to reach the machine: the kernel port, its live backend and the
#: machine's readers, the simulated kernel (it edits a tree's files), gputuned's own files
#: (store) and the daemon's sockets, event loop and notify socket (service).
MACHINE_PACKAGES = {"kernel", "sim", "store", "service"}


def test_only_host_package_touches_the_machine() -> None:
    files = [p for p in PKG.rglob("*.py") if not MACHINE_PACKAGES & {p.relative_to(PKG).parts[0]}]
    assert len(files) > 3, "expected modules outside the machine packages to check"
    bad = [o for f in files for o in _offences(f)]
    assert bad == [], (
        "modules outside the machine packages reach the machine directly:\n" + "\n".join(bad)
    )


def test_offence_detector_catches_each_form(tmp_path: Path) -> None:
    sample = PKG / "_sample_for_test.py"
    sample.write_text(
        "import os\nimport subprocess as sp\nfrom pyudev import Context\nimport pynvml\n"
        "x = open('/sys/x')\nfrom pathlib import Path\ny = Path('/proc/x').read_text()\n"
    )
    try:
        found = _offences(sample)
    finally:
        sample.unlink()
    assert [f.rsplit(": ", 1)[1] for f in found] == [
        "os",
        "subprocess",
        "pyudev",
        "pynvml",
        "open()",
        "Path.read_text",
    ]


def test_unit_guard_refuses_real_sys() -> None:
    with pytest.raises(RuntimeError, match="escaped to the real host"):
        Path("/proc/cmdline").read_text()
    from tests.unit import conftest

    conftest._escapes.clear()  # the escape was deliberate; don't fail this test for it


def test_host_rejects_dotdot_and_relative(tmp_path: Path) -> None:
    h = tree_kernel(tmp_path)
    with pytest.raises(errors.PathEscape, match=r"contains '\.\.'"):
        h.path("/sys/../../etc/passwd")
    with pytest.raises(errors.PathEscape, match="must be absolute"):
        h.path("sys/bus")


def test_host_joins_by_component_and_resolves_links_inside_root(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/pci0000:00/0000:00:06.0").mkdir(parents=True)
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    (tmp_path / "sys/bus/pci/devices/0000:00:06.0").symlink_to(
        "../../../devices/pci0000:00/0000:00:06.0"
    )
    (tmp_path / "sys/abs").symlink_to("/sys/devices")  # absolute: re-rooted, not the real /sys
    (tmp_path / "sys/up").symlink_to("../../../../../../..")  # clamps at the root
    h = tree_kernel(tmp_path)
    assert h.path("//sys//bus/./pci") == tmp_path / "sys/bus/pci"
    assert h.resolve("/sys/bus/pci/devices/0000:00:06.0") == "/sys/devices/pci0000:00/0000:00:06.0"
    assert h.resolve("/sys/abs/pci0000:00") == "/sys/devices/pci0000:00"
    assert h.resolve("/sys/up/sys") == "/sys"


def test_oserror_translation(tmp_path: Path) -> None:
    h = tree_kernel(tmp_path)
    with pytest.raises(
        errors.TargetGone, match=r"read /proc/irq/99/smp_affinity_list: not there \(ENOENT\)"
    ):
        h.read_value("/proc/irq/99/smp_affinity_list")
    (tmp_path / "f").write_text("1\n")
    h.inject("/f", "write", errno.EPERM)
    with pytest.raises(errors.PermissionDenied, match=r"write /f: permission denied \(EPERM\)"):
        h.write_text("/f", "2")
    h.inject("/f", "read", errno.EBUSY)
    with pytest.raises(errors.Busy):
        h.read_value("/f")
    assert (tmp_path / "f").read_text() == "1\n"
    assert h.writes == []


def test_tree_write_errors_replayed(tmp_path: Path) -> None:
    (tmp_path / "gputuned-tree.json").write_text(
        '{"write_errors": {"/proc/irq/31/smp_affinity_list": "EIO"}}'
    )
    (tmp_path / "proc/irq/31").mkdir(parents=True)
    (tmp_path / "proc/irq/31/smp_affinity_list").write_text("0-1\n")
    h = tree_kernel(tmp_path)
    with pytest.raises(errors.HostError) as info:
        h.write_text("/proc/irq/31/smp_affinity_list", "1")
    assert info.value.errno == errno.EIO
    assert (tmp_path / "proc/irq/31/smp_affinity_list").read_text() == "0-1\n"


def test_write_in_place_keeps_length(tmp_path: Path) -> None:
    (tmp_path / "config").write_bytes(bytes(range(16)))
    h = tree_kernel(tmp_path)
    h.write_bytes("/config", b"\xaa\xbb", offset=4)
    assert (tmp_path / "config").read_bytes() == bytes([0, 1, 2, 3, 0xAA, 0xBB]) + bytes(
        range(6, 16)
    )
    assert len(h.writes) == 1 and h.writes[0].offset == 4
