"""Drain and resume rules: slurmfabric only ever touches reasons it set itself.

Reasons look like ``slurmfabric: <check>: <detail>``. A node that already carries a reason
set by someone else (an admin's "bad DIMM, ticket 123") keeps it and is never resumed by
us. If slurmctld cannot be reached, we retry briefly and keep the wanted reason in a local
state file; the hook still exits non-zero so Slurm drains the node anyway ("Prolog error"),
and ``resume_if_ours`` recognises that Slurm reason as ours through the state file.

A circuit breaker refuses to drain when a configured share of the cluster already carries
the same slurmfabric check: a bad config or driver rollout must not drain every node. It
costs one ``scontrol show -o node`` (one RPC to slurmctld, about 1 KB of text per node),
made only when a check fails, and the same call gives this node's current reason.

Two backends talk to slurmctld, chosen by the site config (``[runner] drain_backend``):
``scontrol`` (default, through slurmcmd) and ``pyslurm``. pyslurm is GPL and optional: the
site installs it (built for its exact Slurm version); it is imported only inside that backend,
so the hook path never loads it unless configured. Both apply the same rules above.

Burn-in: Slurm runs no job on a DRAIN node, not even in a maintenance reservation, and a
RESUME clears the reason. ``release_for_burnin`` therefore records a node we drained in the
state file before resuming it into a MAINT reservation; ``finish_burnin`` ends that record.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from slurmfabric import slurmcmd
from slurmfabric.errors import ConfigError, HealthError, SlurmCommandError
from slurmfabric.health import siteconfig, state

PREFIX = "slurmfabric:"
SLURM_HOOK_REASONS = ("Prolog error", "Epilog error")
MAX_REASON = 200
DEFAULT_STATE_DIR = "/var/lib/slurmfabric/health"
_STAMP = re.compile(r"\s*\[[^\]]*@[^\]]*\]\s*$")  # Slurm appends " [user@2024-01-01T00:00:00]"

# outcomes of drain()
DRAINED = "drained"  # we set the reason now
ALREADY = "already"  # the node already carried this exact reason of ours
KEPT_FOREIGN = "kept_foreign"  # someone else's reason: left alone
BREAKER = "breaker"  # too many nodes fail the same check: not drained
DEFERRED = "deferred"  # slurmctld unreachable: reason kept in the local state file


@dataclass(frozen=True)
class DrainOutcome:
    outcome: str
    reason: str
    detail: str = ""

    @property
    def drained(self) -> bool:
        return self.outcome in (DRAINED, ALREADY)


def make_reason(check: str, detail: str) -> str:
    """One line, bounded length: Slurm shows it in sinfo -R and scontrol show node."""
    text = " ".join(f"{PREFIX} {check}: {detail}".split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def current_reason(record: dict[str, str]) -> str:
    """The node's Reason without Slurm's ``[user@time]`` stamp ('' when there is none)."""
    reason = record.get("Reason", "").strip()
    return "" if reason in ("(null)", "none", "None") else _STAMP.sub("", reason)


def is_ours(reason: str) -> bool:
    return reason.startswith(PREFIX)


def _state_path(state_dir: str | os.PathLike[str] | None, node: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in node)
    return Path(state_dir or DEFAULT_STATE_DIR) / f"drain-{safe}.json"


def _remember(state_dir, node: str, reason: str, applied: bool, **extra: object) -> None:
    state.write_json(_state_path(state_dir, node), {"node": node, "reason": reason,
                                                    "applied": applied, "time": time.time(),
                                                    **extra})


def remembered(node: str, state_dir: str | os.PathLike[str] | None = None) -> dict | None:
    """What we last wanted for ``node`` (a dict with reason/applied), or None."""
    return state.read_json(_state_path(state_dir, node))


BACKENDS = ("scontrol", "pyslurm")
_DRAIN_FLAGS = {"DRAIN", "DRAINED", "DRAINING"}


class ScontrolBackend:
    """``scontrol show -o node`` / ``scontrol update`` through slurmcmd (the default)."""

    name = "scontrol"

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env

    def nodes(self) -> list[dict[str, str]]:
        return slurmcmd.show("node", env=self.env)

    def node(self, name: str) -> dict[str, str]:
        return slurmcmd.node(name, env=self.env)

    def update(self, name: str, state: str, reason: str | None = None) -> None:
        fields = {"State": state} if reason is None else {"State": state, "Reason": reason}
        slurmcmd.update_node(name, env=self.env, **fields)


class PyslurmBackend:
    """pyslurm 25.11's ``Node``/``Nodes`` API. Records use scontrol's keys so the rules
    above stay the same: ``Node.state`` is Slurm's complete state string (``IDLE+DRAIN``)
    and ``Node.reason`` the bare reason (None when unset). pyslurm reads SLURM_CONF itself."""

    name = "pyslurm"

    def __init__(self) -> None:
        try:
            import pyslurm  # optional, GPL: only when the site configured this backend
        except ImportError as exc:
            raise HealthError(
                f"drain_backend = \"pyslurm\" but pyslurm cannot be imported ({exc})",
                hint="install pyslurm built for this Slurm version (its major.minor must "
                "match), or set [runner] drain_backend = \"scontrol\" in health.toml",
            ) from exc
        self.pyslurm = pyslurm

    @staticmethod
    def _record(node) -> dict[str, str]:
        return {"NodeName": str(node.name), "State": str(node.state or ""),
                "Reason": str(node.reason or "")}

    def _call(self, what: str, func):
        try:
            return func()
        except Exception as exc:  # pyslurm.RPCError and libslurm failures alike
            raise SlurmCommandError(f"pyslurm {what} failed: {exc}") from exc

    def nodes(self) -> list[dict[str, str]]:
        return self._call("Nodes.load()", lambda: [
            self._record(n) for n in self.pyslurm.Nodes.load().values()])

    def node(self, name: str) -> dict[str, str]:
        return self._call(f"Node.load({name!r})",
                          lambda: self._record(self.pyslurm.Node.load(name)))

    def update(self, name: str, state: str, reason: str | None = None) -> None:
        changes = {"state": state} if reason is None else {"state": state, "reason": reason}
        self._call(f"Node.modify({name!r}, {changes})", lambda: self.pyslurm.Node.load(
            name).modify(self.pyslurm.Node(**changes)))


def backend_for(name: str | None, node: str, env: dict[str, str] | None = None):
    """The backend ``name``; None: the one the site config names (``drain_backend``).
    Raises HealthError (with a hint) when pyslurm is configured but cannot be imported."""
    if name is None:
        name = str(siteconfig.load(node).runner["drain_backend"])
    if name == "scontrol":
        return ScontrolBackend(env)
    if name == "pyslurm":
        return PyslurmBackend()
    raise ConfigError([f"drain backend {name!r} is unknown"],
                      hint=f"use one of {', '.join(BACKENDS)}")


def _with_retries(func, retries: int, retry_s: float):
    last: SlurmCommandError | None = None
    for attempt in range(max(1, retries)):
        try:
            return func()
        except SlurmCommandError as exc:
            last = exc
            if attempt + 1 < retries:
                time.sleep(retry_s * (2**attempt))
    assert last is not None
    raise last


def breaker_tripped(records: list[dict[str, str]], node: str, check: str, fraction: float,
                    min_nodes: int) -> tuple[bool, int, int]:
    """(tripped, nodes already drained for ``check``, total nodes)."""
    tag = f"{PREFIX} {check}:"
    same = sum(1 for r in records if r.get("NodeName") != node
               and current_reason(r).startswith(tag))
    total = len(records)
    limit = max(int(min_nodes), math.ceil(float(fraction) * total))
    return same >= limit, same, total


def drain(node: str, check: str, detail: str, *, breaker_fraction: float = 0.1,
          breaker_min_nodes: int = 3, retries: int = 3, retry_s: float = 1.0,
          state_dir: str | os.PathLike[str] | None = None,
          env: dict[str, str] | None = None, backend: str | None = None) -> DrainOutcome:
    """Drain ``node`` with ``slurmfabric: <check>: <detail>`` unless a foreign reason is
    already set or the breaker trips. Never raises for an unreachable slurmctld or a
    missing pyslurm: the reason is kept in the state file (DEFERRED) and the hook still
    exits non-zero. ``backend``: "scontrol" | "pyslurm"; None reads the site config."""
    reason = make_reason(check, detail)
    try:
        be = backend_for(backend, node, env)
    except HealthError as exc:
        _remember(state_dir, node, reason, applied=False)
        return DrainOutcome(DEFERRED, reason, f"{exc}; {exc.hint}")
    try:
        records = _with_retries(be.nodes, retries, retry_s)
    except SlurmCommandError as exc:
        _remember(state_dir, node, reason, applied=False)
        return DrainOutcome(DEFERRED, reason, f"slurmctld unreachable: {exc}")
    mine = next((r for r in records if r.get("NodeName") == node), None)
    if mine is None:
        return DrainOutcome(DEFERRED, reason, f"{be.name} knows no node {node!r}")
    existing = current_reason(mine)
    if existing and not is_ours(existing):
        return DrainOutcome(KEPT_FOREIGN, reason, f"node already has reason {existing!r}")
    flags = slurmcmd.node_state_flags(mine.get("State", ""))
    if existing == reason and flags & _DRAIN_FLAGS:
        return DrainOutcome(ALREADY, reason)
    if not existing:
        tripped, same, total = breaker_tripped(records, node, check, breaker_fraction,
                                               breaker_min_nodes)
        if tripped:
            return DrainOutcome(BREAKER, reason, f"{same} of {total} nodes already drained "
                                f"for {check}; not draining {node} (circuit breaker)")
    try:
        _with_retries(lambda: be.update(node, "DRAIN", reason), retries, retry_s)
    except SlurmCommandError as exc:
        _remember(state_dir, node, reason, applied=False)
        return DrainOutcome(DEFERRED, reason, f"{be.name} update failed: {exc}")
    _remember(state_dir, node, reason, applied=True)
    return DrainOutcome(DRAINED, reason)


def _ours(record: dict[str, str], node: str, state_dir) -> bool:
    """Drained with our reason, or with Slurm's hook reason our failing hook caused."""
    reason = current_reason(record)
    if is_ours(reason):
        return True
    return reason in SLURM_HOOK_REASONS and remembered(node, state_dir) is not None


def resume_if_ours(node: str, *, state_dir: str | os.PathLike[str] | None = None,
                   env: dict[str, str] | None = None, backend: str | None = None) -> bool:
    """Resume ``node`` only if it is drained with a slurmfabric reason (or with Slurm's
    "Prolog error"/"Epilog error" that our own failing hook caused, per the state file).
    Raises HealthError when the configured pyslurm backend is missing."""
    be = backend_for(backend, node, env)
    record = be.node(node)
    flags = slurmcmd.node_state_flags(record.get("State", ""))
    if not flags & _DRAIN_FLAGS or not _ours(record, node, state_dir):
        return False
    be.update(node, "RESUME")
    forget(node, state_dir)
    return True


# outcomes of release_for_burnin()
RELEASED = "released"  # was drained by us: resumed for the test, remembered in the state file
NOT_DRAINED = "not_drained"  # nothing to do: the node can run the test as it is


def release_for_burnin(node: str, *, state_dir: str | os.PathLike[str] | None = None,
                       env: dict[str, str] | None = None,
                       backend: str | None = None) -> tuple[str, str]:
    """Resume a node slurmfabric drained so a burn-in job (in a MAINT reservation that keeps
    users off) can run on it; the state file keeps ``burnin`` and the old reason so the gate
    can tell afterwards. Returns (outcome, reason); outcome is KEPT_FOREIGN, untouched, when
    someone else drained the node."""
    be = backend_for(backend, node, env)
    record = be.node(node)
    reason = current_reason(record)
    if not slurmcmd.node_state_flags(record.get("State", "")) & _DRAIN_FLAGS:
        return NOT_DRAINED, reason
    if not _ours(record, node, state_dir):
        return KEPT_FOREIGN, reason
    _remember(state_dir, node, reason, applied=True, burnin=True)
    be.update(node, "RESUME")
    return RELEASED, reason


def in_burnin(node: str, state_dir: str | os.PathLike[str] | None = None) -> bool:
    record = remembered(node, state_dir)
    return bool(isinstance(record, dict) and record.get("burnin"))


def finish_burnin(node: str, state_dir: str | os.PathLike[str] | None = None) -> bool:
    """The node passed its burn-in: end the record (it already runs jobs). True if it was
    in burn-in."""
    if not in_burnin(node, state_dir):
        return False
    forget(node, state_dir)
    return True


def forget(node: str, state_dir: str | os.PathLike[str] | None = None) -> None:
    with contextlib.suppress(OSError):
        _state_path(state_dir, node).unlink()
