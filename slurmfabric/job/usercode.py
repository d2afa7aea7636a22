"""The launch side of a script beyond the launch line: the code fields, shellchecked.

``program.setup`` / ``program.teardown`` (batch shell) and ``program.task_setup`` (every task)
are shell code by the user's explicit choice: they go into the script verbatim, in marked
sections, and are checked with ShellCheck at render time (an error refuses the config,
naming the field and ShellCheck's code). Everything else stays data, quoted by render.q.

``task_setup`` reaches every task as one argument, ``slurmfabric launch --setup CODE``, which
runs it in bash inside the task (inside the container, after the rank environment and the
binding are set) and then execs the program with its argv untouched: the same path for
torchrun's workers, srun ranks, mpirun ranks and srun --mpi=pmix.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from functools import lru_cache
from typing import Any, Callable, Optional

from slurmfabric.config.launchrules import CODE_FIELDS, mpirun_maps
from slurmfabric.errors import ConfigError
from slurmfabric.job import expansion

SHELLCHECK_MISSING = ("shellcheck is not installed, so program.setup, program.teardown and "
                      "program.task_setup were not checked; install it (apt-get install "
                      "shellcheck) to check them at render time")


def _shellcheck(text: str) -> tuple[tuple[str, int, str], ...] | None:
    """ShellCheck's findings (level, code, message) on a bash fragment; None without it."""
    binary = shutil.which("shellcheck")
    return None if binary is None else _run_shellcheck(binary, text)


@lru_cache(maxsize=64)
def _run_shellcheck(binary: str, text: str) -> tuple[tuple[str, int, str], ...]:
    try:
        proc = subprocess.run([binary, "--shell=bash", "--format=json1", "--severity=warning",
                               "-"], input=text, capture_output=True, text=True, check=False,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return (("warning", 0, f"shellcheck did not run ({type(exc).__name__}); the code "
                 "went unchecked"),)
    try:
        comments = json.loads(proc.stdout or "{}").get("comments", [])
    except json.JSONDecodeError:
        return (("warning", 0, f"shellcheck failed, so the code went unchecked: "
                 f"{proc.stderr.strip()[:200]}"),)
    return tuple((c.get("level", "error"), int(c.get("code", 0)), c.get("message", ""))
                 for c in comments)


def code_sections(config: Any) -> dict[str, list[str]]:
    """The code fields that hold lines, by their dotted name."""
    program = config.program
    sections = {"program.setup": program.setup, "program.teardown": program.teardown,
                "program.task_setup": program.task_setup}
    assert tuple(sections) == CODE_FIELDS
    return {name: list(lines) for name, lines in sections.items() if lines}


def check_code(config: Any) -> list[str]:
    """ShellCheck each code field: an error refuses the config (ConfigError naming the field,
    the line and ShellCheck's SC code); warnings are returned for the caller to show."""
    errors: list[str] = []
    warnings: list[str] = []
    for field, lines in code_sections(config).items():
        found = _shellcheck("\n".join(lines) + "\n")
        if found is None:
            return [SHELLCHECK_MISSING]
        for level, code, message in found:
            line = f"{field}: ShellCheck SC{code} ({level}): {message}"
            (errors if level == "error" else warnings).append(line)
    if errors:
        raise ConfigError([*errors, "accepted: shell lines that ShellCheck passes "
                           "(https://www.shellcheck.net/wiki/ explains each SC code)"])
    return warnings


def launch_options(config: Any) -> str:
    """What every ``slurmfabric launch`` of the main launch gets besides --mode."""
    opts = []
    if not config.launcher.bind:
        opts.append("--no-bind")
    if config.program.task_setup:
        opts.append('--setup "$sf_task_setup"')
    return "".join(" " + opt for opt in opts)


def step_line(step: Any, q: Callable[[Any], str], groups: int = 0,
              job_image: Optional[str] = None) -> str:
    """One ``[[steps]]`` entry as srun line(s). The task count is explicit: srun in a batch
    job reads SLURM_NTASKS (the job's) from the environment otherwise (srun(1), INPUT
    ENVIRONMENT VARIABLES). In a heterogeneous job (``groups`` extra components) a step
    over every node runs once per component (``srun --het-group=N``, one after the other),
    each with that component's node count, since $SLURM_NNODES is component 0's alone
    (https://slurm.schedmd.com/heterogeneous_jobs.html); a step with ``nodes`` runs in
    component 0, srun's default group. A step in the job's own image (``job_image``) with
    no container options of its own runs in the job's named container (the script's
    ``sf_container``): pyxis skips the import when a container of that name exists
    (https://github.com/NVIDIA/pyxis/wiki/Usage), and the plan's variables win there too."""
    per_node = step.ntasks_per_node or 1
    if step.nodes is not None:
        layouts = [f"--nodes={step.nodes} --ntasks={step.nodes * per_node} "
                   f"--ntasks-per-node={per_node}"]
    elif not groups:
        layouts = [f'--nodes="$SLURM_NNODES" --ntasks="$((SLURM_NNODES * {per_node}))" '
                   f"--ntasks-per-node={per_node}"]
    else:
        layouts = [f'--het-group={n} --nodes="$SLURM_JOB_NUM_NODES_HET_GROUP_{n}" '
                   f'--ntasks="$((SLURM_JOB_NUM_NODES_HET_GROUP_{n} * {per_node}))" '
                   f"--ntasks-per-node={per_node}" for n in range(groups + 1)]
    lines = []
    for layout in layouts:
        words = [f"srun --job-name={q(step.name)}", layout, "--kill-on-bad-exit=1"]
        if step.container_image and step.container_image == job_image and not any(
                arg.startswith("--container") for arg in step.srun_args):
            words.append('"${sf_container[@]}"')
        elif step.container_image:
            words.append(f"--container-image={q(step.container_image)}")
        words += [q(arg) for arg in step.srun_args]
        lines.append(" ".join(words) + " \\\n  " + " ".join(q(arg) for arg in step.command))
    return "\n".join(lines)


def param_lines(params: dict[str, str], q: Callable[[Any], str]) -> list[str]:
    """A default for each parameter the job's environment does not already set (sbatch
    --export), exported so the program sees it too. Names were checked (launchrules)."""
    out = []
    for name, value in sorted(params.items()):
        # export first: exporting after the assignment reads to ShellCheck like a value
        # whose quotes were meant as syntax (SC2089/SC2090)
        out += [f"export {name}", f'[ -n "${{{name}+set}}" ] || {name}={q(value)}']
    return out


def context(config: Any, q: Callable[[Any], str]) -> dict[str, Any]:
    """Template values for the code sections and the launch (plain text: render wraps it)."""
    program = config.program
    groups = len(config.job.components)
    return {
        "setup_lines": list(program.setup),
        "teardown_lines": list(program.teardown),
        "task_setup_lines": list(program.task_setup),
        "launch_opts": launch_options(config),
        "mpirun_maps": mpirun_maps(config.launcher.mpirun_args),
        "srun_binds": any(arg.startswith("--cpu-bind") for arg in config.launcher.srun_args),
        "program_argv": expansion.program_argv(program, q),
        "params": param_lines(program.params, q),
        "steps_before": [(s.name, step_line(s, q, groups, program.container_image))
                         for s in config.steps if s.when == "before"],
        "steps_after": [(s.name, step_line(s, q, groups, program.container_image))
                        for s in config.steps if s.when == "after"],
        # the launch runs in a subshell when anything follows it (an 'exec' inside stays there)
        "wrap_launch": bool(program.teardown) or any(s.when == "after" for s in config.steps),
    }
