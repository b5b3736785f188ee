"""What an apply and a revert report: :class:`ApplyReport` (written, skipped, not possible
here, failed, leftovers restored, rolled back), :class:`ApplyError`, the failure that carries
it, and :class:`RevertReport` (restored, failed, notes, the profile made inactive).

Data only: the writer (:mod:`gputuned.engine.writer`) fills the report, ``apply_profile``
(:mod:`gputuned.engine.apply`) hands it to the caller and records what is not possible here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gputuned import errors

__all__ = ["ApplyError", "ApplyReport"]


class ApplyError(errors.GputunedError):
    """An apply failed part-way; what it had written is reverted unless --keep-going."""

    def __init__(self, message: str, report: ApplyReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class ApplyReport:
    written: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # exited or reused processes
    not_possible: dict[str, dict[str, str]] = field(default_factory=dict)  # setting key -> why
    failed: list[dict[str, str]] = field(default_factory=list)
    restored: list[dict[str, str]] = field(default_factory=list)  # leftovers of another profile
    rolled_back: bool = False
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "written": self.written,
            "skipped": self.skipped,
            "not_possible": self.not_possible,
            "failed": self.failed,
            "restored": self.restored,
            "rolled_back": self.rolled_back,
            "seconds": round(self.seconds, 4),
        }


@dataclass
class RevertReport:
    restored: list[dict[str, str]] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: The profile this revert made no longer active (its name), None where none was.
    deactivated: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "restored": self.restored,
            "failed": self.failed,
            "notes": self.notes,
            "seconds": round(self.seconds, 4),
            "deactivated": self.deactivated,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RevertReport:
        """Rebuild a report the daemon sent (``to_json``) for rendering here."""
        return cls(
            d["restored"], d["failed"], d.get("notes", []), d["seconds"], d.get("deactivated")
        )
