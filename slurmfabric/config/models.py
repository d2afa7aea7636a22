"""The job config model: four sections, each field checked where it is declared.

Field checks (types, ranges, Slurm's own formats) live on the fields; checks that need
several fields (launcher vs. tasks and GPUs) live in ``cross_field_problems`` so that a bad
config reports every problem at once, one line each, naming the field and what is accepted.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from slurmfabric.rank.env import DEFAULT_PORT_RANGE
from slurmfabric.restart import EVENTS as RESUME_EVENTS

LAUNCHERS = ("torchrun", "srun", "mpirun", "srun-pmix", "nccl-tests")
NCCL_TESTS_OPS = (
    "all_reduce", "all_gather", "alltoall", "broadcast", "gather", "hypercube",
    "reduce", "reduce_scatter", "scatter", "sendrecv",
)
# Signals worth sending before the time limit (sbatch --signal); names without "SIG".
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "URG")

# sbatch --time forms (sbatch(1)): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, plus unlimited.
_TIME = re.compile(r"^(\d+|\d+:\d+|\d+:\d+:\d+|\d+-\d+|\d+-\d+:\d+|\d+-\d+:\d+:\d+)\Z")
TIME_FORMS = "MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, " \
    "DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS or UNLIMITED"
# Conservative job names: safe in every #SBATCH parser, squeue column and file name.
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+\-=@:]{0,127}\Z")
# nccl-tests' own size arguments (-b/-e): a number with K, M or G.
_SIZE = re.compile(r"^\d+[KMGT]?\Z")
# Slurm's memory sizes (sbatch(1) --mem, --mem-per-cpu, --mem-per-gpu): digits, then an
# optional K, M, G or T in either case, which may itself be followed by b or B; no suffix
# means megabytes (str_to_mbytes() in src/common/proc_args.c, SchedMD/slurm@016994e).
_SLURM_MEM = re.compile(r"^\d+(?:[KMGTkmgt][bB]?)?\Z")
_MEM_FACTOR = {"": 1, "k": 1, "m": 1, "g": 1024, "t": 1024 * 1024}
# GPU type names as gres.conf writes them (Type=a100, Type=h100_80gb); no ':' or ','.
_GPU_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")
GPU_REQUESTS = ("gpus-per-node", "gres", "gpus-per-task", "none")
HINTS = ("compute_bound", "memory_bound", "multithread", "nomultithread")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# #SBATCH values: sbatch and pyslurm split these lines on whitespace and cut at '#', so a
# value must be one plain word.
_SBATCH_WORD = re.compile(r"^[^\s'\"#\\`$]+\Z")


def _sbatch_word(value: Optional[str], what: str) -> Optional[str]:
    if value is not None and not _SBATCH_WORD.match(value):
        raise ValueError(
            f"{what} {value!r} goes into an #SBATCH line and must be one word without "
            "spaces, quotes, '#', '\\', '`' or '$'"
        )
    return value


def slurm_mbytes(value: str) -> int:
    """A Slurm memory size in megabytes, as str_to_mbytes() reads it (K rounds up)."""
    match = re.match(r"^(\d+)([KMGTkmgt]?)", value)
    if not _SLURM_MEM.match(value) or match is None:
        raise ValueError(f"{value!r} is not a Slurm memory size")
    number, unit = int(match.group(1)), match.group(2).lower()
    return (number + 1023) // 1024 if unit == "k" else number * _MEM_FACTOR[unit]


def distribution_problem(value: str) -> Optional[str]:
    """Why Slurm's verify_dist_type() would refuse ``value`` (sbatch(1) --distribution), or
    None. Its words compare case-insensitively; plane=N stands alone."""
    if value[:5].lower() == "plane":
        size = value[6:] if value[5:6] == "=" else ""
        return None if size.isdigit() and 0 < int(size) <= 2**31 - 1 else \
            "plane needs its size: plane=N with N >= 1"
    base, _, flag = value.partition(",")
    words = base.lower().split(":")
    if flag and flag.lower() not in ("pack", "nopack"):
        return f"{flag!r} after ',' is not Pack or NoPack"
    if len(words) == 1 and words[0] in ("arbitrary", "hostfile", "pack", "nopack"):
        return None if not flag or words[0] not in ("pack", "nopack") else "one flag only"
    if len(words) > 3 or words[0] not in ("*", "block", "cyclic") or not all(
            word in ("*", "block", "cyclic", "fcyclic") for word in words[1:]):
        return "not a node[:socket[:core]] distribution"
    return None


def _program_problem(value: str, field: str) -> Optional[str]:
    """Why ``value`` cannot be a helper program (launcher.slurmfabric, torchrun, mpirun)."""
    if not value or value.startswith("-") or "\n" in value or "\x00" in value:
        return (f"{field} {value!r} is not a command: give a path or a command name "
                "(not empty, not starting with '-', one line)")
    return None


class Section(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class JobSection(Section):
    """What Slurm allocates: each field maps to one ``#SBATCH`` option."""

    name: str = "slurmfabric"
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: Optional[str] = None
    nodes: int = Field(1, ge=1)
    # The GPUs each node uses (ranks are counted from it), and how Slurm is asked for them:
    # --gpus-per-node, --gres=gpu:N, --gpus-per-task, or not at all ("none": clusters
    # without GPU gres, where every node's GPUs come with the node).
    gpus_per_node: int = Field(0, ge=0)
    gpu_request: Literal["gpus-per-node", "gres", "gpus-per-task", "none"] = "gpus-per-node"
    gpus_per_task: Optional[int] = Field(None, ge=1)
    gpu_type: Optional[str] = None  # typed request: "h100" -> --gpus-per-node=h100:8
    ntasks_per_node: Optional[int] = Field(None, ge=1)
    cpus_per_task: Optional[int] = Field(None, ge=1)
    cpus_per_gpu: Optional[int] = Field(None, ge=1)
    mem: Optional[str] = None
    mem_per_cpu: Optional[str] = None
    mem_per_gpu: Optional[str] = None
    exclusive: bool = False
    constraint: Optional[str] = None
    reservation: Optional[str] = None
    output: Optional[str] = None
    error: Optional[str] = None
    array: Optional[str] = None
    dependency: Optional[str] = None
    requeue: Optional[bool] = None
    mail_type: Optional[str] = None
    mail_user: Optional[str] = None
    wait_all_nodes: Optional[bool] = None
    ntasks_per_core: Optional[int] = Field(None, ge=1)
    exclude: Optional[str] = None
    nodelist: Optional[str] = None
    distribution: Optional[str] = None
    hint: Optional[str] = None
    extra_sbatch: list[str] = Field(default_factory=list)
    # [[job.components]]: more components of a heterogeneous job; [job] is component 0.
    components: list[JobComponent] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _gpus_from_tasks(cls, data: Any) -> Any:
        """``--gpus-per-task=G --ntasks-per-node=T`` as people write it: the node then uses
        G*T GPUs, so gpus_per_node may be left out."""
        if isinstance(data, dict) and "gpus_per_node" not in data and \
                data.get("gpu_request") == "gpus-per-task":
            per_task, tasks = (str(data.get(name)) for name in ("gpus_per_task",
                                                                "ntasks_per_node"))
            if per_task.isdigit() and tasks.isdigit():  # else: the field checks say why
                data = {**data, "gpus_per_node": int(per_task) * int(tasks)}
        return data

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # TOML `time = 30` means 30 minutes, as in sbatch
        if isinstance(value, str) and not (
            _TIME.match(value) or value.upper() in ("UNLIMITED", "INFINITE")
        ):
            raise ValueError(f"time limit {value!r} is not a form Slurm accepts: {TIME_FORMS}")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _JOB_NAME.match(value):
            raise ValueError(
                f"job name {value!r} is not accepted: use 1-128 letters, digits and . _ + - = @ :"
                ", starting with a letter or digit"
            )
        return value

    @field_validator("mem", "mem_per_cpu", "mem_per_gpu", mode="before")
    @classmethod
    def _mem(cls, value: Any, info: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            value = str(value)  # TOML `mem = 4096`: megabytes, as in sbatch
        if isinstance(value, str) and not _SLURM_MEM.match(value):
            option = info.field_name.replace("_", "-")
            raise ValueError(
                f"memory {value!r} is not a size Slurm reads (sbatch --{option}); "
                "accepted: a whole number with an optional K, M, G or T (either case, "
                "optionally followed by B), e.g. 440G, 440gb or 512000 (megabytes)"
            )
        return value

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _GPU_TYPE.match(value):
            raise ValueError(f"GPU type {value!r} is not a gres type name; accepted: a name "
                             "from the cluster's gres.conf Type=, e.g. 'h100' or 'a100_80gb'")
        return value

    @field_validator("distribution")
    @classmethod
    def _distribution(cls, value: Optional[str]) -> Optional[str]:
        why = None if value is None else distribution_problem(value)
        if why:
            raise ValueError(
                f"distribution {value!r}: {why}; accepted (sbatch --distribution): block, "
                "cyclic, arbitrary or plane=N, optionally :SOCKET[:CORE] (block, cyclic, "
                "fcyclic or *) and ,Pack or ,NoPack")
        return value

    @field_validator("hint")
    @classmethod
    def _hint(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and value.lower() not in HINTS:
            raise ValueError(f"hint {value!r} is not one sbatch --hint takes; accepted: "
                             + ", ".join(HINTS))
        return value

    @field_validator(
        "partition", "account", "qos", "constraint", "reservation", "output", "error",
        "array", "dependency", "mail_type", "mail_user", "exclude", "nodelist",
    )
    @classmethod
    def _word(cls, value: Optional[str], info: Any) -> Optional[str]:
        return _sbatch_word(value, info.field_name)

    @field_validator("extra_sbatch")
    @classmethod
    def _extra(cls, value: list[str]) -> list[str]:
        for line in value:
            if not line.startswith("-") or "\n" in line or "\r" in line:
                raise ValueError(
                    f"extra #SBATCH option {line!r} must be one line starting with '-' "
                    "(for example '--gres=nvme:1'); '#SBATCH' is added for you"
                )
        return value


class JobComponent(JobSection):
    """One more component of a heterogeneous job (``[[job.components]]``, het group 1, 2,
    ...): what Slurm allocates per component, checked as in ``[job]``. Job-wide fields
    (name, time, output, ...) belong to ``[job]`` alone; Slurm propagates them
    (https://slurm.schedmd.com/heterogeneous_jobs.html, "Submitting Jobs")."""

    @model_validator(mode="before")
    @classmethod
    def _per_component(cls, data: Any) -> Any:
        from slurmfabric.job.options import COMPONENT_FIELDS

        if isinstance(data, dict):
            # A job-wide field at its default is what a dumped config (a script's embedded
            # config line) holds: only a value that would be lost is refused.
            fields = JobSection.model_fields
            wide = sorted(name for name, value in data.items()
                          if name in fields and name not in COMPONENT_FIELDS
                          and value != fields[name].get_default(call_default_factory=True))
            if "components" in wide:
                raise ValueError("components: a component has no components of its own; "
                                 "accepted: every component as one [[job.components]] table")
            if wide:
                raise ValueError(
                    f"{wide[0]} is job-wide: set it in [job] (component 0; Slurm propagates "
                    f"it to every component); accepted here: {', '.join(sorted(COMPONENT_FIELDS))}")
        return data


class Rendezvous(Section):
    """torchrun rendezvous; MASTER_PORT is picked at run time inside ``port_range``."""

    backend: Literal["c10d"] = "c10d"
    # `slurmfabric env`'s own default (rankenv.DEFAULT_PORT_RANGE): 10,000 ports below the
    # ephemeral range; the batch shell then checks the port (ports.py).
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE
    # The port the batch shell tries first (default: a hash of the job); it moves on to the
    # next free one when another job on the first node holds it (slurmfabric/rank/ports.py).
    port: Optional[int] = None

    @field_validator("port_range")
    @classmethod
    def _range(cls, value: tuple[int, int]) -> tuple[int, int]:
        from slurmfabric.errors import RankEnvError
        from slurmfabric.rank.env import parse_port_range

        try:  # the one check `slurmfabric env` applies to --port-range too
            return parse_port_range("{}-{}".format(*value))
        except RankEnvError as exc:
            raise ValueError(f"{exc}; accepted: 1024 <= low <= high <= 65535") from None

    @model_validator(mode="after")
    def _port_in_range(self) -> Rendezvous:
        low, high = self.port_range
        if self.port is not None and not low <= self.port <= high:
            raise ValueError(
                f"port {self.port} is outside port_range {low}-{high}; accepted: a port "
                "inside launcher.rendezvous.port_range, or unset"
            )
        return self


# The per-node launchers slurmfabric starts in torchrun's place, and their words by default.
PER_NODE_COMMANDS = {"accelerate": ["accelerate", "launch"], "torchrun": ["torchrun"],
                     "deepspeed": ["deepspeed"]}


class PerNode(Section):
    """Another launcher that runs once per node and starts its own workers, in torchrun's
    place (``launcher.type = "torchrun"``): ``accelerate launch``, ``deepspeed`` (its
    ``--no_ssh`` mode), or a torchrun wrapper such as ``tune run``. slurmfabric starts one
    per node and gives it the node count, the node rank, the rendezvous address and port
    and the worker counts as its own options (job/render.py ``per_node_exec``); the node's
    NCCL plan is in its environment."""

    kind: Optional[Literal["accelerate", "torchrun", "deepspeed"]] = None
    command: list[str] = Field(default_factory=list)  # default: PER_NODE_COMMANDS[kind]
    args: list[str] = Field(default_factory=list)  # its own options (data), before the program

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        bad = _program_problem(value[0], "per_node.command") if value else None
        if bad:
            raise ValueError(bad)
        return value

    @property
    def words(self) -> list[str]:
        return self.command or list(PER_NODE_COMMANDS.get(self.kind or "", []))


class NcclTests(Section):
    """One nccl-tests binary run per op (``all_reduce`` -> ``all_reduce_perf``)."""

    ops: list[str] = Field(default_factory=lambda: ["all_reduce"])
    bin_dir: Optional[str] = None
    min_bytes: str = "8"
    max_bytes: str = "8G"
    step_factor: int = Field(2, ge=2)
    iters: int = Field(20, ge=1)
    warmup_iters: int = Field(5, ge=0)
    check: int = Field(1, ge=0)
    # Slurm's MPI plugin for the ranks (srun --mpi): pmix for Open MPI 4/5 and recent MPICH,
    # pmi2 for MPICH/MVAPICH builds without PMIx.
    # "default": no --mpi option, so srun uses the cluster's MpiDefault (slurm.conf).
    mpi: Literal["pmix", "pmi2", "pmix_v3", "pmix_v4", "pmix_v5", "cray_shasta",
                 "default"] = "pmix"
    gpus_per_rank: int = Field(1, ge=1)  # nccl-tests -g: GPUs driven by each MPI rank

    @field_validator("ops")
    @classmethod
    def _ops(cls, value: list[str]) -> list[str]:
        bad = [op for op in value if op not in NCCL_TESTS_OPS]
        if bad or not value:
            raise ValueError(
                f"nccl-tests ops {bad or value!r} not accepted: choose from "
                + ", ".join(NCCL_TESTS_OPS)
            )
        return value

    @field_validator("min_bytes", "max_bytes")
    @classmethod
    def _size(cls, value: str) -> str:
        if not _SIZE.match(value):
            raise ValueError(f"size {value!r} is not accepted: use a number with K, M or G")
        return value


class ResumeSection(Section):
    """Which interruptions the job survives, and how (``[launcher.resume]``).

    The batch shell runs the launch under ``slurmfabric resume supervise``: Slurm's warning
    signal before the time limit asks the program for a checkpoint, then the job is requeued
    (``mode = "requeue"``, the same job id) or a successor is submitted (``"chain"``).
    Preemption and node failure are requeued by Slurm itself (``--requeue``); worker failures
    restart inside the allocation (torchrun ``--max-restarts``) or requeue the job.
    """

    events: list[Literal[RESUME_EVENTS]] = Field(default_factory=list)  # type: ignore[valid-type]
    max_restarts: int = Field(3, ge=0, le=1000)
    signal: str = "USR2"
    grace_seconds: int = Field(120, ge=10, le=65535)
    mode: Literal["requeue", "chain"] = "requeue"
    checkpoint_dir: Optional[str] = None  # default checkpoints/<job.name> in the workdir
    keep: int = Field(2, ge=1, le=1000)
    # events hang / slow (slurmfabric.progress.watch): no rank advanced for hang_timeout
    # seconds; a rank's compute per step at least slow_ratio x its peers' median
    hang_timeout: int = Field(300, ge=10, le=86400)
    slow_ratio: float = Field(1.10, gt=1.0, le=10.0)

    @field_validator("signal")
    @classmethod
    def _signal(cls, value: str) -> str:
        # USR1 is fine here: the warning goes to the batch shell only (--signal=B:, sbatch(1)),
        # never to the ranks, so no library in them can swallow it. (NCCL 2.12 caught
        # SIGUSR1 in every rank, https://github.com/NVIDIA/nccl/issues/704; later releases
        # only when NCCL_PROXY_DUMP_SIGNAL asks for it.)
        name = value.upper().removeprefix("SIG")
        if name not in SIGNALS:
            raise ValueError(f"signal {value!r} is not accepted: choose from {', '.join(SIGNALS)}")
        return name

    @field_validator("events")
    @classmethod
    def _events(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"events {value!r} repeat a name; accepted: each of "
                             f"{', '.join(RESUME_EVENTS)} at most once")
        return value

    @field_validator("checkpoint_dir")
    @classmethod
    def _dir(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and (not value.strip() or value.startswith("-")):
            raise ValueError(f"checkpoint directory {value!r} is not a path; accepted: a "
                             "directory, absolute or relative to the job's working directory")
        return value

    @property
    def enabled(self) -> bool:
        return bool(self.events)


class LauncherSection(Section):
    """How ranks start: the launcher, torchrun's worker count, signals, helper paths."""

    type: Literal["torchrun", "srun", "mpirun", "srun-pmix", "nccl-tests"] = "torchrun"
    nproc_per_node: Optional[int] = Field(None, ge=1)
    rendezvous: Rendezvous = Field(default_factory=Rendezvous)
    signal: Optional[str] = None
    signal_seconds: int = Field(120, ge=1, le=65535)
    # slurmfabric on the compute nodes: a command on their PATH (default) or an absolute
    # path there; the script checks it on every node before anything starts.
    slurmfabric: Optional[str] = None
    slurmfabric_module: Optional[str] = None  # `module load` this first (e.g. an Lmod module)
    check_nodes: bool = True  # one srun step that checks slurmfabric on every node
    # PyTorch's NCCL flight recorder: the script sets TORCH_FR_BUFFER_SIZE,
    # TORCH_NCCL_DUMP_ON_TIMEOUT=1 and TORCH_FR_DUMP_TEMP_FILE (a per-job dump
    # directory) unless already set, so `jobs diagnose` can read the dumps; false: none
    nccl_flight_recorder: bool = True
    # false: ranks keep the CPU/memory affinity they start with ('launch --no-bind', srun
    # --cpu-bind=none, mpirun --bind-to none)
    bind: bool = True
    # torchrun as a command list (["python", "-m", "torch.distributed.run"]); a string is
    # one word. torchrun_args: torchrun's own options (launchrules checks them).
    torchrun: list[str] = Field(default_factory=lambda: ["torchrun"])
    torchrun_args: list[str] = Field(default_factory=list)
    mpirun: str = "mpirun"
    srun_args: list[str] = Field(default_factory=list)
    mpirun_args: list[str] = Field(default_factory=list)
    # One output file per srun task of the launch step (srun --output; %t is the task,
    # %j the job, %x its name), so 'slurmfabric jobs logs --rank N' finds a rank's lines.
    task_output: Optional[str] = None
    # [launcher.per_node]: accelerate launch (or a torchrun wrapper) in torchrun's place
    per_node: PerNode = Field(default_factory=PerNode)
    nccl_tests: NcclTests = Field(default_factory=NcclTests)
    resume: ResumeSection = Field(default_factory=ResumeSection)

    @field_validator("task_output")
    @classmethod
    def _task_output(cls, value: Optional[str]) -> Optional[str]:
        _sbatch_word(value, "task_output")
        if value is not None and "%t" not in value:
            raise ValueError(f"task_output {value!r} has no %t, so every task would write "
                             "the same file; accepted: a pattern with %t, e.g. '%x-%j-%t.out'")
        return value

    @field_validator("torchrun", mode="before")
    @classmethod
    def _torchrun_words(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.split() != [value]:
                raise ValueError(
                    f"{value!r} would be one command word (with its spaces); accepted: a list "
                    "of words, e.g. launcher.torchrun = [\"python\", \"-m\", "
                    "\"torch.distributed.run\"]")
            return [value]
        return value

    @field_validator("torchrun")
    @classmethod
    def _torchrun(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("torchrun is empty; accepted: [\"torchrun\"] or e.g. "
                             "[\"python\", \"-m\", \"torch.distributed.run\"]")
        bad = _program_problem(value[0], "torchrun")
        if bad:
            raise ValueError(bad)
        return value

    @field_validator("slurmfabric", "mpirun", "slurmfabric_module")
    @classmethod
    def _program(cls, value: Optional[str], info: Any) -> Optional[str]:
        bad = None if value is None else _program_problem(value, info.field_name)
        if bad:
            raise ValueError(bad)
        return value

    @field_validator("signal")
    @classmethod
    def _signal(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return None
        name = value.upper().removeprefix("SIG")
        if name not in SIGNALS:
            raise ValueError(
                f"signal {value!r} is not accepted: choose from {', '.join(SIGNALS)}"
            )
        return name


class ProgramSection(Section):
    """What every rank runs, and where."""

    command: list[str] = Field(default_factory=list)
    workdir: Optional[str] = None
    env: dict[str, str] = Field(default_factory=dict)
    # Explicit run-time expansion (job/expansion.py); values in ``env`` stay data.
    env_prepend: dict[str, str] = Field(default_factory=dict)
    env_append: dict[str, str] = Field(default_factory=dict)
    env_expand: dict[str, str] = Field(default_factory=dict)
    container_image: Optional[str] = None
    container_mounts: list[str] = Field(default_factory=list)
    # How the ranks enter container_image: pyxis (srun --container-image), or Apptainer /
    # Singularity ('apptainer exec --bind MOUNTS IMAGE' before each rank's command).
    container_runtime: Literal["pyxis", "apptainer", "singularity"] = "pyxis"
    modules: list[str] = Field(default_factory=list)
    # Code by the user's explicit choice (job/usercode.py): rendered verbatim into marked
    # sections and shellchecked at render. Every other field is data.
    setup: list[str] = Field(default_factory=list)  # batch shell, before the launch
    teardown: list[str] = Field(default_factory=list)  # batch shell, after the launch
    teardown_on_failure: bool = False  # also after a failed launch (exit code: the launch's)
    task_setup: list[str] = Field(default_factory=list)  # in every task, before the exec
    # Run-time parameters: NAME -> default; `submit --param NAME=VALUE` overrides, and
    # ${NAME} in program.command / env_expand expands to the value.
    params: dict[str, str] = Field(default_factory=dict)
    pass_args: bool = False  # the script's own "$@" follows program.command

    @field_validator("setup", "teardown", "task_setup")
    @classmethod
    def _code(cls, value: list[str], info: Any) -> list[str]:
        from slurmfabric.config.launchrules import line_problem

        for line in value:
            bad = line_problem(line)
            if bad:
                raise ValueError(bad)
        return value

    @field_validator("params", mode="before")
    @classmethod
    def _param_values(cls, value: Any) -> Any:
        if isinstance(value, dict):  # TOML `lr = 3e-4` means the text "0.0003"
            return {k: str(v).lower() if isinstance(v, bool) else
                    str(v) if isinstance(v, (int, float)) else v for k, v in value.items()}
        return value

    @field_validator("params")
    @classmethod
    def _param_names(cls, value: dict[str, str]) -> dict[str, str]:
        from slurmfabric.config.launchrules import param_name_problem

        for name in value:
            bad = param_name_problem(name)
            if bad:
                raise ValueError(bad)
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if value and (not value[0] or value[0].startswith("-")):
            raise ValueError(
                f"the program {value[0]!r} is empty or starts with '-', so a launcher would "
                "read it as an option; accepted: a program name or path first, its "
                "arguments after it"
            )
        return value

    @field_validator("modules")
    @classmethod
    def _modules(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name or name.startswith("-") or any(c.isspace() for c in name):
                raise ValueError(
                    f"module {name!r} is not a module name (empty, a leading '-' or "
                    "whitespace); accepted: names like 'cuda/12.4'"
                )
        return value

    @field_validator("container_mounts")
    @classmethod
    def _mounts(cls, value: list[str]) -> list[str]:
        # pyxis --container-mounts=SRC[:DST[:FLAGS]],...: ',' separates mounts, so an item
        # holding one would silently become several (one of them could mount '/').
        for item in value:
            parts = item.split(":")
            if "," in item or not item or len(parts) > 3 or not all(parts[:2]):
                raise ValueError(
                    f"container mount {item!r} is not one SRC[:DST[:FLAGS]] (no ',', at most "
                    "two ':'); accepted: one list item per mount, e.g. '/data:/data:ro'"
                )
        return value

    @field_validator("env", "env_prepend", "env_append", "env_expand", mode="before")
    @classmethod
    def _env_values(cls, value: Any) -> Any:
        # TOML `OMP_NUM_THREADS = 4` is meant as the string "4".
        if isinstance(value, dict):
            return {
                k: (str(v).lower() if isinstance(v, bool) else str(v))
                if isinstance(v, (int, float)) else v
                for k, v in value.items()
            }
        return value

    @field_validator("env", "env_prepend", "env_append", "env_expand")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not _ENV_NAME.match(k)]
        if bad:
            raise ValueError(
                f"environment variable names {bad!r} are not accepted: use letters, digits "
                "and '_', not starting with a digit"
            )
        return value

    @field_validator("container_image")
    @classmethod
    def _image(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise ValueError(f"container image {value!r} must be one non-empty word")
        return value


class Step(Section):
    """One extra ``srun`` step (``[[steps]]``) before or after the main launch: a probe, a
    setup step, a rankfile generator. Its command is argv (data), not shell code."""

    name: str
    when: Literal["before", "after"] = "before"
    command: list[str]
    nodes: Optional[int] = Field(None, ge=1)  # default: every node of the allocation
    ntasks_per_node: Optional[int] = Field(1, ge=1)
    container_image: Optional[str] = None
    srun_args: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        from slurmfabric.config.launchrules import step_name_problem

        bad = step_name_problem(value)
        if bad:
            raise ValueError(bad)
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if not value or not value[0] or value[0].startswith("-"):
            raise ValueError(
                f"the step's command {value!r} is empty or starts with '-', which srun would "
                "read as its own option; accepted: a program first, e.g. [\"hostname\"]")
        return value

    @field_validator("container_image")
    @classmethod
    def _image(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise ValueError(f"container image {value!r} must be one non-empty word")
        return value


class FabricSection(Section):
    """The network; explicit NCCL settings are exported before launch and always win."""

    type: Literal["auto", "ib", "roce", "efa", "tcp"] = "auto"
    nccl: dict[str, str] = Field(default_factory=dict)

    @field_validator("nccl", mode="before")
    @classmethod
    def _nccl_values(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: str(v) if isinstance(v, (int, float)) else v for k, v in value.items()}
        return value

    @field_validator("nccl")
    @classmethod
    def _nccl_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not (k.startswith("NCCL_") and _ENV_NAME.match(k))]
        if bad:
            raise ValueError(f"NCCL overrides {bad!r} are not accepted: names start with NCCL_")
        return value


def cross_field_problems(job: JobSection, launcher: LauncherSection,
                         program: ProgramSection) -> list[str]:
    """Rules that tie sections together; each returned line names the fields and the fix."""
    problems = count_problems(job, launcher)
    kind = launcher.type
    if kind == "nccl-tests" and program.command:
        problems.append(
            "program.command: nccl-tests runs the binaries of launcher.nccl_tests.ops, not a "
            "program; accepted: unset (empty)"
        )
    if kind != "nccl-tests" and not program.command:
        problems.append(
            "program.command: empty; accepted: the program and its arguments as a list, "
            "e.g. [\"python\", \"train.py\"]"
        )
    problems += component_problems(job, launcher)
    problems += resume_problems(job, launcher)
    problems += request_problems(job, launcher)
    from slurmfabric.job.options import extra_sbatch_problems  # the options table's owner

    problems += extra_sbatch_problems(job, launcher)
    if kind == "mpirun" and program.container_image:
        problems.append(
            "program.container_image: containers start through srun (pyxis); accepted with "
            "launchers torchrun, srun, srun-pmix, nccl-tests, not mpirun"
        )
    return problems


def count_problems(job: JobSection, launcher: LauncherSection) -> list[str]:
    """A component's tasks and GPUs per node against the launcher (``[job]`` and each
    ``[[job.components]]`` alike)."""
    problems: list[str] = []
    kind = launcher.type
    gpus, tasks = job.gpus_per_node, job.ntasks_per_node
    if kind == "torchrun":
        if tasks not in (None, 1):
            problems.append(
                f"job.ntasks_per_node: torchrun runs one task per node (it spawns the workers),"
                f" got {tasks}; accepted: 1 or unset"
            )
        workers = launcher.nproc_per_node
        if gpus and workers not in (None, gpus):
            problems.append(
                f"launcher.nproc_per_node: torchrun runs one worker per GPU, got {workers} with"
                f" job.gpus_per_node={gpus}; accepted: {gpus} or unset"
            )
        if not gpus and workers is None:
            problems.append(
                "launcher.nproc_per_node: a CPU-only torchrun job (job.gpus_per_node=0) needs "
                "the number of workers per node; accepted: an integer >= 1"
            )
    else:
        if launcher.nproc_per_node is not None:
            problems.append(
                f"launcher.nproc_per_node: only used by torchrun, not {kind}; accepted: unset"
            )
        per_rank = launcher.nccl_tests.gpus_per_rank if kind == "nccl-tests" else 1
        if gpus and gpus % per_rank:
            problems.append(
                f"launcher.nccl_tests.gpus_per_rank: {per_rank} does not divide "
                f"job.gpus_per_node={gpus}; accepted: a divisor of {gpus}"
            )
        elif gpus and tasks not in (None, gpus // per_rank):
            what = "one task per GPU" if per_rank == 1 else f"one task per {per_rank} GPUs"
            problems.append(
                f"job.ntasks_per_node: {kind} runs {what}, got {tasks} with "
                f"job.gpus_per_node={gpus}; accepted: {gpus // per_rank} or unset"
            )
        if not gpus and tasks is None:
            problems.append(
                f"job.ntasks_per_node: a CPU-only {kind} job (job.gpus_per_node=0) needs the "
                "number of tasks per node; accepted: an integer >= 1"
            )
    return problems


def component_problems(job: JobSection, launcher: LauncherSection) -> list[str]:
    """``[[job.components]]`` against the launcher: each component's counts, and what one
    launch step spanning every component (srun --het-group) needs."""
    if not job.components:
        return []
    kind = launcher.type
    out: list[str] = []
    if kind in ("mpirun", "nccl-tests"):
        out.append(f"job.components: launcher.type = {kind!r} counts its ranks from component "
                   "0's nodes only; accepted: launcher.type 'srun', 'srun-pmix' or 'torchrun' "
                   "with [[job.components]], or no components")
    if job.array is not None:
        out.append("job.array: Slurm runs no job arrays of heterogeneous jobs "
                   "(heterogeneous_jobs.html, Limitations); accepted: unset with "
                   "[[job.components]]")
    own = set(count_problems(job, launcher))  # said once, for [job]
    for index, component in enumerate(job.components):
        where = f"job.components[{index}]."
        lines = count_problems(component, launcher) + request_problems(component, launcher)
        out += [line.replace("job.", where) for line in lines if line not in own]
        if component.cpus_per_task != job.cpus_per_task:
            out.append(f"{where}cpus_per_task: the launch step (srun --het-group) passes one "
                       f"--cpus-per-task to every component, job.cpus_per_task = "
                       f"{job.cpus_per_task!r}; accepted: the same value as job.cpus_per_task")
        if kind == "torchrun" and launcher.nproc_per_node is None and \
                component.gpus_per_node != job.gpus_per_node:
            out.append(f"{where}gpus_per_node: one torchrun command starts every node's workers "
                       f"(one per GPU), and job.gpus_per_node = {job.gpus_per_node}; accepted: "
                       f"{job.gpus_per_node} (the same workers per node in every component)")
    return out


def slurm_tasks_per_node(job: JobSection, launcher: LauncherSection) -> int:
    """Slurm tasks per node: one torchrun agent, else one task per GPU (per rank's GPUs for
    nccl-tests) unless job.ntasks_per_node says; 0 when a CPU-only job leaves it unset."""
    if launcher.type == "torchrun":
        return 1
    per_rank = launcher.nccl_tests.gpus_per_rank if launcher.type == "nccl-tests" else 1
    return job.ntasks_per_node or job.gpus_per_node // per_rank


def request_problems(job: JobSection, launcher: LauncherSection) -> list[str]:
    """Slurm's request forms against each other (sbatch(1) names the exclusive pairs)."""
    out: list[str] = []
    gpus, form = job.gpus_per_node, job.gpu_request
    requested = bool(gpus) and form != "none"
    if job.gpus_per_task is not None and form != "gpus-per-task":
        out.append(f"job.gpus_per_task: only read with job.gpu_request = 'gpus-per-task' (it is "
                   f"{form!r}); accepted: unset, or gpu_request = 'gpus-per-task'")
    if form == "gpus-per-task":
        tasks = slurm_tasks_per_node(job, launcher)
        if not gpus:
            out.append("job.gpus_per_node: gpu_request = 'gpus-per-task' needs the GPUs each "
                       "node uses; accepted: job.gpus_per_node >= 1, or job.gpus_per_task "
                       "with job.ntasks_per_node")
        elif tasks and gpus % tasks == 0 and job.gpus_per_task not in (None, gpus // tasks):
            out.append(f"job.gpus_per_task: {launcher.type} runs {tasks} task(s) per node on "
                       f"job.gpus_per_node={gpus} GPUs, so each task gets {gpus // tasks}, not "
                       f"{job.gpus_per_task}; accepted: {gpus // tasks} or unset")
    if job.gpu_type is not None and not requested:
        out.append(f"job.gpu_type: {job.gpu_type!r} types a GPU request, but this job requests "
                   "no GPUs (job.gpus_per_node = 0 or job.gpu_request = 'none'); accepted: unset")
    if job.cpus_per_gpu is not None and job.cpus_per_task is not None:
        out.append("job.cpus_per_gpu: sbatch refuses it beside --cpus-per-task (job.cpus_per_task"
                   "); accepted: one of the two")
    for name in ("cpus_per_gpu", "mem_per_gpu"):
        if getattr(job, name) is not None and not requested:
            out.append(f"job.{name}: counts per requested GPU, but this job requests none "
                       "(job.gpus_per_node = 0 or job.gpu_request = 'none'); accepted: unset")
    mems = [name for name in ("mem", "mem_per_cpu", "mem_per_gpu") if getattr(job, name)
            is not None]
    if len(mems) > 1:
        out.append(f"job.{mems[1]}: sbatch takes one of --mem, --mem-per-cpu and --mem-per-gpu, "
                   f"and job.{mems[0]} is set too; accepted: one of them")
    if job.hint is not None and job.ntasks_per_core is not None:
        out.append("job.hint: sbatch --hint is incompatible with --ntasks-per-core "
                   "(job.ntasks_per_core); accepted: one of the two")
    return out


def time_limit_seconds(value: Optional[str]) -> Optional[int]:
    """A Slurm time limit (sbatch(1) --time forms) in seconds; None when unset/unlimited."""
    if value is None or value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, _, rest = value.rpartition("-") if "-" in value else ("", "", value)
    parts = [int(part) for part in rest.split(":")]
    if days:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = (parts + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(parts) == 1:
        return parts[0] * 60  # M
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]  # M:S
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]  # H:M:S


def resume_problems(job: JobSection, launcher: LauncherSection) -> list[str]:
    """[launcher.resume] against the rest: the requeue flag, the signal, the time limit."""
    resume = launcher.resume
    if not resume.enabled:
        return []
    out: list[str] = []
    if launcher.type == "nccl-tests":
        out.append("launcher.resume: nccl-tests is a measurement with no checkpoint to resume; "
                   "accepted: no [launcher.resume] events with launcher.type = 'nccl-tests'")
    slurm_requeues = {"preempt", "node_fail"} & set(resume.events)
    if job.requeue is False and (resume.mode == "requeue" or slurm_requeues):
        why = "mode = 'requeue'" if resume.mode == "requeue" else ", ".join(sorted(
            slurm_requeues))
        out.append(f"job.requeue: false, but launcher.resume ({why}) needs a requeueable job; "
                   "accepted: job.requeue unset or true")
    if launcher.signal is not None:
        out.append("launcher.signal: launcher.resume sends its own warning signal "
                   f"(launcher.resume.signal = {resume.signal}) to the batch shell; accepted: "
                   "launcher.signal unset when launcher.resume is on")
    limit = time_limit_seconds(job.time)
    if "timeout" in resume.events and limit is not None and resume.grace_seconds >= limit:
        out.append(f"launcher.resume.grace_seconds: {resume.grace_seconds} s is not shorter than "
                   f"the time limit job.time = {job.time} ({limit} s), so the warning would come "
                   f"before the job starts; accepted: fewer than {limit} seconds")
    if resume.mode == "chain" and job.array is not None:
        out.append("launcher.resume.mode: 'chain' submits one successor job and cannot continue "
                   "an array task; accepted: mode = 'requeue' with job.array")
    return out


# Fields whose text is free (textcheck.py): what the program receives, byte for byte.
_FREE_TEXT = {("program", "command"), ("launcher", "srun_args"), ("launcher", "mpirun_args"),
              ("program", "env"), ("program", "env_prepend"), ("program", "env_append"),
              ("program", "env_expand"), ("program", "params"), ("program", "setup"),
              ("program", "teardown"), ("program", "task_setup"), ("steps", "command"),
              ("steps", "srun_args"), ("launcher", "torchrun_args")}


def text_problems(data: Any, path: tuple[str, ...] = ()) -> list[str]:
    """Every string in the raw config checked by kind, before any other validation, so a
    NUL, an undecodable byte or a control character is named with its field."""
    from slurmfabric._common.textcheck import one_line, problem

    out: list[str] = []
    where = ".".join(path)
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(key, str):
                bad = problem(key, "strict")
                if bad:
                    out.append(f"{where + '.' if where else ''}{one_line(repr(key))}: the name "
                               f"{bad}")
                    continue
            out += text_problems(value, (*path, str(key)))
    elif isinstance(data, (list, tuple)):
        for index, item in enumerate(data):
            out += text_problems(item, (*path[:-1], f"{path[-1]}[{index}]") if path else ())
    elif isinstance(data, str):
        base = tuple(part.split("[")[0] for part in path[:2])
        # the program itself (command[0]) is an executable path: strict, like the others
        free = base in _FREE_TEXT and not (len(path) >= 2 and path[1] == "command[0]")
        bad = problem(data, "free" if free else "strict")
        if bad:
            out.append(f"{where}: {bad}")
    return out


_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1123 label
# RFC 1123 subdomain (a PersistentVolumeClaim name)
_K8S_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                            r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_K8S_RESOURCE = re.compile(r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}"
                           r"[A-Za-z0-9])?$")  # a qualified name, as resource names are


JobSection.model_rebuild()


class KubernetesSection(Section):
    """What ``render --target pytorchjob|trainjob|jobset|mpijob`` adds for a Kubernetes
    cluster; the rest (nodes, GPUs, command, NCCL settings) comes from the same config."""

    namespace: Optional[str] = None
    image: Optional[str] = None  # default: program.container_image
    rdma_resource: Optional[str] = None  # e.g. "rdma/rdma_shared_device_a", "nvidia.com/hostdev"
    rdma_per_pod: int = Field(1, ge=1, le=64)
    networks: Optional[str] = None  # Multus: k8s.v1.cni.cncf.io/networks, e.g. "rdma-net"
    runtime: str = "torch-distributed"  # TrainJob's runtimeRef (a ClusterTrainingRuntime)
    health_check: bool = True  # an init container runs 'slurmfabric health check'
    health_config: Optional[str] = None  # path of the health config inside the image
    # where the pods find slurmfabric: "configmap" (the default, unless launcher.slurmfabric
    # names a path) mounts the one-file zipapp from the ConfigMap that 'slurmfabric zipapp
    # --configmap' writes and runs it with the image's python3, so a stock image works;
    # "image": the image has slurmfabric (launcher.slurmfabric, else on its PATH)
    slurmfabric: Optional[Literal["configmap", "image"]] = None
    # program.container_mounts become pod volumes: a mount whose source (SRC of
    # SRC[:DST[:FLAGS]]) is a key here mounts that PersistentVolumeClaim ("CLAIM", or
    # "CLAIM/sub/dir" for a subPath); any other mount is a hostPath volume, unless
    # host_path_mounts is false, which refuses it (clusters whose policy forbids hostPath).
    mount_claims: dict[str, str] = Field(default_factory=dict)
    host_path_mounts: bool = True

    @field_validator("mount_claims")
    @classmethod
    def _claims(cls, value: dict[str, str]) -> dict[str, str]:
        for source, target in value.items():
            claim, _, sub = target.partition("/")
            if not source.startswith("/") or not _K8S_SUBDOMAIN.match(claim) or (
                    sub and (sub.startswith("/") or ".." in sub.split("/"))):
                raise ValueError(
                    f"mount claim {source!r} = {target!r} is not accepted: the key is a "
                    "mount source (an absolute path of program.container_mounts), the value "
                    "a PersistentVolumeClaim name, optionally with a relative sub-directory, "
                    "e.g. '/lustre' = 'lustre-pvc' or '/lustre/ckpt' = 'lustre-pvc/ckpt'")
        return value

    @field_validator("namespace", "runtime")
    @classmethod
    def _name(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _K8S_NAME.match(value):
            raise ValueError(f"{value!r} is not a Kubernetes name (lower-case letters, "
                             "digits and '-', at most 63)")
        return value

    @field_validator("rdma_resource")
    @classmethod
    def _resource(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _K8S_RESOURCE.match(value):
            raise ValueError(f"{value!r} is not a resource name like rdma/hca_shared_devices_a")
        return value


class JobConfig(BaseSettings):
    """A whole job. Built by ``load_config`` from CLI sets, environment and TOML files."""

    model_config = SettingsConfigDict(
        env_prefix="SLURMFABRIC_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    job: JobSection = Field(default_factory=JobSection)
    launcher: LauncherSection = Field(default_factory=LauncherSection)
    program: ProgramSection = Field(default_factory=ProgramSection)
    fabric: FabricSection = Field(default_factory=FabricSection)
    kubernetes: KubernetesSection = Field(default_factory=KubernetesSection)
    steps: list[Step] = Field(default_factory=list)  # [[steps]]: extra srun steps

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: Any, env_settings: Any,
        dotenv_settings: Any, file_secret_settings: Any,
    ) -> tuple[Any, ...]:
        """Precedence, highest first: ``--set`` (init kwargs), environment (only when the
        caller asked for it: the CLI does), the user's TOML file (or table), the site
        defaults file. The files come from ``load_config``."""
        from slurmfabric.config.sources import EnvSource, active_file_sources, environment_active

        env = (EnvSource(settings_cls),) if environment_active() else ()
        return (init_settings, *env, *active_file_sources(settings_cls))

    def __init__(self, **values: Any) -> None:
        """``JobConfig(**table)`` refuses a bad table as a file would: a ConfigError with one
        line per problem naming the field, never pydantic's multi-line report."""
        from pydantic import ValidationError

        try:
            super().__init__(**values)
        except ValidationError as exc:
            from slurmfabric.config.report import CONFIG_HINT, format_errors
            from slurmfabric.errors import ConfigError

            raise ConfigError(format_errors(exc, type(self)), hint=CONFIG_HINT) from None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobConfig:
        """A config from an in-memory table shaped like the TOML file (``{"job": {...}}``),
        checked like one: no environment, no site defaults (``load_config(data=...)`` adds
        those on request)."""
        from slurmfabric.config.sources import file_sources

        with file_sources([data]):
            return cls()

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        problems = text_problems(data)
        if problems:
            raise ValueError("\n".join(problems))
        return data

    @model_validator(mode="after")
    def _cross_fields(self) -> JobConfig:
        from slurmfabric.config import launchrules
        from slurmfabric.plan.contract import conflicts

        problems = cross_field_problems(self.job, self.launcher, self.program)
        problems += launchrules.program_problems(self.program, self.launcher)
        problems += launchrules.container_step_problems(self.steps, self.program)
        problems += launchrules.torchrun_problems(self.launcher, self.program)
        problems += launchrules.mpirun_args_problems(self.launcher.mpirun_args)
        problems += launchrules.steps_problems(self.steps, self.job,
                                               self.launcher.resume.enabled)
        problems += conflicts(self.fabric.type, self.fabric.nccl, where="fabric.nccl.")
        if problems:
            raise ValueError("\n".join(problems))
        return self
