"""``gputuned``: the long-running service that keeps a profile applied.

Start: take the host lock for good, adopt or replay a journal left by an earlier run, load the
active profile (``gputunectl apply`` recorded it in /etc/gputuned/active.json), apply it, verify,
then tell systemd READY=1 with a STATUS= line. Then, in one single-threaded loop:

- process events (proc connector, or polling): a new process that matches a rule is placed at
  once, threads it creates later too; a process that exits is forgotten;
- udev events for PCI devices: the profile is re-planned (a GPU reset or re-bind can bring back
  the kernel's saved DevCtl, or new IRQ numbers);
- every ``[daemon] drift_interval_s``: everything applied is re-read and drift repaired;
- the control socket (gputunectl status, verify, top; apply, revert, register, unregister: root
  or [daemon] admin_group only; docs/usage.md has its protocol);
- WATCHDOG=1 at half of WatchdogSec=;
- SIGHUP re-reads the profile and applies only the difference; SIGTERM/SIGINT: STOPPING=1,
  revert everything, exit 0. SIGUSR2 stops the watchdog pings (to test watchdog recovery).
- SIGUSR1: hand over, for an upgrade (the Debian package's prerm sends it): exit 0 leaving
  everything applied and the journal in /run/gputuned, so the next daemon adopts it and a
  placed server's cgroup, nice level and CPUs never change. ``systemctl restart`` is a stop
  and a start: it reverts, then applies again.

A journal left by a killed daemon is adopted when a profile is active: its entries keep the
original values, the profile is applied on top (no untuned window), and the final revert
restores them. With no active profile the journal is replayed (reverted) at start.
"""
