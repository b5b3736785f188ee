"""A small client for qemu-guest-agent over QEMU's virtio-serial chardev socket.

The guest needs no network: QEMU exposes the agent's port as a Unix socket on the host
(``-chardev socket,path=...,server=on,wait=off`` plus a ``virtserialport`` named
``org.qemu.guest_agent.0``). The protocol is QMP-like JSON, one object per line
(https://qemu-project.gitlab.io/qemu/interop/qemu-ga-ref.html):

- ``guest-sync-delimited`` resynchronises: the agent answers with a 0xFF byte and then the
  id we sent, so stale answers from an earlier, timed-out exchange are skipped;
- ``guest-exec`` starts a program and returns its PID; ``guest-exec-status`` says whether it
  exited, with its exit code and its stdout/stderr in base64;
- ``guest-file-open``/``-write``/``-close`` copy files in.

Until the agent runs, what we write waits in QEMU's buffer or is lost; ``sync`` therefore retries
with fresh ids until the agent answers.
"""

from __future__ import annotations

import base64
import json
import random
import shlex
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: PATH for commands the agent runs: the project's venv first, then the usual system paths.
GUEST_PATH = "/opt/gputuned/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class AgentError(AssertionError):
    """The agent did not answer, or answered with an error."""


@dataclass(frozen=True)
class GuestResult:
    cmd: str
    rc: int
    out: str
    err: str
    seconds: float

    def __str__(self) -> str:
        return (
            f"guest$ {self.cmd}\n(exit {self.rc} after {self.seconds:.1f} s)\n"
            f"--- stdout\n{self.out.rstrip()}\n--- stderr\n{self.err.rstrip()}"
        )


class GuestAgent:
    """One connection to the agent's socket. Not thread safe; one request at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock: socket.socket | None = None
        self.buf = b""

    # ---- connection -------------------------------------------------------------------------

    def connect(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(str(self.path))
            except OSError as exc:
                s.close()
                if time.monotonic() > deadline:
                    raise AgentError(f"cannot connect to {self.path}: {exc}") from exc
                time.sleep(0.2)
                continue
            self.sock, self.buf = s, b""
            return

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _send(self, data: bytes) -> None:
        if self.sock is None:
            raise AgentError("not connected to the guest agent")
        self.sock.sendall(data)

    def _read_line(self, deadline: float) -> bytes | None:
        """The next newline-terminated chunk, or None when ``deadline`` passes first."""
        assert self.sock is not None
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not chunk:
                raise AgentError("the guest agent's socket closed (QEMU exited?)")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def sync(self, timeout: float, alive: Callable[[], bool] = lambda: True) -> float:
        """Wait until the agent answers; seconds waited.

        While the guest boots, QEMU may drop our connection (the guest side of the port is
        opened and closed as qemu-ga starts): reconnect and go on until ``timeout``, unless
        ``alive()`` says QEMU itself is gone.
        """
        t0 = time.monotonic()
        deadline = t0 + timeout
        last: Exception | None = None
        while True:
            if not alive():
                raise AgentError(f"QEMU exited while waiting for the guest agent ({last})")
            try:
                if self.sock is None:
                    self.connect(timeout=max(0.5, deadline - time.monotonic()))
                if self._sync_once(min(deadline, time.monotonic() + 3.0)):
                    return time.monotonic() - t0
            except (OSError, AgentError) as exc:
                last = exc
                self.close()
                time.sleep(0.5)
            if time.monotonic() >= deadline:
                raise AgentError(f"the guest agent did not answer within {timeout:.0f} s ({last})")

    def _sync_once(self, until: float) -> bool:
        ident = random.randrange(1, 2**31)
        # 0xFF first: makes the agent's JSON parser drop any half-written request.
        req = {"execute": "guest-sync-delimited", "arguments": {"id": ident}}
        self._send(b"\xff" + json.dumps(req).encode() + b"\n")
        while True:
            line = self._read_line(until)
            if line is None:
                return False
            line = line.lstrip(b"\xff").strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("return") == ident:
                return True

    def call(
        self, command: str, arguments: dict[str, Any] | None = None, *, timeout: float = 30.0
    ) -> Any:
        req: dict[str, Any] = {"execute": command}
        if arguments:
            req["arguments"] = arguments
        self._send(json.dumps(req).encode() + b"\n")
        deadline = time.monotonic() + timeout
        while True:
            line = self._read_line(deadline)
            if line is None:
                raise AgentError(f"{command}: no answer within {timeout:.0f} s")
            line = line.lstrip(b"\xff").strip()
            if not line:
                continue
            msg = json.loads(line)
            if "error" in msg:
                raise AgentError(f"{command}: {msg['error'].get('desc', msg['error'])}")
            if "return" in msg:
                return msg["return"]

    def send_only(self, command: str, arguments: dict[str, Any] | None = None) -> None:
        """A request whose answer may never come (guest-shutdown)."""
        req: dict[str, Any] = {"execute": command}
        if arguments:
            req["arguments"] = arguments
        self._send(json.dumps(req).encode() + b"\n")

    # ---- programs -----------------------------------------------------------------------------

    def spawn(self, argv: Sequence[str], *, stdin: bytes | None = None) -> int:
        args: dict[str, Any] = {
            "path": argv[0],
            "arg": list(argv[1:]),
            "capture-output": True,
            "env": [f"PATH={GUEST_PATH}", "LANG=C.UTF-8", "HOME=/root", "TERM=dumb"],
        }
        if stdin is not None:
            args["input-data"] = base64.b64encode(stdin).decode()
        return int(self.call("guest-exec", args)["pid"])

    def wait(self, pid: int, timeout: float, what: str) -> tuple[int, str, str]:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            st = self.call("guest-exec-status", {"pid": pid})
            if st.get("exited"):
                out = base64.b64decode(st.get("out-data", "")).decode(errors="replace")
                err = base64.b64decode(st.get("err-data", "")).decode(errors="replace")
                rc = int(st["exitcode"]) if "exitcode" in st else 128 + int(st.get("signal", 0))
                return rc, out, err
            if time.monotonic() > deadline:
                raise AgentError(f"guest$ {what}: still running after {timeout:.0f} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def sh(self, script: str, *, timeout: float = 120.0, stdin: bytes | None = None) -> GuestResult:
        """Run ``script`` with /bin/sh in the guest; the caller checks the exit code."""
        t0 = time.monotonic()
        pid = self.spawn(["/bin/sh", "-c", script], stdin=stdin)
        rc, out, err = self.wait(pid, timeout, script)
        return GuestResult(script, rc, out, err, time.monotonic() - t0)

    def run(self, argv: Sequence[str], *, timeout: float = 120.0) -> GuestResult:
        t0 = time.monotonic()
        pid = self.spawn(argv)
        cmd = shlex.join(argv)
        rc, out, err = self.wait(pid, timeout, cmd)
        return GuestResult(cmd, rc, out, err, time.monotonic() - t0)

    # ---- files --------------------------------------------------------------------------------

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        handle = self.call("guest-file-open", {"path": path, "mode": "wb"})
        try:
            for i in range(0, len(data), 1 << 18):
                chunk = data[i : i + (1 << 18)]
                self.call(
                    "guest-file-write",
                    {"handle": handle, "buf-b64": base64.b64encode(chunk).decode()},
                )
        finally:
            self.call("guest-file-close", {"handle": handle})
        res = self.run(["chmod", f"{mode:o}", path])
        if res.rc != 0:
            raise AgentError(str(res))

    def read_file(self, path: str) -> bytes:
        handle = self.call("guest-file-open", {"path": path, "mode": "rb"})
        out = b""
        try:
            while True:
                r = self.call("guest-file-read", {"handle": handle, "count": 1 << 20})
                out += base64.b64decode(r.get("buf-b64", ""))
                if r.get("eof") or not r.get("count"):
                    return out
        finally:
            self.call("guest-file-close", {"handle": handle})
