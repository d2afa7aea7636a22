"""The rank environment inside a Kubernetes training pod, from what its operator set.

rankenv.resolve() asks here only when there is no Slurm job (SLURM_JOB_ID unset: Slurm
wins when both are present). Detection order, first match wins, each one explained in the
RankEnv's notes (tests/fixtures/k8s/ holds each operator's environment with its source):

1. LeaderWorkerSet (kubernetes-sigs/lws, pkg/utils/pod): ``LWS_LEADER_ADDRESS``,
   ``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX`` (leader 0): one group is one torch job, a pod
   is a node; the port is ``MASTER_PORT`` if the manifest sets it, else torch's 29500.
2. Kubeflow Trainer v2 TrainJob (kubeflow/trainer torch plugin): ``PET_NNODES``,
   ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (the Indexed Job's completion index),
   ``PET_MASTER_ADDR`` (``<job>-node-0-0.<job>``), ``PET_MASTER_PORT`` (29500), no RANK:
   the pod is a node that runs torchrun.
3. Kubeflow Training Operator v1 PyTorchJob (pkg/controller.v1/pytorch/envvar.go):
   ``MASTER_ADDR`` (``<job>-master-0``), ``MASTER_PORT``, ``RANK`` (the pod's replica rank:
   Master 0, Worker-i i+1), ``WORLD_SIZE`` (replicas x nprocPerNode, the default "auto"
   counting 1), ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_NNODES``. With one process
   per pod the pod is a rank; with nprocPerNode > 1 it is a node that runs torchrun.
4. An Indexed Job or JobSet pod (JobSet injects no variables, only Kubernetes'
   ``JOB_COMPLETION_INDEX``): a node whose rank is that index, when the manifest gives
   ``MASTER_ADDR`` and ``NNODES`` (slurmfabric's rendered manifests do); else a clear error.

The MPI Operator's ranks are MPI ranks (rankenv's ``mpi`` scope). Open MPI starts them on
the workers over ssh, with a fresh environment, so they see only what mpirun exports; a
rendered MPIJob exports ``MASTER_ADDR`` (worker 0) with the NCCL and slurmfabric variables
(``-x``, job/k8s.py). Without it the master is the first host of the launcher's hostfile
(``mpi_master``), which only the launcher mounts.
"""

from __future__ import annotations

from slurmfabric.errors import RankEnvError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

TORCH_DEFAULT_PORT = 29500  # torch.distributed's default MASTER_PORT (and Trainer v2's)
HOSTFILE_VARS = ("OMPI_MCA_orte_default_hostfile", "I_MPI_HYDRA_HOST_FILE", "HYDRA_HOST_FILE")


def _int(env: Mapping[str, str], name: str, low: int = 0) -> int:
    text = env.get(name, "")
    if not text.isdigit() or len(text) > 9 or int(text) < low:
        raise RankEnvError(f"{name}={text!r} is not a whole number >= {low}",
                           "the training operator sets it; check the pod spec's env")
    return int(text)


def _host(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "")
    if not value or len(value) > 253 or any(c.isspace() or c in "/'\"$`\\;" for c in value):
        raise RankEnvError(f"{name}={value!r} is not a host name",
                           "the training operator sets it; check the pod spec's env")
    return value


def _nproc(env: Mapping[str, str], name: str) -> int | None:
    """``PET_NPROC_PER_NODE``: a number, or "auto"/"gpu"/"cpu" (torchrun decides): None."""
    text = env.get(name, "")
    return int(text) if text.isdigit() and 0 < int(text) < 4096 else None


def detect(env: Mapping[str, str]) -> str | None:
    """Which operator made this pod's environment, or None."""
    if env.get("LWS_LEADER_ADDRESS") and env.get("LWS_GROUP_SIZE"):
        return "LeaderWorkerSet"
    if env.get("PET_MASTER_ADDR") and env.get("PET_NNODES") and not env.get("RANK"):
        return "TrainJob"
    if env.get("MASTER_ADDR") and env.get("RANK") and env.get("WORLD_SIZE"):
        return "PyTorchJob"
    if env.get("JOB_COMPLETION_INDEX"):
        return "Indexed Job"
    return None


def resolve(env: Mapping[str, str], policy: str,
            port_range: tuple[int, int]) -> dict | None:
    """The fields of this pod's RankEnv (rankenv builds it: this module sits below it), or
    None when no operator's variables are there."""
    kind = detect(env)
    if kind is None:
        return None
    common = {"job_id": env.get("HOSTNAME", "pod"), "step_id": None,
              "addr_policy": policy, "port_range": port_range}
    if kind == "LeaderWorkerSet":
        master = _host(env, "LWS_LEADER_ADDRESS")
        nnodes, node_rank = _int(env, "LWS_GROUP_SIZE", 1), _int(env, "LWS_WORKER_INDEX")
        port = _int(env, "MASTER_PORT", 1) if env.get("MASTER_PORT") else TORCH_DEFAULT_PORT
        note = ("Kubernetes LeaderWorkerSet: LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, "
                f"LWS_WORKER_INDEX (port {port}"
                + ("" if env.get("MASTER_PORT") else ": torch's default") + ")")
        nproc = _nproc(env, "NPROC_PER_NODE") or _gpus(env)
    elif kind == "TrainJob":
        master, port = _host(env, "PET_MASTER_ADDR"), _int(env, "PET_MASTER_PORT", 1)
        nnodes, node_rank = _int(env, "PET_NNODES", 1), _int(env, "PET_NODE_RANK")
        nproc = _nproc(env, "PET_NPROC_PER_NODE") or _gpus(env)
        note = "Kubeflow TrainJob: PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT"
    elif kind == "PyTorchJob":
        master, port = _host(env, "MASTER_ADDR"), _int(env, "MASTER_PORT", 1)
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE", 1)
        nproc = _nproc(env, "PET_NPROC_PER_NODE")
        note = "Kubeflow PyTorchJob: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE"
        if not nproc or nproc == 1:  # one process per pod: the pod is a rank
            if rank >= world:
                raise RankEnvError(f"RANK={rank} is not below WORLD_SIZE={world}")
            return dict(scope="task", master_host=master, master_addr=master,
                           master_port=port, rdzv_id=f"k8s-{master}", nnodes=world,
                           node_rank=rank, rank=rank, local_rank=0, world_size=world,
                           local_world_size=1, nproc_per_node=1,
                           notes=(note + "; one process per pod",), **common)
        nnodes = _int(env, "PET_NNODES", 1) if env.get("PET_NNODES", "").isdigit() \
            else max(1, world // nproc)
        node_rank = _int(env, "PET_NODE_RANK") if env.get("PET_NODE_RANK") else rank
    else:
        if not env.get("MASTER_ADDR") or not env.get("NNODES"):
            raise RankEnvError(
                "an Indexed Job / JobSet pod (JOB_COMPLETION_INDEX is set) without "
                "MASTER_ADDR and NNODES: JobSet injects no rank variables",
                "set MASTER_ADDR to the first pod's name (<jobset>-<job>-0-0.<subdomain>) "
                "and NNODES in the manifest (slurmfabric render --target jobset does)")
        master = _host(env, "MASTER_ADDR")
        port = _int(env, "MASTER_PORT", 1) if env.get("MASTER_PORT") else TORCH_DEFAULT_PORT
        nnodes, node_rank = _int(env, "NNODES", 1), _int(env, "JOB_COMPLETION_INDEX")
        nproc = _nproc(env, "NPROC_PER_NODE") or _gpus(env)
        note = "Kubernetes Indexed Job / JobSet: JOB_COMPLETION_INDEX, MASTER_ADDR, NNODES"
    if node_rank >= nnodes:
        raise RankEnvError(f"{kind}: node rank {node_rank} is not below the node count "
                           f"{nnodes}")
    return dict(scope="node", master_host=master, master_addr=master, master_port=port,
                   rdzv_id=f"k8s-{master}", nnodes=nnodes, node_rank=node_rank,
                   nproc_per_node=nproc, notes=(note + "; the pod is a node (torchrun)",),
                   **common)


def _gpus(env: Mapping[str, str]) -> int:
    visible = [d for d in env.get("NVIDIA_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES",
                                                                      "")).split(",")
               if d.strip() and d.strip() not in ("all", "none", "void")]
    return len(visible) or 1


def mpi_master(env: Mapping[str, str]) -> str | None:
    """The MPI Operator's first host: the first line of the launcher's hostfile
    (``<job>-worker-0.<job>.<ns>.svc slots=N`` for Open MPI, ``host:N`` for Intel MPI and
    MPICH; kubeflow/mpi-operator mpi_job_controller.go). None where it cannot be read
    (the worker pods do not mount it)."""
    for name in HOSTFILE_VARS:
        path = env.get(name)
        if not path:
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                for line in handle.read(1 << 20).splitlines():
                    line = line.split("#", 1)[0].strip()
                    if line:
                        return line.split()[0].split(":")[0]
        except OSError:
            return None
    return None


CAP_IPC_LOCK = 14  # linux/capability.h


def locked_memory_problem(status_text: str | None = None,
                          memlock: int | None = None) -> str | None:
    """Why RDMA cannot register memory in this container, or None.

    Verbs pin the buffers NCCL registers; a process may lock memory beyond its
    RLIMIT_MEMLOCK only with CAP_IPC_LOCK (mlock(2)). Container runtimes give neither by
    default (Docker's default capability set leaves IPC_LOCK out; memlock is often 64 KiB),
    so a pod needs ``securityContext.capabilities.add: ["IPC_LOCK"]`` or an unlimited
    memlock limit. ``status_text`` (/proc/self/status) and ``memlock`` (the soft limit,
    -1 for unlimited) default to this process's."""
    if status_text is None:
        try:
            with open("/proc/self/status") as handle:
                status_text = handle.read(65536)
        except OSError:
            return None
    if memlock is None:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
        memlock = -1 if soft == resource.RLIM_INFINITY else soft
    caps = next((line.split(":", 1)[1].strip() for line in status_text.splitlines()
                 if line.startswith("CapEff:")), "")
    try:
        has_lock = bool(int(caps, 16) >> CAP_IPC_LOCK & 1)
    except ValueError:
        return None
    if has_lock or memlock < 0:
        return None
    return (f"RDMA cannot pin memory here: no CAP_IPC_LOCK (CapEff {caps}) and a memlock "
            f"limit of {memlock // 1024} KiB; add securityContext.capabilities.add: "
            '["IPC_LOCK"] to the container (or run it with an unlimited memlock limit)')
