"""The daemon's plumbing: the event loop, sd_notify and logging, the socket-server base that
the control socket and the metrics port share, the control protocol and client, the process
watcher and the udev monitor. What the daemon decides lives in gputuned/daemon/."""
