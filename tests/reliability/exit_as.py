"""``python3 -m tests.reliability.exit_as STATUS``: exit with STATUS, or die by SIGKILL ("kill").

The smallest child for test_forked.py, which checks that a forked child's exit status comes back
exactly, however many threads start and wait for children at once.
"""

import os
import signal
import sys

if __name__ == "__main__":
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(sys.argv[1]))
