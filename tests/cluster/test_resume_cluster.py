"""Jobs that keep training, on the real testbed: the time limit, preemption, a node that dies,
a worker that dies. Each one resumes from its own checkpoint and ends with exactly the
parameter an uninterrupted run computes (examples/train_resume.py, ``expected_w``).

Everything here is Slurm's own doing:
- the warning is ``--signal=B:USR2@GRACE`` before a 1-minute time limit;
- preemption is a job in the testbed's higher-tier partition (``PreemptType=
  preempt/partition_prio``, ``PreemptMode=REQUEUE``);
- the node failure SIGKILLs one node's slurmd and slurmstepds, so slurmctld finds it silent
  after ``SlurmdTimeout`` (20 s here) and marks it DOWN;
- the worker failure is rank 1 exiting with code 3 once.

Slurm holds a requeued job for ``AuthInfo=cred_expire`` seconds before it may start again
(BeginTime; 120 s by default, 30 s on the testbed, slurm.conf(5)), so each requeue costs that
here too; the figures go to the test log (``-s``).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
from testbed_cluster import Cluster, expected_w

from slurmfabric.restart import events
from slurmfabric.restart.report import history

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
WAIT = 900  # runs with requeues: each requeue waits cred_expire (30 s here) in BeginTime



@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    return tmp_path


def submit(cluster: Cluster, work: Path, *sets: str, wait: bool = False,
           name: str = "resume-cpu"):
    args = ["slurmfabric", "submit", "-c", "examples/resume-cpu.toml", "--set",
            f"job.name={name}", "--set", f"job.output={name}-%j.out", "--set",
            f"launcher.resume.checkpoint_dir=checkpoints/{name}"]
    for item in sets:
        args += ["--set", item]
    if wait:
        args += ["--wait", "--timeout", str(WAIT)]
    return cluster.run(args, check=False, cwd=work, timeout=WAIT + 60)


def job_id(proc) -> str:
    first = proc.stdout.splitlines()[0] if proc.stdout else ""
    assert first.isdigit(), proc.stdout + proc.stderr
    return first


def records(output: str, key: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r'\{"' + key + r'[^{}]*\}', output)]


def wait_progress(directory: Path, step: int, timeout: float = 240) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        progress = events.read_progress(str(directory)) or {}
        if progress.get("step", 0) >= step:
            return progress
        time.sleep(0.5)
    raise AssertionError(f"training never reached step {step} in {directory}")


def check_resumes(directory: Path, output: str, steps: int) -> list:
    """Every start resumed from the checkpoint the previous run ended with, and the result
    is the uninterrupted one."""
    log = events.read(str(directory))
    starts = [e for e in log if e["event"] == "start"]
    ends = [e for e in log if e["event"] == "end"]
    for before, start in zip(ends, starts[1:]):
        assert start["from_step"] == before["checkpoint_step"], (before, start)
    printed = records(output, "resumed_from")
    reached = {e["restart"]: e.get("step_reached") for e in ends}
    for start in starts:  # what the program itself says it resumed from, per restart
        first = next((r for r in printed if r["restart"] == start["restart"]), None)
        if first is None:  # stopped before the program printed (a slow import on a busy
            # machine): then it must also have reached no step, and resumed nothing
            assert reached.get(start["restart"]) is None and start["from_step"] is None, start
            continue
        assert first["resumed_from"] == (start["from_step"] or 0), (first, start)
    final = records(output, "final_step")
    assert final and final[-1]["w"] == expected_w(steps) == final[-1]["expected"], output
    found = history(str(directory))
    assert found is not None
    for r in found.restarts:
        print(f"restart: {r.reason} {r.nodes} steps redone {r.steps_redone}; "
              f"event to first resumed step {r.seconds_lost} s")
    return found.restarts


def test_time_limit_requeues_resume_and_the_cap_stops(cluster: Cluster, workdir: Path) -> None:
    # Slurm sends the warning up to a minute before GRACE (its time-limit check runs about
    # once a minute), so a 2-minute run lasts 35-95 s. At 0.2 s a step a run does at most
    # about 450 steps: 480 need at least two runs on any machine. A 1-minute limit left a
    # run 30 s, which a loaded machine spent importing torch (no step reached in 7 runs).
    steps = 480
    capped = submit(cluster, workdir, "job.time=1", "launcher.resume.grace_seconds=25",
                    "launcher.resume.max_restarts=0", "program.env.TRAIN_STEPS=100000",
                    'launcher.resume.events=["timeout"]', name="capped")
    through = submit(cluster, workdir, "job.time=2", "launcher.resume.grace_seconds=25",
                     "launcher.resume.max_restarts=8", f"program.env.TRAIN_STEPS={steps}",
                     "program.env.TRAIN_STEP_SECONDS=0.2",
                     'launcher.resume.events=["timeout"]', name="timeout")
    cap_id, through_id = job_id(capped), job_id(through)
    from slurmfabric.restart.follow import wait_run

    _, cap_record = wait_run(cap_id, str(workdir / "checkpoints/capped"), WAIT,
                             env=cluster.env)
    assert cap_record["JobState"] == "FAILED", cap_record
    cap_out = (workdir / f"capped-{cap_id}.out").read_text()
    assert "slurmfabric: resume: stopped: timeout:" in cap_out
    assert "max_restarts = 0 used up" in cap_out and "final_step" not in cap_out
    last = events.read(str(workdir / "checkpoints/capped"))[-1]
    assert last["final"] is True and last["reason"] == "timeout"

    _, record = wait_run(through_id, str(workdir / "checkpoints/timeout"), WAIT,
                         env=cluster.env)
    output = (workdir / f"timeout-{through_id}.out").read_text()
    assert record["JobState"] == "COMPLETED", output
    restarts = check_resumes(workdir / "checkpoints/timeout", output, steps)
    assert len(restarts) >= 1 and {r.reason for r in restarts} == {"timeout"}
    starts = [e for e in events.read(str(workdir / "checkpoints/timeout"))
              if e["event"] == "start"]
    assert any(start["from_step"] for start in starts), starts  # resumed mid-way at least once
    assert int(record["Restarts"]) == len(restarts)  # the same job id, requeued each time


def test_preempted_job_is_requeued_and_resumes(cluster: Cluster, workdir: Path) -> None:
    steps = 500
    proc = submit(cluster, workdir, f"program.env.TRAIN_STEPS={steps}", name="preempt")
    jid = job_id(proc)
    wait_progress(workdir / "checkpoints/preempt", 100)
    urgent = cluster.run(["sbatch", "--parsable", "-p", cluster.testbed.s.urgent_partition,
                          "-N", str(len(cluster.nodes)), "--exclusive", "-o", "/dev/null",
                          "--wrap", "sleep 5"])
    assert urgent.stdout.strip().isdigit()
    from slurmfabric.restart.follow import wait_run

    _, record = wait_run(jid, str(workdir / "checkpoints/preempt"), WAIT, env=cluster.env)
    output = (workdir / f"preempt-{jid}.out").read_text()
    assert record["JobState"] == "COMPLETED", output
    assert "DUE TO PREEMPTION" in output
    restarts = check_resumes(workdir / "checkpoints/preempt", output, steps)
    assert [r.reason for r in restarts] == ["preempt"]
    assert restarts[0].step_reached >= 100 and restarts[0].steps_redone < 20  # every 20 steps


def test_node_failure_requeues_without_the_dead_node(cluster: Cluster, workdir: Path) -> None:
    steps = 500
    proc = submit(cluster, workdir, f"program.env.TRAIN_STEPS={steps}", name="nodefail")
    jid = job_id(proc)
    directory = workdir / "checkpoints/nodefail"
    wait_progress(directory, 100)
    start = next(e for e in events.read(str(directory)) if e["event"] == "start")
    from slurmfabric.slurm.hostlist import expand

    first, victim = expand(start["nodes"])  # the batch shell runs on the first node
    killed = cluster.crash_node(victim)
    try:
        assert len(killed) >= 2  # slurmd and at least the step's slurmstepd
        from slurmfabric.restart.follow import wait_run

        _, record = wait_run(jid, str(directory), WAIT, env=cluster.env)
        output = (workdir / f"nodefail-{jid}.out").read_text()
        assert record["JobState"] == "COMPLETED", output
        restarts = check_resumes(directory, output, steps)
        assert [(r.reason, r.nodes) for r in restarts] == [("node_fail", [victim])]
        later = [e for e in events.read(str(directory)) if e["event"] == "start"][1:]
        assert later and all(victim not in expand(e["nodes"]) for e in later)
        assert victim not in expand(record["NodeList"])
    finally:
        cluster.restore_node(victim)


def test_worker_failure_restarts_inside_the_allocation(cluster: Cluster, workdir: Path) -> None:
    steps = 300
    proc = submit(cluster, workdir, f"program.env.TRAIN_STEPS={steps}",
                  "program.env.TRAIN_FAIL_AT=90", name="workerfail", wait=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jid = job_id(proc)
    directory = workdir / "checkpoints/workerfail"
    restarts = check_resumes(directory, proc.stdout, steps)
    assert [r.reason for r in restarts] == ["worker_fail"]
    assert restarts[0].resumed_from == 80 and restarts[0].step_reached >= 89
    starts = [e for e in events.read(str(directory)) if e["event"] == "start"]
    assert len(starts) == 1  # no requeue: torchrun restarted the workers in place
    assert f"restarts of run {jid}: 1 (worker_fail 1)" in proc.stdout
