"""The benchmarks' shared machinery, apart from the scripts that use it (issue 29).

The scripts of benchmarks/ run as ``python3 benchmarks/NAME.py``: their folder is then first on
``sys.path`` and this package is ``harness``. They import it, never each other, and it imports
no script (tests/unit/test_benchmarks_smoke.py reads the imports). Importing the package does
nothing: ``harness.repo`` puts this checkout first on ``sys.path``, for the modules that need
gputuned. What each module does: docs/dev/benchmarks.md, "The harness".
"""
