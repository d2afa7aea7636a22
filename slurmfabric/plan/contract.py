"""The fabric contract: what ``fabric.type`` means for NCCL, decided in one place.

Render (on the login node) and ``env``/``launch`` (on every node) both ask this module, so
the script's exports and the per-node plan can never say two things:

* ``tcp``: sockets only. ``NCCL_IB_DISABLE=1`` and no IB/RoCE/EFA variable from the plan.
* ``ib`` / ``roce``: NCCL's IB verbs transport or fail (``NCCL_NET=IB``, no silent fallback
  to sockets); a node without a usable rail of that link layer is an error naming the node.
* ``efa``: ``FI_PROVIDER=efa`` (libfabric must not fall back to its TCP provider) and no
  ``NCCL_IB_*`` (an EFA device is not an IB verbs rail for NCCL). NCCL_NET is not forced:
  the plugin's network name changed between releases ("AWS Libfabric", "Libfabric" with
  NCCL 2.27: tests/fixtures/nccl/versions/), and a wrong name fails every job; a missing
  plugin is reported by the plan and a socket fallback by ``slurmfabric nccl-log``.
* ``auto``: each node's plan decides and says why.

Sources: NCCL environment variables (docs.nvidia.com/deeplearning/nccl/user-guide/docs/
env.html: NCCL_NET, NCCL_IB_DISABLE, NCCL_IB_HCA); aws-ofi-nccl's net name as sites force it
(https://github.com/eth-cscs/cscs-docs/pull/75, NCCL_NET="AWS Libfabric"; newer plugins
register "Libfabric"); libfabric's
FI_PROVIDER (fi_provider(7)). Standard library only: it runs on every rank.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

FABRIC_TYPES = ("auto", "ib", "roce", "efa", "tcp")
ENV_VAR = "SLURMFABRIC_FABRIC_TYPE"  # what the rendered script exports for env/launch
# Per-node variables that only make sense on an IB/RoCE rail (dropped for tcp and efa).
IB_ONLY = ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY", "NCCL_NET_GDR_LEVEL")
_IB_NETS = ("ib", "ibext")  # NCCL's own IB transport and the SHARP plugin's IB transport
_PLAN_FABRIC = {"ib": "InfiniBand", "roce": "RoCE", "efa": "AWS EFA"}

# What each type sets on every node, known before the job starts (the script exports it).
_JOB_ENV = {
    "ib": {"NCCL_NET": "IB"},
    "roce": {"NCCL_NET": "IB"},
    "efa": {"FI_PROVIDER": "efa"},
    "tcp": {"NCCL_IB_DISABLE": "1"},
}


def check_type(fabric_type: str) -> str:
    if fabric_type not in FABRIC_TYPES:
        from slurmfabric.errors import UsageError

        raise UsageError(
            f"fabric type {fabric_type!r} is not accepted",
            f"choose one of {', '.join(FABRIC_TYPES)} (config fabric.type, env {ENV_VAR})",
        )
    return fabric_type


def job_env(fabric_type: str, explicit: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a rendered script exports: the type's meaning, explicit ones on top."""
    return {**_JOB_ENV.get(check_type(fabric_type), {}), **(explicit or {})}


def conflicts(fabric_type: str, env: Mapping[str, str], where: str = "") -> list[str]:
    """One line per variable in ``env`` that contradicts ``fabric_type`` (or itself).

    ``where`` prefixes each variable name (``fabric.nccl.`` at render time).
    """
    out: list[str] = []
    net = env.get("NCCL_NET")
    net_l = net.lower() if net is not None else None
    disabled = env.get("NCCL_IB_DISABLE")

    def say(name: str, why: str, accepted: str) -> None:
        out.append(f"{where}{name}: {env[name]!r} {why}; accepted: {accepted}")

    if fabric_type == "tcp":
        if disabled is not None and disabled != "1":
            say("NCCL_IB_DISABLE", "turns IB on, but fabric.type is tcp", "1 or unset")
        if net_l is not None and net_l != "socket":
            say("NCCL_NET", "is not sockets, but fabric.type is tcp", "Socket or unset")
        for name in ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX"):
            if name in env:
                say(name, "selects IB/RoCE devices, but fabric.type is tcp (IB is disabled)",
                    "unset, or fabric.type ib/roce/auto")
        if env.get("FI_PROVIDER", "").lower() == "efa":
            say("FI_PROVIDER", "selects EFA, but fabric.type is tcp", "unset, or fabric.type efa")
    elif fabric_type in ("ib", "roce"):
        if disabled == "1":
            say("NCCL_IB_DISABLE", f"turns IB off, but fabric.type is {fabric_type}",
                "0 or unset, or fabric.type tcp")
        if net_l is not None and net_l not in _IB_NETS:
            say("NCCL_NET", f"is not an IB transport, but fabric.type is {fabric_type}",
                "IB, IBext or unset")
    elif fabric_type == "efa":
        for name in ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX"):
            if name in env:
                say(name, "selects IB verbs devices, but fabric.type is efa (aws-ofi-nccl "
                    "picks the EFA devices)", "unset, or fabric.type ib/roce/auto")
        if net_l is not None and net_l in (*_IB_NETS, "socket"):
            say("NCCL_NET", "bypasses the aws-ofi-nccl plugin, but fabric.type is efa",
                "the plugin's name ('AWS Libfabric' or 'Libfabric') or unset")
        provider = env.get("FI_PROVIDER")
        if provider is not None and provider.lower() != "efa":
            say("FI_PROVIDER", "is not efa, but fabric.type is efa", "efa or unset")
    if fabric_type == "auto" and disabled == "1" and net_l in _IB_NETS:
        say("NCCL_NET", "asks for IB while NCCL_IB_DISABLE=1 turns it off", "one of the two")
    return out


def node_wants(fabric_type: str, plan: object, want: dict[str, tuple[str, str]],
               node: str) -> None:
    """Bring one node's plan in line with ``fabric_type``; edits ``want`` and the plan.

    ``want`` maps variable -> (value, reason) before the user's own values are applied.
    A node that cannot honour ``ib``/``roce``/``efa`` gets an entry in ``plan.errors``.
    """
    found = getattr(plan, "fabric", "tcp")
    summary = getattr(plan, "summary", "") or found
    errors: list[str] = plan.errors  # type: ignore[attr-defined]
    notes: list[str] = plan.notes  # type: ignore[attr-defined]
    if fabric_type == "tcp":
        dropped = [name for name in (*IB_ONLY, "NCCL_NET") if want.pop(name, None)]
        if dropped:
            notes.append(f"fabric.type=tcp: this node has {summary}, but the job uses sockets; "
                         f"not set: {', '.join(dropped)}")
        want["NCCL_IB_DISABLE"] = ("1", "fabric.type=tcp: NCCL uses TCP sockets only")
        plan.fabric = "tcp"  # type: ignore[attr-defined]
        return
    if fabric_type in ("ib", "roce", "efa") and found != fabric_type:
        errors.append(
            f"fabric.type={fabric_type} but node {node} has no usable {_PLAN_FABRIC[fabric_type]}"
            f" rail: found {summary}"
        )
        for name in (*IB_ONLY, "NCCL_NET"):
            want.pop(name, None)
        return
    if found in ("ib", "roce"):
        want["NCCL_NET"] = (
            "IB",
            f"fabric.type={fabric_type}: NCCL's IB transport or fail, never a silent fallback "
            "to TCP sockets (set NCCL_NET yourself for a plugin such as IBext)",
        )
    elif found == "efa":
        for name in IB_ONLY:
            want.pop(name, None)
        want["FI_PROVIDER"] = ("efa", "libfabric's EFA provider only (no fallback to tcp;udp); "
                               "NCCL_NET left to the plugin, whose name varies by release")
    if fabric_type == "auto":
        notes.append(f"fabric.type=auto: node {node} uses {found} ({summary})")
