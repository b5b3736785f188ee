"""What an operator reads: verify's lines, status's counts, each command's help, completion,
the daemon's journal lines, the shipped profiles README names, and `gputunectl active`
(issue 31, item 12)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from gputuned.cli import main as cli
from gputuned.cli.render import render_status
from tests.unit.test_apply import PROFILES, tree_copy

REPO = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tree_copy("h200-captured", tmp_path)


# ---- verify ------------------------------------------------------------------------------------


def test_verify_names_a_target_once_and_says_a_shared_reason_once_with_a_count(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run(capsys, "verify", str(PROFILES / "shared-host.toml"), "--root", str(root))
    assert rc == 1
    assert "irq irq" not in out
    others = [ln for ln in out.splitlines() if "not a GPU vector" in ln]
    assert len(others) == 1, others  # 14 IRQs, one reason: one line
    assert "drifted irq 24 (ACPI:Ged), 25 (ACPI:Ged), 26 (ttyS0)," in others[0]
    assert "(14 settings)" in others[0] and "live 0-15, wanted 0" in others[0]
    # Lines that differ in what they want stay apart: each GPU vector has its own CPU.
    assert len([ln for ln in out.splitlines() if "GPU 0 vector" in ln]) == 8
    rc, out, _ = run(
        capsys, "verify", str(PROFILES / "shared-host.toml"), "--root", str(root), "--json"
    )
    assert len([s for s in json.loads(out)["settings"] if "not a GPU vector" in s["reason"]]) == 14


# ---- status ------------------------------------------------------------------------------------


def test_status_says_what_placed_processes_and_placements_each_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    daemon = {"pid": 10, "status": "running", "watcher": "netlink", "placements": 0}
    daemon |= {"repairs": 0, "replans": 0, "reloads": 0}
    render_status(
        {
            "active_profile": "shared-host",
            "source": "/usr/share/gputuned/profiles/shared-host.toml",
            "journal_entries": 3,
            "daemon": daemon,
            "placed": [302],
            "not_possible": {},
        }
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "0 placement(s)," not in out  # beside a placed process, it read as a contradiction
    assert "Placed processes: 1 now (302); 0 placement(s) of new processes since the daemon" in out


# ---- help --------------------------------------------------------------------------------------


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    return cli._commands(cli.build_parser())


def test_every_command_help_has_a_description(capsys: pytest.CaptureFixture[str]) -> None:
    for name, sub in _subparsers().items():
        assert sub.description, name
        assert sub.description[0].isupper() and sub.description.endswith("."), name
    with pytest.raises(SystemExit):
        cli.main(["verify", "--help"])
    out = capsys.readouterr().out
    assert "Compare the host with the applied profile (-v: the settings that passed too)." in out


def test_uninstall_system_prefix_says_remove_from() -> None:
    subs = _subparsers()
    helps = {
        name: next(a.help for a in subs[name]._actions if "--prefix" in a.option_strings)
        for name in ("install-system", "uninstall-system")
    }
    assert helps["install-system"] == "install under DIR (default: /)"
    assert helps["uninstall-system"] == "remove what was installed under DIR (default: /)"


def shipped_profiles() -> list[str]:
    """README's list of the shipped profiles as profiles/ has them: each one's name, file and
    the first paragraph of its opening comment ("# name: what it is for")."""
    items = []
    for path in sorted((REPO / "profiles").glob("*.toml")):
        para = []
        for line in path.read_text().splitlines():
            if line.strip() == "#" or not line.startswith("#"):
                break
            para.append(line.removeprefix("#").strip())
        name, text = " ".join(para).split(": ", 1)
        assert name == path.stem, (path, name)
        items.append(f"- `{name}` (`profiles/{path.name}`): {text}")
    return items


def test_readme_names_every_shipped_profile() -> None:
    readme = (REPO / "README.md").read_text()
    listed = readme.split("<!-- shipped-profiles:", 1)[1].split("<!-- end of shipped-profiles")[0]
    assert listed.splitlines()[1:] == shipped_profiles()


# ---- bash completion -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def completion(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gputuned.cli.manpages import bash_completion

    script = tmp_path_factory.mktemp("completion") / "gputunectl"
    script.write_text(bash_completion(cli.build_parser()))
    return script


def complete(script: Path, cwd: Path, *words: str) -> list[str]:
    """What the completion offers for the last of ``words``, run in ``cwd``."""
    import shlex
    import subprocess

    cmd = (
        f"source {script}; COMP_WORDS=({' '.join(map(shlex.quote, words))}); "
        f'COMP_CWORD={len(words) - 1}; _gputunectl; printf "%s\\n" "${{COMPREPLY[@]}}"'
    )
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True, cwd=cwd)
    return sorted(filter(None, out.stdout.splitlines()))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "trees").mkdir()
    (tmp_path / "trees" / "mine.toml").write_text("")
    (tmp_path / "trees" / "notes.txt").write_text("")
    (tmp_path / "edge.toml").write_text("")
    (tmp_path / "notes.txt").write_text("")
    return tmp_path


def test_completion_offers_folders_for_root_and_files_for_a_file(
    completion: Path, folder: Path
) -> None:
    assert complete(completion, folder, "gputunectl", "verify", "--root", "") == ["trees"]
    assert complete(completion, folder, "gputunectl", "uninstall-system", "--prefix", "t") == [
        "trees"
    ]
    assert complete(completion, folder, "gputunectl", "capture", "") == ["trees"]
    got = complete(completion, folder, "gputunectl", "verify", "--prometheus", "")
    assert got == ["edge.toml", "notes.txt", "trees"]


def test_completion_offers_pids_for_a_pid_and_nothing_it_cannot_know(
    completion: Path, folder: Path
) -> None:
    import os

    pids = complete(completion, folder, "gputunectl", "register", "")
    assert str(os.getpid()) in pids and all(p.isdigit() for p in pids)
    assert str(os.getpid()) in complete(completion, folder, "gputunectl", "top", "--pid", "")
    assert complete(completion, folder, "gputunectl", "register", "1", "--rule", "") == []
    assert complete(completion, folder, "gputunectl", "trial", "--better", "") == [
        "higher",
        "lower",
    ]


def test_completion_of_a_profile_is_names_and_toml_paths_not_every_file(
    completion: Path, folder: Path
) -> None:
    got = complete(completion, folder, "gputunectl", "plan", "")
    assert "notes.txt" not in got
    assert {"edge.toml", "trees"} <= set(got)
    assert complete(completion, folder, "gputunectl", "plan", "trees/") == ["trees/mine.toml"]
    assert complete(completion, folder, "gputunectl", "plan", "--j") == ["--json"]


# ---- man pages -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from gputuned.cli.manpages import write_all

    return {p.name: p.read_text() for p in write_all(tmp_path_factory.mktemp("man"))}


def _section(page: str, name: str) -> str:
    assert f"\n.SH {name}\n" in page, name
    return page.split(f"\n.SH {name}\n", 1)[1].split("\n.SH ", 1)[0]


def test_profile_page_opens_with_a_description(pages: dict[str, str]) -> None:
    page = pages["gputuned-profile.5"]
    text = _section(page, "DESCRIPTION")
    assert page.index(".SH DESCRIPTION") < page.index(".SH ", page.index(".SH NAME") + 1) + 1
    for what in ("TOML", "/etc/gputuned/profiles", "include", "gputunectl plan"):
        assert what.replace("-", "\\-") in text, what


def test_gputunectl_page_has_examples_that_parse() -> None:
    import shlex

    from gputuned.cli.manpages import EXAMPLES, command_page

    parser = cli.build_parser()
    page = command_page(parser, 8, "x")
    text = _section(page, "EXAMPLES")
    for command, meaning in EXAMPLES:
        words = shlex.split(command)
        assert words[0] == "gputunectl"
        # An example that no longer parses fails here (its tree stands for a captured one).
        tree = str(REPO / "tests/data/hosts/h200-captured")
        args = parser.parse_args([tree if w == "/srv/trees/h200" else w for w in words[1:]])
        assert args.func, command
        assert command.replace("-", "\\-") in text and meaning.split()[0] in text
    assert {shlex.split(c)[1] for c, _ in EXAMPLES} >= {"plan", "apply", "verify", "revert"}


def test_the_profile_manual_names_every_shipped_profile() -> None:
    from gputuned.profile.schema import render_profile_docs

    opening = render_profile_docs().split("\n## ", 1)[0]
    for path in (REPO / "profiles").glob("*.toml"):
        assert f"`profiles/{path.name}`" in opening, path.name


# ---- gputunectl active -----------------------------------------------------------------------


def test_active_prints_one_line_the_profiles_name_or_none(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "active", "--root", str(root)) == (0, "none\n", "")
    rc, out, _ = run(capsys, "active", "--root", str(root), "--json")
    assert rc == 0 and json.loads(out) == {"active_profile": None, "source": None}
    assert run(capsys, "apply", str(PROFILES / "shared-host.toml"), "--root", str(root))[0] == 0
    assert run(capsys, "active", "--root", str(root)) == (0, "shared-host\n", "")
    rc, out, _ = run(capsys, "active", "--root", str(root), "--json")
    assert rc == 0 and json.loads(out) == {
        "active_profile": "shared-host",
        "source": str(PROFILES / "shared-host.toml"),
    }
    assert run(capsys, "revert", "--root", str(root))[0] == 0
    assert run(capsys, "active", "--root", str(root)) == (0, "none\n", "")


# ---- the daemon's journal lines --------------------------------------------------------------


def test_log_lines_do_not_repeat_the_services_name(capfd: pytest.CaptureFixture[str]) -> None:
    """journald already names the unit's lines ``gputuned[PID]:``; its stderr lines said
    ``gputuned: daemon: ...`` after that."""
    import logging

    from gputuned.service.notify import setup_logging

    root_logger = logging.getLogger()
    handlers, level = root_logger.handlers[:], root_logger.level
    try:
        assert setup_logging(debug=False, to_journal=False) == "stderr"
        logging.getLogger("gputuned").info("daemon: ready")
        logging.getLogger("gputuned.engine.apply").warning("skipped %s", "irq 31")
    finally:
        root_logger.handlers[:] = handlers
        root_logger.setLevel(level)
    assert capfd.readouterr().err.splitlines() == [
        "<6>daemon: ready",
        "<4>engine.apply: skipped irq 31",
    ]


def test_the_daemon_logs_what_apply_and_reload_did_and_reads_at_debug(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import os
    import signal

    from gputuned.daemon.core import Daemon
    from gputuned.service.control import PeerCred
    from tests.faults import tree_kernel
    from tests.unit.test_daemon import profile_file

    root = tree_copy("h200-captured", tmp_path)
    prof = profile_file(tmp_path, count=4)
    with caplog.at_level(logging.DEBUG, logger="gputuned"):
        d = Daemon(tree_kernel(root), profile_path=prof)
        d.start()
        try:
            infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
            assert any(
                re.fullmatch(r"daemon: start: applied shared-host: \d+ write\(s\), .*", m)
                for m in infos
            ), infos
            caplog.clear()
            peer = PeerCred(4242, 0, 0)
            d.requests.handle({"cmd": "status"}, peer)
            d.requests.handle({"cmd": "verify"}, peer)
            asked = [r for r in caplog.records if "control:" in r.getMessage()]
            assert [r.levelno for r in asked] == [logging.DEBUG] * 2, asked
            caplog.clear()
            prof.write_text(prof.read_text().replace("count = 4", "count = 6"))
            os.kill(os.getpid(), signal.SIGHUP)
            d.loop.run_once(1.0)
            infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
            assert f"daemon: reload: shared-host from {prof} (was shared-host)" in infos, infos
            assert any(re.fullmatch(r"daemon: reload: applied shared-host: [1-9]\d* write\(s\), .*", m)
                       for m in infos), infos  # fmt: skip
        finally:
            d.stop()
