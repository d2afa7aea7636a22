"""slurmfabric's own jobs and steps: the sbatch options of a job pinned to named nodes (the
pair sweep, the RoCE audit) and the ``srun --overlap`` step that joins a running job (``jobs
diagnose``).

The user's own jobs take their options from the config (job/options.py); these are the
few jobs slurmfabric writes for itself, spelled once here next to the commands that run
them (slurm/cmd.py). Option names and meanings: sbatch(1) and srun(1).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from slurmfabric.errors import SlurmCommandError
from slurmfabric.slurm.cmd import _execute, cluster_args


def pinned_job_options(nodes: Sequence[str], *, job_name: str, tasks_per_node: int = 1,
                       output: str | os.PathLike[str] | None = None,
                       partition: str | None = None, time_limit: str | None = None,
                       gpus_per_node: int | None = None) -> list[str]:
    """The ``#SBATCH`` options of a job on exactly ``nodes``: ``--nodes`` and
    ``--nodelist`` together, so Slurm neither adds nor drops a node (sbatch(1): a nodelist
    with fewer nodes than ``--nodes`` lets Slurm add any others)."""
    options = [f"--job-name={job_name}", f"--nodes={len(nodes)}",
               f"--nodelist={','.join(nodes)}", f"--ntasks-per-node={tasks_per_node}"]
    if output is not None:
        options.append(f"--output={output}")
    if partition:
        options.append(f"--partition={partition}")
    if time_limit:
        options.append(f"--time={time_limit}")
    if gpus_per_node:
        options.append(f"--gpus-per-node={gpus_per_node}")
    return options


def exact_step_options(nodes: int | None, tasks_per_node: int, *, exact: bool = True,
                       gpus_per_node: int | None = None, mpi: str | None = None) -> list[str]:
    """``srun`` options of a step on ``nodes`` nodes (None: the step's caller gives
    ``--nodes``/``--ntasks`` itself) with ``tasks_per_node`` tasks each; ``--exact``: only
    the CPUs it asks for, so several steps run side by side in one allocation."""
    counts = [f"--nodes={nodes}", f"--ntasks={nodes * tasks_per_node}"] if nodes else []
    return [*counts, f"--ntasks-per-node={tasks_per_node}", *(["--exact"] if exact else []),
            *([f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else []),
            *([f"--mpi={mpi}"] if mpi else [])]


def overlap_step_command(job_id: str, command: Sequence[str], *, cluster: str | None = None,
                         nodes: int | None = None, job_name: str | None = None) -> list[str]:
    """``srun --overlap --jobid=JOB``: one task per node of a running job, next to its own
    steps (``--overlap`` shares their CPUs; Slurm >= 20.11 needs it to start at all while the
    job's steps hold every CPU). ``nodes``: the job's node count, given as ``--nodes`` and
    ``--ntasks``; without them srun takes the counts from its environment (inside the batch
    shell SLURM_NTASKS is the job's task count: several tasks per node), and outside any
    job srun runs one task. A failing task does not end the others (``--kill-on-bad-exit=0``);
    ``--label`` prefixes each line with its task number. ``--`` ends srun's options, so the
    command is never read as one."""
    counts = [f"--nodes={nodes}", f"--ntasks={nodes}"] if nodes else []
    return ["srun", "--overlap", f"--jobid={job_id}", *cluster_args(cluster), *counts,
            "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--label", "--quiet",
            *([f"--job-name={job_name}"] if job_name else []), "--", *command]


@dataclass(frozen=True)
class StepOutput:
    """What an overlap step printed: some tasks may have failed and others answered."""

    returncode: int
    stdout: str
    stderr: str


def overlap_step(job_id: str, command: Sequence[str], *, timeout: float,
                 cluster: str | None = None, nodes: int | None = None,
                 job_name: str | None = None,
                 env: dict[str, str] | None = None) -> StepOutput:
    """Run ``command`` on every node of the running job (``overlap_step_command``). A
    non-zero exit is returned, not raised: the caller reads what the other nodes printed;
    a missing srun or the timeout raise SlurmCommandError."""
    argv = overlap_step_command(job_id, command, cluster=cluster, nodes=nodes,
                                job_name=job_name)
    proc = _execute(argv, timeout, None, env, None, SlurmCommandError, check=False)
    return StepOutput(proc.returncode, proc.stdout, proc.stderr)
