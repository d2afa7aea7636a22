"""The job's Slurm options in one table, and the job's shape, for every output.

The sbatch script's ``#SBATCH`` lines (render.py), the pyslurm backend's
``JobSubmitDescription`` fields (submit.py) and the Kubernetes manifests (k8s.py) all read
``shape()`` and ``OPTIONS``, so a derived value (tasks per node, torchrun workers, the
requeue flag that restart events imply, the warning signal) is computed once: a backend
can no longer lose ``--requeue`` or count workers its own way (issue 30).

pyslurm attribute names are those of ``JobSubmitDescription`` in pyslurm 25.11.2
(pyslurm/core/job/submission.pxd, ``cdef public``); tests/fixtures/pyslurm/ lists them
and the tests check every name used here against that list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from slurmfabric.config.models import JobConfig
from slurmfabric.errors import UsageError

# Slurm requeues a job on preemption or node failure only when it is requeueable.
_SLURM_REQUEUES = frozenset({"preempt", "node_fail"})


@dataclass(frozen=True)
class Signal:
    """sbatch ``--signal=[B:]SIG@SECONDS``: the warning before the time limit."""

    name: str  # without "SIG", as the config stores it
    seconds: int
    batch_only: bool  # B: only the batch shell gets it (the resume supervisor)

    def sbatch(self) -> str:
        return f"{'B:' if self.batch_only else ''}{self.name}@{self.seconds}"

    def pyslurm(self) -> str:
        """pyslurm looks the name up in Python's ``signal.Signals`` (utils/helpers.pyx
        ``signal_to_num``), which knows ``SIGUSR2`` but not ``USR2``."""
        return f"{'B:' if self.batch_only else ''}SIG{self.name}@{self.seconds}"


@dataclass(frozen=True)
class Shape:
    """What every backend must agree on: the allocation and the job's restart behaviour."""

    nodes: int
    tasks_per_node: int  # Slurm tasks: 1 for torchrun (it spawns the workers)
    workers_per_node: int  # ranks per node: torchrun workers, else the Slurm tasks
    gpus_per_node: int
    requeue: Optional[bool]  # None: Slurm's default (JobRequeue in slurm.conf)
    signal: Optional[Signal]
    open_mode: Optional[str]  # "append": a requeued job keeps one output file


def shape(config: JobConfig) -> Shape:
    """The job's shape from its config; the one place these values are derived."""
    job, launcher = config.job, config.launcher
    if launcher.type == "torchrun":
        tasks = 1
    elif launcher.type == "nccl-tests":
        tasks = job.ntasks_per_node or job.gpus_per_node // launcher.nccl_tests.gpus_per_rank
    else:
        tasks = job.ntasks_per_node or job.gpus_per_node
    workers = (launcher.nproc_per_node or job.gpus_per_node) if launcher.type == "torchrun" \
        else tasks
    resume = launcher.resume
    requeue = job.requeue
    if resume.enabled and (resume.mode == "requeue" or _SLURM_REQUEUES & set(resume.events)):
        requeue = True
    signal: Optional[Signal] = None
    if resume.enabled:
        # B: the batch shell alone gets the warning (the supervisor asks the program for a
        # checkpoint); append: a requeued job keeps one output file (sbatch(1)).
        signal = Signal(resume.signal, resume.grace_seconds, batch_only=True)
    elif launcher.signal:
        # Sent to every job step (not the batch shell) signal_seconds before the time limit.
        signal = Signal(launcher.signal, launcher.signal_seconds, batch_only=False)
    return Shape(nodes=job.nodes, tasks_per_node=tasks, workers_per_node=workers,
                 gpus_per_node=job.gpus_per_node, requeue=requeue, signal=signal,
                 open_mode="append" if resume.enabled else None)


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Option:
    """One Slurm option: its value (None: not given), its sbatch(1) long option and its
    pyslurm ``JobSubmitDescription`` attribute, each with its own spelling of the value."""

    sbatch: str  # sbatch(1) long option, without "--"
    pyslurm: str  # JobSubmitDescription attribute (pyslurm 25.11)
    value: Callable[[JobConfig, Shape], Any]
    to_pyslurm: Callable[[Any], Any] = _same
    to_sbatch: Optional[Callable[[Any], str]] = None  # default: --NAME=VALUE

    def sbatch_line(self, value: Any) -> str:
        if self.to_sbatch is not None:
            return self.to_sbatch(value)
        return f"--{self.sbatch}={value}"


def _job(name: str) -> Callable[[JobConfig, Shape], Any]:
    return lambda config, _shape: getattr(config.job, name)


OPTIONS: tuple[Option, ...] = (
    Option("job-name", "name", _job("name")),
    Option("nodes", "nodes", lambda _c, s: s.nodes),
    Option("ntasks-per-node", "ntasks_per_node", lambda _c, s: s.tasks_per_node),
    # pyslurm has no gpus_per_node: its docs send --gpus-per-node to gres_per_node.
    Option("gpus-per-node", "gres_per_node", lambda _c, s: s.gpus_per_node or None,
           to_pyslurm=lambda n: f"gpu:{n}"),
    Option("partition", "partitions", _job("partition")),
    Option("account", "account", _job("account")),
    Option("qos", "qos", _job("qos")),
    Option("time", "time_limit", _job("time")),
    Option("mem", "memory_per_node", _job("mem")),  # a string: pyslurm skips a falsy 0
    Option("cpus-per-task", "cpus_per_task", _job("cpus_per_task")),
    Option("constraint", "constraints", _job("constraint")),
    Option("reservation", "reservations", _job("reservation")),
    Option("output", "standard_output", _job("output")),
    Option("error", "standard_error", _job("error")),
    Option("array", "array", _job("array")),
    Option("dependency", "dependencies", _job("dependency")),
    Option("mail-type", "mail_types", _job("mail_type")),
    Option("mail-user", "mail_user", _job("mail_user")),
    Option("exclusive", "resource_sharing", lambda c, _s: True if c.job.exclusive else None,
           to_pyslurm=lambda _v: "exclusive", to_sbatch=lambda _v: "--exclusive"),
    Option("requeue", "is_requeueable", lambda _c, s: s.requeue,
           to_sbatch=lambda v: "--requeue" if v else "--no-requeue"),
    Option("signal", "signal", lambda _c, s: s.signal, to_pyslurm=Signal.pyslurm,
           to_sbatch=lambda v: f"--signal={v.sbatch()}"),
    Option("open-mode", "log_files_open_mode", lambda _c, s: s.open_mode),
)

# Set by the pyslurm backend itself, not from the table: the script and where it starts.
PYSLURM_SCRIPT = "script"
PYSLURM_WORKDIR = "working_directory"


def pyslurm_attributes() -> frozenset[str]:
    """Every JobSubmitDescription attribute slurmfabric may set."""
    return frozenset({o.pyslurm for o in OPTIONS} | {PYSLURM_SCRIPT, PYSLURM_WORKDIR})


def given(config: JobConfig) -> list[tuple[Option, Any]]:
    """The table's options that this config sets, with their values."""
    job_shape = shape(config)
    out = []
    for option in OPTIONS:
        value = option.value(config, job_shape)
        if value is not None:
            out.append((option, value))
    return out


def sbatch_options(config: JobConfig) -> list[str]:
    """The modelled ``#SBATCH`` options, sorted (raw ``extra_sbatch`` lines come after)."""
    return sorted(option.sbatch_line(value) for option, value in given(config))


def pyslurm_fields(config: JobConfig) -> dict[str, Any]:
    """The same options as JobSubmitDescription attributes. Raw ``extra_sbatch`` lines have
    no attribute, so they are refused rather than dropped (pyslurm's own #SBATCH parser,
    load_sbatch_options, splits on '=' and '#' and is not used)."""
    if config.job.extra_sbatch:
        raise UsageError(
            "job.extra_sbatch lines cannot be passed through the pyslurm backend",
            hint="use --backend sbatch, or model the option in the config",
        )
    return {option.pyslurm: option.to_pyslurm(value) for option, value in given(config)}
