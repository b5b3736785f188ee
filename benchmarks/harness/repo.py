"""This checkout's root, first on ``sys.path`` once imported: the benchmarks measure the
gputuned beside them, not whichever one is installed (the processes they start get the same
through PYTHONPATH, harness/children.py).

Not done by the package on import: apply_revert.py times the gputuned on its PYTHONPATH, an
earlier version's tree (scripts/device/applytime.sh), and imports only harness.applysteps.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
#: What the processes a benchmark starts run, each in a role: ``--role cpu|net|disk`` (noise),
#: ``worker`` or ``api`` (the server). The API process's command line names this file, and a
#: profile copy's rule matches it there (harness/worker.py API_MATCH).
ROLE_SCRIPT = REPO / "benchmarks" / "noisy_neighbor.py"
