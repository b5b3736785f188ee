"""``match.cmdline`` and ``exclude.cmdline`` on command lines other users write (issue 14,
finding 5): only the first 4 KiB are read, patterns that can backtrack exponentially are
refused at load with the key that holds them, and a search that runs past its CPU budget is
stopped and its pattern suspended (tuners/cmdmatch.py)."""

from __future__ import annotations

import re
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.engine.plan import plan_profile
from gputuned.kernel.proc import CMDLINE_BYTES, read_process
from gputuned.profile.load import parse_profile
from gputuned.profile.patterns import check_pattern
from gputuned.tuners.cmdmatch import SEARCHES, Searches
from tests.fakeproc import add_process, remove_process
from tests.faults import tree_kernel
from tests.unit.test_apply import SERVER_UID, SERVER_USER, tree_copy

REPO = Path(__file__).resolve().parents[2]

#: The pattern profiles/*.toml shipped before this fix: its option loop could backtrack
#: exponentially (40 "-X -X" options kept a search going for minutes).
OLD_SHIPPED = (
    r"^\S*python[0-9.]*\s+((-[XW]\s*|--check-hash-based-pycs\s+)\S+\s+|-[A-Za-z]+\s+)*"
    r"\S*(vllm|sglang|text-generation-server|torchrun)\b"
)
#: Exponential without a nested quantifier (two alternatives matching the same text), so the
#: load check passes it: only the CPU budget stops it. 2^40 ways to fail on this line.
#: What every profile in profiles/ ships now: the option loop possessive (``*+``).
SHIPPED = tomllib.loads((REPO / "profiles/shared-host.toml").read_text())["process"][0]["match"][
    "cmdline"
]
AMBIGUOUS = r"^(a|a)*$"
AMBIGUOUS_LINE = "a" * 40 + "!"


@pytest.fixture(autouse=True)
def _fresh_searches() -> Iterator[None]:
    SEARCHES.reset()
    yield
    SEARCHES.reset()


def profile(match: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": "t",
        "process": [{"name": "srv", "match": {"user": SERVER_USER, **match}, "nice": -5, **extra}],
    }


def test_only_the_first_4_kib_of_a_command_line_are_read(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    add_process(
        root, 6100, comm="python3", cmdline=["python3", "-X", "a" * (1 << 20)],
        exe="/usr/bin/python3.11", start_time=61,
    )  # fmt: skip
    cmd = read_process(tree_kernel(root), 6100, threads=False, brief=True).cmdline
    assert cmd.startswith("python3 -X aaa")
    assert len(cmd.encode()) <= CMDLINE_BYTES == 4096


@pytest.mark.parametrize(
    "pattern",
    [OLD_SHIPPED, r"(\S+\s+)*vllm", r"(a+)+b", r"(a*)*", r"((x|y+)z)*", r"(?:a{2,})+"],
)
@pytest.mark.parametrize("key", ["match", "exclude"])
def test_nested_unbounded_repetitions_are_refused_at_load(pattern: str, key: str) -> None:
    doc = profile({"cmdline": "vllm"}) if key == "exclude" else profile({"cmdline": pattern})
    if key == "exclude":
        doc["process"][0]["exclude"] = {"cmdline": pattern}
    with pytest.raises(errors.ProfileError) as got:
        parse_profile(doc, "t.toml")
    text = str(got.value)
    assert f"process[0].{key}.cmdline" in text  # the key path
    assert "'*+'" in text and "(?>...)" in text and "'{0,16}'" in text  # what to write instead
    assert "Traceback" not in text


@pytest.mark.parametrize(
    "pattern",
    [
        "vllm",
        r"(\S+\s+)*+vllm",  # possessive: never gives back
        r"(?>\S+\s+)*vllm",  # atomic
        r"(\S+\s+){0,16}vllm",  # bounded
        r"(a|b)*c",  # no repetition inside
        SHIPPED,
    ],
)
def test_patterns_that_cannot_backtrack_without_end_load(pattern: str) -> None:
    check_pattern(pattern)
    parse_profile(profile({"cmdline": pattern}), "t.toml")


def test_every_shipped_profile_has_the_possessive_pattern() -> None:
    for path in sorted((REPO / "profiles").glob("*.toml")):
        for rule in tomllib.loads(path.read_text()).get("process", []):
            got = rule.get("match", {}).get("cmdline")
            assert got in (None, SHIPPED), (path.name, got)


def test_the_shipped_pattern_still_matches_the_servers() -> None:
    shipped = SHIPPED
    for line in (
        "/usr/bin/python3 /usr/local/bin/vllm serve m",
        "python3 -m sglang.launch_server --model m",
        "python3 -X faulthandler -m sglang.launch_server",
        "python3 -W ignore -m vllm.entrypoints.openai.api_server",
        "python3.11 -u -m torchrun x",
    ):
        assert re.search(shipped, line), line
    for line in ("gputuned --profile dedicated-inference.toml", "vim vllm.py", "python3 x vllm"):
        assert not re.search(shipped, line), line
    # The line that kept the old pattern busy for minutes is answered at once.
    t0 = time.thread_time()
    assert not re.search(shipped, "python3 " + "-X -X " * 40 + "y")
    assert time.thread_time() - t0 < 1.0


def test_a_search_past_its_cpu_budget_is_stopped_and_suspended_for_that_process() -> None:
    s = Searches(budget_s=0.05)
    t0 = time.thread_time()
    found = s.search(AMBIGUOUS, AMBIGUOUS_LINE, what="match.cmdline x", pid=41, start=7, safe=False)
    assert found is False
    # Unstopped this search runs for hours; stopped, it used about its budget.
    assert time.thread_time() - t0 < 5.0
    (note,) = s.notes()
    assert "pid 41" in note and "suspended for that process until the profile is applied" in note
    # Suspended for that process: not run again in its line (it answers the safe side).
    t1 = time.thread_time()
    assert s.search(AMBIGUOUS, AMBIGUOUS_LINE, what="x", pid=41, start=7, safe=True) is True
    assert time.thread_time() - t1 < 0.01
    # Every other process is still searched: another one, and the same PID reused.
    assert s.search(AMBIGUOUS, "aaa", what="x", pid=42, start=8, safe=False) is True
    assert s.search(AMBIGUOUS, "aaa", what="x", pid=41, start=9, safe=False) is True
    s.reset()
    assert s.notes() == [] and s.search(AMBIGUOUS, "aaa", what="x", pid=41, start=7, safe=False)


def test_suspensions_are_bounded_and_notes_are_short(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputuned.tuners import cmdmatch

    monkeypatch.setattr(cmdmatch, "MAX_SUSPENDED", 3)
    s = Searches(budget_s=0.01)
    for pid in range(10, 22):
        s.search(AMBIGUOUS, AMBIGUOUS_LINE, what="x", pid=pid, start=pid, safe=False)
    assert [k[1] for k in s.suspended] == [19, 20, 21], "the oldest forgotten first"
    s.suspended.update({(AMBIGUOUS, p, p): f"note {p}" for p in range(100, 120)})
    notes = s.notes()
    assert len(notes) == cmdmatch.MAX_NOTES + 1 and notes[-1].endswith(
        "more suspended pattern searches"
    )


def test_a_rule_whose_search_overruns_grants_nothing_and_plan_says_why(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    for pid in (6200, 6201):
        add_process(
            root, pid, comm="python3", cmdline=[AMBIGUOUS_LINE], exe="/usr/bin/python3.11",
            start_time=pid, uid=SERVER_UID,
        )  # fmt: skip
    prof = parse_profile(profile({"cmdline": AMBIGUOUS}), "t.toml")
    t0 = time.thread_time()
    plan = plan_profile(tree_kernel(root), prof, allow_blocked=True)
    assert time.thread_time() - t0 < 10.0  # two searches of hours each, stopped at 50 ms
    assert not [c for c in plan.settings if c.tuner == "process"]
    notes = [n for n in plan.notes if "suspended" in n]
    assert len(notes) == 2 and all("match.cmdline" in n for n in notes), plan.notes
    assert "pid 6200" in notes[0] and "pid 6201" in notes[1]


@pytest.mark.parametrize("owner", ["user", "any_user"])
def test_another_users_crafted_command_line_changes_nothing_for_the_server(
    tmp_path: Path, owner: str
) -> None:
    """Issue 30: a process of another user whose command line runs the rule's pattern past
    its budget must not change whether the server is placed. With match.user the pattern is
    never searched in the other user's line; without owner keys (any_user) it is suspended for
    that process only."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    add_process(
        root, 6400, comm="python3", cmdline=[AMBIGUOUS_LINE], exe="/usr/bin/python3.11",
        start_time=64, uid=4321,
    )  # fmt: skip
    add_process(
        root, 6401, comm="python3", cmdline=["aaaa"], exe="/usr/bin/python3.11",
        start_time=65, uid=SERVER_UID,
    )  # fmt: skip
    if owner == "user":
        prof = profile({"cmdline": AMBIGUOUS})
    else:
        prof = {
            "name": "t",
            "process": [
                {"name": "srv", "match": {"cmdline": AMBIGUOUS}, "any_user": True, "nice": 5}
            ],
        }
    plan = plan_profile(tree_kernel(root), parse_profile(prof, "t.toml"), allow_blocked=True)
    placed = {c.data.get("pid") for c in plan.settings if c.tuner == "process"}
    assert 6401 in placed and 6400 not in placed
    suspended = [n for n in plan.notes if "suspended" in n]
    assert (
        suspended == [] if owner == "user" else len(suspended) == 1 and "pid 6400" in suspended[0]
    )


def test_the_daemon_says_which_pattern_is_suspended_until_the_next_apply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gputuned.daemon.core import Daemon
    from gputuned.service.control import PeerCred

    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    root = tree_copy("h200-captured", tmp_path, server=False)
    add_process(
        root, 6300, comm="python3", cmdline=[AMBIGUOUS_LINE], exe="/usr/bin/python3.11",
        start_time=63, uid=SERVER_UID,
    )  # fmt: skip
    prof = tmp_path / "p.toml"
    prof.write_text(
        'name = "t"\n[[process]]\nname = "srv"\n'
        f"match.user = {SERVER_USER!r}\nmatch.cmdline = {AMBIGUOUS!r}\nnice = -5\n"
    )
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    try:
        notes = d.requests.handle({"cmd": "status"}, PeerCred(1, 0, 0))["notes"]
        assert any("suspended for that process until the profile is applied" in n for n in notes)
        assert 6300 not in d.placed
        remove_process(root, 6300)
        add_process(
            root, 6301, comm="python3", cmdline=[AMBIGUOUS_LINE], exe="/usr/bin/python3.11",
            start_time=64, uid=SERVER_UID,
        )  # fmt: skip
        d.reapply("udev")  # the daemon's own re-plan: a new process is searched (and stopped)
        assert ["pid 6300" in n for n in SEARCHES.notes()] == [True, False]
        assert "pid 6301" in SEARCHES.notes()[1]
        d.apply_full("reload")  # applied again: suspensions forgotten; 6301 searched again
        (note,) = SEARCHES.notes()
        assert "pid 6301" in note
    finally:
        assert d.stop() == 0
