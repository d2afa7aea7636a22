"""``slurmfabric launch [options] -- CMD ARGS...``: the per-task wrapper.

Sets the rank (and NCCL) environment, applies this local rank's CPU/memory binding when a
fabric plan exists, then ``execvpe``s the command: the program replaces this process, so
signals and the exit code go straight to it and no wrapper stays behind. Every launcher's
ranks come through here: ``srun slurmfabric launch -- python train.py`` (also with
``--mpi=pmix``), torchrun's workers with ``torchrun --no-python ... slurmfabric launch
--mode torchrun -- python train.py`` (each worker binds by its own LOCAL_RANK, again after
every torchrun restart), and MPI ranks with ``mpirun ... slurmfabric launch --mode mpi --
./app``.
"""

from __future__ import annotations

import os
import sys

from slurmfabric.commands import env as env_cmd
from slurmfabric.errors import UsageError
from slurmfabric.rank import task as taskenv

USAGE = """\
usage: slurmfabric launch [--mode auto|srun|torchrun|mpi] [--addr-policy POLICY]
                          [--port-range LOW-HIGH] [--fabric-type TYPE] [--check-port]
                          [--override] [--no-plan] [--no-bind] [--setup CODE] [--print]
                          -- CMD [ARGS...]

Set this task's rank and NCCL environment, bind it to its CPUs, and exec CMD.

  --print      show the environment, binding and command instead of running it
  --no-bind    set the environment but leave CPU and memory affinity alone
  --setup CODE bash code run in this task right before CMD (program.task_setup), under
               set -euo pipefail; CMD and its arguments stay data
  (other options as for 'slurmfabric env')
"""

_FLAGS = ("--check-port", "--override", "--no-plan", "--print", "--no-bind")
# program.task_setup runs in bash, then bash execs the program: the code is $1 of the runner
# and the program's argv is saved before the code runs, so the code cannot change it.
SETUP_RUNNER = ('set -euo pipefail; sf_setup=$1; shift; sf_argv=("$@"); set --; '
                'eval "$sf_setup"; exec -- "${sf_argv[@]}"')


def _take_setup(argv: list[str]) -> tuple[str | None, list[str]]:
    """Remove ``--setup CODE`` / ``--setup=CODE`` from the options (before ``--``)."""
    rest: list[str] = []
    setup = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return setup, rest + argv[i:]
        if arg == "--setup":
            if i + 1 == len(argv):
                raise UsageError("slurmfabric launch: --setup needs a value",
                                 "see slurmfabric launch --help")
            setup, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--setup="):
            setup = arg[len("--setup="):]
        else:
            rest.append(arg)
        i += 1
    return setup, rest


def main(argv: list[str]) -> int:
    setup, argv = _take_setup(argv)
    opts, command = env_cmd.parse_options(argv, "slurmfabric launch", USAGE, _FLAGS, command=True)
    if not command:
        raise UsageError(
            "slurmfabric launch: no command given",
            "slurmfabric launch [options] -- python train.py",
        )
    program = command
    if setup:
        command = ["bash", "-c", SETUP_RUNNER, "slurmfabric-task-setup", setup, *command]
    environ = dict(os.environ)
    task = env_cmd.build_task(opts, environ, bind=not opts.get("--no-bind"),
                              strict=not opts.get("--print"))
    final, kept, plan, binding = task.variables, task.kept, task.plan, task.binding
    if opts.get("--print"):
        _print(final, kept, plan, binding, command, bool(opts.get("--no-bind")),
               task.plan_origin)
        return 1 if getattr(plan, "errors", None) else 0
    if binding is not None and not opts.get("--no-bind"):
        from slurmfabric.rank.binding import apply_binding

        apply_binding(binding)
    environ.update(final)
    for key in kept:
        environ[key] = kept[key]
    # the flight recorder's names as the program's torch reads them (rank/torchnames.py):
    # imported only where the script set them (its one module on a rank's path)
    if "TORCH_FR_BUFFER_SIZE" in environ or "TORCH_FR_DUMP_TEMP_FILE" in environ:
        from slurmfabric.rank import torchnames

        torchnames.adapt(environ, program)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        taskenv.execvpe(command[0], command, environ)
    except FileNotFoundError:
        print(f"slurmfabric: error: launch: command not found: {command[0]}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"slurmfabric: error: launch: permission denied: {command[0]}", file=sys.stderr)
        return 126
    return 1  # not reached: execvpe replaced this process


def _print(final, kept, plan, binding, command, no_bind: bool, origin: str) -> None:
    out = [taskenv.render(final, kept, "export", plan).rstrip("\n")]
    if "SLURMFABRIC_CONTAINER_ENV" in os.environ:
        from slurmfabric.rank.container import image_env

        for key, value in image_env(dict(os.environ)).items():
            what = ("replaced by this node's plan" if key in final else
                    "kept; set it in fabric.nccl or program.env to choose it")
            out.append(f"# container: the image sets {key}={taskenv.quote(value)} and the "
                       f"plan does not ({what})")
    if plan is not None:
        out.append(f"# fabric: type={plan.fabric_type} node={plan.fabric} ({plan.summary})")
        out.append(f"# plan: {origin}")
        out += [f"# note: {note}" for note in plan.notes]
        out += [f"# slurmfabric: error: {error}" for error in plan.errors]
    if binding is None:
        out.append("# binding: none (no fabric plan for this node)")
    elif no_bind:
        out.append("# binding: skipped (--no-bind)")
    else:
        from slurmfabric._common.sysfs import format_cpulist

        cpus = list(getattr(binding, "cpus", ()) or ())
        gpu = getattr(binding, "gpu", None)
        out.append(
            f"# binding: local_rank={getattr(binding, 'local_rank', '?')} "
            f"gpu={getattr(gpu, 'index', None)} nic={getattr(binding, 'nic', None)} "
            f"cpus={format_cpulist(cpus) or 'unchanged'} "
            f"mem_node={getattr(binding, 'mem_node', None)} ({getattr(binding, 'reason', '')})"
        )
    out.append("exec " + " ".join(taskenv.quote(arg) for arg in command))
    sys.stdout.flush()
    sys.stdout.buffer.write(("\n".join(out) + "\n").encode("utf-8", "surrogateescape"))
    sys.stdout.flush()
