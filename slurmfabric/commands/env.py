"""``slurmfabric env``: print this task's rank (and NCCL) environment.

In the batch shell it prints job-level values (MASTER_ADDR, MASTER_PORT, NNODES, RDZV_ID)
for ``eval "$(slurmfabric env)"``; inside an srun task the full rank environment.

This runs on every rank, so it avoids argparse, shlex, json and dataclasses (each costs
milliseconds to import): a tiny option parser below, JSON only when asked for.
"""

from __future__ import annotations

import os
import sys

from slurmfabric import rankenv
from slurmfabric.errors import UsageError

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


def resolve(opts: dict[str, object], environ: dict[str, str]) -> rankenv.RankEnv:
    port_range = opts.get("--port-range")
    rank_env = rankenv.resolve(
        environ,
        mode=str(opts["--mode"]),
        addr_policy=opts.get("--addr-policy"),  # type: ignore[arg-type]
        port_range=rankenv.parse_port_range(str(port_range)) if port_range else None,
    )
    if rank_env.scope == "job":
        rank_env = _checked_job_port(rank_env, opts, environ)
    if opts.get("--check-port"):
        check_port(rank_env, environ)
    return rank_env


def _checked_job_port(rank_env: rankenv.RankEnv, opts: dict[str, object],
                      environ: dict[str, str]) -> rankenv.RankEnv:
    """In the batch shell on the master node: a port no other job holds (ports.py)."""
    text = str(opts.get("--port") or environ.get("SLURMFABRIC_PORT") or "")
    start = rank_env.master_port
    if text:
        if not text.isdigit() or not rank_env.port_range[0] <= int(text) <= \
                rank_env.port_range[1]:
            raise UsageError(
                f"--port/SLURMFABRIC_PORT {text!r} is not a port inside the range "
                "{}-{}".format(*rank_env.port_range),
                "give a port inside --port-range / SLURMFABRIC_PORT_RANGE",
            )
        start = int(text)
    here = environ.get("SLURMD_NODENAME")
    if here != rank_env.master_host:
        return rank_env.replace(master_port=start)  # not on the master: cannot check
    from slurmfabric import ports

    port, notes = ports.choose(start, rank_env.port_range, rank_env.job_id,
                               rankenv.port_is_free)
    return rank_env.replace(master_port=port, notes=(*rank_env.notes, *notes))


def check_port(rank_env: rankenv.RankEnv, environ: dict[str, str]) -> None:
    """Only the master node can tell whether the port is free; elsewhere this is a no-op."""
    here = environ.get("SLURMD_NODENAME")
    if here and here != rank_env.master_host:
        return
    if not rankenv.port_is_free(rank_env.master_port):
        from slurmfabric.errors import RankEnvError

        raise RankEnvError(
            f"MASTER_PORT {rank_env.master_port} is already in use on {rank_env.master_host}",
            "pick another range with --port-range or SLURMFABRIC_PORT_RANGE, "
            "or set MASTER_PORT yourself",
        )


def wants_plan(rank_env: rankenv.RankEnv, opts: dict[str, object], environ: dict[str, str]):
    """The fabric plan for this node, or None (batch shell, --no-plan, a CPU-only node).

    NCCL settings are per node, so never in the batch shell (its values would leak into
    every node's steps). A node with neither GPUs nor RDMA devices gets no plan at all:
    nothing to tune, and the topology code stays unimported (it is the slow part).
    """
    if rank_env.scope == "job" or opts.get("--no-plan"):
        return None
    if environ.get("SLURMFABRIC_NO_PLAN") == "1":
        return None
    if not environ.get("SLURMFABRIC_SYSFS_ROOT") and not _has_accelerators():
        kind = _raw_fabric_type(opts, environ)
        if kind in ("auto", "tcp"):  # nothing to plan; the plan package stays unimported
            return None
        if fabric_type(opts, environ) != "tcp":  # validates; ib/roce/efa need the fabric
            from slurmfabric.errors import RankEnvError

            node = environ.get("SLURMD_NODENAME") or os.uname().nodename
            raise RankEnvError(
                f"fabric.type={kind} but node {node} has no GPU and no RDMA device "
                "(/dev/nvidiactl and /sys/class/infiniband are absent)",
                "run on a node with the fabric, or set fabric.type=auto or tcp",
            )
        return None
    try:
        from slurmfabric.plan import make_plan, visible_gpus_from_env
        from slurmfabric.topology import discover
    except ImportError:  # the fabric plan is optional at this seam
        return None
    local = rank_env.local_world_size or rank_env.nproc_per_node or 1
    plan = make_plan(
        discover(plan_only=True),
        local,
        visible_gpus=visible_gpus_from_env(environ),
        master_addr=rank_env.master_addr,
        user_env=environ,
        fabric_type=fabric_type(opts, environ),
        node=environ.get("SLURMD_NODENAME") or os.uname().nodename,
    )
    if plan.errors and not opts.get("--print"):
        from slurmfabric.errors import RankEnvError

        raise RankEnvError(
            "; ".join(plan.errors),
            "fix the node (slurmfabric topo --explain) or set fabric.type=auto to let "
            "each node decide",
        )
    return plan


def _raw_fabric_type(opts: dict[str, object], environ: dict[str, str]) -> str:
    return str(opts.get("--fabric-type") or environ.get("SLURMFABRIC_FABRIC_TYPE") or "auto")


def fabric_type(opts: dict[str, object], environ: dict[str, str]) -> str:
    """The job's fabric.type (plan/contract.py ENV_VAR), checked against the known types."""
    from slurmfabric.plan.contract import check_type

    return check_type(_raw_fabric_type(opts, environ))


def _has_accelerators() -> bool:
    if os.path.exists("/dev/nvidiactl"):
        return True
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


def build(
    opts: dict[str, object], environ: dict[str, str]
) -> tuple[rankenv.RankEnv, dict[str, str], dict[str, str], object]:
    """(rank env, variables to set, user values kept, plan or None)."""
    rank_env = resolve(opts, environ)
    final, kept = rankenv.with_user_values(rank_env, environ, bool(opts.get("--override")))
    plan = wants_plan(rank_env, opts, environ)
    if plan is not None:
        for key, value in plan.nccl_env.items():  # the plan never overrides the user's
            final.setdefault(key, value)
    return rank_env, final, kept, plan


def quote(value: str) -> str:
    """POSIX shell quoting, same result as shlex.quote (shlex imports re: too slow here)."""
    if value and all(c in _SAFE for c in value):
        return value
    return "'" + value.replace("'", "'\"'\"'") + "'"


_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_")


def render(final: dict[str, str], kept: dict[str, str], fmt: str, plan: object) -> str:
    if fmt == "json":
        import json

        return json.dumps(final, indent=2, sort_keys=False) + "\n"
    from slurmfabric.textcheck import one_line

    lines = []
    if fmt == "export":
        # Comment lines hold user values: a newline there would end the comment and run the
        # rest under eval, so every non-printable character is shown by its escape.
        lines += [
            f"# slurmfabric: kept {key}={one_line(quote(value), 200)} (already set; "
            "--override replaces it)"
            for key, value in kept.items()
        ]
        for warning in getattr(plan, "warnings", ()) or ():
            lines.append("# slurmfabric: warning: " + one_line(" ".join(str(warning).split()),
                                                               1000))
        lines += [f"export {key}={quote(value)}" for key, value in final.items()]
    else:  # dotenv: KEY=value, double-quoted when needed
        for key, value in final.items():
            if value and all(c in _SAFE for c in value):
                lines.append(f"{key}={value}")
            else:
                escaped = (value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
                           .replace("`", "\\`").replace("\n", "\\n").replace("\r", "\\r"))
                lines.append(f'{key}="{escaped}"')
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    opts, _ = parse_options(argv, "slurmfabric env", USAGE, _FLAGS[:3])
    _, final, kept, plan = build(opts, dict(os.environ))
    text = render(final, kept, str(opts["--format"]), plan)
    sys.stdout.flush()
    # surrogateescape: a value with bytes that are not UTF-8 goes out as those same bytes
    sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
    sys.stdout.flush()
    return 0
