"""The one module that calls pyslurm: job submission and node drain, one version check.

pyslurm is GPL-2.0 and optional: it is imported here only, on first use. Its release line
is Slurm's (pyslurm README, "Versioning"): pyslurm X.Y.Z builds against Slurm X.Y's headers
and ``libslurm`` only, so it is read from the installed distribution's metadata and checked
against the running Slurm (``scontrol --version``) *before* the import: importing a build
for another libslurm fails to load, or loads and sends structures of the wrong layout.

What a release line's ``JobSubmitDescription`` cannot send the way sbatch does is refused
(``unsupported``), never dropped: a job submitted through pyslurm must reach slurmctld as
the sbatch job of the same config does (tests/cluster/test_pyslurm_cluster.py compares
``scontrol show job`` field by field).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from typing import Any, Optional

from slurmfabric.errors import SlurmCommandError, SubmitError, UsageError
from slurmfabric.slurm import cmd

HINT = ("build pyslurm from the tag of this Slurm's release line (docs/launch.md, "
        "\"The pyslurm backend\"), or use --backend sbatch")


class PyslurmError(UsageError):
    """pyslurm cannot be used here: not installed, built for another Slurm, or it cannot
    express the request. Exit code 2: the fix is the user's (another build, or sbatch)."""


def installed_version() -> Optional[str]:
    """The installed pyslurm's version from its metadata (None: not installed); pyslurm
    itself is not imported (its import initialises libslurm and reads slurm.conf)."""
    from importlib import metadata  # noqa: PLC0415 - only the pyslurm paths need it

    try:
        return metadata.version("pyslurm")
    except metadata.PackageNotFoundError:
        return None


def release_line(version: str) -> Optional[tuple[int, int]]:
    """``22.5.3`` (pyslurm) or ``22.05.8`` (Slurm) -> ``(22, 5)``; None: not a version."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _line_text(line: tuple[int, int]) -> str:
    return f"{line[0]}.{line[1]:02d}"


def check_version(version: str, slurm: tuple[int, int, int]) -> None:
    """The one version check: ``version`` (the installed pyslurm's) must be of the release
    line of ``slurm`` (the running Slurm's); else PyslurmError, one line naming both."""
    running = f"{slurm[0]}.{slurm[1]:02d}.{slurm[2]}"
    line = release_line(version)
    if line != tuple(slurm[:2]):
        built = f"Slurm {_line_text(line)}" if line else "an unknown Slurm"
        raise PyslurmError(
            f"pyslurm {version} is built for {built}, but this Slurm is {running} "
            "(scontrol --version): their release lines must match", hint=HINT)


def load() -> Any:
    """Check the installed pyslurm against the running Slurm, then import it."""
    version = installed_version()
    if version is None:
        raise PyslurmError("pyslurm is not installed", hint=HINT)
    check_version(version, cmd.slurm_version())
    try:
        import pyslurm  # noqa: PLC0415 - optional (GPL), imported on first use on purpose
    except Exception as exc:  # a missing libslurm.so.N fails in its own ways
        raise PyslurmError(f"pyslurm failed to load ({type(exc).__name__}: {exc})",
                           hint=HINT) from None
    return pyslurm


# --- job submission -----------------------------------------------------------------------

_MEMORY = ("memory_per_node", "memory_per_cpu", "memory_per_gpu")


def unsupported(fields: Mapping[str, Any], version: Optional[str]) -> dict[str, str]:
    """The JobSubmitDescription attributes in ``fields`` that pyslurm ``version`` would not
    send as sbatch does, each with why (empty: all of them reach slurmctld intact)."""
    out = {}
    for name in _MEMORY:
        if str(fields.get(name, "")).strip() == "0":
            # utils/uint.pyx u64(): 0 is "no value", so --mem=0 (all memory) becomes no
            # memory request at all (DefMemPerNode/DefMemPerCPU then apply).
            out[name] = ("pyslurm sends 0 (all memory, sbatch --mem=0) as no memory request "
                         "at all")
    if fields.get("signal") is not None and release_line(version or "") == (22, 5):
        # v22.5.3 core/job/submission.pyx: _create_job_submit_desc never calls _set_signal.
        out["signal"] = f"pyslurm {version} never sends the warning signal (sbatch --signal)"
    return out


def sbatch_counts(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The task and CPU counts sbatch derives and sends, as JobSubmitDescription attributes.

    sbatch (src/sbatch/opt.c _opt_verify, src/common/slurm_opt.c slurm_opt_create_job_desc)
    sends ntasks only when given or derived (--ntasks-per-node on a fixed node count: nodes x
    tasks per node), cpus_per_task only when given, and the job's minimum CPU count as
    ntasks x cpus_per_task when -c is given, else ntasks (1 when unset); the cluster test
    holds this against sbatch's job on the testbed's Slurm. pyslurm sends that minimum
    from ``min_cpus_per_node`` (v22.5.3, v24.11.0 core/job/submission.pyx _set_min_cpus:
    ``ptr.min_cpus``), else from its own ntasks=1 x cpus_per_task=1 defaults."""
    out: dict[str, Any] = {}
    ntasks, nodes, per_node = (fields.get(k) for k in ("ntasks", "nodes", "ntasks_per_node"))
    if ntasks is None and per_node and nodes and "-" not in str(nodes):
        ntasks = out["ntasks"] = int(nodes) * int(per_node)
    cpus = fields.get("cpus_per_task")
    out["min_cpus_per_node"] = (ntasks or 1) * (int(cpus) if cpus else 1)
    return out


def _description_class(pyslurm: Any) -> type:
    """JobSubmitDescription without the defaults sbatch does not have: pyslurm's
    ``_set_defaults`` sets ntasks=1 and cpus_per_task=1 when unset (sbatch sends neither).
    It is a plain Python-level method of the class in every release line (v22.5.3, v24.11.0,
    v25.11), so a subclass keeps sbatch's "not given"."""

    class SbatchLikeDescription(pyslurm.JobSubmitDescription):  # type: ignore[misc, name-defined]
        def _set_defaults(self) -> None:
            if not self.working_directory:
                self.working_directory = os.getcwd()
            if not self.environment:
                self.environment = "ALL"  # sbatch's default --export=ALL

    return SbatchLikeDescription


def submit(fields: Mapping[str, Any], script: str) -> int:
    """Submit ``script`` with JobSubmitDescription attributes ``fields``; the job id."""
    pyslurm = load()
    refused = unsupported(fields, installed_version())
    if refused:
        name, why = next(iter(refused.items()))
        raise PyslurmError(f"pyslurm cannot submit {name}={fields[name]!r}: {why}",
                           hint="use --backend sbatch")
    # pyslurm reads SCRIPT from a file when SCRIPT names one (Path(script).is_file()),
    # which a long script line makes raise ENAMETOOLONG: hand it a file.
    with tempfile.NamedTemporaryFile("w", prefix="slurmfabric-", suffix=".sbatch") as handle:
        handle.write(script)
        handle.flush()
        try:
            sent = {**fields, **sbatch_counts(fields)}  # what the dry run prints
            description = _description_class(pyslurm)(script=handle.name, **sent)
            return int(description.submit())
        except pyslurm.RPCError as exc:  # Slurm's own text, verbatim
            raise SubmitError(f"pyslurm submit failed: {exc}") from None
        except (ValueError, TypeError) as exc:  # pyslurm's own checks of the description
            raise SubmitError(f"pyslurm refused the job description: {exc}") from None


# --- nodes (drain and resume) -------------------------------------------------------------


def _call(what: str, func: Any) -> Any:
    try:
        return func()
    except PyslurmError:
        raise
    except Exception as exc:  # pyslurm.RPCError and libslurm failures alike
        raise SlurmCommandError(f"pyslurm {what} failed: {exc}") from exc


def _record(node: Any) -> dict[str, str]:
    """scontrol's keys, so callers read both backends alike: ``Node.state`` is Slurm's
    complete state string (``IDLE+DRAIN``), ``Node.reason`` the bare reason or None."""
    return {"NodeName": str(node.name), "State": str(node.state or ""),
            "Reason": str(node.reason or "")}


class Nodes:
    """pyslurm's ``Node``/``Nodes`` API (the same in v22.5.3, v24.11.0 and v25.11), checked
    and imported once; pyslurm reads SLURM_CONF itself."""

    def __init__(self) -> None:
        self.pyslurm = load()

    def all(self) -> list[dict[str, str]]:
        return _call("Nodes.load()", lambda: [
            _record(n) for n in self.pyslurm.Nodes.load().values()])

    def one(self, name: str) -> dict[str, str]:
        return _call(f"Node.load({name!r})", lambda: _record(self.pyslurm.Node.load(name)))

    def update(self, name: str, state: str, reason: Optional[str] = None) -> None:
        changes = {"state": state} if reason is None else {"state": state, "reason": reason}
        _call(f"Node.modify({name!r}, {changes})", lambda: self.pyslurm.Node.load(
            name).modify(self.pyslurm.Node(**changes)))
