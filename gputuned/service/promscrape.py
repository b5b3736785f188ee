"""Read one metric from a server's Prometheus endpoint (the text exposition format).

``URL#name``: the endpoint (``http://127.0.0.1:8000/metrics``, vLLM's) and a metric family.
Every sample of the family is summed over its label sets (one per model served): a histogram
or summary gives its ``_sum`` and ``_count`` (a window's mean is the difference of sums over
the difference of counts: vLLM's ``vllm:time_per_output_token_seconds``), a counter or gauge
its value. The server is another program: its answer is hostile input, read with a size limit
and a timeout, and a line that does not parse is skipped.
"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from gputuned import errors

#: Largest exposition read (vLLM's is tens of KiB).
MAX_BYTES = 8 << 20
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


def scrape(target: Target, timeout: float = 5.0) -> Reading:
    try:
        with urllib.request.urlopen(target.url, timeout=timeout) as resp:  # noqa: S310 (http(s) only: parse_target)
            body = resp.read(MAX_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise errors.HostError(
            f"could not read {target.url}: {exc}; is the server up and its metrics endpoint "
            "at that address?",
            path=target.url,
        ) from exc
    if len(body) > MAX_BYTES:
        raise errors.HostError(f"{target.url}: more than {MAX_BYTES} bytes of metrics; refused")
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
