"""``gputunectl``, the command line: :mod:`gputuned.cli.main` (``python3 -m gputuned.cli``)."""
