"""End to end on the local Slurm testbed: render + submit real jobs through the CLI and check
what every rank reports: its rank, the all-reduce, and the node plan it was given.

Every launcher runs for real, 2 nodes x 2 ranks: torchrun (gloo on CPU), srun-launched
ranks, mpirun, srun --mpi=pmix and nccl-tests (the last three run a small MPI C program
built here; srun-pmix works because the testbed gives every virtual node its own TmpFS,
docs/testbed.md). Each job points SLURMFABRIC_SYSFS_ROOT at a fixture tree
sized to this machine (tests/fixtures/topology/nodes.py testbed_node: two NUMA nodes over
the CPUs that exist here, one GPU and one rail NIC on each), and every rank reports from
inside itself the CPUs it runs on (sched_getaffinity), its memory node, its NIC and its NCCL
variables.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import fakesysfs
import nodes
import pytest
from testbed_cluster import Cluster

from slurmfabric._common.sysfs import parse_cpulist

HERE = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
TIMEOUT = 300  # 4 ranks importing torch on a 2-core machine
CPUS = sorted(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def fixture_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An IB and a RoCE node tree, and the CPUs each local rank must end up on."""
    return {layer: fakesysfs.build(nodes.testbed_node(CPUS, layer),
                                   tmp_path_factory.mktemp(layer.lower()))
            for layer in ("InfiniBand", "Ethernet")}


def numa_cpus(root: Path) -> dict[int, list[int]]:
    base = root / "sys/devices/system/node"
    return {i: parse_cpulist((base / f"node{i}" / "cpulist").read_text()) for i in (0, 1)}


def sets_args(*sets: str) -> list[str]:
    return [arg for item in sets for arg in ("--set", item)]


def submit_and_wait(cluster: Cluster, tmp_path: Path, config_args: list[str]) -> str:
    """`slurmfabric submit` (the CLI, sbatch backend); returns the job's output text."""
    proc = cluster.run(["slurmfabric", "submit", *config_args, "--workdir", str(tmp_path),
                        "--set", f"job.output={tmp_path}/job-%j.out"], check=False)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stdout
    state = cluster.wait(job_id, timeout=TIMEOUT)
    output = (tmp_path / f"job-{job_id}.out").read_text(errors="replace")
    assert state == "COMPLETED", f"job {job_id} ended {state}:\n{output}"
    return output


def rank_records(output: str) -> list[dict]:
    """Every rank's JSON record; found by pattern, since lines of ranks sharing one output
    stream can interleave."""
    return [json.loads(match) for match in re.findall(r'\{"rank": [^{}]*\}', output)]


def check_ranks(records: list[dict], cluster: Cluster, output: str) -> None:
    assert len(records) == 4, output
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3], output
    assert {r["world_size"] for r in records} == {4}
    assert {r["sum"] for r in records} == {1 + 2 + 3 + 4}  # all_reduce of rank+1
    nodes_seen = {r["node"] for r in records}
    assert len(nodes_seen) == 2 and nodes_seen <= set(cluster.nodes), output
    pairs = {(r["node"], r["local_rank"]) for r in records}
    assert len(pairs) == 4, output
    assert {r["local_rank"] for r in records} == {0, 1}


def check_plan(records: list[dict], root: Path, fabric: str, output: str) -> None:
    """Per rank: the CPUs, memory node and NIC of its local rank, the node's NCCL plan."""
    cpus = numa_cpus(root)
    for r in records:
        local = r["local_rank"]
        where = f"rank {r['rank']} (local {local} on {r['node']}): {r}\n{output}"
        assert r["cpus"] == cpus[local], where
        assert r["SLURMFABRIC_MEM_NODE"] == str(local), where
        if fabric == "tcp":
            assert r["NCCL_IB_DISABLE"] == "1", where
            for name in ("NCCL_NET", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "SLURMFABRIC_NIC"):
                assert r[name] is None, (name, where)
            continue
        assert r["SLURMFABRIC_NIC"] == f"mlx5_{local}:1", where  # its GPU's PIX rail
        assert r["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1", where  # no storage NIC mlx5_2
        assert r["NCCL_NET"] == "IB" and r["NCCL_IB_DISABLE"] is None, where
        assert r["NCCL_IB_GID_INDEX"] == ("3" if fabric == "roce" else None), where


def allreduce_sets(launcher: str, root: Path, fabric: str) -> list[str]:
    return [
        f"launcher.type={launcher}",
        f"program.command=[{json.dumps(sys.executable)}, "
        f"{json.dumps(str(REPO / 'examples' / 'allreduce.py'))}]",
        f"program.env.SLURMFABRIC_SYSFS_ROOT={root}", f"fabric.type={fabric}",
    ]


def test_torchrun_workers_get_their_local_ranks_binding(cluster: Cluster, tmp_path: Path,
                                                        fixture_roots: dict[str, Path]) -> None:
    root = fixture_roots["InfiniBand"]
    config = ["-c", str(REPO / "examples" / "smoke-cpu.toml"),
              *sets_args(*allreduce_sets("torchrun", root, "ib"),
                         f"launcher.torchrun={VENV_BIN / 'torchrun'}")]
    output = submit_and_wait(cluster, tmp_path, config)
    records = rank_records(output)
    check_ranks(records, cluster, output)
    check_plan(records, root, "ib", output)


def test_srun_ranks_on_roce_get_the_gid_index(cluster: Cluster, tmp_path: Path,
                                              fixture_roots: dict[str, Path]) -> None:
    root = fixture_roots["Ethernet"]
    config = sets_args(*allreduce_sets("srun", root, "roce"), "job.nodes=2",
                       "job.ntasks_per_node=2", f"job.partition={cluster.partition}",
                       "job.time=5", "program.env.OMP_NUM_THREADS=1")
    output = submit_and_wait(cluster, tmp_path, config)
    records = rank_records(output)
    check_ranks(records, cluster, output)
    check_plan(records, root, "roce", output)


MPI_PROGRAM = r"""
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void field(char *out, const char *name) {  /* "NAME": "value" or null */
    const char *v = getenv(name);
    char buf[512];
    if (v) snprintf(buf, sizeof buf, ", \"%s\": \"%s\"", name, v);
    else snprintf(buf, sizeof buf, ", \"%s\": null", name);
    strcat(out, buf);
}

int main(int argc, char **argv) {
    int rank, size, value, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    value = rank + 1;
    MPI_Allreduce(&value, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    char out[8192], cpus[2048] = "";
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof set, &set);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) {
            char b[16];
            snprintf(b, sizeof b, "%s%d", cpus[0] ? ", " : "", c);
            strcat(cpus, b);
        }
    const char *node = getenv("SLURMD_NODENAME"), *local = getenv("LOCAL_RANK");
    const char *env_rank = getenv("RANK");
    snprintf(out, sizeof out,
             "{\"rank\": %d, \"env_rank\": %s, \"local_rank\": %s, \"world_size\": %d, "
             "\"sum\": %d, \"node\": \"%s\", \"cpus\": [%s], \"args\": \"",
             rank, env_rank ? env_rank : "-1", local ? local : "-1", size, sum,
             node ? node : "?", cpus);
    for (int i = 1; i < argc; i++) {
        strcat(out, argv[i]);
        if (i + 1 < argc) strcat(out, " ");
    }
    strcat(out, "\"");
    const char *names[] = {"SLURMFABRIC_NIC", "SLURMFABRIC_MEM_NODE", "NCCL_NET", "NCCL_IB_HCA",
                           "NCCL_IB_GID_INDEX", "NCCL_IB_DISABLE", NULL};
    for (int i = 0; names[i]; i++) field(out, names[i]);
    strcat(out, "}\n");
    fputs(out, stdout);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
"""


@pytest.fixture(scope="module")
def mpi_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MPI all-reduce probe, also installed as bin/all_reduce_perf for nccl-tests."""
    return build_mpi_probe(tmp_path_factory.mktemp("mpi"))


def build_mpi_probe(base: Path) -> Path:
    """Compile the probe into ``base`` (also as bin/all_reduce_perf); shared with the other
    cluster test files."""
    assert shutil.which("mpicc"), "mpicc missing: apt-get install libopenmpi-dev openmpi-bin"
    source = base / "allreduce.c"
    source.write_text(MPI_PROGRAM)
    binary = base / "allreduce"
    subprocess.run(["mpicc", "-O1", "-o", str(binary), str(source)], check=True)
    (base / "bin").mkdir()
    shutil.copy(binary, base / "bin" / "all_reduce_perf")
    return binary


def mpi_sets(cluster: Cluster, root: Path, fabric: str) -> list[str]:
    # Open MPI's shared-memory transport segfaults across virtual nodes of one host, and
    # OpenMPI refuses to run as root (jobs run as root here) without these two variables.
    # The TCP transport stays on loopback, where every virtual node is: over the host's own
    # NIC, Open MPI 4.1's non-blocking connect() sometimes failed with EINPROGRESS and the
    # rank segfaulted (a CI run, srun --mpi=pmix: "connect() to 192.0.2.2:1029 failed").
    return sets_args("job.nodes=2", "job.ntasks_per_node=2",
                     f"job.partition={cluster.partition}", "job.time=5",
                     "program.env.OMPI_MCA_btl=self,tcp",
                     "program.env.OMPI_MCA_btl_tcp_if_include=lo",
                     "program.env.OMPI_ALLOW_RUN_AS_ROOT=1",
                     "program.env.OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                     f"program.env.SLURMFABRIC_SYSFS_ROOT={root}", f"fabric.type={fabric}")


@pytest.mark.parametrize(("launcher", "fabric"), [("mpirun", "auto"), ("srun-pmix", "tcp")])
def test_mpi_ranks_go_through_launch(cluster: Cluster, tmp_path: Path, mpi_binary: Path,
                                     fixture_roots: dict[str, Path], launcher: str,
                                     fabric: str) -> None:
    # mpirun: the ranks' Slurm variables are those of Open MPI's daemon step, so launch
    # --mode mpi must read OMPI_COMM_WORLD_*. srun --mpi=pmix: the ranks are Slurm tasks and
    # MPI_Init gets the world from each node's slurmstepd PMIx server. tcp on an IB node:
    # no IB variable reaches the rank, the CPU binding still does.
    root = fixture_roots["InfiniBand"]
    config = [*sets_args(f"launcher.type={launcher}",
                         f"program.command=[{json.dumps(str(mpi_binary))}]"),
              *mpi_sets(cluster, root, fabric)]
    output = submit_and_wait(cluster, tmp_path, config)
    records = rank_records(output)
    check_ranks(records, cluster, output)
    assert all(r["env_rank"] == r["rank"] for r in records), output  # launch's RANK = MPI's
    check_plan(records, root, "ib" if fabric == "auto" else fabric, output)


def test_nccl_tests_run_one_rank_per_gpu_through_launch(cluster: Cluster, tmp_path: Path,
                                                        mpi_binary: Path,
                                                        fixture_roots: dict[str, Path]) -> None:
    # nccl-tests' own binary needs GPUs; the MPI probe stands in for all_reduce_perf, so the
    # rendered srun --mpi line, the per-rank launch and the -g 1 argument run for real.
    root = fixture_roots["InfiniBand"]
    config = ["-c", str(REPO / "examples" / "nccl-tests-sweep.toml"),
              *sets_args("job.gpus_per_node=0", "job.cpus_per_task=1", "job.exclusive=false",
                         f"launcher.nccl_tests.bin_dir={mpi_binary.parent / 'bin'}",
                         "launcher.nccl_tests.mpi=pmix",
                         'launcher.nccl_tests.ops=["all_reduce"]'),
              *mpi_sets(cluster, root, "ib")]
    output = submit_and_wait(cluster, tmp_path, config)
    records = rank_records(output)
    check_ranks(records, cluster, output)
    assert {r["args"] for r in records} == {
        "--minbytes 8 --maxbytes 8G --stepfactor 2 --ngpus 1 --iters 20 --warmup_iters 5 "
        "--check 1"}, output
    check_plan(records, root, "ib", output)


def test_bad_config_exits_2_with_one_line_per_problem(cluster: Cluster, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[job]\npartition = "debug"\nnodez = 2\nnodes = -1\ntime = "forever"\n'
                   '[launcher]\ntype = "srun"\n[program]\ncommand = ["true"]\n')
    proc = cluster.run(["slurmfabric", "submit", "-c", str(bad)], check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines()
              if line.startswith("slurmfabric: error: ")]
    assert len(errors) == 3, proc.stderr
    text = "\n".join(errors)
    assert "job.nodez: unknown field; accepted fields here: name, partition" in text
    assert "job.nodes: got -1; accepted: a number >= 1" in text
    assert "job.time: time limit 'forever' is not a form Slurm accepts" in text


def test_readme_submit_commands_run_as_written(cluster: Cluster, tmp_path: Path) -> None:
    """docs/launch.md: ``submit -c job.toml --test-only`` gets Slurm's verdict and starts no
    job; ``submit -c examples/smoke-cpu.toml --wait`` prints the job id, then the job's line
    and its output, and exits 0 (the README's main job, as the demo runs it)."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    shutil.copy(REPO / "examples" / "smoke-cpu.toml", tmp_path / "job.toml")
    before = cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split()
    verdict = cluster.run(["slurmfabric", "submit", "-c", "job.toml", "--test-only"],
                          check=False, cwd=tmp_path)
    assert verdict.returncode == 0, verdict.stderr
    assert re.search(r"Job \d+ to start at ", verdict.stdout), verdict.stdout
    assert cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split() == before

    proc = cluster.run(["slurmfabric", "submit", "-c", "examples/smoke-cpu.toml", "--wait"],
                       check=False, cwd=tmp_path, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id, status, *output = proc.stdout.splitlines()
    assert job_id.isdigit()
    assert status.startswith(f"job {job_id} COMPLETED (exit 0:0); output: ")
    assert status.endswith(f"{tmp_path}/smoke-cpu-{job_id}.out")
    records = rank_records("\n".join(output))
    check_ranks(records, cluster, proc.stdout)
    # the flight recorder's names are the ones torch 2.13 reads: no rank warns (issue 42)
    assert "TORCH_FR_BUFFER_SIZE" in (REPO / "tests" / "golden" / "smoke-cpu.sh").read_text()
    assert "is deprecated; use TORCH_FR_" not in proc.stdout + proc.stderr
