"""Crash points: SIGKILL at every write of a full apply and of a revert, then restart; exact revert.

Enumerated, not sampled: ``GPUTUNED_FAILPOINT=kill-before-write:N`` (the journal entry of write N
is on disk, the write is not done) and ``kill-after-write:N`` (write N is done, the next journal
entry is not) for every N from 1 to the number of writes, and N + 1 to show the run then ends
normally. Four scenarios, each point on its own copy of the tree:

- ``gputunectl apply`` killed, then a revert (``revert_all`` on a new Host: what
  ``gputunectl revert`` runs, reading the journal the killed process left; in-process to keep
  the suite fast; ``test_torn_journal_line_is_ignored`` runs the real command);
- ``gputunectl revert`` killed (after a complete apply), then a revert again;
- the daemon killed during its start apply, then restarted (it adopts the journal, applies the
  profile on top) and stopped with SIGTERM (it reverts);
- the daemon killed during its stop revert, then restarted and stopped the same way.

After each: the tree is byte-identical to the tree before the first apply and the journal is
gone. The tree is degraded-link with a two-thread server process and profiles/shared-host.toml
(cgroup partition, IRQs, the server's nice, affinity and cgroup). Points run two at a time
(the CI machine kind has 2 vCPUs); every command and daemon is a new process forked from a
server that imported gputuned once, and runs its module as ``python3 -m`` would
(tests/reliability/forked.py; ``test_torn_journal_line_is_ignored`` runs a real ``python3 -m``).
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gputuned import errors
from gputuned.engine.apply import apply_profile, revert_all
from gputuned.profile.load import load_profile
from gputuned.service.control import daemon_running, request
from gputuned.store.state import JOURNAL
from tests.conftest import TREES_DIR
from tests.fakeproc import add_process, add_user
from tests.faults import tree_kernel
from tests.reliability import forked
from tests.reliability.conftest import cli, diff_keys, subprocess_env
from tests.unit.test_apply import PROFILES, SERVER_PID, SERVER_UID, SERVER_USER, digest

TREE = "degraded-link"
WORKERS = 2


def make_tree(dest: Path) -> Path:
    root = dest / TREE
    shutil.copytree(TREES_DIR / TREE, root, symlinks=True)
    add_user(root, SERVER_USER, SERVER_UID)
    add_process(
        root,
        SERVER_PID,
        comm="python3",
        cmdline=["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"],
        exe="/usr/bin/python3.11",
        start_time=123456,
        threads=[SERVER_PID, SERVER_PID + 1],
        cpus=(root / "sys/devices/system/cpu/online").read_text().strip(),
        uid=SERVER_UID,
    )
    return root


@dataclass(frozen=True)
class Point:
    scenario: str
    when: str  # "before" | "after"
    n: int


@dataclass
class Outcome:
    point: Point
    killed: bool
    exact: bool
    detail: str = ""


class Gauntlet:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.template = make_tree(work / "template")
        self.before = digest(self.template)
        self.profile = work / "shared-host.toml"
        shutil.copy(PROFILES / "shared-host.toml", self.profile)
        self._n = 0

    def fresh(self) -> Path:
        self._n += 1
        dest = self.work / f"p{self._n}"
        shutil.copytree(self.template, dest / TREE, symlinks=True)
        return dest / TREE

    def counts(self) -> tuple[int, int]:
        """(writes of a full apply, writes of its revert), counted in-process on a copy."""
        root = self.fresh()
        host = tree_kernel(root)
        apply_profile(host, load_profile(self.profile))
        rev = tree_kernel(root)
        revert_all(rev)
        assert digest(root) == self.before
        return len(host.writes), len(rev.writes)

    def check(self, root: Path) -> tuple[bool, str]:
        after = digest(root)
        journal = (root / JOURNAL.lstrip("/")).exists()
        ok = after == self.before and not journal
        return ok, "" if ok else f"differs: {diff_keys(self.before, after)[:4]} journal={journal}"

    # -- the one-shot CLI ------------------------------------------------------------------

    def cli_apply(self, p: Point) -> Outcome:
        root = self.fresh()
        fp = {"GPUTUNED_FAILPOINT": f"kill-{p.when}-write:{p.n}"}
        run = forked.run(
            "gputuned.cli", "apply", "--root", str(root), str(self.profile),
            env=subprocess_env() | fp,
        )  # fmt: skip
        killed = run.returncode == -signal.SIGKILL
        if not killed and run.returncode != 0:
            return Outcome(p, False, False, f"apply rc {run.returncode}: {run.stderr[-300:]}")
        rev = revert_all(
            tree_kernel(root)
        )  # what `gputunectl revert` runs, from the journal on disk
        ok, why = self.check(root)
        return Outcome(p, killed, ok and not rev.failed, why or str(rev.failed))

    def cli_revert(self, p: Point) -> Outcome:
        root = self.fresh()
        apply_profile(tree_kernel(root), load_profile(self.profile), source=str(self.profile))
        fp = {"GPUTUNED_FAILPOINT": f"kill-{p.when}-write:{p.n}"}
        run = forked.run("gputuned.cli", "revert", "--root", str(root), env=subprocess_env() | fp)
        killed = run.returncode == -signal.SIGKILL
        if not killed and run.returncode != 0:
            return Outcome(p, False, False, f"revert rc {run.returncode}: {run.stderr[-300:]}")
        if killed:
            rev = revert_all(tree_kernel(root))
            if rev.failed:
                return Outcome(p, True, False, f"second revert failed: {rev.failed}")
        ok, why = self.check(root)
        return Outcome(p, killed, ok, why)

    # -- the daemon --------------------------------------------------------------------------

    def daemon(self, root: Path, failpoint: str | None) -> forked.Forked:
        env = subprocess_env()
        env.pop("NOTIFY_SOCKET", None)
        if failpoint:
            env["GPUTUNED_FAILPOINT"] = failpoint
        return forked.Forked(
            "gputuned.daemon", ["--root", str(root), "--profile", str(self.profile)], env
        )

    @staticmethod
    def wait_ready(proc: forked.Forked, root: Path, timeout: float = 30) -> bool:
        """True once the daemon answers a status (the socket is there before the start apply,
        its first answer after it); False if the daemon exits first."""
        host = tree_kernel(root)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            if daemon_running(host):
                try:
                    request(host, {"cmd": "status"}, timeout=max(0.1, deadline - time.monotonic()))
                except errors.GputunedError:
                    continue  # killed mid-apply: the connection closed unanswered
                return True
            time.sleep(0.02)
        raise AssertionError("daemon not ready within 30 s")

    def restart_and_stop(self, root: Path) -> tuple[bool, str]:
        """The recovery: a fresh daemon adopts the journal; SIGTERM makes it revert."""
        d = self.daemon(root, None)
        if not self.wait_ready(d, root):
            return False, f"restarted daemon exited {d.wait()}: {d.communicate()[1][-400:]}"
        d.send_signal(signal.SIGTERM)
        _, err = d.communicate(timeout=30)
        if d.returncode != 0:
            return False, f"restarted daemon exit {d.returncode}: {err[-400:]}"
        return True, ""

    def daemon_apply(self, p: Point) -> Outcome:
        root = self.fresh()
        d = self.daemon(root, f"kill-{p.when}-write:{p.n}")
        ready = self.wait_ready(d, root)
        if ready:  # the point lies past the start apply: the end of this enumeration
            d.send_signal(signal.SIGTERM)
        d.communicate(timeout=30)
        if d.returncode == -signal.SIGKILL:  # in the start apply, or (when ready) its revert
            ok, why = self.restart_and_stop(root)
            if not ok:
                return Outcome(p, not ready, False, why)
        ok, why = self.check(root)
        return Outcome(p, not ready, ok, why)

    def daemon_revert(self, p: Point) -> Outcome:
        root = self.fresh()
        d = self.daemon(root, f"kill-{p.when}-write:{p.n}")
        if not self.wait_ready(d, root):
            return Outcome(p, False, False, f"killed before ready: {d.communicate()[1][-300:]}")
        d.send_signal(signal.SIGTERM)
        d.communicate(timeout=30)
        killed = d.returncode == -signal.SIGKILL
        if not killed and d.returncode != 0:
            return Outcome(p, False, False, f"daemon exit {d.returncode}")
        if killed:
            ok, why = self.restart_and_stop(root)
            if not ok:
                return Outcome(p, True, False, why)
        ok, why = self.check(root)
        return Outcome(p, killed, ok, why)


def test_crash_points(tmp_path: Path, terminal: list[str]) -> None:
    g = Gauntlet(tmp_path)
    writes, reverts = g.counts()
    assert writes >= 10 and reverts >= writes
    # N runs 1..last+1: the last point must end normally, every other must be a kill.
    plan: list[tuple[Point, Callable[[Point], Outcome]]] = []
    for when in ("before", "after"):
        plan += [(Point("gputunectl apply", when, n), g.cli_apply) for n in range(1, writes + 2)]
        plan += [(Point("gputunectl revert", when, n), g.cli_revert) for n in range(1, reverts + 2)]
        plan += [
            (Point("daemon start apply", when, n), g.daemon_apply) for n in range(1, writes + 2)
        ]
        # The daemon's revert writes follow its apply writes in its one write counter.
        plan += [
            (Point("daemon stop revert", when, n), g.daemon_revert)
            for n in range(writes + 1, writes + reverts + 2)
        ]
    t0 = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        outcomes = list(pool.map(lambda job: job[1](job[0]), plan))
    seconds = time.monotonic() - t0

    terminal.append(
        f"crash points on {TREE} + shared-host.toml ({writes} writes per apply, {reverts} per "
        f"revert), {seconds:.0f} s:"
    )
    terminal.append("| scenario | kill | points (N) | killed | restored byte-exact |")
    terminal.append("|---|---|---|---|---|")
    problems = []
    for scenario in dict.fromkeys(p.scenario for p, _ in plan):
        for when in ("before", "after"):
            mine = [o for o in outcomes if o.point.scenario == scenario and o.point.when == when]
            last = max(o.point.n for o in mine)
            for o in mine:
                if o.killed != (o.point.n != last):
                    problems.append(f"{o.point}: killed={o.killed} {o.detail}")
                if not o.exact:
                    problems.append(f"{o.point}: {o.detail}")
            ns = sorted(o.point.n for o in mine if o.killed)
            terminal.append(
                f"| {scenario} | {when} write N | {ns[0]}..{ns[-1]} | {len(ns)} | "
                f"{sum(o.exact for o in mine if o.killed)} |"
            )
    tried = sum(o.killed for o in outcomes)
    survived = sum(o.killed and o.exact for o in outcomes)
    terminal.append(f"crash points: {tried} tried, {survived} survived")
    assert not problems, problems[:10]
    assert tried == survived == 2 * (2 * writes + 2 * reverts)


def test_torn_journal_line_is_ignored(tmp_path: Path) -> None:
    """A crash in the middle of a journal append leaves a torn last line: revert ignores it."""
    g = Gauntlet(tmp_path)
    writes, _ = g.counts()
    root = g.fresh()
    run = cli(
        "apply", "--root", str(root), str(g.profile),
        env={"GPUTUNED_FAILPOINT": f"kill-before-write:{writes // 2}"},
    )  # fmt: skip
    assert run.returncode == -signal.SIGKILL
    journal = root / JOURNAL.lstrip("/")
    with journal.open("ab") as f:
        f.write(b'{"v": 1, "op": "save", "entry": {"key": "sysfs:/proc/irq/4')
    rev = cli("revert", "--root", str(root))
    assert rev.returncode == 0, rev.stderr
    assert g.check(root) == (True, "")
