"""Rules that tie fields and sections together (launcher vs. tasks and GPUs, Slurm's
exclusive request forms, resume vs. requeue and the time limit, heterogeneous components),
and the text check every raw string passes first.

Each function returns the problems it finds, one line each naming the field and the fix,
so a bad config reports every problem at once; ``config_problems`` runs them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slurmfabric._common.textcheck import one_line, problem
from slurmfabric.config import launchrules
from slurmfabric.config.formats import time_limit_seconds
from slurmfabric.config.vocabulary import extra_sbatch_problems

if TYPE_CHECKING:
    from slurmfabric.config.sections.job import JobSection
    from slurmfabric.config.sections.launcher import LauncherSection
    from slurmfabric.config.sections.program import ProgramSection


def config_problems(config: Any) -> list[str]:
    """Every rule across sections of a ``JobConfig`` (which calls this, so it is not
    imported here), in the order the lines are reported."""
    from slurmfabric.plan.contract import conflicts  # plan/ loads its placement code

    problems = cross_field_problems(config.job, config.launcher, config.program)
    problems += launchrules.program_problems(config.program, config.launcher)
    problems += launchrules.container_step_problems(config.steps, config.program)
    problems += launchrules.torchrun_problems(config.launcher, config.program)
    problems += launchrules.mpirun_args_problems(config.launcher.mpirun_args)
    problems += launchrules.steps_problems(config.steps, config.job,
                                           config.launcher.resume.enabled)
    problems += conflicts(config.fabric.type, config.fabric.nccl, where="fabric.nccl.")
    return problems


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
