"""``python3 -m gputuned.cli``: gputunectl."""

import sys

from gputuned.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
