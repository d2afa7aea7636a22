"""Rank environment inside Kubernetes training pods, from each operator's environment as
its own tests and code define it (tests/fixtures/k8s/, each file with its source and
whether it is verbatim or derived for a stated example job; SOURCES.md has the quotes)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cleanenv import clean_env

from slurmfabric.errors import RankEnvError
from slurmfabric.rank.env import resolve

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "k8s"
POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOSTNAME": "pod-0", "PATH": "/usr/bin:/bin"}


def recorded(name: str, **extra: str) -> dict[str, str]:
    """KEY=VALUE lines of a fixture (comments and trailing '# ...' notes dropped)."""
    env = clean_env(**POD)
    for line in (FIX / name).read_text().splitlines():
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        env[key] = value.split("  #")[0].split(" #")[0].rstrip() if "#" in value else value
    env.update(extra)
    return env


def test_pytorchjob_pods_are_ranks_with_the_operators_values() -> None:
    master = resolve(recorded("env_pytorchjob_v1_master.txt"))
    assert (master.scope, master.rank, master.world_size, master.local_rank) == \
        ("task", 0, 3, 0)
    assert (master.master_addr, master.master_port) == ("test-job-master-0", 8080)
    worker = resolve(recorded("env_pytorchjob_v1_worker1.txt"))
    assert (worker.rank, worker.node_rank, worker.nnodes) == (2, 2, 3)
    assert "Kubeflow PyTorchJob" in worker.notes[0]
    # nprocPerNode 4 (the fixture's own note): WORLD_SIZE 12, the pod is a node for torchrun
    node = resolve(recorded("env_pytorchjob_v1_worker1.txt", PET_NPROC_PER_NODE="4",
                            WORLD_SIZE="12"))
    assert (node.scope, node.nnodes, node.node_rank, node.nproc_per_node) == \
        ("node", 3, 2, 4)
    assert node.variables()["PET_RDZV_ENDPOINT"] == "test-job-master-0:8080"


def test_trainjob_lws_and_jobset_pods_are_nodes() -> None:
    trainjob = resolve(recorded("env_trainjob_v2_node.txt", PET_NODE_RANK="7"))
    assert (trainjob.scope, trainjob.nnodes, trainjob.node_rank, trainjob.nproc_per_node) \
        == ("node", 100, 7, 1)
    assert (trainjob.master_addr, trainjob.master_port) == ("alpha-node-0-0.alpha", 29500)
    leader, worker = (resolve(recorded(f"env_lws_{r}.txt")) for r in ("leader", "worker"))
    assert (leader.node_rank, worker.node_rank, worker.nnodes) == (0, 1, 3)
    assert worker.master_addr == "test-sample-0.test-sample.default"
    assert worker.master_port == 29500 and "torch's default" in worker.notes[0]
    # JobSet injects no rank variables: without MASTER_ADDR and NNODES, a clear error
    jobset = recorded("env_jobset_workers_pod1.txt")
    del jobset["MASTER_ADDR"]
    with pytest.raises(RankEnvError, match="JobSet injects no rank variables"):
        resolve(jobset)
    pod = resolve(recorded("env_indexedjob_pod.txt", MASTER_ADDR="indexed-job-0.svc",
                           NNODES="4"))
    assert (pod.node_rank, pod.nnodes, pod.master_port) == (2, 4, 29500)


def test_mpi_operator_ranks_find_their_master_in_the_hostfile(tmp_path) -> None:
    hostfile = tmp_path / "hostfile"
    shutil.copy(FIX / "mpijob_hostfile_openmpi.txt", hostfile)
    rank = dict(recorded("env_mpijob_launcher.txt"), OMPI_COMM_WORLD_RANK="3",
                OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="0",
                OMPI_COMM_WORLD_LOCAL_SIZE="1", OMPI_MCA_orte_default_hostfile=str(hostfile))
    got = resolve(rank)
    assert (got.scope, got.rank, got.world_size) == ("mpi", 3, 4)
    assert got.master_addr == "openmpi-without-slots-launcher.openmpi-without-slots.tenant-a.svc"
    intel = tmp_path / "intel"
    shutil.copy(FIX / "mpijob_hostfile_intel.txt", intel)
    rank_i = dict(recorded("env_mpijob_launcher_intel.txt"), PMI_RANK="1", PMI_SIZE="2",
                  MPI_LOCALRANKID="0", MPI_LOCALNRANKS="1", I_MPI_HYDRA_HOST_FILE=str(intel))
    assert resolve(rank_i).master_addr == "intelmpi-with-slots-worker-0.intelmpi-with-slots" \
        ".project-x.svc"
    worker = dict(recorded("env_mpijob_worker.txt"), OMPI_COMM_WORLD_RANK="1",
                  OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="0",
                  OMPI_COMM_WORLD_LOCAL_SIZE="1")
    with pytest.raises(RankEnvError, match="no readable hostfile"):
        resolve(worker)


def test_slurm_wins_and_hostile_values_are_refused() -> None:
    both = recorded("env_pytorchjob_v1_worker1.txt", SLURM_JOB_ID="77", SLURM_STEP_ID="0",
                    SLURM_PROCID="5", SLURM_LOCALID="1", SLURM_NODEID="2",
                    SLURM_STEP_NODELIST="n[1-4]", SLURM_STEP_NUM_TASKS="8",
                    SLURM_STEP_NUM_NODES="4", SLURM_STEP_TASKS_PER_NODE="2(x4)",
                    SLURM_JOB_NUM_NODES="4", SLURM_TASKS_PER_NODE="2(x4)",
                    SLURMD_NODENAME="n3")
    got = resolve(both)
    assert (got.scope, got.rank, got.world_size, got.master_host) == ("task", 5, 8, "n1")
    for key, value in (("MASTER_ADDR", "$(reboot)"), ("RANK", "9" * 40),
                       ("MASTER_ADDR", "a b"), ("RANK", "7")):
        env = recorded("env_pytorchjob_v1_master.txt", **{key: value})
        with pytest.raises(RankEnvError):
            resolve(env)


def test_slurmfabric_env_in_a_pod_prints_the_rank(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "env", "--no-plan"],
                          env=recorded("env_pytorchjob_v1_worker1.txt"), capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert "export RANK=2\n" in proc.stdout and "export LOCAL_RANK=0\n" in proc.stdout
    assert "export MASTER_ADDR=test-job-master-0\n" in proc.stdout


def test_the_pod_uses_only_the_rdma_devices_it_was_given(tmp_path) -> None:
    """sysfs shows the host's three HCAs; the RDMA device plugin mounted only uverbs1
    (mlx5_1) into the pod's /dev/infiniband: that is the one rail."""
    import fakesysfs
    import nodes

    from slurmfabric.rank import task as taskenv

    root = fakesysfs.build(nodes.testbed_node(sorted(__import__("os").sched_getaffinity(0)),
                                              "InfiniBand"), tmp_path / "pod")
    (root / "dev/infiniband").mkdir(parents=True)
    (root / "dev/infiniband/uverbs1").write_text("")  # a char device in a real pod
    (root / "dev/infiniband/rdma_cm").write_text("")
    env = recorded("env_pytorchjob_v1_worker1.txt", SLURMFABRIC_SYSFS_ROOT=str(root))
    task = taskenv.build(env)
    assert task.variables["NCCL_IB_HCA"] == "=mlx5_1:1"
    excluded = task.plan.rails.excluded["mlx5_0:1"]
    assert "the RDMA device plugin did not allocate it" in excluded


def test_a_container_without_ipc_lock_is_told_what_to_add() -> None:
    """CapEff of Docker's default capability set (docs.docker.com, "Runtime privilege and
    Linux capabilities": CHOWN ... AUDIT_WRITE, no IPC_LOCK) and a 64 KiB memlock limit."""
    from slurmfabric.rank.k8s import locked_memory_problem

    docker = "Name:\tpython\nCapEff:\t00000000a80425fb\n"
    problem = locked_memory_problem(docker, 65536)
    assert problem == ("RDMA cannot pin memory here: no CAP_IPC_LOCK (CapEff 00000000a80425fb) "
                       "and a memlock limit of 64 KiB; add securityContext.capabilities.add: "
                       '["IPC_LOCK"] to the container (or run it with an unlimited memlock '
                       "limit)")
    assert locked_memory_problem("CapEff:\t00000000a80465fb\n", 65536) is None  # + IPC_LOCK
    assert locked_memory_problem(docker, -1) is None  # ulimit -l unlimited


def test_ranks_of_a_rendered_mpijob_agree_on_their_master() -> None:
    """A rank on a worker pod sees only what mpirun exported (ssh starts a fresh session):
    the rendered launcher's -x list carries MASTER_ADDR (worker 0, rank 0's host), so every
    rank, on any worker, gets the same master address and port without the hostfile, which
    the workers do not mount."""
    from slurmfabric.config import load_config
    from slurmfabric.job import k8s as k8smanifest

    repo = Path(__file__).resolve().parents[2]
    config = load_config(str(repo / "examples" / "h100-fsdp.toml"),
                         ["kubernetes.image=nvcr.io#nvidia/pytorch:25.08-py3",
                          "program.modules=[]"], "")
    launcher = k8smanifest.build(config, "mpijob")["spec"]["mpiReplicaSpecs"]["Launcher"][
        "template"]["spec"]["containers"][0]
    values = {e["name"]: e["value"] for e in launcher["env"]}
    command = launcher["command"]
    exported = {command[i + 1]: values[command[i + 1]] for i, word in enumerate(command)
                if word == "-x"}
    got = []
    for rank, local in ((0, 0), (9, 1), (127, 7)):
        env = dict(recorded("env_mpijob_worker.txt"), **exported, SLURMFABRIC_NO_PLAN="1",
                   OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE="128",
                   OMPI_COMM_WORLD_LOCAL_RANK=str(local), OMPI_COMM_WORLD_LOCAL_SIZE="8")
        got.append(resolve(env))
    assert {(r.master_addr, r.master_port) for r in got} == {
        ("llama-fsdp-16n-worker-0.llama-fsdp-16n", got[0].master_port)}
    assert [(r.scope, r.rank, r.world_size, r.nnodes) for r in got] == [
        ("mpi", 0, 128, 16), ("mpi", 9, 128, 16), ("mpi", 127, 128, 16)]
