"""deploy/: every Kubernetes manifest validated offline, and the pieces agree with each other.

Core kinds against the Kubernetes API schemas kubernetes-validate ships (strict: an unknown
field is an error); the ServiceMonitor against its CRD's schema, vendored in tests/data/crds.
The ConfigMap's profile is a gputuned profile that plans on the 8-GPU two-socket tree.
"""

from __future__ import annotations

import re
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
    assert pod["hostPID"] and pod["hostNetwork"] and ctr["securityContext"]["privileged"]
    mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["profile"] == USER_DIR
    assert volumes["profile"]["configMap"]["name"] == by_kind("ConfigMap")["metadata"]["name"]
    assert f"--profile={USER_DIR}/{name}" in ctr["args"]
    assert "--metrics-address=$(POD_IP)" in ctr["args"]
    for host_path in ("/sys", "/sys/fs/cgroup", "/proc/irq", "/run/gputuned"):
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
    assert ctr["command"] == ["/usr/sbin/gputuned"]
    assert ctr["image"] == f"gputuned:{gputuned.__version__}"
