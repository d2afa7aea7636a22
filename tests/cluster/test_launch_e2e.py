"""End to end on the local Slurm testbed: render + submit real jobs through the CLI and check
what every rank reports.

torchrun (gloo on CPU), srun-launched ranks, mpirun and srun --mpi=pmix (a small MPI C
program) run for real, 2 nodes x 2 ranks; srun-pmix works here because the testbed gives
every virtual node its own TmpFS (FACTS section 1). nccl-tests needs GPUs, so it (and, as a
static check, srun-pmix too) is rendered, shellchecked and accepted by `sbatch --test-only`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurmfabric.testbed import Cluster

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
TIMEOUT = 300  # 4 ranks importing torch on a 2-core machine


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


def check_ranks(records: list[dict], cluster: Cluster, output: str,
                local_rank: bool = True) -> None:
    assert len(records) == 4, output
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3], output
    assert {r["world_size"] for r in records} == {4}
    assert {r["sum"] for r in records} == {1 + 2 + 3 + 4}  # all_reduce of rank+1
    nodes = {r["node"] for r in records}
    assert len(nodes) == 2 and nodes <= set(cluster.nodes), output
    if local_rank:
        pairs = {(r["node"], r["local_rank"]) for r in records}
        assert len(pairs) == 4, output
        assert {r["local_rank"] for r in records} == {0, 1}


def allreduce_sets(launcher: str) -> list[str]:
    return [
        f"launcher.type={launcher}",
        f"program.command=[{json.dumps(sys.executable)}, "
        f"{json.dumps(str(REPO / 'examples' / 'allreduce.py'))}]",
    ]


def test_torchrun_cpu_two_nodes_by_two_workers(cluster: Cluster, tmp_path: Path) -> None:
    config = ["-c", str(REPO / "examples" / "smoke-cpu.toml"),
              *sets_args(*allreduce_sets("torchrun"),
                         f"launcher.torchrun={VENV_BIN / 'torchrun'}")]
    output = submit_and_wait(cluster, tmp_path, config)
    check_ranks(rank_records(output), cluster, output)


def test_srun_ranks_two_nodes_by_two_tasks(cluster: Cluster, tmp_path: Path) -> None:
    config = sets_args(*allreduce_sets("srun"), "job.nodes=2", "job.ntasks_per_node=2",
                       f"job.partition={cluster.partition}", "job.time=5",
                       "program.env.OMP_NUM_THREADS=1")
    output = submit_and_wait(cluster, tmp_path, config)
    check_ranks(rank_records(output), cluster, output)


MPI_PROGRAM = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int rank, size, value, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    value = rank + 1;
    MPI_Allreduce(&value, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    const char *node = getenv("SLURMD_NODENAME");
    printf("{\"rank\": %d, \"world_size\": %d, \"sum\": %d, \"node\": \"%s\"}\n",
           rank, size, sum, node ? node : "?");
    MPI_Finalize();
    return 0;
}
"""


def mpi_sets(cluster: Cluster, tmp_path: Path, launcher: str) -> list[str]:
    """Build the MPI program in tmp_path; the config that runs it 2 nodes x 2 ranks."""
    assert shutil.which("mpicc"), "mpicc missing: apt-get install libopenmpi-dev openmpi-bin"
    source = tmp_path / "allreduce.c"
    source.write_text(MPI_PROGRAM)
    binary = tmp_path / "allreduce"
    subprocess.run(["mpicc", "-O1", "-o", str(binary), str(source)], check=True)
    # FACTS section 1: shared memory segfaults across virtual nodes of one host, and
    # OpenMPI refuses to run as root (jobs run as root here) without these two variables.
    return sets_args(f"launcher.type={launcher}",
                     f"program.command=[{json.dumps(str(binary))}]",
                     "job.nodes=2", "job.ntasks_per_node=2",
                     f"job.partition={cluster.partition}", "job.time=5",
                     "program.env.OMPI_MCA_btl=self,tcp",
                     "program.env.OMPI_ALLOW_RUN_AS_ROOT=1",
                     "program.env.OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")


def test_mpirun_two_nodes_by_two_ranks(cluster: Cluster, tmp_path: Path) -> None:
    output = submit_and_wait(cluster, tmp_path, mpi_sets(cluster, tmp_path, "mpirun"))
    records = rank_records(output)
    check_ranks(records, cluster, output, local_rank=False)


def test_srun_pmix_two_nodes_by_two_ranks(cluster: Cluster, tmp_path: Path) -> None:
    # srun --mpi=pmix starts the 4 ranks itself (no mpirun); MPI_Init gets the world from
    # each node's slurmstepd PMIx server. Without one (or with a failed one) each rank is
    # a singleton of world size 1, or the step fails to launch. The testbed gives each
    # virtual node its own TmpFS, where the pmix plugin puts its app dir (FACTS section 1).
    output = submit_and_wait(cluster, tmp_path, mpi_sets(cluster, tmp_path, "srun-pmix"))
    check_ranks(rank_records(output), cluster, output, local_rank=False)


@pytest.mark.parametrize("config_args", [
    ["-c", str(REPO / "examples" / "nccl-tests-sweep.toml"), "--set", "job.gpus_per_node=0",
     "--set", "job.ntasks_per_node=2", "--set", "job.cpus_per_task=1",
     "--set", "job.exclusive=false"],
    sets_args("launcher.type=srun-pmix", "job.ntasks_per_node=2",
              'program.command=["./mpi_app", "--size", "1 MB"]'),
], ids=["nccl-tests", "srun-pmix"])
def test_rendered_and_accepted_by_sbatch_test_only(cluster: Cluster, tmp_path: Path,
                                                   config_args: list[str]) -> None:
    # nccl-tests needs GPUs, which the local testbed lacks (srun-pmix also runs for real
    # above); the partition and node count are the testbed's, and Slurm validates the script.
    local = [*config_args, *sets_args(f"job.partition={cluster.partition}", "job.nodes=2",
                                      "job.time=10")]
    script = tmp_path / "job.sh"
    cluster.run(["slurmfabric", "render", *local, "-o", str(script)])
    lint = subprocess.run(["shellcheck", "--shell=bash", str(script)], capture_output=True,
                          text=True)
    assert lint.returncode == 0, lint.stdout
    proc = cluster.run(["slurmfabric", "submit", "--test-only", *local, "--workdir",
                        str(tmp_path)], check=False)
    assert proc.returncode == 0, proc.stderr
    assert " to start at " in proc.stdout and "sfn" in proc.stdout, proc.stdout


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
