"""A server stand-in that binds itself (e2e guest, phase "self-binding process"): one thread that
keeps the CPUs it started with, putting them back (sched_setaffinity on itself) whenever they
differ, as SGLang's or TensorRT-LLM's workers do with theirs. It counts its resets in
/run/gputuned-vm-selfbind.json, which the test reads."""

import json
import os
import time

STATE = "/run/gputuned-vm-selfbind.json"


def save(mine: set[int], resets: int) -> None:
    tmp = f"{STATE}.tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "cpus": sorted(mine), "resets": resets}, f)
    os.replace(tmp, STATE)


mine = os.sched_getaffinity(0)
resets = 0
save(mine, resets)
while True:
    time.sleep(0.1)
    if os.sched_getaffinity(0) != mine:
        os.sched_setaffinity(0, mine)
        resets += 1
        save(mine, resets)
