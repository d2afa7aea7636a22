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

from slurmfabric.config.vocabulary import BY_SBATCH, COMPONENT_FIELDS, OptionName
from slurmfabric.errors import UsageError
from slurmfabric.slurm import pyslurm as slurm_pyslurm

JobConfig = Any  # config.models.JobConfig, read by attribute (the table is built at import)

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
    pyslurm ``JobSubmitDescription`` attribute, each with its own spelling of the value.
    Its other spellings and the config field that owns it are the config's vocabulary
    (config/vocabulary.py ``NAMES``), which the model's own checks read."""

    sbatch: str  # sbatch(1) long option, without "--"; a name of config.vocabulary.NAMES
    pyslurm: Optional[str]  # JobSubmitDescription attribute (pyslurm 25.11); None: none
    value: Callable[[JobConfig, Shape], Any]
    to_pyslurm: Callable[[Any], Any] = _same
    to_sbatch: Optional[Callable[[Any], str]] = None  # default: --NAME=VALUE

    @property
    def name(self) -> OptionName:
        return BY_SBATCH[self.sbatch]

    @property
    def field(self) -> str:
        return self.name.owner

    @property
    def aliases(self) -> tuple[str, ...]:
        return self.name.aliases

    def sbatch_line(self, value: Any) -> str:
        if self.to_sbatch is not None:
            return self.to_sbatch(value)
        return f"--{self.sbatch}={value}"


def _job(name: str) -> Callable[[JobConfig, Shape], Any]:
    return lambda config, _shape: getattr(config.job, name)


def _gpus(form: str, per: Callable[[Shape], int]) -> Callable[[JobConfig, Shape], Any]:
    """The GPU count of one request form (job.gpu_request), typed when job.gpu_type is set:
    ``h100:8`` (--gpus-per-node, --gpus-per-task), None for the other forms."""
    def value(config: JobConfig, job_shape: Shape) -> Any:
        job = config.job
        if job.gpu_request != form or not job.gpus_per_node:
            return None
        count = per(job_shape)
        return f"{job.gpu_type}:{count}" if job.gpu_type else count
    return value


def _gres(value: Any) -> str:
    """A GPU count as a gres (``gpu:8``, ``gpu:h100:8``): pyslurm's gres_per_node and
    sbatch --gres both take this form."""
    return f"gpu:{value}"


# The options whose value is their [job] field as it is: sbatch(1) name -> pyslurm
# attribute. mem stays a string: pyslurm skips a falsy 0.
_PLAIN = {
    "job-name": "name", "partition": "partitions", "account": "account", "qos": "qos",
    "time": "time_limit", "mem": "memory_per_node", "mem-per-cpu": "memory_per_cpu",
    "mem-per-gpu": "memory_per_gpu", "cpus-per-task": "cpus_per_task",
    "cpus-per-gpu": "cpus_per_gpu", "constraint": "constraints", "reservation": "reservations",
    "output": "standard_output", "error": "standard_error", "array": "array",
    "dependency": "dependencies", "mail-type": "mail_types", "mail-user": "mail_user",
    "ntasks-per-core": "ntasks_per_core", "exclude": "excluded_nodes",
    "nodelist": "required_nodes", "distribution": "distribution",
}

OPTIONS: tuple[Option, ...] = (
    Option("nodes", "nodes", lambda _c, s: s.nodes),
    Option("ntasks-per-node", "ntasks_per_node", lambda _c, s: s.tasks_per_node),
    # pyslurm has no gpus_per_node: its docs send --gpus-per-node to gres_per_node.
    Option("gpus-per-node", "gres_per_node", _gpus("gpus-per-node", lambda s: s.gpus_per_node),
           to_pyslurm=_gres),
    Option("gres", "gres_per_node", _gpus("gres", lambda s: s.gpus_per_node), to_pyslurm=_gres,
           to_sbatch=lambda v: f"--gres={_gres(v)}"),
    Option("gpus-per-task", "gpus_per_task",
           _gpus("gpus-per-task", lambda s: s.gpus_per_node // s.tasks_per_node)),
    *(Option(name, attribute, _job(BY_SBATCH[name].owner.removeprefix("job.")))
      for name, attribute in _PLAIN.items()),
    Option("exclusive", "resource_sharing", lambda c, _s: True if c.job.exclusive else None,
           to_pyslurm=lambda _v: "exclusive", to_sbatch=lambda _v: "--exclusive"),
    Option("requeue", "is_requeueable", lambda _c, s: s.requeue,
           to_sbatch=lambda v: "--requeue" if v else "--no-requeue"),
    Option("signal", "signal", lambda _c, s: s.signal, to_pyslurm=Signal.pyslurm,
           to_sbatch=lambda v: f"--signal={v.sbatch()}"),
    Option("open-mode", "log_files_open_mode", lambda _c, s: s.open_mode),
    # sbatch(1) --wait-all-nodes=0|1: start the script only once every node booted.
    Option("wait-all-nodes", "wait_all_nodes", _job("wait_all_nodes"),
           to_sbatch=lambda v: f"--wait-all-nodes={int(v)}"),
    Option("hint", None, _job("hint")),  # pyslurm 25.11 has no hint attribute
)


def _per_component(option: Option) -> bool:
    return _field(option).split("/")[0].removeprefix("job.") in COMPONENT_FIELDS


def component_configs(config: JobConfig) -> list[JobConfig]:
    """One config per extra component (het group 1, 2, ...): the job's, with the
    component in place of ``[job]``, so shape() and the table read it as they read [job]."""
    return [config.model_copy(update={"job": component}) for component in config.job.components]


def component_sbatch_options(config: JobConfig) -> list[list[str]]:
    """Each extra component's ``#SBATCH`` options (after ``#SBATCH hetjob``): only the
    per-component options; job-wide ones come from [job] and Slurm propagates them."""
    return [sorted(option.sbatch_line(value) for option, value in given(component)
                   if _per_component(option))
            for component in component_configs(config)]


def total_nodes(config: JobConfig) -> int:
    """The nodes of every component together (a plain job: job.nodes)."""
    return config.job.nodes + sum(c.nodes for c in config.job.components)


def _field(option: Option) -> str:
    return option.field


# Set by the pyslurm backend itself, not from the table: the script and where it starts.
PYSLURM_SCRIPT = "script"
PYSLURM_WORKDIR = "working_directory"


def pyslurm_attributes() -> frozenset[str]:
    """Every JobSubmitDescription attribute slurmfabric may set."""
    return frozenset({o.pyslurm for o in OPTIONS if o.pyslurm} |
                     {PYSLURM_SCRIPT, PYSLURM_WORKDIR})


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


def pyslurm_fields(config: JobConfig, version: Optional[str] = None) -> dict[str, Any]:
    """The same options as JobSubmitDescription attributes of pyslurm ``version`` (None: any
    release line). Raw ``extra_sbatch`` lines have no attribute, so they are refused rather
    than dropped (pyslurm's own #SBATCH parser, load_sbatch_options, splits on '=' and '#'
    and is not used); so is a value that pyslurm would not send as sbatch does."""
    if config.job.components:
        raise UsageError(
            "job.components: a heterogeneous job cannot be passed through the pyslurm backend "
            "(slurmfabric hands it one JobSubmitDescription)",
            hint="use --backend sbatch, or drop [[job.components]]",
        )
    if config.job.extra_sbatch:
        raise UsageError(
            "job.extra_sbatch lines cannot be passed through the pyslurm backend",
            hint="use --backend sbatch, or model the option in the config",
        )
    options = given(config)
    missing = [_field(option) for option, _ in options if option.pyslurm is None]
    if missing:
        raise UsageError(f"{', '.join(missing)} cannot be passed through the pyslurm backend "
                         "(JobSubmitDescription has no such attribute)",
                         hint="use --backend sbatch")
    fields = {option.pyslurm: option.to_pyslurm(value) for option, value in options
              if option.pyslurm}
    refused = slurm_pyslurm.unsupported(fields, version)
    for option, value in options:
        if option.pyslurm in refused:
            raise UsageError(f"{_field(option)} = {_shown(value)}: {refused[option.pyslurm]}",
                             hint="use --backend sbatch")
    return fields


def _shown(value: Any) -> str:
    return repr(value.sbatch()) if isinstance(value, Signal) else repr(value)
