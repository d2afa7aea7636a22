"""The rank environment of one Slurm task, as a pure function of its environment.

``resolve(env)`` reads only the mapping it is given (plus, for the ``nodeaddr`` and
``iface:`` address policies, the lookups passed in) and returns a frozen :class:`RankEnv`;
exporting it is a separate step (``slurmfabric env`` / ``slurmfabric launch``). No torch,
no third-party imports: this runs on every rank and must start in milliseconds.

Scopes (``mode="auto"`` picks one; each is a small detector in ``DETECTORS``, tried in order):

* ``task``: inside an ``srun`` step, one task per GPU. RANK=SLURM_PROCID,
  LOCAL_RANK=SLURM_LOCALID, NODE_RANK=SLURM_NODEID, WORLD_SIZE=SLURM_STEP_NUM_TASKS,
  LOCAL_WORLD_SIZE from SLURM_STEP_TASKS_PER_NODE at this node (uneven counts are right).
* ``node``: inside a step with one task per node that will run torchrun
  (``mode="torchrun"``): NODE_RANK, NNODES, NPROC_PER_NODE and torchrun's own ``PET_*``
  variables, so a bare ``torchrun train.py`` joins the right rendezvous.
* ``job``: the batch shell (no SLURM_STEP_ID): job-level values only, so that a script can
  ``eval "$(slurmfabric env)"`` once and pass ``$MASTER_ADDR:$MASTER_PORT`` to torchrun.
* ``worker``: already under torchrun (TORCHELASTIC_RUN_ID set; ``auto`` or ``torchrun``, so
  the template's ``torchrun ... slurmfabric launch --mode torchrun`` worker gets the plan and
  binding of its LOCAL_RANK): torchrun's values are kept.
* ``mpi``: a rank started by an MPI launcher (``mpirun``/``mpiexec``): RANK, LOCAL_RANK and
  the sizes come from the MPI's own variables (Open MPI ``OMPI_COMM_WORLD_*``, MPICH and
  Intel MPI Hydra ``PMI_RANK``/``MPI_LOCALRANKID``, MVAPICH2 ``MV2_COMM_WORLD_*``), because
  the Slurm variables such a rank inherits describe the launcher's daemon step, not the rank.
  Ranks started by ``srun --mpi=pmix|pmi2`` are Slurm tasks: their SLURM_* values are right.

MASTER_ADDR is the first node of the step's node list, found without expanding the list.
MASTER_PORT is a CRC-32 of (cluster, job id, het group, step) folded into a port range
(default 20000-29999), so two jobs sharing a node differ unless the hash collides
(1 in 10,000) — unlike ``job_id % 10000`` schemes, where jobs 10,000 apart always collide.
The batch shell then checks that port on the first node and moves on if another job holds
it (slurmfabric/rank/ports.py); steps and MPI ranks of the same job whose first node is that node
adopt the published port, so a checked port is what the ranks use.
"""

from __future__ import annotations

from slurmfabric._common.record import Record, replace
from slurmfabric.errors import RankEnvError

# slurmfabric.slurm.hostlist is imported where a node list is read, not here: a torchrun
# worker reads none (torchrun's variables are complete), so its start skips two modules.

TYPE_CHECKING = False  # no typing/dataclasses at run time: see RankEnv
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

# 20000-29999: below Linux's ephemeral range (ip_local_port_range 32768-60999), so a
# hashed port never races outgoing connections for the same number; above the
# registered low ports; 10,000 wide. 29500 (torch's default) is inside but only 1 in 10k.
DEFAULT_PORT_RANGE = (20000, 29999)
MARKER = "SLURMFABRIC_ENV_SET"  # "KEY=VALUE ..." that slurmfabric itself exported
MARKER_JOB = "SLURMFABRIC_ENV_JOB"  # the job those values belong to
MODES = ("auto", "srun", "torchrun", "mpi")
# (rank, size, local rank, local size) as each MPI launcher exports them to its ranks:
# Open MPI mpirun/prterun (ompi mpirun(1) "Exported Environment Variables"), MVAPICH2,
# MPICH/Intel MPI Hydra (PMI_RANK/PMI_SIZE, MPI_LOCALRANKID/MPI_LOCALNRANKS).
MPI_VARS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
     "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)
_SPECIAL_STEP_MIN = 0xFFFFFFF0  # batch/extern/interactive steps are numbered up here
class RankEnv(Record):
    """What this task should see; frozen. ``variables()`` gives the names and export order.

    A ``Record`` (slurmfabric/_common/record.py), the one record style of the per-rank path:
    ``import dataclasses`` pulls in ``inspect`` and costs 10+ ms on every rank.
    """

    __slots__ = (
        "scope", "job_id", "step_id", "master_host", "master_addr", "master_port", "rdzv_id",
        "nnodes", "node_rank", "rank", "local_rank", "world_size", "local_world_size",
        "nproc_per_node", "addr_policy", "port_range", "notes",
    )  # fmt: skip
    _defaults = {
        "step_id": None, "node_rank": None, "rank": None, "local_rank": None,
        "world_size": None, "local_world_size": None, "nproc_per_node": None,
        "addr_policy": "plain", "port_range": DEFAULT_PORT_RANGE, "notes": (),
    }  # fmt: skip
    scope: str  # "task", "node", "job", "worker" or "mpi"
    job_id: str
    step_id: str | None
    master_host: str
    master_addr: str
    master_port: int
    rdzv_id: str
    nnodes: int
    node_rank: int | None
    rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    nproc_per_node: int | None
    addr_policy: str
    port_range: tuple[int, int]
    notes: tuple[str, ...]

    def __init__(self, *args: object, **values: object) -> None:
        super().__init__(*args, **values)
        missing = [name for name in self.__slots__ if name not in self._defaults
                   and getattr(self, name) is None]
        if missing:
            raise TypeError(f"RankEnv needs {missing}")

    def replace(self, **changes: object) -> RankEnv:
        """A copy with some fields changed (the record itself is frozen)."""
        return replace(self, **changes)  # type: ignore[return-value]

    def variables(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.scope in ("task", "worker", "mpi"):
            out.update(
                RANK=str(self.rank),
                LOCAL_RANK=str(self.local_rank),
                WORLD_SIZE=str(self.world_size),
                LOCAL_WORLD_SIZE=str(self.local_world_size),
            )
        if self.node_rank is not None:
            out["NODE_RANK"] = str(self.node_rank)
        out.update(
            NNODES=str(self.nnodes),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
            RDZV_ID=self.rdzv_id,
        )
        if self.scope == "node":
            out["NPROC_PER_NODE"] = str(self.nproc_per_node)
            out.update(
                PET_NNODES=out["NNODES"],
                PET_NODE_RANK=out["NODE_RANK"],
                PET_NPROC_PER_NODE=out["NPROC_PER_NODE"],
                PET_RDZV_BACKEND="c10d",
                PET_RDZV_ENDPOINT=f"{self.master_addr}:{self.master_port}",
                PET_RDZV_ID=self.rdzv_id,
            )
        return out


# --- MASTER_ADDR address policies ---------------------------------------------------------
# Which address of the first node the ranks connect to. ``plain`` keeps the node name;
# ``suffix:-ib`` appends a suffix (clusters whose fabric hostnames differ from Slurm's node
# names); ``nodeaddr`` takes NodeAddr from Slurm's node record; ``iface:NAME`` reads the
# IPv4 address of a local interface on the master node. Whatever the policy, ``is_loopback``
# lets the resolver refuse 127.x / ::1 (a rank on another node would connect to itself).
# Kept in this module, not one of its own: every module on the per-rank path costs its
# import machinery (~0.1 ms of each rank's start).

LOOPBACK_HINT = (
    "use --addr-policy suffix:-ib, nodeaddr or iface:NAME to pick a routable address, "
    "or set SLURMFABRIC_ALLOW_LOOPBACK=1 on a single-host test cluster"
)


def is_loopback(addr: str) -> bool:
    lowered = addr.lower()
    return (
        lowered in ("localhost", "::1", "0:0:0:0:0:0:0:1")
        or lowered.startswith("localhost.")
        or lowered.startswith("127.")
        or lowered.startswith("::ffff:127.")
    )


def master_address(
    host: str,
    policy: str,
    env: Mapping[str, str],
    node_addr: Callable[[str], str] | None = None,
    iface_addr: Callable[[str], str] | None = None,
) -> str:
    """Apply an address policy to the first node's name.

    ``plain``: the node name. ``suffix:-ib``: name + suffix (fabric hostnames).
    ``nodeaddr``: NodeAddr from Slurm's node record (one scontrol call).
    ``iface:NAME``: the IPv4 address of interface NAME — readable only on the master node
    itself, so other nodes must inherit it (eval it once in the batch script).
    """
    kind, _, arg = policy.partition(":")
    if kind == "plain" and not arg:
        return host
    if kind == "suffix" and arg:
        return host + arg
    if kind == "nodeaddr" and not arg:
        if node_addr is None:
            from slurmfabric.rank.addr import slurm_node_addr as node_addr
        addr = node_addr(host)
        if not addr:
            raise RankEnvError(f"Slurm's node record of {host} has no NodeAddr")
        return addr
    if kind == "iface" and arg:
        here = env.get("SLURMD_NODENAME")
        if here and here != host:
            raise RankEnvError(
                f"--addr-policy {policy} can only be read on the master node {host}, "
                f"and this is {here}",
                f'run eval "$(slurmfabric env --addr-policy {policy})" in the batch script '
                "(it runs on the first node); steps then reuse that address",
            )
        if iface_addr is None:
            from slurmfabric.rank.addr import interface_ipv4 as iface_addr
        return iface_addr(arg)
    raise RankEnvError(
        f"unknown address policy {policy!r}", "use plain, suffix:SUFFIX, nodeaddr or iface:NAME"
    )


# --- small readers ---------------------------------------------------------------------


def _need(env: Mapping[str, str], *names: str) -> str:
    for name in names:
        value = env.get(name)
        if value:
            return value
    listed = " or ".join(names)
    raise RankEnvError(
        f"{listed} is not set",
        "run this inside a Slurm job (sbatch/salloc/srun); check that --export did not drop "
        "SLURM_* variables",
    )


def _int(env: Mapping[str, str], *names: str) -> int:
    value = _need(env, *names)
    name = next(n for n in names if env.get(n))
    try:
        number = int(value)
    except ValueError:
        raise RankEnvError(f"{name}={value!r} is not an integer") from None
    if number < 0:
        raise RankEnvError(f"{name}={value!r} is negative")
    return number


def parse_port_range(text: str) -> tuple[int, int]:
    lo_text, sep, hi_text = text.partition("-")
    try:
        lo, hi = int(lo_text), int(hi_text if sep else lo_text)
    except ValueError:
        raise RankEnvError(
            f"port range {text!r} is not LOW-HIGH", "for example --port-range 20000-29999"
        ) from None
    if not 1024 <= lo <= hi <= 65535:
        raise RankEnvError(
            f"port range {text!r} must lie within 1024-65535 with LOW <= HIGH",
            "for example --port-range 20000-29999",
        )
    return lo, hi


def crc32(data: bytes) -> int:
    """CRC-32 as zlib.crc32 computes it (ISO-HDLC: reflected polynomial 0xEDB88320, initial
    and final XOR 0xFFFFFFFF), bit by bit: for the few dozen bytes of a port key this is
    ~20 us, where importing zlib (a shared library) costs ~0.4 ms on every rank."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def port_for(key: str, port_range: tuple[int, int]) -> int:
    """Stable across hosts and Python versions (unlike hash()): CRC-32 of the key."""
    lo, hi = port_range
    return lo + crc32(key.encode()) % (hi - lo + 1)


def _marker(env: Mapping[str, str]) -> dict[str, str]:
    pairs = (item.partition("=") for item in env.get(MARKER, "").split())
    return {key: value for key, _, value in pairs if key}


# --- the resolver ----------------------------------------------------------------------


class _Ask(Record):
    """What every detector reads: the environment and the settings resolve() settled.

    ``previous`` is what slurmfabric exported one level up for this same job (else empty).
    """

    __slots__ = ("env", "mode", "policy", "port_range", "previous", "node_addr", "iface_addr")
    env: Mapping[str, str]
    mode: str
    policy: str
    port_range: tuple[int, int]
    previous: dict[str, str]
    node_addr: Callable[[str], str] | None
    iface_addr: Callable[[str], str] | None


def resolve(
    env: Mapping[str, str],
    *,
    mode: str = "auto",
    addr_policy: str | None = None,
    port_range: tuple[int, int] | None = None,
    node_addr: Callable[[str], str] | None = None,
    iface_addr: Callable[[str], str] | None = None,
) -> RankEnv:
    """Compute the rank environment from ``env`` (normally ``os.environ``): the first of
    ``DETECTORS`` that recognises the launch decides (the last one always answers)."""
    if mode not in MODES:
        raise RankEnvError(f"unknown mode {mode!r}", f"choose one of: {', '.join(MODES)}")
    previous = _marker(env)
    same_job = env.get(MARKER_JOB) == env.get("SLURM_JOB_ID")
    policy = (
        addr_policy
        or env.get("SLURMFABRIC_ADDR_POLICY")
        or (previous.get("SLURMFABRIC_ADDR_POLICY") if same_job else None)
        or "plain"
    )
    if port_range is None:
        text = env.get("SLURMFABRIC_PORT_RANGE") or (
            previous.get("SLURMFABRIC_PORT_RANGE") if same_job else None
        )
        port_range = parse_port_range(text) if text else DEFAULT_PORT_RANGE
    ask = _Ask(env=env, mode=mode, policy=policy, port_range=port_range,
               previous=previous if same_job else {}, node_addr=node_addr,
               iface_addr=iface_addr)
    for detect in DETECTORS:
        found = detect(ask)
        if found is not None:
            return found
    raise AssertionError("_slurm_task answers or raises")  # pragma: no cover


# --- the shared master address and port --------------------------------------------------


def _master(ask: _Ask, master_host: str, key: str, *, adopt_published: bool,
            same_policy: bool, look_up: bool = True) -> tuple[str, int]:
    """(MASTER_ADDR, MASTER_PORT) for ``master_host``, for Slurm and MPI alike.

    The port is ``key`` hashed into the range, or (``adopt_published``) the one the batch
    shell checked and published for this master. The address is the one already resolved
    one level up for this master (``same_policy``: only under the same policy), else
    ``master_address`` under the policy (``look_up``), else the host name itself (an MPI
    rank outside Slurm). A loopback address is refused either way.
    """
    previous = ask.previous
    port = port_for(key, ask.port_range)
    if adopt_published:
        port = _published_port(previous, master_host, port)
    if (
        previous.get("MASTER_HOST") == master_host
        and previous.get("MASTER_ADDR")
        and (not same_policy
             or previous.get("SLURMFABRIC_ADDR_POLICY", "plain") == ask.policy)
    ):
        master_addr = previous["MASTER_ADDR"]  # resolved once for this job, e.g. iface:
    elif look_up:
        master_addr = master_address(master_host, ask.policy, ask.env, ask.node_addr,
                                     ask.iface_addr)
    else:
        master_addr = master_host
    _refuse_loopback(master_addr, ask.policy, master_host, ask.env)
    return master_addr, port


def _refuse_loopback(master_addr: str, policy: str, master_host: str,
                     env: Mapping[str, str]) -> None:
    """Other nodes cannot reach a loopback MASTER_ADDR: refuse it unless allowed (testbed)."""
    if is_loopback(master_addr) and env.get("SLURMFABRIC_ALLOW_LOOPBACK") != "1":
        raise RankEnvError(
            f"MASTER_ADDR would be the loopback address {master_addr!r} "
            f"(policy {policy}, first node {master_host})",
            LOOPBACK_HINT,
        )


def _published_port(previous: dict[str, str], master_host: str, port: int) -> int:
    """The port the batch shell checked and published, when this step has its master."""
    text = previous.get("MASTER_PORT", "")
    if previous.get("MASTER_HOST") == master_host and text.isdigit():
        return int(text)
    return port


# --- the detectors, in order -------------------------------------------------------------


def _torchrun_worker(ask: _Ask) -> RankEnv | None:
    """Under torchrun: its RANK/LOCAL_RANK/... are authoritative; we only read them.

    torchrun's agent exports GROUP_WORLD_SIZE (the node count of this rendezvous round); a
    process that lacks it counts nodes as torchrun does, nproc_per_node on every node.
    """
    env = ask.env
    if ask.mode not in ("auto", "torchrun") or not env.get("TORCHELASTIC_RUN_ID"):
        return None
    world_size, local_world = _int(env, "WORLD_SIZE"), _int(env, "LOCAL_WORLD_SIZE")
    if env.get("GROUP_WORLD_SIZE"):
        nnodes = _int(env, "GROUP_WORLD_SIZE")
    else:
        nnodes = -(-world_size // local_world) if local_world > 0 else 1
    return RankEnv(
        scope="worker",
        job_id=env.get("SLURM_JOB_ID", ""),
        step_id=env.get("SLURM_STEP_ID"),
        master_host=_need(env, "MASTER_ADDR"),
        master_addr=_need(env, "MASTER_ADDR"),
        master_port=_int(env, "MASTER_PORT"),
        rdzv_id=env.get("TORCHELASTIC_RUN_ID", ""),
        nnodes=nnodes,
        node_rank=_int(env, "GROUP_RANK") if env.get("GROUP_RANK") else None,
        rank=_int(env, "RANK"),
        local_rank=_int(env, "LOCAL_RANK"),
        world_size=world_size,
        local_world_size=local_world,
        addr_policy=ask.policy,
        port_range=ask.port_range,
        notes=("under torchrun: its rank variables are kept as they are",),
    )


def _mpi_family(env: Mapping[str, str]) -> tuple[str, str, str, str] | None:
    for family in MPI_VARS:
        if env.get(family[0]) and (family[0] != "PMI_RANK" or env.get(family[2])):
            return family  # PMI_RANK alone is Slurm's own pmi2 plugin: a Slurm task
    return None


def _mpi_rank(ask: _Ask) -> RankEnv | None:
    """A rank of an MPI launcher: ranks from the MPI, job-level master from the batch shell."""
    env = ask.env
    family = _mpi_family(env)
    if family is None or ask.mode not in ("auto", "mpi"):
        return None
    rank, world, local, local_world = (_int(env, name) for name in family)
    if rank >= world:
        raise RankEnvError(f"{family[0]}={rank} is not below {family[1]}={world}")
    if local >= local_world:
        raise RankEnvError(f"{family[2]}={local} is not below {family[3]}={local_world}")
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    cluster = env.get("SLURM_CLUSTER_NAME", "")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    here = env.get("SLURMD_NODENAME", "")
    from slurmfabric.slurm import hostlist

    try:
        master_host = ask.previous.get("MASTER_HOST") or (
            hostlist.first(nodelist) if nodelist else _mpi_master(env)
        )
        node_rank = hostlist.index(nodelist, here) if nodelist and here else None
    except hostlist.HostlistError as error:
        raise RankEnvError(f"SLURM_JOB_NODELIST: {error}") from None
    het = env.get("SLURM_HET_JOB_OFFSET", "")
    master_addr, port = _master(ask, master_host, f"{cluster}/{job_id}/{het}/job",
                                adopt_published=True, same_policy=False,
                                look_up=bool(nodelist))
    nnodes_text = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    nnodes = _int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES") if nnodes_text else max(
        1, world // max(local_world, 1))
    return RankEnv(
        scope="mpi",
        job_id=job_id or "mpi",
        step_id=env.get("SLURM_STEP_ID"),
        master_host=master_host,
        master_addr=master_addr,
        master_port=port,
        rdzv_id=_rdzv_id(env, cluster, job_id or "mpi"),
        nnodes=nnodes,
        node_rank=node_rank,
        rank=rank,
        local_rank=local,
        world_size=world,
        local_world_size=local_world,
        addr_policy=ask.policy,
        port_range=ask.port_range,
        notes=(f"MPI rank: ranks from {family[0]} and its family",),
    )


def _mpi_master(env: Mapping[str, str]) -> str:
    """Outside Slurm: MASTER_ADDR, else the MPI Operator's hostfile's first host."""
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    from slurmfabric.rank import k8s as k8senv

    found = k8senv.mpi_master(env)
    if found:
        return found
    raise RankEnvError(
        "an MPI rank outside Slurm with no MASTER_ADDR and no readable hostfile "
        "(OMPI_MCA_orte_default_hostfile, I_MPI_HYDRA_HOST_FILE, HYDRA_HOST_FILE)",
        "pass it from the launcher: mpirun -x MASTER_ADDR=$(head -1 /etc/mpi/hostfile | "
        "cut -d' ' -f1) ...")


def _kubernetes_pod(ask: _Ask) -> RankEnv | None:
    """A training operator's pod, only where there is no Slurm job: Slurm wins."""
    env = ask.env
    if ask.mode != "auto" or env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"):
        return None
    from slurmfabric.rank import k8s as k8senv

    pod = k8senv.resolve(env, ask.policy, ask.port_range)
    return RankEnv(**pod) if pod is not None else None


def _slurm_ids(ask: _Ask) -> tuple[str, str | None]:
    """(job id, step id or None in the batch shell); a mode that needs a step says so."""
    env = ask.env
    job_id = _need(env, "SLURM_JOB_ID", "SLURM_JOBID")
    step_id = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    if step_id and step_id.isdigit() and int(step_id) >= _SPECIAL_STEP_MIN:
        step_id = None  # the batch or interactive step behaves like the batch shell
    if ask.mode == "srun" and step_id is None:
        raise RankEnvError(
            "--mode srun needs an srun step, but SLURM_STEP_ID is not set (batch shell?)",
            "in the batch script run: srun slurmfabric launch -- python train.py",
        )
    if ask.mode == "mpi" and step_id is None:
        raise RankEnvError(
            "--mode mpi needs MPI rank variables (OMPI_COMM_WORLD_RANK, PMI_RANK with "
            "MPI_LOCALRANKID, MV2_COMM_WORLD_RANK) or an srun step, but neither is set",
            "in the batch script run: srun slurmfabric launch -- python train.py, or "
            "mpirun slurmfabric launch --mode mpi -- ./app",
        )
    return job_id, step_id


def _slurm_common(ask: _Ask, job_id: str, step_id: str | None) -> dict[str, object]:
    """The RankEnv fields every Slurm scope shares: ids, master and port, rendezvous id.

    The batch shell (no step) takes its master from the job's node list, a step from its
    own; the port is the step's, and a step adopts the one the batch shell published.
    """
    env = ask.env
    in_step = step_id is not None
    nodelist_var = next(
        (
            n
            for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
            if env.get(n) and (in_step or n != "SLURM_STEP_NODELIST")
        ),
        None,
    )
    if nodelist_var is None:
        _need(env, "SLURM_STEP_NODELIST" if in_step else "SLURM_JOB_NODELIST")
    nodelist = env[nodelist_var]
    from slurmfabric.slurm import hostlist

    try:
        master_host = hostlist.first(nodelist)
    except hostlist.HostlistError as error:
        raise RankEnvError(f"{nodelist_var}: {error}") from None
    cluster = env.get("SLURM_CLUSTER_NAME", "")
    # The het group slot stays empty for steps: Slurm numbers steps once per het job
    # (srun --het-group=0 makes step 1721.1 and no 1722.1), so the leader's job id and the
    # step id already name one step, and a step spanning components must agree on it.
    het = "" if in_step else env.get("SLURM_HET_JOB_OFFSET", "")
    master_addr, port = _master(ask, master_host, f"{cluster}/{job_id}/{het}/{step_id or 'job'}",
                                adopt_published=in_step, same_policy=True)
    return dict(
        job_id=job_id,
        step_id=step_id,
        master_host=master_host,
        master_addr=master_addr,
        master_port=port,
        rdzv_id=_rdzv_id(env, cluster, job_id),
        addr_policy=ask.policy,
        port_range=ask.port_range,
    )


def _slurm_job(ask: _Ask) -> RankEnv | None:
    """The batch shell (no step): job-level values only."""
    job_id, step_id = _slurm_ids(ask)
    if step_id is not None:
        return None
    common = _slurm_common(ask, job_id, None)
    return RankEnv(scope="job", nnodes=_job_nodes(ask.env), **common)


def _job_nodes(env: Mapping[str, str]) -> int:
    """The job's nodes. In a heterogeneous job's batch shell SLURM_JOB_NUM_NODES counts
    component 0 alone; SLURM_HET_SIZE components each give SLURM_JOB_NUM_NODES_HET_GROUP_<n>
    (https://slurm.schedmd.com/heterogeneous_jobs.html, "Environment Variables"), and a
    step over them all (srun --het-group) has their total."""
    size = env.get("SLURM_HET_SIZE", "")
    if size.isdigit() and int(size) > 1:
        return sum(_int(env, f"SLURM_JOB_NUM_NODES_HET_GROUP_{n}") for n in range(int(size)))
    return _int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")


class _Layout(Record):
    """How a step's tasks lie on its nodes, checked against each other."""

    __slots__ = ("nnodes", "node_rank", "world", "per_node_var", "per_node", "counts")
    nnodes: int
    node_rank: int
    world: int
    per_node_var: str
    per_node: str
    counts: list[int]

    @property
    def local_world(self) -> int:
        return self.counts[self.node_rank]


def _step_layout(env: Mapping[str, str]) -> _Layout:
    nnodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    node_rank = _int(env, "SLURM_NODEID")
    world = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    per_node_var = (
        "SLURM_STEP_TASKS_PER_NODE"
        if env.get("SLURM_STEP_TASKS_PER_NODE")
        else ("SLURM_TASKS_PER_NODE")
    )
    per_node = _need(env, per_node_var)
    counts = _counts(per_node_var, per_node)
    if len(counts) != nnodes:
        raise RankEnvError(
            f"{per_node_var}={per_node!r} describes {len(counts)} nodes but the step has {nnodes}",
            "do not mix job-level and step-level variables (was --export used?)",
        )
    if node_rank >= nnodes:
        raise RankEnvError(f"SLURM_NODEID={node_rank} but the step has {nnodes} nodes")
    return _Layout(nnodes, node_rank, world, per_node_var, per_node, counts)


def _slurm_node(ask: _Ask) -> RankEnv | None:
    """A step with one task per node that will start torchrun (``mode="torchrun"``)."""
    if ask.mode != "torchrun":
        return None
    job_id, step_id = _slurm_ids(ask)
    common = _slurm_common(ask, job_id, step_id)
    layout = _step_layout(ask.env)
    if layout.local_world != 1:
        raise RankEnvError(
            f"--mode torchrun needs one task per node, but this node runs "
            f"{layout.local_world} tasks ({layout.per_node_var}={layout.per_node}); each "
            "would start its own torchrun",
            "use srun --ntasks-per-node=1 for torchrun, or --mode srun for one task per GPU",
        )
    return RankEnv(
        scope="node",
        nnodes=layout.nnodes,
        node_rank=layout.node_rank,
        nproc_per_node=_gpus_on_node(ask.env),
        **common,
    )


def _slurm_task(ask: _Ask) -> RankEnv:
    """One task of an srun step, one task per GPU."""
    env = ask.env
    job_id, step_id = _slurm_ids(ask)
    common = _slurm_common(ask, job_id, step_id)
    layout = _step_layout(env)
    rank = _int(env, "SLURM_PROCID")
    local_rank = _int(env, "SLURM_LOCALID")
    world, local_world = layout.world, layout.local_world
    if sum(layout.counts) != world:
        raise RankEnvError(
            f"{layout.per_node_var}={layout.per_node!r} adds up to {sum(layout.counts)} "
            f"tasks but SLURM_STEP_NUM_TASKS/SLURM_NTASKS says {world}"
        )
    if rank >= world:
        raise RankEnvError(f"SLURM_PROCID={rank} is not below the {world} tasks of the step")
    if local_rank >= local_world:
        raise RankEnvError(
            f"SLURM_LOCALID={local_rank} but node {layout.node_rank} runs only {local_world} "
            "tasks"
        )
    return RankEnv(
        scope="task",
        nnodes=layout.nnodes,
        node_rank=layout.node_rank,
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        **common,
    )


# Tried in this order by resolve(); the first that answers decides. A torchrun worker
# keeps torchrun's values even inside Slurm; an MPI rank's Slurm variables describe the
# launcher's daemon step, not the rank; a pod is only a pod where there is no Slurm job.
DETECTORS: tuple[Callable[[_Ask], RankEnv | None], ...] = (
    _torchrun_worker, _mpi_rank, _kubernetes_pod, _slurm_job, _slurm_node, _slurm_task,
)


def _counts(name: str, spec: str) -> list[int]:
    from slurmfabric.slurm import hostlist

    try:
        return hostlist.expand_counts(spec)
    except Exception as error:  # UsageError from the parser: say which variable
        raise RankEnvError(f"{name}: {error}") from None


def _rdzv_id(env: Mapping[str, str], cluster: str, job_id: str) -> str:
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    tag = f"{array_job}_{array_task}" if array_job and array_task else job_id
    return f"{cluster or 'slurm'}-{tag}"


def _gpus_on_node(env: Mapping[str, str]) -> int:
    """torchrun's --nproc-per-node: Slurm's GPU count, else CUDA_VISIBLE_DEVICES, else 1."""
    gpus = env.get("SLURM_GPUS_ON_NODE", "")
    if gpus.isdigit() and int(gpus) > 0:
        return int(gpus)
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return len(visible) or 1


# --- exporting -------------------------------------------------------------------------


def with_user_values(
    rank_env: RankEnv, env: Mapping[str, str], override: bool = False
) -> tuple[dict[str, str], dict[str, str]]:
    """(variables to export, variables kept because the user set them differently).

    A value counts as the user's unless slurmfabric exported exactly that value before
    (recorded in SLURMFABRIC_ENV_SET): values we set in the batch shell are recomputed
    per step, values left over from another job are replaced, a user's own are kept.
    The result carries the marker variables for the next level down.
    """
    previous = _marker(env)
    final: dict[str, str] = {}
    kept: dict[str, str] = {}
    for key, value in rank_env.variables().items():
        current = env.get(key)
        if current is None or current == value or override or previous.get(key) == current:
            final[key] = value
        elif rank_env.scope == "worker":
            final[key] = current
        else:
            final[key] = current
            kept[key] = current
    ours = {k: v for k, v in final.items() if k not in kept}
    ours["MASTER_HOST"] = rank_env.master_host
    if rank_env.addr_policy != "plain":
        ours["SLURMFABRIC_ADDR_POLICY"] = rank_env.addr_policy
    if rank_env.port_range != DEFAULT_PORT_RANGE:
        ours["SLURMFABRIC_PORT_RANGE"] = "{}-{}".format(*rank_env.port_range)
    final[MARKER] = " ".join(f"{k}={v}" for k, v in ours.items()
                             if v and not any(c.isspace() for c in v))
    final[MARKER_JOB] = rank_env.job_id
    return final, kept
