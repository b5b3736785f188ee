"""Loading a profile: its files read and merged (gputuned/profile/files.py), then checked with
the model and across tables."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gputuned.errors import ProfileError
from gputuned.profile.checks import check_profile
from gputuned.profile.files import TOO_DEEP, digest, read_merged, too_deep
from gputuned.profile.messages import problems_from
from gputuned.profile.model import Profile, profile_model
from gputuned.store.profiledirs import ProfileDirs


def load_profile(path: str | Path, *, names: ProfileDirs | None = None) -> Profile:
    """Read, merge (includes) and check the profile at ``path``; raise ProfileError if invalid.

    ``names``: where includes by name are looked up (default: this machine's folders)."""
    return parse_profile(read_merged(path, names=names), str(path))


def parse_profile(data: Mapping[str, Any], source: str) -> Profile:
    """Check already-parsed TOML data; problems become one ProfileError naming ``source``."""
    if too_deep(data):
        raise ProfileError(source, [("", TOO_DEEP)])
    try:
        profile = profile_model().model_validate(data)
    except ValidationError as exc:
        raise ProfileError(source, problems_from(exc, profile_model())) from None
    problems = check_profile(profile)
    if problems:
        raise ProfileError(source, problems)
    # What apply records, so that verify can tell an unchanged file without the model.
    profile._source_digest = digest(data)
    return profile
