"""Every documentation path the repository cites exists (issue 19: docs moved into docs/dev).

Two kinds of reference: Markdown links in the project's .md files (relative to the file), and
plain ``docs/<page>.md`` paths anywhere in the tracked text (code comments, error messages,
scripts, tests, packaging), which are relative to the repository root.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
DOC_PATH = re.compile(r"(?<![\w/.-])(docs/[\w/-]+\.(?:md|png))")
TEXT = {".md", ".py", ".sh", ".toml", ".service", ".rules", ".yaml", ".in", ".cfg", ""}
#: Not the project's own text: vendored schemas and captured host trees.
SKIP = ("tests/data/crds/", "tests/data/hosts/")


def _files() -> list[Path]:
    out = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    names = [p for p in out.split("\0") if p and not p.startswith(SKIP)]
    return [REPO / p for p in names if Path(p).suffix in TEXT and (REPO / p).is_file()]


def dangling(text: str, page: Path) -> list[str]:
    """The references in ``text`` (read from ``page``) that point at nothing."""
    bad = []
    if page.suffix == ".md":
        for target in LINK.findall(text):
            if "://" not in target and not (page.parent / target).exists():
                bad.append(f"link {target}")
    bad += [f"path {cited}" for cited in DOC_PATH.findall(text) if not (REPO / cited).exists()]
    return bad


def test_no_reference_to_a_doc_that_is_not_there() -> None:
    files = _files()
    assert len(files) > 100
    bad = []
    for path in files:
        if path == Path(__file__).resolve():
            continue  # its own example below cites a page that is gone on purpose
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        bad += [f"{path.relative_to(REPO)}: {b}" for b in dangling(text, path)]
    assert not bad, "dangling documentation references:\n" + "\n".join(bad)


def test_the_check_finds_a_dangling_reference() -> None:
    page = REPO / "docs" / "usage.md"
    text = page.read_text()
    assert dangling(text, page) == []
    moved = text + "\n[gone](gone.md), [there](dev/benchmarks.md), docs/benchmarks.md\n"
    assert dangling(moved, page) == ["link gone.md", "path docs/benchmarks.md"]
