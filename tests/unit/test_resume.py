"""[launcher.resume]: the config rules, the rendered script, the program's checkpoint helper,
the supervisor's decisions and the restart report.

The supervisor runs for real here (``slurmfabric resume supervise`` in its own process, sent
real signals) with a real child program. The only stand-ins are the Slurm commands it asks:
recording ``scontrol``/``squeue``/``sinfo``/``sbatch`` scripts first on PATH, answering
from files. The same decisions against a real slurmctld are in
tests/cluster/test_resume_cluster.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cleanenv import clean_env

import slurmfabric
from slurmfabric.config import load_config
from slurmfabric.config.models import time_limit_seconds
from slurmfabric.errors import ConfigError
from slurmfabric.job.render import render_sbatch
from slurmfabric.restart import Checkpoints, events
from slurmfabric.restart.report import format_history, history

ROOT = Path(__file__).resolve().parents[2]
BASE = ["program.command=[\"python\", \"train.py\"]", "job.time=00:10:00"]


def config(*sets: str):
    """A torchrun job unless the sets name another launcher."""
    torchrun = [] if any(s.startswith("launcher.type=") for s in sets) else [
        "launcher.nproc_per_node=2"]
    return load_config(None, sets=[*BASE, *torchrun, *sets])


def problems(*sets: str) -> str:
    with pytest.raises(ConfigError) as caught:
        config(*sets)
    return str(caught.value)


# -- config ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "seconds"), [
    ("30", 1800), ("5:00", 300), ("1:00:00", 3600), ("2-00:00:00", 172800), ("1-2", 93600),
    ("1-2:3", 93780), ("1-2:3:4", 93784), ("UNLIMITED", None), (None, None)])
def test_time_limit_seconds_reads_every_sbatch_form(text, seconds) -> None:
    assert time_limit_seconds(text) == seconds


def test_usr1_goes_to_the_batch_shell_only() -> None:
    # B: keeps it from every rank (sbatch(1)), so NCCL 2.12's SIGUSR1 handler
    # (https://github.com/NVIDIA/nccl/issues/704) never sees it
    script = render_sbatch(config('launcher.resume.events=["timeout"]',
                                  "launcher.resume.signal=SIGUSR1"))
    assert "#SBATCH --signal=B:USR1@120\n" in script and " --signal USR1 " in script
    text = problems('launcher.resume.events=["timeout"]', "launcher.resume.signal=KILL")
    assert "launcher.resume.signal" in text and "choose from" in text


@pytest.mark.parametrize(("sets", "field", "phrase"), [
    (["job.time=1", "launcher.resume.grace_seconds=60"], "launcher.resume.grace_seconds",
     "not shorter than the time limit"),
    (["job.requeue=false"], "job.requeue", "needs a requeueable job"),
    (["job.requeue=false", "launcher.resume.mode=chain", 'launcher.resume.events=["preempt"]'],
     "job.requeue", "preempt"),
    (["launcher.signal=USR2"], "launcher.signal", "sends its own warning signal"),
    (["launcher.resume.mode=chain", "job.array=0-3"], "launcher.resume.mode", "array"),
    (['launcher.resume.events=["timeout","timeout"]'], "launcher.resume.events", "repeat"),
])
def test_contradictions_name_the_field(sets, field, phrase) -> None:
    text = problems('launcher.resume.events=["timeout"]', *sets)
    line = next(line for line in text.splitlines() if line.startswith(field))
    assert phrase in line


def test_nccl_tests_has_nothing_to_resume() -> None:
    text = problems('launcher.resume.events=["timeout"]', "launcher.type=nccl-tests",
                    "program.command=[]", "job.ntasks_per_node=1")
    assert "launcher.resume: nccl-tests is a measurement" in text


def test_chain_without_slurm_requeues_keeps_job_requeue_false() -> None:
    script = render_sbatch(config('launcher.resume.events=["timeout"]', "job.requeue=false",
                                  "launcher.resume.mode=chain"))
    assert "#SBATCH --no-requeue\n" in script and "--mode chain" in script


# -- rendering -------------------------------------------------------------------------------

def test_script_warns_the_batch_shell_appends_output_and_execs_the_supervisor() -> None:
    script = render_sbatch(config('launcher.resume.events=["timeout","preempt"]',
                                  "launcher.resume.grace_seconds=90"))
    for line in ("#SBATCH --requeue", "#SBATCH --signal=B:USR2@90", "#SBATCH --open-mode=append",
                 'export SLURMFABRIC_CHECKPOINT_DIR="$PWD"/checkpoints/slurmfabric'):
        assert line + "\n" in script
    supervise = next(line for line in script.splitlines() if "resume supervise" in line)
    assert supervise == (
        'exec "$sf_bin" resume supervise --events timeout,preempt --max-restarts 3 --signal USR2 '
        '--grace 90 --mode requeue --keep 2 --launcher torchrun '
        '--progress-dir "$SLURMFABRIC_PROGRESS_DIR" --hang-timeout 300 --slow-ratio 1.1 '
        '--script "$0" -- \\')
    after = script.splitlines()[script.splitlines().index(supervise) + 1]
    assert after.startswith("srun ")  # the launch is the supervisor's argv, not a new line
    assert "--max-restarts" not in script.split(supervise)[1]  # no worker_fail: no torchrun retry


def test_worker_fail_gives_torchrun_its_restarts_and_absolute_dirs_stay() -> None:
    script = render_sbatch(config('launcher.resume.events=["worker_fail"]',
                                  "launcher.resume.max_restarts=5",
                                  "launcher.resume.checkpoint_dir=/lustre/ck/run 1"))
    assert "--max-restarts=5 --no-python" in script
    assert "export SLURMFABRIC_CHECKPOINT_DIR='/lustre/ck/run 1'\n" in script


def test_without_resume_nothing_changes() -> None:
    script = render_sbatch(config())
    assert "resume supervise" not in script and "--open-mode" not in script


@pytest.mark.parametrize("launcher", ["srun", "mpirun", "srun-pmix"])
def test_every_launcher_runs_under_the_supervisor(launcher: str, tmp_path: Path) -> None:
    cfg = config('launcher.resume.events=["timeout"]', f"launcher.type={launcher}",
                 "job.ntasks_per_node=2")
    script = render_sbatch(cfg)
    lines = script.splitlines()
    at = next(i for i, line in enumerate(lines) if "resume supervise" in line)
    assert lines[at].endswith("-- \\")
    assert lines[at + 1].split()[0] in ("srun", '"$mpirun_bin"')
    path = tmp_path / "job.sh"
    path.write_text(script)
    subprocess.run(["shellcheck", str(path)], check=True)


# -- the program's helper --------------------------------------------------------------------

def test_checkpoints_are_atomic_and_the_newest_are_kept(tmp_path: Path) -> None:
    ck = Checkpoints(str(tmp_path), keep=2)

    def write(value: str):
        return lambda d: Path(d, "state").write_text(value)

    for step in (10, 20, 30):
        ck.save(step, write(str(step)))
    assert ck.steps() == [20, 30] and Path(ck.latest()[1], "state").read_text() == "30"

    def broken(directory: str) -> None:
        Path(directory, "state").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        ck.save(40, broken)
    assert ck.latest()[0] == 30  # the half-written step 40 is not a checkpoint
    assert any(name.startswith(".step-000000040.tmp-") for name in os.listdir(tmp_path))


def test_mark_records_where_training_resumed(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMFABRIC_RUN_ID", "77")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    events.write_progress(str(tmp_path), {"step": 41, "time": 100.0})
    ck = Checkpoints(str(tmp_path))
    ck.mark(36)
    ck.mark(37)
    first = events.read(str(tmp_path))
    assert [(e["event"], e["step"], e["previous_step"], e["worker_restart"]) for e in first] == [
        ("first_step", 36, 41, 1)]
    assert events.read_progress(str(tmp_path))["step"] == 37


# -- the supervisor, with recording Slurm commands ------------------------------------------

FAKE = r"""#!/bin/sh
# A recording stand-in: logs its argv, answers from $FAKE_SLURM/<name>.out.
name=$(basename "$0")
printf '%s\n' "$name $*" >> "$FAKE_SLURM/calls"
case "$name $1" in
  "scontrol show") cat "$FAKE_SLURM/show_job" 2>/dev/null ;;
  "squeue "*) cat "$FAKE_SLURM/time_left" 2>/dev/null ;;
  "sinfo "*) cat "$FAKE_SLURM/sinfo" 2>/dev/null ;;
  "sbatch "*) echo "901" ;;
esac
exit 0
"""

# A child that trains until told to stop, answering a save request with a checkpoint.
CHILD = r"""
import os, sys, time
sys.path.insert(0, os.environ["SF_ROOT"])
from slurmfabric import restart as resume
ck = resume.Checkpoints()
start = (ck.latest() or (0, None))[0]
exit_code = int(os.environ.get("CHILD_EXIT", "0"))
steps = int(os.environ.get("CHILD_STEPS", "100000"))
for step in range(start + 1, steps + 1):
    time.sleep(0.02)
    ck.mark(step)
    if resume.save_requested() or step % 50 == 0:
        ck.save(step, lambda d, s=step: open(os.path.join(d, "s"), "w").write(str(s)))
        if resume.save_requested():
            time.sleep(float(os.environ.get("CHILD_HOLD", "60")))  # the supervisor stops us
    if exit_code and step == 20:
        sys.stderr.write(os.environ.get("CHILD_SAYS", ""))
        sys.exit(exit_code)
if steps < 100000:
    ck.save(steps, lambda d: open(os.path.join(d, "s"), "w").write("last"))
time.sleep(float(os.environ.get("CHILD_TAIL", "0")))  # tearing down, training no more
"""


class Harness:
    def __init__(self, tmp: Path, **env: str) -> None:
        self.tmp, self.fake = tmp, tmp / "slurm"
        self.fake.mkdir()
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        for name in ("scontrol", "squeue", "sinfo", "sbatch"):
            (bin_dir / name).write_text(FAKE)
            (bin_dir / name).chmod(0o755)
        (tmp / "child.py").write_text(CHILD)
        self.ckpt = tmp / "ck"
        self.env = clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_SLURM=str(self.fake),
                             SF_ROOT=str(ROOT), SLURM_JOB_ID="77",
                             SLURM_JOB_NODELIST="sfn[1-2]", LANG="C.UTF-8", **env)
        self.answer("show_job", "JobId=77 JobState=RUNNING Restarts=0 Requeue=1")
        self.answer("sinfo", "sfn1 allocated\nsfn2 allocated\n")
        self.answer("time_left", "0:45\n")

    def answer(self, name: str, text: str) -> None:
        (self.fake / name).write_text(text + "\n")

    def start(self, *options: str) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "slurmfabric", "resume", "supervise", "--checkpoint-dir",
               str(self.ckpt), "--script", str(self.tmp / "job.sh"), *options, "--",
               sys.executable, str(self.tmp / "child.py")]
        return subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def calls(self) -> list[str]:
        path = self.fake / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def wait_for_progress(self, step: int, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            progress = events.read_progress(str(self.ckpt)) or {}
            if progress.get("step", 0) >= step:
                return
            time.sleep(0.05)
        raise AssertionError(f"the child never reached step {step}")

    def events(self) -> list[dict]:
        return events.read(str(self.ckpt))


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def test_a_finished_program_ends_the_run(tmp_path: Path) -> None:
    h = Harness(tmp_path, CHILD_STEPS="30")
    rc, out = finish(h.start("--events", "timeout"))
    assert rc == 0, out
    assert [e["event"] for e in h.events()] == ["start", "first_step", "end"]
    assert h.events()[-1]["reason"] == "finished" and h.events()[-1]["step_reached"] == 30
    assert not any(call.startswith("scontrol requeue") for call in h.calls())


def test_the_warning_gets_a_checkpoint_then_a_requeue(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    proc = h.start("--events", "timeout", "--grace", "120")
    h.wait_for_progress(70)
    proc.send_signal(signal.SIGUSR2)
    rc, out = finish(proc)
    assert rc == 0, out
    end = h.events()[-1]
    assert end["reason"] == "timeout" and end["action"] == "requeued 77"
    assert end["checkpoint_step"] >= 70 and end["checkpoint_step"] != 50  # asked, not periodic
    assert end["seconds_to_checkpoint"] < 10  # it did not sit out the grace period
    assert "squeue -h -j 77 -o %L" in h.calls() and h.calls()[-1] == "scontrol requeue 77"
    assert "timeout: checkpoint at step" in out and "requeued 77 (restart 1 of 3)" in out


def test_the_warning_may_be_usr1(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    proc = h.start("--events", "timeout", "--signal", "USR1")
    h.wait_for_progress(30)
    proc.send_signal(signal.SIGUSR1)  # the default action would kill the supervisor
    rc, out = finish(proc)
    assert rc == 0 and h.events()[-1]["reason"] == "timeout", out
    assert h.calls()[-1] == "scontrol requeue 77"
    bad = subprocess.run([sys.executable, "-m", "slurmfabric", "resume", "supervise",
                          "--events", "timeout", "--signal", "KILL", "--", "true"],
                         capture_output=True, text=True, env=h.env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "'KILL' is not a signal the supervisor can catch" in bad.stderr


def test_a_program_that_finishes_during_the_grace_period_is_not_requeued(
        tmp_path: Path) -> None:
    h = Harness(tmp_path, CHILD_STEPS="60", CHILD_HOLD="0", CHILD_TAIL="2")
    proc = h.start("--events", "timeout")
    h.wait_for_progress(60)  # the last step: the program saves it and tears down
    proc.send_signal(signal.SIGUSR2)
    rc, out = finish(proc)
    assert rc == 0 and h.events()[-1]["reason"] == "finished", out
    assert not any(call.startswith("scontrol requeue") for call in h.calls())


def test_an_array_task_is_requeued_as_itself(tmp_path: Path) -> None:
    h = Harness(tmp_path, SLURM_ARRAY_JOB_ID="70", SLURM_ARRAY_TASK_ID="4")
    proc = h.start("--events", "timeout")
    h.wait_for_progress(5)
    proc.send_signal(signal.SIGUSR2)
    assert finish(proc)[0] == 0
    assert h.calls()[-1] == "scontrol requeue 70_4"  # not 70: that restarts every task


def test_chain_mode_submits_a_successor_with_the_counter(tmp_path: Path) -> None:
    h = Harness(tmp_path, SLURMFABRIC_CHAIN_COUNT="1", SLURMFABRIC_RUN_ID="60")
    proc = h.start("--events", "timeout", "--mode", "chain")
    h.wait_for_progress(5)
    proc.send_signal(signal.SIGUSR2)
    rc, out = finish(proc)
    assert rc == 0, out
    assert h.calls()[-1] == (f"sbatch --parsable --dependency=afterany:77 --export=ALL,"
                             f"SLURMFABRIC_CHAIN_COUNT=2,SLURMFABRIC_RUN_ID=60 {tmp_path}/job.sh")
    assert h.events()[-1]["successor"] == "901" and h.events()[-1]["run"] == "60"


def test_the_cap_stops_with_a_reason_and_no_requeue(tmp_path: Path) -> None:
    h = Harness(tmp_path, SLURM_RESTART_COUNT="3")
    proc = h.start("--events", "timeout", "--max-restarts", "3")
    h.wait_for_progress(5)
    proc.send_signal(signal.SIGUSR2)
    rc, out = finish(proc)
    assert rc == 1
    assert "stopped: timeout:" in out and "max_restarts = 3 used up" in out
    assert not any(call.startswith("scontrol requeue") for call in h.calls())
    assert h.events()[-1]["final"] is True


def test_a_start_past_the_cap_never_runs_the_program(tmp_path: Path) -> None:
    h = Harness(tmp_path, SLURM_RESTART_COUNT="4")
    rc, out = finish(h.start("--events", "preempt", "--max-restarts", "3"))
    assert rc == 1 and "restart 4 is past max_restarts = 3" in out
    assert events.read_progress(str(h.ckpt)) is None  # the child never started


def test_warning_far_from_the_limit_is_not_a_timeout(tmp_path: Path) -> None:
    h = Harness(tmp_path, CHILD_STEPS="200", CHILD_HOLD="0")
    h.answer("time_left", "1:00:00")  # PreemptParameters=send_user_signal sends it early
    proc = h.start("--events", "timeout")
    h.wait_for_progress(5)
    proc.send_signal(signal.SIGUSR2)
    rc, out = finish(proc, timeout=90)
    assert "not the time limit" in out
    assert not any(call.startswith("scontrol requeue") for call in h.calls())


@pytest.mark.parametrize(("sinfo", "restarts", "reason", "nodes"), [
    ("sfn1 allocated\nsfn2 allocated", "1", "preempt", []),
    ("sfn1 allocated\nsfn2 down*", "1", "node_fail", ["sfn2"]),
    ("sfn1 allocated\nsfn2 allocated", "0", "cancelled", []),
])
def test_sigterm_is_told_apart_by_slurms_state(tmp_path: Path, sinfo: str, restarts: str,
                                               reason: str, nodes: list[str]) -> None:
    h = Harness(tmp_path)
    h.answer("sinfo", sinfo)
    h.answer("show_job", f"JobId=77 JobState=COMPLETING Restarts={restarts} Requeue=1")
    proc = h.start("--events", "preempt,node_fail")
    h.wait_for_progress(5)
    proc.send_signal(signal.SIGTERM)
    rc, out = finish(proc)
    assert rc == 143
    end = h.events()[-1]
    assert (end["reason"], end["nodes"]) == (reason, nodes)
    assert not any(call.startswith("scontrol requeue") for call in h.calls())  # Slurm does it


@pytest.mark.parametrize(("launcher", "rc", "requeued"), [("srun", 0, True),
                                                          ("torchrun", 3, False)])
def test_a_failed_launch_is_requeued_unless_torchrun_already_retried(
        tmp_path: Path, launcher: str, rc: int, requeued: bool) -> None:
    h = Harness(tmp_path, CHILD_EXIT="3")
    got, out = finish(h.start("--events", "worker_fail", "--launcher", launcher))
    assert got == rc, out
    assert (h.calls()[-1] == "scontrol requeue 77") is requeued
    assert h.events()[-1]["reason"] == "worker_fail"


# srun's own lines when task 3 of 4 exits 1 and srun kills the rest (--kill-on-bad-exit):
# the consequence (Terminated, exit 143) may come first, the cause is named
SRUN_SAYS = ("srun: error: sfn1: tasks 0-1: Terminated\n"
             "srun: error: sfn2: task 3: Exited with exit code 1\n"
             "srun: error: sfn2: task 2: Exited with exit code 143\n")


def test_a_worker_failure_names_its_rank_and_node(tmp_path: Path) -> None:
    h = Harness(tmp_path, CHILD_EXIT="3", CHILD_SAYS=SRUN_SAYS)
    got, out = finish(h.start("--events", "worker_fail", "--launcher", "srun"))
    assert got == 0, out
    end = h.events()[-1]
    assert end["reason"] == "worker_fail" and end["exit_code"] == 3
    assert end["failed"][0] == {"rank": 3, "node": "sfn2", "what": "exit code 1"}
    assert len(end["failed"]) == 4
    assert "worker_fail: launch exited 3 (rank 3 on sfn2: exit code 1)" in out
    assert SRUN_SAYS in out  # passed on whole to the job's stderr
    text = format_history(history(str(h.ckpt)))
    assert "worker_fail (exit 3): rank 3 on sfn2: exit code 1" in text


# -- the report ------------------------------------------------------------------------------

def test_history_counts_redone_steps_and_time_to_the_first_resumed_step(tmp_path: Path) -> None:
    d = str(tmp_path)
    log = [
        {"event": "start", "time": 0.0, "run": "9", "job": "9", "restart": 0, "from_step": None},
        {"event": "first_step", "time": 5.0, "run": "9", "job": "9", "step": 1,
         "worker_restart": 0},
        {"event": "end", "time": 60.0, "run": "9", "job": "9", "reason": "timeout",
         "step_reached": 140, "checkpoint_step": 138, "action": "requeued 9"},
        {"event": "start", "time": 190.0, "run": "9", "job": "9", "restart": 1, "from_step": 138},
        {"event": "first_step", "time": 200.0, "run": "9", "job": "9", "step": 139,
         "worker_restart": 0},
        {"event": "end", "time": 230.0, "run": "9", "job": "9", "reason": "node_fail",
         "nodes": ["sfn2"], "step_reached": 170, "action": "requeued by slurm"},
        {"event": "start", "time": 400.0, "run": "9", "job": "9", "restart": 2, "from_step": 160},
        {"event": "first_step", "time": 410.0, "run": "9", "job": "9", "step": 161,
         "worker_restart": 0},
        {"event": "first_step", "time": 430.0, "run": "9", "job": "9", "step": 181,
         "worker_restart": 1, "previous_step": 185, "previous_time": 425.0},
        {"event": "end", "time": 500.0, "run": "9", "job": "9", "reason": "finished",
         "step_reached": 300},
        {"event": "start", "time": 900.0, "run": "other", "job": "12", "restart": 0},
    ]
    for record in log:
        events.append(d, record)
    h = history(d, "9")
    assert [(r.reason, r.steps_redone, r.seconds_lost) for r in h.restarts] == [
        ("timeout", 2, 140.0), ("node_fail", 10, 180.0), ("worker_fail", 5, 5.0)]
    assert h.steps_redone == 17 and h.seconds_lost == 325.0
    text = format_history(h)
    assert text.splitlines()[0] == ("restarts of run 9: 3 (timeout 1, node_fail 1, "
                                    "worker_fail 1); steps redone 17; time lost 325.0 s")
    assert "node_fail (sfn2)" in text and text.splitlines()[-1] == "final: finished at step 300"
    assert history(d).run == "other"  # default: the run that started last


def test_a_hang_counts_from_the_last_step_not_from_its_notice(tmp_path: Path) -> None:
    """Issue 45: 38-41 s reported against 61-66 s measured, the hang timeout left out."""
    d = str(tmp_path)
    for record in [
        {"event": "start", "time": 0.0, "run": "4", "job": "4", "restart": 0},
        {"event": "first_step", "time": 5.0, "run": "4", "job": "4", "step": 1},
        {"event": "end", "time": 100.0, "since": 80.0, "run": "4", "job": "4",
         "reason": "hang", "nodes": ["sfn2"], "step_reached": 59, "action": "requeued 4"},
        {"event": "start", "time": 130.0, "run": "4", "job": "4", "restart": 1,
         "from_step": 40},
        {"event": "first_step", "time": 140.0, "run": "4", "job": "4", "step": 41}]:
        events.append(d, record)
    h = history(d, "4")
    assert [(r.reason, r.when, r.seconds_lost) for r in h.restarts] == [("hang", 80.0, 60.0)]


def test_history_command_prints_json(tmp_path: Path) -> None:
    events.append(str(tmp_path), {"event": "start", "time": 1.0, "run": "5", "job": "5"})
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "resume", "history",
                           str(tmp_path), "--json"], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout)["run"] == "5"
    empty = subprocess.run([sys.executable, "-m", "slurmfabric", "resume", "history",
                            str(tmp_path / "none")], capture_output=True, text=True)
    assert empty.returncode == 1 and "no restart record" in empty.stderr


def test_hang_and_slow_are_events_with_their_thresholds() -> None:
    config = slurmfabric.JobConfig.from_dict({
        "job": {"name": "x", "nodes": 2, "ntasks_per_node": 2},
        "program": {"command": ["python", "t.py"]},
        "launcher": {"type": "srun", "resume": {"events": ["hang", "slow"],
                                                 "hang_timeout": 60, "slow_ratio": 1.2}}})
    resume = config.launcher.resume
    assert (resume.events, resume.hang_timeout, resume.slow_ratio) == (["hang", "slow"], 60, 1.2)
    with pytest.raises(ConfigError, match=r"launcher\.resume\.hang_timeout"):
        slurmfabric.JobConfig.from_dict({
            "job": {"name": "x", "nodes": 2, "ntasks_per_node": 2},
            "program": {"command": ["python", "t.py"]},
            "launcher": {"type": "srun", "resume": {"events": ["hang"], "hang_timeout": 1}}})


# Four "ranks" of heartbeats (slurmfabric.progress's record): all advance for 5 steps, then
# rank 2 stays in its step's compute while the others wait in its collectives; the beats
# are backdated 400 s so the supervisor's first look past --hang-timeout sees the hang.
HUNG = r"""
import json, os, time
beats = os.environ["SLURMFABRIC_PROGRESS_DIR"]
os.makedirs(beats, exist_ok=True)
def beat(rank, step, phase, t):
    record = {"rank": rank, "pid": 1000 + rank, "host": f"sfn{rank // 2 + 1}", "local": "0",
              "gpus": "", "step": step, "phase": phase, "time": t, "compute": 0.1,
              "compute_sum": 0.1 * step, "timed": step}
    with open(os.path.join(beats, f"rank-{rank}.beat"), "w") as handle:
        handle.write(json.dumps(record))
for step in range(1, 6):
    for rank in range(4):
        beat(rank, step, "step", time.time())
    time.sleep(0.05)
for rank in range(4):
    beat(rank, 5, "step" if rank == 2 else "comm", time.time() - 400)
time.sleep(120)
"""


@pytest.mark.parametrize("events_", ["hang", "timeout"])
def test_a_hang_names_the_rank_and_requeues_without_its_node(tmp_path: Path,
                                                             events_: str) -> None:
    h = Harness(tmp_path)
    (tmp_path / "child.py").write_text(HUNG)
    srun = tmp_path / "bin" / "srun"  # the diagnosis step fails: the beats name the rank
    srun.write_text('#!/bin/sh\necho "srun $*" >> "$FAKE_SLURM/calls"\n'
                    'echo "srun: error: no such job" >&2; exit 1\n')
    srun.chmod(0o755)
    beats = tmp_path / "beats"
    beats.mkdir()
    (beats / "rank-9.beat").write_text('{"rank": 9, "step": 1, "time": 1.0}')  # a past run's
    proc = h.start("--events", events_, "--hang-timeout", "60", "--progress-dir", str(beats),
                   "--prom", str(tmp_path / "job.prom"))
    if events_ == "timeout":  # said and recorded, but not acted on: the job keeps running
        deadline = time.time() + 20
        while not any(e["event"] == "finding" for e in h.events()) and time.time() < deadline:
            time.sleep(0.2)
        proc.terminate()
    rc, out = finish(proc)
    assert "slurmfabric: hang: no rank advanced for 40" in out
    assert "rank 2 on sfn2 (pid 1002" in out and "still computing" in out
    assert "diagnosis failed: srun failed: srun: error: no such job" in out
    assert any(c.startswith("srun --overlap --jobid=77 --ntasks-per-node=1") for c in h.calls())
    assert "rank 9" not in out
    finding = next(e for e in h.events() if e["event"] == "finding")
    assert finding["kind"] == "hang" and finding["nodes"] == ["sfn2"]
    assert 'slurmfabric_progress_hang{job="77"} 1' in (tmp_path / "job.prom").read_text()
    if events_ == "hang":
        assert rc == 0, out
        end = h.events()[-1]
        assert end["reason"] == "hang" and end["action"] == "requeued 77"
        # the hang began at the last beat (400 s ago), not when it was noticed
        assert end["time"] - 410 < end["since"] < end["time"] - 390
        # Slurm 22.05 takes ExcNodeList only from a pending job: after the requeue
        calls = h.calls()
        assert calls[-1] == "scontrol update JobId=77 ExcNodeList=sfn2"
        found = history(str(h.ckpt))  # the restart report names the culprit node
        assert [(r.reason, r.nodes) for r in found.restarts] == [("hang", ["sfn2"])]
        assert "hang (sfn2)" in format_history(found)
        assert calls.index("scontrol requeue 77") < len(calls) - 1
    else:
        assert not any(call.startswith("scontrol requeue") for call in h.calls())


# -- heartbeats and the flight recorder in the rendered script --------------------------------

def _run_env_block(script: str, tmp: Path, **env: str) -> dict[str, str]:
    """The script's flight-recorder and progress lines, run in bash: what a rank inherits."""
    lines = script.splitlines()
    first = next(i for i, line in enumerate(lines) if "NCCL flight recorder" in line)
    last = next(i for i, line in enumerate(lines)
                if line.startswith("export TORCH_FR_DUMP_TEMP_FILE="))
    block = "\n".join(["set -euo pipefail", *lines[first:last + 1],
                       *[line for line in lines if "SLURMFABRIC_CHECKPOINT_DIR=" in line
                         or "SLURMFABRIC_PROGRESS_DIR=" in line],
                       "env | grep -E '^(TORCH_NCCL|TORCH_FR|SLURMFABRIC_PROGRESS)' | sort"])
    out = subprocess.run(["bash", "-c", block], cwd=tmp, capture_output=True, text=True,
                         env=clean_env(SLURM_JOB_ID="4242", **env), check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_resume_script_gives_every_job_its_heartbeats_and_flight_dumps(tmp_path: Path) -> None:
    script = render_sbatch(config('launcher.resume.events=["hang","slow"]',
                                  "launcher.resume.hang_timeout=20",
                                  "launcher.resume.slow_ratio=1.25"))
    assert ('--progress-dir "$SLURMFABRIC_PROGRESS_DIR" --hang-timeout 20 --slow-ratio 1.25 '
            in script)
    got = _run_env_block(script, tmp_path)
    # per job, under the checkpoint directory the nodes share; the dumps per job too
    assert got["SLURMFABRIC_PROGRESS_DIR"] == \
        f"{tmp_path}/checkpoints/slurmfabric/.slurmfabric/progress-4242"
    assert got["TORCH_FR_DUMP_TEMP_FILE"] == f"{tmp_path}/nccl_trace_4242_rank_"
    assert list(tmp_path.iterdir()) == []  # nothing written until a rank dumps
    assert got["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert got["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    # torch >= 2.8's names only: an old name beside them makes torch 2.13 warn on every rank
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in got
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in got


def test_the_users_flight_recorder_values_win_and_the_switch_turns_it_off(
        tmp_path: Path) -> None:
    script = render_sbatch(config("program.env.TORCH_NCCL_TRACE_BUFFER_SIZE=64"))
    # the config's own value only, under its own (old) name: no new name to outrank it
    assert "TORCH_FR_BUFFER_SIZE" not in script
    assert "export TORCH_NCCL_TRACE_BUFFER_SIZE=64\n" in script
    got = _run_env_block(script, tmp_path, TORCH_NCCL_DEBUG_INFO_TEMP_FILE="/scratch/fr_",
                         TORCH_NCCL_DUMP_ON_TIMEOUT="0")
    # the submit env wins, under either name: the new name takes the old one's value
    assert got["TORCH_FR_DUMP_TEMP_FILE"] == "/scratch/fr_"
    assert got["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    got = _run_env_block(script, tmp_path, TORCH_FR_DUMP_TEMP_FILE="/scratch/new_")
    assert got["TORCH_FR_DUMP_TEMP_FILE"] == "/scratch/new_"
    off = render_sbatch(config("launcher.nccl_flight_recorder=false"))
    assert "TORCH_NCCL" not in off and "TORCH_FR" not in off
    assert "TORCH_NCCL" not in render_sbatch(load_config(
        ROOT / "examples" / "nccl-tests-sweep.toml"))  # no PyTorch there


# -- a hang seen without the helper: the launch went silent -----------------------------------

SILENT = r"""
import sys, time
print("step 1", flush=True)
time.sleep(float(sys.argv[1]))
"""


@pytest.mark.parametrize("quiet", [60.0, 4.0])
def test_log_silence_is_a_hang_when_no_rank_writes_beats(tmp_path: Path, quiet: float) -> None:
    """The job's output file is the supervisor's stdout (sbatch -o): a launch that prints
    nothing for longer than the hang timeout is a hang, marked as seen by log silence (the
    first timeout after the launch starts is startup, not counted)."""
    h = Harness(tmp_path)
    (tmp_path / "child.py").write_text(SILENT)
    srun = tmp_path / "bin" / "srun"
    srun.write_text('#!/bin/sh\necho "srun $*" >> "$FAKE_SLURM/calls"; exit 1\n')
    srun.chmod(0o755)
    out_file = tmp_path / "job.out"
    cmd = [sys.executable, "-m", "slurmfabric", "resume", "supervise", "--checkpoint-dir",
           str(h.ckpt), "--events", "hang", "--hang-timeout", "10", "--progress-dir",
           str(tmp_path / "beats"), "--", sys.executable, str(tmp_path / "child.py"), str(quiet)]
    started = time.time()
    with open(out_file, "w") as handle:
        rc = subprocess.run(cmd, env=h.env, stdout=handle, stderr=subprocess.STDOUT,
                            timeout=90).returncode
    out = out_file.read_text()
    if quiet < 10:  # printed, then finished within the timeout: nothing to say
        assert rc == 0 and "hang" not in out, out
        return
    assert rc == 0, out
    assert "slurmfabric: hang: the launch printed nothing for 1" in out
    assert "[signal: log_silence]" in out
    assert time.time() - started < 45  # found at 20-25 s (one look every 5 s), not at exit
    finding = next(e for e in h.events() if e["event"] == "finding")
    assert finding["signal"] == "log_silence" and finding["kind"] == "hang"
    end = h.events()[-1]
    assert end["reason"] == "hang" and end["signal"] == "log_silence"
    assert "scontrol requeue 77" in h.calls()


def test_log_silence_is_not_watched_once_ranks_write_beats(tmp_path: Path) -> None:
    from slurmfabric.restart.hang import Watcher

    out = tmp_path / "out"
    beats = tmp_path / "beats"
    beats.mkdir()
    with open(out, "w") as handle:
        handle.write("started\n")
        handle.flush()
        silent = Watcher("", "1", timeout=10, log_fd=handle.fileno(), every=0)
        watched = Watcher(str(beats), "1", timeout=10, log_fd=handle.fileno(), every=0)
        record = {"rank": 0, "pid": 1, "host": "n1", "local": "0", "gpus": "", "step": 3,
                  "phase": "step", "time": 1000.0, "compute": 0.1, "compute_sum": 0.3,
                  "timed": 3}
        (beats / "rank-0.beat").write_text(json.dumps(record))
        assert silent.poll(1000.0) == [] and watched.poll(1000.0) == []
        assert silent.poll(1015.0) == []  # the first timeout is startup
        (beats / "rank-0.beat").write_text(json.dumps({**record, "step": 4, "time": 1018.0}))
        later = silent.poll(1021.0)
        assert [f.signal for f in later] == ["log_silence"]
        assert watched.poll(1021.0) == []  # beats advance: the quiet log is no hang
        assert silent.poll(1030.0) == []  # said once per silence
        handle.write("step 5\n")
        handle.flush()
        assert silent.poll(1031.0) == [] and silent.poll(1040.0) == []
        assert silent.poll(1042.0)[0].signal == "log_silence"
    r, w = os.pipe()
    try:
        piped = Watcher("", "1", timeout=1, log_fd=w, every=0)
        assert piped.poll(0.0) == [] and piped.poll(100.0) == []  # a pipe has no size
    finally:
        os.close(r)
        os.close(w)


def test_a_node_failure_during_the_hang_diagnosis_is_slurms_to_handle(tmp_path: Path) -> None:
    """A dead node: the beats show a hang first; the collector step gets no answer from
    that node and Slurm marks it down and ends the job while the diagnosis runs. Slurm's
    SIGTERM decides (node_fail, the node named), and nothing is requeued twice."""
    h = Harness(tmp_path)
    (tmp_path / "child.py").write_text(HUNG)
    srun = tmp_path / "bin" / "srun"  # only sfn1's collector answers, after a while
    srun.write_text('#!/bin/sh\necho "srun $*" >> "$FAKE_SLURM/calls"\nsleep 3\n'
                    'echo \'0: {"kind": "node", "host": "sfn1", "job": "77"}\'\n')
    srun.chmod(0o755)
    h.answer("sinfo", "sfn1 allocated\nsfn2 down*")
    h.answer("show_job", "JobId=77 JobState=COMPLETING Restarts=1 Requeue=1")
    beats = tmp_path / "beats"
    proc = h.start("--events", "hang,node_fail", "--hang-timeout", "60", "--progress-dir",
                   str(beats))
    deadline = time.time() + 30
    while not any(c.startswith("srun") for c in h.calls()) and time.time() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)  # Slurm: node failure, job requeued
    rc, out = finish(proc)
    assert rc == 143, out
    end = h.events()[-1]
    assert (end["reason"], end["nodes"]) == ("node_fail", ["sfn2"])
    assert "sfn2 is not answering Slurm: the culprit node" in out
    assert not any(call.startswith("scontrol requeue") for call in h.calls())
