"""``[launcher]`` and its tables: how ranks start (torchrun, srun, mpirun, srun-pmix,
nccl-tests), the rendezvous, another per-node launcher, nccl-tests' own options and
``[launcher.resume]``."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from slurmfabric.config.formats import (
    NCCL_TESTS_OPS,
    SIZE,
    Section,
    program_problem,
    refuse,
    sbatch_word,
    signal_name,
)
from slurmfabric.config.vocabulary import RESUME_EVENTS

# The rendezvous port range as `slurmfabric env --port-range` takes it (rank/env.py
# DEFAULT_PORT_RANGE and parse_port_range: 10,000 ports below Linux's ephemeral range).
# Written here too, not imported: rank/ sits above config/, and a shared module would add
# an import to every rank's start (tests/unit/test_entry_script.py fixes that set);
# tests/unit/test_config_vocabulary.py checks that both take the same ranges.
DEFAULT_PORT_RANGE = (20000, 29999)
PORT_LIMITS = (1024, 65535)


class Rendezvous(Section):
    """torchrun rendezvous; MASTER_PORT is picked at run time inside ``port_range``."""

    backend: Literal["c10d"] = "c10d"
    # `slurmfabric env`'s own default; the batch shell then checks the port
    # (slurmfabric/rank/ports.py).
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE
    # The port the batch shell tries first (default: a hash of the job); it moves on to the
    # next free one when another job on the first node holds it (slurmfabric/rank/ports.py).
    port: Optional[int] = None

    @field_validator("port_range")
    @classmethod
    def _range(cls, value: tuple[int, int]) -> tuple[int, int]:
        low, high = value
        if not PORT_LIMITS[0] <= low <= high <= PORT_LIMITS[1]:
            raise ValueError(f"port range '{low}-{high}' must lie within 1024-65535 with LOW <= "
                             "HIGH; accepted: 1024 <= low <= high <= 65535")
        return value

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
    ``--no_ssh`` mode) or a torchrun wrapper such as ``tune run``. slurmfabric starts one
    per node and gives it the node count, the node rank, the rendezvous address and port
    and the worker counts as its own options (job/render.py ``per_node_exec``); the node's
    NCCL plan is in its environment."""

    kind: Optional[Literal["accelerate", "torchrun", "deepspeed"]] = None
    command: list[str] = Field(default_factory=list)  # default: PER_NODE_COMMANDS[kind]
    args: list[str] = Field(default_factory=list)  # its own options (data), before the program

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        refuse(program_problem(value[0], "per_node.command") if value else None)
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
        if not SIZE.match(value):
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
        return signal_name(value)

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
        sbatch_word(value, "task_output")
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
        refuse(program_problem(value[0], "torchrun"))
        return value

    @field_validator("slurmfabric", "mpirun", "slurmfabric_module")
    @classmethod
    def _program(cls, value: Optional[str], info: Any) -> Optional[str]:
        refuse(None if value is None else program_problem(value, info.field_name))
        return value

    @field_validator("signal")
    @classmethod
    def _signal(cls, value: Optional[str]) -> Optional[str]:
        return None if value is None else signal_name(value)
