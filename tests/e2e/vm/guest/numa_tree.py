"""Stand-in for a tensor-parallel server on the e2e guest's two NUMA nodes.

The API process (this script; vm-numa.toml's rule matches its unit and command line) starts one
worker per GPU with multiprocessing's spawn context, each with the environment a launcher
gives it: worker 0 with CUDA_VISIBLE_DEVICES=0, and it opens /dev/nvidia0 at once; worker 1
with CUDA_VISIBLE_DEVICES=0,1 (every GPU of the server, as vLLM passes it), and it opens
/dev/nvidia1 only once the test creates /run/gputuned-vm-numa.open: a GPU opened late. The
PIDs go to /run/gputuned-vm-numa.json, the time worker 1 opened its GPU to
/run/gputuned-vm-numa.opened.
"""

import json
import multiprocessing as mp
import os
import time

OUT = "/run/gputuned-vm-numa.json"
TRIGGER = "/run/gputuned-vm-numa.open"
OPENED = "/run/gputuned-vm-numa.opened"


def rename(name: str) -> None:
    with open("/proc/self/comm", "w") as f:
        f.write(name)


def worker(index: int, late: bool, q: "mp.Queue[tuple[str, int]]") -> None:
    rename(f"VM::Worker_TP{index}")
    q.put((f"worker{index}", os.getpid()))
    while late and not os.path.exists(TRIGGER):
        time.sleep(0.2)
    fd = os.open(f"/dev/nvidia{index}", os.O_RDWR)
    if late:
        with open(OPENED + ".tmp", "w") as f:
            f.write(f"{time.time()}\n")
        os.rename(OPENED + ".tmp", OPENED)
    time.sleep(1e6)
    os.close(fd)


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    # spawn starts a fresh interpreter with os.environ as it is at start().
    for i, visible in enumerate(("0", "0,1")):
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
        ctx.Process(target=worker, args=(i, i == 1, q)).start()
    os.environ.pop("CUDA_VISIBLE_DEVICES")
    pids = dict(q.get() for _ in range(2))
    pids["api"] = os.getpid()
    with open(OUT + ".tmp", "w") as f:
        json.dump(pids, f)
    os.rename(OUT + ".tmp", OUT)
    time.sleep(1e6)
