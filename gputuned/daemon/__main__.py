"""``python3 -m gputuned.daemon``: gputuned."""

import sys

from gputuned.daemon.main import main

if __name__ == "__main__":
    sys.exit(main())
