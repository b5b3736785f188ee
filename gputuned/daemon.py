"""``gputuned``: the long-running service.

The service itself (journal replay, sd_notify, control socket, process watcher, drift repair)
is not implemented yet; until it is, this entry point says so and exits non-zero rather than
pretending to run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gputuned import __version__


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gputuned", description="gputuned host-tuning daemon")
    p.add_argument("--version", action="version", version=f"gputuned {__version__}")
    p.parse_args(argv)
    sys.stderr.write(
        "gputuned: the daemon is not implemented in this version; "
        "use 'gputunectl plan PROFILE' to see what a profile would change\n"
    )
    return 3


if __name__ == "__main__":
    sys.exit(main())
