"""Submission: config -> typed request (no I/O) -> dry run, ``sbatch --test-only`` or submit.

The request is all a dry run prints: the exact command and the exact script. Backends:
``sbatch`` (through slurm/cmd.py, the one module that runs Slurm commands) and ``pyslurm``
(optional, imported only when used, checked against the running Slurm's version).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from slurmfabric.config.models import JobConfig
from slurmfabric.errors import SlurmCommandError, UsageError
from slurmfabric.job import options
from slurmfabric.job.render import render_sbatch
from slurmfabric.slurm import cmd
from slurmfabric.slurm import pyslurm as slurm_pyslurm

BACKENDS = ("sbatch", "pyslurm", "auto")


@dataclass(frozen=True)
class SubmitRequest:
    """Everything needed to submit, computed without touching the cluster."""

    script: str
    backend: str
    sbatch_args: tuple[str, ...] = ()
    workdir: Optional[str] = None
    test_only: bool = False
    pyslurm_fields: dict[str, Any] = field(default_factory=dict)
    # program.params values (submit --param) and the script's own arguments (submit -- ARGS)
    params: dict[str, str] = field(default_factory=dict)
    script_args: tuple[str, ...] = ()

    def all_sbatch_args(self) -> list[str]:
        """--export names the parameters: sbatch takes their values from its own environment
        (sbatch(1) --export: a name alone propagates its current value), so a value may hold
        ',' which --export=NAME=VALUE would split."""
        export = [f"--export=ALL,{','.join(sorted(self.params))}"] if self.params else []
        return [*export, *self.sbatch_args]

    def command(self) -> list[str]:
        """The exact command line (the script goes to its stdin, or is the file SCRIPT when
        it has arguments)."""
        tail = ["SCRIPT", *self.script_args] if self.script_args else []
        if self.test_only:
            return [*cmd.sbatch_test_only_command(self.all_sbatch_args()), *tail]
        if self.backend == "pyslurm":
            return ["pyslurm.JobSubmitDescription(**fields, script=SCRIPT).submit()"]
        return [*cmd.sbatch_command(self.all_sbatch_args()), *tail]

    def environment(self) -> Optional[dict[str, str]]:
        """sbatch's environment: this one plus the parameters (None: unchanged)."""
        return {**os.environ, **self.params} if self.params else None

    def describe(self) -> str:
        """What ``--dry-run`` prints: the command, the backend's fields, then the script."""
        lines = [f"# backend: {self.backend}"]
        if self.workdir:
            lines.append(f"# workdir: {self.workdir}")
        if self.backend == "pyslurm" and not self.test_only:
            sent = {**self.pyslurm_fields, **slurm_pyslurm.sbatch_counts(self.pyslurm_fields)}
            lines.append(f"# fields: {sent!r}")
            lines.append(f"# command: {self.command()[0]}")
        else:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.params.items()))
            stdin = "" if self.script_args else " < SCRIPT"
            lines.append(f"# command: {env + ' ' if env else ''}{shlex.join(self.command())}"
                         f"{stdin}")
        lines.append("# SCRIPT:")
        return "\n".join(lines) + "\n" + self.script


def pyslurm_fields(config: JobConfig, workdir: Optional[str] = None, *,
                   version: Optional[str] = None) -> dict[str, Any]:
    """JobSubmitDescription attributes matching the #SBATCH lines (the one table in
    options.py), plus where the job starts: like sbatch's, the submitting directory (the
    script itself cd's to program.workdir). What pyslurm ``version`` (default: the
    installed one) would not send as sbatch does is refused, naming the config field."""
    return {**options.pyslurm_fields(config, version or slurm_pyslurm.installed_version()),
            options.PYSLURM_WORKDIR: workdir or os.getcwd()}


def resolve_backend(name: str, config: Optional[JobConfig] = None, *,
                    dry_run: bool = False) -> str:
    """``auto`` -> pyslurm when it is installed, of the running Slurm's release line, and
    can send this config as sbatch would; else sbatch. ``dry_run``: the Slurm version is not
    asked (a dry run touches no Slurm), so the installed pyslurm decides."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if name != "auto":
        return name
    version = slurm_pyslurm.installed_version()
    if version is None:
        return "sbatch"
    try:
        if config is not None:
            pyslurm_fields(config, version=version)
        if not dry_run:
            slurm_pyslurm.check_version(version, cmd.slurm_version())
    except (UsageError, SlurmCommandError):
        return "sbatch"
    return "pyslurm"


def build_request(
    config: JobConfig,
    *,
    backend: str = "sbatch",
    test_only: bool = False,
    sbatch_args: Sequence[str] = (),
    workdir: Optional[str] = None,
    rerender: Optional[str] = None,
    slurmfabric_bin: Optional[str] = None,
    params: Optional[dict[str, str]] = None,
    script_args: Sequence[str] = (),
    dry_run: bool = False,
) -> SubmitRequest:
    """Render and describe the submission; submits nothing (``dry_run``: asks no Slurm)."""
    # auto: what only sbatch carries (--sbatch-arg, --param, script arguments) means sbatch
    sbatch_only = bool(sbatch_args or params or script_args)
    resolved = "sbatch" if test_only or (backend == "auto" and sbatch_only) \
        else resolve_backend(backend, config, dry_run=dry_run)
    if resolved == "pyslurm" and (sbatch_args or params or script_args):
        what = "--sbatch-arg" if sbatch_args else "--param" if params else "arguments after --"
        raise UsageError(f"{what} needs the sbatch backend", hint="use --backend sbatch")
    run_time_problems(config, params or {}, script_args)
    return SubmitRequest(
        script=render_sbatch(config, slurmfabric_bin=slurmfabric_bin, rerender=rerender),
        backend=resolved,
        sbatch_args=tuple(sbatch_args),
        workdir=workdir,
        test_only=test_only,
        pyslurm_fields=pyslurm_fields(config, workdir) if resolved == "pyslurm" else {},
        params=dict(params or {}),
        script_args=tuple(script_args),
    )


def run_time_problems(config: JobConfig, params: dict[str, str],
                      script_args: Sequence[str]) -> None:
    """--param names must be declared in program.params; arguments need program.pass_args."""
    declared = config.program.params
    unknown = sorted(set(params) - set(declared))
    if unknown:
        known = f"; declared: {', '.join(sorted(declared))}" if declared else ""
        raise UsageError(f"--param {unknown[0]}: not declared in program.params",
                         hint="declare it with its default, e.g. [program.params] "
                              f"{unknown[0]} = \"...\"{known}")
    bad = [v for v in params.values() if "\x00" in v]
    if bad:
        raise UsageError("--param: a value holds a NUL byte, which no environment variable "
                         "can carry")
    if script_args and not config.program.pass_args:
        raise UsageError("arguments after -- reach the program only with program.pass_args",
                         hint="set program.pass_args = true, or drop the arguments")


def submit(request: SubmitRequest) -> str:
    """Submit (or validate with ``--test-only``); returns the job id as sbatch printed it
    (``123``, or ``123;cluster`` on a multi-cluster setup) or Slurm's verdict."""
    args, env = request.all_sbatch_args(), request.environment()
    script_args = list(request.script_args)
    if request.test_only:
        return cmd.sbatch_test_only(request.script, args, workdir=request.workdir,
                                         env=env, script_args=script_args).strip()
    if request.backend == "pyslurm":
        return str(_submit_pyslurm(request))
    return str(cmd.sbatch(request.script, args, workdir=request.workdir, env=env,
                               script_args=script_args))


def _submit_pyslurm(request: SubmitRequest) -> int:
    return slurm_pyslurm.submit(request.pyslurm_fields, request.script)
