"""``sbatch --parsable`` prints ``id;cluster`` on multi-cluster and federated setups
(sbatch(1), --parsable: "Outputs only the job id number and the cluster name if present").
The cluster is kept wherever the id is shown or stored, and every later Slurm command about
the job gets ``--clusters`` (issue 31, part 7)."""

from __future__ import annotations

import subprocess

import pytest

from slurmfabric import cli
from slurmfabric.config import load_config
from slurmfabric.job.follow import Job, load_records, submit_job
from slurmfabric.slurm import cmd

SETS = ["launcher.type=srun", "job.nodes=2", "job.ntasks_per_node=1",
        'program.command=["hostname"]', "launcher.slurmfabric=slurmfabric"]
RUNNING = ("JobId=4243 JobName=x JobState=COMPLETED Reason=None Restarts=0 RunTime=00:00:05 "
           "NodeList=sfn[1-2] ExitCode=0:0 StdOut=/nonexistent/out\n")


@pytest.fixture
def slurm(mocker, monkeypatch, tmp_path, clean_sf_env):
    """Slurm's commands answered in-process; returns the list of argv they were run with."""
    monkeypatch.setenv("SLURMFABRIC_JOBS_DIR", str(tmp_path / "records"))
    calls: list[list[str]] = []

    def run(argv, **_kw):
        calls.append(list(argv))
        out = {"sbatch": "4243;c1\n", "scontrol": RUNNING}.get(argv[0], "")
        return subprocess.CompletedProcess(argv, 0, out, "")

    mocker.patch.object(cmd.subprocess, "run", side_effect=run)
    return calls


def test_the_parsed_id_prints_with_its_cluster() -> None:
    parsed = cmd.parse_parsable_jobid("4243;c1\n")
    assert (parsed.job_id, parsed.cluster, str(parsed)) == ("4243", "c1", "4243;c1")
    assert str(cmd.parse_parsable_jobid("4244\n")) == "4244"


def test_cli_submit_prints_records_and_lists_the_cluster(slurm, tmp_path, capsys) -> None:
    assert cli.main(["submit", *[x for s in SETS for x in ("--set", s)],
                     "--workdir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "4243;c1\n"
    (record,) = load_records()
    assert (record.job_id, record.cluster, record.key) == ("4243", "c1", "4243;c1")
    assert cli.main(["jobs", "list"]) == 0
    assert capsys.readouterr().out.startswith("4243;c1 ")


def test_submit_wait_asks_the_jobs_own_cluster(slurm, tmp_path, capsys) -> None:
    assert cli.main(["submit", *[x for s in SETS for x in ("--set", s)],
                     "--workdir", str(tmp_path), "--wait", "--timeout", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("4243;c1\njob 4243;c1 COMPLETED")
    scontrol = [c for c in slurm if c[0] == "scontrol"]
    assert scontrol and all("--clusters=c1" in c for c in scontrol)


def test_python_job_keeps_the_cluster_and_later_commands_pass_it(slurm, tmp_path) -> None:
    config = load_config(sets=SETS)
    job = submit_job(config, workdir=str(tmp_path))
    assert (job.job_id, job.cluster, str(job), job.key) == ("4243", "c1", "4243;c1", "4243;c1")
    assert job.status().key == "4243;c1"
    job.cancel()
    assert slurm[-1] == ["scancel", "--clusters=c1", "4243"]
    # the bare id finds the record, and with it the cluster
    again = Job.from_text("4243")
    assert again.cluster == "c1"
    again.status()
    assert slurm[-1][:2] == ["scontrol", "--clusters=c1"]


def test_jobs_status_and_cancel_show_the_cluster(slurm, capsys) -> None:
    assert cli.main(["jobs", "status", "4243;c1"]) == 0
    assert capsys.readouterr().out.startswith("job 4243;c1: COMPLETED")
    assert cli.main(["jobs", "cancel", "4243;c1"]) == 0
    assert capsys.readouterr().out == "job 4243;c1: cancelled\n"
    assert slurm[-1] == ["scancel", "--clusters=c1", "4243"]


def test_time_left_can_ask_another_cluster(slurm) -> None:
    cmd.time_left("4243", cluster="c1")
    assert slurm[-1] == ["squeue", "--clusters=c1", "-h", "-j", "4243", "-o", "%L"]
