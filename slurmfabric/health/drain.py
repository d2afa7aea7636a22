"""Drain and resume rules: slurmfabric only ever touches reasons it set itself.

Reasons look like ``slurmfabric: <check>: <detail>``. A node that already carries a reason
set by someone else (an admin's "bad DIMM, ticket 123") keeps it and is never resumed by
us. If slurmctld cannot be reached, we retry briefly and keep the wanted reason in a local
state file; the hook still exits non-zero so Slurm drains the node anyway ("Prolog error"),
and ``resume_if_ours`` recognises that Slurm reason as ours through the state file.

A circuit breaker refuses to drain when a configured share of the cluster already carries
the same slurmfabric check: a bad config or driver rollout must not drain every node. It
costs one ``scontrol show -o node`` (one RPC to slurmctld, about 1 KB of text per node),
made only when a check fails, and the same call gives this node's current reason. Prologs
on many nodes decide at the same moment, and each sees the others' drains only once they
land; so after draining, a hook waits ``settle_s``, reads the drains again, and keeps its
own only if its node is among the first ``limit`` drained for that check in one order every
hook computes alike (Slurm's reason time stamp, then the node name). The others undo theirs
(RESUME) and keep the reason in the state file: the limit holds however the hooks race.

Every caller passes one ``DrainPolicy``, built once from the site config (``[runner]``):
no function here loads the site config behind its caller.

Two backends talk to slurmctld, chosen by the site config (``[runner] drain_backend``):
``scontrol`` (default, through slurm/cmd.py) and ``pyslurm``. pyslurm is GPL and optional: the
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

from slurmfabric._common import files
from slurmfabric.errors import ConfigError, HealthError, SlurmCommandError
from slurmfabric.health import lemon, siteconfig
from slurmfabric.slurm import cmd

PREFIX = "slurmfabric:"
SLURM_HOOK_REASONS = ("Prolog error", "Epilog error")
MAX_REASON = 200
DEFAULT_STATE_DIR = "/var/lib/slurmfabric/health"
_STAMP = re.compile(r"\s*\[[^\]]*@[^\]]*\]\s*$")  # Slurm appends " [user@2024-01-01T00:00:00]"

# outcomes of drain()
DRAINED = "drained"  # we set the reason now
REPORTED = "reported"  # the site config says drain = false: nothing was changed
ALREADY = "already"  # the node already carried this exact reason of ours
KEPT_FOREIGN = "kept_foreign"  # someone else's reason: left alone
BREAKER = "breaker"  # too many nodes fail the same check: not drained
DEFERRED = "deferred"  # slurmctld unreachable: reason kept in the local state file


@dataclass(frozen=True)
class DrainPolicy:
    """How this site drains and resumes: built once from the site config's ``[runner]``
    (``from_site``) and passed to the hooks, ``health resume``, ``ib audit --drain``
    and ``pairs report/submit``; the defaults are the site config's own."""

    enabled: bool = True
    backend: str = "scontrol"
    breaker_fraction: float = 0.1
    breaker_min_nodes: int = 3
    retries: int = 3
    retry_s: float = 1.0
    state_dir: str = DEFAULT_STATE_DIR
    slurm_bin_dir: str = ""
    slurm_conf: str = ""
    settle_s: float = 1.0
    lemon_drains: int = 3  # 0: no lemon rule
    lemon_window_h: float = 24.0

    @classmethod
    def from_site(cls, cfg, state_dir: str | None = None) -> DrainPolicy:
        """From a loaded SiteConfig; an explicit ``state_dir`` (a command's option) wins."""
        runner = cfg.runner
        return cls(
            enabled=bool(runner["drain"]), backend=str(runner["drain_backend"]),
            breaker_fraction=float(runner["breaker_fraction"]),
            breaker_min_nodes=int(runner["breaker_min_nodes"]),
            retries=int(runner["drain_retries"]), retry_s=float(runner["drain_retry_s"]),
            state_dir=str(state_dir or runner["state_dir"]),
            slurm_bin_dir=str(runner.get("slurm_bin_dir") or ""),
            slurm_conf=str(runner.get("slurm_conf") or ""),
            lemon_drains=int(runner.get("lemon_drains", 3)),
            lemon_window_h=float(runner.get("lemon_window_h", 24.0)),
        )

    @classmethod
    def load(cls, node: str, config: str | None = None,
             state_dir: str | None = None) -> DrainPolicy:
        """Read the site config now (a command, before it changes anything): a broken one is
        a ConfigError (exit 2) before the first node is touched."""
        from slurmfabric.health import siteconfig

        return cls.from_site(siteconfig.load(node, config), state_dir)

    def env(self, env: dict[str, str] | None = None) -> dict[str, str] | None:
        """The environment for scontrol: ``slurm_bin_dir`` first on PATH (hooks have none),
        and ``slurm_conf`` as SLURM_CONF (slurmd gives HealthCheckProgram no SLURM_CONF, so
        a slurm.conf outside the built-in path is not found there otherwise)."""
        if not self.slurm_bin_dir and not self.slurm_conf:
            return env
        base = dict(os.environ if env is None else env)
        if self.slurm_bin_dir:
            base["PATH"] = self.slurm_bin_dir + os.pathsep + base.get("PATH", os.defpath)
        if self.slurm_conf:
            base["SLURM_CONF"] = self.slurm_conf
        return base


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
    return _STAMP.sub("", cmd.node_reason(record))


def reason_check(reason: str) -> str:
    """The check a slurmfabric reason names (``slurmfabric: gpu.xid: ...`` -> ``gpu.xid``)."""
    if not is_ours(reason):
        return ""
    return reason[len(PREFIX):].strip().split(":", 1)[0].strip()


def is_ours(reason: str) -> bool:
    return reason.startswith(PREFIX)


def _state_path(state_dir: str | os.PathLike[str] | None, node: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in node)
    return Path(state_dir or DEFAULT_STATE_DIR) / f"drain-{safe}.json"


def _remember(state_dir, node: str, reason: str, applied: bool, **extra: object) -> None:
    files.write_json(_state_path(state_dir, node), {"node": node, "reason": reason,
                                                    "applied": applied, "time": time.time(),
                                                    **extra})


def remembered(node: str, state_dir: str | os.PathLike[str] | None = None) -> dict | None:
    """What we last wanted for ``node`` (a dict with reason/applied), or None."""
    return files.read_json_or_none(_state_path(state_dir, node))


BACKENDS = siteconfig.RUNNER_KEYS["drain_backend"].choices  # one list: the config checks it
_DRAIN_FLAGS = {"DRAIN", "DRAINED", "DRAINING"}


class ScontrolBackend:
    """``scontrol show -o node`` / ``scontrol update`` through slurm/cmd.py (the default)."""

    name = "scontrol"

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env

    def nodes(self) -> list[dict[str, str]]:
        return cmd.show("node", env=self.env)

    def node(self, name: str) -> dict[str, str]:
        return cmd.node(name, env=self.env)

    def update(self, name: str, state: str, reason: str | None = None) -> None:
        fields = {"State": state} if reason is None else {"State": state, "Reason": reason}
        cmd.update_node(name, env=self.env, **fields)


class PyslurmBackend:
    """The site's pyslurm, through slurm/pyslurm.py (the one module that calls it, with
    the one version check). Records use scontrol's keys so the rules above stay the same."""

    name = "pyslurm"

    def __init__(self) -> None:
        from slurmfabric.slurm import pyslurm as slurm_pyslurm  # only when configured

        try:
            self.nodes_api = slurm_pyslurm.Nodes()
        except slurm_pyslurm.PyslurmError as exc:
            raise HealthError(
                f"drain_backend = \"pyslurm\" but pyslurm cannot be used: {exc}",
                hint="build pyslurm from the tag of this Slurm's release line "
                "(docs/launch.md), or set [runner] drain_backend = \"scontrol\" in "
                "health.toml",
            ) from exc

    def nodes(self) -> list[dict[str, str]]:
        return self.nodes_api.all()

    def node(self, name: str) -> dict[str, str]:
        return self.nodes_api.one(name)

    def update(self, name: str, state: str, reason: str | None = None) -> None:
        self.nodes_api.update(name, state, reason)


def backend_for(name: str, env: dict[str, str] | None = None):
    """The backend ``name`` (a DrainPolicy's). Raises HealthError (with a hint) when pyslurm
    is configured but cannot be imported."""
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


def _stamp(record: dict[str, str]) -> str:
    """The time in Slurm's ``[user@2026-12-01T10:00:00]`` reason stamp ('' without one)."""
    match = _STAMP.search(record.get("Reason", ""))
    return match.group(0).split("@", 1)[1].rstrip("] ") if match else ""


def drain(node: str, check: str, detail: str, policy: DrainPolicy,
          env: dict[str, str] | None = None) -> DrainOutcome:
    """Drain ``node`` with ``slurmfabric: <check>: <detail>`` unless a foreign reason is
    already set or the breaker trips. Never raises for an unreachable slurmctld or a
    missing pyslurm: the reason is kept in the state file (DEFERRED) and the hook still
    exits non-zero."""
    reason = make_reason(check, detail)
    if not policy.enabled:
        return DrainOutcome(REPORTED, reason, "drain = false in the site config: not drained")
    state_dir, retries, retry_s = policy.state_dir, policy.retries, policy.retry_s
    try:
        be = backend_for(policy.backend, policy.env(env))
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
    flags = cmd.node_state_flags(mine.get("State", ""))
    if existing and flags & _DRAIN_FLAGS and reason_check(existing) == check and (
            existing == reason or lemon.is_lemon(existing)):
        return DrainOutcome(ALREADY, existing)
    new_drain = not flags & _DRAIN_FLAGS
    if new_drain and policy.lemon_drains:
        count = len(lemon.recent(state_dir, node, policy.lemon_window_h)) + 1
        if count >= policy.lemon_drains:
            reason = make_reason(check, lemon.detail(count, policy.lemon_window_h, detail))
    if not existing:
        tripped, same, total = breaker_tripped(records, node, check, policy.breaker_fraction,
                                               policy.breaker_min_nodes)
        if tripped:
            return DrainOutcome(BREAKER, reason, f"{same} of {total} nodes already drained "
                                f"for {check}; not draining {node} (circuit breaker)")
    try:
        _with_retries(lambda: be.update(node, "DRAIN", reason), retries, retry_s)
    except SlurmCommandError as exc:
        _remember(state_dir, node, reason, applied=False)
        return DrainOutcome(DEFERRED, reason, f"{be.name} update failed: {exc}")
    if not existing:
        undone = _settle(be, node, check, policy)
        if undone is not None:
            _remember(state_dir, node, reason, applied=False, breaker=True)
            return DrainOutcome(BREAKER, reason, undone)
    if new_drain and policy.lemon_drains:  # only a drain that stayed counts
        lemon.record(state_dir, node, time.time(), policy.lemon_window_h)
    _remember(state_dir, node, reason, applied=True)
    return DrainOutcome(DRAINED, reason)


def _settle(be, node: str, check: str, policy: DrainPolicy) -> str | None:
    """After our drain landed: keep it only if this node is among the first ``limit`` drained
    for ``check`` (by reason time stamp, then name); else undo it and say why."""
    time.sleep(policy.settle_s)
    try:
        records = _with_retries(be.nodes, policy.retries, policy.retry_s)
    except SlurmCommandError:
        return None  # cannot see the others: keep the drain (the node did fail a check)
    tag = f"{PREFIX} {check}:"
    drained = sorted((_stamp(r), r.get("NodeName", "")) for r in records
                     if current_reason(r).startswith(tag))
    limit = max(int(policy.breaker_min_nodes),
                math.ceil(float(policy.breaker_fraction) * len(records)))
    keep = {name for _, name in drained[:limit]}
    if node in keep or len(drained) <= limit:
        return None
    try:
        _with_retries(lambda: be.update(node, "RESUME"), policy.retries, policy.retry_s)
    except SlurmCommandError:
        return None  # the drain stays: better than a half state
    return (f"{len(drained)} nodes drained for {check} at once, more than the limit of "
            f"{limit}: {node} undone (circuit breaker; reason kept in the state file)")


def _ours(record: dict[str, str], node: str, state_dir) -> bool:
    """Drained with our reason, or with Slurm's hook reason our failing hook caused."""
    reason = current_reason(record)
    if is_ours(reason):
        return True
    return reason in SLURM_HOOK_REASONS and remembered(node, state_dir) is not None


def resume_if_ours(node: str, policy: DrainPolicy, env: dict[str, str] | None = None,
                   clear_lemon: bool = False) -> bool:
    """Resume ``node`` only if it is drained with a slurmfabric reason (or with Slurm's
    "Prolog error"/"Epilog error" that our own failing hook caused, per the state file).
    A lemon stays drained unless ``clear_lemon`` (an admin's word), which also resets its
    drain count. Raises HealthError when the configured pyslurm backend is missing."""
    state_dir = policy.state_dir
    be = backend_for(policy.backend, policy.env(env))
    record = be.node(node)
    flags = cmd.node_state_flags(record.get("State", ""))
    if not flags & _DRAIN_FLAGS or not _ours(record, node, state_dir):
        return False
    if lemon.is_lemon(current_reason(record)) and not clear_lemon:
        return False
    be.update(node, "RESUME")
    forget(node, state_dir)
    if clear_lemon:
        lemon.clear(state_dir, node)
    return True


# outcomes of release_for_burnin()
RELEASED = "released"  # was drained by us: resumed for the test, remembered in the state file
NOT_DRAINED = "not_drained"  # nothing to do: the node can run the test as it is


def burnin_refusals(nodes: list[str], policy: DrainPolicy,
                    env: dict[str, str] | None = None) -> list[str]:
    """The nodes a burn-in may not take: drained by someone else (``node (reason)``)."""
    be = backend_for(policy.backend, policy.env(env))
    refused = []
    for node in nodes:
        record = be.node(node)
        if cmd.node_state_flags(record.get("State", "")) & _DRAIN_FLAGS and not (
                _ours(record, node, policy.state_dir) or in_burnin(node, policy.state_dir)):
            refused.append(f"{node} ({current_reason(record) or 'no reason'})")
    return refused


def release_for_burnin(node: str, policy: DrainPolicy,
                       env: dict[str, str] | None = None) -> tuple[str, str]:
    """Resume a node slurmfabric drained so a burn-in job (in a MAINT reservation that keeps
    users off) can run on it; the state file keeps ``burnin`` and the old reason so the gate
    can tell afterwards. Returns (outcome, reason); outcome is KEPT_FOREIGN, untouched, when
    someone else drained the node."""
    state_dir = policy.state_dir
    be = backend_for(policy.backend, policy.env(env))
    record = be.node(node)
    reason = current_reason(record)
    if not cmd.node_state_flags(record.get("State", "")) & _DRAIN_FLAGS:
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
