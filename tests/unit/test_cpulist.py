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
