"""Profiles: TOML loading, includes, every validation error, CPU set resolution, schema, docs."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import pytest

from gputuned.errors import ProfileError
from gputuned.kernel.topology import GpuRef, HostCpus
from gputuned.profile import tables as declared
from gputuned.profile.cpuresolve import resolve_cpusets
from gputuned.profile.load import load_profile, parse_profile
from gputuned.profile.messages import key_path
from gputuned.profile.model import Profile
from gputuned.profile.schema import profile_schema, render_profile_docs
from gputuned.store.userfiles import MAX_USER_FILE, read_user_file

#: The tables, in profile order, as their declarations give them (gputuned/profile/tables/).
TABLE_KEYS = [t.key for t in declared.tables()]
REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "profiles"
SHIPPED = ("shared-host", "dedicated-inference", "latency-critical")

# Two literal sets most error tests refer to.
#: The hint for a set name where the profile defines none.
NO_SETS = "no set is defined; define it first as [cpusets.{}]"
SETS = """
name = "t"
[cpusets.housekeeping]
cpus = "0"
[cpusets.inference]
cpus = "1-3"
"""


def cpus(text: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


# -- hosts ------------------------------------------------------------------------------------

# The lent H200 host: 16 vCPUs, one NUMA node, one GPU.
HOST16 = HostCpus(
    online=cpus("0-15"),
    numa={0: cpus("0-15")},
    gpus=(GpuRef(0, "0000:19:00.0", 0, cpus("0-15"), "NVIDIA H200"),),
)

# -- helpers ----------------------------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str) -> list[tuple[str, str]]:
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert info.value.source == str(path)
    return info.value.problems


def load(tmp_path: Path, text: str) -> Profile:
    return load_profile(write(tmp_path, text))


# -- unknown keys and wrong types ----------------------------------------------------------------


def test_unknown_top_level_key_and_missing_name_are_both_reported(tmp_path: Path) -> None:
    assert problems(tmp_path, 'nmae = "x"\n') == [
        ("name", "required key is missing; add it"),
        (
            "nmae",
            "unknown key 'nmae'; allowed keys here: name, description, include, cpusets, "
            + ", ".join(TABLE_KEYS),
        ),
    ]


def test_unknown_key_in_a_tuner_table_lists_that_tables_keys(tmp_path: Path) -> None:
    assert problems(tmp_path, SETS + '[irq]\ngpu_cpu = "inference"\n') == [
        (
            "irq.gpu_cpu",
            "unknown key 'gpu_cpu'; allowed keys here: gpu_cpus, spread, others_cpus, "
            "default_affinity, irqbalance, report_only",
        )
    ]


def test_unknown_key_in_cpuset_definition_and_process_match(tmp_path: Path) -> None:
    text = SETS + '[cpusets.x]\ncpu = "0"\n[[process]]\nname = "s"\nmatch.pid = 1\n'
    assert problems(tmp_path, text) == [
        (
            "cpusets.x.cpu",
            "unknown key 'cpu'; allowed keys here: cpus, gpu_local, numa_node, all, per, "
            "exclude, count, cores, max_percent, fallback_all",
        ),
        (
            "process[0].match.pid",
            "unknown key 'pid'; allowed keys here: exe, comm, cmdline, user, uid, unit, "
            "cgroup, uses_gpu",
        ),
    ]


def test_wrong_toml_types(tmp_path: Path) -> None:
    text = "irq = 5\n" + SETS + '[pcie_aspm]\nreport_only = "yes"\n[[process]]\nname = "s"\n'
    text += 'match.comm = "x"\nnice = "-10"\n'
    assert problems(tmp_path, text) == [
        ("pcie_aspm.report_only", "expected true or false, got string 'yes'"),
        ("irq", "expected a table, got integer 5"),
        ("process[0].nice", "expected an integer, got string '-10'"),
    ]


def test_process_written_as_a_table_instead_of_an_array(tmp_path: Path) -> None:
    text = SETS + '[process]\nname = "s"\n'
    assert problems(tmp_path, text) == [
        ("process", "expected an array, got table {'name': 's'}"),
    ]


def test_choice_outside_the_allowed_words(tmp_path: Path) -> None:
    text = SETS + '[pcie_aspm]\npolicy = "fast"\n[irq]\nirqbalance = "stop"\n'
    assert problems(tmp_path, text) == [
        (
            "pcie_aspm.policy",
            "'fast' is not allowed; use 'keep', 'default', 'performance', 'powersave' or "
            "'powersupersave'",
        ),
        ("irq.irqbalance", "'stop' is not allowed; use 'coordinate', 'report' or 'ignore'"),
    ]


# -- CPU set definitions ---------------------------------------------------------------------


def test_bad_cpulists_show_the_cpulist_message(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.a]\ncpus = "0-x"\n[cpusets.b]\ncpus = "3-1"\n'
    text += '[cpusets.c]\ncpus = " "\n'
    assert problems(tmp_path, text) == [
        (
            "cpusets.a.cpus",
            "'0-x' is not a CPU list; write CPUs and ranges like '0-3,8' or '0-15:2/4'",
        ),
        ("cpusets.b.cpus", "'3-1': range '3-1' runs backwards; write it low-high"),
        ("cpusets.c.cpus", "names no CPUs; give at least one, e.g. '0'"),
    ]


def test_a_set_needs_exactly_one_base(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.a]\ncpus = "0"\ngpu_local = 0\n[cpusets.b]\ncount = 2\n'
    text += "[cpusets.c]\nall = false\n"
    assert problems(tmp_path, text) == [
        (
            "cpusets.a",
            "give exactly one base: cpus, gpu_local, numa_node, all = true or per = 'gpu' "
            "or 'node' (found cpus and gpu_local)",
        ),
        (
            "cpusets.b",
            "give exactly one base: cpus, gpu_local, numa_node, all = true or per = 'gpu' "
            "or 'node' (found none)",
        ),
        ("cpusets.c.all", "false is not allowed; use true"),
    ]


def test_count_and_indexes_below_their_minimum(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.a]\nall = true\ncount = 0\n[cpusets.b]\ngpu_local = -1\n'
    assert problems(tmp_path, text) == [
        ("cpusets.a.count", "must be at least 1; got 0"),
        ("cpusets.b.gpu_local", "must be at least 0; got -1"),
    ]


def test_set_names(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.Big]\nall = true\n[cpusets."a.b"]\nall = true\n'
    text += "[cpusets.keep]\nall = true\n"
    msg = "is not a set name; use lowercase letters, digits, '_' and '-', starting with a letter"
    assert problems(tmp_path, text) == [
        ("cpusets.Big", f"'Big' {msg}"),
        ('cpusets."a.b"', f"'a.b' {msg}"),
        ("cpusets.keep", "'keep' is reserved (it means 'leave as is'); choose another name"),
    ]


def test_references_to_unknown_sets_everywhere(tmp_path: Path) -> None:
    text = SETS + 'exclude = ["hk"]\n[irq]\ngpu_cpus = "gpu"\nothers_cpus = "keep"\n'
    text += '[cpuset]\nmode = "root"\ncpus = "keep"\n[[process]]\nname = "s"\nmatch.comm = "x"\n'
    text += 'match.uid = 0\ncpus = "infer"\n[bootargs]\nnohz_full = "tickless"\n'
    known = "the sets are: 'housekeeping', 'inference'"
    keep = "; or 'keep', to leave it as it is"
    assert problems(tmp_path, text) == [
        ("irq.gpu_cpus", f"unknown CPU set 'gpu'; {known}{keep}"),
        ("cpuset.cpus", f"unknown CPU set 'keep'; {known}"),
        ("process[0].cpus", f"unknown CPU set 'infer'; did you mean 'inference'? {known}{keep}"),
        ("bootargs.nohz_full", f"unknown CPU set 'tickless'; {known}"),
        ("cpusets.inference.exclude[0]", f"unknown CPU set 'hk'; {known}"),
    ]


def test_references_when_no_sets_are_defined(tmp_path: Path) -> None:
    text = 'name = "t"\n[irq]\ngpu_cpus = "gpu"\n[bootargs]\nirqaffinity = "hk"\n'
    assert problems(tmp_path, text) == [
        (
            "irq.gpu_cpus",
            f"unknown CPU set 'gpu'; {NO_SETS.format('gpu')}; or 'keep', to leave it as it is",
        ),
        ("bootargs.irqaffinity", f"unknown CPU set 'hk'; {NO_SETS.format('hk')}"),
    ]


def test_a_misspelt_set_name_is_one_error_with_one_hint_in_every_table(tmp_path: Path) -> None:
    """Issue 31, item 8: `[cpuset] cpus = "inferense"` with mode "none" loaded without a word;
    every key that takes a set name now says the same."""
    typo = '"inferense"'
    text = (
        SETS + f"[irq]\ngpu_cpus = {typo}\n[workqueues]\ncpus = {typo}\n[cpuset]\ncpus = {typo}\n"
    )
    text += f'[[process]]\nname = "s"\nmatch.comm = "x"\nmatch.uid = 0\ncpus = {typo}\n'
    text += f"[bootargs]\nnohz_full = {typo}\n[neighbours]\ncap_cpus = {typo}\n"
    hint = (
        "unknown CPU set 'inferense'; did you mean 'inference'? "
        "the sets are: 'housekeeping', 'inference'"
    )
    found = problems(tmp_path, text)
    assert sorted(k for k, _ in found) == sorted(
        [
            "irq.gpu_cpus",
            "workqueues.cpus",
            "cpuset.cpus",
            "process[0].cpus",
            "bootargs.nohz_full",
            "neighbours.cap_cpus",
        ]
    )
    assert all(msg.startswith(hint) for _, msg in found), found


def test_exclude_cycles_are_reported_once_with_the_chain(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.a]\nall = true\nexclude = ["b"]\n'
    text += '[cpusets.b]\nall = true\nexclude = ["c"]\n[cpusets.c]\nall = true\nexclude = ["a"]\n'
    text += '[cpusets.d]\nall = true\nexclude = ["d"]\n'
    assert problems(tmp_path, text) == [
        ("cpusets.a.exclude", "exclude cycle: a -> b -> c -> a; a set cannot subtract itself"),
        ("cpusets.d.exclude", "exclude cycle: d -> d; a set cannot subtract itself"),
    ]


# -- PCIe sizes ------------------------------------------------------------------------------


def test_payload_sizes(tmp_path: Path) -> None:
    text = SETS + "[pcie_payload]\nmps = 8192\nmrrs = 3000\n"
    sizes = "a size in bytes: 128, 256, 512, 1024, 2048 or 4096"
    assert problems(tmp_path, text) == [
        ("pcie_payload.mps", f"8192 is not allowed; use 'keep', 'max-safe' or {sizes}"),
        ("pcie_payload.mrrs", f"3000 is not allowed; use 'keep' or {sizes}"),
    ]


def test_payload_sizes_reject_other_types(tmp_path: Path) -> None:
    text = SETS + '[pcie_payload]\nmps = true\nmrrs = "4096"\n'
    sizes = "a size in bytes: 128, 256, 512, 1024, 2048 or 4096"
    assert problems(tmp_path, text) == [
        ("pcie_payload.mps", f"true is not allowed; use 'keep', 'max-safe' or {sizes}"),
        ("pcie_payload.mrrs", f"'4096' is not allowed; use 'keep' or {sizes}"),
    ]


def test_payload_sizes_accepted(tmp_path: Path) -> None:
    text = SETS + "[pcie_payload]\nmps = 256\nmrrs = 128\nallow_mps_change = true\n"
    payload = load(tmp_path, text).pcie_payload
    assert payload is not None
    assert (payload.mps, payload.mrrs, payload.allow_mps_change) == (256, 128, True)


# -- process rules ---------------------------------------------------------------------------


def rule(body: str, name: str = "s") -> str:
    return f'[[process]]\nname = "{name}"\nmatch.comm = "x"\nmatch.uid = 0\n{body}\n'


def test_nice_and_priority_ranges(tmp_path: Path) -> None:
    text = SETS + rule("nice = -21", "a") + rule('policy = "fifo"', "b")
    text += rule('policy = "rr"\npriority = 100', "c") + rule('policy = "other"\npriority = 5', "d")
    text += rule("priority = 3", "e") + rule('policy = "fifo"\npriority = 10', "f")
    assert problems(tmp_path, text) == [
        ("process[0].nice", "must be from -20 to 19; got -21"),
        ("process[1].priority", "policy 'fifo' needs a priority from 1 to 99; add one"),
        ("process[2].priority", "policy 'rr' needs a priority from 1 to 99; got 100"),
        (
            "process[3].priority",
            "5 is not allowed with policy 'other'; a priority is only for 'fifo' or 'rr': "
            "remove it or set it to 0",
        ),
        (
            "process[4].priority",
            "3 is not allowed with policy 'keep'; a priority is only for 'fifo' or 'rr': "
            "remove it or set it to 0",
        ),
    ]


def test_priority_zero_is_allowed_without_real_time(tmp_path: Path) -> None:
    profile = load(tmp_path, SETS + rule('policy = "batch"\npriority = 0\nnice = 19'))
    assert profile.process[0].priority == 0


def test_match_keys(tmp_path: Path) -> None:
    text = SETS + '[[process]]\nname = "a"\nmatch.comm = "text-generation-server"\n'
    text += 'match.exe = "python3"\nmatch.unit = "vllm"\nmatch.cgroup = "system.slice"\n'
    text += 'match.cmdline = "(vllm"\nmatch.uses_gpu = -1\n'
    text += '[[process]]\nname = "b"\nmatch = {}\n[[process]]\nname = ""\n'
    assert problems(tmp_path, text) == [
        (
            "process[0].match.exe",
            "'python3' is not an absolute path; give the executable's full path as "
            "/proc/PID/exe shows it (e.g. '/usr/bin/python3.11')",
        ),
        (
            "process[0].match.comm",
            "'text-generation-server' is 22 characters; the kernel keeps only the first 15 "
            "(TASK_COMM_LEN), so write 'text-generation'",
        ),
        (
            "process[0].match.cmdline",
            "'(vllm' is not a valid Python regular expression (missing ), unterminated "
            "subpattern at position 0); escape literal characters such as ( [ . * + ? with "
            "a backslash",
        ),
        (
            "process[0].match.unit",
            "'vllm' is not a systemd unit name; write one ending in '.service' or '.scope' "
            "(e.g. 'vllm.service')",
        ),
        (
            "process[0].match.cgroup",
            "'system.slice' is not a cgroup path; write it as /proc/PID/cgroup shows it, "
            "starting with '/' (e.g. '/system.slice/vllm.service')",
        ),
        ("process[0].match.uses_gpu", "must be at least 0; got -1"),
        (
            "process[1].match",
            "give at least one of user, uid, unit, cgroup, exe, comm, cmdline or uses_gpu; a "
            "rule without one would match every process",
        ),
        ("process[2].name", "must not be empty"),
        ("process[2].match", "required key is missing; add it"),
    ]


def test_duplicate_rule_names(tmp_path: Path) -> None:
    text = SETS + rule("", "server") + rule("", "other") + rule("", "server")
    assert problems(tmp_path, text) == [
        ("process[2].name", "'server' is already the name of process[0]; rename one"),
    ]


def test_process_in_partition_must_use_the_partition_set(tmp_path: Path) -> None:
    text = SETS + '[cpuset]\nmode = "root"\ncpus = "inference"\n'
    text += rule('cpus = "housekeeping"\nmove_to_partition = true', "a")
    text += rule('cpus = "housekeeping"', "b")  # not moved: may run anywhere
    text += rule('cpus = "keep"\nmove_to_partition = true', "c")
    text += rule("move_to_partition = true\nspread_threads = true", "d")
    assert problems(tmp_path, text) == [
        (
            "process[0].cpus",
            "'housekeeping' is not the partition set 'inference' ([cpuset] cpus), and a process "
            "moved into the partition can run only on its CPUs; use cpus = 'inference' or "
            "'keep', or move_to_partition = false",
        ),
        (
            "process[3].spread_threads",
            "works only inside an isolated partition: needs move_to_partition = true and "
            "[cpuset] mode = 'isolated'",
        ),
    ]


def test_move_to_partition_needs_a_partition(tmp_path: Path) -> None:
    text = SETS + rule("move_to_partition = true", "a")
    assert problems(tmp_path, text) == [
        (
            "process[0].move_to_partition",
            "there is no partition to move into: there is no [cpuset] table; set [cpuset] "
            "mode = 'isolated' or 'root', or move_to_partition = false",
        ),
    ]
    text = (
        SETS
        + '[cpuset]\nmode = "affinity"\ncpus = "inference"\n'
        + rule("move_to_partition = true")
    )
    assert problems(tmp_path, text) == [
        (
            "process[0].move_to_partition",
            "there is no partition to move into: [cpuset] mode is 'affinity'; set [cpuset] "
            "mode = 'isolated' or 'root', or move_to_partition = false",
        ),
    ]


# -- cpuset table ----------------------------------------------------------------------------


def test_cpuset_needs_a_set_and_a_relative_cgroup(tmp_path: Path) -> None:
    text = SETS + '[cpuset]\nmode = "isolated"\ncgroup = "../escape"\n'
    allowed = (
        "is not allowed; write a path relative to the cgroup v2 mount without a leading '/', "
        "empty parts, '.', '..' or spaces (e.g. 'gputuned.inference')"
    )
    assert problems(tmp_path, text) == [
        ("cpuset.cpus", "mode 'isolated' needs cpus = '<name of a [cpusets] set>'"),
        ("cpuset.cgroup", f"'../escape' {allowed}"),
    ]
    for bad in ("/gputuned", "a//b", "a/", "my group"):
        text = SETS + f'[cpuset]\nmode = "root"\ncpus = "inference"\ncgroup = "{bad}"\n'
        assert problems(tmp_path, text) == [("cpuset.cgroup", f"{bad!r} {allowed}")]


def test_cpuset_mode_none_needs_no_set(tmp_path: Path) -> None:
    cpuset = load(tmp_path, SETS + "[cpuset]\n").cpuset
    assert cpuset is not None
    assert (cpuset.mode, cpuset.cpus, cpuset.cgroup) == ("none", None, "gputuned.inference")


# -- overlaps known without the host ---------------------------------------------------------


def test_partition_overlapping_irq_sets(tmp_path: Path) -> None:
    text = SETS + '[cpusets.wide]\ncpus = "0-1"\n[cpuset]\nmode = "isolated"\ncpus = "inference"\n'
    text += '[irq]\nothers_cpus = "wide"\ndefault_affinity = "inference"\ngpu_cpus = "inference"\n'
    why = "IRQs there would interrupt the partition; use a set outside it"
    assert problems(tmp_path, text) == [
        (
            "irq.others_cpus",
            f"set 'wide' (0-1) overlaps set 'inference' of cpuset.cpus (1-3) on CPUs 1; {why}",
        ),
        ("irq.default_affinity", f"names set 'inference', the same set as cpuset.cpus; {why}"),
    ]


def test_overlap_through_excludes_is_static_too(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.hk]\ncpus = "0-1"\n[cpusets.inf]\ncpus = "0-7"\n'
    text += 'exclude = ["hk"]\ncount = 2\n[cpuset]\nmode = "root"\ncpus = "inf"\n'
    text += '[irq]\nothers_cpus = "hk"\n'
    profile = load(tmp_path, text)  # inf is 2-3: no overlap with hk
    assert resolve_cpusets(profile, HOST16).sets == {"hk": cpus("0-1"), "inf": cpus("2-3")}


def test_host_dependent_sets_are_not_checked_statically(tmp_path: Path) -> None:
    text = SETS + '[cpusets.gpu]\ngpu_local = 0\n[cpuset]\nmode = "root"\ncpus = "gpu"\n'
    text += '[irq]\nothers_cpus = "housekeeping"\n'
    load(tmp_path, text)  # decided by resolve_cpusets on a host


def test_boot_irqaffinity_overlapping_nohz_full_and_rcu_nocbs(tmp_path: Path) -> None:
    text = SETS + '[cpusets.wide]\ncpus = "0-3"\n[bootargs]\nnohz_full = "inference"\n'
    text += 'rcu_nocbs = "wide"\nirqaffinity = "wide"\n'
    assert problems(tmp_path, text) == [
        (
            "bootargs.irqaffinity",
            "set 'wide' (0-3) overlaps set 'inference' of bootargs.nohz_full (1-3) on CPUs 1-3; "
            "IRQs must start outside the nohz_full CPUs; use a set without them",
        ),
        (
            "bootargs.irqaffinity",
            "names set 'wide', the same set as bootargs.rcu_nocbs; IRQs must start outside the "
            "rcu_nocbs CPUs; use a set without them",
        ),
    ]


# -- bootargs ----------------------------------------------------------------------------------


def test_boot_extra_arguments(tmp_path: Path) -> None:
    text = SETS + '[bootargs]\nextra = ["preempt=full", "quiet", "a b", "x=\'1\'", "k=1;reboot",'
    text += ' "nohz_full=1-3"]\n'
    shape = (
        "is not an argument gputuned writes; use key or key=value without spaces, quotes or "
        "semicolons (e.g. 'preempt=full')"
    )
    assert problems(tmp_path, text) == [
        ("bootargs.extra[2]", f"'a b' {shape}"),
        ("bootargs.extra[3]", f"\"x='1'\" {shape}"),
        ("bootargs.extra[4]", f"'k=1;reboot' {shape}"),
        (
            "bootargs.extra[5]",
            "'nohz_full=1-3' sets nohz_full, which has its own key: write bootargs.nohz_full",
        ),
    ]


def test_boot_pcie_aspm_off_conflicts_with_runtime_aspm(tmp_path: Path) -> None:
    text = SETS + '[bootargs]\npcie_aspm = "off"\n[pcie_aspm]\ngpu_links = "disable"\n'
    assert problems(tmp_path, text) == [
        (
            "bootargs.pcie_aspm",
            "'off' leaves ASPM as firmware set it and removes the runtime controls [pcie_aspm] "
            "writes; to boot with ASPM off use extra = ['pcie_aspm.policy=performance'], or set "
            "[pcie_aspm] policy and gpu_links to 'keep'",
        ),
    ]
    load(tmp_path, SETS + '[bootargs]\npcie_aspm = "off"\n[pcie_aspm]\nreport_only = true\n')


# -- collecting everything ---------------------------------------------------------------------


def test_all_field_problems_come_back_at_once(tmp_path: Path) -> None:
    text = SETS + '[pcie_payload]\nmrrs = 100\n[cpusets.x]\ncpus = "a"\ncount = 0\n'
    text += rule("nice = 20")
    assert [key for key, _ in problems(tmp_path, text)] == [
        "cpusets.x.cpus",
        "cpusets.x.count",
        "pcie_payload.mrrs",
        "process[0].nice",
    ]


def test_error_text_has_no_pydantic_noise(tmp_path: Path) -> None:
    path = write(tmp_path, SETS + '[irq]\nspread = "no"\n')
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert str(info.value) == (
        f"{path}: invalid profile; nothing was changed.\n"
        "  irq.spread: expected true or false, got string 'no'"
    )


def test_parse_profile_names_the_source(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as info:
        parse_profile({"name": "t", "irq": {"gpu_cpus": "x"}}, "<socket>")
    assert info.value.source == "<socket>"
    assert info.value.problems == [
        (
            "irq.gpu_cpus",
            f"unknown CPU set 'x'; {NO_SETS.format('x')}; or 'keep', to leave it as it is",
        )
    ]


def test_key_path_quotes_keys_that_are_not_bare() -> None:
    assert key_path(("process", 1, "priority")) == "process[1].priority"
    assert key_path(("cpusets", "a b", "cpus")) == 'cpusets."a b".cpus'
    assert key_path(("bootargs", "extra", 0)) == "bootargs.extra[0]"


@pytest.mark.parametrize("name", ["a\\b", 'say "hi"', "\\", "tab\there", "bell\x07", "del\x7f"])
def test_key_path_quoted_part_reads_back_as_the_same_key(name: str) -> None:
    path = key_path(("cpusets", name, "cpus"))
    assert tomllib.loads(f"{path} = 1") == {"cpusets": {name: {"cpus": 1}}}, path
    assert key_path(("cpusets", "a\\b")) == 'cpusets."a\\\\b"'


def test_profiles_are_frozen(tmp_path: Path) -> None:
    profile = load(tmp_path, SETS)
    with pytest.raises(ValueError, match="frozen"):
        profile.name = "other"  # type: ignore[misc]


def test_no_table_of_a_loaded_profile_can_be_changed_in_place() -> None:
    """The daemon keeps the profile it applied and plans against it again at every event: a
    table changed in place would make it plan something no file says. Every table is frozen,
    as the profile is."""
    from pydantic import BaseModel

    from tests.unit.test_apply import full_profile

    prof = full_profile(bootargs={"extra": ["quiet"]}, neighbours={"weight": 50})
    tables = [
        k for k in Profile.model_fields if k not in ("name", "description", "include", "cpusets")
    ]
    assert tables == TABLE_KEYS
    seen = []
    for t in declared.tables():
        # A table the widest profile leaves out: as its model makes it with its defaults.
        value = getattr(prof, t.key) or t.model.model_construct()
        for table in value if isinstance(value, tuple) else (value,):
            assert isinstance(table, BaseModel), f"[{t.key}] missing from the test's profile"
            field = next(f for f in type(table).model_fields if hasattr(table, f))
            key = t.key
            with pytest.raises(ValueError, match="frozen"):
                setattr(table, field, getattr(table, field))
            seen.append(key)
    assert sorted(set(seen)) == sorted(tables)


# -- reading files -------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["daemon.drift_interval_s", "cpusets.a.count"])
def test_an_integer_longer_than_python_reads_is_an_invalid_profile(
    tmp_path: Path, where: str
) -> None:
    """Issue 30, item 7: 5,000 digits made tomllib's int() raise ValueError past the loader
    (the CLI's internal error, exit 70)."""
    from gputuned.cli.main import main

    table, key = where.rsplit(".", 1)
    path = tmp_path / "big.toml"
    path.write_text(f'name = "x"\n[{table}]\n{key} = {"9" * 5000}\n')
    with pytest.raises(ProfileError) as exc:
        load_profile(path)
    assert exc.value.problems == [
        ("", "a number of more than 4300 digits; no key takes one so long")
    ]
    assert main(["plan", str(path), "--root", str(REPO / "tests/data/hosts/ci-vm")]) == 4


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ProfileError) as info:
        load_profile(missing)
    assert (info.value.source, info.value.problems) == (
        str(missing),
        [("", "cannot read: No such file or directory; check the path")],
    )
    assert problems(tmp_path, 'name = "t"\n[irq\n') == [
        (
            "",
            "TOML syntax error: Expected ']' at the end of a table declaration "
            "(at line 2, column 5)",
        )
    ]
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(ProfileError) as info:
        load_profile(bad)
    assert info.value.problems == [("", "not UTF-8 text (byte 11); save the profile as UTF-8")]


def test_read_user_file_translates_os_errors(tmp_path: Path) -> None:
    assert read_user_file(write(tmp_path, "x = 1\n", "f.toml")) == b"x = 1\n"
    with pytest.raises(ProfileError) as info:
        read_user_file(tmp_path / "missing.toml")
    assert info.value.problems == [("", "cannot read: No such file or directory; check the path")]


def test_read_user_file_reads_regular_files_only(tmp_path: Path) -> None:
    """The daemon reads what a control client names, as root: nothing but a regular file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # would block an open() for reading until a writer came
    link = tmp_path / "link.toml"
    link.symlink_to(write(tmp_path, "x = 1\n", "f.toml"))
    assert read_user_file(link) == b"x = 1\n"  # a link to a regular file is that file
    for path, kind in (
        (tmp_path, "a directory"),
        (fifo, "a FIFO"),
        (Path("/dev/null"), "a character device"),
    ):
        with pytest.raises(ProfileError) as info:
            read_user_file(path)
        want = f"refused: not a regular file ({kind}); name a profile file"
        assert info.value.problems == [("", want)], path
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (MAX_USER_FILE + 1))
    with pytest.raises(ProfileError, match="larger than 1 MiB"):
        read_user_file(big)
    big.write_bytes(b"#" * MAX_USER_FILE)
    assert len(read_user_file(big)) == MAX_USER_FILE
    # A NUL in a path: Python raises ValueError, worded "embedded null byte" (3.11) or
    # "embedded null character in path" (3.13); gputuned says it in its own words.
    with pytest.raises(ProfileError, match="the path holds a NUL byte"):
        read_user_file(f"{tmp_path}/a\0b.toml")


# -- includes ------------------------------------------------------------------------------------


def test_include_merges_tables_and_replaces_sets_and_arrays(tmp_path: Path) -> None:
    write(
        tmp_path,
        SETS
        + 'count = 2\n[irq]\ngpu_cpus = "inference"\nothers_cpus = "housekeeping"\n'
        + rule("nice = -5", "a")
        + rule("nice = -1", "b"),
        "base.toml",
    )
    top = 'include = ["base.toml"]\nname = "top"\n[cpusets.inference]\ngpu_local = 0\n'
    top += '[irq]\nothers_cpus = "keep"\n' + rule("nice = -10", "c")
    profile = load(tmp_path, top)
    assert profile.name == "top"
    assert profile.include == ("base.toml",)
    assert profile.cpusets["housekeeping"].cpus == "0"
    # replaced whole: no cpus (that would be a second base) and no count
    assert profile.cpusets["inference"].gpu_local == 0
    assert profile.cpusets["inference"].cpus is None
    assert profile.cpusets["inference"].count is None
    assert profile.irq is not None
    assert (profile.irq.gpu_cpus, profile.irq.others_cpus) == ("inference", "keep")
    assert [(r.name, r.nice) for r in profile.process] == [("c", -10)]


def test_includes_apply_in_order_relative_to_the_including_file(tmp_path: Path) -> None:
    write(tmp_path, 'name = "one"\ndescription = "first"\n[irq]\nspread = false\n', "sub/one.toml")
    write(tmp_path, 'include = ["one.toml"]\ndescription = "second"\n', "sub/two.toml")
    write(tmp_path, '[irq]\nirqbalance = "report"\n', "sub/three.toml")
    profile = load(tmp_path, 'include = ["sub/two.toml", "sub/three.toml"]\n')
    assert (profile.name, profile.description) == ("one", "second")
    assert profile.irq is not None
    assert (profile.irq.spread, profile.irq.irqbalance) == (False, "report")


def test_include_cycle_shows_the_chain(tmp_path: Path) -> None:
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    write(tmp_path, 'name = "a"\ninclude = ["b.toml"]\n', "a.toml")
    write(tmp_path, 'include = ["a.toml"]\n', "b.toml")
    with pytest.raises(ProfileError) as info:
        load_profile(a)
    assert (info.value.source, info.value.problems) == (
        str(b),
        [("include[0]", f"include cycle: {a} -> {b} -> {a}; remove one of these")],
    )


def test_include_of_itself(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "a"\ninclude = ["./a.toml"]\n', "a.toml")
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert info.value.problems == [
        ("include[0]", f"include cycle: {path} -> {tmp_path / 'a.toml'}; remove one of these")
    ]


def test_diamond_includes_are_not_a_cycle(tmp_path: Path) -> None:
    write(tmp_path, 'name = "d"\n', "d.toml")
    write(tmp_path, 'include = ["d.toml"]\n', "b.toml")
    write(tmp_path, 'include = ["d.toml"]\n', "c.toml")
    assert load(tmp_path, 'include = ["b.toml", "c.toml"]\n').name == "d"


def test_missing_or_malformed_include(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "a"\ninclude = ["nope.toml"]\n')
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert (info.value.source, info.value.problems) == (
        str(path),
        [
            (
                "include[0]",
                f"{tmp_path / 'nope.toml'}: cannot read: No such file or directory; check the path",
            )
        ],
    )
    assert problems(tmp_path, 'name = "a"\ninclude = "base.toml"\n') == [
        ("include", "expected an array of file names, e.g. ['shared-host.toml']")
    ]


# -- shipped profiles --------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load(name: str) -> None:
    profile = load_profile(PROFILES / f"{name}.toml")
    assert profile.name == name
    assert profile.description


def test_shipped_profiles_say_what_they_promise() -> None:
    shared, dedicated, latency = (load_profile(PROFILES / f"{n}.toml") for n in SHIPPED)
    assert shared.bootargs is None
    assert shared.cpuset is not None and shared.cpuset.mode == "root"
    assert [(r.nice, r.policy, r.cpus, r.move_to_partition) for r in shared.process] == [
        (-10, "other", "inference", True),
        (-10, "other", "inference", True),
    ]
    # Who may have it: an account or a system unit, never a command line alone (issue 13).
    for prof in (shared, dedicated, latency):
        assert [(r.match.user, r.match.unit, r.children) for r in prof.process] == [
            ("inference", None, "follow"),
            (None, "inference.service", "follow"),
        ]
        assert len({r.match.cmdline for r in prof.process}) == 1
    assert dedicated.cpuset is not None and dedicated.cpuset.mode == "isolated"
    assert dedicated.process[0].spread_threads
    assert dedicated.bootargs is not None and dedicated.bootargs.irqaffinity == "housekeeping"
    assert latency.bootargs is not None
    assert (latency.bootargs.nohz_full, latency.bootargs.rcu_nocbs) == ("inference", "inference")
    assert latency.bootargs.irqaffinity == "housekeeping"  # merged from dedicated
    assert latency.pcie_aspm is not None and latency.pcie_aspm.gpu_links == "disable"
    payload = latency.pcie_payload
    assert payload is not None
    assert (payload.mps, payload.mrrs, payload.allow_mps_change) == ("max-safe", 4096, False)


@pytest.mark.parametrize(
    ("cmdline", "matches"),
    [
        ("/usr/bin/python3 /usr/local/bin/vllm serve Qwen/Qwen2-0.5B", True),
        ("python3 -m sglang.launch_server --model-path m", True),
        ("/usr/bin/python3 /usr/local/bin/text-generation-server serve m", True),
        ("/opt/conda/bin/python3.11 -u /usr/local/bin/torchrun --nproc-per-node 8 serve.py", True),
        (
            "/usr/bin/python3 /usr/bin/gputuned --profile /etc/gputuned/dedicated-inference.toml",
            False,
        ),
        ("vim vllm.py", False),
        ("python3 -m pytest tests/test_vllm.py", False),
        # Interpreter options with arguments (issue 13).
        ("python3 -X faulthandler -m sglang.launch_server --model-path m", True),
        ("python3 -W ignore -m vllm.entrypoints.openai.api_server --model m", True),
        ("/usr/bin/python3.11 -u -Wignore -X dev -m vllm.entrypoints.openai.api_server", True),
        # A spawned child before setproctitle renames it: only its tree finds it.
        (
            "python3 -c from multiprocessing.spawn import spawn_main; "
            "spawn_main(tracker_fd=5, pipe_handle=7) --multiprocessing-fork",
            False,
        ),
        ("python3 -c import vllm", False),
    ],
)
def test_shipped_server_rule_matches_servers_but_not_gputuned(cmdline: str, matches: bool) -> None:
    for name in SHIPPED:
        for rule in load_profile(PROFILES / f"{name}.toml").process:
            pattern = rule.match.cmdline
            assert pattern is not None
            assert bool(re.search(pattern, cmdline)) is matches


# -- schema and docs -----------------------------------------------------------------------------


def test_schema_is_json_with_every_table() -> None:
    schema = json.loads(json.dumps(profile_schema()))
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["name"]
    assert list(schema["properties"]) == ["name", "description", "include", "cpusets", *TABLE_KEYS]
    configs = {"".join(w.capitalize() for w in k.split("_")) + "Config" for k in TABLE_KEYS}
    assert set(schema["$defs"]) == configs | {"CpuSetSpec", "Exclude", "Match"}
    assert {"IrqConfig", "PcieAspmConfig", "ProcessConfig"} <= configs
    # The tables of the first release keep their order (the manual's and the schema's); a table
    # added later goes where its declaration says.
    first = ["pcie_aspm", "pcie_payload", "irq", "cpuset", "process", "bootargs", "neighbours"]
    assert [k for k in TABLE_KEYS if k in first] == first and TABLE_KEYS[-1] == "daemon"
    refs = re.findall(r'"\$ref": "#/\$defs/([^"]+)"', json.dumps(schema))
    assert set(refs) <= set(schema["$defs"])
    assert schema["$defs"]["PciePayloadConfig"]["properties"]["mrrs"]["enum"] == [
        "keep",
        128,
        256,
        512,
        1024,
        2048,
        4096,
    ]


def test_every_field_has_a_description() -> None:
    schema = profile_schema()
    for name, definition in [("Profile", schema), *schema["$defs"].items()]:
        for key, prop in definition["properties"].items():
            assert prop.get("description"), f"{name}.{key} has no description"


def test_docs_are_generated_from_the_models() -> None:
    docs = (REPO / "docs" / "profiles.md").read_text()
    assert docs == render_profile_docs(), "docs/profiles.md is stale: run scripts/gen-docs"


def test_docs_print_types_as_a_profile_writes_them() -> None:
    # docs/profiles.md once printed a float key's type as "<class 'float'>" (issue 19).
    docs = render_profile_docs()
    assert "<class" not in docs and "typing." not in docs
    assert "- `drift_interval_s`: number (>= 0.5, <= 3600); default: `10.0`." in docs


def test_a_float_key_of_the_wrong_type_says_a_number_is_expected() -> None:
    with pytest.raises(ProfileError, match=r"drift_interval_s: expected a number, got string"):
        parse_profile({"name": "t", "daemon": {"drift_interval_s": "x"}}, "t")
