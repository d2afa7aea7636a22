"""A handle on a running testbed for the tests: run commands, submit, wait.

Test-only, so it lives under tests/ and stays out of the wheel; the tests get it through
the session fixture in ``tests/conftest.py``. Only job-level conveniences live here; Slurm
command lines themselves come from ``slurmfabric.slurm.cmd``.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from slurmfabric.slurm import cmd
from slurmfabric.testbed import Testbed, write_extra_conf


@dataclass(frozen=True)
class JobResult:
    job_id: str
    state: str
    output: str
    record: dict


class Cluster:
    """The running testbed as tests see it."""

    def __init__(self, testbed: Testbed) -> None:
        self.testbed = testbed
        self.nodes = testbed.s.node_names
        self.partition = testbed.s.partition
        self.conf_path = testbed.s.conf_path
        self.state_dir = testbed.s.state_dir
        self.env = testbed.env()

    def run(self, args: list[str], check: bool = True, timeout: float = 60,
            **kwargs) -> subprocess.CompletedProcess:
        """Run a command against this cluster (SLURM_CONF set), capturing text output."""
        env = dict(self.env, **kwargs.pop("env", {}))
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                              env=env, **kwargs)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{args} exited {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}")
        return proc

    def jobs_dir(self) -> Path:
        path = self.state_dir / "jobs"
        path.mkdir(exist_ok=True)
        return path

    def submit(self, script: str, *sbatch_args: str, workdir: Path | None = None) -> str:
        workdir = workdir or self.jobs_dir()
        job = cmd.sbatch(script, list(sbatch_args), workdir=workdir, env=self.env)
        return job.job_id

    def job(self, job_id: str) -> dict:
        return cmd.job(job_id, env=self.env)

    def wait(self, job_id: str, timeout: float = 180) -> str:
        """Poll until the job reaches a final state; return that state."""
        record = cmd.wait_job(job_id, timeout, poll=0.3, env=self.env)
        return cmd.job_state(record.get("JobState"))

    def sbatch_wait(self, script: str, *sbatch_args: str, timeout: float = 180,
                    workdir: Path | None = None) -> JobResult:
        job_id = self.submit(script, *sbatch_args, workdir=workdir)
        state = self.wait(job_id, timeout)
        record = self.job(job_id)
        output = cmd.read_output_file(record.get("StdOut", ""))
        return JobResult(job_id, state, output, record)

    def node_state(self, name: str) -> tuple[str, str]:
        record = cmd.node(name, env=self.env)
        return record.get("State", "UNKNOWN"), cmd.node_reason(record)

    def set_extra_conf(self, text: str) -> None:
        """Rewrite the included slurm.conf fragment and make the daemons reread it."""
        write_extra_conf(self.testbed.s, text)
        self.run(["scontrol", "reconfigure"])
        time.sleep(1.0)  # slurmd rereads asynchronously

    def crash_node(self, name: str) -> list[int]:
        """What a node that loses power does to its daemons: SIGKILL its slurmd, its
        slurmstepds and every process under them, with no goodbye to slurmctld. The
        virtual nodes share one host, so a node's slurmstepds are told apart by the log
        file each holds open (SlurmdLogFile=.../slurmd.%n.log). Returns the killed PIDs."""
        import os
        import signal as signals

        from slurmfabric._common.probe import proc_stat

        log = str(self.testbed.s.state_dir / "log" / f"slurmd.{name}.log")
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        roots = {self.testbed.running()[f"slurmd:{name}"]}
        for pid in pids:
            stat = proc_stat(pid)
            if stat is None or stat[0] != "slurmstepd":
                continue
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
                if any(os.readlink(f"/proc/{pid}/fd/{fd}") == log for fd in fds):
                    roots.add(pid)
            except OSError:
                continue
        parents = {}
        for pid in pids:
            stat = proc_stat(pid)
            if stat is not None and len(stat[1]) > 1 and stat[1][1].isdigit():
                parents[pid] = int(stat[1][1])
        tree, grew = set(roots), True
        while grew:
            grew = False
            for pid, parent in parents.items():
                if parent in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        for pid in tree:
            with contextlib.suppress(OSError):
                os.kill(pid, signals.SIGKILL)
        return sorted(tree)

    def restore_node(self, name: str, timeout: float = 90) -> None:
        """Start the node's slurmd again; ReturnToService=2 brings it back idle."""
        self.testbed.up(timeout=timeout, log=lambda msg: None)


def expected_w(steps: int) -> str:
    """The final parameter of an uninterrupted examples/train_resume.py run of ``steps``
    steps (hex), which every resumed or restarted run must end with."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / "train_resume.py"
    spec = importlib.util.spec_from_file_location("train_resume", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.expected_w(steps).hex()
