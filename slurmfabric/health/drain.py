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
from slurmfabric.errors import SlurmCommandError
from slurmfabric.health import state

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


def _remember(state_dir, node: str, reason: str, applied: bool) -> None:
    state.write_json(_state_path(state_dir, node),
                     {"node": node, "reason": reason, "applied": applied, "time": time.time()})


def remembered(node: str, state_dir: str | os.PathLike[str] | None = None) -> dict | None:
    """What we last wanted for ``node`` (a dict with reason/applied), or None."""
    return state.read_json(_state_path(state_dir, node))


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
          env: dict[str, str] | None = None) -> DrainOutcome:
    """Drain ``node`` with ``slurmfabric: <check>: <detail>`` unless a foreign reason is
    already set or the breaker trips. Never raises for an unreachable slurmctld."""
    reason = make_reason(check, detail)
    try:
        records = _with_retries(lambda: slurmcmd.show("node", env=env), retries, retry_s)
    except SlurmCommandError as exc:
        _remember(state_dir, node, reason, applied=False)
        return DrainOutcome(DEFERRED, reason, f"slurmctld unreachable: {exc}")
    mine = next((r for r in records if r.get("NodeName") == node), None)
    if mine is None:
        return DrainOutcome(DEFERRED, reason, f"scontrol knows no node {node!r}")
    existing = current_reason(mine)
    if existing and not is_ours(existing):
        return DrainOutcome(KEPT_FOREIGN, reason, f"node already has reason {existing!r}")
    flags = slurmcmd.node_state_flags(mine.get("State", ""))
    if existing == reason and flags & {"DRAIN", "DRAINED", "DRAINING"}:
        return DrainOutcome(ALREADY, reason)
    if not existing:
        tripped, same, total = breaker_tripped(records, node, check, breaker_fraction,
                                               breaker_min_nodes)
        if tripped:
            return DrainOutcome(BREAKER, reason, f"{same} of {total} nodes already drained "
                                f"for {check}; not draining {node} (circuit breaker)")
    try:
        _with_retries(lambda: slurmcmd.update_node(node, env=env, State="DRAIN", Reason=reason),
                      retries, retry_s)
    except SlurmCommandError as exc:
        _remember(state_dir, node, reason, applied=False)
        return DrainOutcome(DEFERRED, reason, f"scontrol update failed: {exc}")
    _remember(state_dir, node, reason, applied=True)
    return DrainOutcome(DRAINED, reason)


def resume_if_ours(node: str, *, state_dir: str | os.PathLike[str] | None = None,
                   env: dict[str, str] | None = None) -> bool:
    """Resume ``node`` only if it is drained with a slurmfabric reason (or with Slurm's
    "Prolog error"/"Epilog error" that our own failing hook caused, per the state file)."""
    record = slurmcmd.node(node, env=env)
    flags = slurmcmd.node_state_flags(record.get("State", ""))
    if not flags & {"DRAIN", "DRAINED", "DRAINING"}:
        return False
    reason = current_reason(record)
    ours = is_ours(reason)
    if not ours and reason in SLURM_HOOK_REASONS:
        ours = remembered(node, state_dir) is not None
    if not ours:
        return False
    slurmcmd.update_node(node, env=env, State="RESUME")
    forget(node, state_dir)
    return True


def forget(node: str, state_dir: str | os.PathLike[str] | None = None) -> None:
    with contextlib.suppress(OSError):
        _state_path(state_dir, node).unlink()
