"""``gputunectl install-system`` and ``uninstall-system``: the systemd unit, the udev rule and
the shipped profiles put where systemd, udev and the daemon look for them, each file recorded
and removed only if nobody changed it (``system``). Its report's rendering is
gputuned/cli/install.py; the programs it runs (systemctl, udevadm) are
gputuned/kernel/sysinstall.py's."""
