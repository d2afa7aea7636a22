"""Kubernetes manifests from the same validated job config: PyTorchJob (Kubeflow Training
Operator v1), TrainJob (Kubeflow Trainer v1alpha1), JobSet (v1alpha2) and MPIJob (MPI
Operator v2beta1). The shapes follow each operator's CRD (tests/fixtures/k8s/crds/, with
their sources; the tests validate every rendered manifest against them).

Every pod gets: the GPUs (``nvidia.com/gpu``) and the RDMA resource the device plugin
exposes (``kubernetes.rdma_resource``); ``IPC_LOCK`` (verbs pin memory, mlock(2)); the
Multus network annotation when given; a memory-backed /dev/shm (NCCL's shared-memory
transport); the job-level NCCL variables (``fabric.nccl``, ``program.env``); the
container command through ``slurmfabric launch`` (it derives the rank env from the
operator's variables, slurmfabric/rank/k8s.py, and binds each worker); and an init container
running ``slurmfabric health check``, whose failure keeps the pod from starting.

YAML comes out with every string in double quotes (JSON escapes, valid YAML): values from
the config are data, never YAML syntax.
"""

from __future__ import annotations

import json
import re
from typing import Any

from slurmfabric.errors import UsageError
from slurmfabric.job.options import shape

TARGETS = ("pytorchjob", "trainjob", "jobset", "mpijob")
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _name(config: Any) -> str:
    """job.name as a Kubernetes name (RFC 1123: lower case, digits, '-')."""
    name = re.sub(r"[^a-z0-9-]+", "-", config.job.name.lower()).strip("-")[:40].strip("-")
    if not name:
        raise UsageError(f"job.name {config.job.name!r} gives no Kubernetes name",
                         hint="use letters, digits and '-'")
    return name


# Fields with no Kubernetes form: a pod runs its container's command, with no batch shell
# around it (setup, teardown, steps), no per-task bash (task_setup) and no submit-time
# arguments (params, pass_args).
_SHELL_ONLY = ("setup", "teardown", "task_setup")


def _refuse_shell_only(config: Any) -> None:
    if config.steps:
        raise UsageError("steps has no Kubernetes form: a pod has no srun steps around its "
                         "command", hint="run them as init containers yourself, or drop "
                         "[[steps]]")
    program = config.program
    if program.params or program.pass_args:
        field = "params" if program.params else "pass_args"
        raise UsageError(f"program.{field} has no Kubernetes form: a manifest has no "
                         "submit-time parameters or script arguments",
                         hint=f"write the values into program.command, or drop "
                              f"program.{field}")
    for field in _SHELL_ONLY:
        if getattr(config.program, field):
            raise UsageError(f"program.{field} has no Kubernetes form: a pod runs its "
                             "command with no batch shell around it",
                             hint=f"bake it into the image, or drop program.{field}")


def _env(config: Any) -> list[dict[str, str]]:
    program = config.program
    _refuse_shell_only(config)
    for field in ("env_prepend", "env_append", "env_expand"):
        if getattr(program, field):
            # A pod's env has no shell: Kubernetes expands only $(VAR) of variables defined
            # earlier in the same container, not the image's (API reference, EnvVar.value).
            raise UsageError(f"program.{field} has no Kubernetes form: the pod's variables "
                             "are set without a shell",
                             hint=f"put the full value in program.env, or drop program.{field}")
    values = {**{k: str(v) for k, v in config.fabric.nccl.items()},
              **{k: str(v) for k, v in config.program.env.items()}}
    if config.fabric.type != "auto":
        values["SLURMFABRIC_FABRIC_TYPE"] = config.fabric.type
    return [{"name": k, "value": v} for k, v in values.items()]


def _image(config: Any) -> str:
    image = config.kubernetes.image or config.program.container_image
    if not image:
        raise UsageError("a Kubernetes target needs a container image",
                         hint="set kubernetes.image (or program.container_image)")
    return image


def _resources(config: Any, gpus: bool = True) -> dict:
    limits: dict[str, Any] = {}
    if gpus and config.job.gpus_per_node:
        limits["nvidia.com/gpu"] = config.job.gpus_per_node
    if gpus and config.kubernetes.rdma_resource:
        limits[config.kubernetes.rdma_resource] = config.kubernetes.rdma_per_pod
    return {"limits": limits} if limits else {}


def _worker_command(config: Any, kind: str) -> list[str]:
    """torchrun with one worker per GPU, each through 'slurmfabric launch'. The operators
    of PyTorchJob and TrainJob give torchrun its arguments as PET_* variables; for JobSet
    'slurmfabric env' derives them from the completion index first (k8senv.py)."""
    program = list(config.program.command)
    if not program:
        raise UsageError("program.command is empty", hint="set program.command")
    launcher = config.launcher
    run = [*launcher.torchrun, *launcher.torchrun_args, "--no-python", "slurmfabric", "launch",
           "--mode", "torchrun", *([] if launcher.bind else ["--no-bind"]), "--", *program]
    if kind == "jobset":
        return ["/bin/sh", "-c", 'eval "$(slurmfabric env --no-plan)" && exec "$@"', "sh",
                *run]
    return run


def _container(config: Any, name: str, command: list[str], gpus: bool = True) -> dict:
    container: dict[str, Any] = {"name": name, "image": _image(config), "command": command}
    env = _env(config)
    if env:
        container["env"] = env
    resources = _resources(config, gpus)
    if resources:
        container["resources"] = resources
    if config.program.workdir:
        container["workingDir"] = config.program.workdir
    if gpus:
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    return container


def _health(config: Any) -> list[dict]:
    if not config.kubernetes.health_check:
        return []
    command = ["slurmfabric", "health", "check"]
    if config.kubernetes.health_config:
        command += ["--config", config.kubernetes.health_config]
    return [{"name": "slurmfabric-health", "image": _image(config), "command": command,
             "resources": _resources(config),
             "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}]


def _pod(config: Any, container: dict, extra_env: list[dict] | None = None,
         gpus: bool = True) -> dict:
    if extra_env:
        container = {**container, "env": [*extra_env, *container.get("env", [])]}
    spec: dict[str, Any] = {"containers": [container]}
    if gpus:
        spec["initContainers"] = _health(config) or None
        spec["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    template: dict[str, Any] = {}
    if config.kubernetes.networks and gpus:
        template["metadata"] = {"annotations": {
            "k8s.v1.cni.cncf.io/networks": config.kubernetes.networks}}
    template["spec"] = {k: v for k, v in spec.items() if v}
    return template


def _meta(config: Any) -> dict:
    meta = {"name": _name(config)}
    if config.kubernetes.namespace:
        meta["namespace"] = config.kubernetes.namespace
    return meta


def _per_node(config: Any) -> tuple[int, int]:
    """Nodes and workers per node, as the sbatch script has them (options.shape): torchrun's
    nproc_per_node for a CPU job, not one worker per missing GPU."""
    job_shape = shape(config)
    return job_shape.nodes, job_shape.workers_per_node


def pytorchjob(config: Any) -> dict:
    nodes, workers = _per_node(config)
    template = _pod(config, _container(config, "pytorch", _worker_command(config,
                                                                         "pytorchjob")))
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "OnFailure",
                                           "template": template}}
    if nodes > 1:
        replicas["Worker"] = {"replicas": nodes - 1, "restartPolicy": "OnFailure",
                              "template": template}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _meta(config),
            "spec": {"nprocPerNode": str(workers), "pytorchReplicaSpecs": replicas}}


def trainjob(config: Any) -> dict:
    nodes, workers = _per_node(config)
    trainer: dict[str, Any] = {"image": _image(config),
                               "command": _worker_command(config, "trainjob"),
                               "numNodes": nodes, "numProcPerNode": workers}
    env = _env(config)
    if env:
        trainer["env"] = env
    resources = _resources(config)
    if resources:
        trainer["resourcesPerNode"] = resources
    # The runtime (a ClusterTrainingRuntime) owns the pod; runtimePatches may add volumes,
    # annotations and a container's securityContext/volumeMounts, but not a new init
    # container (v1alpha1 CRD), so the health gate belongs in the runtime itself.
    pod: dict[str, Any] = {}
    if config.kubernetes.networks:
        pod["metadata"] = {"annotations": {
            "k8s.v1.cni.cncf.io/networks": config.kubernetes.networks}}
    pod["spec"] = {"containers": [{
        "name": "node", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}
    patch = {"manager": "slurmfabric", "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": "node", "template": {"spec": {"template": pod}}}]}}}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": _meta(config),
            "spec": {"runtimeRef": {"name": config.kubernetes.runtime}, "trainer": trainer,
                     "runtimePatches": [patch]}}


def jobset(config: Any) -> dict:
    name, (nodes, workers) = _name(config), _per_node(config)
    extra = [{"name": "MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
             {"name": "MASTER_PORT", "value": "29500"},
             {"name": "NNODES", "value": str(nodes)},
             {"name": "NPROC_PER_NODE", "value": str(workers)}]
    template = _pod(config, _container(config, "node", _worker_command(config, "jobset")),
                    extra)
    template["spec"]["restartPolicy"] = "Never"
    job = {"parallelism": nodes, "completions": nodes, "completionMode": "Indexed",
           "backoffLimit": 0, "template": template}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": _meta(config),
            "spec": {"replicatedJobs": [{"name": "node", "replicas": 1,
                                         "template": {"spec": job}}]}}


def mpijob(config: Any) -> dict:
    nodes, ranks = _per_node(config)
    program = list(config.program.command)
    if not program:
        raise UsageError("program.command is empty", hint="set program.command")
    launch = ["mpirun", "-np", str(nodes * ranks), "--bind-to", "none",
              "slurmfabric", "launch", "--mode", "mpi", "--", *program]
    launcher = _pod(config, _container(config, "launcher", launch, gpus=False), gpus=False)
    worker = _pod(config, _container(config, "worker", ["/usr/sbin/sshd", "-De"]))
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": _meta(config),
            "spec": {"slotsPerWorker": ranks, "runPolicy": {"cleanPodPolicy": "Running"},
                     "mpiReplicaSpecs": {
                         "Launcher": {"replicas": 1, "template": launcher},
                         "Worker": {"replicas": nodes, "template": worker}}}}


BUILDERS = {"pytorchjob": pytorchjob, "trainjob": trainjob, "jobset": jobset,
            "mpijob": mpijob}


def build(config: Any, target: str) -> dict:
    if target not in BUILDERS:
        raise UsageError(f"--target {target!r}: use one of {', '.join(TARGETS)}")
    return BUILDERS[target](config)


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML; every string double-quoted with JSON escapes (valid YAML 1.2)."""
    return "\n".join(_lines(value, indent)) + "\n"


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if value is None:
        return "null"
    return json.dumps(str(value), ensure_ascii=False)


def _key(key: str) -> str:
    return key if _PLAIN_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{_key(key)}:")
                out += _lines(item, indent + 2)
            else:
                out.append(f"{pad}{_key(key)}: {_empty(item)}")
        return out
    for item in value:
        if isinstance(item, (dict, list)) and item:
            inner = _lines(item, indent + 2)
            out.append(f"{pad}- {inner[0].lstrip()}")
            out += inner[1:]
        else:
            out.append(f"{pad}- {_empty(item)}")
    return out


def _empty(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)
