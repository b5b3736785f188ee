"""The shipped rules boost only the server: a real unprivileged user gets nothing from them.

A local user (``gputuned-atk``, made here when missing and removed again) tries what was seen
to work before the rules named an owner or a unit (issue 13): a script named ``vllm.py``,
``exec -a "python3 vllm"``, and a server in a user unit named like the system one
(``systemd-run --user --unit=inference.service``). This machine's init is not systemd, so no
real user unit can exist: the test makes the cgroup path such a unit would have in the
cgroup v2 hierarchy (``/user.slice/user-UID.slice/user@UID.service/app.slice/
inference.service``) and moves the process there, as systemd would have started it. For the
other side, root starts the same script in a fake *system* unit (``/system.slice/
inference.service``): the shipped ``server-unit`` rule must place that one.

The daemon runs with the shipped profiles' ``[[process]]`` rules exactly as shipped (their text
is copied from profiles/shared-host.toml), with CPU sets of this machine and no other table,
so that only processes can change; placement falls back to per-thread affinity here (no
cgroup v2 cpuset). Everything made here is removed again and every process killed by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gputuned.engine.journal import Journal
from gputuned.engine.plan import plan_profile
from gputuned.kernel.proc import read_process, read_uids
from gputuned.kernel.system import read_cgroup_layout
from gputuned.profile.load import load_profile
from gputuned.service.control import request
from tests.faults import live_kernel
from tests.integration.livedaemon import running_daemon
from tests.users import python_for, system_user

pytestmark = pytest.mark.usefixtures("as_root")

REPO = Path(__file__).resolve().parents[2]
USER = "gputuned-atk"
RUN_DIR = Path("/run/gputuned-atk")
UNIT = "inference.service"
SLEEPER = "import time\ntime.sleep(120)\n"


@dataclass(frozen=True)
class Attacker:
    uid: int
    gid: int
    python: str


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    with system_user(USER) as pw:
        python = python_for(pw.pw_uid, pw.pw_gid)
        if python is None:
            pytest.fail(f"no Python interpreter that {USER} may run")
        shutil.rmtree(RUN_DIR, ignore_errors=True)
        RUN_DIR.mkdir()
        RUN_DIR.chmod(0o755)
        try:
            (RUN_DIR / "vllm.py").write_text(SLEEPER)
            yield Attacker(pw.pw_uid, pw.pw_gid, python)
        finally:
            shutil.rmtree(RUN_DIR, ignore_errors=True)


def profile_rules(name: str, dest: Path, *, user: str | None = None) -> Path:
    """The ``[[process]]`` rules of profiles/NAME.toml as loaded (includes resolved), with
    this machine's CPU sets (CPU 1) and no other table; ``user``: the account swapped for
    another, for a positive control. Written as TOML (JSON strings are TOML strings)."""
    rules = [r.model_dump(mode="json", exclude_defaults=True) for r in load_profile(
        REPO / f"profiles/{name}.toml").process]  # fmt: skip
    spread = any(r.get("spread_threads") for r in rules)
    out = [
        f'name = "shipped-rules-{name}"',
        '[cpusets.inference]\ncpus = "1"',
        f'[cpuset]\nmode = "{"isolated" if spread else "root"}"\ncpus = "inference"',
        "[daemon]\ndrift_interval_s = 3600",
    ]
    for r in rules:
        match = dict(r.pop("match"))
        if user is not None and match.get("user") == "inference":
            match["user"] = user
        out.append("[[process]]")
        out += [f"{k} = {json.dumps(v)}" for k, v in r.items()]
        out += [f"match.{k} = {json.dumps(v)}" for k, v in match.items()]
    dest.write_text("\n".join(out) + "\n")
    return dest


def shipped_rules_profile(dest: Path, *, user: str | None = None) -> Path:
    """The [[process]] rules of profiles/shared-host.toml, verbatim (``user``: the account
    swapped for another, for the positive control), with this machine's CPU sets."""
    text = (REPO / "profiles/shared-host.toml").read_text()
    rules = text[text.index("[[process]]") : text.index("# No [bootargs]")]
    if user is not None:
        rules = rules.replace('match.user = "inference"', f'match.user = "{user}"')
    dest.write_text(
        'name = "shipped-rules"\n[cpusets.inference]\ncpus = "1"\n'
        '[cpuset]\nmode = "root"\ncpus = "inference"\n[daemon]\ndrift_interval_s = 3600\n' + rules
    )
    return dest


class Procs:
    """Processes started here, by PID; killed at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, argv: list[str], *, as_user: Attacker | None = None, cgroup: Path | None = None
    ) -> int:
        """Start ``argv`` (as ``as_user``), first moved into ``cgroup`` by root, as systemd
        starts a unit's process in the unit's cgroup: it is there when it execs."""
        if as_user is not None:
            argv = ["setpriv", f"--reuid={as_user.uid}", f"--regid={as_user.gid}",
                    "--clear-groups", *argv]  # fmt: skip
        if cgroup is not None:
            argv = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *argv]
        p = subprocess.Popen(argv, cwd="/", stdin=subprocess.DEVNULL)
        self.procs.append(p)
        return p.pid

    def kill(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def settle(pid: int, want_comm: str = "python3") -> None:
    """Wait until ``pid`` runs Python (setpriv and bash exec into it)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if read_process(live_kernel(), pid, threads=False).comm == want_comm:
            return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} did not become {want_comm}")


def boosted(pid: int) -> bool:
    p = read_process(live_kernel(), pid)
    return any(t.nice < 0 or t.affinity == frozenset({1}) for t in p.threads)


@contextlib.contextmanager
def fake_cgroups(mount: str, *rels: str) -> Iterator[list[Path]]:
    """Make the cgroups ``rels`` (as systemd would have for the units); remove what was made
    (once the processes in them are gone)."""
    made: list[Path] = []
    out = []
    try:
        for rel in rels:
            parts = [p for p in rel.split("/") if p]
            for i in range(len(parts)):
                d = Path(mount, *parts[: i + 1])
                if not d.is_dir():
                    d.mkdir()
                    made.append(d)
            out.append(Path(mount, *parts))
        yield out
    finally:
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()


def live_preconditions() -> str:
    """The cgroup v2 mount to make the units' cgroups in; skips or fails where the test
    cannot run here."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs: the rules place on CPU 1")
    if len(Journal(live_kernel())):
        pytest.fail("a profile is applied on this machine (journal not empty): not touched")
    mount = read_cgroup_layout(live_kernel()).v2_mount
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy to make the units' cgroup paths in")
    return mount


def test_shipped_rules_give_an_unprivileged_users_processes_nothing(
    attacker: Attacker, tmp_path: Path
) -> None:
    mount = live_preconditions()
    script = str(RUN_DIR / "vllm.py")
    prof = shipped_rules_profile(tmp_path / "shipped.toml")
    procs = Procs()
    uid = attacker.uid
    user_unit = f"/user.slice/user-{uid}.slice/user@{uid}.service/app.slice/{UNIT}"
    with (
        fake_cgroups(mount, user_unit, f"/system.slice/{UNIT}") as (in_user_unit, in_unit),
        running_daemon(prof, tmp_path) as d,
    ):
        try:
            a_script = procs.start([attacker.python, script], as_user=attacker)
            a_exec = procs.start(
                ["bash", "-c", f'exec -a "python3 vllm" {attacker.python} -c "{SLEEPER}"'],
                as_user=attacker,
            )
            a_unit = procs.start([attacker.python, script], as_user=attacker, cgroup=in_user_unit)
            server = procs.start([attacker.python, script], cgroup=in_unit)  # root's
            for pid in (a_script, a_exec, a_unit, server):
                settle(pid)
            cmd = read_process(live_kernel(), a_exec, threads=False).cmdline
            assert re.match(r"python3 vllm ", cmd), cmd
            assert read_process(live_kernel(), a_unit, threads=False).cgroup == user_unit
            deadline = time.monotonic() + 20
            while not boosted(server):
                assert time.monotonic() < deadline, "the server in its system unit not placed"
                time.sleep(0.02)
            status = request(live_kernel(), {"cmd": "status"})
            assert status["placed"] == [server], status["placed"]
            for pid in (a_script, a_exec, a_unit):
                assert not boosted(pid), pid
            # A full plan agrees: the server by its system unit, none of the user's processes.
            plan = plan_profile(live_kernel(), load_profile(prof), allow_blocked=True)
            by_rules = {c.data["pid"] for c in plan.settings if c.tuner == "process"}
            assert by_rules == {server}, by_rules
            # The positive control: the same rules naming root's account place root's process
            # by account too, and the user's still not. The test can tell them apart.
            ctl = load_profile(shipped_rules_profile(tmp_path / "ctl.toml", user="root"))
            got = {
                c.data["pid"]
                for c in plan_profile(live_kernel(), ctl, allow_blocked=True).settings
                if c.tuner == "process"
            }
            assert server in got and not got & {a_script, a_exec, a_unit}, got
            d.send_signal(signal.SIGTERM)
            assert d.wait(timeout=30) == 0
            assert not boosted(server)
        finally:
            procs.kill()
    assert len(Journal(live_kernel())) == 0


#: Run as the user: renames itself back and forth between what vLLM's setproctitle shows and
#: "python3" (a comm event each, which the daemon answers by matching again), then starts a
#: thread and a child under the server's name; prints the child's PID.
RENAMER = r"""
import ctypes, os, threading, time
libc = ctypes.CDLL(None)
for i in range(40):
    libc.prctl(15, b"VLLM::EngineCor" if i % 2 == 0 else b"python3", 0, 0, 0)
    time.sleep(0.01)
libc.prctl(15, b"VLLM::EngineCor", 0, 0, 0)
threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
child = os.fork()
if child == 0:
    libc.prctl(15, b"VLLM::Worker_TP", 0, 0, 0)
    time.sleep(120)
    os._exit(0)
print(child, flush=True)
time.sleep(120)
"""

#: What a local user can make their command line say: vLLM's and SGLang's entry points.
SPOOFS = (
    "python3 -m vllm.entrypoints.openai.api_server --model m",
    "python3 -m sglang.launch_server --model-path m",
    "/usr/bin/python3 /usr/local/bin/vllm serve m",
)


def gains(pid: int) -> list[str]:
    """What the process has that a local user cannot give themselves, or that the rules give
    (CPU 1 alone, the partition); [] when nothing."""
    p = read_process(live_kernel(), pid)
    out = []
    for t in p.threads:
        if t.nice < 0:
            out.append(f"thread {t.tid} nice {t.nice}")
        if t.policy in ("fifo", "rr"):
            out.append(f"thread {t.tid} policy {t.policy}")
        if t.affinity == frozenset({1}):
            out.append(f"thread {t.tid} CPUs of the rule")
    if "gputuned" in p.cgroup:
        out.append(f"cgroup {p.cgroup}")
    return out


def users_processes(uid: int) -> list[int]:
    kernel = live_kernel()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(Exception):
                if read_uids(kernel, int(d.name))[0] == uid:
                    out.append(int(d.name))
    return out


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "profiles").glob("*.toml")))
def test_no_shipped_profile_gives_a_local_user_anything(
    name: str, attacker: Attacker, tmp_path: Path
) -> None:
    """Issue 14, finding 3: the rules of every shipped profile, live, against a local user's
    processes named, renamed and spoofed to look like vLLM and SGLang (before the daemon and
    after it), a child and a thread of one, and one in a user unit named like the server's.
    Every process the user owns at the end has gained nothing; root's server in the system
    unit was placed by the same daemon (the rules work here)."""
    mount = live_preconditions()
    prof = profile_rules(name, tmp_path / f"{name}.toml")
    procs = Procs()
    uid = attacker.uid
    py = attacker.python
    user_unit = f"/user.slice/user-{uid}.slice/user@{uid}.service/app.slice/{UNIT}"

    def spoofed(argv0: str, cgroup: Path | None = None) -> int:
        cmd = f'exec -a "{argv0}" {py} -c "{SLEEPER}"'  # argv[0] holds the whole spoof
        return procs.start(["bash", "-c", cmd], as_user=attacker, cgroup=cgroup)

    with fake_cgroups(mount, user_unit, f"/system.slice/{UNIT}") as (in_user_unit, in_unit):
        try:
            # Before the daemon (found by its first scan) ...
            early = [procs.start([py, str(RUN_DIR / "vllm.py")], as_user=attacker)]
            early += [spoofed(s) for s in SPOOFS]
            for pid in early:
                settle(pid)
            with running_daemon(prof, tmp_path) as d:
                # ... and after it (found by exec, fork, rename and thread events).
                late = [spoofed(s) for s in SPOOFS]
                late.append(spoofed(SPOOFS[0], cgroup=in_user_unit))
                for pid in late:
                    settle(pid)
                renamer = subprocess.Popen(
                    ["setpriv", f"--reuid={uid}", f"--regid={attacker.gid}", "--clear-groups",
                     "bash", "-c", f'exec -a "{SPOOFS[0]}" {py} -c "$0"', RENAMER],
                    cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                )  # fmt: skip
                procs.procs.append(renamer)  # type: ignore[arg-type]
                assert renamer.stdout is not None
                int(renamer.stdout.readline())  # renamed, threaded and forked
                # Root's server last: once it is placed, the events before it were answered.
                server = procs.start([py, str(RUN_DIR / "vllm.py")], cgroup=in_unit)
                settle(server)
                deadline = time.monotonic() + 20
                while not gains(server):
                    assert time.monotonic() < deadline, "the server in its system unit not placed"
                    time.sleep(0.02)
                # The spoofs pass every key a user chooses (the shipped cmdline pattern):
                # only the owner or the unit, which they cannot choose, keeps them out.
                pattern = load_profile(prof).process[0].match.cmdline
                assert pattern is not None
                for pid in [*early, *late, renamer.pid]:
                    cmd = read_process(live_kernel(), pid, threads=False).cmdline
                    assert re.search(pattern, cmd), cmd
                theirs = users_processes(uid)
                assert len(theirs) >= len(early) + len(late) + 2, theirs
                got = {pid: g for pid in theirs if (g := gains(pid))}
                assert got == {}, got
                assert request(live_kernel(), {"cmd": "status"})["placed"] == [server]
                plan = plan_profile(live_kernel(), load_profile(prof), allow_blocked=True)
                claimed = {c.data["pid"] for c in plan.settings if c.tuner == "process"}
                assert not claimed & set(theirs), claimed
                # The control: the same rules naming the user's account claim their spoofs
                # (the test can tell a gain).
                ctl = load_profile(profile_rules(name, tmp_path / "ctl.toml", user=USER))
                by_control = {
                    c.data["pid"]
                    for c in plan_profile(live_kernel(), ctl, allow_blocked=True).settings
                    if c.tuner == "process"
                }
                assert set(early) <= by_control, (early, by_control)
                d.send_signal(signal.SIGTERM)
                assert d.wait(timeout=30) == 0
        finally:
            procs.kill()
            kill_users_processes(uid)  # the renamer's child: started here, by PID
    assert len(Journal(live_kernel())) == 0


def kill_users_processes(uid: int) -> None:
    """Kill the processes the test made as ``uid`` (the user is made for the test), so that
    the user can be removed."""
    deadline = time.monotonic() + 10
    while pids := users_processes(uid):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert time.monotonic() < deadline, f"processes of uid {uid} left: {pids}"
        time.sleep(0.05)
