"""Readers of processes, the process watcher and gputuned's state files, moving to
gputuned/kernel/, gputuned/service/ and gputuned/store/ (docs/dev/architecture.md)."""
