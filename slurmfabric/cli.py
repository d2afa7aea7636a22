"""The ``slurmfabric`` command: a tiny dispatcher that imports only the subcommand it runs.

``slurmfabric env`` and ``slurmfabric launch`` run on every rank, so this module uses the
standard library alone and does not build one big argparse tree: it looks the subcommand
up in ``COMMANDS`` and imports ``slurmfabric.commands.<module>`` only then. Each command
module exposes ``main(argv: list[str]) -> int`` and builds its own parser.
"""

from __future__ import annotations

import sys

from slurmfabric import __version__
from slurmfabric.errors import SlurmfabricError

# name -> (module under slurmfabric.commands, one-line help). Order is the --help order.
COMMANDS: dict[str, tuple[str, str]] = {
    "render": ("render", "render the sbatch script for a job config"),
    "submit": ("submit", "render and submit a job (--dry-run, --test-only)"),
    "import": ("import_", "write a config for an existing sbatch script (--check compares "
               "them)"),
    "env": ("env", "print this task's rank and NCCL environment (export lines, json, dotenv)"),
    "launch": ("launch", "per-task wrapper: set rank env and binding, then exec the program"),
    "hostlist": ("hostlist", "expand, compress, count or index Slurm hostlists"),
    "topo": ("topo", "discover GPUs, RDMA NICs and NUMA layout; show the NCCL plan"),
    "health": ("health", "node health checks, prolog/epilog hooks, drain and resume"),
    "nccl-log": ("nccl_log", "check NCCL_DEBUG=INFO logs for socket fallback, GDR, errors"),
    "nccl-tests": ("nccl_tests", "parse nccl-tests output and compare with the fabric"),
    "pairs": ("pairs", "node-pair bandwidth sweep: submit and report the slow node"),
    "jobs": ("jobs", "follow submitted jobs: status, logs, wait, cancel, list; why one failed"),
    "resume": ("resume", "supervise a job that survives timeouts, preemption and failures; "
               "its restart history"),
    "ib": ("ib", "InfiniBand fabric audit with infiniband-diags (audit, links)"),
    "roce": ("roce", "RoCE lossless setup (trust, PFC, ECN, ToS, MTU) and counters: this node "
             "or a cluster audit"),
    "whatif": ("whatif", "step time of a training job against the fabric, and what one "
               "halved cable, slow GPU or GDR off costs"),
    "site": ("site", "cluster-wide hooks for every job: TaskProlog, cli_filter.lua, install"),
    "zipapp": ("zipapp", "this slurmfabric as one file that container images run with their "
               "own python3 (built once per version, path printed)"),
    "testbed": ("testbed", "start/stop a local multi-node Slurm cluster for tests and demos"),
}

# Commands that changed name: the old name gets exit 2 and the new one, never a guess.
RENAMED = {"fabric": "ib"}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        "usage: slurmfabric [--version] [--help] COMMAND [ARGS...]",
        "",
        "Multi-node GPU training on Slurm that starts right and fails loudly.",
        "",
        "commands:",
    ]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'slurmfabric COMMAND --help' for a command's options."]
    return "\n".join(lines)


def report_error(error: SlurmfabricError) -> int:
    """Print an expected error the way every command does: no traceback, a HINT if any."""
    for line in str(error).splitlines() or [type(error).__name__]:
        print(f"slurmfabric: error: {line}", file=sys.stderr)
    if error.hint:
        print(f"HINT: {error.hint}", file=sys.stderr)
    return error.exit_code


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(f"slurmfabric {__version__}")
        return 0
    name = args[0]
    entry = COMMANDS.get(name)
    if entry is None and name in RENAMED:
        import shlex

        again = shlex.join(["slurmfabric", RENAMED[name], *args[1:]])
        print(f"slurmfabric: error: command {name!r} is now {RENAMED[name]!r}; run: {again}",
              file=sys.stderr)
        return 2
    if entry is None:
        print(
            f"slurmfabric: error: unknown command {name!r}; "
            f"choose from: {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    # __import__, not importlib.import_module: the importlib package (and warnings, which it
    # imports) is ~0.5 ms that every rank's 'launch' would pay
    qualified = f"slurmfabric.commands.{entry[0]}"
    __import__(qualified)
    module = sys.modules[qualified]
    try:
        return int(module.main(args[1:]) or 0)
    except SlurmfabricError as error:
        return report_error(error)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except Exception as error:  # noqa: BLE001 - the last line of defence: never a traceback
        return _unexpected(name, error)


# Commands whose process may end without the interpreter's finalization when run as the
# `slurmfabric` command (run()): `env` runs in every rank's start-up path, and tearing the
# interpreter down (module dicts, GC) costs about as much as a fifth of a bare start.
# `launch` never gets there: it execs the program.
QUICK_EXIT = frozenset({"env"})


def run() -> None:
    """The installed ``slurmfabric`` command and ``python -m slurmfabric``: ``main()``, then
    exit with its code. In-process callers use ``main()``, which always returns."""
    code = main()
    if sys.argv[1:2] and sys.argv[1] in QUICK_EXIT:
        _quick_exit(code)
    sys.exit(code)


def _quick_exit(code: int) -> None:
    """``os._exit(code)`` once stdout and stderr are flushed, when nothing else would have
    run at exit: no atexit callback, no threading (non-daemon threads are joined at exit).
    Anything else (a failed flush, an unknown interpreter) returns: the normal exit."""
    # Callbacks are registered through the atexit module: where no code imported it, there
    # are none (and importing it here would cost a module creation on every rank).
    atexit = sys.modules.get("atexit")
    count = getattr(atexit, "_ncallbacks", None) if atexit is not None else (lambda: 0)
    if count is None or count() or "threading" in sys.modules:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # the normal exit reports it as Python does
    import os

    os._exit(code)


def _unexpected(name: str, error: Exception) -> int:
    """An error no command turned into a message: one line; exit 2 where it is the input's
    fault (a file that is not text, too deep, too big, unreadable), 70 (EX_SOFTWARE) for a
    bug. SLURMFABRIC_DEBUG=1 shows the traceback."""
    import os

    from slurmfabric._common.textcheck import one_line

    if os.environ.get("SLURMFABRIC_DEBUG") == "1":
        import traceback

        traceback.print_exc()
    detail = one_line(str(error), 300)
    code = 2
    if isinstance(error, UnicodeError):
        text = f"input is not valid UTF-8 text ({detail})"
    elif isinstance(error, RecursionError):
        text = "input nested too deeply"
    elif isinstance(error, MemoryError):
        text = "input too large for memory"
    elif isinstance(error, OSError) and error.filename is not None:
        text = f"{one_line(str(error.filename))}: {error.strerror or detail}"
    elif isinstance(error, ValueError) and "limit" in detail and "digits" in detail:
        text = f"a number in the input is too long ({detail})"
    else:
        code = 70
        text = (f"internal error in '{name}': {type(error).__name__}: {detail} (a bug: please "
                "report it; SLURMFABRIC_DEBUG=1 shows the traceback)")
    print(f"slurmfabric: error: {text}", file=sys.stderr)
    return code


if __name__ == "__main__":
    run()
