"""Boot the e2e guest many times and count how each boot ended: the hunt for boot flakes.

    python3 -m tests.e2e.vm.bootloop [--boots 50] [--json FILE]    (as root, from the checkout)

Each boot is a fresh overlay of the cached image (tests/e2e/vm/image.py), started as the lane
starts it (:meth:`Machine.boot`, with its one retry of a boot that died before userspace), waited
for until ``systemctl is-system-running`` answers, then killed. Prints one line per boot and a
summary: booted first time, booted after a retry (with the kernel fault the console showed),
failed. Not part of the suite (50 boots take about half an hour under TCG); docs/dev/e2e-vm.md
quotes its last figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.e2e.vm import image as vm_image
from tests.e2e.vm.machine import Machine, MachineError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--boots", type=int, default=50)
    p.add_argument("--json", type=Path, help="write every boot's outcome here")
    args = p.parse_args(argv)
    img, _cached = vm_image.ensure_image(say=print)
    runs = vm_image.CACHE / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    outcomes: list[dict[str, object]] = []
    for n in range(1, args.boots + 1):
        work = Path(tempfile.mkdtemp(prefix="bootloop-", dir=runs))
        m = Machine(img, work)
        t0 = time.monotonic()
        try:
            m.create_disks()
            b = m.boot()
            state = b.state
            outcome = "retried" if b.retried else ("booted" if state == "running" else state)
            detail = b.retried
        except MachineError as exc:
            outcome, detail = "failed", str(exc).splitlines()[0]
        finally:
            m.kill()
            shutil.rmtree(work, ignore_errors=True)
        secs = time.monotonic() - t0
        outcomes.append(
            {"boot": n, "outcome": outcome, "seconds": round(secs, 1), "detail": detail}
        )
        print(f"boot {n:3d}: {outcome:<8} {secs:5.1f} s  {detail}", flush=True)
    counts = {k: sum(o["outcome"] == k for o in outcomes) for k in ("booted", "retried", "failed")}
    other = len(outcomes) - sum(counts.values())
    print(
        f"{len(outcomes)} boots: {counts['booted']} first time, {counts['retried']} after one "
        f"retry (died before userspace), {counts['failed']} failed, {other} other states"
    )
    if args.json:
        args.json.write_text(json.dumps({"counts": counts, "boots": outcomes}, indent=1) + "\n")
    return 0 if counts["failed"] == 0 and other == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
