"""``[program]`` and ``[[steps]]``: what every rank runs and where, and the extra srun steps
around the launch. Commands are argv (data); only the code fields are shell code."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, field_validator

from slurmfabric.config.formats import ENV_NAME, Section, image_word, refuse, texts
from slurmfabric.config.launchrules import line_problem, param_name_problem, step_name_problem


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
        for line in value:
            refuse(line_problem(line))
        return value

    @field_validator("params", mode="before")
    @classmethod
    def _param_values(cls, value: Any) -> Any:
        return texts(value)  # TOML `lr = 3e-4` means the text "0.0003"

    @field_validator("params")
    @classmethod
    def _param_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            refuse(param_name_problem(name))
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
        bad = [name for name in value
               if not name or name.startswith("-") or any(c.isspace() for c in name)]
        refuse(f"module {bad[0]!r} is not a module name (empty, a leading '-' or whitespace);"
               " accepted: names like 'cuda/12.4'" if bad else None)
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
        return texts(value)  # TOML `OMP_NUM_THREADS = 4` is meant as the string "4"

    @field_validator("env", "env_prepend", "env_append", "env_expand")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not ENV_NAME.match(k)]
        if bad:
            raise ValueError(
                f"environment variable names {bad!r} are not accepted: use letters, digits "
                "and '_', not starting with a digit"
            )
        return value

    _image = field_validator("container_image")(image_word)


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
        refuse(step_name_problem(value))
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if not value or not value[0] or value[0].startswith("-"):
            raise ValueError(
                f"the step's command {value!r} is empty or starts with '-', which srun would "
                "read as its own option; accepted: a program first, e.g. [\"hostname\"]")
        return value

    _image = field_validator("container_image")(image_word)
