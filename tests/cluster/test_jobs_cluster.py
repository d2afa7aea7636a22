"""slurmfabric jobs on the real testbed, with slurmdbd and MariaDB running: a rank that
exits 7, a rank killed by a signal, a cancelled job, a job slurmctld has forgotten (its
status comes from sacct), and one rank's log followed while the job runs."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from testbed_cluster import Cluster

from slurmfabric.slurm.hostlist import expand

pytestmark = pytest.mark.cluster


def submit(cluster: Cluster, work: Path, script: str, name: str, *sets: str) -> str:
    """A 2-node x 2-task srun job of ``bash -c SCRIPT`` (RANK set by slurmfabric launch),
    one output file per rank."""
    args = ["slurmfabric", "submit", "--set", "launcher.type=srun", "--set", "job.nodes=2",
            "--set", "job.ntasks_per_node=2", "--set", f"job.name={name}", "--set",
            "job.partition=debug", "--set", "fabric.type=tcp", "--set",
            f"job.output={work}/{name}-%j.out", "--set",
            f"launcher.task_output={work}/{name}-%j-%t.out", "--set",
            f"program.command={json.dumps(['bash', '-c', script])}"]
    for item in sets:
        args += ["--set", item]
    proc = cluster.run(args, cwd=work)
    return proc.stdout.strip()


def jobs(cluster: Cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return cluster.run(["slurmfabric", "jobs", *args], check=False, timeout=timeout)


def test_the_summary_names_the_rank_its_node_and_exit_7(cluster: Cluster,
                                                         tmp_path: Path) -> None:
    job = submit(cluster, tmp_path, 'echo "rank $RANK up on $SLURMD_NODENAME"; sleep 2; '
                 'if [ "$RANK" = 3 ]; then echo "rank 3 gives up"; exit 7; fi; sleep 60',
                 "exit7")
    waited = jobs(cluster, "wait", job, "--timeout", "120")
    print(waited.stdout)  # the note shows this summary as printed
    assert waited.returncode == 1, waited.stdout + waited.stderr
    status = json.loads(jobs(cluster, "status", job, "--json").stdout)
    first = status["summary"]["first"]
    nodes = expand(status["nodes"])
    assert (first["rank"], first["exit_code"]) == (3, 7)
    assert first["node"] == nodes[1]  # ranks 2-3 run on the second node
    lines = waited.stdout.splitlines()
    assert f"first failure: rank 3 on {nodes[1]}: exit code 7" in lines
    assert "  rank 3 gives up" in lines  # the failing rank's own last lines
    assert status["state"] == "FAILED"


def test_a_rank_killed_by_a_signal(cluster: Cluster, tmp_path: Path) -> None:
    job = submit(cluster, tmp_path, 'sleep 1; if [ "$RANK" = 1 ]; then kill -KILL $$; fi; '
                 'sleep 60', "killed")
    waited = jobs(cluster, "wait", job, "--timeout", "120")
    assert waited.returncode == 1
    status = json.loads(jobs(cluster, "status", job, "--json").stdout)
    assert status["summary"]["first"]["rank"] == 1
    assert status["summary"]["first"]["what"] in ("Killed", "exit code 137")


def test_cancel_then_wait_says_cancelled(cluster: Cluster, tmp_path: Path) -> None:
    job = submit(cluster, tmp_path, "sleep 120", "cancel")
    deadline = time.time() + 60
    while json.loads(jobs(cluster, "status", job, "--json").stdout)["state"] != "RUNNING":
        assert time.time() < deadline
        time.sleep(0.5)
    cancelled = jobs(cluster, "cancel", job)
    assert cancelled.returncode == 0 and cancelled.stdout == f"job {job}: cancelled\n"
    waited = jobs(cluster, "wait", job, "--timeout", "60")
    assert waited.returncode == 1 and waited.stdout.startswith(f"job {job}: CANCELLED")


def test_status_of_a_forgotten_job_comes_from_accounting(cluster: Cluster,
                                                         tmp_path: Path) -> None:
    job = submit(cluster, tmp_path, 'if [ "$RANK" = 2 ]; then exit 5; fi', "forgotten")
    assert jobs(cluster, "wait", job, "--timeout", "120").returncode == 1
    extra = cluster.testbed.s.extra_conf_path.read_text()
    cluster.set_extra_conf(extra.split("\n", 1)[-1] + "MinJobAge=2\n")
    try:
        deadline = time.time() + 180  # slurmctld purges old jobs on its own timer
        while cluster.run(["scontrol", "show", "job", job], check=False).returncode == 0:
            assert time.time() < deadline, "slurmctld never forgot the job"
            time.sleep(2)
        started = time.monotonic()
        status = jobs(cluster, "status", job, "--json")
        print(f"jobs status of a forgotten job: {time.monotonic() - started:.2f} s")
        data = json.loads(status.stdout)
        assert (data["source"], data["state"]) == ("sacct", "FAILED")
        assert data["exit_code"] == "5:0" and expand(data["nodes"])
    finally:
        cluster.set_extra_conf(extra.split("\n", 1)[-1])


def test_follow_one_rank_while_the_job_runs(cluster: Cluster, tmp_path: Path) -> None:
    job = submit(cluster, tmp_path, 'for i in 1 2 3 4 5 6; do echo "rank $RANK line $i"; '
                 'sleep 1; done', "follow")
    started = time.monotonic()
    status = jobs(cluster, "status", job)
    print(f"jobs status of a live job: {time.monotonic() - started:.2f} s")
    assert status.returncode == 0 and status.stdout.startswith(f"job {job}: ")
    follow = jobs(cluster, "logs", job, "--rank", "1", "--follow", timeout=120)
    assert follow.returncode == 0, follow.stderr
    lines = [line for line in follow.stdout.splitlines() if line.startswith("rank ")]
    assert lines == [f"rank 1 line {i}" for i in range(1, 7)]
    tail = jobs(cluster, "logs", job, "--rank", "1", "--tail", "2")
    assert tail.stdout.splitlines()[-2:] == ["rank 1 line 5", "rank 1 line 6"]
