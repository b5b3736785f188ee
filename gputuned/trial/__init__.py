"""``gputunectl trial``: whether a profile makes the server faster here. Paired windows that
take turns between two sides, the win rule and the verdict (``windows``), what one window
measures (``meter``: run-queue delay, or a metric of the server's Prometheus endpoint read by
``scrape``). The command itself, its options and its output, is gputuned/cli/trial.py."""
