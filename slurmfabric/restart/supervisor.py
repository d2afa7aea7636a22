"""The batch shell's side of resuming: run the launch, survive what Slurm does to the job.

``slurmfabric resume supervise -- <launch>`` is exec'd as the last line of a job script
rendered with ``[launcher.resume]``. It is the batch shell process, so it gets the
``--signal=B:SIG@GRACE`` warning (B: only the batch shell, sbatch(1)). It tells the events
apart by Slurm's own signals and state, never by elapsed time
(https://github.com/facebookincubator/submitit/issues/1656):

- **timeout**: the warning signal arrives while squeue's time left (``%L``) is within the
  grace period. It asks the program for a checkpoint (the save-request file), stops the
  launch once the checkpoint is complete, then requeues the job from here (never from a rank)
  or submits the successor.
- **preempt / node_fail**: Slurm ends the job itself with SIGTERM and requeues it
  (``--requeue``). Its restart count (``Restarts=``) has already gone up. A node of the
  allocation that is DOWN or not responding makes it a node failure. The next start finds
  the job on other nodes: Slurm schedules nothing on a DOWN node.
- **worker_fail**: the launch exits non-zero on its own. torchrun has already restarted its
  workers (``--max-restarts``); any other launcher gets the job requeued. The record names
  the first failed rank and its node from srun's own line on the launch's stderr
  (``srun: error: NODE: task N: Exited with exit code C``), which passes through here.
- **hang / slow**: with a progress directory (``--progress-dir``, the ranks'
  ``SLURMFABRIC_PROGRESS_DIR``) the ranks' heartbeats are read every 5 s
  (``restart.hang``). Every finding is printed into the job log and recorded; a hang runs
  the stack diagnosis (``jobs diagnose``) to name the culprit rank and node. With the event
  in ``--events``: a hang stops the launch, a slow rank first gets a checkpoint asked for,
  then the job restarts without the culprit's node (``ExcNodeList`` before the requeue, or
  ``--exclude`` for the chained successor).

Restarts are counted by Slurm (``SLURM_RESTART_COUNT``) for requeues and by
``SLURMFABRIC_CHAIN_COUNT`` for chained successors. Past ``max_restarts`` the job stops with
one line that says why.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from slurmfabric.errors import SlurmCommandError
from slurmfabric.progress.watch import Finding
from slurmfabric.restart import Checkpoints, events
from slurmfabric.restart.hang import Watcher, culprits
from slurmfabric.slurm import cmd

if TYPE_CHECKING:
    from slurmfabric.job.follow import TaskFailure

BAD_NODE_FLAGS = {"NOT_RESPONDING", "DOWN", "FAIL", "FAILING", "DRAIN", "DRAINING",
                  "DRAINED"}
STOP_WAIT = 15.0  # seconds the launch gets to exit after SIGTERM before SIGKILL
FINISH_WAIT = 5.0  # seconds a checkpointed program gets to exit on its own before SIGTERM
SLURM_NOTICE_WAIT = 120.0  # how long a failed launch waits for Slurm to act on a bad node


@dataclass
class Options:
    events: list[str]
    max_restarts: int = 3
    signal: str = "USR2"
    grace: int = 120
    mode: str = "requeue"
    keep: int = 2
    launcher: str = "srun"
    script: str | None = None  # the job script, resubmitted in chain mode
    checkpoint_dir: str = ""
    progress_dir: str = ""  # the ranks' heartbeats (slurmfabric.progress); empty: not watched
    hang_timeout: float = 300.0
    slow_ratio: float = 1.10
    prom: str = ""  # Prometheus textfile of the heartbeat findings; empty: none


@dataclass
class Job:
    """Who this job is, read once from the batch shell's environment."""

    job_id: str
    target: str  # what scontrol requeue names: the array task, not the array
    run: str  # one id across requeues and chained successors
    nodes: str
    slurm_restarts: int
    chain: int
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Job:
        job_id = env.get("SLURM_JOB_ID", "")
        array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        target = f"{array}_{task}" if array and task else job_id
        return cls(job_id=job_id, target=target, run=env.get("SLURMFABRIC_RUN_ID") or target,
                   nodes=env.get("SLURM_JOB_NODELIST", ""),
                   slurm_restarts=_count(env.get("SLURM_RESTART_COUNT")),
                   chain=_count(env.get("SLURMFABRIC_CHAIN_COUNT")), env=env)

    @property
    def restarts(self) -> int:
        return self.slurm_restarts + self.chain


def _count(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0


def _say(message: str) -> None:
    print(f"slurmfabric: resume: {message}", flush=True)


class Supervisor:
    def __init__(self, command: list[str], options: Options, job: Job) -> None:
        self.command, self.o, self.job = command, options, job
        self.checkpoints = Checkpoints(options.checkpoint_dir, options.keep)
        self.request = os.path.join(events.state_dir(options.checkpoint_dir), "save-request")
        self.flags: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.exclude: list[str] = []  # nodes the next start must not get
        self.failed: list[TaskFailure] = []  # srun's own failure lines, as they come
        self.stderr: threading.Thread | None = None
        # the heartbeats when there is a directory; the launch's output (our stdout, the
        # job's output file) stands in while no rank writes beats
        self.watcher = Watcher(options.progress_dir, job.job_id, options.hang_timeout,
                               options.slow_ratio, options.prom, log_fd=1) \
            if options.progress_dir or "hang" in options.events else None

    # -- the record ------------------------------------------------------------------------

    def _log(self, event: str, **fields: object) -> None:
        events.append(self.o.checkpoint_dir, {
            "event": event, "time": time.time(), "run": self.job.run, "job": self.job.job_id,
            "restart": self.job.restarts, **fields})

    def _latest_step(self) -> int | None:
        latest = self.checkpoints.latest()
        return latest[0] if latest else None

    def _reached(self) -> int | None:
        progress = events.read_progress(self.o.checkpoint_dir) or {}
        step = progress.get("step")
        return step if isinstance(step, int) else None

    def _bad_nodes(self, nodelist: str) -> list[str]:
        if not nodelist:
            return []
        try:
            states = cmd.node_states(nodelist, env=self.job.env)
        except SlurmCommandError:
            return []
        return sorted(node for node, state in states.items()
                      if cmd.node_state_flags(state) & BAD_NODE_FLAGS)

    # -- start -----------------------------------------------------------------------------

    def _close_unrecorded(self) -> None:
        """A run that ended with no record (its batch shell was killed outright, e.g. with
        its node) gets one now, from what Slurm says about its nodes."""
        history = events.read(self.o.checkpoint_dir, self.job.run)
        starts = [e for e in history if e.get("event") == "start"]
        if not starts or not self.job.restarts or any(
                e.get("event") == "end" for e in history[history.index(starts[-1]):]):
            return
        last = starts[-1]
        bad = self._bad_nodes(str(last.get("nodes", "")))
        reached = self._reached()
        events.append(self.o.checkpoint_dir, {
            "event": "end", "time": time.time(), "run": self.job.run, "job": last.get("job"),
            "restart": last.get("restart"), "reason": "node_fail" if bad else "unknown",
            "nodes": bad, "step_reached": reached, "checkpoint_step": self._latest_step(),
            "inferred": True, "action": "requeued by slurm"})

    def start(self) -> int | None:
        """Log the start; a number when the job must stop here (past max_restarts)."""
        self._close_unrecorded()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.request)
        if self.o.progress_dir:  # the last run's beats would read as a hang at once
            with contextlib.suppress(OSError):
                for name in os.listdir(self.o.progress_dir):
                    if name.startswith("rank-") and name.endswith(".beat"):
                        os.unlink(os.path.join(self.o.progress_dir, name))
        step = self._latest_step()
        self._log("start", nodes=self.job.nodes, from_step=step)
        where = f"resuming from checkpoint step {step}" if step is not None else \
            "no checkpoint yet, starting from the beginning"
        _say(f"job {self.job.target} start {self.job.restarts} (max_restarts "
             f"{self.o.max_restarts}) on {self.job.nodes}: {where}")
        if self.job.restarts > self.o.max_restarts:
            self._final("max_restarts", f"restart {self.job.restarts} is past max_restarts = "
                        f"{self.o.max_restarts}; Slurm requeued the job after an interruption "
                        "it handles itself (preemption or node failure)")
            return 1
        return None

    # -- running ---------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: object) -> None:
        self.flags.append(signal.Signals(signum).name)

    def child_env(self) -> dict[str, str]:
        env = dict(self.job.env)
        env.update(SLURMFABRIC_CHECKPOINT_DIR=self.o.checkpoint_dir,
                   SLURMFABRIC_RESTART_COUNT=str(self.job.restarts),
                   SLURMFABRIC_SAVE_REQUEST=self.request,
                   SLURMFABRIC_CHECKPOINT_KEEP=str(self.o.keep),
                   SLURMFABRIC_RUN_ID=self.job.run)
        if self.o.progress_dir:
            env["SLURMFABRIC_PROGRESS_DIR"] = self.o.progress_dir
        return env

    def run(self) -> int:
        stop = self.start()
        if stop is not None:
            return stop
        warning = getattr(signal, f"SIG{self.o.signal}")
        for signum in (warning, signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        # srun says which task failed on which node on its stderr ("srun: error: NODE:
        # task N: Exited with exit code C"): read it on its way to ours
        self.proc = subprocess.Popen(self.command, env=self.child_env(),
                                     stderr=subprocess.PIPE)
        self.stderr = threading.Thread(target=self._copy_stderr, args=(self.proc.stderr,),
                                       daemon=True)
        self.stderr.start()
        while True:
            try:
                rc = self.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                rc = None
            if self.flags:
                name = self.flags.pop(0)
                if name == f"SIG{self.o.signal}":
                    result = self._warning()
                else:
                    result = self._terminated(name)
                if result is not None:
                    return result
                continue
            if rc is not None:
                return self._exited(rc)
            for finding in self.watcher.poll() if self.watcher is not None else []:
                result = self._finding(finding)
                if result is not None:
                    return result

    def _copy_stderr(self, pipe: IO[bytes]) -> None:
        from slurmfabric.job.follow import task_failure

        for number, line in enumerate(iter(pipe.readline, b""), 1):
            with contextlib.suppress(OSError):
                os.write(2, line)
            self.failed += task_failure(line.decode("utf-8", "replace").rstrip("\n"), number)

    def _first_failure(self) -> tuple[str, list[dict[str, object]]]:
        """(" (rank 3 on sfn2: exit code 1)", the failures as data) from srun's lines."""
        from slurmfabric.job.follow import first_failures

        if self.stderr is not None:
            self.stderr.join(timeout=5.0)  # the launch has exited: its last lines follow
        failed = first_failures(self.failed)
        who = "rank" if self.o.launcher == "srun" else "task"
        data = [{who: f.rank, "node": f.node, "what": f.what} for f in failed[:64]]
        if not failed:
            return "", data
        first = failed[0]
        return f" ({who} {first.rank} on {first.node}: {first.what})", data

    # -- the four ways a run ends ----------------------------------------------------------

    def _warning(self) -> int | None:
        """The time-limit warning: checkpoint, stop, requeue. None: not a timeout after all."""
        try:
            left = cmd.time_left(self.job.job_id, env=self.job.env)
        except SlurmCommandError:
            left = None
        if left is not None and left > self.o.grace + 60:
            # Slurm also sends the user signal on preemption (PreemptParameters=
            # send_user_signal); Slurm requeues then, as on SIGTERM.
            self._log("warning", time_left=left)
            _say(f"{self.o.signal} with {left} s left: not the time limit (preemption?); "
                 "asking for a checkpoint")
            self._ask_checkpoint()
            return None
        asked = time.time()
        before = self._latest_step()
        self._ask_checkpoint()
        _say(f"time limit in {left if left is not None else '?'} s: asked for a checkpoint")
        deadline = asked + max(5.0, self.o.grace - 20.0 - STOP_WAIT)
        # Wait for a checkpoint newer than the request's: the program keeps training while
        # it answers, so "the last checkpoint covers the last step" would be a race.
        while time.time() < deadline and self.proc and self.proc.poll() is None:
            latest = self._latest_step()
            if latest is not None and (before is None or latest > before):
                break
            time.sleep(0.2)
        answered = time.time()
        # A program whose last checkpoint is its final step is about to exit by itself:
        # while it trains no further, give it a moment, so a finished run is not requeued.
        saved = self._latest_step()
        until = answered + FINISH_WAIT
        while self.proc and self.proc.poll() is None and time.time() < until:
            reached = self._reached()
            if reached is not None and saved is not None and reached > saved:
                break  # still training: stop it now
            time.sleep(0.1)
        if self.proc and self.proc.poll() is not None:
            return self._exited(self.proc.returncode)  # it finished (or failed) on its own
        self._stop_child()
        step, reached = self._latest_step(), self._reached()
        waited = answered - asked
        return self._continue_or_stop("timeout", f"checkpoint at step {step} after {waited:.1f}"
                                      f" s (step {reached} reached)", step_reached=reached,
                                      checkpoint_step=step, seconds_to_checkpoint=waited)

    def _terminated(self, name: str) -> int:
        """Slurm ends the job: preemption, node failure, scancel or the hard time limit."""
        try:
            record = cmd.job(self.job.job_id, env=self.job.env)
        except SlurmCommandError:
            record = {}
        restarts = record.get("Restarts", "")
        requeued = restarts.isdigit() and int(restarts) > self.job.slurm_restarts
        bad = self._bad_nodes(self.job.nodes)
        reason = "node_fail" if bad else "preempt" if requeued else "cancelled"
        self._ask_checkpoint()
        self._log("end", reason=reason, signal=name, nodes=bad,
                  job_state=cmd.job_state(record.get("JobState")),
                  step_reached=self._reached(), checkpoint_step=self._latest_step(),
                  action="requeued by slurm" if requeued else "none")
        what = {"node_fail": f"node failure ({', '.join(bad)})", "preempt": "preempted",
                "cancelled": "cancelled or out of time"}[reason]
        then = "Slurm requeues the job" if requeued else "the job ends"
        _say(f"{name}: {what}; last checkpoint step {self._latest_step()}; {then}")
        self._stop_child(grace=STOP_WAIT)
        return 143

    def _exited(self, rc: int) -> int:
        reached = self._reached()
        if rc == 0:
            self._log("end", reason="finished", step_reached=reached,
                      checkpoint_step=self._latest_step(), action="none")
            _say(f"finished (step {reached})")
            return 0
        bad = self._bad_nodes(self.job.nodes)
        if bad:
            # A node went silent; Slurm marks it DOWN within SlurmdTimeout and requeues
            # the job without it (SIGTERM lands in _terminated).
            _say(f"launch exited {rc} while {', '.join(bad)} is not answering; waiting for "
                 "Slurm to requeue the job without it")
            deadline = time.time() + SLURM_NOTICE_WAIT
            while time.time() < deadline:
                if self.flags:
                    return self._terminated(self.flags.pop(0))
                time.sleep(0.5)
        first, failed = self._first_failure()
        if self.o.launcher == "torchrun":
            return self._final("worker_fail", f"torchrun exited {rc}{first} after restarting "
                               f"its workers up to {self.o.max_restarts} times "
                               "(--max-restarts)", rc=rc, exit_code=rc, failed=failed)
        return self._continue_or_stop("worker_fail", f"launch exited {rc}{first}",
                                      exit_code=rc, failed=failed, step_reached=reached,
                                      checkpoint_step=self._latest_step())

    def _finding(self, finding: Finding) -> int | None:
        """A hang or slow rank from the heartbeats: said and recorded always; acted on when
        its event is in ``--events``. None: the launch keeps running."""
        print(finding.log_line(), flush=True)
        lines, nodes, data = culprits(finding, self.job.job_id, env=self.job.env)
        for line in lines:
            _say(line)
        # A node that stopped answering explains a hang better than any rank: its ranks
        # are gone, the others wait for them (the diagnosis cannot reach it).
        silent = self._bad_nodes(self.job.nodes) if finding.kind == "hang" else []
        unreached = self._unreached(data) if finding.kind == "hang" and data else []
        if unreached and not silent and finding.kind in self.o.events:
            # a collector did not answer: the node may be dead and not yet marked (Slurm
            # waits SlurmdTimeout); wait for Slurm's verdict before blaming a rank
            _say(f"hang: no answer from {', '.join(unreached)}; waiting up to "
                 f"{SLURM_NOTICE_WAIT:.0f} s for Slurm to mark it")
            deadline = time.time() + SLURM_NOTICE_WAIT
            while time.time() < deadline and not self.flags and not silent:
                time.sleep(1.0)
                silent = self._bad_nodes(",".join(unreached))
        if silent:
            _say(f"hang: {', '.join(silent)} is not answering Slurm: the culprit node")
            nodes = silent
        self._log("finding", kind=finding.kind, signal=finding.signal, detail=finding.detail,
                  ranks=finding.ranks, nodes=nodes, culprits=data.get("culprits"),
                  named_after=round(time.time() - finding.time, 2))
        if self.flags:  # Slurm acted while the diagnosis ran (a node failure, the time
            # limit): its signal decides, not the finding
            name = self.flags.pop(0)
            return self._warning() if name == f"SIG{self.o.signal}" else \
                self._terminated(name)
        if finding.kind not in self.o.events:
            return None
        if finding.kind == "slow":  # still training: keep its progress
            before = self._latest_step()
            self._ask_checkpoint()
            deadline = time.time() + max(5.0, self.o.grace - 20.0 - STOP_WAIT)
            while time.time() < deadline and self.proc and self.proc.poll() is None:
                latest = self._latest_step()
                if latest is not None and (before is None or latest > before):
                    break
                time.sleep(0.2)
        self._stop_child()
        self.exclude = nodes
        where = f"culprit node(s) {', '.join(nodes)}" if nodes else "culprit node unknown"
        return self._continue_or_stop(finding.kind, f"{finding.detail}; {where}",
                                      nodes=nodes, signal=finding.signal, since=finding.since,
                                      step_reached=self._reached(),
                                      checkpoint_step=self._latest_step())

    def _unreached(self, diagnosis: dict[str, object]) -> list[str]:
        """The job's nodes whose collector printed nothing in the diagnosis."""
        from slurmfabric.slurm.hostlist import HostlistError, expand

        answered = {str(n.get("host")) for n in diagnosis.get("nodes") or []
                    if isinstance(n, dict)}
        try:
            nodes = expand(self.job.nodes) if self.job.nodes else []
        except HostlistError:
            return []
        return [node for node in nodes if node not in answered]

    def _exclude_on_requeue(self) -> None:
        """The job's ExcNodeList plus the culprits, set right after the requeue: the
        requeued job keeps its node count and is not started on them again.

        Slurm 22.05 refuses ``ExcNodeList`` on a running job ("Job is no longer pending
        execution", job_mgr.c update_job), and accepts it once ``scontrol requeue`` made it
        pending again (recorded on the testbed). The requeued job waits out its BeginTime
        (cred_expire + 1 s, AuthInfo in slurm.conf(5)) first, so the update lands before it
        can start; this batch shell catches Slurm's SIGTERM and is killed only after
        KillWait. ``requeuehold`` + update + ``release`` would leave the job held for good
        if this shell died between the calls; a plain requeue at worst restarts without
        the exclusion."""
        try:
            record = cmd.job(self.job.job_id, env=self.job.env)
            have = record.get("ExcNodeList", "")
            nodes = ",".join([*([have] if have and have != "(null)" else []), *self.exclude])
            cmd.update_job(self.job.target, env=self.job.env, ExcNodeList=nodes)
            _say(f"excluded {', '.join(self.exclude)} from the next start")
        except SlurmCommandError as error:
            _say(f"could not exclude {', '.join(self.exclude)}: {error}")

    # -- helpers ---------------------------------------------------------------------------

    def _continue_or_stop(self, reason: str, detail: str, exit_code: int | None = None,
                          **fields: object) -> int:
        if reason not in self.o.events:
            return self._final(reason, f"{detail}; '{reason}' is not in launcher.resume.events",
                               rc=exit_code or 1, **fields)
        if self.job.restarts >= self.o.max_restarts:
            return self._final(reason, f"{detail}; max_restarts = {self.o.max_restarts} used "
                               "up", rc=exit_code or 1, **fields)
        if self.o.mode == "chain":  # the successor's id goes into the record
            action, successor = self._resubmit()
            self._log("end", reason=reason, action=action, exit_code=exit_code,
                      successor=successor, **fields)
            _say(f"{reason}: {detail}; {action} (restart {self.job.restarts + 1} of "
                 f"{self.o.max_restarts})")
            return 0
        # A requeue makes Slurm kill this batch shell at once: the record and the message
        # go first, or a loaded node loses them (the next start then knows no reason).
        action = f"requeued {self.job.target}"
        self._log("end", reason=reason, action=action, exit_code=exit_code, successor=None,
                  **fields)
        _say(f"{reason}: {detail}; {action} (restart {self.job.restarts + 1} of "
             f"{self.o.max_restarts})")
        try:
            self._resubmit()
        except SlurmCommandError as error:
            if "pending" in str(error).lower():  # Slurm requeued it first (a node failure)
                _say(f"Slurm has requeued {self.job.target} already: {error}")
                return 0
            return self._final(reason, f"{detail}; the requeue failed: {error}",
                               rc=exit_code or 1, **fields)
        return 0

    def _resubmit(self) -> tuple[str, str | None]:
        """Requeue this job, or submit its successor; (what was done, successor id)."""
        if self.o.mode == "chain":
            if not self.o.script:
                raise SlurmCommandError("chain mode needs the job script (--script)")
            successor = cmd.sbatch_file(self.o.script, [
                *([f"--exclude={','.join(self.exclude)}"] if self.exclude else []),
                f"--dependency=afterany:{self.job.job_id}",
                f"--export=ALL,SLURMFABRIC_CHAIN_COUNT={self.job.chain + 1},"
                f"SLURMFABRIC_RUN_ID={self.job.run}"], env=self.job.env)
            return f"submitted successor {successor.job_id}", successor.job_id
        if self.exclude:
            # The requeue sends SIGTERM to every process of the batch step, the scontrol
            # that sets the exclusion included (it died with -15 on the testbed); ignored
            # signals stay ignored across exec (signal(7)), so it finishes. SIGKILL
            # follows only after KillWait.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cmd.requeue(self.job.target, env=self.job.env)
        if self.exclude:
            self._exclude_on_requeue()
        return f"requeued {self.job.target}", None

    def _final(self, reason: str, detail: str, rc: int = 1, **fields: object) -> int:
        self._log("end", reason=reason, action="stopped", final=True, **fields)
        _say(f"stopped: {reason}: {detail}")
        return rc

    def _ask_checkpoint(self) -> None:
        os.makedirs(os.path.dirname(self.request), exist_ok=True)
        with open(self.request, "w") as handle:
            handle.write(f"{time.time()}\n")

    def _stop_child(self, grace: float = STOP_WAIT) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # srun forwards it to every task (srun(1))
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def supervise(command: list[str], options: Options, env: dict[str, str] | None = None) -> int:
    """Run ``command`` under the resume rules; the batch shell's exit code."""
    job = Job.from_env(dict(os.environ if env is None else env))
    if not job.job_id:
        print("slurmfabric: error: resume supervise runs in a Slurm batch job "
              "(SLURM_JOB_ID is not set)", file=sys.stderr)
        return 2
    return Supervisor(command, options, job).run()
