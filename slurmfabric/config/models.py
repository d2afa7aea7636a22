"""The job config model: ``JobConfig`` assembled from its sections.

Field checks (types, ranges, Slurm's own formats) live on the fields of each section
(config/sections/); checks that need several fields live in config/rules.py, so that a bad
config reports every problem at once, one line each, naming the field and what is accepted.
The names other modules import from here stay here (re-exported from where they live).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from slurmfabric.config.formats import (
    GPU_REQUESTS,
    HINTS,
    NCCL_TESTS_OPS,
    SIGNALS,
    TIME_FORMS,
    Section,
    distribution_problem,
    slurm_mbytes,
    time_limit_seconds,
)
from slurmfabric.config.rules import (
    component_problems,
    config_problems,
    count_problems,
    cross_field_problems,
    request_problems,
    resume_problems,
    slurm_tasks_per_node,
    text_problems,
)
from slurmfabric.config.sections.fabric import FabricSection, KubernetesSection
from slurmfabric.config.sections.job import JobComponent, JobSection
from slurmfabric.config.sections.launcher import (
    PER_NODE_COMMANDS,
    LauncherSection,
    NcclTests,
    PerNode,
    Rendezvous,
    ResumeSection,
)
from slurmfabric.config.sections.program import ProgramSection, Step
from slurmfabric.config.vocabulary import LAUNCHERS

__all__ = [
    "GPU_REQUESTS", "HINTS", "LAUNCHERS", "NCCL_TESTS_OPS", "PER_NODE_COMMANDS", "SIGNALS",
    "TIME_FORMS", "FabricSection", "JobComponent", "JobConfig", "JobSection",
    "KubernetesSection", "LauncherSection", "NcclTests", "PerNode", "ProgramSection",
    "Rendezvous", "ResumeSection", "Section", "Step", "component_problems",
    "count_problems", "cross_field_problems", "distribution_problem", "request_problems",
    "resume_problems", "slurm_mbytes", "slurm_tasks_per_node", "text_problems",
    "time_limit_seconds",
]


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
        problems = config_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self
