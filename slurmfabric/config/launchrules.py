"""Rules for the launch-side fields of issue 31: code fields, run-time parameters, steps,
torchrun's and mpirun's own options. Standard library only (the model imports it).

Each function returns the problems it finds, one line each, naming the field and the fix, so
a bad config reports every problem at once (rules.config_problems runs them with its own).
"""

from __future__ import annotations

import re
from typing import Any

# The heredoc that carries program.task_setup in the batch script (templates/sbatch.sh.j2).
TASK_SETUP_END = "SLURMFABRIC_TASK_SETUP_END"
# The code fields: the only fields whose text is shell code, by the user's explicit choice.
CODE_FIELDS = ("program.setup", "program.teardown", "program.task_setup")

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_STEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# Variables the shell, Slurm or slurmfabric set: a parameter of the same name would fight
# them (a submitter's PATH would override the default, an exported RANK would reach torch).
_RESERVED = frozenset((
    "PATH", "HOME", "PWD", "OLDPWD", "IFS", "SHELL", "USER", "UID", "EUID", "PPID", "RANDOM",
    "LINENO", "SECONDS", "HOSTNAME", "ENV", "CDPATH", "PS4", "SHELLOPTS", "BASHOPTS", "LANG",
    "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "MASTER_ADDR", "MASTER_PORT", "RDZV_ID",
    "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
    "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "TMPDIR",
))
_RESERVED_PREFIXES = ("SLURM", "SBATCH_", "SRUN_", "SALLOC_", "BASH", "NCCL_", "PMI", "PMIX_",
                      "OMPI_", "TORCHELASTIC_", "sf_", "slurmfabric_", "LC_")


def line_problem(line: str) -> str | None:
    """Why ``line`` cannot be one verbatim line of a code field, or None."""
    if "\n" in line or "\r" in line:
        return (f"{line[:60]!r} holds a line break; accepted: one list item per line "
                "(each item is one shell line)")
    if line.lstrip().upper().startswith("#SBATCH"):
        return (f"{line!r} looks like an #SBATCH directive, which is read only in the header; "
                "accepted: job.* fields or job.extra_sbatch")
    if line.strip() == TASK_SETUP_END:
        return f"{line!r} is the marker that ends the task setup section; rename it"
    return None


def param_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a program.params entry, or None."""
    if not _IDENT.match(name) or not name.isascii():
        return (f"{name!r} is not a shell variable name; accepted: letters, "
                "digits and '_', not starting with a digit")
    if name in _RESERVED or name.startswith(_RESERVED_PREFIXES):
        return (f"{name!r} is set by the shell, Slurm, MPI, torch or "
                "slurmfabric; accepted: a name of your own, e.g. 'lr' or 'DATA_DIR'")
    return None


# torchrun's options (torch/distributed/run.py, get_args_parser(), pytorch/pytorch commit
# 010929fd3f401c3868310396e6a91ed95aa0305b; https://docs.pytorch.org/docs/stable/elastic/run.html).
# Each option's spellings -> whether it takes a value.
_TORCHRUN_FREE = {
    ("--max-restarts", "--max_restarts"): True,
    ("--monitor-interval", "--monitor_interval"): True,
    ("--start-method", "--start_method"): True,
    ("--event-log-handler", "--event_log_handler"): True,
    ("--role",): True,
    ("--log-dir", "--log_dir"): True,
    ("-r", "--redirects"): True,
    ("-t", "--tee"): True,
    ("--local-ranks-filter", "--local_ranks_filter"): True,
    ("--local-addr", "--local_addr"): True,
    ("--logs-specs", "--logs_specs"): True,
    ("--numa-binding", "--numa_binding"): True,
    ("--signals-to-handle", "--signals_to_handle"): True,
}
# Options slurmfabric sets itself -> the field that sets them.
_TORCHRUN_OWNED = {
    ("--nnodes",): "job.nodes",
    ("--nproc-per-node", "--nproc_per_node"): "launcher.nproc_per_node (or job.gpus_per_node)",
    ("--rdzv-backend", "--rdzv_backend"): "launcher.rendezvous.backend",
    ("--rdzv-endpoint", "--rdzv_endpoint"): "launcher.rendezvous (MASTER_ADDR/MASTER_PORT at "
                                             "run time)",
    ("--rdzv-id", "--rdzv_id"): "slurmfabric (the job id, at run time)",
    ("--rdzv-conf", "--rdzv_conf"): "slurmfabric (is_host, at run time)",
    ("--standalone",): "launcher.rendezvous (a multi-node rendezvous)",
    ("--node-rank", "--node_rank"): "slurmfabric (the rendezvous assigns node ranks)",
    ("--master-addr", "--master_addr"): "slurmfabric (MASTER_ADDR, at run time)",
    ("--master-port", "--master_port"): "launcher.rendezvous.port / port_range",
    ("--no-python", "--no_python"): "slurmfabric (workers start through 'slurmfabric launch')",
    ("-m", "--module"): "program.command (write [\"python\", \"-m\", \"pkg.module\", ...])",
    ("--run-path", "--run_path"): "program.command (write [\"python\", \"/abs/script.py\"])",
}


def _table(spellings: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    return {name: value for names, value in spellings.items() for name in names}


TORCHRUN_TAKES_VALUE = _table(_TORCHRUN_FREE)
TORCHRUN_OWNED = _table(_TORCHRUN_OWNED)


def torchrun_args_problems(args: list[str], resume_restarts: bool) -> list[str]:
    """launcher.torchrun_args against torchrun's own options: each must be one torchrun
    accepts (exact spelling: argparse's prefix matching would hide a typo) and not one that
    slurmfabric sets."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, _ = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if arg[:2] in ("-r", "-t") and len(arg) > 2:  # argparse's -t3 form
            name, eq = arg[:2], "="
        if name in TORCHRUN_OWNED:
            out.append(f"launcher.torchrun_args: {name} is set by {TORCHRUN_OWNED[name]}; "
                       "accepted: drop it from launcher.torchrun_args")
        elif name in ("--max-restarts", "--max_restarts") and resume_restarts:
            out.append(f"launcher.torchrun_args: {name} is set by launcher.resume.max_restarts "
                       "(events include 'worker_fail'); accepted: drop it from torchrun_args")
        elif name not in TORCHRUN_TAKES_VALUE:
            out.append(f"launcher.torchrun_args: {arg!r} is not a torchrun option; accepted: "
                       + ", ".join(sorted(n for n in TORCHRUN_TAKES_VALUE if n.startswith("--")
                                          and "_" not in n))
                       + " (torch/distributed/run.py), each with its value")
            i += 1
            continue
        if not eq and TORCHRUN_TAKES_VALUE.get(name) and name not in TORCHRUN_OWNED:
            if i + 1 >= len(args):
                out.append(f"launcher.torchrun_args: {name} needs a value; accepted: "
                           f"[\"{name}\", \"VALUE\"] or [\"{name}=VALUE\"]")
            i += 1
        i += 1
    return out


def torchrun_problems(launcher: Any, program: Any) -> list[str]:
    """launcher.torchrun_args and program.command against the launcher."""
    per_node = launcher.per_node
    if per_node.kind is None and (per_node.command or per_node.args):
        return ["launcher.per_node: command/args without kind; accepted: kind = "
                "\"accelerate\" or \"torchrun\""]
    if launcher.type != "torchrun":
        return ([f"launcher.torchrun_args: only used by torchrun, not {launcher.type}; "
                 "accepted: unset"] if launcher.torchrun_args else []) + (
            [f"launcher.per_node: a per-node launcher runs in torchrun's place, not "
             f"{launcher.type}'s; accepted: launcher.type = \"torchrun\""]
            if per_node.kind else [])
    if per_node.kind:
        out = ["launcher.torchrun_args: torchrun does not run with launcher.per_node; "
               "accepted: the launcher's own options in launcher.per_node.args"] \
            if launcher.torchrun_args else []
        if "worker_fail" in launcher.resume.events:
            out.append("launcher.resume.events: worker_fail restarts torchrun's workers; a "
                       "per-node launcher has no such option here; accepted: other events")
        return out
    restarts = "worker_fail" in launcher.resume.events
    return [*torchrun_args_problems(launcher.torchrun_args, restarts),
            *torchrun_command_problems(launcher, program)]


def torchrun_command_problems(launcher: Any, program: Any) -> list[str]:
    """``train.py`` first under torchrun: torchrun itself would run it with its own python,
    but slurmfabric starts every worker through ``slurmfabric launch`` (torchrun
    --no-python), which execs the program: a .py file would fail on every node."""
    out: list[str] = []
    command = program.command
    if command and command[0].endswith(".py"):
        out.append(f"program.command: {command[0]!r} is a Python script; torchrun would add "
                   "python, but slurmfabric runs the program itself; accepted: "
                   f"[\"python\", {command[0]!r}, ...] (the python that has torch)")
    return out


# Open MPI / MPICH options that choose where ranks go (mpirun(1) "Mapping, Ranking, and
# Binding"; MPICH mpiexec -ppn): with any of these, slurmfabric adds no --map-by.
_MPI_MAPPING = frozenset((
    "--map-by", "-map-by", "--rankfile", "-rankfile", "-rf", "--npernode", "-npernode",
    "-N", "--ppr", "-ppr", "-ppn", "--ppn", "-perhost", "--bynode", "-bynode", "--byslot",
    "-byslot", "--host", "-host", "-H", "--hostfile", "-hostfile", "--machinefile",
    "-machinefile",
))
_MPI_COUNT = frozenset(("-np", "--np", "-n", "-c", "--n"))


def _option(arg: str) -> str:
    return arg.partition("=")[0] if arg.startswith("--") else arg


def mpirun_maps(args: list[str]) -> bool:
    """Whether launcher.mpirun_args choose the rank placement themselves."""
    return any(_option(arg) in _MPI_MAPPING for arg in args)


def mpirun_args_problems(args: list[str]) -> list[str]:
    return [f"launcher.mpirun_args: {arg!r} sets the rank count, which slurmfabric takes from "
            "the allocation at run time (nodes x job.ntasks_per_node); accepted: drop it, "
            "and size the job with job.nodes (or sbatch -N)"
            for arg in args if _option(arg) in _MPI_COUNT]


def steps_problems(steps: list[Any], job: Any, resume_enabled: bool) -> list[str]:
    out: list[str] = []
    names = [step.name for step in steps]
    for index, step in enumerate(steps):
        where = f"steps[{index}]"
        if names.count(step.name) > 1:
            out.append(f"{where}.name: {step.name!r} names more than one step; accepted: "
                       "a name per step")
        if step.nodes is not None and step.nodes > job.nodes:
            out.append(f"{where}.nodes: {step.nodes} is more than job.nodes={job.nodes}; "
                       f"accepted: 1..{job.nodes}, or unset (every node)")
        if step.when == "after" and resume_enabled:
            out.append(f"{where}.when: 'after' cannot run with launcher.resume, whose "
                       "supervisor replaces the batch shell; accepted: 'before'")
    return out


def step_name_problem(name: str) -> str | None:
    if not _STEP_NAME.match(name):
        return (f"step name {name!r} is not accepted: 1-64 letters, digits and . _ -, "
                "starting with a letter or digit")
    return None


def container_step_problems(steps: Any, program: Any) -> list[str]:
    """A [[steps]] image is a pyxis option (srun --container-image); under Apptainer the
    steps have no container form yet."""
    runtime = program.container_runtime
    return [f"steps[{i}].container_image: a step's image is a pyxis option, not rendered "
            f"with program.container_runtime = {runtime!r}; accepted: unset (the step runs "
            "on the node), or runtime 'pyxis'"
            for i, step in enumerate(steps) if step.container_image and runtime != "pyxis"]


def program_problems(program: Any, launcher: Any) -> list[str]:
    """The code and parameter fields against the launcher."""
    out: list[str] = []
    if program.teardown and launcher.resume.enabled:
        out.append("program.teardown: cannot run with launcher.resume, whose supervisor "
                   "replaces the batch shell; accepted: no teardown, or no [launcher.resume]")
    if program.pass_args and launcher.resume.enabled and launcher.resume.mode == "chain":
        out.append("program.pass_args: launcher.resume.mode = 'chain' submits the successor "
                   "script without the first job's arguments; accepted: mode = 'requeue', or "
                   "program.params (the job's environment carries them to the successor)")
    runtime = program.container_runtime
    if runtime != "pyxis":
        if not program.container_image:
            out.append(f"program.container_runtime: {runtime!r} runs the ranks in "
                       "program.container_image, which is unset; accepted: an image (a .sif "
                       "file or a docker:// reference), or runtime 'pyxis'")
        if any(arg.startswith("--container") for arg in launcher.srun_args):
            out.append(f"launcher.srun_args: pyxis's --container-* options with "
                       f"program.container_runtime = {runtime!r}; accepted: program."
                       "container_image and program.container_mounts")
        if launcher.type == "mpirun":
            out.append(f"program.container_runtime: {runtime!r} with launcher.type 'mpirun' "
                       "is not rendered yet; accepted: srun, srun-pmix, torchrun or nccl-tests")
    if program.teardown_on_failure and not program.teardown:
        out.append("program.teardown_on_failure: true without program.teardown; accepted: "
                   "teardown lines, or false")
    return out
