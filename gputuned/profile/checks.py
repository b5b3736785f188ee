"""Checks across a profile's tables: set names and references, exclude cycles, process rules
(who may have what they grant), ASPM against boot arguments, partitions and overlaps. Run by
:class:`gputuned.profile.model.Profile` itself, so every profile object has passed them."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gputuned.profile.cpusets import PARTITION_MODES as _PARTITION_MODES
from gputuned.profile.cpusets import check_partitions, overlaps, set_refs, static_cpus
from gputuned.profile.messages import Problems, key_path, or_list
from gputuned.tuners import process

if TYPE_CHECKING:
    from gputuned.profile.model import Profile
    from gputuned.tuners.process import Config as ProcessConfig

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
            choices = [*names, "keep"] if keep_ok else names
            hint = f"use {or_list(choices)}" if choices else f"define it first as [cpusets.{name}]"
            problems.append((key, f"unknown CPU set {name!r}; {hint}"))
    problems += _exclude_cycles(p)
    problems += _check_process_rules(p)
    problems += _check_aspm_bootargs(p)
    problems += check_partitions(p)
    if not problems:
        problems += overlaps(p, lambda name: static_cpus(p, name))
    return problems


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
        if rule.move_to_partition and mode not in _PARTITION_MODES:
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
    if not grants or rule.any_user or rule.report_only or process.owner_key(rule.match):
        return problems
    msg = (
        f"any local user can start a process this rule matches (exe, comm, cmdline and "
        f"uses_gpu are every user's to choose: a script named vllm.py, exec -a), and it grants "
        f"{', '.join(grants)}; add match.user or match.uid (the account the server runs as), "
        "match.unit (its systemd system unit) or a match.cgroup outside /user.slice, or set "
        "any_user = true if every local user may have it"
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
