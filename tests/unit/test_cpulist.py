from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputuned.cpulist import CpuListError, format_cpulist, format_mask, parse_cpulist, parse_mask


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", set()),
        ("\n", set()),
        ("0", {0}),
        ("0-3,8", {0, 1, 2, 3, 8}),
        ("0-15:2/4", {0, 1, 4, 5, 8, 9, 12, 13}),
        (" 4-5 ,7\n", {4, 5, 7}),
    ],
)
def test_parse_cpulist(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a-b", "'a-b' is not a CPU list; write CPUs and ranges like '0-3,8' or '0-15:2/4'"),
        ("3-1", "'3-1': range '3-1' runs backwards; write it low-high"),
        ("0-7:3/2", "'0-7:3/2': in '0-7:3/2' need 0 < used <= group size"),
        ("1,,2", "'1,,2' is not a CPU list; write CPUs and ranges like '0-3,8' or '0-15:2/4'"),
    ],
)
def test_parse_cpulist_errors(text: str, message: str) -> None:
    with pytest.raises(CpuListError) as info:
        parse_cpulist(text)
    assert str(info.value) == message


def test_format_cpulist_like_the_kernel() -> None:
    assert format_cpulist({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert format_cpulist(set()) == ""


@pytest.mark.parametrize(
    ("cpus", "nr", "mask"),
    [
        ({0, 1}, 2, "3"),  # ci-vm default_smp_affinity
        (set(range(16)), 16, "ffff"),  # h200-vm default_smp_affinity
        ({0}, 64, "00000000,00000001"),
        ({32}, 64, "00000001,00000000"),
        ({0}, 36, "0,00000001"),
    ],
)
def test_masks(cpus: set[int], nr: int, mask: str) -> None:
    assert format_mask(cpus, nr) == mask
    assert parse_mask(mask) == cpus


def test_parse_mask_rejects_garbage() -> None:
    with pytest.raises(CpuListError, match="not a hex CPU mask"):
        parse_mask("0x1g")


@given(st.frozensets(st.integers(0, 255)))
def test_cpulist_roundtrip(cpus: frozenset[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus)) == cpus
    assert parse_mask(format_mask(cpus, 256)) == cpus


# -- bounds (issue 14, finding 14): "0-99999999" allocated 2.3 GB --------------------------


@pytest.mark.parametrize("text", ["0-99999999", "8192", "0-9000", "1,8192", "0-65535:1/2"])
def test_cpu_numbers_past_the_kernels_limit_are_refused(text: str) -> None:
    with pytest.raises(CpuListError, match="past CPU 8191"):
        parse_cpulist(text)


def test_the_highest_cpu_linux_builds_for_is_fine() -> None:
    assert max(parse_cpulist("8190-8191")) == 8191


def test_a_mask_longer_than_8192_cpus_is_refused() -> None:
    assert parse_mask("f" * 2048) == frozenset(range(8192))
    with pytest.raises(CpuListError, match="past CPU 8191"):
        parse_mask("1" + "0" * 2048)


def test_a_huge_list_in_a_profile_is_a_profile_error() -> None:
    from gputuned.errors import ProfileError
    from gputuned.profile.load import parse_profile

    with pytest.raises(ProfileError, match="past CPU 8191"):
        parse_profile({"name": "x", "cpusets": {"a": {"cpus": "0-99999999"}}}, "t")


def test_errors_quote_a_long_list_shortened() -> None:
    with pytest.raises(CpuListError) as exc:
        parse_cpulist("x" * 100000)
    assert len(str(exc.value)) < 300


# -- independent oracles: the kernel's own algorithms, written out here ----------------------------


def kernel_region(lo: int, hi: int, used: int, group: int) -> set[int]:
    """lib/bitmap-str.c bitmap_set_region: from ``lo``, every ``group`` CPUs set the first
    ``used`` of them, never past ``hi``."""
    out: set[int] = set()
    for start in range(lo, hi + 1, group):
        out.update(range(start, min(start + used, hi + 1)))
    return out


@st.composite
def cpulist_parts(draw: st.DrawFn) -> tuple[str, set[int]]:
    """One part of a cpulist as a profile or the kernel writes it, and the CPUs it names."""
    lo = draw(st.integers(0, 300))
    hi = lo + draw(st.integers(0, 40))
    shape = draw(st.sampled_from(["single", "range", "stride"]))
    if shape == "single":
        return str(lo), {lo}
    if shape == "range":
        return f"{lo}-{hi}", set(range(lo, hi + 1))
    group = draw(st.integers(1, 9))
    used = draw(st.integers(1, group))
    return f"{lo}-{hi}:{used}/{group}", kernel_region(lo, hi, used, group)


@given(st.lists(cpulist_parts(), min_size=1, max_size=6), st.sampled_from(["", " ", "\n"]))
def test_parse_cpulist_names_the_cpus_the_kernel_would(
    parts: list[tuple[str, set[int]]], pad: str
) -> None:
    """A profile's cpus = "..." (and any *_list file) means what bitmap_parselist makes of it:
    singles, ranges and strided ranges that start anywhere, parts in any order."""
    text = ",".join(p for p, _ in parts) + pad
    expected = set().union(*(cpus for _, cpus in parts))
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("1-8:1/4", {1, 5}),  # the stride counts from the range's start, not from CPU 0
        ("3-12:2/4", {3, 4, 7, 8, 11, 12}),
        ("0-3:1/1", {0, 1, 2, 3}),  # a group of one: every CPU
        ("0-5:3/3", {0, 1, 2, 3, 4, 5}),  # all of each group: every CPU
        ("5-5", {5}),  # a range of one CPU
    ],
)
def test_strided_and_one_cpu_ranges_mean_what_the_kernel_says(text: str, cpus: set[int]) -> None:
    """Edge cases of the kernel's grammar that a user may write: a stride starting off CPU 0,
    a group of one, used equal to the group, and a range whose ends are the same CPU."""
    assert parse_cpulist(text) == cpus


def kernel_list(cpus: set[int]) -> str:
    """bitmap_print_list_to_buf: maximal runs of consecutive CPUs, "a" or "a-b", by comma."""
    out: list[str] = []
    ordered = sorted(cpus)
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            a, b = ordered[start], ordered[i - 1]
            out.append(str(a) if a == b else f"{a}-{b}")
            start = i
    return ",".join(out)


@given(st.sets(st.integers(0, 200)))
def test_format_cpulist_prints_what_the_kernel_prints(cpus: set[int]) -> None:
    """What gputuned writes to cpuset.cpus and *_list files, and shows in the plan, is the
    kernel's own form, so that a read-back compares equal as text."""
    assert format_cpulist(cpus) == kernel_list(cpus)
    assert format_cpulist(iter(sorted(cpus, reverse=True))) == kernel_list(cpus)


def kernel_mask(cpus: set[int], nr: int) -> str:
    """bitmap_print_bitmask_to_buf ("%*pb"): ceil(nr/4) hex digits, a comma every 8 from the
    right."""
    value = sum(1 << c for c in cpus)
    digits = format(value, f"0{(nr + 3) // 4}x")
    groups = [digits[max(0, end - 8) : end] for end in range(len(digits), 0, -8)]
    return ",".join(reversed(groups))


@given(
    st.integers(1, 1100).flatmap(lambda nr: st.tuples(st.just(nr), st.sets(st.integers(0, nr - 1))))
)
def test_masks_are_printed_and_read_as_the_kernel_does(case: tuple[int, set[int]]) -> None:
    """smp_affinity and default_smp_affinity are written in the kernel's width for the host's
    CPU count (a mask the kernel prints back compares equal as text) and read back as the
    same CPUs, on hosts of any size up to 1,100 CPUs."""
    nr, cpus = case
    mask = format_mask(cpus, nr)
    assert mask == kernel_mask(cpus, nr)
    assert parse_mask(mask) == cpus


@pytest.mark.parametrize(
    ("nr", "mask"),
    [
        (1, "1"),
        (4, "1"),
        (5, "01"),
        (32, "00000001"),
        (33, "0,00000001"),
        (97, "0,00000000,00000000,00000001"),
        (1024, ",".join(["00000000"] * 31 + ["00000001"])),
    ],
)
def test_mask_width_follows_the_cpu_count(nr: int, mask: str) -> None:
    """The widths the kernel prints at the edges of a 32-CPU group and a digit."""
    assert format_mask({0}, nr) == mask


def test_masks_read_from_proc_end_in_a_newline() -> None:
    """/proc/irq/N/smp_affinity reads "ffff\\n"; the newline is not part of the mask."""
    assert parse_mask("ffff\n") == frozenset(range(16))
    assert parse_mask(" 00000001,00000000\n") == {32}


def test_a_mask_is_limited_by_the_cpus_it_names_not_by_its_leading_zeros() -> None:
    """A mask padded with zeros past 8,192 CPUs still names only its low CPUs; the refusal of
    one that names a CPU past the limit says which CPU (the highest its digits can hold)."""
    assert parse_mask("0" * 3000 + "3") == {0, 1}
    with pytest.raises(CpuListError) as info:
        parse_mask("f" + "0" * 2048)
    assert "names CPU 8195, past CPU 8191" in str(info.value)


def test_a_part_longer_than_64_characters_is_refused_unread() -> None:
    """Each part of a list is bounded before it is parsed: 64 characters are read (a number
    zero-padded to that width is still the CPU it names), 65 are refused as not a list."""
    assert parse_cpulist("0" * 63 + "7") == {7}
    assert parse_cpulist("1," + "0" * 63 + "7") == {1, 7}
    with pytest.raises(CpuListError, match="is not a CPU list"):
        parse_cpulist("0" * 64 + "7")


def test_errors_quote_lists_up_to_60_characters_whole() -> None:
    """An error shows the list as written while it fits in 60 characters, and otherwise its
    first 57 and "...", so that a message stays one readable line."""
    sixty = "x" * 60
    with pytest.raises(CpuListError) as info:
        parse_cpulist(sixty)
    assert str(info.value).startswith(repr(sixty) + " is not a CPU list")
    with pytest.raises(CpuListError) as info:
        parse_cpulist(sixty + "y")
    assert str(info.value).startswith(repr("x" * 57 + "...") + " is not a CPU list")
