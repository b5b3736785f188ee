"""Checks across a profile's tables: set names and references, exclude cycles, process rules
(who may have what they grant), ASPM against boot arguments, partitions and overlaps. Run by
:func:`gputuned.profile.load.parse_profile`, the one way a profile object is made, so every
profile object has passed them."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.profile import tables as declared
from gputuned.profile.cpusets import PARTITION_MODES
from gputuned.profile.messages import Problems, key_path
from gputuned.profile.tables.processmatch import owner_key

if TYPE_CHECKING:
    from gputuned.profile.model import Profile
    from gputuned.profile.tables.process import Config as ProcessConfig

_SET_NAME = re.compile(r"[a-z][a-z0-9_-]*")


def check_profile(p: Profile) -> Problems:
    problems: Problems = []
    names = list(p.cpusets)
    for name in names:
        if name == "keep":
            problems.append(
                ("cpusets.keep", "'keep' is reserved (it means 'leave as is'); choose another name")
            )
        elif not _SET_NAME.fullmatch(name):
            problems.append(
                (
                    key_path(("cpusets", name)),
                    f"{name!r} is not a set name; use lowercase letters, digits, '_' and '-', "
                    "starting with a letter",
                )
            )
    refs = set_refs(p)
    for name, spec in p.cpusets.items():
        refs += [
            (key_path(("cpusets", name, "exclude", i)), ex, False)
            for i, ex in enumerate(spec.exclude)
        ]
    for key, name, keep_ok in refs:
        if name not in p.cpusets:
            problems.append((key, unknown_set(name, names, keep_ok=keep_ok)))
    problems += _exclude_cycles(p)
    problems += _check_process_rules(p)
    problems += _check_aspm_bootargs(p)
    problems += check_partitions(p)
    if not problems:
        problems += overlaps(p, lambda name: static_cpus(p, name))
    return problems


def unknown_set(name: str, names: list[str], *, keep_ok: bool) -> str:
    """The one message for a set name the profile does not define, wherever it is named:
    the closest name, the sets there are, and 'keep' where the key takes it."""
    close = difflib.get_close_matches(name, [*names, *(["keep"] if keep_ok else [])], n=1)
    guess = f"did you mean {close[0]!r}? " if close else ""
    sets = (
        f"the sets are: {', '.join(map(repr, names))}"
        if names
        else f"no set is defined; define it first as [cpusets.{name}]"
    )
    keep = "; or 'keep', to leave it as it is" if keep_ok else ""
    return f"unknown CPU set {name!r}; {guess}{sets}{keep}"


def _exclude_cycles(p: Profile) -> Problems:
    problems: Problems = []
    reported: set[frozenset[str]] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = path[path.index(name) :]
            if frozenset(cycle) not in reported:
                reported.add(frozenset(cycle))
                chain = " -> ".join([*cycle, name])
                key = key_path(("cpusets", cycle[0], "exclude"))
                problems.append((key, f"exclude cycle: {chain}; a set cannot subtract itself"))
            return
        spec = p.cpusets.get(name)
        for ex in spec.exclude if spec else ():
            visit(ex, [*path, name])

    for name in p.cpusets:
        visit(name, [])
    return problems


def _check_process_rules(p: Profile) -> Problems:
    problems: Problems = []
    mode = p.cpuset.mode if p.cpuset else "none"
    part = p.cpuset.cpus if p.cpuset else None
    seen: dict[str, int] = {}
    for i, rule in enumerate(p.process):
        at = f"process[{i}]"
        if rule.name in seen:
            msg = f"{rule.name!r} is already the name of process[{seen[rule.name]}]; rename one"
            problems.append((f"{at}.name", msg))
        seen.setdefault(rule.name, i)
        if rule.move_to_partition and mode not in PARTITION_MODES:
            where = (
                "there is no [cpuset] table" if p.cpuset is None else f"[cpuset] mode is {mode!r}"
            )
            msg = (
                f"there is no partition to move into: {where}; set [cpuset] mode = 'isolated' "
                "or 'root', or move_to_partition = false"
            )
            problems.append((f"{at}.move_to_partition", msg))
        elif rule.move_to_partition and rule.cpus not in ("keep", part):
            msg = (
                f"{rule.cpus!r} is not the partition set {part!r} ([cpuset] cpus), and a process "
                f"moved into the partition can run only on its CPUs; use cpus = {part!r} or "
                "'keep', or move_to_partition = false"
            )
            problems.append((f"{at}.cpus", msg))
        if rule.by_gpu and rule.cpus == "keep":
            msg = "places each process on its GPU's CPUs of a set: give cpus = a [cpusets] name"
            problems.append((f"{at}.by_gpu", msg))
        if rule.by_gpu and rule.spread_threads:
            msg = (
                "spread_threads plans one CPU a thread over one set for the whole tree, and "
                "by_gpu gives each process its own GPU's CPUs: the two are not combined yet; "
                "use [cpuset] mode = 'root' (the scheduler balances inside each partition)"
            )
            problems.append((f"{at}.spread_threads", msg))
        if rule.without_gpu != "tree" and not rule.by_gpu:
            msg = "only has a meaning with by_gpu = true; remove it or set by_gpu"
            problems.append((f"{at}.without_gpu", msg))
        if rule.spread_threads and not (rule.move_to_partition and mode == "isolated"):
            msg = (
                "works only inside an isolated partition: needs move_to_partition = true and "
                "[cpuset] mode = 'isolated'"
            )
            problems.append((f"{at}.spread_threads", msg))
        problems += _check_who(rule, at)
    return problems


def _check_who(rule: ProcessConfig, at: str) -> Problems:
    """A rule that gives something worth having must say who may have it (issue: any local
    user got nice -10 and the server's CPUs by naming a script vllm.py)."""
    problems: Problems = []
    ex = rule.exclude
    if rule.children == "ignore" and (ex.comm or ex.cmdline is not None):
        msg = "has no effect with children = 'ignore' (no child is placed); remove it"
        problems.append((f"{at}.exclude", msg))
    grants = []
    if rule.nice is not None and rule.nice < 0:
        grants.append(f"nice {rule.nice}")
    if rule.policy in ("fifo", "rr"):
        grants.append(f"real-time policy {rule.policy!r}")
    if rule.cpus != "keep":
        grants.append(f"CPUs (set {rule.cpus!r})")
    if rule.move_to_partition:
        grants.append("the partition")
    if not grants or rule.any_user or rule.report_only or owner_key(rule.match):
        return problems
    msg = (
        f"any local user can start a process this rule matches (exe, comm, cmdline and "
        f"uses_gpu are every user's to choose: a script named vllm.py, exec -a), and it grants "
        f"{', '.join(grants)}; add match.user or match.uid (the account the server runs as), "
        "match.unit (its systemd system unit) or a match.cgroup outside /user.slice and the "
        "kubelet's kubepods (any tenant's pod is there), or set any_user = true if every local "
        "user may have it"
    )
    problems.append((f"{at}.match", msg))
    return problems


def _check_aspm_bootargs(p: Profile) -> Problems:
    aspm = p.pcie_aspm
    if not (p.bootargs and p.bootargs.pcie_aspm == "off" and aspm):
        return []
    if aspm.policy == "keep" and aspm.gpu_links == "keep":
        return []
    msg = (
        "'off' leaves ASPM as firmware set it and removes the runtime controls [pcie_aspm] "
        "writes; to boot with ASPM off use extra = ['pcie_aspm.policy=performance'], or set "
        "[pcie_aspm] policy and gpu_links to 'keep'"
    )
    return [("bootargs.pcie_aspm", msg)]


# -- schema and generated docs -----------------------------------------------------------------


# -- where sets are named, and checks that need no host ----------------------------------------


def set_refs(p: Profile) -> list[declared.Ref]:
    """Every place a set is named: (key path, set name, whether 'keep' is allowed there), as
    each table declares them (gputuned/profile/tables/)."""
    refs = [r for t in declared.tables() if (v := t.present(p)) is not None for r in t.refs(v)]
    return [r for r in refs if not (r[2] and r[1] == "keep")]


def check_partitions(p: Profile) -> Problems:
    """Several partitions need a set that has members, and a process rule moving into one
    must choose it by the GPU each process uses (``by_gpu``): a process can be in one cgroup
    only, and without by_gpu there is no single place for it to go.
    """
    cs = p.cpuset
    if cs is None or cs.partitions == "one" or cs.cpus not in p.cpusets:
        return []
    problems: Problems = []
    spec = p.cpusets[cs.cpus]
    if cs.partitions == "gpu" and spec.per != "gpu":
        problems.append(
            (
                "cpuset.partitions",
                f"'gpu' makes one partition per member of a per = 'gpu' set, and set "
                f"{cs.cpus!r} has no per = 'gpu'; give the set per = 'gpu' or use "
                "partitions = 'node' or 'one'",
            )
        )
    for i, rule in enumerate(p.process):
        if rule.move_to_partition and not rule.by_gpu:
            problems.append(
                (
                    f"process[{i}].move_to_partition",
                    f"[cpuset] partitions = {cs.partitions!r} makes several partitions and a "
                    "process can be in only one; set by_gpu = true (each process into the "
                    "partition of the GPU it uses), use partitions = 'one', or "
                    "move_to_partition = false",
                )
            )
    return problems


def overlap_pairs(p: Profile) -> list[tuple[str, str, str, str, str]]:
    """(key, set, other key, other set, why) for sets that must not share CPUs."""
    pairs: list[tuple[str, str, str, str, str]] = []
    if p.cpuset and p.cpuset.mode in PARTITION_MODES and p.cpuset.cpus and p.irq:
        for k in ("others_cpus", "default_affinity"):
            name = getattr(p.irq, k)
            if name != "keep":
                why = "IRQs there would interrupt the partition; use a set outside it"
                pairs.append((f"irq.{k}", name, "cpuset.cpus", p.cpuset.cpus, why))
    if p.bootargs and p.bootargs.irqaffinity:
        for k in ("nohz_full", "rcu_nocbs"):
            name = getattr(p.bootargs, k)
            if name is not None:
                why = f"IRQs must start outside the {k} CPUs; use a set without them"
                pairs.append(
                    ("bootargs.irqaffinity", p.bootargs.irqaffinity, f"bootargs.{k}", name, why)
                )
    return pairs


def overlaps(p: Profile, cpus_of: Callable[[str], frozenset[int] | None]) -> Problems:
    problems: Problems = []
    for key, a, other_key, b, why in overlap_pairs(p):
        if a == b:
            problems.append((key, f"names set {a!r}, the same set as {other_key}; {why}"))
            continue
        cpus_a, cpus_b = cpus_of(a), cpus_of(b)
        if cpus_a is not None and cpus_b is not None and cpus_a & cpus_b:
            msg = (
                f"set {a!r} ({format_cpulist(cpus_a)}) overlaps set {b!r} of {other_key} "
                f"({format_cpulist(cpus_b)}) on CPUs {format_cpulist(cpus_a & cpus_b)}; {why}"
            )
            problems.append((key, msg))
    return problems


def static_cpus(p: Profile, name: str) -> frozenset[int] | None:
    """The set's CPUs where they do not depend on the host: literal cpus all the way down and
    no count or cores (which take whole cores, and cores are the host's). Excluding a literal
    set takes whole cores on the host, so the host's set is never larger than this one."""
    spec = p.cpusets[name]
    if spec.cpus is None or spec.count is not None or spec.cores is not None:
        return None
    cpus = parse_cpulist(spec.cpus)
    for ex in spec.exclude:
        other = static_cpus(p, ex)
        if other is None:
            return None
        cpus -= other
    return cpus
