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
- It writes only where the user can: the node's topology and plan go into the per-boot plan
  cache that ``launch`` and ``env`` share (rank/plancache.py: the user's own 0700
  directory, checked before use), so a 1,000-task step discovers sysfs once per node, not
  once per task, and the ranks that ``slurmfabric launch`` starts afterwards find the plan.
- A value that cannot be one ``export`` line (a newline, a NUL) is not printed at all.
"""

from __future__ import annotations

import os
import sys

OPT_OUT = "SLURMFABRIC_TASKPROLOG"
_OFF = ("0", "off", "no", "false")
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
    task = taskenv.build(env, fabric_type=fabric_type, plan=plan, strict=False)
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
