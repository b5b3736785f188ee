"""gputunectl trial on this machine's real kernel: a busy "server" pinned by one side onto a
CPU with burners, by the other onto a CPU of its own; trial must name the second, and the
host must end on it (and be put back by the test)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputuned.cli.main import main
from gputuned.engine.apply import revert_all
from gputuned.kernel.proc import read_process
from gputuned.store.state import ETC_DIR, JOURNAL
from tests.faults import live_kernel

pytestmark = pytest.mark.usefixtures("as_root")

# The server and the burners all run at nice -15 (weight 29154 each). On CPU 0 (side A) the
# server shares with three burners: it waits about 75 % of the time. On CPU 1 (side B) it
# competes only with work at nice 0 (weight 1024): even ten such tasks leave it waiting about
# 26 %. With the server at nice 0, B depended on what else the machine ran on CPU 1: everything
# at nice 0 crowds there while the burners hold CPU 0, and in the quick-start lane (two roots
# running the suite, a CPU each) B waited almost as long as A (winner None).
#
# The test's own thread (the runner: trial runs in it) takes the same nice while they spin: at
# nice 19 (a suite run under `nice -n 19`) it had weight 15 against their 29154 on both CPUs,
# 0.05 % of a CPU, and the run starved for 200 s. At -15 it gets its share on either CPU; it
# sleeps through the windows, so what trial measures does not change. Each loop also ends when
# its parent does: a runner killed mid-test leaves no busy loop at nice -15 behind.
NICE = -15
SPIN = "parent = os.getppid()\nwhile os.getppid() == parent: pass\n"
BUSY = f"import os, sys\nos.setpriority(os.PRIO_PROCESS, 0, {NICE})\n{SPIN}"
PINNED = f"import os, sys\nos.sched_setaffinity(0, {{0}})\nos.setpriority(os.PRIO_PROCESS, 0, {NICE})\n{SPIN}"


@contextlib.contextmanager
def alone_on_this_host(timeout_s: float = 600) -> Iterator[None]:
    """One trial at a time on this host. The quick-start lane runs the whole suite in two
    chroots beside the host's own (sharing its kernel, /proc and network namespace): three of
    these tests at once put three servers and nine burners on two CPUs, and a side's waits no
    longer depend on the side alone (winner None, seen once in CI). The lock is an abstract
    unix socket name, which every root of the host shares and the kernel frees on exit."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            lock.bind("\0gputuned-test-trial-live")
            break
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                lock.close()
                raise
            time.sleep(0.5)
    try:
        yield
    finally:
        lock.close()


@pytest.fixture
def workload() -> Iterator[tuple[int, str]]:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs: one shared with burners, one not")
    with alone_on_this_host(), running_workload() as server:
        yield server


@contextlib.contextmanager
def running_workload() -> Iterator[tuple[int, str]]:
    """The server and its three burners, ended at exit; yields (the server's PID, its token)."""
    token = f"gputuned-trial-{uuid.uuid4().hex[:8]}"
    runner = os.getpriority(os.PRIO_PROCESS, 0)  # this thread's (Linux: nice is per thread)
    os.setpriority(os.PRIO_PROCESS, 0, min(runner, NICE))  # before they spin: see NICE
    procs = [subprocess.Popen([sys.executable, "-c", BUSY, token])]
    procs += [subprocess.Popen([sys.executable, "-c", PINNED]) for _ in range(3)]
    etc_existed = Path(ETC_DIR).exists()
    try:
        yield procs[0].pid, token
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, runner)
        if Path(JOURNAL).exists():
            revert_all(live_kernel())
        for p in procs:  # by PID: only what this test started
            p.kill()
            p.wait()
        if not etc_existed:
            import shutil

            shutil.rmtree(ETC_DIR, ignore_errors=True)


def test_trial_picks_the_side_without_burners_and_ends_on_it(
    workload: tuple[int, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pid, token = workload
    before = read_process(live_kernel(), pid).threads[0].affinity
    prof = tmp_path / "pin.toml"
    prof.write_text(
        'name = "pin"\n[cpusets.server]\ncpus = "0"\n[cpuset]\nmode = "affinity"\n'
        'cpus = "server"\n[[process]]\nname = "server"\n'
        f'match.cmdline = "{token}"\nmatch.uid = 0\ncpus = "server"\n'
    )
    # A: on CPU 0 with three burners at nice -15 (about 75 % of its time waiting); B: CPU 1.
    rc = main(
        [
            "trial",
            str(prof),
            "--set",
            "cpusets.server.cpus=0,1",
            "--pairs",
            "4",
            "--min-wins",
            "3",
            "--min-gain",
            "10",
            "--window",
            "1",
            "--settle",
            "0.3",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    pairs = [(p["a"], p["b"]) for p in doc["pairs"]]
    assert doc["verdict"]["winner"] == "B", (doc["verdict"], "(A, B) per pair:", pairs)
    assert read_process(live_kernel(), pid).threads[0].affinity == {1}  # on the winner
    revert_all(live_kernel())
    assert read_process(live_kernel(), pid).threads[0].affinity == before


#: A metrics endpoint of one sample, ``x 7``, on 127.0.0.1; it prints its port.
ENDPOINT = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"x 7\\n")
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def test_a_local_endpoint_is_read_only_from_the_servers_user_or_root() -> None:
    """Another local user listening where the server's endpoint should be is refused before
    anything is read (issue 30, item 5): the owner is the kernel's, by NETLINK_SOCK_DIAG."""
    from gputuned import errors
    from gputuned.trial.meter import server_uids
    from gputuned.trial.scrape import parse_target, scrape
    from tests.localuser import NoUser, local_user

    try:
        with local_user("gputuned-test-scrape") as user:
            server = subprocess.Popen(
                user.argv(user.python, "-c", ENDPOINT), stdout=subprocess.PIPE, text=True
            )
            try:
                assert server.stdout is not None
                target = parse_target(f"http://127.0.0.1:{int(server.stdout.readline())}/m#x")
                # The process trial measures is root's here (this test): the user's socket is
                # not the server's.
                with pytest.raises(errors.HostError) as exc:
                    scrape(target, owners=server_uids(live_kernel(), [os.getpid()]))
                assert f"belongs to uid {user.uid}" in str(exc.value)
                # Measuring the user's own server: its socket is the server's.
                assert user.uid in server_uids(live_kernel(), [server.pid])
                got = scrape(target, owners=server_uids(live_kernel(), [server.pid]))
                assert got.value == 7.0
            finally:
                server.kill()  # by PID: only what this test started
                server.wait()
    except NoUser as exc:
        pytest.skip(str(exc))


def test_the_busy_loops_leave_a_nice_19_runner_its_share() -> None:
    """A suite run under ``nice -n 19`` (a polite developer, a CI runner's default) was starved
    for 200 s by the burners at nice -15 (weight 29154 against 15: 0.05 % of a CPU): the test
    that started them could not get on with its trial, nor end them."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs: one shared with burners, one not")
    nice, cpus = os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0)
    os.setpriority(os.PRIO_PROCESS, 0, 19)  # this thread only: as under nice -n 19
    try:
        with alone_on_this_host(), running_workload():
            time.sleep(0.5)  # the burners have set their nice and spin
            for cpu in (0, 1):  # CPU 0: three burners; CPU 1: the server
                os.sched_setaffinity(0, {cpu})
                start, used = time.monotonic(), time.thread_time()
                while time.thread_time() - used < 0.02 and time.monotonic() - start < 3:
                    pass
                took = time.monotonic() - start
                assert took < 3, f"20 ms of CPU on CPU {cpu} took {took:.1f} s: starved"
    finally:
        os.sched_setaffinity(0, cpus)
        os.setpriority(os.PRIO_PROCESS, 0, nice)
