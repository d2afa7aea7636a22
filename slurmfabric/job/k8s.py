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

The config was written for Slurm, so what has no pod form is translated or refused, never
dropped: an enroot/pyxis image reference becomes a registry reference (a squashfs file is
refused), ``program.container_mounts`` become volumes, and a launcher that starts MPI ranks
renders only as an MPIJob; ``job.time`` becomes the operator's ``activeDeadlineSeconds``.
Every other field is honoured, refused (``_refuse_unhonoured``), or only tells Slurm how to
queue, bill, log or mail the job (docs/kubernetes.md, "Every field on Kubernetes", the
audit the tests keep complete). Each manifest names, in the ``slurmfabric/requires`` annotation,
the oldest operator release that serves every field it uses.

YAML comes out with every string in double quotes (JSON escapes, valid YAML): values from
the config are data, never YAML syntax.
"""

from __future__ import annotations

import json
import re
import shlex
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


def _refuse_components(config: Any) -> None:
    if config.job.components:
        raise UsageError("job.components has no Kubernetes form: a heterogeneous job is a "
                         "Slurm allocation of several components, a manifest has one pod shape",
                         hint="drop [[job.components]] for a Kubernetes target")


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


# The audit of every config field against a pod (docs/kubernetes.md, "Every field on
# Kubernetes"): what is not honoured is refused here, unless it only tells Slurm how to
# queue, bill, log or mail the job (the pod's program runs the same without it).
# Fields that choose the hardware, the software, how often or when the job runs:
_JOB_REFUSED = {
    "nodelist": "pin the pods with a nodeAffinity on kubernetes.io/hostname in the manifest",
    "exclude": "keep pods off those nodes with a taint or a nodeAffinity in the manifest",
    "constraint": "select the nodes with a nodeSelector on their labels in the manifest",
    "gpu_type": "select the GPU model with a nodeSelector on nvidia.com/gpu.product "
                "(GPU feature discovery) in the manifest",
    "array": "render one manifest per array task (a distinct job.name each)",
    "dependency": "create the manifest once the jobs it waits for have finished",
    "extra_sbatch": "give what the options do through [kubernetes], or in the manifest",
}
# Open MPI's mpirun starts its ranks with its own PMIx server, which is what an MPIJob runs
# (mpi-operator's default mpiImplementation, OpenMPI); the launcher's '-x' exports and
# OMPI_ALLOW_RUN_AS_ROOT are Open MPI's. Slurm's other PMI plugins name MPI builds whose
# launchers take other options (MPICH/MVAPICH hydra, Cray PALS).
_OPEN_MPI_PMI = ("pmix", "pmix_v3", "pmix_v4", "pmix_v5", "default")


def _refuse_unhonoured(config: Any, target: str) -> None:
    """Refuse every field that would otherwise be dropped without a word."""
    for field, fix in _JOB_REFUSED.items():
        if getattr(config.job, field):
            raise UsageError(f"job.{field} has no Kubernetes form in a rendered manifest: it "
                             "would be dropped", hint=f"drop job.{field}, and {fix}")
    if config.program.modules or config.launcher.slurmfabric_module:
        field = "program.modules" if config.program.modules else "launcher.slurmfabric_module"
        raise UsageError(f"{field} has no Kubernetes form: environment modules ('module "
                         "load') are a host's software, and a pod runs only its image's",
                         hint=f"install that software in kubernetes.image, and drop {field}")
    if config.program.container_runtime != "pyxis":
        raise UsageError(f"program.container_runtime {config.program.container_runtime!r} has "
                         "no Kubernetes form: a pod runs its image itself, not through "
                         "apptainer exec", hint="drop program.container_runtime and give an "
                         "OCI image in kubernetes.image for a Kubernetes target")
    if config.launcher.per_node.kind:
        raise UsageError("launcher.per_node.kind has no Kubernetes form here: the operators "
                         "start torchrun in every pod, not another per-node launcher",
                         hint="drop [launcher.per_node] and give the worker command in "
                         "program.command for a Kubernetes target")
    if config.launcher.resume.enabled:
        raise UsageError("launcher.resume.events has no Kubernetes form: a pod has no Slurm "
                         "time-limit signal or requeue", hint="drop launcher.resume.events "
                         "(the operator restarts failed pods: restartPolicy, backoffLimit)")
    fields = {"--container-workdir": "program.workdir", "--container-env": "program.env",
              "--container-mounts": "program.container_mounts",
              "--container-image": "kubernetes.image"}
    for arg in config.launcher.srun_args:
        option = arg.split("=", 1)[0]
        fix = f"give it as {fields[option]} instead" if option in fields else \
            "drop launcher.srun_args for a Kubernetes target"
        raise UsageError(f"launcher.srun_args {option}: a pod has no srun, so this would be "
                         "dropped", hint=fix)
    mpi = config.launcher.nccl_tests.mpi
    if target == "mpijob" and config.launcher.type == "nccl-tests" and \
            mpi not in _OPEN_MPI_PMI:
        raise UsageError(f"launcher.nccl_tests.mpi {mpi!r}: an MPIJob runs Open MPI's mpirun "
                         "(its own PMIx), not an MPI built for Slurm's "
                         f"{mpi} plugin", hint="use an Open MPI build of nccl-tests in "
                         "kubernetes.image and set launcher.nccl_tests.mpi = \"pmix\"")


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
    return [{"name": k, "value": v} for k, v in _job_variables(config).items()]


def _job_variables(config: Any) -> dict[str, str]:
    """What the sbatch script exports before the launch (templates/env.sh.j2): fabric.type's
    NCCL meaning with fabric.nccl on top (render.nccl_exports, their one owner), program.env,
    and the variables 'slurmfabric launch' reads on every rank."""
    from slurmfabric.job.render import nccl_exports

    values = {**nccl_exports(config), **{k: str(v) for k, v in config.program.env.items()}}
    if config.fabric.type != "auto":
        values["SLURMFABRIC_FABRIC_TYPE"] = config.fabric.type
    values["SLURMFABRIC_PORT_RANGE"] = "{}-{}".format(*config.launcher.rendezvous.port_range)
    if config.launcher.rendezvous.port:
        values["SLURMFABRIC_PORT"] = str(config.launcher.rendezvous.port)
    return values


def _image(config: Any) -> str:
    image = config.kubernetes.image or config.program.container_image
    if not image:
        raise UsageError("a Kubernetes target needs a container image",
                         hint="set kubernetes.image (or program.container_image)")
    field = "kubernetes.image" if config.kubernetes.image else "program.container_image"
    return image_reference(image, field)


# pyxis takes --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH, and a value that starts
# with '.' or '/' is a squashfs file on the node (NVIDIA/pyxis README.md and
# pyxis_slurmstepd.c, strspn(image, "./"), @107519944221); anything else becomes the enroot
# URI docker://VALUE. enroot import reads docker://[USER@][REGISTRY#]IMAGE[:TAG], plus
# Docker's REGISTRY/IMAGE spelling and @sha256 digests, while dockerd:// and podman:// read
# the node's local Docker daemon or Podman store (NVIDIA/enroot doc/cmd/import.md and
# src/docker.sh, @8ea147d337da). USER is a login for enroot's credentials file; a pod's
# registry credentials are its imagePullSecrets instead.
_SQUASHFS_SUFFIXES = (".sqsh", ".squashfs", ".sqfs")
_DIGEST = re.compile(r"@(sha256:[0-9A-Fa-f]{64})$")
# A Docker image reference (github.com/distribution/reference, regexp.go): what the kubelet
# accepts in image:; anything else leaves the pod in InvalidImageName.
_LABEL = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(rf"^(?:{_LABEL}(?:\.{_LABEL})*(?::[0-9]+)?/)?{_COMPONENT}"
                        rf"(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                        r"(?:@sha256:[0-9a-f]{64})?$")
_IMAGE_FIX = "set kubernetes.image to the image's registry reference, e.g. " \
    "nvcr.io/nvidia/pytorch:25.08-py3"


def image_reference(value: str, field: str = "kubernetes.image") -> str:
    """``value`` (an enroot/pyxis image, or already a registry reference) as the registry
    reference a pod's ``image:`` takes: ``nvcr.io#nvidia/pytorch:25.08-py3`` becomes
    ``nvcr.io/nvidia/pytorch:25.08-py3``. A squashfs file or a node-local image store has no
    pod form and is refused, naming ``field``."""
    text = value
    if text.startswith(("dockerd://", "podman://")):
        raise UsageError(f"{field} {value!r} is an image in one node's local "
                         f"{'Docker daemon' if text.startswith('dockerd') else 'Podman store'}"
                         "; a pod pulls its image from a registry", hint=_IMAGE_FIX)
    text = text.removeprefix("docker://")
    if text.startswith((".", "/")) or text.lower().endswith(_SQUASHFS_SUFFIXES):
        raise UsageError(f"{field} {value!r} is a squashfs file on the cluster (pyxis reads "
                         "it from the node's file system); a pod pulls its image from a "
                         "registry", hint=_IMAGE_FIX)
    digest = ""
    found = _DIGEST.search(text)
    if found:
        text, digest = text[:found.start()], "@" + found.group(1)
    text = text.rsplit("@", 1)[-1]  # enroot's USER@: credentials come from imagePullSecrets
    if "#" in text:
        registry, _, image = text.partition("#")
        if not ("." in registry or ":" in registry or registry == "localhost"):
            raise UsageError(f"{field} {value!r}: registry {registry!r} has no '.' or port, "
                             "so Kubernetes would read it as a Docker Hub namespace",
                             hint=_IMAGE_FIX)
        text = f"{registry}/{image}"
    reference = text + digest
    if not _REFERENCE.match(reference):
        raise UsageError(f"{field} {value!r} gives {reference!r}, which is not an image "
                         "reference (a pod would sit in InvalidImageName)", hint=_IMAGE_FIX)
    return reference


def _resources(config: Any, gpus: bool = True) -> dict:
    limits: dict[str, Any] = {}
    if gpus and config.job.gpus_per_node:
        limits["nvidia.com/gpu"] = config.job.gpus_per_node
    if gpus and config.kubernetes.rdma_resource:
        limits[config.kubernetes.rdma_resource] = config.kubernetes.rdma_per_pod
    return {"limits": limits} if limits else {}


def _slurmfabric(config: Any) -> str:
    """launcher.slurmfabric (a command or absolute path, e.g. on a mounted file system),
    else the image's 'slurmfabric' on its PATH."""
    return config.launcher.slurmfabric or "slurmfabric"


def _worker_command(config: Any, kind: str) -> list[str]:
    """torchrun with one worker per GPU, each through 'slurmfabric launch'. The operators
    of PyTorchJob and TrainJob give torchrun its arguments as PET_* variables; for JobSet
    'slurmfabric env' derives them from the completion index first (k8senv.py)."""
    program = list(config.program.command)
    if not program:
        raise UsageError("program.command is empty", hint="set program.command")
    launcher = config.launcher
    run = [*launcher.torchrun, *launcher.torchrun_args, "--no-python", _slurmfabric(config),
           "launch",
           "--mode", "torchrun", *([] if launcher.bind else ["--no-bind"]), "--", *program]
    if kind == "jobset" and launcher.slurmfabric:  # its path is data: $1, not script text
        return ["/bin/sh", "-c", 'sf=$1; shift; eval "$("$sf" env --no-plan)" && exec "$@"',
                "sh", launcher.slurmfabric, *run]
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
    mounts = _mounts(config)[1]
    if gpus:
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
        mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, *mounts]
    if mounts:
        container["volumeMounts"] = mounts
    return container


# pyxis --container-mounts=SRC[:DST[:FLAGS]]: DST defaults to SRC; SRC is a path, "tmpfs"
# or "umount"; FLAGS are enroot's fstab options joined with '+', e.g. "ro+rprivate", added
# after pyxis's own "x-create=auto,rbind" (NVIDIA/pyxis args.c, parse_mount_option and
# add_mount, @107519944221). Each flag maps to its volumeMount form; any other is refused.
_FLAG_FORMS: dict[str, dict[str, Any]] = {
    "ro": {"readOnly": True},
    "rw": {}, "bind": {}, "rbind": {},  # a volume is a read-write bind mount
    "private": {}, "rprivate": {},  # mountPropagation None, the default
    "slave": {"mountPropagation": "HostToContainer"},
    "rslave": {"mountPropagation": "HostToContainer"},
}


def _mount_flags(item: str, flags: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flag in flags:
        if flag.startswith("x-create="):
            continue  # enroot creates the mount point; the kubelet always does
        if flag not in _FLAG_FORMS:
            raise UsageError(f"program.container_mounts {item!r}: flag {flag!r} has no "
                             "Kubernetes volume form",
                             hint=f"accepted flags: {', '.join(_FLAG_FORMS)}, x-create=...; "
                             "drop it, or give the pod this mount some other way")
        out.update(_FLAG_FORMS[flag])
    return out


def _mounts(config: Any) -> tuple[list[dict], list[dict]]:
    """(pod volumes, container volumeMounts) for ``program.container_mounts``: a
    PersistentVolumeClaim where ``kubernetes.mount_claims`` names one for the mount's
    source, an in-memory emptyDir for pyxis's ``tmpfs``, else a hostPath volume (the same
    path on the node, as pyxis bind-mounts it), unless ``kubernetes.host_path_mounts`` is
    false. A mount is never dropped: what has no volume form is refused."""
    claims = config.kubernetes.mount_claims
    unused = set(claims)
    volumes: list[dict] = []
    mounts: list[dict] = []
    for index, item in enumerate(config.program.container_mounts):
        parts = item.split(":")
        source, target = parts[0], parts[1] if len(parts) > 1 else parts[0]
        name = f"mount-{index}"
        if not target.startswith("/"):
            raise UsageError(f"program.container_mounts {item!r}: the target {target!r} is "
                             "relative; a volumeMount's mountPath is absolute",
                             hint="give the mount an absolute DST")
        flags = [flag for flag in parts[2].split("+") if flag] if len(parts) > 2 else []
        mount = {"name": name, "mountPath": target, **_mount_flags(item, flags)}
        if source in claims:
            unused.discard(source)
            claim, _, sub = claims[source].partition("/")
            volume: dict[str, Any] = {"persistentVolumeClaim": {"claimName": claim}}
            if sub:
                mount["subPath"] = sub
        elif source == "tmpfs":
            volume = {"emptyDir": {"medium": "Memory"}}
        elif not source.startswith("/"):
            raise UsageError(f"program.container_mounts {item!r}: the source {source!r} has "
                             "no volume form (a relative path, or pyxis's 'umount')",
                             hint="give an absolute source path, or drop the mount")
        elif not config.kubernetes.host_path_mounts:
            raise UsageError(f"program.container_mounts {item!r} needs a volume: "
                             "kubernetes.host_path_mounts is false and "
                             f"kubernetes.mount_claims has no claim for {source!r}",
                             hint=f"add kubernetes.mount_claims.\"{source}\" = \"CLAIM\" "
                             "(a PersistentVolumeClaim), or set kubernetes.host_path_mounts "
                             "= true")
        else:
            volume = {"hostPath": {"path": source}}
        volumes.append({"name": name, **volume})
        mounts.append(mount)
    if unused:
        raise UsageError(f"kubernetes.mount_claims: {', '.join(map(repr, sorted(unused)))} is "
                         "not the source of any program.container_mounts entry",
                         hint="use a mount's SRC exactly as program.container_mounts gives "
                         "it, or drop the claim")
    return volumes, mounts


def _health(config: Any) -> list[dict]:
    if not config.kubernetes.health_check:
        return []
    command = [_slurmfabric(config), "health", "check"]
    if config.kubernetes.health_config:
        command += ["--config", config.kubernetes.health_config]
    init = {"name": "slurmfabric-health", "image": _image(config), "command": command,
            "resources": _resources(config),
            "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}
    mounts = _mounts(config)[1]
    if mounts:  # the health config may live on a mounted file system
        init["volumeMounts"] = mounts
    return [init]


def _pod(config: Any, container: dict, extra_env: list[dict] | None = None,
         gpus: bool = True) -> dict:
    if extra_env:
        container = {**container, "env": [*extra_env, *container.get("env", [])]}
    spec: dict[str, Any] = {"containers": [container]}
    volumes = _mounts(config)[0]
    if gpus:
        spec["initContainers"] = _health(config) or None
        volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, *volumes]
    spec["volumes"] = volumes
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


def _deadline(config: Any) -> int | None:
    """job.time as the seconds an operator lets the job run (activeDeadlineSeconds, from the
    job's start, as Slurm counts its time limit); None when unlimited (Slurm reads a limit
    of 0 as none: sbatch(1), --time)."""
    from slurmfabric.config.models import time_limit_seconds

    seconds = time_limit_seconds(config.job.time)
    return seconds if seconds and seconds > 0 else None


def _run_policy(config: Any, **policy: Any) -> dict:
    deadline = _deadline(config)
    return {**policy, **({"activeDeadlineSeconds": deadline} if deadline else {})}


def pytorchjob(config: Any) -> dict:
    nodes, workers = _per_node(config)
    template = _pod(config, _container(config, "pytorch", _worker_command(config,
                                                                         "pytorchjob")))
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "OnFailure",
                                           "template": template}}
    if nodes > 1:
        replicas["Worker"] = {"replicas": nodes - 1, "restartPolicy": "OnFailure",
                              "template": template}
    spec: dict[str, Any] = {"nprocPerNode": str(workers), "pytorchReplicaSpecs": replicas}
    if _deadline(config):
        spec["runPolicy"] = _run_policy(config)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _meta(config),
            "spec": spec}


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
    volumes, mounts = _mounts(config)
    pod["spec"] = {"containers": [{
        "name": "node", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, *mounts]}],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, *volumes]}
    patch = {"manager": "slurmfabric", "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": "node", "template": {"spec": {"template": pod}}}]}}}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": _meta(config),
            "spec": {"runtimeRef": {"name": config.kubernetes.runtime}, "trainer": trainer,
                     "runtimePatches": [patch], **_run_policy(config)}}


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
           "backoffLimit": 0, **_run_policy(config), "template": template}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": _meta(config),
            "spec": {"replicatedJobs": [{"name": "node", "replicas": 1,
                                         "template": {"spec": job}}]}}


# Open MPI starts the ranks on the workers through ssh (mpi-operator v2: the workers run
# sshd), and an ssh session starts from a fresh environment: the launcher pod's variables
# reach a rank only when mpirun exports them, '-x NAME' each ("Export the specified
# environment variables to the remote nodes before executing the program", Open MPI
# mpirun(1), -x). mpirun refuses to run as root, which images commonly are, unless both
# OMPI_ALLOW_RUN_AS_ROOT variables are set, as mpi-operator's nccl-tests example does
# (kubeflow/mpi-operator examples/v2beta1/nccl-tests/nccl-tests.yaml @6dcc0f73e9dc, the
# example proposed for its issue #639, whose launcher runs "mpirun -np N -bind-to none
# -x NCCL_DEBUG .../all_reduce_perf ..." and whose workers hold the GPUs and /dev/shm).
_MPIRUN_AS_ROOT = [{"name": "OMPI_ALLOW_RUN_AS_ROOT", "value": "1"},
                   {"name": "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "value": "1"}]


def _rank_programs(config: Any) -> list[list[str]]:
    """What each MPI rank runs, once per mpirun: the program, or one nccl-tests binary per
    op with the arguments the sbatch script gives it (templates/launch/nccl-tests.sh.j2;
    tests/unit/test_k8smanifest.py holds the two to the same argv)."""
    if config.launcher.type != "nccl-tests":
        return [list(config.program.command)]
    tests = config.launcher.nccl_tests
    where = f"{tests.bin_dir.rstrip('/')}/" if tests.bin_dir else ""
    return [[f"{where}{op}_perf", "--minbytes", tests.min_bytes, "--maxbytes", tests.max_bytes,
             "--stepfactor", str(tests.step_factor), "--ngpus", str(tests.gpus_per_rank),
             "--iters", str(tests.iters), "--warmup_iters", str(tests.warmup_iters),
             "--check", str(tests.check)] for op in tests.ops]


def _mpirun(config: Any, ranks: int, exported: list[str], program: list[str]) -> list[str]:
    """mpirun as the sbatch script runs it (launcher.mpirun_args kept; slurmfabric launch
    binds each rank, so mpirun binds nothing unless mpirun_args say so), with '-x' for
    every variable the ranks need. The hostfile's slots=slotsPerWorker place the ranks, as
    --map-by ppr:N:node does under Slurm."""
    args = list(config.launcher.mpirun_args)
    binds = any(arg.lstrip("-").startswith("bind-to") for arg in args)
    return [config.launcher.mpirun, "-np", str(ranks),
            *([] if binds else ["--bind-to", "none"]),
            *[word for name in exported for word in ("-x", name)], *args,
            _slurmfabric(config), "launch", "--mode", "mpi", "--", *program]


def mpijob(config: Any) -> dict:
    name, (nodes, ranks) = _name(config), _per_node(config)
    # Rank 0 is the first slot of the hostfile's first host, worker 0; the operator gives the
    # workers that DNS name (hostname <job>-worker-0, subdomain <job>: SOURCES.md, 4.2).
    master = [{"name": "MASTER_ADDR", "value": f"{name}-worker-0.{name}"}]
    exported = [item["name"] for item in [*_env(config), *master]]
    runs = [_mpirun(config, nodes * ranks, exported, program)
            for program in _rank_programs(config)]
    command = runs[0] if len(runs) == 1 else \
        ["/bin/sh", "-ec", "\n".join(shlex.join(run) for run in runs)]
    launcher = _pod(config, _container(config, "launcher", command, gpus=False),
                    [*_MPIRUN_AS_ROOT, *master], gpus=False)
    worker = _pod(config, _container(config, "worker", ["/usr/sbin/sshd", "-De"]))
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": _meta(config),
            "spec": {"slotsPerWorker": ranks,
                     "runPolicy": _run_policy(config, cleanPodPolicy="Running"),
                     "mpiReplicaSpecs": {
                         "Launcher": {"replicas": 1, "template": launcher},
                         "Worker": {"replicas": nodes, "template": worker}}}}


BUILDERS = {"pytorchjob": pytorchjob, "trainjob": trainjob, "jobset": jobset,
            "mpijob": mpijob}

# The oldest release of each operator that serves every field its manifest uses, read from
# the operator's own CRD at that tag (the tests validate against tests/fixtures/k8s/crds/):
# - PyTorchJob: spec.nprocPerNode is first in kubeflow/training-operator
#   manifests/base/crds/kubeflow.org_pytorchjobs.yaml at v1.7.0 (5525468b9057), not v1.6.0;
#   Kubeflow Trainer v2 no longer serves PyTorchJob.
# - TrainJob: spec.runtimePatches is first in kubeflow/trainer manifests/base/crds/
#   trainer.kubeflow.org_trainjobs.yaml at v2.2.0 (dc7656ad878f); v2.1.0 has
#   podTemplateOverrides, v2.0.0 podSpecOverrides.
# - JobSet: jobset.x-k8s.io/v1alpha2 is first served by kubernetes-sigs/jobset
#   config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml at v0.2.0 (034c8a2d0a37).
# - MPIJob: kubeflow.org/v2beta1 is first in kubeflow/mpi-operator
#   deploy/v2beta1/mpi-operator.yaml at v0.3.0 (db6930dcd509).
# job.time's activeDeadlineSeconds is served by each of these: runPolicy in PyTorchJob
# v1.7.0 and MPIJob v0.3.0, spec in TrainJob v2.2.0 (not v2.1.0), and batch/v1's JobSpec
# inside a JobSet.
REQUIRES = {
    "pytorchjob": "Kubeflow Training Operator v1, >= v1.7.0 (PyTorchJob kubeflow.org/v1 with "
                  "spec.nprocPerNode)",
    "trainjob": "Kubeflow Trainer >= v2.2.0 (TrainJob trainer.kubeflow.org/v1alpha1 with "
                "spec.runtimePatches)",
    "jobset": "JobSet >= v0.2.0 (jobset.x-k8s.io/v1alpha2)",
    "mpijob": "MPI Operator >= v0.3.0 (MPIJob kubeflow.org/v2beta1)",
}
REQUIRES_ANNOTATION = "slurmfabric/requires"
# Launchers whose ranks are MPI processes: only an MPIJob starts them with mpirun.
_MPI_LAUNCHERS = ("mpirun", "nccl-tests", "srun-pmix")
_KINDS = {"pytorchjob": "PyTorchJob", "trainjob": "TrainJob", "jobset": "JobSet"}


def _check_launcher(config: Any, target: str) -> None:
    """Refuse a launcher that cannot run in the target's pods, pointing at one that can."""
    kind = config.launcher.type
    if target != "mpijob" and kind in _MPI_LAUNCHERS:
        raise UsageError(
            f"launcher.type {kind!r} starts MPI ranks, but a {_KINDS[target]} runs torchrun in "
            "each pod: every worker would be a separate one-rank MPI program",
            hint="render it with --target mpijob (the MPI Operator starts the ranks with "
            "mpirun)")


def warnings(config: Any) -> list[str]:
    """What the manifest renders but cannot carry as the sbatch script would: said, not
    refused, where refusing would stop a config that is otherwise fine for a pod."""
    if config.launcher.signal:
        return [f"launcher.signal ({config.launcher.signal}, {config.launcher.signal_seconds} s "
                "before the time limit) is not carried to Kubernetes: a pod stopped at its "
                "activeDeadlineSeconds gets SIGTERM, then SIGKILL after "
                "terminationGracePeriodSeconds (https://kubernetes.io/docs/concepts/workloads/"
                "pods/pod-lifecycle/#pod-termination); checkpoint on SIGTERM or leave "
                "job.time unset"]
    return []


def build(config: Any, target: str) -> dict:
    if target not in BUILDERS:
        raise UsageError(f"--target {target!r}: use one of {', '.join(TARGETS)}")
    _refuse_components(config)
    _check_launcher(config, target)
    manifest = BUILDERS[target](config)
    _refuse_unhonoured(config, target)
    manifest["metadata"]["annotations"] = {REQUIRES_ANNOTATION: REQUIRES[target]}
    return manifest


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
