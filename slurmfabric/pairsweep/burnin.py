"""The burn-in gate of a pair sweep: nodes go in through a maintenance reservation and come
back only if they pass.

``pairs submit --burn-in`` resumes the nodes slurmfabric drained into the reservation (Slurm
runs no job on a drained node) and remembers them; ``pairs report --drain/--resume-passing``
drains the suspects again and returns the passing ones. Every drain and resume goes through
the health module's rules (slurmfabric/health/drain.py): a reason someone else set is never
touched."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slurmfabric.errors import UsageError

if TYPE_CHECKING:
    from slurmfabric.health.drain import DrainPolicy
    from slurmfabric.pairsweep.report import Analysis


def policy(health_config: str | None, state_dir: str | None) -> DrainPolicy:
    """The site's drain policy, read before anything changes; ``state_dir`` wins."""
    import socket

    from slurmfabric.health.drain import DrainPolicy

    return DrainPolicy.load(socket.gethostname().split(".")[0], health_config, state_dir)


def release(nodes: list[str], reservation: str, policy: DrainPolicy) -> list[tuple[str, str]]:
    """Resume the nodes slurmfabric drained into the maintenance reservation: (node, the
    reason it carried) for each. Refuses, before changing anything, when the reservation is
    missing or a node carries someone else's drain reason."""
    from slurmfabric.errors import SlurmCommandError
    from slurmfabric.health import drain as drain_mod
    from slurmfabric.slurm import cmd

    try:
        cmd.show("reservation", reservation)
    except SlurmCommandError as exc:
        raise UsageError(f"--burn-in {reservation}: no such reservation ({exc})", hint=(
            f"create it first, e.g. scontrol create reservation ReservationName={reservation} "
            "Nodes=... Users=root StartTime=now Duration=120 Flags=MAINT,IGNORE_JOBS")) from exc
    foreign = drain_mod.burnin_refusals(nodes, policy)
    if foreign:
        raise UsageError(
            f"--burn-in: drained by someone else, left alone: {', '.join(foreign)}",
            hint="Slurm runs no job on a drained node: leave these out of --nodes, or resume "
            "them yourself if they are ready to test")
    released = []
    for node in nodes:
        out, reason = drain_mod.release_for_burnin(node, policy)
        if out == drain_mod.RELEASED:
            released.append((node, reason))
    return released


def gate(analysis: Analysis, policy: DrainPolicy, drain: bool,
         resume_passing: bool) -> list[str]:
    """Drain suspects (``drain``, or a node in burn-in with ``resume_passing``) and resume
    passing nodes (``resume_passing``): one line per node acted on. A node in burn-in
    (released by ``release``) is drained again if it fails, and its record ends if it
    passes (it is already running jobs)."""
    from slurmfabric.health import drain as drain_mod

    lines = []
    for node in analysis.suspect_nodes:
        if drain or (resume_passing and drain_mod.in_burnin(node, policy.state_dir)):
            detail = next((m for m in analysis.messages if f" {node} " in f" {m} "), "slow")
            out = drain_mod.drain(node, "pairs", detail, policy)
            lines.append(f"drain {node}: {out.outcome} {out.detail}".rstrip())
    if resume_passing:
        for node in analysis.passing_nodes:
            if drain_mod.resume_if_ours(node, policy):
                lines.append(f"resume {node}: resumed")
            elif drain_mod.finish_burnin(node, policy.state_dir):
                lines.append(f"resume {node}: passed burn-in, back in service "
                             "(delete the reservation to open it to users)")
            else:
                lines.append(f"resume {node}: left as is")
    return lines
