"""``gputunectl install-system`` and ``uninstall-system``: the systemd unit, the udev rule and
the shipped profiles, put where systemd, udev and the daemon look for them.

Installed (under ``--prefix``, ``/`` by default):

- ``/etc/systemd/system/gputuned.service``, with ``ExecStart=`` rewritten to the absolute path
  of this installation's ``gputuned`` entry point (a venv's bin/, /usr/local/bin, ...);
- ``/etc/udev/rules.d/90-gputuned.rules``;
- ``/etc/gputuned/profiles/*.toml``.

What was installed is recorded, with each file's SHA-256, in ``/etc/gputuned/installed.json``.
Files are treated like dpkg treats conffiles: a file that differs from what gputuned installed
(or that gputuned did not install) is never overwritten or removed; it is left and reported.
Uninstall therefore removes exactly the files it installed and nobody changed since.

Then ``systemctl daemon-reload`` and ``udevadm control --reload`` make systemd and udev read the
new files, when the running system has them (PID 1 is systemd; systemd-udevd runs); otherwise
each is reported as skipped, with the reason.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gputuned import __version__, errors
from gputuned.kernel import Kernel, sysinstall
from gputuned.store import state as hoststate
from gputuned.store import userfiles

if TYPE_CHECKING:
    pass

UNIT_NAME = "gputuned.service"
UNIT = f"/etc/systemd/system/{UNIT_NAME}"
RULE_NAME = "90-gputuned.rules"
RULE = f"/etc/udev/rules.d/{RULE_NAME}"
PROFILES_DIR = f"{hoststate.ETC_DIR}/profiles"
RECORD = f"{hoststate.ETC_DIR}/installed.json"
RECORD_FORMAT = 1


@dataclass(frozen=True)
class FileAction:
    """What install or uninstall did (or, with --dry-run, would do) to one file.

    ``action`` is one of: install (new file), update (replaced a file gputuned installed and
    nobody changed), unchanged, keep (left as it is: changed since install, or not gputuned's),
    remove, gone (was already missing).
    """

    path: str
    action: str
    sha256: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class Step:
    """One program run after the files: ok, failed, skipped (with why) or "would run"."""

    command: str
    result: str
    detail: str = ""
    #: "before" the files are touched (uninstall stops the service first), else "after".
    phase: str = "after"


@dataclass
class Report:
    command: str
    prefix: str
    dry_run: bool
    exec_start: str | None = None
    files: list[FileAction] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(s.result == "failed" for s in self.steps)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 3

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "command": self.command,
            "prefix": self.prefix,
            "dry_run": self.dry_run,
            "exec_start": self.exec_start,
            "record": RECORD,
            "files": [asdict(f) for f in self.files],
            "steps": [asdict(s) for s in self.steps],
        }


# ---- what is installed ------------------------------------------------------------------------


def systemd_quote(word: str) -> str:
    """The program word of an ExecStart= line, quoted as systemd.service(5) parses it.

    '%' starts a specifier everywhere on the line, so it is doubled; a path with '$' or a
    control character is refused rather than guessed at (systemd does not expand variables in
    the program word, and "$$" would stay doubled there).
    """
    if "$" in word or any(ord(ch) < 32 for ch in word):
        raise errors.GputunedError(
            f"the gputuned program's path {word!r} has '$' or a control character, which an "
            "ExecStart= line cannot hold; install gputuned under a plainer path"
        )
    word = word.replace("%", "%%")
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rewrite_exec_start(unit: str, exe: str) -> str:
    """The unit text with the program of its one ``ExecStart=`` line replaced by ``exe``."""
    lines = unit.splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if line.startswith("ExecStart=")]
    if len(found) != 1:
        raise errors.GputunedError(
            f"the shipped {UNIT_NAME} has {len(found)} ExecStart= lines, expected one: this "
            "installation of gputuned is damaged; reinstall it"
        )
    i = found[0]
    _program, _, args = lines[i].removeprefix("ExecStart=").rstrip("\n").partition(" ")
    lines[i] = f"ExecStart={systemd_quote(exe)}{' ' + args if args else ''}\n"
    return "".join(lines)


def wanted_files(exe: str) -> dict[str, bytes]:
    """Host path -> bytes of everything install-system puts in place."""
    unit = sysinstall.package_data("systemd")[UNIT_NAME].decode()
    out = {UNIT: rewrite_exec_start(unit, exe).encode()}
    out[RULE] = sysinstall.package_data("udev")[RULE_NAME]
    for name, data in sysinstall.package_data("profiles").items():
        if name.endswith(".toml"):
            out[f"{PROFILES_DIR}/{name}"] = data
    return out


def find_gputuned() -> str:
    """The ``gputuned`` root's unit will run, refused unless only root can change it, the
    Python it starts and the package that Python imports (:func:`check_roots_alone`)."""
    exe = sysinstall.entry_point("gputuned")
    if exe is None:
        raise errors.GputunedError(
            "cannot find the gputuned program of this installation (beside the Python running "
            "gputunectl, or on PATH); reinstall gputuned with pip, then run install-system again"
        )
    check_roots_alone(exe)
    return exe


#: How to make an installation only root can change (docs/systemd.md, "From a clone").
ROOT_INSTALL = (
    "sudo python3 -m venv /opt/gputuned && sudo /opt/gputuned/bin/pip install . && "
    "sudo /opt/gputuned/bin/gputunectl install-system"
)


def check_roots_alone(exe: str) -> None:
    """Raise :class:`errors.UnsafeInstall` unless root alone can change what the unit runs:
    ``exe``, the programs its ``#!`` starts, the gputuned package this Python imported and
    its site-packages, each with every link and folder on the way from / (issue 30, item 4:
    the ``gputuned`` of a venv in another user's clone gave root a unit running their files).
    """
    parts = [("it", exe)]
    parts += [(f"its interpreter {p}", p) for p in sysinstall.interpreter_of(exe)]
    parts += [(f"what it imports from {p}", p) for p in sysinstall.package_folders()]
    for what, path in parts:
        why = userfiles.untrusted_path(path)
        if why is not None:
            raise errors.UnsafeInstall(
                f"refused: root's unit would run {exe}, and {what} can be changed by a user "
                f"other than root ({why}); nothing was changed. Install gputuned as "
                f"root where only root can change it, and run that one's install-system: "
                f"{ROOT_INSTALL}"
            )


def read_record(kernel: Kernel) -> dict[str, str]:
    """Path -> SHA-256 of the files the last install-system put in place ({} if none)."""
    raw = hoststate.read_optional_bytes(kernel, RECORD)
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
        return {str(f["path"]): str(f["sha256"]) for f in data["files"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.GputunedError(
            f"{RECORD} is not what install-system writes ({exc}); nothing was changed. Move it "
            "aside to install afresh, or remove gputuned's files by hand"
        ) from exc


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- install ----------------------------------------------------------------------------------


def install_system(kernel: Kernel, *, exe: str, dry_run: bool = False) -> Report:
    """Put the unit, the udev rule and the profiles in place; reload systemd and udev."""
    report = Report("install-system", str(kernel.root), dry_run, exec_start=exe)
    recorded = read_record(kernel)
    wanted = wanted_files(exe)
    keep_record: dict[str, str] = {}
    for hpath, data in wanted.items():
        new = _sha(data)
        have = sysinstall.sha256_of(kernel, hpath)
        if have == new:
            report.files.append(FileAction(hpath, "unchanged", new))
        elif have is None or recorded.get(hpath) == have:
            report.files.append(FileAction(hpath, "install" if have is None else "update", new))
            if not dry_run:
                sysinstall.install_file(kernel, hpath, data)
        else:
            why = (
                "changed since gputuned installed it"
                if hpath in recorded
                else "not installed by gputuned"
            )
            report.files.append(
                FileAction(
                    hpath,
                    "keep",
                    have,
                    f"{why}: left as it is; move it aside and run install-system again to get "
                    "the shipped version",
                )
            )
            if hpath in recorded:
                keep_record[hpath] = recorded[hpath]
            continue
        keep_record[hpath] = new
    # Files an older version installed and this one no longer ships.
    for hpath, sha in recorded.items():
        if hpath in wanted:
            continue
        report.files.append(_remove_if_ours(kernel, hpath, sha, dry_run, "no longer shipped"))
    if not dry_run:
        record = {
            "format": RECORD_FORMAT,
            "gputuned_version": __version__,
            "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "exec_start": exe,
            "files": [{"path": p, "sha256": s} for p, s in keep_record.items()],
        }
        hoststate.replace_durable(
            kernel, RECORD, (json.dumps(record, indent=2) + "\n").encode(), mode=0o644
        )
    report.steps += _reload(kernel, dry_run)
    return report


# ---- uninstall --------------------------------------------------------------------------------


def uninstall_system(kernel: Kernel, *, dry_run: bool = False) -> Report:
    """Stop and disable the service, remove exactly the files install-system recorded and
    nobody changed since, then reload systemd and udev."""
    report = Report("uninstall-system", str(kernel.root), dry_run)
    recorded = read_record(kernel)
    if not recorded and not kernel.exists(RECORD):
        report.steps.append(
            Step("uninstall", "skipped", f"nothing to do: no {RECORD} (install-system not run)")
        )
        return report
    if UNIT in recorded:
        report.steps.append(
            replace(
                _systemctl(
                    kernel, dry_run, "disable", "--now", UNIT_NAME, why="no service to stop now"
                ),
                phase="before",
            )
        )
    for hpath, sha in recorded.items():
        report.files.append(_remove_if_ours(kernel, hpath, sha, dry_run, "installed by gputuned"))
    if not dry_run:
        hoststate.remove(kernel, RECORD)
        sysinstall.remove_dir_if_empty(kernel, PROFILES_DIR)
        sysinstall.remove_dir_if_empty(kernel, hoststate.ETC_DIR)
    report.files.append(FileAction(RECORD, "remove"))
    report.steps += _reload(kernel, dry_run)
    return report


def _remove_if_ours(kernel: Kernel, hpath: str, sha: str, dry_run: bool, why: str) -> FileAction:
    have = sysinstall.sha256_of(kernel, hpath)
    if have is None:
        return FileAction(hpath, "gone", None, "already removed")
    if have != sha:
        return FileAction(hpath, "keep", have, "changed since gputuned installed it: left as it is")
    if not dry_run:
        sysinstall.remove_file(kernel, hpath)
    return FileAction(hpath, "remove", have, why)


# ---- systemd and udev -------------------------------------------------------------------------


def _reload(kernel: Kernel, dry_run: bool) -> list[Step]:
    steps = [
        _systemctl(kernel, dry_run, "daemon-reload", why="systemd reads the unit when it starts")
    ]
    cmd = "udevadm control --reload"
    if not kernel.services:
        steps.append(Step(cmd, "skipped", _elsewhere(kernel)))
    elif not sysinstall.udevd_running(kernel):
        steps.append(
            Step(
                cmd,
                "skipped",
                f"systemd-udevd is not running (no {sysinstall.UDEV_CONTROL}); it reads the "
                "rule when it starts",
            )
        )
    else:
        steps.append(_run(cmd, dry_run))
    return steps


def _systemctl(kernel: Kernel, dry_run: bool, *args: str, why: str) -> Step:
    cmd = " ".join(("systemctl", *args))
    if not kernel.services:
        return Step(cmd, "skipped", _elsewhere(kernel))
    if not sysinstall.systemd_booted(kernel):
        return Step(
            cmd,
            "skipped",
            f"PID 1 is not systemd (no {sysinstall.SYSTEMD_RUNTIME}); {why}",
        )
    return _run(cmd, dry_run)


def _run(cmd: str, dry_run: bool) -> Step:
    argv = cmd.split()
    if sysinstall.which(argv[0]) is None:
        return Step(cmd, "skipped", f"{argv[0]} is not installed")
    if dry_run:
        return Step(cmd, "would run")
    done = sysinstall.run_tool(argv)
    if done.rc != 0:
        return Step(cmd, "failed", f"exit {done.rc}: {done.output}")
    return Step(cmd, "ok", done.output)


def _elsewhere(kernel: Kernel) -> str:
    return f"installed under {kernel.root}, not into the running system"


# ---- output -----------------------------------------------------------------------------------
