"""Reading a server's Prometheus endpoint: one deadline for the whole answer, no redirects, and
a local endpoint read only when its socket belongs to the server trial measures (or root).

Each test serves from a real socket on 127.0.0.1 in a thread of this process: its owner is
this process's user, which the tests name as the server's (or not). A listener of another
real user is tests/integration/test_trial_live.py's."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.cli.main import main
from gputuned.trial.scrape import parse_target, scrape

ME = os.geteuid()
OK = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n"


@contextlib.contextmanager
def serving(answer: Callable[[socket.socket], None]) -> Iterator[tuple[int, list[bytes]]]:
    """A listener on 127.0.0.1 whose every connection gets ``answer``; (port, requests)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.1)
    seen: list[bytes] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(5)
                request = conn.recv(4096)
                if request:  # a client refused before its request sends none
                    seen.append(request)
                    answer(conn)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield listener.getsockname()[1], seen
    finally:
        stop.set()
        t.join()
        listener.close()


def trickle(
    head: bytes, tail: bytes, every: float = 0.1, for_s: float = 3.0
) -> Callable[..., None]:
    """Send ``head`` at once, then ``tail`` one byte each ``every`` seconds, for ``for_s``."""

    def answer(conn: socket.socket) -> None:
        conn.sendall(head)
        end = time.monotonic() + for_s
        for b in tail:
            if time.monotonic() > end:
                return
            conn.sendall(bytes([b]))
            time.sleep(every)

    return answer


def plain(body: bytes, head: bytes = OK) -> Callable[[socket.socket], None]:
    return lambda conn: conn.sendall(head + body)


def test_an_endpoint_is_read() -> None:
    with serving(plain(b"# HELP x\nx_total 7\n")) as (port, seen):
        got = scrape(parse_target(f"http://127.0.0.1:{port}/metrics#x"), owners=[ME])
    assert (got.kind, got.value) == ("value", 7.0)
    assert seen[0].startswith(b"GET /metrics HTTP/1.")


@pytest.mark.parametrize(
    "answer",
    [
        # a full sample at once, then one byte every 0.1 s: each read is quick, the whole is not
        trickle(OK + b"x 1\n", b"#" * 1000),
        # the status line and headers themselves trickled
        trickle(b"", OK + b"x 1\n" + b"#" * 1000),
    ],
    ids=["body", "headers"],
)
def test_one_deadline_holds_for_the_whole_answer_and_its_values_are_not_used(
    answer: Callable[[socket.socket], None],
) -> None:
    with serving(answer) as (port, _seen):
        t0 = time.monotonic()
        with pytest.raises(errors.HostError) as exc:
            scrape(parse_target(f"http://127.0.0.1:{port}/metrics#x"), owners=[ME], timeout=0.5)
        elapsed = time.monotonic() - t0
    assert "0.5 s" in str(exc.value) and "not used" in str(exc.value)
    assert elapsed < 0.5 + 1.0  # cut at the deadline; the server trickles for 3 s


def test_a_redirect_is_an_error_naming_where_it_pointed_and_is_not_followed() -> None:
    with serving(plain(b"x 5\n")) as (other, other_seen):
        moved = f"HTTP/1.0 302 Found\r\nLocation: http://127.0.0.1:{other}/metrics\r\n\r\n"
        with (
            serving(plain(b"", moved.encode())) as (port, _seen),
            pytest.raises(errors.HostError) as exc,
        ):
            scrape(parse_target(f"http://127.0.0.1:{port}/metrics#x"), owners=[ME])
    assert "302" in str(exc.value) and f"127.0.0.1:{other}/metrics" in str(exc.value)
    assert "not followed" in str(exc.value)
    assert other_seen == []


def test_an_error_status_is_an_error() -> None:
    answer = plain(b"x 1\n", b"HTTP/1.0 500 Oops\r\n\r\n")
    with serving(answer) as (port, _seen), pytest.raises(errors.HostError, match="500"):
        scrape(parse_target(f"http://127.0.0.1:{port}/metrics#x"), owners=[ME])


def test_more_than_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputuned.trial import scrape as promscrape

    monkeypatch.setattr(promscrape, "MAX_BYTES", 1000)
    big = plain(b"x 1\n" + b"#" * 5000 + b"\n")
    with serving(big) as (port, _seen), pytest.raises(errors.HostError, match="more than 1000"):
        scrape(parse_target(f"http://127.0.0.1:{port}/metrics#x"), owners=[ME])


def test_a_local_socket_is_checked_against_the_servers_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner the kernel names for the server's end of the connection decides: the server's
    user or root is read, anyone else is refused before a byte is read."""
    from gputuned.service import sockdiag

    with serving(plain(b"x 1\n")) as (port, seen):
        target = parse_target(f"http://127.0.0.1:{port}/metrics#x")
        assert scrape(target, owners=[ME]).value == 1.0
        real = sockdiag.tcp_socket
        asked: list[tuple[object, object]] = []

        def as_user(local: tuple[str, int], remote: tuple[str, int]) -> sockdiag.TcpSocket | None:
            asked.append((local, remote))
            found = real(local, remote)
            return None if found is None else sockdiag.TcpSocket(found.state, 4242)

        monkeypatch.setattr(sockdiag, "tcp_socket", as_user)
        with pytest.raises(errors.HostError) as exc:
            scrape(target, owners=[1000])
        assert scrape(target, owners=[4242]).value == 1.0
        assert len(seen) == 2  # the refused one sent no request
    assert asked[0][0] == ("127.0.0.1", port)  # the server's end, found by the kernel
    msg = str(exc.value)
    assert "uid 4242" in msg and "--pid" in msg and "another local user" in msg


def test_a_local_socket_whose_owner_the_kernel_does_not_say_is_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TIME-WAIT and half-open sockets come back with uid 0 (inet_twsk_diag_fill,
    inet_req_diag_fill): that 0 is not root, and a closed or unknown end is refused."""
    from gputuned.service import sockdiag

    with serving(plain(b"x 1\n")) as (port, _seen):
        target = parse_target(f"http://127.0.0.1:{port}/metrics#x")
        for answer in (None, sockdiag.TcpSocket(sockdiag.TCP_TIME_WAIT, None)):
            monkeypatch.setattr(sockdiag, "tcp_socket", lambda _l, _r, a=answer: a)
            with pytest.raises(errors.HostError, match="owner"):
                scrape(target, owners=[ME], timeout=0.5)


@pytest.mark.skipif(ME != 0, reason="the tree's processes are not this user's; root is trusted")
def test_trial_stops_on_a_scrape_past_its_deadline_and_says_its_values_were_not_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gputuned.trial import scrape as promscrape
    from tests.unit.test_apply import PROFILES, digest, tree_copy

    monkeypatch.setattr(promscrape, "DEADLINE_S", 0.5)
    root = tree_copy("h200-vm", tmp_path)
    before = digest(root)
    with serving(trickle(OK + b"x_count 1\nx_sum 1\n", b"#" * 1000)) as (port, _seen):
        args = ["trial", str(PROFILES / "shared-host.toml"), "--set", "cpusets.inference.count=4,8"]
        args += ["--pairs", "1", "--min-wins", "1", "--window", "0", "--settle", "0"]
        rc = main([*args, "--metric", f"http://127.0.0.1:{port}/metrics#x", "--root", str(root)])
    err = capsys.readouterr().err
    assert rc != 0 and "not used" in err and "0.5 s" in err
    assert digest(root) == before


def test_sock_diag_names_the_owner_of_the_servers_end_of_a_connection() -> None:
    from gputuned.service.sockdiag import TCP_ESTABLISHED, TcpSocket, tcp_socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()) as client:
            # Not accepted yet: the listener's clone, with its owner.
            found = tcp_socket(listener.getsockname(), client.getsockname())
            assert found == TcpSocket(TCP_ESTABLISHED, ME)
