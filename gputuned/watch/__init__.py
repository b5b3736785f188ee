"""What gputuned shows of the server as it runs: Prometheus text (``exposition``: what verify
finds, the daemon's counters, per-process run-queue delay, the GPUs) for the daemon's metrics
port and ``verify --prometheus``, and ``top``'s rows (what the neighbours cost each inference
process). The metrics port's socket server is gputuned/service/httpmetrics.py; top's table,
gputuned/cli/top.py."""
