"""gputuned as a benchmark drives it for a condition: the daemon started as a child with
``--profile``, asked over its socket, stopped (SIGTERM: it reverts) and checked; and the profile
copies whose one rule matches only what the benchmark starts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from harness.children import Children


class Gputuned:
    """Start ``gputuned --profile`` as a child, register PIDs, stop it (SIGTERM: it reverts)."""

    def __init__(self, children: Children, log: IO[bytes]) -> None:
        from gputuned.kernel.live import LiveKernel
        from gputuned.store.state import ACTIVE, STATE, read_optional_bytes

        self.children, self.log, self.host = children, log, LiveKernel()
        self.proc: subprocess.Popen[bytes] | None = None
        #: How the daemon is run; benchmarks/reaction.py --breakdown runs it through
        #: benchmarks/daemon_trace.py.
        self.launcher = [sys.executable, "-m", "gputuned.daemon"]
        check_untuned(self.host)
        # The daemon records its profile as the active one; put back what was there.
        self.saved = {p: read_optional_bytes(self.host, p) for p in (ACTIVE, STATE)}

    def start(self, profile: Path, timeout: float = 60.0) -> float:
        from gputuned.service.control import daemon_running

        t0 = time.monotonic()
        argv = [*self.launcher, "--profile", str(profile.absolute())]
        self.proc = self.children.start(
            argv, death_signal=signal.SIGTERM, stdout=self.log, stderr=subprocess.STDOUT
        )
        while not daemon_running(self.host):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gputuned exited with status {self.proc.returncode}; see its log"
                )
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"gputuned did not open its control socket in {timeout:g} s")
            time.sleep(0.05)
        # The socket comes up before the start's apply; its first answer comes after it.
        self.request({"cmd": "status"})
        return time.monotonic() - t0

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        from gputuned.service.control import request

        return request(self.host, msg)

    def stop(self) -> dict[str, Any]:
        """SIGTERM (the daemon reverts), then check that nothing is left applied."""
        from gputuned.engine.journal import Journal
        from gputuned.store.state import remove, replace_durable

        assert self.proc is not None
        rc = self.children.stop(self.proc, wait=60.0)
        self.proc = None
        left = len(Journal(self.host))
        if rc != 0 or left:
            from gputuned.engine.apply import revert_all

            rep = revert_all(self.host, forget_profile=False)
            print(f"gputuned exited {rc} leaving {left} journal entries; reverted: {rep.to_json()}")
        for path, data in self.saved.items():
            if data is None:
                remove(self.host, path)
            else:
                replace_durable(self.host, path, data, mode=0o644)
        return {"exit_status": rc, "journal_entries_left": left}


def check_untuned(host: Any) -> None:
    from gputuned.engine.journal import Journal
    from gputuned.service.control import daemon_running

    if os.geteuid() != 0:
        sys.exit("the gputuned conditions need root (or run with --no-gputuned)")
    if daemon_running(host):
        sys.exit("a gputuned daemon runs already: stop it (the clean windows must be untuned)")
    if len(Journal(host)):
        sys.exit("a profile is applied here (journal not empty): gputunectl revert first")


def isolated_profile(
    profile: Path,
    work: Path,
    cmdline: str = "(?!)",
    rule_name: str | None = None,
    uid: int | None = None,
) -> Path:
    """``profile`` with one [[process]] rule (``rule_name``, default the first), matching only
    ``cmdline`` (default: nothing) of processes run by ``uid`` (default: this process's).

    On a machine others use too, the shipped rule would also place their vLLM-like processes.
    What the rule does (CPUs, nice, policy, partition, children) is kept; only ``match``
    changes, and it still names an account, as a rule that grants CPUs or a negative nice must.
    ``profile``'s folder is copied into ``work/base`` and included from there: an include must
    lie beside the including file or below its folder.
    """
    from gputuned.profile.load import load_profile

    rules = load_profile(profile).process
    chosen = next((r for r in rules if r.name == rule_name), rules[0])
    rule = chosen.model_dump(mode="json", by_alias=True, exclude_none=True)
    rule["match"] = {"cmdline": cmdline, "uid": os.geteuid() if uid is None else uid}
    base = work / "base"
    # The profile may itself lie in ``work`` (reaction.py writes one there for
    # realtime_priority): the copy must not copy itself into itself.
    skip = base.resolve()
    shutil.copytree(
        profile.absolute().parent,
        base,
        dirs_exist_ok=True,
        ignore=lambda d, names: [n for n in names if (Path(d) / n).resolve() == skip],
    )
    lines = [f"include = [{json.dumps(f'base/{profile.name}')}]", "", "[[process]]"]
    for key, value in rule.items():
        for k, v in value.items() if isinstance(value, dict) else [(None, value)]:
            lines.append(f"{key}.{k} = {_toml(v)}" if k else f"{key} = {_toml(v)}")
    out = work / f"{profile.stem}.toml"
    out.write_text("\n".join(lines) + "\n")
    return out


def _toml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v) if isinstance(v, int) else json.dumps(v)


def start_time(pid: int) -> int:
    """proc(5) stat field 22: with the PID, a process's identity (register sends both)."""
    from gputuned.kernel.live import LiveKernel
    from gputuned.kernel.proc import read_identity

    return read_identity(LiveKernel(), pid)[0]


def wait_placed(pids: list[int], wanted: int | None, timeout: float = 60.0) -> float | None:
    """Seconds until every thread of ``pids`` has nice ``wanted`` (None: not waited for)."""
    if wanted is None:
        return None
    from gputuned import errors
    from gputuned.kernel.live import LiveKernel
    from gputuned.kernel.proc import read_process

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if all(t.nice == wanted for p in pids for t in read_process(LiveKernel(), p).threads):
                return round(time.monotonic() - t0, 3)
        except errors.TargetGone:
            pass
        time.sleep(0.01)
    print(f"  WARNING: not every thread of {pids} had nice {wanted} within {timeout:.0f} s")
    return None
