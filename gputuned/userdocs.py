"""Where a message or a man page sends its reader: the user docs (README.md, docs/*.md).

The Debian package ships them in /usr/share/doc/gputuned (scripts/build-deb); a clone has them
in docs/. A message names a doc with ``cite``, which gives the installed copy where the package
put one and the clone's path otherwise; the man pages, shipped only in the package, name the
installed copies (``installed``). tests/unit/test_userdocs.py holds every citation to a doc the
package ships.
"""

from __future__ import annotations

import re
from pathlib import Path

DOC_DIR = Path("/usr/share/doc/gputuned")
_CITED = re.compile(r"(?<![\w/])docs/([\w-]+\.md)")


def cite(page: str) -> str:
    """``/usr/share/doc/gputuned/PAGE`` where the package installed it, else ``docs/PAGE``."""
    installed_copy = DOC_DIR / page
    return str(installed_copy) if installed_copy.is_file() else f"docs/{page}"


def installed(text: str) -> str:
    """``text`` with each user doc it cites (docs/ and a page name) named where the package
    installs it."""
    return _CITED.sub(lambda m: f"{DOC_DIR}/{m.group(1)}", text)
