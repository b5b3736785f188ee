"""What other programs send the daemon, checked: control-request fields, profiles that come over
the socket, and who may scrape the metrics (issue 14, findings 4, 7 and 10).

Every field of a request is hostile until checked: a flag is a boolean (here), a PID and start
time are integers (the daemon's ``_process_id``). ``apply`` takes the profile itself
or the name of one in the profile directory, never a path for the daemon to open as root; its
``source`` is shown, never opened. The groups and users ``[daemon]`` names are checked
when the profile is planned (gputuned/tuners/daemon.py).
"""

from __future__ import annotations

from typing import Any

from gputuned import errors
from gputuned.kernel import Kernel
from gputuned.profile.load import load_profile, parse_profile
from gputuned.profile.model import Profile
from gputuned.service.controlproto import PeerCred
from gputuned.service.httpmetrics import Allowed
from gputuned.store.profiledirs import USER_DIR, ProfileDirs
from gputuned.textsafe import printable
from gputuned.tuners.daemon import resolve_metrics_allow

#: A verify other than root's is answered from one at most this old: each is a full plan.
VERIFY_CACHE_S = 5.0


def request_flag(req: dict[str, Any], key: str) -> bool:
    value = req.get(key, False)
    if not isinstance(value, bool):
        raise errors.GputunedError(f'"{key}" must be true or false')
    return value


def profile_from_request(
    kernel: Kernel, req: dict[str, Any], peer: PeerCred
) -> tuple[Profile, str, str | None]:
    """(profile, source to show, file to re-read on SIGHUP) for an ``apply`` request."""
    name, data = req.get("name"), req.get("profile")
    if isinstance(name, str):
        dirs = ProfileDirs.for_host(kernel)
        path = dirs.find(name)
        return load_profile(path, names=dirs), str(path), str(path)
    if isinstance(data, dict):
        given = req.get("source")
        shown = printable(given)[:200] if isinstance(given, str) else "a profile"
        source = f"{shown} (sent by uid {peer.uid} over the control socket)"
        return parse_profile(data, f"the profile sent by uid {peer.uid}"), source, None
    if isinstance(data, str):
        raise errors.GputunedError(
            "this daemon opens no file a client names: send the profile itself (gputunectl "
            "apply PATH does) or a profile's name (gputunectl apply NAME; gputunectl list)"
        )
    raise errors.GputunedError(
        'apply needs "profile" (the profile, as gputunectl apply sends it) or "name" (one in '
        f"{USER_DIR} or the shipped ones: gputunectl list)"
    )


def metrics_allowed(entries: tuple[str, ...]) -> Allowed:
    """``[daemon] metrics_allow`` resolved on this machine; InvalidValue names what is missing."""
    return Allowed(*resolve_metrics_allow(entries))
