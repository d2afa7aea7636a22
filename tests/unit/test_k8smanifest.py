"""Kubernetes manifests rendered from the job config, validated against the operators'
published CRD schemas (tests/fixtures/k8s/crds/, each with its repository, tag and
licence in SOURCES.md) with a JSON-schema validator, plus a strict pass that refuses any
field the schema does not define (the API server would prune it silently), and compared
with golden files.

To accept intended changes: SLURMFABRIC_UPDATE_GOLDEN=1 pytest tests/unit/test_k8smanifest.py
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from slurmfabric.config import load_config
from slurmfabric.job import k8s as k8smanifest

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "tests" / "fixtures" / "k8s" / "crds"
GOLDEN = REPO / "tests" / "golden" / "k8s"
UPDATE = os.environ.get("SLURMFABRIC_UPDATE_GOLDEN") == "1"
CRD_FILES = {"pytorchjob": "kubeflow.org_pytorchjobs.yaml.gz",
             "trainjob": "trainer.kubeflow.org_trainjobs.yaml.gz",
             "jobset": "jobset.x-k8s.io_jobsets.yaml.gz",
             "mpijob": "kubeflow.org_mpijobs.yaml.gz"}
SETS = ["kubernetes.image=nvcr.io/nvidia/pytorch:24.07-py3",
        "kubernetes.rdma_resource=rdma/rdma_shared_device_a", "kubernetes.networks=rdma-net",
        "kubernetes.namespace=ml"]


def schema(target: str, version: str) -> dict:
    with gzip.open(CRDS / CRD_FILES[target], "rt", encoding="utf-8") as handle:
        crd = yaml.safe_load(handle)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return served["schema"]["openAPIV3Schema"]


def unknown_fields(value, node: dict, path: str = "") -> list[str]:
    """Fields the structural schema does not define (kubectl --validate=strict refuses
    them; without it the API server prunes them)."""
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out = []
    if isinstance(value, dict) and node.get("type") == "object":
        props, extra = node.get("properties"), node.get("additionalProperties")
        for key, item in value.items():
            if props and key in props:
                out += unknown_fields(item, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(item, extra, f"{path}.{key}")
            elif props is not None or extra is False:
                out.append(f"{path}.{key}")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            out += unknown_fields(item, node["items"], f"{path}[{i}]")
    return out


def rendered(target: str, *extra: str) -> dict:
    config = load_config(str(REPO / "examples" / "h100-fsdp.toml"), [*SETS, *extra], "")
    return yaml.safe_load(k8smanifest.to_yaml(k8smanifest.build(config, target)))


@pytest.mark.parametrize("target", k8smanifest.TARGETS)
def test_every_target_validates_against_its_crd(target: str) -> None:
    manifest = rendered(target)
    version = manifest["apiVersion"].split("/")[1]
    spec = schema(target, version)
    errors = [f"{list(e.path)}: {e.message[:200]}"
              for e in jsonschema.Draft7Validator(spec).iter_errors(manifest)]
    assert errors == []
    assert unknown_fields(manifest, spec) == []
    # the validation can fail: a wrong type and a misspelt field are both caught
    broken = json.loads(json.dumps(manifest))
    broken["spec"]["bogusField"] = 1
    assert unknown_fields(broken, spec) == [".spec.bogusField"]
    if target == "pytorchjob":
        broken["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "one"
        assert list(jsonschema.Draft7Validator(spec).iter_errors(broken))


@pytest.mark.parametrize("target", k8smanifest.TARGETS)
def test_manifests_match_their_golden_files(target: str) -> None:
    config = load_config(str(REPO / "examples" / "h100-fsdp.toml"), SETS, "")
    text = k8smanifest.to_yaml(k8smanifest.build(config, target))
    golden = GOLDEN / f"h100-fsdp.{target}.yaml"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_the_pods_get_gpus_rdma_ipc_lock_the_network_and_the_health_gate() -> None:
    job = rendered("pytorchjob")
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]
    assert master["replicas"] == 1 and job["spec"]["pytorchReplicaSpecs"]["Worker"][
        "replicas"] == 15
    pod = master["template"]
    assert pod["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "rdma-net"}
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "pytorch"  # the operator's default container name
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8,
                                                "rdma/rdma_shared_device_a": 1}
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert container["command"][:6] == ["torchrun", "--no-python", "slurmfabric", "launch",
                                        "--mode", "torchrun"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NCCL_NET"] == "IB" and env["SLURMFABRIC_FABRIC_TYPE"] == "ib"
    (init,) = pod["spec"]["initContainers"]
    assert init["command"] == ["slurmfabric", "health", "check"]
    jobset = rendered("jobset")["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert jobset["completionMode"] == "Indexed" and jobset["parallelism"] == 16
    env = {e["name"]: e["value"] for e in jobset["template"]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "llama-fsdp-16n-node-0-0.llama-fsdp-16n"
    assert env["NNODES"] == "16"
    mpi = rendered("mpijob")["spec"]
    assert mpi["slotsPerWorker"] == 8 and mpi["mpiReplicaSpecs"]["Worker"]["replicas"] == 16
    launcher = mpi["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"][:3] == ["mpirun", "-np", "128"] and "resources" not in launcher


def test_hostile_values_stay_data_in_the_yaml() -> None:
    """The config's strings reach YAML as double-quoted JSON strings: a value with YAML or
    shell syntax is the same string after parsing."""
    nasty = 'x: y - z # "quoted" \\ $(rm -rf /) {a: b} [c] &anchor *alias !!str'
    job = rendered("pytorchjob", f"program.env.NASTY={nasty}")
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NASTY"] == nasty


def test_render_target_on_the_command_line(tmp_path) -> None:
    out = tmp_path / "job.yaml"
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "render", "-c",
                           str(REPO / "examples" / "h100-fsdp.toml"), "--target", "pytorchjob",
                           *[a for s in SETS for a in ("--set", s)], "-o", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == (GOLDEN / "h100-fsdp.pytorchjob.yaml").read_text()
    bad = subprocess.run([sys.executable, "-m", "slurmfabric", "render", "-c",
                          str(REPO / "examples" / "h100-fsdp.toml"), "--target", "jobset"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "needs a container image" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "slurmfabric", "render", "-c",
                          str(REPO / "examples" / "h100-fsdp.toml"), "--target", "jobset",
                          "--set", "kubernetes.rdma_resource=rdma/has space"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "kubernetes.rdma_resource" in bad.stderr
