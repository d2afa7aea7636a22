"""Kubernetes manifests rendered from the job config, validated against the operators'
published CRD schemas (tests/fixtures/k8s/crds/, each with its repository, tag and
licence in SOURCES.md) with a JSON-schema validator, plus a strict pass that refuses any
field the schema does not define (the API server would prune it silently), and compared
with golden files.

To accept intended changes: SLURMFABRIC_UPDATE_GOLDEN=1 pytest tests/unit/test_k8smanifest.py
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
import shlex
import shutil
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
        "kubernetes.namespace=ml", "program.modules=[]"]


@functools.cache
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
    # the warning signal has no pod form: said once, naming the field, never silently dropped
    warned = [line for line in proc.stderr.splitlines() if "launcher.signal" in line]
    assert len(warned) == 1 and warned[0].startswith("slurmfabric: warning: ") \
        and "SIGTERM" in warned[0], proc.stderr
    bad = subprocess.run([sys.executable, "-m", "slurmfabric", "render", "-c",
                          str(REPO / "examples" / "h100-fsdp.toml"), "--target", "jobset"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "needs a container image" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "slurmfabric", "render", "-c",
                          str(REPO / "examples" / "h100-fsdp.toml"), "--target", "jobset",
                          "--set", "kubernetes.rdma_resource=rdma/has space"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "kubernetes.rdma_resource" in bad.stderr


# --- issue 32: manifests that a cluster would run ------------------------------------------

TORCH_TARGETS = ("pytorchjob", "trainjob", "jobset")


def build(config_sets: list[str], target: str, toml: str = "h100-fsdp.toml") -> dict:
    """The example's manifest; h100-fsdp.toml's environment modules are cleared, since a
    Kubernetes target refuses them (test_every_unhonoured_field_is_refused...)."""
    config = load_config(str(REPO / "examples" / toml), ["program.modules=[]", *config_sets],
                         "")
    return yaml.safe_load(k8smanifest.to_yaml(k8smanifest.build(config, target)))


def program_containers(manifest: dict) -> list[dict]:
    """Every container that runs the job's code (TrainJob: the runtime patch's)."""
    spec = manifest["spec"]
    if manifest["kind"] == "PyTorchJob":
        pods = [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    elif manifest["kind"] == "MPIJob":
        pods = [r["template"] for r in spec["mpiReplicaSpecs"].values()]
    elif manifest["kind"] == "JobSet":
        pods = [spec["replicatedJobs"][0]["template"]["spec"]["template"]]
    else:
        patch = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
        pods = [patch["replicatedJobs"][0]["template"]["spec"]["template"]]
    return [(c, pod["spec"].get("volumes", [])) for pod in pods
            for c in pod["spec"]["containers"]]


def images(manifest: dict) -> set[str]:
    if manifest["kind"] == "TrainJob":
        return {manifest["spec"]["trainer"]["image"]}
    return {c["image"] for c, _ in program_containers(manifest)}


def validate(manifest: dict, target: str) -> None:
    spec = schema(target, manifest["apiVersion"].split("/")[1])
    assert [e.message for e in jsonschema.Draft7Validator(spec).iter_errors(manifest)] == []
    assert unknown_fields(manifest, spec) == []


@pytest.mark.parametrize(("given", "reference"), [
    # pyxis README: --container-image=[USER@][REGISTRY#]IMAGE[:TAG]; enroot import
    # docker://[USER@][REGISTRY#]IMAGE[:TAG] (doc/cmd/import.md), digests (src/docker.sh)
    ("nvcr.io#nvidia/pytorch:25.08-py3", "nvcr.io/nvidia/pytorch:25.08-py3"),
    ("docker://nvcr.io#nvidia/pytorch:25.08-py3", "nvcr.io/nvidia/pytorch:25.08-py3"),
    ("docker://$oauthtoken@nvcr.io#nvidia/nemo:25.07", "nvcr.io/nvidia/nemo:25.07"),
    ("localhost:5000#team/train:v1", "localhost:5000/team/train:v1"),
    ("ubuntu:24.04", "ubuntu:24.04"),
    ("docker://ghcr.io/org/trainer:1.2", "ghcr.io/org/trainer:1.2"),
    ("nvcr.io#nvidia/pytorch@sha256:" + "ab" * 32, "nvcr.io/nvidia/pytorch@sha256:" + "ab" * 32),
])
@pytest.mark.parametrize("target", k8smanifest.TARGETS)
def test_enroot_image_references_become_registry_references(given, reference, target) -> None:
    manifest = build([f"program.container_image={given}", *SETS[1:]], target)
    assert images(manifest) == {reference}
    validate(manifest, target)
    # kubernetes.image wins, and is translated the same way
    manifest = build([f"kubernetes.image={given}", "program.container_image=other:1"], target)
    assert images(manifest) == {reference}


@pytest.mark.parametrize("given", ["/lustre/images/pytorch-25.08.sqsh", "./pytorch.sqsh",
                                   "pytorch+25.08.squashfs", "dockerd://pytorch:latest",
                                   "podman://localhost/train:1", "myregistry#team/img:1",
                                   "nvcr.io#NVIDIA/PyTorch:25.08"])
def test_images_without_a_pod_form_are_refused_naming_the_field(given) -> None:
    for field in ("kubernetes.image", "program.container_image"):
        with pytest.raises(k8smanifest.UsageError) as caught:
            build([f"{field}={given}"], "pytorchjob")
        error = caught.value
        assert str(error).startswith(f"{field} {given!r}")
        assert "kubernetes.image" in error.hint and "nvcr.io/nvidia/pytorch:" in error.hint


def test_a_squashfs_image_is_refused_on_the_command_line(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "render", "-c",
                           str(REPO / "examples" / "h100-fsdp.toml"), "--target", "jobset",
                           "--set", "program.container_image=/lustre/img/pt.sqsh"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "program.container_image '/lustre/img/pt.sqsh' is a squashfs file" in proc.stderr
    assert "set kubernetes.image" in proc.stderr


MOUNTS = ['program.container_mounts=["/lustre:/lustre:ro", "/data:/mnt/data:ro+rprivate+'
          'x-create=dir", "/scratch", "tmpfs:/tmp/fast", "/home/alice/llm:/home/alice/llm:'
          'rslave", "/data:/mnt/data2:"]', 'kubernetes.mount_claims={"/data" = "datasets/v2"}']


@pytest.mark.parametrize("target", k8smanifest.TARGETS)
def test_container_mounts_become_volumes_in_every_program_container(target) -> None:
    manifest = build([*SETS, *MOUNTS], target)
    validate(manifest, target)
    for container, volumes in program_containers(manifest):
        by_name = {v["name"]: v for v in volumes}
        mounts = {m["mountPath"]: (m, by_name[m["name"]]) for m in container["volumeMounts"]}
        mount, volume = mounts["/lustre"]
        assert mount.get("readOnly") is True and volume["hostPath"] == {"path": "/lustre"}
        mount, volume = mounts["/mnt/data"]
        assert mount.get("readOnly") is True and mount["subPath"] == "v2"
        assert volume["persistentVolumeClaim"] == {"claimName": "datasets"}
        mount, volume = mounts["/scratch"]
        assert "readOnly" not in mount and volume["hostPath"] == {"path": "/scratch"}
        assert mounts["/tmp/fast"][1]["emptyDir"] == {"medium": "Memory"}
        mount, volume = mounts["/home/alice/llm"]
        assert mount["mountPropagation"] == "HostToContainer"
        mount, volume = mounts["/mnt/data2"]  # a second mount of a claimed source
        assert volume["persistentVolumeClaim"] == {"claimName": "datasets"}
        assert "readOnly" not in mount  # "SRC:DST:" has no flags, as in pyxis
    if target == "pytorchjob":  # the health gate may read its config from a mount too
        init = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
            "initContainers"][0]
        assert {m["mountPath"] for m in init["volumeMounts"]} >= {"/lustre", "/mnt/data"}


@pytest.mark.parametrize("target", k8smanifest.TARGETS)
def test_a_plain_container_mount_reaches_every_program_container(target) -> None:
    """No [kubernetes] setting: a pyxis mount is a hostPath volume wherever the job's code
    runs (the old manifests dropped it while program.command pointed into it)."""
    manifest = build([*SETS, 'program.container_mounts=["/lustre:/lustre:ro"]'], target)
    validate(manifest, target)
    for container, volumes in program_containers(manifest):
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/lustre"]
        (volume,) = [v for v in volumes if v["name"] == mount["name"]]
        assert volume["hostPath"] == {"path": "/lustre"} and mount["readOnly"] is True


@pytest.mark.parametrize(("sets", "says"), [
    (['program.container_mounts=["/lustre:/lustre:noexec"]'], "flag 'noexec' has no"),
    (['program.container_mounts=["umount:/opt/hpcx"]'], "the source 'umount' has no"),
    (['program.container_mounts=["/lustre:data"]'], "the target 'data' is relative"),
    (['program.container_mounts=["/lustre"]', "kubernetes.host_path_mounts=false"],
     "kubernetes.mount_claims has no claim for '/lustre'"),
    (['program.container_mounts=["/lustre"]', 'kubernetes.mount_claims={"/lustre/" = "l"}'],
     "kubernetes.mount_claims: '/lustre/' is not the source"),
    (['launcher.srun_args=["--container-mounts=/lustre:/lustre"]'],
     "launcher.srun_args --container-mounts: a pod has no srun"),
])
def test_mounts_without_a_volume_form_are_refused_not_dropped(sets, says) -> None:
    for target in k8smanifest.TARGETS:
        with pytest.raises(k8smanifest.UsageError, match=says) as caught:
            build([*SETS, *sets], target)
        assert caught.value.hint


def test_mount_claims_are_checked_when_the_config_loads() -> None:
    from slurmfabric.errors import ConfigError

    for value in ('{"lustre" = "pvc"}', '{"/lustre" = "Not_A_Name"}',
                  '{"/lustre" = "pvc/../etc"}'):
        with pytest.raises(ConfigError, match="kubernetes.mount_claims"):
            load_config(str(REPO / "examples" / "h100-fsdp.toml"),
                        [f"kubernetes.mount_claims={value}"], "")


def launcher_container(manifest: dict) -> dict:
    return manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]


def exported(command: list[str]) -> list[str]:
    return [command[i + 1] for i, word in enumerate(command) if word == "-x"]


def test_mpijob_keeps_mpirun_args_and_exports_every_rank_variable() -> None:
    manifest = build([*SETS, 'launcher.mpirun_args=["--mca", "pml", "ucx", "--report-bindings"]',
                      "fabric.nccl.NCCL_IB_TC=106", "launcher.rendezvous.port=29600"],
                     "mpijob")
    launcher = launcher_container(manifest)
    command = launcher["command"]
    head = command[:command.index("slurmfabric")]
    assert head[-4:] == ["--mca", "pml", "ucx", "--report-bindings"]
    names = {e["name"] for e in launcher["env"]} - {"OMPI_ALLOW_RUN_AS_ROOT",
                                                     "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"}
    assert set(exported(head)) == names
    assert {"NCCL_NET", "NCCL_IB_TC", "SLURMFABRIC_FABRIC_TYPE", "SLURMFABRIC_PORT_RANGE",
            "SLURMFABRIC_PORT", "MASTER_ADDR", "OMP_NUM_THREADS"} <= names
    env = {e["name"]: e["value"] for e in launcher["env"]}
    assert env["MASTER_ADDR"] == "llama-fsdp-16n-worker-0.llama-fsdp-16n"
    assert "--bind-to" in head  # launch binds each rank; mpirun binds nothing
    bound = build([*SETS, 'launcher.mpirun_args=["--bind-to", "core"]'], "mpijob")
    head = launcher_container(bound)["command"]
    assert head.count("--bind-to") == 1 and head[head.index("--bind-to") + 1] == "core"


def test_mpijob_ranks_get_every_variable_under_real_open_mpi(tmp_path) -> None:
    """The rendered launcher command, unchanged, under this machine's Open MPI. On the
    cluster mpirun reaches each worker pod over ssh, whose session starts with a fresh
    environment; here the launch agent (--mca plm_rsh_agent, set as OMPI_MCA_plm_rsh_agent)
    is a script that ignores the host name and runs the remote command under 'env -i' with
    only PATH and HOME, as sshd would. So a variable reaches a rank only when mpirun exports
    it: "-x <env>: Export the specified environment variables to the remote nodes before
    executing the program" (Open MPI mpirun(1)). The 'slurmfabric' on the agent's PATH
    stands in for the image's."""
    mpirun = shutil.which("mpirun")
    assert mpirun is not None and shutil.which("orted"), \
        "Open MPI missing: apt-get install openmpi-bin (scripts/test.sh does)"
    probe, out = tmp_path / "probe.py", tmp_path / "ranks"
    out.mkdir()
    probe.write_text("import json, os, sys\n"
                     "rank = os.environ['OMPI_COMM_WORLD_RANK']\n"
                     "with open(os.path.join(sys.argv[1], rank), 'w') as handle:\n"
                     "    json.dump(dict(os.environ), handle)\n")
    config = tmp_path / "job.toml"
    config.write_text(f"""
[job]
name = "probe"
nodes = 2
gpus_per_node = 0
ntasks_per_node = 2
[launcher]
type = "mpirun"
mpirun_args = ["--mca", "btl", "self,tcp"]
[launcher.rendezvous]
port_range = [31000, 31999]
[program]
command = [{json.dumps(sys.executable)}, {json.dumps(str(probe))}, {json.dumps(str(out))}]
env = {{ SLURMFABRIC_NO_PLAN = "1", PROBE_MARK = "two words" }}
[fabric]
type = "roce"
nccl = {{ NCCL_IB_GID_INDEX = "3", NCCL_IB_TC = "106", NCCL_SOCKET_IFNAME = "eth0" }}
[kubernetes]
image = "nvcr.io#nvidia/pytorch:25.08-py3"
namespace = "ml"
""")
    job = k8smanifest.build(load_config(str(config), [], ""), "mpijob")
    launcher = launcher_container(job)
    assert job["spec"]["slotsPerWorker"] == 2
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "slurmfabric"
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} PYTHONPYCACHEPREFIX="
                    f"{os.environ.get('PYTHONPYCACHEPREFIX', tmp_path / 'pyc')} "
                    f'exec {sys.executable} -m slurmfabric "$@"\n')
    agent = tmp_path / "ssh-stand-in"
    agent.write_text('#!/bin/sh\n# [options] host command...: like ssh into a worker pod\n'
                     'while [ "${1#-}" != "$1" ]; do shift; done\nshift\n'
                     f'pod=$(mktemp -d {tmp_path}/pod.XXXXXX)  # its own /tmp, as a pod has\n'
                     f'exec env -i PATH={bin_dir}:/usr/bin:/bin HOME={tmp_path} '
                     'TMPDIR="$pod" /bin/sh -c "$*"\n')
    for script in (shim, agent):
        script.chmod(0o755)
    # The operator's hostfile (SOURCES.md 4.3): <job>-worker-<i>.<job>.<ns>.svc slots=N
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("probe-worker-0.probe.ml.svc slots=2\n"
                        "probe-worker-1.probe.ml.svc slots=2\n")

    def run(command: list[str]) -> list[dict]:
        for old in out.iterdir():
            old.unlink()
        env = {e["name"]: e["value"] for e in launcher["env"]}
        launcher_tmp = tmp_path / "launcher-tmp"
        launcher_tmp.mkdir(exist_ok=True)
        env.update(PATH=os.environ["PATH"], HOME=str(tmp_path), TMPDIR=str(launcher_tmp),
                   OMPI_MCA_plm_rsh_agent=str(agent),
                   OMPI_MCA_orte_default_hostfile=str(hostfile),
                   OMPI_MCA_routed="direct")  # all "hosts" are this one machine
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return [json.loads(path.read_text()) for path in sorted(out.iterdir())]

    command = launcher["command"]
    assert command[0] == "mpirun" and "--mca" in command  # mpirun_args kept
    ranks = run(command)
    assert sorted(int(r["OMPI_COMM_WORLD_RANK"]) for r in ranks) == [0, 1, 2, 3]
    for rank in ranks:
        assert rank["NCCL_IB_GID_INDEX"] == "3" and rank["NCCL_IB_TC"] == "106"
        assert rank["NCCL_SOCKET_IFNAME"] == "eth0" and rank["NCCL_NET"] == "IB"
        assert rank["SLURMFABRIC_FABRIC_TYPE"] == "roce"
        assert rank["SLURMFABRIC_PORT_RANGE"] == "31000-31999"
        assert rank["PROBE_MARK"] == "two words"
        assert rank["MASTER_ADDR"] == "probe-worker-0.probe"
        assert rank["RANK"] == rank["OMPI_COMM_WORLD_RANK"] and rank["WORLD_SIZE"] == "4"
    # The stand-in does start ranks clean: without the -x exports (MASTER_ADDR aside, which
    # 'launch' needs) no NCCL or slurmfabric variable reaches a rank.
    bare = [w for i, w in enumerate(command) if not (
        (w == "-x" and command[i + 1] != "MASTER_ADDR")
        or (i and command[i - 1] == "-x" and w != "MASTER_ADDR"))]
    for rank in run(bare):
        assert not {"NCCL_IB_GID_INDEX", "NCCL_IB_TC", "SLURMFABRIC_FABRIC_TYPE",
                    "PROBE_MARK"} & set(rank)


NCCL_TESTS = ["kubernetes.image=nvcr.io#nvidia/pytorch:25.08-py3",
              "launcher.nccl_tests.gpus_per_rank=2",
              'launcher.mpirun_args=["-x", "LD_LIBRARY_PATH"]']


def test_nccl_tests_renders_as_the_mpi_operator_example_shapes_it() -> None:
    """kubeflow/mpi-operator examples/v2beta1/nccl-tests/nccl-tests.yaml (@6dcc0f73e9dc):
    a launcher without GPUs running mpirun ... -bind-to none -x ... <op>_perf, workers with
    the GPUs and a memory-backed /dev/shm running sshd, slotsPerWorker ranks per worker."""
    config = load_config(str(REPO / "examples" / "nccl-tests-sweep.toml"), NCCL_TESTS, "")
    manifest = yaml.safe_load(k8smanifest.to_yaml(k8smanifest.build(config, "mpijob")))
    validate(manifest, "mpijob")
    spec = manifest["spec"]
    assert spec["slotsPerWorker"] == 4 and spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    launcher = launcher_container(manifest)
    assert "resources" not in launcher
    assert launcher["command"][:2] == ["/bin/sh", "-ec"]
    runs = [shlex.split(line) for line in launcher["command"][2].splitlines()]
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["containers"][0]["command"] == ["/usr/sbin/sshd", "-De"]
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert {"name": "dshm", "mountPath": "/dev/shm"} in worker["containers"][0]["volumeMounts"]
    # one mpirun per op, each the sbatch script's nccl-tests argv, under 'slurmfabric launch'
    from slurmfabric.job.render import render_sbatch

    script = render_sbatch(config)
    sbatch_runs = [shlex.split(line.split("launch --mode srun -- ", 1)[1].rstrip("\\ ")
                               + " " + script.splitlines()[i + 1].strip())
                   for i, line in enumerate(script.splitlines())
                   if "launch --mode srun -- " in line and "_perf" in line]
    assert len(sbatch_runs) == len(runs) == 4
    for run, expected in zip(runs, sbatch_runs):
        assert run[0] == "mpirun" and run[1:3] == ["-np", "8"]
        assert run[run.index("--") + 1:] == expected
        head = run[:run.index("slurmfabric")]
        assert head[-2:] == ["-x", "LD_LIBRARY_PATH"] and "NCCL_DEBUG" in exported(head)


@pytest.mark.parametrize("launcher", ["mpirun", "srun-pmix", "nccl-tests"])
@pytest.mark.parametrize("target", TORCH_TARGETS)
def test_mpi_launchers_are_refused_for_torchrun_targets_with_a_hint_that_leads_on(
        launcher, target) -> None:
    sets = [*SETS, f"launcher.type={launcher}"]
    if launcher == "nccl-tests":
        sets.append("program.command=[]")
    with pytest.raises(k8smanifest.UsageError, match=f"launcher.type '{launcher}' starts MPI"
                       ) as caught:
        build(sets, target)
    hint = caught.value.hint
    assert "--target mpijob" in hint and "program.command" not in hint
    build(sets, "mpijob")  # following the hint renders


def sbatch_workers(config) -> int:
    """Workers per node as the sbatch script starts them."""
    from slurmfabric.job.render import render_sbatch

    script = render_sbatch(config)
    for pattern in (r"--nproc-per-node=(\d+)", r"--map-by ppr:(\d+):node",
                    r'--nodes="\$SLURM_NNODES" --ntasks-per-node=(\d+)'):
        found = re.search(pattern, script)
        if found:
            return int(found.group(1))
    raise AssertionError("no worker count in the script")


@pytest.mark.parametrize("sets", [
    [],
    ["job.gpus_per_node=0", "launcher.nproc_per_node=4", "job.ntasks_per_node=1"],
    ["launcher.type=srun"],
    ["launcher.type=srun", "job.gpus_per_node=0", "job.ntasks_per_node=6"],
    ["launcher.type=mpirun", "job.ntasks_per_node=8"],
    ["launcher.type=nccl-tests", "program.command=[]", "launcher.nccl_tests.gpus_per_rank=4"],
])
def test_workers_per_pod_equal_the_sbatch_scripts(sets) -> None:
    config = load_config(str(REPO / "examples" / "h100-fsdp.toml"), [*SETS, *sets], "")
    workers = sbatch_workers(config)
    targets = ["mpijob"] if config.launcher.type in ("mpirun", "nccl-tests") \
        else k8smanifest.TARGETS
    for target in targets:
        manifest = k8smanifest.build(config, target)
        spec = manifest["spec"]
        if target == "pytorchjob":
            assert spec["nprocPerNode"] == str(workers)
        elif target == "trainjob":
            assert spec["trainer"]["numProcPerNode"] == workers
        elif target == "jobset":
            env = spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
                "containers"][0]["env"]
            assert {"name": "NPROC_PER_NODE", "value": str(workers)} in env
        else:
            assert spec["slotsPerWorker"] == workers
            assert launcher_container(manifest)["command"][1:3] == ["-np", str(16 * workers)]


def test_each_manifest_names_the_operator_release_it_needs() -> None:
    wanted = {"pytorchjob": ("Training Operator", "v1.7.0"),
              "trainjob": ("Kubeflow Trainer", "v2.2.0"), "jobset": ("JobSet", "v0.2.0"),
              "mpijob": ("MPI Operator", "v0.3.0")}
    for target, (operator, version) in wanted.items():
        text = k8smanifest.to_yaml(k8smanifest.build(
            load_config(str(REPO / "examples" / "h100-fsdp.toml"), SETS, ""), target))
        note = yaml.safe_load(text)["metadata"]["annotations"]["slurmfabric/requires"]
        assert operator in note and f">= {version}" in note


def test_pods_get_the_scripts_nccl_exports_for_the_fabric_type() -> None:
    """fabric.type's meaning (plan/contract.py) reaches the pods as it reaches the script."""
    for target in k8smanifest.TARGETS:
        manifest = build([*SETS, "fabric.type=tcp", "fabric.nccl.NCCL_NET=Socket"], target)
        env = manifest["spec"]["trainer"]["env"] if target == "trainjob" else \
            program_containers(manifest)[0][0]["env"]
        values = {e["name"]: e["value"] for e in env}
        assert values["NCCL_IB_DISABLE"] == "1" and values["SLURMFABRIC_FABRIC_TYPE"] == "tcp"
        assert values["SLURMFABRIC_PORT_RANGE"] == "29500-30499"


def test_a_trainjob_needs_trainer_2_2_as_its_annotation_says() -> None:
    """Trainer v2.2.0's CRD serves every field of a rendered TrainJob; v2.1.0's lacks
    spec.runtimePatches (crds/SOURCES.md, section 5), so the minimum is tight."""
    manifest = build([*SETS, *MOUNTS], "trainjob")
    assert ">= v2.2.0" in manifest["metadata"]["annotations"]["slurmfabric/requires"]
    for tag, unknown in (("v2.2.0", []), ("v2.1.0", [".spec.activeDeadlineSeconds",
                                                  ".spec.runtimePatches"])):
        path = CRDS / f"trainer.kubeflow.org_trainjobs.{tag}.yaml.gz"
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            crd = yaml.safe_load(handle)
        (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
        spec = served["schema"]["openAPIV3Schema"]
        assert list(jsonschema.Draft7Validator(spec).iter_errors(manifest)) == []
        assert sorted(unknown_fields(manifest, spec)) == unknown, tag


# --- every config field on Kubernetes: honoured, refused, or Slurm only ---------------------

AUDIT_KINDS = ("honoured", "refused", "Slurm only", "honoured or refused",
               "warned, not carried")


def audit_table() -> dict[str, str]:
    """docs/kubernetes.md, "Every field on Kubernetes": field -> what a manifest does."""
    text = (REPO / "docs" / "kubernetes.md").read_text()
    section = text.split("### Every field on Kubernetes", 1)[1].split("\n### ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1] in AUDIT_KINDS:
            for field in re.findall(r"`([a-z_.]+)`", cells[0]):
                assert field not in rows, f"{field} has two rows"
                rows[field] = cells[1]
    return rows


def config_fields() -> set[str]:
    """Every leaf field of the job config, dotted; [[steps]] and [[job.components]] whole."""
    from pydantic import BaseModel

    from slurmfabric.config.models import JobConfig

    out: set[str] = set()

    def walk(model, prefix: str) -> None:
        for name, info in model.model_fields.items():
            kind = info.annotation
            if f"{prefix}{name}" in ("steps", "job.components"):
                out.add(f"{prefix}{name}")
            elif isinstance(kind, type) and issubclass(kind, BaseModel):
                walk(kind, f"{prefix}{name}.")
            else:
                out.add(f"{prefix}{name}")

    walk(JobConfig, "")
    return out


def test_the_audit_table_names_every_config_field_once() -> None:
    """A field added to the config without a decision for Kubernetes fails here."""
    table = audit_table()
    assert set(table) == config_fields()
    # the one known gap (a warning at render), named so that closing it updates the table
    assert {f for f, kind in table.items() if kind == "warned, not carried"} == {
        "launcher.signal", "launcher.signal_seconds"}


# (field, --set values, target, words in the hint): every "refused" row of the table.
REFUSED = [
    ("job.nodelist", ["job.nodelist=gpu[001-004]"], "kubernetes.io/hostname"),
    ("job.exclude", ["job.exclude=gpu007"], "taint"),
    ("job.constraint", ["job.constraint=h100&ib"], "nodeSelector"),
    ("job.gpu_type", ["job.gpu_type=h100"], "nvidia.com/gpu.product"),
    ("job.array", ["job.array=0-3"], "one manifest per array task"),
    ("job.dependency", ["job.dependency=afterok:12"], "jobs it waits for"),
    ("job.extra_sbatch", ['job.extra_sbatch=["--gres=nvme:1"]'], "[kubernetes]"),
    ("program.modules", ['program.modules=["cuda/12.4"]'], "install that software in "
                                                           "kubernetes.image"),
    ("launcher.slurmfabric_module", ["launcher.slurmfabric_module=slurmfabric/1.0"],
     "kubernetes.image"),
    ("launcher.srun_args", ['launcher.srun_args=["--cpu-bind=none"]'],
     "drop launcher.srun_args"),
    ("launcher.srun_args", ['launcher.srun_args=["--container-workdir=/w"]'],
     "program.workdir"),
    ("launcher.srun_args", ['launcher.srun_args=["--container-env=NCCL_IB_HCA"]'],
     "program.env"),
    ("launcher.resume.events", ["@resume-cpu.toml"], "restartPolicy"),
    ("launcher.per_node.kind", ["launcher.per_node.kind=accelerate"],
     "drop [launcher.per_node]"),
    ("program.container_runtime", ["program.container_runtime=apptainer",
                                   "program.container_image=/images/pt.sif"],
     "kubernetes.image"),
    ("program.env_prepend", ["program.env_prepend.PATH=/opt/bin"], "program.env"),
    ("program.env_append", ["program.env_append.PATH=/opt/bin"], "program.env"),
    ("program.env_expand", ["program.env_expand.RUN=$HOME/run"], "program.env"),
    ("program.setup", ['program.setup=["echo ready"]'], "image"),
    ("program.teardown", ['program.teardown=["echo done"]'], "image"),
    ("program.task_setup", ['program.task_setup=["echo task"]'], "image"),
    ("program.params", ["program.params.LR=0.1"], "program.command"),
    ("program.pass_args", ["program.pass_args=true"], "program.command"),
    ("steps", ['steps=[{name="probe", command=["hostname"]}]'], "init containers"),
    ("launcher.nccl_tests.mpi", ["@nccl-tests-sweep.toml", "launcher.nccl_tests.mpi=pmi2"],
     'launcher.nccl_tests.mpi = "pmix"'),
    ("launcher.nccl_tests.mpi", ["@nccl-tests-sweep.toml",
                                 "launcher.nccl_tests.mpi=cray_shasta"], "Open MPI build"),
]


def refused_build(sets: list[str], target: str) -> None:
    toml = next((s[1:] for s in sets if s.startswith("@")), "h100-fsdp.toml")
    build([*SETS, *(s for s in sets if not s.startswith("@"))], target, toml)


@pytest.mark.parametrize(("field", "sets", "fix"), REFUSED,
                         ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(REFUSED)])
def test_every_field_without_a_pod_form_is_refused_naming_it(field, sets, fix) -> None:
    """Before this audit, program.modules, launcher.nccl_tests.mpi, launcher.srun_args other
    than pyxis's mount/image, launcher.slurmfabric_module, launcher.resume and the job
    fields above went into no manifest without a word."""
    mpi = any(s.startswith("launcher.nccl_tests.mpi") for s in sets)
    for target in ["mpijob"] if mpi else k8smanifest.TARGETS:
        with pytest.raises(k8smanifest.UsageError) as caught:
            refused_build(sets, target)
        message, hint = str(caught.value), caught.value.hint
        assert message.startswith(field) and "\n" not in message, message
        assert fix in hint and "\n" not in hint, hint
    # The fix leads somewhere: the same config without the field renders.
    refused_build([*(s for s in sets if s.startswith("@")), *FIXED.get(field, [])],
                  "mpijob" if mpi else "pytorchjob")


FIXED = {"launcher.resume.events": ["launcher.resume.events=[]"]}


def test_every_refused_row_of_the_table_has_its_refusal_test() -> None:
    refused = {field for field, kind in audit_table().items() if kind == "refused"}
    # job.components: tests/unit/test_hetjob.py, test_pyslurm_and_kubernetes_refuse_components
    assert refused == {field for field, _, _ in REFUSED} - {"launcher.nccl_tests.mpi"} | {
        "job.components"}


def test_a_refused_field_is_one_line_and_exit_code_2_on_the_command_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "render", "-c",
                           str(REPO / "examples" / "h100-fsdp.toml"), "--target", "jobset",
                           "--set", "kubernetes.image=nvcr.io#nvidia/pytorch:25.08-py3"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == ""
    first, hint = proc.stderr.splitlines()  # the error, and its fix
    assert first.startswith("slurmfabric: error: program.modules has no Kubernetes form")
    assert hint == "HINT: install that software in kubernetes.image, and drop program.modules"


@pytest.mark.parametrize("mpi", ["pmix", "pmix_v3", "pmix_v4", "pmix_v5", "default"])
def test_nccl_tests_mpi_for_open_mpi_renders_the_open_mpi_launcher(mpi) -> None:
    """Slurm's PMIx plugins (and the cluster's default) mean an Open MPI build: under the
    MPI Operator its own mpirun starts the ranks, the same MPIJob for each."""
    manifest = build([*NCCL_TESTS, f"launcher.nccl_tests.mpi={mpi}"], "mpijob",
                     "nccl-tests-sweep.toml")
    validate(manifest, "mpijob")
    assert "mpiImplementation" not in manifest["spec"]  # the operator's default: OpenMPI
    runs = launcher_container(manifest)["command"][2].splitlines()
    assert all(run.startswith("mpirun -np 8 --bind-to none -x ") for run in runs)
    assert manifest == build(NCCL_TESTS, "mpijob", "nccl-tests-sweep.toml")


@pytest.mark.parametrize(("time", "seconds"), [("2-00:00:00", 172800), ("90", 5400),
                                               ("1:30:00", 5400), ("UNLIMITED", None),
                                               ("0", None)])
def test_the_time_limit_becomes_each_operators_active_deadline(time, seconds) -> None:
    """job.time was dropped: a job Slurm stops after its limit ran on as pods forever."""
    for target in k8smanifest.TARGETS:
        manifest = build([*SETS, f"job.time={time}"], target)
        validate(manifest, target)
        spec = manifest["spec"]
        if target in ("pytorchjob", "mpijob"):
            where = spec.get("runPolicy", {})
        elif target == "jobset":
            where = spec["replicatedJobs"][0]["template"]["spec"]
        else:
            where = spec
        assert where.get("activeDeadlineSeconds") == seconds, target
        if seconds is None:
            assert "activeDeadlineSeconds" not in json.dumps(manifest)


def test_launcher_slurmfabric_is_the_command_in_every_pod_and_stays_data(tmp_path) -> None:
    """launcher.slurmfabric (e.g. on a mounted file system) was dropped for the image's
    'slurmfabric'. The JobSet's shell runs, for real, with a path holding a space and
    '$(...)': the path reaches exec as one word, never as shell text."""
    where = tmp_path / "s f$(touch pwned)"
    where.mkdir()
    fake = where / "slurmfabric"
    fake.write_text('#!/bin/sh\n[ "$1 $2" = "env --no-plan" ] && echo "export FROM_ENV=yes"\n')
    torchrun = tmp_path / "torchrun"
    torchrun.write_text('#!/bin/sh\necho "FROM_ENV=$FROM_ENV"\nprintf "%s\\n" "$@"\n')
    for script in (fake, torchrun):
        script.chmod(0o755)
    sets = [*SETS, f"launcher.slurmfabric={fake}", f'launcher.torchrun=["{torchrun}"]']
    for target in k8smanifest.TARGETS:
        text = json.dumps(build(sets, target))
        assert json.dumps(str(fake)) in text
        assert '"slurmfabric"' not in text.replace('"manager": "slurmfabric"', "")
    pod = build(sets, "jobset")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    command = pod["spec"]["containers"][0]["command"]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "FROM_ENV=yes" and str(fake) in lines and "launch" in lines
    assert not (tmp_path / "pwned").exists()
    health = pod["spec"]["initContainers"][0]["command"]
    assert health == [str(fake), "health", "check"]
    mpi = launcher_container(build([*sets, "launcher.type=mpirun"], "mpijob"))["command"]
    assert mpi[mpi.index("--") - 4:mpi.index("--")] == [str(fake), "launch", "--mode", "mpi"]
