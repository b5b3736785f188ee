"""What an apply leaves for status and the next start: state.json (the profile's name, its
source, when, what is not possible here and what the plan refused) and active.json (the
profile itself, its source and the file it may be read again from); written at the end of an
apply that did not fail, read by status, the daemon and the CLI.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from gputuned.kernel import Kernel
from gputuned.store.state import ACTIVE, STATE, read_optional_bytes, replace_durable

if TYPE_CHECKING:
    # Types only: status and list read these files, and need neither pydantic and the
    # profile's models nor the plan's data (issue 31, item 2).
    from gputuned.changes import Refusal
    from gputuned.engine.applyreport import ApplyReport
    from gputuned.profile.model import Profile

__all__ = ["read_active", "read_state", "record_applied"]


def record_applied(
    kernel: Kernel,
    profile: Profile,
    source: str,
    report: ApplyReport,
    reload_path: str | None,
    refused: list[Refusal],
) -> None:
    state = {
        "profile": profile.name,
        "source": source,
        "applied_at": time.time(),
        "not_possible": report.not_possible,
        # What the plan refused is not possible here either; status shows it with the rest
        # (it was lost after apply: issue 19, item 4).
        "refused": [{"tuner": r.tuner, "target": r.target, "reason": r.reason} for r in refused],
    }
    replace_durable(kernel, STATE, json.dumps(state, indent=1).encode())
    active: dict[str, Any] = {
        "source": source,
        "profile": profile.model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    if reload_path is not None:
        active["path"] = reload_path
    if profile.source_digest is not None:
        # verify's quick answer to "did the file change since?" (cli/tuning._edited_since_apply).
        active["source_digest"] = profile.source_digest
    replace_durable(kernel, ACTIVE, json.dumps(active, indent=1).encode(), mode=0o644)


def read_state(kernel: Kernel) -> dict[str, Any]:
    raw = read_optional_bytes(kernel, STATE)
    return dict(json.loads(raw)) if raw else {}


def read_active(kernel: Kernel) -> dict[str, Any] | None:
    raw = read_optional_bytes(kernel, ACTIVE)
    return dict(json.loads(raw)) if raw else None
