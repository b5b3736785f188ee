"""Stand-in for a vLLM-shaped server in the e2e guest: a process tree made by spawn.

The API process (this script; the profile's "tree" rule matches its unit and command line)
starts an engine with multiprocessing's spawn context, which starts a worker the same way;
the first spawn also starts Python's resource tracker. Engine and worker rename themselves as
setproctitle does (/proc/self/comm). When all are up, the PIDs go to /run/gputuned-vm-tree.json
for the test (or to $TREE_OUT: in the container phase, a folder the host sees, the PIDs then
the container's own). Started by gputuned-vm-tree.service, or in a podman container.
"""

import json
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing import resource_tracker

OUT = os.environ.get("TREE_OUT", "/run/gputuned-vm-tree.json")


def rename(name: str) -> None:
    with open("/proc/self/comm", "w") as f:
        f.write(name)


def idle(n: int) -> None:
    for _ in range(n):
        threading.Thread(target=time.sleep, args=(1e6,), daemon=True).start()


def worker(q: "mp.Queue[tuple[str, int]]") -> None:
    # SIGUSR1 blocked before any thread starts, so every thread inherits the mask and the
    # signal waits for sigwait() below: a handler would run only once the main thread woke,
    # and the kernel may deliver the signal to a thread sleeping elsewhere.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    rename("VM::Worker_TP0")
    idle(1)
    q.put(("worker", os.getpid()))
    # SIGUSR1: take 400 MiB of memory (touched), past the unit's MemoryMax= in the phase
    # "unit keeps its processes": the kernel must OOM-kill this process in the unit's cgroup.
    signal.sigwait({signal.SIGUSR1})
    held = b"x" * (400 << 20)
    time.sleep(1e6 + len(held))


def engine(q: "mp.Queue[tuple[str, int]]") -> None:
    rename("VM::EngineCore")
    idle(2)
    mp.get_context("spawn").Process(target=worker, args=(q,)).start()
    q.put(("engine", os.getpid()))
    time.sleep(1e6)


if __name__ == "__main__":
    idle(1)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ctx.Process(target=engine, args=(q,)).start()
    pids = dict(q.get() for _ in range(2))
    pids["api"] = os.getpid()
    pids["tracker"] = resource_tracker._resource_tracker._pid
    with open(OUT + ".tmp", "w") as f:
        json.dump(pids, f)
    os.rename(OUT + ".tmp", OUT)
    time.sleep(1e6)
