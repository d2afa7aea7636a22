"""``slurmfabric env``: print this task's rank (and NCCL) environment.

In the batch shell it prints job-level values (MASTER_ADDR, MASTER_PORT, NNODES, RDZV_ID)
for ``eval "$(slurmfabric env)"``; inside an srun task the full rank environment.

The decisions live in slurmfabric/rank/task.py (also the Python API); this module parses the
options and prints. It runs on every rank, so no argparse: a tiny option parser below.
"""

from __future__ import annotations

import os
import sys

from slurmfabric.errors import UsageError
from slurmfabric.rank import task as taskenv

USAGE = """\
usage: slurmfabric env [--format export|json|dotenv] [--mode auto|srun|torchrun|mpi]
                       [--addr-policy POLICY] [--port-range LOW-HIGH] [--port N]
                       [--fabric-type auto|ib|roce|efa|tcp] [--check-port]
                       [--override] [--no-plan]

Print the rank environment of this Slurm task: export lines for
eval "$(slurmfabric env)", or --format json|dotenv.

  --format F        export (default), json or dotenv
  --mode M          auto (default): srun step -> one task per GPU, batch shell -> job-level
                    values, under torchrun or an MPI launcher -> their rank values;
                    srun: require a step; torchrun: a torchrun worker (its LOCAL_RANK), or
                    in a one-task-per-node step the node's torchrun values (PET_*);
                    mpi: an MPI rank (OMPI_COMM_WORLD_*, PMI_RANK, MV2_COMM_WORLD_*)
  --addr-policy P   MASTER_ADDR from the first node: plain (default), suffix:-ib,
                    nodeaddr (Slurm's NodeAddr) or iface:NAME (only on the master node)
                    [env SLURMFABRIC_ADDR_POLICY]
  --port-range R    MASTER_PORT is hashed into R (default 20000-29999)
                    [env SLURMFABRIC_PORT_RANGE]
  --port N          in the batch shell: try N first instead of the hash [env SLURMFABRIC_PORT]
                    (the batch shell always moves on to the next port another job holds)
  --fabric-type T   the job's fabric.type: tcp drops IB variables, ib/roce/efa fail on a
                    node without such a rail [env SLURMFABRIC_FABRIC_TYPE, default auto]
  --check-port      on the master node, fail if MASTER_PORT is already in use
  --override        replace values the user already set (they are kept by default)
  --no-plan         no NCCL variables from the fabric plan [env SLURMFABRIC_NO_PLAN=1]
"""

_VALUE_OPTIONS = ("--format", "--mode", "--addr-policy", "--port-range", "--port",
                  "--fabric-type")
_FLAGS = ("--check-port", "--override", "--no-plan", "--print", "--no-bind")
FORMATS = ("export", "json", "dotenv")


def parse_options(
    argv: list[str], prog: str, usage: str, flags: tuple[str, ...], command: bool = False
) -> tuple[dict[str, object], list[str]]:
    """Parse ``--opt value``/``--opt=value`` and flags; with ``command``, stop at ``--``."""
    opts: dict[str, object] = {"--format": "export", "--mode": "auto"}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            print(usage, end="")
            raise SystemExit(0)
        if command and (arg == "--" or not arg.startswith("-")):
            rest = argv[i + 1 :] if arg == "--" else argv[i:]
            break
        name, eq, value = arg.partition("=")
        if name in _VALUE_OPTIONS:
            if not eq:
                i += 1
                if i == len(argv):
                    raise UsageError(f"{prog}: {name} needs a value", f"see {prog} --help")
                value = argv[i]
            opts[name] = value
        elif arg in flags:
            opts[arg] = True
        else:
            raise UsageError(f"{prog}: unknown option {arg!r}", f"see {prog} --help")
        i += 1
    if opts["--format"] not in FORMATS:
        raise UsageError(f"{prog}: --format must be one of {', '.join(FORMATS)}")
    return opts, rest


def build_task(opts: dict[str, object], environ: dict[str, str], **extra: object):
    """The command's options -> ``taskenv.build`` (shared with 'slurmfabric launch')."""
    def text(name: str) -> str | None:
        value = opts.get(name)
        return None if value is None else str(value)

    return taskenv.build(
        environ, mode=str(opts["--mode"]), addr_policy=text("--addr-policy"),
        port_range=text("--port-range"), port=text("--port"), fabric_type=text("--fabric-type"),
        check_port=bool(opts.get("--check-port")), override=bool(opts.get("--override")),
        plan=not opts.get("--no-plan"), **extra)


def main(argv: list[str]) -> int:
    opts, _ = parse_options(argv, "slurmfabric env", USAGE, _FLAGS[:3])
    task = build_task(opts, dict(os.environ))
    text = taskenv.render(task.variables, task.kept, str(opts["--format"]), task.plan)
    sys.stdout.flush()
    # surrogateescape: a value with bytes that are not UTF-8 goes out as those same bytes
    sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
    sys.stdout.flush()
    return 0
