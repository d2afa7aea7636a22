"""What a Slurm TaskProlog prints so that every task gets the node's NCCL plan and its rank.

slurmstepd runs ``TaskProlog`` (slurm.conf) as the job's user, with the task's environment,
before each task; it reads the program's standard output and applies each line
``export NAME=value`` (the value is taken literally to the end of the line: no shell
quoting), ``unset NAME`` and ``print TEXT`` (to the task's stdout). See slurm.conf(5)
TaskProlog and https://slurm.schedmd.com/prolog_epilog.html. Observed on Slurm 22.05: an
exported name replaces a value the task already had, so this module never prints a name
the task already has unless slurmfabric itself set that value (the SLURMFABRIC_ENV_SET
marker, rankenv.with_user_values): what the user or the job set always wins.

Rules for a hook every task on the cluster passes through:
- It never fails a task. Any error becomes one line on stderr (slurmd's log) and no
  exports: a job without the plan still runs, as it did before the hook.
- Opt-out per job: ``SLURMFABRIC_TASKPROLOG=off`` (or 0/no/false) in the job's environment.
- It writes only where the user can: the discovered topology is cached per boot in
  ``$TMPDIR/slurmfabric-<uid>/`` (0700, owned by the user, else not used), so a 1,000-task
  step discovers sysfs once per node, not once per task.
- A value that cannot be one ``export`` line (a newline, a NUL) is not printed at all.
"""

from __future__ import annotations

import os
import sys

OPT_OUT = "SLURMFABRIC_TASKPROLOG"
_OFF = ("0", "off", "no", "false")
CACHE_FORMAT = "1"
_NAME_OK = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def opted_out(environ: dict[str, str]) -> bool:
    return environ.get(OPT_OUT, "").strip().lower() in _OFF


def sysfs_root(pattern: str | None, environ: dict[str, str]) -> str | None:
    """``--sysfs-root`` with ``{node}`` replaced by this node's name (test clusters and
    containers whose sysfs lives elsewhere); a node name that could leave the directory
    is refused."""
    if not pattern:
        return None
    node = environ.get("SLURMD_NODENAME") or os.uname().nodename
    if "/" in node or node in (".", "..") or not node:
        raise ValueError(f"node name {node!r} cannot name a sysfs root")
    return pattern.replace("{node}", node)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read(64).strip()
    except OSError:
        return "unknown"


def cache_dir(environ: dict[str, str]) -> str | None:
    """The user's own cache directory, created 0700; None when it is not safely ours
    (another user made it first, or it is a symlink)."""
    base = environ.get("TMPDIR") or "/tmp"
    path = os.path.join(base, f"slurmfabric-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        info = os.lstat(path)
    except OSError:
        return None
    import stat

    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return path


def _key(*parts: str) -> str:
    """FNV-1a over the parts, not hashlib: hashlib's import alone costs ~4 ms per task."""
    digest = 0xCBF29CE484222325
    for byte in "\0".join(parts).encode("utf-8", "surrogateescape"):
        digest = ((digest ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{digest:016x}"


def _node_key(root: str | None) -> str:
    """Per boot, sysfs root, slurmfabric and Python version (marshal's format is Python's)."""
    from slurmfabric import __version__

    return _key(CACHE_FORMAT, __version__, sys.version, _boot_id(),
                os.path.abspath(root or "/"))


def _cache_path(environ: dict[str, str], name: str) -> str | None:
    """``name``.marshal in the user's cache directory; None where there is none."""
    directory = cache_dir(environ)
    return os.path.join(directory, f"{name}.marshal") if directory else None


def _load(path: str | None) -> object:
    import marshal

    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as handle:
            return marshal.loads(handle.read(16 << 20))
    except Exception:  # noqa: BLE001 - a bad cache is recomputed, never fatal
        return None


def _store(path: str | None, data: object) -> None:
    """Atomically (write, rename): concurrent first tasks never read half a file."""
    import marshal

    from slurmfabric._common.files import write_atomic

    if not path:
        return
    try:
        write_atomic(path, marshal.dumps(data))
    except (OSError, ValueError):  # a cache that cannot be written is simply not kept
        return


def topology(root: str | None, environ: dict[str, str]) -> object:
    """This node's Topology: from the per-boot cache when there is one, else discovered
    (plan-only reads) and cached for the next task. marshal (built in, unlike json) of
    snapshot.to_dict, in the user's own 0700 directory."""
    from slurmfabric.topology import snapshot

    path = _cache_path(environ, f"topology-{_node_key(root)}")
    data = _load(path)
    if isinstance(data, dict):
        try:
            return snapshot.from_dict(data)
        except Exception:  # noqa: BLE001 - rediscover
            pass
    from slurmfabric.topology import discover

    topo = discover(root, plan_only=True, environ=environ)
    _store(path, snapshot.to_dict(topo))
    return topo


class CachedPlan:
    """What taskenv.build reads of a node plan, as the cache holds it."""

    def __init__(self, data: dict) -> None:
        self.nccl_env = dict(data["nccl_env"])
        self.fabric = data["fabric"]
        self.warnings = list(data["warnings"])
        self.errors = list(data["errors"])
        self.bindings = [CachedBinding(b) for b in data["bindings"]]


class CachedBinding:
    def __init__(self, data: dict) -> None:
        self.visible_index = data["visible_index"]
        self.nic = data["nic"]
        self.cpus = tuple(data["cpus"])
        self.mem_node = data["mem_node"]


def _plan_data(plan: object) -> dict:
    return {"nccl_env": dict(plan.nccl_env), "fabric": plan.fabric,  # type: ignore[attr-defined]
            "warnings": [str(w) for w in plan.warnings],  # type: ignore[attr-defined]
            "errors": [str(e) for e in plan.errors],  # type: ignore[attr-defined]
            "bindings": [{"visible_index": getattr(b, "visible_index", None),
                          "nic": getattr(b, "nic", None),
                          "cpus": list(getattr(b, "cpus", ()) or ()),
                          "mem_node": getattr(b, "mem_node", None)}
                         for b in getattr(plan, "bindings", None) or ()]}


def plan_source(root: str | None):
    """taskenv.build's plan step with a cache: the plan is a function of the node's
    topology and of these inputs, so tasks of one step (same inputs) compute it once."""
    from slurmfabric.rank import task as taskenv

    def source(rank_env, opts, env):
        if not opts.get("plan", True) or rank_env.scope == "job":
            return None
        if not (root or env.get("SLURMFABRIC_SYSFS_ROOT") or taskenv._has_accelerators()):
            return taskenv.wants_plan(rank_env, opts, env)  # no fabric: its own answer
        from slurmfabric.plan import visible_gpus_from_env

        inputs = [_node_key(root), str(rank_env.local_world_size or rank_env.nproc_per_node),
                  ",".join(visible_gpus_from_env(env) or ()), str(rank_env.master_addr),
                  taskenv._raw_fabric_type(opts, env), env.get("SLURMD_NODENAME", ""),
                  env.get("SLURMFABRIC_ROCE_VLAN", ""),  # the site's RoCE GID choice
                  *sorted(f"{k}={v}" for k, v in env.items() if k.startswith("NCCL_"))]
        path = _cache_path(env, f"plan-{_key(*inputs)}")
        data = _load(path)
        if isinstance(data, dict):
            try:
                return CachedPlan(data)
            except (KeyError, TypeError):
                pass
        plan = taskenv.wants_plan(rank_env, opts, env, topology(root, env))
        if plan is not None:
            _store(path, _plan_data(plan))
        return plan

    return source


def exports(environ: dict[str, str], root_pattern: str | None = None,
            fabric_type: str | None = None, plan: bool = True) -> list[str]:
    """The ``export`` lines for the task ``environ`` describes (empty when opted out)."""
    if opted_out(environ):
        return []
    from slurmfabric.rank import task as taskenv

    env = dict(environ)
    root = sysfs_root(root_pattern, env)
    if root:
        env["SLURMFABRIC_SYSFS_ROOT"] = root
    task = taskenv.build(env, fabric_type=fabric_type, plan=plan, strict=False,
                         plan_source=plan_source(env.get("SLURMFABRIC_SYSFS_ROOT")))
    lines = []
    for name, value in task.variables.items():
        if environ.get(name) == value or name in task.kept:
            continue  # already so, or the user's own value
        if name in environ and name not in _ours(environ):
            continue  # set by the user or the job: never replaced
        if not name or not set(name) <= _NAME_OK or "\n" in value or "\0" in value \
                or "\r" in value:
            continue
        lines.append(f"export {name}={value}")
    return lines


def _ours(environ: dict[str, str]) -> set[str]:
    """Names whose current value slurmfabric set (the marker of rankenv.with_user_values)."""
    from slurmfabric.rank import env as rankenv

    marked = rankenv._marker(environ)
    return {k for k, v in marked.items() if environ.get(k) == v}


def main(environ: dict[str, str], root_pattern: str | None, fabric_type: str | None,
         plan: bool) -> int:
    """Print the exports; on any error print nothing to stdout and say why on stderr."""
    try:
        text = "".join(line + "\n" for line in exports(environ, root_pattern, fabric_type, plan))
    except Exception as error:  # noqa: BLE001 - a TaskProlog must never fail the task
        from slurmfabric._common.textcheck import one_line

        print(f"slurmfabric taskprolog: no variables set: {one_line(str(error), 300)}",
              file=sys.stderr)
        return 0
    sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
    sys.stdout.flush()
    return 0
