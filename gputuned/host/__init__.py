"""Readers of the machine through the kernel port, gputuned's own files, and the daemon's
plumbing (control socket, metrics port, event loop, process watcher)."""
