"""What the placing of processes (daemon/placing.py) and the partition made in place
(daemon/inplace.py) use of the daemon: its state and the two ways it applies. The keeper
(daemon/keeper.py) is one; placing takes it by this description, so that it need not import
the keeper that calls it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gputuned.changes import Change
    from gputuned.daemon.selfbind import BindWatch
    from gputuned.engine.applyreport import ApplyReport
    from gputuned.engine.journal import Journal
    from gputuned.kernel import Kernel
    from gputuned.profile.model import Profile
    from gputuned.tuners.context import Claim, Held, PlanContext


class DaemonState(Protocol):
    kernel: Kernel
    journal: Journal | None
    profile: Profile | None
    ctx: PlanContext | None
    claims: dict[int, Claim]
    held: dict[int, Held]
    registered: dict[int, tuple[int, str]]
    binding_warnings: dict[int, str]
    binds: BindWatch
    counters: dict[str, int]
    inplace_said: str | None
    replanning: bool
    by_key: dict[str, Change]
    new_threads: dict[int, set[int]]

    @property
    def settings(self) -> list[Change]: ...

    @settings.setter
    def settings(self, value: list[Change]) -> None: ...

    def place(
        self, pids: list[int], why: str, threads: dict[int, set[int]] | None = None
    ) -> None: ...

    def reapply(self, why: str) -> ApplyReport | None: ...
