"""``[job]`` and ``[[job.components]]``: what Slurm allocates, each field one ``#SBATCH``
option (config/vocabulary.py names them), checked in the formats sbatch(1) accepts."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from slurmfabric.config.formats import (
    GPU_TYPE,
    HINTS,
    JOB_NAME,
    SLURM_MEM,
    TIME,
    TIME_FORMS,
    Section,
    distribution_problem,
    matching,
    sbatch_word,
)
from slurmfabric.config.vocabulary import COMPONENT_FIELDS


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
            TIME.match(value) or value.upper() in ("UNLIMITED", "INFINITE")
        ):
            raise ValueError(f"time limit {value!r} is not a form Slurm accepts: {TIME_FORMS}")
        return value

    _name = field_validator("name")(matching(
        JOB_NAME, "job name {value!r} is not accepted: use 1-128 letters, digits and "
        ". _ + - = @ :, starting with a letter or digit"))

    @field_validator("mem", "mem_per_cpu", "mem_per_gpu", mode="before")
    @classmethod
    def _mem(cls, value: Any, info: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            value = str(value)  # TOML `mem = 4096`: megabytes, as in sbatch
        if isinstance(value, str) and not SLURM_MEM.match(value):
            option = info.field_name.replace("_", "-")
            raise ValueError(
                f"memory {value!r} is not a size Slurm reads (sbatch --{option}); "
                "accepted: a whole number with an optional K, M, G or T (either case, "
                "optionally followed by B), e.g. 440G, 440gb or 512000 (megabytes)"
            )
        return value

    _gpu_type = field_validator("gpu_type")(matching(
        GPU_TYPE, "GPU type {value!r} is not a gres type name; accepted: a name from the "
        "cluster's gres.conf Type=, e.g. 'h100' or 'a100_80gb'"))

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
        return sbatch_word(value, info.field_name)

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


JobSection.model_rebuild()
