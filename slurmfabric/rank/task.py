"""The environment and binding one task gets: a pure decision over its environment.

``build(environ, ...)`` is what ``slurmfabric env`` prints and ``slurmfabric launch``
applies, as a Python API: the rank environment (rankenv), a MASTER_PORT the batch shell
checked free (ports), the node's NCCL plan under the job's fabric type (plan, only on nodes
with GPUs or RDMA devices) and this local rank's binding; ``render`` writes it for ``eval``
(export), as JSON or as a dotenv file, quoted so that every value survives ``eval`` byte for
byte. This runs on every rank: standard library only, no argparse/shlex/json/dataclasses
at import (each costs milliseconds).
"""

from __future__ import annotations

import os

from slurmfabric._common.record import Record
from slurmfabric.errors import UsageError
from slurmfabric.rank import env as rankenv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def resolve(opts: dict[str, object], environ: dict[str, str]) -> rankenv.RankEnv:
    """The rank environment, with the batch shell's port checked (see ``build``)."""
    port_range = opts.get("port_range")
    rank_env = rankenv.resolve(
        environ,
        mode=str(opts.get("mode") or "auto"),
        addr_policy=opts.get("addr_policy"),  # type: ignore[arg-type]
        port_range=rankenv.parse_port_range(str(port_range)) if port_range else None,
    )
    if rank_env.scope == "job":
        rank_env = _checked_job_port(rank_env, opts, environ)
    if opts.get("check_port"):
        check_port(rank_env, environ)
    return rank_env


def _checked_job_port(rank_env: rankenv.RankEnv, opts: dict[str, object],
                      environ: dict[str, str]) -> rankenv.RankEnv:
    """In the batch shell on the master node: a port no other job holds (ports.py)."""
    text = str(opts.get("port") or environ.get("SLURMFABRIC_PORT") or "")
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
    from slurmfabric.rank import ports

    port, notes = ports.choose(start, rank_env.port_range, rank_env.job_id,
                               ports.port_is_free)
    return rank_env.replace(master_port=port, notes=(*rank_env.notes, *notes))


def check_port(rank_env: rankenv.RankEnv, environ: dict[str, str]) -> None:
    """Only the master node can tell whether the port is free; elsewhere this is a no-op."""
    here = environ.get("SLURMD_NODENAME")
    if here and here != rank_env.master_host:
        return
    from slurmfabric.rank.ports import port_is_free

    if not port_is_free(rank_env.master_port):
        from slurmfabric.errors import RankEnvError

        raise RankEnvError(
            f"MASTER_PORT {rank_env.master_port} is already in use on {rank_env.master_host}",
            "pick another range with --port-range or SLURMFABRIC_PORT_RANGE, "
            "or set MASTER_PORT yourself",
        )


def wants_plan(rank_env: rankenv.RankEnv, opts: dict[str, object], environ: dict[str, str],
               topology: object = None):
    """The fabric plan for this node, or None (see ``node_plan``)."""
    return node_plan(rank_env, opts, environ, topology)[0]


def node_plan(rank_env: rankenv.RankEnv, opts: dict[str, object], environ: dict[str, str],
              topology: object = None) -> tuple[object, str]:
    """(the fabric plan for this node or None, where it came from: ``cache``,
    ``discovered``, ``discovered; cache: WHY NOT``, or '' without a plan).

    ``topology``: the node's discovered Topology when the caller has it (no cache then).
    ``opts["cache"]`` False: no per-boot cache (rank/plancache.py; also
    SLURMFABRIC_PLAN_CACHE=off).

    NCCL settings are per node, so never in the batch shell (its values would leak into
    every node's steps). A node with neither GPUs nor RDMA devices gets no plan at all:
    nothing to tune, and the topology code stays unimported (it is the slow part).
    """
    if rank_env.scope == "job" or not opts.get("plan", True):
        return None, ""
    if environ.get("SLURMFABRIC_NO_PLAN") == "1":
        return None, ""
    root = environ.get("SLURMFABRIC_SYSFS_ROOT") or ""
    if not root and not _has_accelerators():
        kind = _raw_fabric_type(opts, environ)
        if kind in ("auto", "tcp"):  # nothing to plan; the plan package stays unimported
            return None, ""
        if fabric_type(opts, environ) != "tcp":  # validates; ib/roce/efa need the fabric
            from slurmfabric.errors import RankEnvError

            node = environ.get("SLURMD_NODENAME") or os.uname().nodename
            raise RankEnvError(
                f"fabric.type={kind} but node {node} has no GPU and no RDMA device "
                "(/dev/nvidiactl and /sys/class/infiniband are absent)",
                "run on a node with the fabric, or set fabric.type=auto or tcp",
            )
        return None, ""
    local = rank_env.local_world_size or rank_env.nproc_per_node or 1
    node = environ.get("SLURMD_NODENAME") or os.uname().nodename
    plan, origin = _cached_or_made(opts, environ, root, local, rank_env.master_addr, node,
                                   topology)
    if plan is None:
        return None, ""
    if (environ.get("KUBERNETES_SERVICE_HOST") and not environ.get("SLURM_JOB_ID")
            and getattr(plan, "fabric", "tcp") in ("ib", "roce")):
        from slurmfabric.rank.k8s import locked_memory_problem

        problem = locked_memory_problem()
        if problem:
            plan.errors.append(problem)
    if plan.errors and opts.get("strict", True):
        from slurmfabric.errors import RankEnvError

        raise RankEnvError(
            "; ".join(plan.errors),
            "fix the node (slurmfabric topo --explain) or set fabric.type=auto to let "
            "each node decide",
        )
    return plan, origin


def _cached_or_made(opts: dict[str, object], environ: dict[str, str], root: str, local: int,
                    master_addr: str, node: str, topology: object) -> tuple[object, str]:
    """The plan from the per-boot cache, else discovered (or ``topology``) and made."""
    from slurmfabric.rank import plancache

    cache = held = None
    if topology is None and opts.get("cache", True):
        cache = plancache.open_cache(environ)
    try:
        inputs = plancache.plan_inputs(environ, local, master_addr,
                                       _raw_fabric_type(opts, environ), node)
        if cache is not None:
            cached = plancache.load_plan(cache, root or "/", inputs)
            if cached is not None:
                return cached, "cache"
            held = plancache.lock(cache, root or "/", inputs)
            if held is not None:  # the rank that held it may have written the entry
                cache.fingerprint = None
                cached = plancache.load_plan(cache, root or "/", inputs)
                if cached is not None:
                    return cached, "cache"
        try:
            from slurmfabric.plan import make_plan, visible_gpus_from_env
            from slurmfabric.topology import discover
        except ImportError:  # the fabric plan is optional at this seam
            return None, ""
        usable = cache is not None and cache.fd is not None
        before = plancache.prepare(root or "/", environ) if usable else ()
        if usable:
            topology = plancache.load_topology(cache, root or "/", environ, before)
        fresh = topology is None
        if fresh:
            topology = discover(root or None, plan_only=True, environ=environ)
        plan = make_plan(
            topology,  # type: ignore[arg-type]
            local,
            visible_gpus=visible_gpus_from_env(environ),
            master_addr=master_addr,
            user_env=environ,
            fabric_type=fabric_type(opts, environ),
            node=node,
        )
        if cache is None:
            return plan, "discovered; cache: off" if topology is None or fresh else "given"
        why = plancache.store(cache, root or "/", environ, inputs, before, topology, plan)
        origin = "discovered" if fresh else "planned from the cached topology"
        return plan, f"{origin}; cache: {why}" if why else origin
    finally:
        if cache is not None:
            plancache.unlock(held)
            cache.close()


def _raw_fabric_type(opts: dict[str, object], environ: dict[str, str]) -> str:
    return str(opts.get("fabric_type") or environ.get("SLURMFABRIC_FABRIC_TYPE") or "auto")


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


class TaskEnv(Record):
    """What one task gets: its rank env, the variables to set, the user's values kept,
    the node's plan (or None) and this local rank's binding (or None)."""

    __slots__ = ("rank_env", "variables", "kept", "plan", "binding", "plan_origin")
    _defaults = {"plan_origin": ""}
    rank_env: rankenv.RankEnv
    variables: dict[str, str]
    kept: dict[str, str]
    plan: object
    binding: object
    plan_origin: str  # node_plan's answer: "cache", "discovered", ...


def build(
    environ: Mapping[str, str] | None = None,
    *,
    mode: str = "auto",
    addr_policy: str | None = None,
    port_range: str | None = None,
    port: str | int | None = None,
    fabric_type: str | None = None,
    check_port: bool = False,
    override: bool = False,
    plan: bool = True,
    bind: bool = True,
    strict: bool = True,
    plan_source: object = None,
    cache: bool = True,
) -> TaskEnv:
    """The environment and binding of the task ``environ`` (default ``os.environ``)
    describes: what ``slurmfabric env`` prints and ``slurmfabric launch`` applies.

    ``strict`` (default): a node that cannot honour the job's fabric type is an error
    (RankEnvError); ``launch --print`` passes False to show the errors instead.
    ``bind=False``: the binding is planned but its CPU/memory entries are not exported.
    ``plan_source``: a callable ``(rank_env, opts, environ) -> plan or None`` used instead
    of ``wants_plan``. ``cache``: use the per-boot plan cache (rank/plancache.py).
    """
    env = dict(os.environ if environ is None else environ)
    opts = {"mode": mode, "addr_policy": addr_policy, "port_range": port_range, "port": port,
            "fabric_type": fabric_type, "check_port": check_port, "plan": plan,
            "strict": strict, "cache": cache}
    rank_env = resolve(opts, env)
    final, kept = rankenv.with_user_values(rank_env, env, override)
    if plan_source is not None:
        the_plan, origin = plan_source(rank_env, opts, env), "given"  # type: ignore[operator]
    else:
        plan_env = env
        if "SLURMFABRIC_CONTAINER_ENV" in env:  # in a job's container (rank/container.py)
            from slurmfabric.rank.container import plan_view

            plan_env = plan_view(env)
        the_plan, origin = node_plan(rank_env, opts, plan_env)
    binding = None
    if the_plan is not None:
        for key, value in the_plan.nccl_env.items():  # the plan never overrides the user's
            final.setdefault(key, value)
        binding = _binding(the_plan, rank_env)
        if binding is not None:
            final.update(binding_env(binding, bound=bind,
                                     nic=getattr(the_plan, "fabric", "tcp") != "tcp"))
    return TaskEnv(rank_env, final, kept, the_plan, binding, origin)


def binding_env(binding: object, bound: bool, nic: bool = True) -> dict[str, str]:
    """Per-rank facts the program (or its logs) can read: GPU, nearest rail NIC, CPUs, memory.

    ``SLURMFABRIC_GPU`` is the CUDA device number of this rank's GPU within what the step sees;
    ``SLURMFABRIC_NIC`` its nearest rail (``mlx5_0:1``; not for a sockets-only job); the CPU
    and memory entries are set only when the binding was applied (not with ``--no-bind``).
    """
    out: dict[str, str] = {}
    visible = getattr(binding, "visible_index", None)
    if visible is not None:
        out["SLURMFABRIC_GPU"] = str(visible)
    rail = getattr(binding, "nic", None)
    if rail and nic:
        out["SLURMFABRIC_NIC"] = rail
    if bound:
        cpus = list(getattr(binding, "cpus", ()) or ())
        if cpus:
            out["SLURMFABRIC_CPUS"] = cpu_list_text(binding, cpus)
        node = getattr(binding, "mem_node", None)
        if node is not None:
            out["SLURMFABRIC_MEM_NODE"] = str(node)
    return out


def cpu_list_text(binding: object, cpus: list[int]) -> str:
    """``binding``'s CPUs as a kernel cpulist (``0-13,112-125``): the text a cached plan
    carries (rank/plancache.py wrote it with format_cpulist), else format_cpulist's. A warm
    rank so never imports _common/sysfs (one module less on every rank's start)."""
    text = getattr(binding, "cpulist", None)
    if isinstance(text, str):
        return text
    from slurmfabric._common.sysfs import format_cpulist

    return format_cpulist(cpus)


def _binding(plan: object, rank_env: rankenv.RankEnv) -> object | None:
    """This local rank's RankBinding from the node plan, or None."""
    bindings = getattr(plan, "bindings", None) or []
    local = rank_env.local_rank
    if local is None or local >= len(bindings):
        return None
    return bindings[local]


def quote(value: str) -> str:
    """A shell word for ``value`` (textcheck.shell_word), imported on use: 'launch' without
    --print renders nothing, so it does not pay for textcheck."""
    from slurmfabric._common.textcheck import shell_word

    return shell_word(value)


def render(final: dict[str, str], kept: dict[str, str], fmt: str, plan: object) -> str:
    if fmt == "json":
        import json

        return json.dumps(final, indent=2, sort_keys=False) + "\n"
    from slurmfabric._common.textcheck import SAFE_CHARS, one_line, shell_word

    lines = []
    if fmt == "export":
        # Comment lines hold user values: a newline there would end the comment and run the
        # rest under eval, so every non-printable character is shown by its escape.
        lines += [
            f"# slurmfabric: kept {key}={one_line(shell_word(value), 200)} (already set; "
            "--override replaces it)"
            for key, value in kept.items()
        ]
        for warning in getattr(plan, "warnings", ()) or ():
            lines.append("# slurmfabric: warning: " + one_line(" ".join(str(warning).split()),
                                                               1000))
        lines += [f"export {key}={shell_word(value)}" for key, value in final.items()]
    else:  # dotenv: KEY=value, double-quoted when needed
        for key, value in final.items():
            if value and all(c in SAFE_CHARS for c in value):
                lines.append(f"{key}={value}")
            else:
                escaped = (value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
                           .replace("`", "\\`").replace("\n", "\\n").replace("\r", "\\r"))
                lines.append(f'{key}="{escaped}"')
    return "\n".join(lines) + "\n"


def execvpe(file: str, args: list[str], env: dict[str, str]) -> None:
    """``os.execvpe`` without its ``import warnings`` (os.get_exec_path imports it: ~0.4 ms
    of every rank's start). Same search as os._execvpe and execvp(3): a name with a '/' is
    run as given; else each directory of the new environment's PATH (os.defpath without
    one; an empty entry is the current directory), in order; the first error that is not
    ENOENT/ENOTDIR is raised if no directory worked, else the last one."""
    if os.path.dirname(file):
        os.execve(file, args, env)
    saved: OSError | None = None
    last: OSError | None = None
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(directory, file), args, env)
        except (FileNotFoundError, NotADirectoryError) as error:
            last = error
        except OSError as error:
            last = error
            saved = saved or error
    raise saved or last or FileNotFoundError(2, "No such file or directory", file)
