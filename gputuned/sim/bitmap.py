"""How the kernel reads a CPU list or mask written to it: lib/bitmap-str.c, ported.

:mod:`gputuned.cpulist` reads what the kernel prints, and profiles; it is stricter than the
kernel's parsers, which also take empty regions (``1,,2``), whitespace between regions, ``N``
(the last CPU) and ``all`` in a list, and read a mask as 32-bit groups between commas (``1,5``
is CPUs 0, 2 and 32). The model answers a write as the kernel would, so it parses with these
ports of ``bitmap_parselist()`` and ``bitmap_parse()`` (Linux 6.12, unchanged in 6.18), not
with gputuned's own parser: a fault in that one is then caught, not mirrored.
tests/integration/test_procctl_live.py checks both against a real kernel.

Errors are the kernel's: EINVAL for a malformed text, ERANGE for a CPU past ``nbits`` in a
list, EOVERFLOW for a number too large or a mask wider than ``nbits``.
"""

from __future__ import annotations

import errno as E
import os

#: isspace() of lib/ctype.c for ASCII, and the comma: what separates regions.
_SEPARATORS = frozenset(" \t\n\v\f\r,")
_HEX = "0123456789abcdef"


def _fail(code: int, reason: str | None = None) -> OSError:
    # gputuned.sim.files.fail, which cannot be imported here: files parses through this module.
    return OSError(code, reason or os.strerror(code))


def parselist(text: str, nbits: int, shown: str = "") -> frozenset[int]:
    """bitmap_parselist(): regions ``a``, ``a-b`` and ``a-b:used/group`` (``N`` is the last
    bit, ``all`` every bit); the text ends at a NUL or at a newline that ends a region."""
    shown = shown or repr(text)
    s = text + "\0"
    cpus: set[int] = set()
    i = 0
    while True:
        while s[i] in _SEPARATORS:  # bitmap_find_region()
            i += 1
        if s[i] in "\0\n":
            return frozenset(cpus)
        (start, end, used, group), i = _region(s, i, nbits, shown)
        if start > end or group == 0 or used > group:  # bitmap_check_region()
            raise _fail(E.EINVAL, f"{shown} is not a CPU list")
        if end >= nbits:
            raise _fail(E.ERANGE)
        for first in range(start, end + 1, group):  # bitmap_set_region()
            cpus.update(range(first, first + min(end - first + 1, used)))
        if i < 0:
            return frozenset(cpus)


def _region(s: str, i: int, nbits: int, shown: str) -> tuple[tuple[int, int, int, int], int]:
    """bitmap_parse_region(): the region at ``i`` and where parsing goes on (-1: the end)."""
    last = nbits - 1
    bad = _fail(E.EINVAL, f"{shown} is not a CPU list")
    if s[i : i + 3].lower() == "all":
        start, end, i = 0, last, i + 3
    else:
        start, i = _number(s, i, last, bad)
        if s[i] in _SEPARATORS or s[i] in "\0\n":  # end_of_region(): a single bit
            return (start, start, 1, 1), (-1 if s[i] in "\0\n" else i)
        if s[i] != "-":
            raise bad
        end, i = _number(s, i + 1, last, bad)
    if s[i] in _SEPARATORS or s[i] in "\0\n":  # no pattern: every bit of the range
        span = end + 1
        return (start, end, span, span), (-1 if s[i] in "\0\n" else i)
    if s[i] != ":":
        raise bad
    used, i = _number(s, i + 1, last, bad)
    if s[i] != "/":
        raise bad
    group, i = _number(s, i + 1, last, bad)
    return (start, end, used, group), i


def _number(s: str, i: int, last: int, bad: OSError) -> tuple[int, int]:
    """bitmap_getnum(): decimal digits, or ``N`` for the last bit."""
    if s[i] == "N":
        return last, i + 1
    j = i
    while s[j].isdigit() and s[j].isascii():
        j += 1
    if j == i:
        raise bad
    n = int(s[i:j])
    if n >= 1 << 32:  # more than an unsigned int holds
        raise _fail(E.EOVERFLOW)
    return n, j


def parse(text: str, nbits: int, shown: str = "") -> frozenset[int]:
    """bitmap_parse(): hex groups of up to 8 digits, each 32 bits, the lowest last; commas
    and whitespace separate them (leading, trailing and repeated ones are skipped); the text
    ends at a NUL or newline. More groups than ``nbits`` needs, or a bit past it: EOVERFLOW."""
    shown = shown or repr(text)
    s = text.split("\n", 1)[0].split("\0", 1)[0]
    chunks = (nbits + 31) // 32
    words: list[int] = []
    end = len(s) - 1
    while True:
        while end >= 0 and s[end] in _SEPARATORS:  # bitmap_find_region_reverse()
            end -= 1
        if end < 0:
            break
        if len(words) == chunks:
            raise _fail(E.EOVERFLOW)
        word, end = _word(s, end, shown)
        words.append(word)
    value = sum(w << (32 * k) for k, w in enumerate(words))
    if len(words) * 32 >= nbits and value >> nbits:
        raise _fail(E.EOVERFLOW)
    return frozenset(b for b in range(value.bit_length()) if value >> b & 1)


def _word(s: str, end: int, shown: str) -> tuple[int, int]:
    """bitmap_get_x32_reverse(): up to 8 hex digits ending at ``end``, read backwards."""
    word = 0
    for shift in range(0, 32, 4):
        digit = _HEX.find(s[end].lower()) if s[end].isascii() else -1
        end -= 1
        if digit < 0:
            raise _fail(E.EINVAL, f"{shown} is not a hex CPU mask")
        word |= digit << shift
        if end < 0 or s[end] in _SEPARATORS:
            return word, end
    # A ninth digit overflows the group. The kernel steps past the character either way
    # (hex_to_bin(*end--)), so a stray non-digit there is skipped, as here.
    nxt = s[end].lower()
    if nxt.isascii() and nxt in _HEX:
        raise _fail(E.EOVERFLOW)
    return word, end - 1
