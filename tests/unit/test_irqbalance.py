"""irqbalance coordination against a fake irqbalance speaking its socket protocol."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputuned.cpulist import format_cpulist, format_mask, parse_cpulist
from gputuned.engine.apply import apply_profile, read_state, revert_all
from gputuned.engine.plan import plan_profile
from gputuned.engine.verify import verify_plan
from gputuned.profile.load import load_profile, parse_profile
from tests.fakeproc import add_process
from tests.faults import tree_kernel
from tests.unit.test_apply import PROFILES, tree_copy

PID = 700


class FakeIrqbalance:
    """Answers like irqbalance.c sock_handle: setup, settings cpus, settings ban irqs."""

    def __init__(self, path: Path, banned: frozenset[int] = frozenset()) -> None:
        self.banned = banned
        self.irqs: tuple[int, ...] = ()
        self.log: list[str] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)  # sun_path is 108 bytes at most
        try:
            self.sock.bind(f"/proc/self/fd/{fd}/{path.name}")
        finally:
            os.close(fd)
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                msg = b""
                while chunk := conn.recv(4096):
                    msg += chunk
                text = msg.decode()
                self.log.append(text)
                self.answer(conn, text)

    def answer(self, conn: socket.socket, text: str) -> None:
        """One request: ``setup`` is answered with the IRQs and CPUs banned, ``settings ...``
        changes them at once (subclasses answer otherwise)."""
        if text == "setup":
            irqs = "".join(f"IRQ {n} LOAD 0 DIFF 0 CLASS 5 " for n in self.irqs)
            conn.sendall(f"SLEEP 10 {irqs}BANNED {format_mask(self.banned, 16)}".encode())
        else:
            self.take(text)

    def take(self, text: str) -> None:
        if text.startswith("settings cpus "):
            arg = text.removeprefix("settings cpus ")
            self.banned = frozenset() if arg == "NULL" else parse_cpulist(arg)
        elif text.startswith("settings ban irqs "):
            arg = text.removeprefix("settings ban irqs ")
            self.irqs = () if arg == "NONE" else tuple(int(n) for n in arg.split())

    def close(self) -> None:
        """Stop answering, leaving the socket file behind as a crashed irqbalance does."""
        with contextlib.suppress(OSError):  # shutdown wakes the accept() in the server thread
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(timeout=2)


def running_irqbalance(root: Path) -> FakeIrqbalance:
    """irqbalance's process in the tree at ``root``, and its socket answering (close it)."""
    add_process(
        root,
        PID,
        comm="irqbalance",
        cmdline=["/usr/sbin/irqbalance", "--foreground"],
        exe="/usr/sbin/irqbalance",
        start_time=500,
        cgroup="/system.slice/irqbalance.service",
    )
    return FakeIrqbalance(root / f"run/irqbalance/irqbalance{PID}.sock")


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, FakeIrqbalance]]:
    root = tree_copy("h200-captured", tmp_path)
    fake = running_irqbalance(root)
    yield root, fake
    fake.close()


def test_coordinate_bans_partition_cpus_and_gpu_irqs_then_reverts(
    tree: tuple[Path, FakeIrqbalance],
) -> None:
    root, fake = tree
    prof = load_profile(PROFILES / "shared-host.toml")
    plan = plan_profile(tree_kernel(root), prof)
    got = {c.target: (c.current, c.wanted) for c in plan.changes if c.kind == "irqbalance"}
    assert got == {
        f"irqbalance (PID {PID}) banned cpus": ("-", "1-15"),
        f"irqbalance (PID {PID}) banned irqs": ("-", "42 43 44 45 46 47 48 49"),
    }
    _, report = apply_profile(tree_kernel(root), prof)
    assert report.failed == []
    assert format_cpulist(fake.banned) == "1-15"
    assert fake.irqs == tuple(range(42, 50))
    assert "settings cpus 1-15" in fake.log
    rep = verify_plan(plan_profile(tree_kernel(root), prof), read_state(tree_kernel(root)))
    assert rep.exit_code == 0 and rep.count("drifted") == 0
    fake.banned = frozenset({3})  # someone changed irqbalance's settings behind our back
    rep = verify_plan(plan_profile(tree_kernel(root), prof), read_state(tree_kernel(root)))
    assert [ln.target for ln in rep.lines if ln.status == "drifted"] == [
        f"irqbalance (PID {PID}) banned cpus"
    ]
    fake.banned = parse_cpulist("1-15")
    assert revert_all(tree_kernel(root)).failed == []
    assert fake.banned == frozenset() and fake.irqs == ()
    settings = [m for m in fake.log if m.startswith("settings")]
    assert settings[-2:] == ["settings ban irqs NONE", "settings cpus NULL"]


def test_report_mode_states_the_conflict(tree: tuple[Path, FakeIrqbalance]) -> None:
    root, fake = tree
    prof = parse_profile(
        {
            "name": "r",
            "cpusets": {"hk": {"cpus": "0"}},
            "irq": {"others_cpus": "hk", "irqbalance": "report"},
        },
        "t",
    )
    plan = plan_profile(tree_kernel(root), prof)
    (r,) = [r for r in plan.refused if r.target == "irqbalance"]
    assert r.reason.startswith(f"irqbalance runs (PID {PID}) and will move IRQs back")
    assert fake.log == []


def test_dead_socket_is_reported_not_fatal(tree: tuple[Path, FakeIrqbalance]) -> None:
    root, fake = tree
    fake.close()
    plan = plan_profile(tree_kernel(root), load_profile(PROFILES / "shared-host.toml"))
    (r,) = [r for r in plan.refused if r.target == "irqbalance"]
    assert "its socket did not answer" in r.reason
