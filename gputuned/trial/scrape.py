"""Read one metric from a server's Prometheus endpoint (the text exposition format).

``URL#name``: the endpoint (``http://127.0.0.1:8000/metrics``, vLLM's) and a metric family.
Every sample of the family is summed over its label sets (one per model served): a histogram
or summary gives its ``_sum`` and ``_count`` (a window's mean is the difference of sums over
the difference of counts: vLLM's ``vllm:time_per_output_token_seconds``), a counter or gauge
its value. The server is another program: its answer is hostile input, read with a size limit
and one deadline for the whole answer, redirects not followed, and a server of this host read
only when its socket is the server's user's or root's (gputuned/service/httpget.py); a line
that does not parse is skipped.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Collection
from dataclasses import dataclass

from gputuned import errors
from gputuned.service import httpget

#: Largest exposition read (vLLM's is tens of KiB).
MAX_BYTES = 8 << 20
#: One reading's deadline in seconds: connecting, the headers and the body together.
DEADLINE_S = 5.0
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+\S+)?")


@dataclass(frozen=True)
class Target:
    url: str
    name: str

    def __str__(self) -> str:
        return f"{self.url}#{self.name}"


def parse_target(text: str) -> Target:
    url, sep, name = text.rpartition("#")
    scheme = urllib.parse.urlsplit(url).scheme
    if not sep or scheme not in ("http", "https") or not re.fullmatch(r"[a-zA-Z_:][\w:]*", name):
        raise errors.GputunedError(
            f"metric {text!r}: give the endpoint and the metric's name as URL#name, such as "
            "http://127.0.0.1:8000/metrics#vllm:time_per_output_token_seconds"
        )
    return Target(url, name)


@dataclass(frozen=True)
class Reading:
    """The family's samples summed: ``value`` (counter, gauge) or ``total`` and ``count``
    (histogram, summary); ``kind`` says which were found."""

    kind: str  # "histogram" or "value"
    value: float
    count: float = 0.0


def scrape(target: Target, *, owners: Collection[int], timeout: float | None = None) -> Reading:
    """The family of ``target``, read within ``timeout`` seconds in all (DEADLINE_S by
    default), never through a redirect; a server on this host only when its socket is owned
    by a uid in ``owners`` (the server's user) or root. gputuned/service/httpget.py says why."""
    body = httpget.get(
        target.url,
        timeout=DEADLINE_S if timeout is None else timeout,
        max_bytes=MAX_BYTES,
        owners=owners,
    )
    return read_family(body.decode("utf-8", "replace"), target.name)


def read_family(text: str, name: str) -> Reading:
    """The family ``name`` in exposition ``text``; HostError when it has no sample."""
    plain = total = count = 0.0
    seen_plain = seen_hist = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.fullmatch(line.strip())
        if m is None:
            continue
        try:
            v = float(m[3])
        except ValueError:
            continue
        if not math.isfinite(v):
            continue
        if m[1] == name or m[1] == f"{name}_total":
            plain += v
            seen_plain = True
        elif m[1] == f"{name}_sum":
            total += v
            seen_hist = True
        elif m[1] == f"{name}_count":
            count += v
    if seen_hist:
        return Reading("histogram", total, count)
    if seen_plain:
        return Reading("value", plain)
    raise errors.HostError(f"the metrics have no sample of {name!r}; check the name", path=name)
