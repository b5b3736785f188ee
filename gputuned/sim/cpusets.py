"""cgroup v2 cpuset partitions as the kernel computes them, in a tree.

The writes of ``cpuset.cpus``, ``cpuset.cpus.exclusive`` and ``cpuset.cpus.partition`` are
checked as kernel/cgroup/cpuset.c checks them, and every derived file (``.effective``,
``.exclusive.effective``, the partition's validity) is recomputed after each
(:func:`recompute`). Not modelled: cpuset changes reaching task affinities (the kernel
re-applies ``cpuset.cpus.effective`` to every task; see :mod:`gputuned.sim.tasks`).
"""

from __future__ import annotations

import errno as E
from dataclasses import dataclass, field

from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.sim.files import TreeFiles, fail

# perr_strings[] of kernel/cgroup/cpuset.c; two changed wording in 6.7 (cpuset.cpus.exclusive).
_PERR = {
    "INVPARENT": "Parent is an invalid partition root",
    "NOTPART": "Parent is not a partition root",
    "NOTEXCL": "Cpu list in cpuset.cpus not exclusive",
    "NOCPUS": "Parent unable to distribute cpu downstream",
}
_PERR_67 = {
    "INVCPUS": ("Invalid cpu list in cpuset.cpus", "Invalid cpu list in cpuset.cpus.exclusive"),
    "CPUSEMPTY": ("cpuset.cpus is empty", "cpuset.cpus and cpuset.cpus.exclusive are empty"),
}


@dataclass
class _Cpuset:
    """One cgroup with the cpuset controller, as its files say before a change."""

    path: str
    cpus: frozenset[int]
    exclusive: frozenset[int]
    want: str  # member | root | isolated (the requested type, valid or not)
    valid_now: bool
    effective_now: frozenset[int]
    xeff_now: frozenset[int]
    tasks: bool
    children: list[_Cpuset] = field(default_factory=list)

    @property
    def user_x(self) -> frozenset[int]:
        """user_xcpus(): the exclusive CPUs if set, else cpuset.cpus."""
        return self.exclusive or self.cpus

    def held(self) -> frozenset[int]:
        """CPUs a valid partition holds from its parent now (its effective_xcpus)."""
        if self.xeff_now:
            return self.xeff_now
        out = set(self.effective_now)
        for c in self.children:
            if c.valid_now:
                out |= c.held()
        return frozenset(out)

    def populated(self) -> bool:
        return self.tasks or any(c.populated() for c in self.children)


def write_cpus(tf: TreeFiles, mount: str, cg: str, text: str) -> None:
    """cpuset.c update_cpumask(): a cpulist within cpu_possible_mask."""
    cpus = _cpuset_list(tf, text)
    # A populated partition cannot lose all its CPUs (seen on the H200 host's 6.18). A member
    # may, on cgroup v2: validate_change() refuses it only on the legacy hierarchy
    # (!is_in_v2_mode()); an empty cpuset.cpus takes the parent's CPUs, which is what systemd
    # writes when a unit's AllowedCPUs= is reset.
    is_partition = (tf.get(f"{cg}/cpuset.cpus.partition") or "member").split()[0] != "member"
    was = parse_cpulist(tf.get(f"{cg}/cpuset.cpus") or "")
    if not cpus and was and is_partition and _busy(tf, cg):
        raise fail(E.ENOSPC, "processes in the cgroup would have no CPU")
    _refuse_empty_root(tf, cg, cpus | parse_cpulist(tf.get(f"{cg}/cpuset.cpus.exclusive") or ""))
    tf.put(f"{cg}/cpuset.cpus", format_cpulist(cpus) + "\n")
    recompute(tf, mount, touched=cg)


def write_exclusive(tf: TreeFiles, mount: str, cg: str, text: str) -> None:
    """cpuset.c update_exclusive_cpumask(): refused (EINVAL) before anything changes.

    Documentation/admin-guide/cgroup-v2.rst, "cpuset.cpus.exclusive" (and validate_change()):
    the CPUs may not overlap a sibling's cpuset.cpus.exclusive or .exclusive.effective (what
    a valid partition holds, even one made with cpuset.cpus alone), nor include all of the
    cpuset.cpus of a sibling without exclusive CPUs of its own (it would be left none).
    Unlike a cpuset.cpus write, which is taken and invalidates the partitions it overlaps.
    """
    cpus = _cpuset_list(tf, text)
    if cpus == parse_cpulist(tf.get(f"{cg}/cpuset.cpus.exclusive") or ""):
        return  # "Nothing to do if the CPUs didn't change"
    parent = cg.rsplit("/", 1)[0]
    for sib in tf.children(parent) if cpus else []:
        if sib == cg:
            continue
        theirs = {
            n: parse_cpulist(tf.get(f"{sib}/{n}") or "")
            for n in ("cpuset.cpus.exclusive", "cpuset.cpus.exclusive.effective")
        }
        for name, held in theirs.items():
            if cpus & held:
                why = f"overlaps {name} of {sib} ({format_cpulist(cpus & held)})"
                raise fail(E.EINVAL, why)
        sib_cpus = parse_cpulist(tf.get(f"{sib}/cpuset.cpus") or "")
        if sib_cpus and sib_cpus <= cpus and not theirs["cpuset.cpus.exclusive"]:
            raise fail(E.EINVAL, f"would leave {sib} none of its cpuset.cpus")
    _refuse_empty_root(tf, cg, cpus | parse_cpulist(tf.get(f"{cg}/cpuset.cpus") or ""))
    tf.put(f"{cg}/cpuset.cpus.exclusive", format_cpulist(cpus) + "\n")
    recompute(tf, mount, touched=cg)


def _refuse_empty_root(tf: TreeFiles, cg: str, user_x: frozenset[int]) -> None:
    # validate_change(): a load-balanced partition must keep room for deadline bandwidth
    # (cpuset_cpumask_can_shrink(); the fair server's share counts): EBUSY when emptied,
    # as the H200 host's 6.18 kernel answered.
    if not user_x and tf.get(f"{cg}/cpuset.cpus.partition") == "root\n":
        raise fail(
            E.EBUSY, "a valid root partition cannot lose all its CPUs; make it a member first"
        )


def write_partition(tf: TreeFiles, mount: str, cg: str, text: str) -> None:
    """cpuset.c cpuset_partition_write(): member, root or isolated; validity is computed."""
    want = text.removesuffix("\n")
    if want not in ("member", "root", "isolated"):
        raise fail(E.EINVAL, "write member, root or isolated")
    recompute(tf, mount, override={cg: want})


def _cpuset_list(tf: TreeFiles, text: str) -> frozenset[int]:
    cpus = tf.parse_cpus(text, as_list=True)
    if not cpus <= tf.possible():
        raise fail(E.EINVAL, "CPUs outside cpu/possible")
    return cpus


def _busy(tf: TreeFiles, cg: str) -> bool:
    return bool(tf.procs(cg)) or any(_busy(tf, k) for k in tf.children(cg))


def recompute(
    tf: TreeFiles,
    mount: str,
    override: dict[str, str] | None = None,
    touched: str | None = None,
) -> None:
    """Recompute the derived cpuset files after a write to ``touched`` (a cgroup).

    ``override`` gives requested partition types that replace what the files say (those
    cgroups count as touched). The root's pool is its effective set plus what valid
    partitions hold now, so a round trip restores every file exactly. Validity follows
    update_prstate(), update_parent_effective_cpumask() and validate_change() of
    kernel/cgroup/cpuset.c, for local partitions only (remote ones are not modelled): a
    partition needs a valid partition (or the root) as parent, CPUs that overlap no sibling
    and lie within the parent's, and must leave a parent with tasks a CPU (the root always
    has tasks). Where the kernel's answer depends on history, the files stand in for it, as
    checked against the 6.18 kernel of the H200 host (tests/integration):

    - an invalid partition is looked at again only when it or an ancestor is written;
    - a valid one that a sibling's new cpuset.cpus overlap turns "root invalid" with no
      reason and keeps its cpuset.cpus.exclusive.effective;
    - partitions valid before the change keep their CPUs before newcomers get any.
    """
    top = _load_cpuset(tf, mount, override or {}, top=True)
    if top is None:
        return
    pool = set(top.effective_now)
    for c in top.children:
        if c.valid_now:
            pool |= c.held()
    pool |= _held_remotely(top)
    new = tf.has_exclusive(mount)
    perr = _PERR | {k: v[1] if new else v[0] for k, v in _PERR_67.items()}
    touch = set(override or {}) | ({touched} if touched else set())
    _settle(tf, top, frozenset(pool), "top", _Pass(perr, touch, remote_ok=new))


def _load_cpuset(tf: TreeFiles, cg: str, override: dict[str, str], *, top: bool) -> _Cpuset | None:
    if tf.get(f"{cg}/cpuset.cpus.effective") is None:
        return None
    part = (tf.get(f"{cg}/cpuset.cpus.partition") or "member").split()
    was = "root" if top else (part[0] if part else "member")
    valid_now = top or (was != "member" and "invalid" not in part)
    cs = _Cpuset(
        path=cg,
        cpus=parse_cpulist(tf.get(f"{cg}/cpuset.cpus") or ""),
        exclusive=parse_cpulist(tf.get(f"{cg}/cpuset.cpus.exclusive") or ""),
        want=override.get(cg, was),
        valid_now=valid_now,
        effective_now=parse_cpulist(tf.get(f"{cg}/cpuset.cpus.effective") or ""),
        xeff_now=parse_cpulist(tf.get(f"{cg}/cpuset.cpus.exclusive.effective") or ""),
        tasks=bool(tf.procs(cg)),
    )
    for kid in tf.children(cg):
        loaded = _load_cpuset(tf, kid, override, top=False)
        if loaded is not None:
            cs.children.append(loaded)
    return cs


def _settle(tf: TreeFiles, cs: _Cpuset, pool: frozenset[int], kind: str, run: _Pass) -> None:
    """Decide ``cs``'s child partitions, then write effective sets down the tree.

    ``kind``: "top", "valid" (a valid partition), "invalid" or "member".
    """
    taken: set[int] = set()
    accepted: list[_Cpuset] = []
    verdict: dict[str, str | None] = {}
    for c in sorted(cs.children, key=lambda c: (not c.valid_now, c.path)):
        if c.want == "member" or not (c.valid_now or run.revisits(c.path)):
            continue  # stale invalid partitions stay as they are
        err = _partition_error(cs, c, kind, pool - taken, accepted, run.revisits(c.path))
        if err is None:
            accepted.append(c)
            taken |= c.user_x
        verdict[c.path] = err
    if kind == "top" and run.remote_ok:
        # Remote partitions take their CPUs from the top, after the local ones.
        run.remote.update(_remotes(cs, frozenset(pool - taken), run.remote_failed))
        taken |= set().union(*run.remote.values())
    effective = pool - taken if kind in ("top", "valid") else pool
    tf.put_cpus(f"{cs.path}/cpuset.cpus.effective", effective)
    for c in cs.children:
        part = f"{c.path}/cpuset.cpus.partition"
        xeff = f"{c.path}/cpuset.cpus.exclusive.effective"
        sub = run.below(c.path)
        if kind == "member" and c.path in run.remote:
            tf.put(part, f"{c.want}\n")
            tf.put_cpus(xeff, run.remote[c.path])
            _settle(tf, c, run.remote[c.path], "valid", sub)
            continue
        if kind == "member" and c.path in run.remote_failed:
            tf.put(part, f"{c.want} invalid ({run.perr['INVCPUS']})\n")
            tf.put_cpus(xeff, frozenset())
            _settle(tf, c, (c.cpus & effective) or effective, "invalid", sub)
            continue
        if c in accepted:
            tf.put(part, f"{c.want}\n")
            tf.put_cpus(xeff, c.user_x)
            _settle(tf, c, c.user_x, "valid", sub)
            continue
        err = verdict.get(c.path, "" if c.want != "member" else None)
        if err is None:  # a member; what it hands down to a remote partition stays its own
            tf.put(part, "member\n")
            handed = set().union(*run.remote.values()) if run.remote else set()
            tf.put_cpus(xeff, c.exclusive & (effective | handed))
        elif err == "SILENT":  # partcmd_invalidate: no reason given, effective_xcpus kept
            tf.put(part, f"{c.want} invalid\n")
        elif err:
            tf.put(part, f"{c.want} invalid ({run.perr[err]})\n")
            tf.put_cpus(xeff, c.exclusive & effective)
        # cgroup v2: an empty or disjoint cpuset.cpus takes the parent's effective CPUs.
        mine = (c.cpus & effective) or effective
        _settle(tf, c, mine, "member" if c.want == "member" else "invalid", sub)


def _partition_error(
    parent: _Cpuset,
    c: _Cpuset,
    kind: str,
    free: frozenset[int],
    accepted: list[_Cpuset],
    revisited: bool,
) -> str | None:
    """The perr_strings key for ``c`` under ``parent`` (None: valid; "SILENT": no reason)."""
    if kind in ("member", "invalid"):
        return "NOTPART" if kind == "member" else "INVPARENT"
    ux = c.user_x
    # validate_change(): an exclusive cpuset may not overlap a sibling. A partition that was
    # valid already only yields to members and to partitions accepted before it.
    overlap = any(
        s is not c and s.user_x & ux and (s.want == "member" or s in accepted or not c.valid_now)
        for s in parent.children
    )
    busy = parent.tasks or any(
        s.populated() for s in parent.children if s is not c and s not in accepted
    )
    failed = {
        "NOTEXCL": overlap,
        "CPUSEMPTY": not ux,
        "INVCPUS": bool(ux) and not ux <= free,
        "NOCPUS": bool(ux) and not free - ux and (kind == "top" or busy),
    }
    if c.valid_now and not revisited:
        return "SILENT" if overlap else None  # a sibling's write invalidated it
    # update_prstate() checks exclusivity first; a valid partition's own cpumask update
    # (update_cpumask()) reports it last.
    order = ("CPUSEMPTY", "INVCPUS", "NOCPUS", "NOTEXCL")
    if not c.valid_now:
        order = ("NOTEXCL", "CPUSEMPTY", "INVCPUS", "NOCPUS")
    return next((k for k in order if failed[k]), None)


def _held_remotely(top: _Cpuset) -> set[int]:
    """CPUs valid remote partitions hold now (below members of the top)."""
    out: set[int] = set()
    todo = [c for c in top.children if c.want == "member" and not c.valid_now]
    while todo:
        cs = todo.pop()
        for c in cs.children:
            if c.valid_now:
                out |= c.held()
            else:
                todo.append(c)
    return out


def _remotes(top: _Cpuset, free: frozenset[int], failed: set[str]) -> dict[str, frozenset[int]]:
    """Remote partitions (Linux 6.7+, cgroup-v2.rst "cpuset.cpus.partition"): a partition
    whose parent is not a partition root. Valid when every ancestor below the top is a member
    whose cpuset.cpus.exclusive holds the partition's (they were written down the hierarchy
    first), its exclusive CPUs are free at the top (no other partition holds them) and leave
    the top a CPU (remote_partition_enable() of kernel/cgroup/cpuset.c). Simplified: looked at
    on every recompute, and refused with "Invalid cpu list in cpuset.cpus.exclusive" whatever
    the reason."""
    out: dict[str, frozenset[int]] = {}
    used: set[int] = set()

    def walk(cs: _Cpuset, chain: list[frozenset[int]]) -> None:
        for c in cs.children:
            if c.want == "member":
                walk(c, [*chain, c.exclusive])
                continue
            if not chain:
                continue  # a local partition of the top: _settle's
            x = c.exclusive
            ok = bool(x) and all(x <= a for a in chain) and x <= free and not x & used
            ok = ok and bool(free - used - x)
            if ok:
                out[c.path] = x
                used.update(x)
            else:
                failed.add(c.path)

    walk(top, [])
    return out


@dataclass(frozen=True)
class _Pass:
    """One recompute: the reason strings, the cgroups written, whether we are below one, and
    the remote partitions found at the top (valid ones with their CPUs, and refused ones)."""

    perr: dict[str, str]
    touched: set[str]
    under: bool = False
    remote_ok: bool = False
    remote: dict[str, frozenset[int]] = field(default_factory=dict)
    remote_failed: set[str] = field(default_factory=set)

    def revisits(self, path: str) -> bool:
        return self.under or path in self.touched

    def below(self, path: str) -> _Pass:
        if not self.revisits(path):
            return self
        return _Pass(self.perr, self.touched, True, self.remote_ok, self.remote, self.remote_failed)
