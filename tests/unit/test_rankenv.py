"""slurmfabric.rank.env: a pure function of an environment mapping (no Slurm needed)."""

from __future__ import annotations

import pytest

from slurmfabric.errors import RankEnvError
from slurmfabric.rank import env as rankenv

JOB = {  # the batch shell of a 2-node job (sbatch OUTPUT ENVIRONMENT VARIABLES)
    "SLURM_JOB_ID": "1234",
    "SLURM_CLUSTER_NAME": "clu",
    "SLURM_JOB_NODELIST": "gpu[007-008]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURMD_NODENAME": "gpu007",
    "SLURM_TASKS_PER_NODE": "3,1",
}


def task(procid: int, nodeid: int, localid: int, **extra: str) -> dict[str, str]:
    """A task of step 0 with uneven tasks: 3 on gpu007, 1 on gpu008."""
    env = dict(JOB)
    env.update(
        SLURM_STEP_ID="0",
        SLURM_STEP_NODELIST="gpu[007-008]",
        SLURM_STEP_NUM_NODES="2",
        SLURM_STEP_NUM_TASKS="4",
        SLURM_STEP_TASKS_PER_NODE="3,1",
        SLURM_PROCID=str(procid),
        SLURM_NODEID=str(nodeid),
        SLURM_LOCALID=str(localid),
        SLURMD_NODENAME=f"gpu00{7 + nodeid}",
    )
    env.update(extra)
    return env


def test_batch_shell_gets_job_level_values_only():
    r = rankenv.resolve(JOB)
    assert r.scope == "job"
    v = r.variables()
    assert set(v) == {"NNODES", "MASTER_ADDR", "MASTER_PORT", "RDZV_ID"}
    assert v["MASTER_ADDR"] == "gpu007" and v["NNODES"] == "2" and v["RDZV_ID"] == "clu-1234"
    assert 20000 <= int(v["MASTER_PORT"]) <= 29999


def test_srun_tasks_with_uneven_tasks_per_node():
    tasks = [task(0, 0, 0), task(1, 0, 1), task(2, 0, 2), task(3, 1, 0)]
    got = [rankenv.resolve(t).variables() for t in tasks]
    assert [g["RANK"] for g in got] == ["0", "1", "2", "3"]
    assert [g["LOCAL_WORLD_SIZE"] for g in got] == ["3", "3", "3", "1"]
    assert [g["NODE_RANK"] for g in got] == ["0", "0", "0", "1"]
    assert {g["WORLD_SIZE"] for g in got} == {"4"}
    assert len({(g["MASTER_ADDR"], g["MASTER_PORT"]) for g in got}) == 1  # all agree


def test_port_differs_by_job_and_step_and_not_like_job_id_mod_10000():
    port = lambda **kw: rankenv.resolve(task(0, 0, 0, **kw)).master_port  # noqa: E731
    base = port()
    # jobs 10,000 apart collide under int(job_id[-4:]) + 15000 schemes; not here
    assert port(SLURM_JOB_ID="11234") != base
    assert port(SLURM_STEP_ID="1") != base
    assert port(SLURM_CLUSTER_NAME="other") != base
    assert port() == base  # stable
    ports = {rankenv.port_for(f"clu/{j}//0", (20000, 29999)) for j in range(1000, 1200)}
    assert len(ports) > 190  # 200 jobs on one node: almost no collisions


def test_port_range_option_and_env():
    r = rankenv.resolve(JOB, port_range=(40000, 40009))
    assert 40000 <= r.master_port <= 40009
    r = rankenv.resolve({**JOB, "SLURMFABRIC_PORT_RANGE": "30000-30000"})
    assert r.master_port == 30000
    for bad in ["abc", "80-90", "30000-20000", "70000"]:
        with pytest.raises(RankEnvError, match="port range"):
            rankenv.parse_port_range(bad)


def test_arrays_get_their_own_rendezvous_id():
    r = rankenv.resolve({**JOB, "SLURM_ARRAY_JOB_ID": "1200", "SLURM_ARRAY_TASK_ID": "34"})
    assert r.rdzv_id == "clu-1200_34"


def test_het_job_components_share_the_step_port():
    # srun --het-group=0,1: every task sees the leader's SLURM_JOB_ID and the same step id
    a = task(0, 0, 0, SLURM_HET_SIZE="2", SLURM_JOB_ID_HET_GROUP_0="1234")
    b = task(3, 1, 0, SLURM_HET_SIZE="2", SLURM_JOB_ID_HET_GROUP_1="1235")
    assert rankenv.resolve(a).master_port == rankenv.resolve(b).master_port


def test_master_addr_from_step_nodelist_without_expanding():
    huge = "n[00001-65536],m[1-65536]"  # first() reads only the first item
    env = task(0, 0, 0, SLURM_STEP_NODELIST=huge)
    env["SLURM_STEP_NUM_NODES"] = "2"
    assert rankenv.resolve(env).master_addr == "n00001"


@pytest.mark.parametrize(("policy", "expected"), [("plain", "gpu007"), ("suffix:-ib", "gpu007-ib")])
def test_address_policies(policy, expected):
    assert rankenv.resolve(JOB, addr_policy=policy).master_addr == expected


def test_nodeaddr_and_iface_policies_use_the_given_lookups():
    r = rankenv.resolve(JOB, addr_policy="nodeaddr", node_addr={"gpu007": "10.1.0.7"}.get)
    assert r.master_addr == "10.1.0.7"
    r = rankenv.resolve(JOB, addr_policy="iface:ib0", iface_addr=lambda name: "10.2.0.7")
    assert r.master_addr == "10.2.0.7"
    with pytest.raises(RankEnvError, match="only be read on the master node gpu007"):
        rankenv.resolve(task(3, 1, 0), addr_policy="iface:ib0", iface_addr=lambda n: "x")
    with pytest.raises(RankEnvError, match="unknown address policy"):
        rankenv.resolve(JOB, addr_policy="dns")


def test_never_a_loopback_address():
    with pytest.raises(RankEnvError, match="loopback") as info:
        rankenv.resolve(JOB, addr_policy="nodeaddr", node_addr=lambda n: "127.0.1.1")
    assert "--addr-policy" in info.value.hint
    with pytest.raises(RankEnvError, match="loopback"):
        rankenv.resolve({**JOB, "SLURM_JOB_NODELIST": "localhost"})
    allowed = {**JOB, "SLURM_JOB_NODELIST": "localhost", "SLURMFABRIC_ALLOW_LOOPBACK": "1"}
    assert rankenv.resolve(allowed).master_addr == "localhost"


def test_torchrun_mode_one_task_per_node():
    env = task(
        1, 1, 0, SLURM_STEP_TASKS_PER_NODE="1(x2)", SLURM_STEP_NUM_TASKS="2", SLURM_GPUS_ON_NODE="8"
    )
    v = rankenv.resolve(env, mode="torchrun").variables()
    assert v["NODE_RANK"] == "1" and v["NPROC_PER_NODE"] == "8" and "RANK" not in v
    assert v["PET_RDZV_ENDPOINT"] == f"gpu007:{v['MASTER_PORT']}"
    assert v["PET_NNODES"] == "2" and v["PET_RDZV_ID"] == v["RDZV_ID"]


def test_torchrun_mode_refuses_several_tasks_per_node():
    with pytest.raises(RankEnvError, match="one task per node") as info:
        rankenv.resolve(task(0, 0, 0), mode="torchrun")
    assert "--ntasks-per-node=1" in info.value.hint


def test_srun_mode_outside_a_step_is_an_error():
    with pytest.raises(RankEnvError, match="SLURM_STEP_ID"):
        rankenv.resolve(JOB, mode="srun")


def test_batch_step_id_counts_as_the_batch_shell():
    assert rankenv.resolve({**JOB, "SLURM_STEP_ID": "4294967291"}).scope == "job"


def test_under_torchrun_its_values_are_kept():
    env = {
        **task(0, 0, 0),
        "TORCHELASTIC_RUN_ID": "r1",
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "gpu007",
        "MASTER_PORT": "29400",
    }
    r = rankenv.resolve(env)
    assert (r.scope, r.rank, r.local_rank, r.node_rank) == ("worker", 5, 1, 1)
    final, kept = rankenv.with_user_values(r, env)
    assert final["RANK"] == "5" and final["MASTER_PORT"] == "29400" and not kept


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID or SLURM_JOBID is not set"),
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not an integer"),
        ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4 is not below the 4 tasks"),
        ({"SLURM_LOCALID": "3"}, "SLURM_LOCALID=3 but node 0 runs only 3 tasks"),
        ({"SLURM_STEP_TASKS_PER_NODE": "3(x3)"}, "describes 3 nodes but the step has 2"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2,1"}, "adds up to 3 tasks"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 but the step has 2 nodes"),
        ({"SLURM_STEP_NODELIST": "gpu[7-"}, "SLURM_STEP_NODELIST: invalid hostlist"),
    ],
)
def test_missing_or_inconsistent_variables_name_the_variable(change, message):
    env = task(0, 0, 0)
    env.update(change)
    env = {k: v for k, v in env.items() if v}
    with pytest.raises(RankEnvError, match=message.replace("(", r"\(").replace("[", r"\[")):
        rankenv.resolve(env)


def test_user_values_are_kept_unless_override():
    env = {**task(0, 0, 0), "MASTER_PORT": "1234"}
    r = rankenv.resolve(env)
    final, kept = rankenv.with_user_values(r, env)
    assert final["MASTER_PORT"] == "1234" and kept == {"MASTER_PORT": "1234"}
    final, kept = rankenv.with_user_values(r, env, override=True)
    assert final["MASTER_PORT"] == str(r.master_port) and not kept


def test_steps_on_the_batch_node_adopt_its_checked_port_others_hash_their_own():
    # The batch shell checked its port free on gpu007 (ports.py); a step whose first node
    # is gpu007 uses it. A step on other nodes (gpu008 only) cannot rely on that check.
    batch_r = rankenv.resolve(JOB).replace(master_port=20001)  # moved by the check
    batch, _ = rankenv.with_user_values(batch_r, JOB)
    step_env = {**task(0, 0, 0), **batch}  # srun inherits the batch shell's exports
    r = rankenv.resolve(step_env)
    final, kept = rankenv.with_user_values(r, step_env)
    assert not kept and final["MASTER_PORT"] == "20001"
    own = {**step_env, "SLURM_STEP_NODELIST": "gpu008", "SLURM_STEP_NUM_NODES": "1",
           "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1",
           "SLURM_NODEID": "0", "SLURMD_NODENAME": "gpu008"}
    other = rankenv.resolve(own)
    assert other.master_host == "gpu008"
    assert other.master_port == rankenv.port_for("clu/1234//0", rankenv.DEFAULT_PORT_RANGE)
    # values left over from another job are never adopted
    stale = {**step_env, rankenv.MARKER_JOB: "999"}
    assert rankenv.resolve(stale).master_port == rankenv.port_for(
        "clu/1234//0", rankenv.DEFAULT_PORT_RANGE)


def test_stale_values_from_another_job_are_replaced():
    old_env = {**JOB, "SLURM_JOB_ID": "999"}
    old, _ = rankenv.with_user_values(rankenv.resolve(old_env), old_env)
    env = {**JOB, **{k: v for k, v in old.items()}}
    env["SLURM_JOB_ID"] = "1234"
    final, kept = rankenv.with_user_values(rankenv.resolve(env), env)
    assert not kept and final["MASTER_PORT"] == str(rankenv.resolve(JOB).master_port)


def test_iface_address_is_reused_by_steps_on_the_same_master():
    batch_r = rankenv.resolve(JOB, addr_policy="iface:ib0", iface_addr=lambda n: "10.9.0.7")
    batch, _ = rankenv.with_user_values(batch_r, JOB)
    other_node = {**task(3, 1, 0), **batch}  # gpu008 cannot read gpu007's interface
    assert rankenv.resolve(other_node).master_addr == "10.9.0.7"


def test_rankenv_is_frozen():
    r = rankenv.resolve(JOB)
    with pytest.raises(AttributeError, match="frozen"):
        r.master_port = 1  # type: ignore[misc]
    assert r == rankenv.resolve(JOB) and hash(r) == hash(rankenv.resolve(JOB))


def mpi_rank(rank: int, local: int, node: str, family: str = "ompi", **extra: str) -> dict:
    """A rank that Open MPI's mpirun (or Hydra/MVAPICH2) started inside the 2-node job: it
    inherits the launcher daemon's Slurm step variables, which do not describe the rank."""
    env = {**JOB, "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
           "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "gpu008",
           "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1",
           "SLURMD_NODENAME": node}
    names = {
        "ompi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE"),
        "hydra": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
        "mv2": ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
                "MV2_COMM_WORLD_LOCAL_SIZE"),
    }[family]
    env.update(zip(names, (str(rank), "4", str(local), "2")))
    env.update(extra)
    return env


@pytest.mark.parametrize("family", ["ompi", "hydra", "mv2"])
@pytest.mark.parametrize("mode", ["mpi", "auto"])
def test_mpi_ranks_read_the_mpi_variables_not_the_daemon_step(family: str, mode: str):
    batch_r = rankenv.resolve(JOB).replace(master_port=20123)  # the batch shell's checked port
    batch, _ = rankenv.with_user_values(batch_r, JOB)
    ranks = [mpi_rank(r, r % 2, f"gpu00{7 + r // 2}", family, **batch) for r in range(4)]
    got = [rankenv.resolve(env, mode=mode) for env in ranks]
    assert [g.scope for g in got] == ["mpi"] * 4
    assert [(g.rank, g.local_rank, g.node_rank) for g in got] == [
        (0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    assert {(g.world_size, g.local_world_size, g.nnodes) for g in got} == {(4, 2, 2)}
    # every rank agrees on the job's master and the port the batch shell checked
    assert {(g.master_addr, g.master_port) for g in got} == {("gpu007", 20123)}
    v = got[3].variables()
    assert v["RANK"] == "3" and v["LOCAL_RANK"] == "1" and v["NODE_RANK"] == "1"


def test_slurm_pmi2_rank_alone_is_a_slurm_task():
    # srun --mpi=pmi2 sets PMI_RANK but not MPI_LOCALRANKID: Slurm's variables are the ranks
    env = task(3, 1, 0, PMI_RANK="3", PMI_SIZE="4")
    r = rankenv.resolve(env)
    assert r.scope == "task" and r.rank == 3 and r.local_rank == 0


def test_mpi_mode_without_mpi_or_step_is_an_error():
    with pytest.raises(RankEnvError, match="--mode mpi needs MPI rank variables"):
        rankenv.resolve(JOB, mode="mpi")
    bad = mpi_rank(0, 2, "gpu007")  # local rank 2 of a local size of 2
    with pytest.raises(RankEnvError, match="OMPI_COMM_WORLD_LOCAL_RANK=2 is not below"):
        rankenv.resolve(bad, mode="mpi")


@pytest.mark.parametrize("mode", ["torchrun", "auto"])
def test_torchrun_worker_under_mode_torchrun_is_a_worker_with_its_local_rank(mode: str):
    # The template runs each worker as `slurmfabric launch --mode torchrun`; inside, torchrun
    # has set TORCHELASTIC_RUN_ID and the worker's own ranks.
    env = {**task(1, 1, 0), "SLURM_STEP_TASKS_PER_NODE": "1,1", "SLURM_STEP_NUM_TASKS": "2",
           "TORCHELASTIC_RUN_ID": "clu-1234", "MASTER_ADDR": "gpu007", "MASTER_PORT": "20555",
           "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
           "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}
    r = rankenv.resolve(env, mode=mode)
    assert r.scope == "worker"
    assert (r.rank, r.local_rank, r.local_world_size, r.node_rank) == (5, 1, 4, 1)


def test_torchrun_worker_without_group_world_size_counts_nodes_like_torchrun():
    # An older agent or a hand-built worker env: nodes = WORLD_SIZE / LOCAL_WORLD_SIZE
    # (torchrun runs the same nproc_per_node on every node), not 1.
    env = {"TORCHELASTIC_RUN_ID": "slurm-77", "MASTER_ADDR": "10.1.0.2", "MASTER_PORT": "29500",
           "RANK": "13", "LOCAL_RANK": "5", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
    r = rankenv.resolve(env, mode="torchrun")
    assert r.scope == "worker" and r.nnodes == 2
    assert rankenv.resolve({**env, "GROUP_WORLD_SIZE": "3"}, mode="torchrun").nnodes == 3


def test_the_port_hash_is_zlibs_crc32_without_importing_zlib() -> None:
    """rankenv.crc32 replaced zlib.crc32 on the per-rank path: every job keeps its port."""
    import random
    import zlib

    from slurmfabric.rank.env import crc32

    rng = random.Random(35)
    samples = [b"", b"a", b"c/41//0", "clüster/9/1/job".encode()]
    samples += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 90)))
                for _ in range(300)]
    assert [crc32(s) for s in samples] == [zlib.crc32(s) for s in samples]
