"""``gputuned``'s command line: ``python3 -m gputuned.daemon`` and the ``gputuned``
script."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from gputuned import __version__, errors, root
from gputuned.daemon.core import Daemon
from gputuned.service.notify import Notifier, setup_logging

log = logging.getLogger("gputuned")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gputuned",
        description="gputuned: the long-running service that keeps a profile applied.",
    )
    p.add_argument("--version", action="version", version=f"gputuned {__version__}")
    p.add_argument(
        "--root",
        type=root.host_root,
        default=Path("/"),
        help="run against a host tree (a relative path is taken from the current folder)",
    )
    p.add_argument("--profile", type=Path, help="apply this profile instead of the active one")
    p.add_argument(
        "--metrics-address",
        type=_ip_address,
        metavar="ADDRESS",
        help="bind [daemon] metrics_port to this IP address instead of metrics_address (a "
        "Kubernetes pod's IP, from the downward API)",
    )
    p.add_argument("--foreground", action="store_true", help="accepted; gputuned never forks")
    p.add_argument("--debug", action="store_true", help="debug logging")
    return p


def _ip_address(text: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an IP address; give one such as 10.1.2.3"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    where = setup_logging(debug=args.debug, to_journal=Notifier().enabled)
    log.info("daemon: gputuned %s starting on %s, logging to %s", __version__, args.root, where)
    d = Daemon(
        root.open_kernel(args.root),
        profile_path=args.profile,
        metrics_address=args.metrics_address,
    )
    try:
        d.start()
    except errors.GputunedError as exc:
        log.error("daemon: cannot start: %s", exc)
        d.notify.send(f"STATUS=failed: {exc}", f"ERRNO={getattr(exc, 'errno', 0) or 0}")
        return exc.exit_code
    except Exception as exc:  # a bug: start() logged its traceback and put the host back
        d.notify.send(f"STATUS=failed: internal error ({type(exc).__name__}); see the log")
        return 1
    return d.run()
