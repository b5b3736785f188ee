"""[neighbours]: cpu.weight and cpu.max of everything that is not the server, planned, applied,
read back and reverted exactly; through systemd's unit properties where systemd is PID 1.

On copies of the H200 tree (cgroup v2, cpu and cpuset enabled at the root) with the cgroups a
shared host has: user.slice with a user's session, system.slice with services, and processes in
the root cgroup itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.engine.apply import apply_profile, revert_all
from gputuned.engine.opcheck import refusal
from gputuned.engine.plan import PlanResult, plan_profile
from gputuned.kernel import units
from gputuned.profile.load import parse_profile
from gputuned.profile.model import Profile
from gputuned.settings.base import Op
from gputuned.sim.model import TreeModel
from tests.fakeproc import add_process
from tests.faults import tree_kernel
from tests.unit.test_apply import SERVER_PID, SERVER_USER, digest, tree_copy

CG = "/sys/fs/cgroup"
BUSY_PID = 5151  # a neighbour's burner in a user's session
CRON_PID = 6161
ROOT_PIDS = (1, 2, 300)  # init, kthreadd, a daemon started at boot: in the root cgroup


def add_server(root: Path, cgroup: str) -> None:
    """A vLLM-like server (as tests/unit/test_apply.py's tree_copy makes it) in ``cgroup``."""
    cpus = (root / "sys/devices/system/cpu/online").read_text().strip()
    add_process(
        root,
        SERVER_PID,
        comm="python3",
        cmdline=["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"],
        exe="/usr/bin/python3.11",
        start_time=123456,
        cgroup=cgroup,
        cpus=cpus,
        uid=990,
    )


def add_burner(root: Path) -> None:
    """A neighbour's burner in a user's session."""
    add_process(
        root,
        BUSY_PID,
        comm="burn",
        cmdline=["/usr/bin/burn"],
        exe="/usr/bin/burn",
        start_time=5000,
        cgroup="/user.slice/user-1000.slice/session-7.scope",
        uid=1000,
    )


def host(tmp_path: Path, *, systemd: bool = False, server_unit: bool = False) -> Path:
    """The H200 tree with neighbours: a user's burner in user.slice, cron in system.slice,
    three processes in the root cgroup (one a kernel thread); the server in a user's session,
    or (``server_unit``) in system.slice/inference.service."""
    root = tree_copy("h200-vm", tmp_path, server=not server_unit)
    add_burner(root)
    add_process(
        root,
        CRON_PID,
        comm="cron",
        cmdline=["/usr/sbin/cron", "-f"],
        exe="/usr/sbin/cron",
        start_time=400,
        cgroup="/system.slice/cron.service",
    )
    for pid in ROOT_PIDS:
        add_process(
            root,
            pid,
            comm=f"p{pid}",
            cmdline=[] if pid == 2 else [f"/sbin/p{pid}"],
            exe=None if pid == 2 else f"/sbin/p{pid}",
            start_time=pid,
            cgroup="/",
        )
    kthread = root / "proc/2/stat"  # PF_KTHREAD (0x00200000) in the flags, field 9
    fields = kthread.read_text().split(" ")
    fields[8] = str(int(fields[8]) | 0x00200000)
    kthread.write_text(" ".join(fields))
    if server_unit:
        add_server(root, "/system.slice/inference.service")
    if systemd:
        (root / "run/systemd/system").mkdir(parents=True)
    return root


def profile(neighbours: dict[str, Any] | None, *, move: bool = True, **top: Any) -> Profile:
    data: dict[str, Any] = {
        "name": "nb",
        "cpusets": {
            "inference": {"cpus": "8-15"},
            "others": {"all": True, "exclude": ["inference"]},
        },
        "cpuset": {"mode": "root" if move else "none", "cpus": "inference"},
        "process": [
            {
                "name": "server",
                "match": {"cmdline": "vllm", "user": SERVER_USER},
                "cpus": "inference",
                "nice": -10,
                "move_to_partition": move,
            }
        ],
        **top,
    }
    if neighbours is not None:
        data["neighbours"] = neighbours
    return parse_profile(data, "test")


def mine(plan: PlanResult) -> dict[str, str]:
    """The neighbours' changes: target -> wanted."""
    return {
        c.target: c.wanted
        for c in plan.settings
        if c.tuner == "neighbours" and c.kind != "controller"
    }


def test_absent_table_changes_nothing(tmp_path: Path) -> None:
    plan = plan_profile(tree_kernel(host(tmp_path)), profile(None))
    assert mine(plan) == {}
    assert not [n for n in plan.notes if "neighbours" in n]


def test_caps_and_weights_the_other_top_level_cgroups_and_reverts_exactly(
    tmp_path: Path,
) -> None:
    root = host(tmp_path)
    before = digest(root)
    kernel = tree_kernel(root)
    prof = profile({"cap_cpus": 4, "weight": 50})
    plan = plan_profile(kernel, prof)
    # The server moves into gputuned's partition: its session's slice is a neighbour now.
    assert mine(plan) == {
        "/system.slice cpu.max": "400000 100000",
        "/system.slice cpu.weight": "50",
        "/user.slice cpu.max": "400000 100000",
        "/user.slice cpu.weight": "50",
    }
    (root_note,) = [n for n in plan.notes if "root cgroup itself" in n]
    assert "3 process(es)" in root_note and "1 of them kernel threads" in root_note
    _plan, report = apply_profile(kernel, prof)
    assert not report.failed
    assert (root / "sys/fs/cgroup/user.slice/cpu.max").read_text() == "400000 100000\n"
    assert (root / "sys/fs/cgroup/system.slice/cpu.weight").read_text() == "50\n"
    assert (root / "sys/fs/cgroup/gputuned.inference/cpu.max").read_text() == "max 100000\n"
    again = plan_profile(kernel, prof)
    assert not [c for c in again.changes if c.tuner == "neighbours"]  # read back: in sync
    revert = revert_all(kernel)
    assert not revert.failed
    assert digest(root) == before


def test_the_servers_ancestors_are_walked_through_not_capped(tmp_path: Path) -> None:
    root = host(tmp_path, server_unit=True)
    TreeModel(root).mkdir(f"{CG}/machine.slice")
    plan = plan_profile(tree_kernel(root), profile({"cap_cpus": 2}, move=False))
    # system.slice holds the server: its other children are capped instead.
    assert mine(plan) == {
        "/machine.slice cpu.max": "200000 100000",
        "/user.slice cpu.max": "200000 100000",
        "/system.slice/cron.service cpu.max": "200000 100000",
    }
    assert any("cpu controller is not enabled in /system.slice" in n for n in plan.notes)
    controller = [c for c in plan.settings if c.kind == "controller" and c.tuner == "neighbours"]
    assert [c.path for c in controller] == [f"{CG}/system.slice/cgroup.subtree_control"]


def test_controller_enabled_where_off_and_disabled_on_revert(tmp_path: Path) -> None:
    root = host(tmp_path, server_unit=True)
    before = digest(root)
    kernel = tree_kernel(root)
    prof = profile({"cap_cpus": 2}, move=False)
    _plan, report = apply_profile(kernel, prof)
    assert not report.failed
    sub = root / "sys/fs/cgroup/system.slice/cgroup.subtree_control"
    assert sub.read_text().split() == ["cpu"]
    assert (root / "sys/fs/cgroup/system.slice/cron.service/cpu.max").read_text() == (
        "200000 100000\n"
    )
    assert not revert_all(kernel).failed
    assert digest(root) == before


def test_a_parent_with_processes_of_its_own_cannot_enable_the_controller(tmp_path: Path) -> None:
    root = host(tmp_path, server_unit=True)
    add_process(
        root,
        7171,
        comm="stray",
        cmdline=["/stray"],
        exe="/stray",
        start_time=7,
        cgroup="/system.slice",
    )
    plan = plan_profile(tree_kernel(root), profile({"weight": 10}, move=False))
    (ref,) = [r for r in plan.refused if r.tuner == "neighbours"]
    assert ref.target == "/system.slice/cron.service"
    assert "no internal processes" in ref.reason
    assert any("1 process(es) run in /system.slice itself" in n for n in plan.notes)
    assert "/system.slice/cron.service cpu.weight" not in mine(plan)


def test_keep_and_gputuneds_own_unit_are_left_alone(tmp_path: Path) -> None:
    root = host(tmp_path)
    model = TreeModel(root)
    model.mkdir(f"{CG}/init.scope")
    model.mkdir(f"{CG}/backup")
    model.mkdir(f"{CG}/batch")
    plan = plan_profile(tree_kernel(root), profile({"weight": 20, "keep": ["backup"]}))
    assert "/backup cpu.weight" not in mine(plan)
    assert "/init.scope cpu.weight" not in mine(plan)  # PID 1: never
    assert "/batch cpu.weight" in mine(plan)
    assert "/user.slice cpu.weight" in mine(plan)


def test_systemd_units_are_changed_through_their_properties(tmp_path: Path) -> None:
    root = host(tmp_path, systemd=True)
    kernel = tree_kernel(root)
    cg = root / "sys/fs/cgroup"
    before_files = {p: p.read_bytes() for p in cg.rglob("cpu.*")}
    prof = profile({"cap_cpus": "others", "weight": 50})  # 'others': 8 CPUs on this host
    plan = plan_profile(kernel, prof)
    assert mine(plan) == {
        "system.slice CPUQuota": "800%",
        "system.slice CPUWeight": "50",
        "user.slice CPUQuota": "800%",
        "user.slice CPUWeight": "50",
    }
    _plan, report = apply_profile(kernel, prof)
    assert not report.failed
    dropin = root / "run/systemd/system.control/user.slice.d/50-CPUQuota.conf"
    assert "[Slice]\nCPUQuota=800%\n" in dropin.read_text()
    assert (cg / "user.slice/cpu.max").read_text() == "800000 100000\n"
    assert kernel.unit_property("user.slice", "CPUWeight") == "50"
    assert not revert_all(kernel).failed
    # systemd's view is back to its default, the cgroup files as they were; the runtime
    # drop-in stays with the empty assignment (what systemctl set-property leaves).
    assert kernel.unit_property("user.slice", "CPUQuota") == ""
    assert dropin.read_text().endswith("CPUQuota=\n")
    assert {p: p.read_bytes() for p in cg.rglob("cpu.*")} == before_files


def test_report_only_writes_nothing(tmp_path: Path) -> None:
    root = host(tmp_path)
    before = digest(root)
    prof = profile({"cap_cpus": 2, "report_only": True})
    kernel = tree_kernel(root)
    plan = plan_profile(kernel, prof)
    assert mine(plan) and all(c.report_only for c in plan.settings if c.tuner == "neighbours")
    apply_profile(kernel, prof)
    revert_all(kernel)
    assert digest(root) == before


def test_a_neighbour_that_went_away_is_not_a_revert_failure(tmp_path: Path) -> None:
    root = host(tmp_path)
    kernel = tree_kernel(root)
    apply_profile(kernel, profile({"cap_cpus": 3}))
    # The user logged out: systemd removed the session and the user's slice.
    model = TreeModel(root)
    for pid in (BUSY_PID,):
        (root / f"proc/{pid}").rename(root / f"gone-{pid}")
    for cg in ("user.slice/user-1000.slice/session-7.scope", "user.slice/user-1000.slice"):
        (root / f"sys/fs/cgroup/{cg}/cgroup.procs").write_text("")
        model.rmdir(f"{CG}/{cg}")
    report = revert_all(kernel)
    assert not report.failed


def test_hybrid_host_refuses_with_the_reason(tmp_path: Path) -> None:
    root = tree_copy("ci-vm", tmp_path)
    plan = plan_profile(
        tree_kernel(root),
        profile(
            {"cap_cpus": 1},
            move=False,
            cpusets={"inference": {"cpus": "1"}, "others": {"cpus": "0"}},
        ),
    )
    (ref,) = [r for r in plan.refused if r.tuner == "neighbours"]
    assert "cgroup hybrid host" in ref.reason or "cgroup v1 host" in ref.reason
    assert mine(plan) == {}


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({}, "neighbours"),
        ({"cap_cpus": 0}, "neighbours"),
        ({"weight": 0}, "neighbours.weight"),
        ({"weight": 10001}, "neighbours.weight"),
        ({"cap_cpus": "nosuchset"}, "neighbours.cap_cpus"),
        ({"weight": 5, "keep": ["../etc"]}, "neighbours"),
        ({"weight": 5, "nice": 3}, "neighbours.nice"),
    ],
)
def test_bad_tables_are_refused_naming_the_key(table: dict[str, Any], key: str) -> None:
    with pytest.raises(errors.ProfileError) as exc:
        profile(table)
    assert any(k == key or k.startswith(key) for k, _ in exc.value.problems), exc.value.problems


@pytest.mark.parametrize("value", [{"a": 1}, [1]])
def test_a_wrong_type_for_cap_cpus_is_one_problem_naming_the_key(value: object) -> None:
    """cap_cpus is a number or a set's name: pydantic tries both and names the members it
    tried (cap_cpus.float, cap_cpus.str), keys no profile has (found by the fuzzer)."""
    with pytest.raises(errors.ProfileError) as exc:
        profile({"cap_cpus": value})
    assert exc.value.problems == [
        (
            "neighbours.cap_cpus",
            f"expected a number or a string, got {'table' if isinstance(value, dict) else 'array'} {value!r}",
        )
    ]


@pytest.mark.parametrize(
    ("shown", "name", "form"),
    [
        ("infinity", "CPUQuota", ""),
        ("4s", "CPUQuota", "400%"),
        ("400ms", "CPUQuota", "40%"),
        ("1s 500ms", "CPUQuota", "150%"),
        ("[not set]", "CPUWeight", ""),
        ("18446744073709551615", "CPUWeight", ""),
        ("50", "CPUWeight", "50"),
    ],
)
def test_systemctl_show_values_read_in_assignment_form(shown: str, name: str, form: str) -> None:
    assert units.show_form(name, shown) == form


@pytest.mark.parametrize(
    ("kind", "path", "value", "data"),
    [
        ("cgroup_cpu", "/etc/passwd", "50", {}),
        ("cgroup_cpu", f"{CG}/user.slice/cpu.max", "400000 100000; rm", {}),
        ("cgroup_cpu", f"{CG}/user.slice/cgroup.procs", "1", {}),
        ("unit_cpu", "user.slice; reboot", "50", {"property": "CPUWeight", "cgroup": CG}),
        ("unit_cpu", "user.slice", "50", {"property": "ExecStart", "cgroup": CG}),
        ("unit_cpu", "user.slice", "-1", {"property": "CPUWeight", "cgroup": CG}),
        ("controller", f"{CG}/cgroup.subtree_control", "present", {"controller": "memory"}),
    ],
)
def test_journal_entries_outside_what_neighbours_write_are_refused(
    kind: str, path: str, value: str, data: dict[str, Any]
) -> None:
    op = Op("k", "neighbours", "t", kind, path, value, data=data)
    assert refusal(op, value) is not None


def test_journal_entries_neighbours_write_are_accepted() -> None:
    ok = [
        Op("k", "n", "t", "cgroup_cpu", f"{CG}/user.slice/cpu.max", "max 100000"),
        Op("k", "n", "t", "cgroup_cpu", f"{CG}/user.slice/cpu.weight", "100"),
        Op(
            "k",
            "n",
            "t",
            "unit_cpu",
            "user.slice",
            "",
            data={"property": "CPUQuota", "cgroup": f"{CG}/user.slice"},
        ),
        Op(
            "k",
            "n",
            "t",
            "controller",
            f"{CG}/cgroup.subtree_control",
            "present",
            data={"controller": "cpu"},
        ),
    ]
    assert [refusal(op, op.value) for op in ok] == [None] * len(ok)


def test_systemd_units_are_read_back_from_their_cgroup_files_not_systemctl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan (and the daemon's drift check, which reads back with the same holds) starts no
    systemctl; apply asks systemd once per property, for the original it journals."""
    from gputuned.sim.tree import SimKernel

    root = host(tmp_path, systemd=True)
    asked: list[tuple[str, str]] = []
    real = SimKernel.unit_property

    def counted(self: SimKernel, unit: str, name: str) -> str:
        asked.append((unit, name))
        return real(self, unit, name)

    monkeypatch.setattr(SimKernel, "unit_property", counted)
    kernel = tree_kernel(root)
    prof = profile({"cap_cpus": 4, "weight": 50})
    plan_profile(kernel, prof)
    assert asked == []
    apply_profile(kernel, prof)
    assert sorted(asked) == [
        ("system.slice", "CPUQuota"),
        ("system.slice", "CPUWeight"),
        ("user.slice", "CPUQuota"),
        ("user.slice", "CPUWeight"),
    ]
    asked.clear()
    again = plan_profile(kernel, prof)
    assert asked == [] and not [c for c in again.changes if c.tuner == "neighbours"]


@pytest.mark.parametrize(
    ("name", "value", "text", "held"),
    [
        ("CPUQuota", "400%", "400000 100000", True),
        ("CPUQuota", "400%", "200000 50000", True),  # the same share of another period
        ("CPUQuota", "400%", "max 100000", False),
        ("CPUQuota", "", "max 100000", True),
        ("CPUQuota", "", "100000 100000", False),
        ("CPUQuota", "150%", None, False),
        ("CPUWeight", "50", "50", True),
        ("CPUWeight", "", "100", True),
        ("CPUWeight", "50", "100", False),
    ],
)
def test_unit_values_as_their_cgroup_files_show_them(
    name: str, value: str, text: str | None, held: bool
) -> None:
    assert units.file_holds(name, value, text) is held


def test_a_server_that_starts_later_in_a_capped_cgroup_is_uncapped_by_the_daemon(
    tmp_path: Path, events: object
) -> None:
    """A rule that leaves its processes where they are: the daemon capped user.slice before
    the server existed; once it places a server that started there, it plans in full again,
    and user.slice's other children are capped instead."""
    from gputuned.daemon.core import Daemon

    root = host(tmp_path, server_unit=True)
    (root / f"proc/{SERVER_PID}").rename(tmp_path / "server-later")  # not running yet
    (root / "sys/fs/cgroup/system.slice/inference.service/cgroup.procs").write_text("")
    prof = tmp_path / "nb.toml"
    prof.write_text(
        'name = "nb"\n[cpusets.inference]\ncpus = "8-15"\n'
        '[[process]]\nname = "server"\nmatch.cmdline = "vllm"\nmatch.uid = 1000\ncpus = "inference"\nnice = -10\n'
        "[neighbours]\ncap_cpus = 2\n"
    )
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    cg = root / "sys/fs/cgroup"
    assert (cg / "user.slice/cpu.max").read_text() == "200000 100000\n"
    add_process(
        root,
        9090,
        comm="python3",
        cmdline=["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"],
        exe="/usr/bin/python3",
        start_time=99999,
        cgroup="/user.slice/user-1000.slice/session-7.scope",
        uid=1000,
    )
    d.place([9090], "test")
    assert 9090 in d.placed
    assert (cg / "user.slice/cpu.max").read_text() == "max 100000\n"  # the cap is lifted
    assert "/user.slice cpu.max" not in {c.target for c in d.settings}
    d.stop()


def test_gputuneds_own_service_keeps_system_slice_uncapped(tmp_path: Path) -> None:
    root = host(tmp_path, systemd=True)
    TreeModel(root).mkdir(f"{CG}/system.slice/gputuned.service")
    plan = plan_profile(tree_kernel(root), profile({"cap_cpus": 4}))
    assert mine(plan) == {
        "user.slice CPUQuota": "400%",
        "cron.service CPUQuota": "400%",  # system.slice's other children, not system.slice
    }


def test_cpu_and_cpuset_enabled_in_the_same_file_are_both_put_back(tmp_path: Path) -> None:
    """The root enables neither controller: [cpuset] enables cpuset and [neighbours] cpu in
    the same cgroup.subtree_control, each journaled under its own key."""
    root = tree_copy("h200-vm", tmp_path, server=False)
    (root / "sys/fs/cgroup/cgroup.subtree_control").write_text("")
    add_burner(root)
    before = digest(root)
    kernel = tree_kernel(root)
    _plan, report = apply_profile(kernel, profile({"cap_cpus": 2}))
    assert not report.failed
    assert (root / "sys/fs/cgroup/cgroup.subtree_control").read_text().split() == ["cpuset", "cpu"]
    assert (root / "sys/fs/cgroup/user.slice/cpu.max").read_text() == "200000 100000\n"
    assert not revert_all(kernel).failed
    assert digest(root) == before


@pytest.mark.parametrize(
    ("name", "is_file"),
    [
        ("cgroup.procs", True),
        ("cpu.max", True),
        ("memory.pressure", True),
        ("cpu.slice", False),  # a unit's cgroup, however it is named
        ("user.slice", False),
        ("process_api", False),
    ],
)
def test_interface_files_are_told_from_child_cgroups_by_name(name: str, is_file: bool) -> None:
    from gputuned.tuners.neighbours import _INTERFACE_FILE

    assert bool(_INTERFACE_FILE.fullmatch(name)) is is_file


def test_a_users_own_units_are_written_as_files_not_through_the_system_manager(
    tmp_path: Path,
) -> None:
    """The server runs as a user unit (user@1000.service/app.slice/vllm.service): its
    siblings are the user manager's units, which `systemctl set-property` (the system
    manager's) would not find, or would mistake for system units of the same name."""
    root = host(tmp_path, systemd=True, server_unit=True)
    model = TreeModel(root)
    app = f"{CG}/user.slice/user-1000.slice/user@1000.service/app.slice"
    for cg in (app.rsplit("/", 1)[0], app, f"{app}/vllm.service", f"{app}/cron.service"):
        model.mkdir(cg)
    (root / f"proc/{SERVER_PID}").rename(tmp_path / "moved")
    add_server(root, "/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service")
    plan = plan_profile(tree_kernel(root), profile({"weight": 30}, move=False))
    assert set(mine(plan)) == {
        # the user's own unit: its cgroup file
        "/user.slice/user-1000.slice/user@1000.service/app.slice/cron.service cpu.weight",
        # the system manager's units: through systemd
        "session-7.scope CPUWeight",
        "system.slice CPUWeight",
    }
