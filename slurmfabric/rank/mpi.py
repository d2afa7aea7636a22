"""A rank started by an MPI launcher (mpirun/mpiexec): ranks from the MPI's own variables.

The Slurm variables such a rank inherits describe the launcher's daemon step, not the rank
(rank/env.py, scope ``mpi``). Imported by rank/env.py only when an MPI launcher's variables
are there, so srun tasks and torchrun workers never load it.
"""

from __future__ import annotations

from slurmfabric.errors import RankEnvError
from slurmfabric.rank.env import RankEnv, _Ask, _int, _master, _rdzv_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def mpi_rank(ask: _Ask, family: tuple[str, str, str, str]) -> RankEnv:
    """A rank of an MPI launcher: ranks from the MPI, job-level master from the batch shell."""
    env = ask.env
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
