"""deploy/: every Kubernetes manifest validated offline, and the pieces agree with each other.

Core kinds against the Kubernetes API schemas kubernetes-validate ships (strict: an unknown
field is an error); the ServiceMonitor against its CRD's schema, vendored in tests/data/crds.
The ConfigMap's profile is a gputuned profile that plans on the 8-GPU two-socket tree.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

import gputuned
from gputuned.engine.plan import plan_profile
from gputuned.profile.load import parse_profile
from gputuned.store.profiledirs import USER_DIR
from tests.fakeproc import add_process
from tests.faults import tree_kernel

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy/kubernetes"
CRDS = REPO / "tests/data/crds"
#: The Kubernetes release the manifests are checked against (kubernetes-validate's schemas).
KUBERNETES = "1.30.0"
CORE = {"Namespace", "ConfigMap", "DaemonSet", "Service"}


def manifests() -> list[dict[str, Any]]:
    docs = []
    for f in sorted(DEPLOY.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def by_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in manifests() if d["kind"] == kind]
    return doc


@pytest.mark.parametrize("doc", manifests(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_is_valid(doc: dict[str, Any]) -> None:
    if doc["kind"] in CORE:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        return
    crd = crd_for(doc["apiVersion"], doc["kind"])
    jsonschema.validate(doc, crd)


def crd_for(api_version: str, kind: str) -> dict[str, Any]:
    group, version = api_version.split("/")
    for f in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(f.read_text())
        spec = crd["spec"]
        if spec["group"] == group and spec["names"]["kind"] == kind:
            for v in spec["versions"]:
                if v["name"] == version:
                    schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
                    return schema
    raise AssertionError(f"no vendored CRD for {api_version} {kind} in {CRDS}")


def test_validation_fails_on_a_broken_manifest() -> None:
    """The checks can fail: a misspelt field and a wrong type are refused."""
    ds = by_kind("DaemonSet")
    ds["spec"]["template"]["spec"]["hostPid"] = True  # hostPID
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBERNETES, strict=True)
    sm = by_kind("ServiceMonitor")
    sm["spec"]["endpoints"][0]["interval"] = "every 30 seconds"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(sm, crd_for(sm["apiVersion"], sm["kind"]))


def fleet_profile() -> tuple[str, dict[str, Any]]:
    data = by_kind("ConfigMap")["data"]
    (name,) = data
    return name, tomllib.loads(data[name])


def test_the_configmap_profile_plans_on_the_8_gpu_tree() -> None:
    name, data = fleet_profile()
    profile = parse_profile(data, name)
    plan = plan_profile(tree_kernel(REPO / "tests/data/hosts/dual-socket-8gpu"), profile)
    assert not plan.blocked
    assert profile.cpuset is None, "the kubelet owns pods' cpusets: no partition"
    assert all(not r.move_to_partition for r in profile.process)


def test_daemonset_profile_port_service_and_monitor_agree() -> None:
    ds = by_kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    name, data = fleet_profile()
    assert pod["hostPID"] and pod["hostNetwork"]
    mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["profile"] == USER_DIR
    assert volumes["profile"]["configMap"]["name"] == by_kind("ConfigMap")["metadata"]["name"]
    assert f"--profile={USER_DIR}/{name}" in ctr["args"]
    assert "--metrics-address=$(POD_IP)" in ctr["args"]
    for host_path in ("/sys", "/sys/fs/cgroup", "/run/gputuned"):
        assert any(v.get("hostPath", {}).get("path") == host_path for v in volumes.values())
    (port,) = ctr["ports"]
    assert port["containerPort"] == data["daemon"]["metrics_port"]
    svc = by_kind("Service")
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["targetPort"] == port["name"]
    sm = by_kind("ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    probe = " ".join(ctr["readinessProbe"]["exec"]["command"])
    assert "gputunectl" in probe and "status" in probe


def test_containerfile_runs_the_packaged_daemon() -> None:
    text = (REPO / "deploy/Containerfile").read_text()
    ds = by_kind("DaemonSet")
    (ctr,) = ds["spec"]["template"]["spec"]["containers"]
    assert re.search(r"^FROM \S+debian:12", text, re.M), "the package's venv runs on Debian 12"
    assert "dist/gputuned_*_amd64.deb" in text  # what scripts/build-deb writes
    assert 'ENTRYPOINT ["/usr/sbin/gputuned"]' in text
    # The pod's command joins the host's cgroup namespace, frees /proc/irq, then execs it.
    assert ctr["command"][:4] == ["/usr/bin/nsenter", "--cgroup=/proc/1/ns/cgroup", "--", "/bin/sh"]
    assert 'exec /usr/sbin/gputuned "$@"' in ctr["command"][-2]
    assert "umount" in ctr["command"][-2] and re.search(r"install .*util-linux mount", text)
    assert ctr["image"] == f"gputuned:{gputuned.__version__}"


def pod_cgroup(pod: int, container: int) -> str:
    """A Burstable pod's container as the kubelet's systemd cgroup driver and containerd name
    it: one for every pod of every namespace, whoever made the pod."""
    slice_ = "/kubepods.slice/kubepods-burstable.slice"
    return f"{slice_}/kubepods-burstable-pod{pod:08x}.slice/cri-containerd-{container:064x}.scope"


def test_a_tenants_server_in_a_pod_gets_nothing_the_operators_does(tmp_path: Path) -> None:
    """Issue 30: the fleet rule matched by the Burstable pods' cgroup alone, which the kubelet
    makes for any tenant's pod: a uid-1000 `python3 -m vllm...` in another namespace's pod
    was planned nice -10 and the inference CPUs. The operator's server (the UID reserved for
    it) still is."""
    root = tmp_path / "node"
    shutil.copytree(REPO / "tests/data/hosts/dual-socket-8gpu", root, symlinks=True)
    name, data = fleet_profile()
    profile = parse_profile(data, name)
    (rule,) = profile.process
    argv = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    tenant, server = 7000, 7100
    for pid, uid in ((tenant, 1000), (server, rule.match.uid or 0)):
        add_process(
            root,
            pid,
            comm="python3",
            cmdline=argv,
            exe="/usr/bin/python3.11",
            start_time=pid,
            cgroup=pod_cgroup(pid, pid),
            uid=uid,
        )
    plan = plan_profile(tree_kernel(root), profile)
    placed = {c.data["pid"]: c for c in plan.settings if c.tuner == "process"}
    assert tenant not in placed, placed[tenant].target
    assert server in placed
    assert rule.match.uid not in (None, 0, 1000)


def unit_capabilities() -> set[str]:
    text = (REPO / "systemd/gputuned.service").read_text()
    (line,) = re.findall(r"^CapabilityBoundingSet=(.*)$", text, re.M)
    return {c.removeprefix("CAP_") for c in line.split()}


def test_the_daemonset_has_the_units_capabilities_and_not_privileged() -> None:
    ds = by_kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    sc = ctr["securityContext"]
    assert not sc.get("privileged", False)
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sorted(sc["capabilities"]["add"]) == sorted(unit_capabilities())
    assert len(unit_capabilities()) == 6
    # runc refuses a host path mounted inside /proc ("cannot be mounted because it is inside
    # /proc", libcontainer checkProcMount): none may be.
    assert not [m for m in ctr["volumeMounts"] if m["mountPath"].startswith("/proc")]


def test_the_metrics_port_admits_a_narrow_network_only() -> None:
    """With hostNetwork the port is on the node's address, which every pod can reach: a
    network as wide as the pods' (10.0.0.0/8) let any tenant read the process list."""
    _, data = fleet_profile()
    allow = data["daemon"]["metrics_allow"]
    nets = [ipaddress.ip_network(a, strict=False) for a in allow if not a[0].isalpha()]
    assert nets and all(n.num_addresses <= 256 for n in nets), allow
