"""The `match` and `exclude` tables of a `[[process]]` rule (gputuned/profile/tables/process.py
declares the rule; its manual says what each key means), and which of their keys only the
host's administrator can satisfy (:func:`owner_key`)."""

from __future__ import annotations

import re

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from gputuned.profile.patterns import check_pattern

#: TASK_COMM_LEN is 16 bytes including the NUL (include/linux/sched.h).
COMM_MAX = 15


#: systemd's unit name characters (src/basic/unit-name.c VALID_CHARS), '@' for instances.
_UNIT_STEM = re.compile(r"[A-Za-z0-9:_.\\@-]+")


#: useradd(8)'s default NAME_REGEX, with '.' (common) and at most 32 characters.
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


class Match(BaseModel):
    """The `match` table of a `[[process]]` rule: which processes the rule applies to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exe: StrictStr | None = Field(
        default=None, description="Exact path of the executable (/proc/PID/exe)."
    )
    comm: StrictStr | None = Field(
        default=None, description="Exact command name (/proc/PID/comm), at most 15 characters."
    )
    cmdline: StrictStr | None = Field(
        default=None,
        description=(
            "Python regex searched in the first 4096 bytes of the command line (arguments "
            "joined by spaces); no unbounded repetition inside another (write '(?:...)*+')."
        ),
    )
    user: StrictStr | None = Field(
        default=None,
        description=(
            "Account the process runs as (real and effective user ID), by name. An account "
            "this host does not have matches nothing (a note in the plan)."
        ),
    )
    uid: StrictInt | None = Field(
        default=None, ge=0, description="Account the process runs as, by user ID."
    )
    unit: StrictStr | None = Field(
        default=None,
        description=(
            "systemd system unit (ending in .service or .scope) the process runs in, exactly; "
            "units under user.slice never match."
        ),
    )
    cgroup: StrictStr | None = Field(
        default=None,
        description="Prefix of the cgroup v2 path as /proc/PID/cgroup shows it, starting with '/'.",
    )
    uses_gpu: StrictInt | None = Field(
        default=None,
        ge=0,
        description=(
            "Index of a GPU the process uses (NVML, its open /dev/nvidiaN, or its "
            "CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES)."
        ),
    )

    @field_validator("exe")
    @classmethod
    def _absolute_exe(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith("/"):
            raise ValueError(
                f"{value!r} is not an absolute path; give the executable's full path as "
                "/proc/PID/exe shows it (e.g. '/usr/bin/python3.11')"
            )
        return value

    @field_validator("comm")
    @classmethod
    def _short_comm(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must not be empty; give the command name as /proc/PID/comm shows it")
        if len(value) > COMM_MAX:
            raise ValueError(
                f"{value!r} is {len(value)} characters; the kernel keeps only the first 15 "
                f"(TASK_COMM_LEN), so write {value[:COMM_MAX]!r}"
            )
        return value

    @field_validator("cmdline")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(
                f"{value!r} is not a valid Python regular expression ({exc}); "
                "escape literal characters such as ( [ . * + ? with a backslash"
            ) from None
        check_pattern(value)  # searched in other users' command lines: no exponential ones
        return value

    @field_validator("unit")
    @classmethod
    def _unit_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        stem, dot, suffix = value.rpartition(".")
        if not (dot and _UNIT_STEM.fullmatch(stem) and suffix in ("service", "scope")):
            raise ValueError(
                f"{value!r} is not a systemd unit name; write one ending in '.service' or "
                "'.scope' (e.g. 'vllm.service')"
            )
        if stem.startswith("user@"):
            raise ValueError(
                f"{value!r} is a user's service manager: every process that user starts runs "
                "under it; name the server's own system unit (e.g. 'vllm.service')"
            )
        return value

    @field_validator("user")
    @classmethod
    def _user_name(cls, value: str | None) -> str | None:
        if value is not None and not _USER_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not an account name (letters, digits, '_', '-', '.', at most 32 "
                "characters, not starting with '-'); or give match.uid"
            )
        return value

    @field_validator("cgroup")
    @classmethod
    def _cgroup_path(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith("/"):
            raise ValueError(
                f"{value!r} is not a cgroup path; write it as /proc/PID/cgroup shows it, "
                "starting with '/' (e.g. '/system.slice/vllm.service')"
            )
        return value

    @model_validator(mode="after")
    def _something(self) -> Match:
        if all(getattr(self, k) is None for k in type(self).model_fields):
            raise ValueError(
                "give at least one of user, uid, unit, cgroup, exe, comm, cmdline or uses_gpu; "
                "a rule without one would match every process"
            )
        if self.user is not None and self.uid is not None:
            raise ValueError("give user or uid, not both")
        return self


class Exclude(BaseModel):
    """The `exclude` table of a `[[process]]` rule: descendants the rule leaves out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    comm: tuple[StrictStr, ...] = Field(
        default=(), description="Exact command names (/proc/PID/comm) of helpers to leave out."
    )
    cmdline: StrictStr | None = Field(
        default=None,
        description=(
            "Python regex searched in a descendant's command line; a match leaves it out "
            "(e.g. 'multiprocessing\\.resource_tracker')."
        ),
    )

    @field_validator("cmdline")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        return Match._compiles(value)  # the same checks as match.cmdline

    @field_validator("comm")
    @classmethod
    def _short(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            Match._short_comm(name)
        return value


def owner_key(match: Match) -> str | None:
    """The key of ``match`` that only the host's administrator can satisfy, or None.

    ``user``/``uid``: a process runs as an account only if that account started it (or root).
    ``unit``: only the system manager creates system units. ``cgroup`` outside ``user.slice``
    and the kubelet's pods: only root creates cgroups there (users' delegated subtrees are
    under user.slice; the kubelet makes a cgroup under ``kubepods*`` for every pod of every
    namespace, whoever made the pod: issue 30). ``exe``, ``comm``, ``cmdline`` and
    ``uses_gpu`` are every user's to choose: a script named vllm.py, ``exec -a``, a copy of
    the interpreter.
    """
    if match.user is not None:
        return "user"
    if match.uid is not None:
        return "uid"
    if match.unit is not None:
        return "unit"
    if match.cgroup is not None:
        parts = [p for p in match.cgroup.split("/") if p]
        if parts and parts[0] != "user.slice" and not any(map(_tenants, parts)):
            return "cgroup"
    return None


def _tenants(part: str) -> bool:
    """A cgroup the kubelet makes for pods, any tenant's: ``kubepods.slice`` and its
    ``kubepods-burstable.slice`` (systemd driver), ``kubepods`` (cgroupfs driver),
    ``kubelet-kubepods.slice`` under a cgroup root of the kubelet's own (``--cgroup-root``)."""
    return "kubepods" in part
