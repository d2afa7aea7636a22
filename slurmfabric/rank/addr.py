"""MASTER_ADDR address policies: which address of the first node the ranks connect to.

``plain`` keeps the node name; ``suffix:-ib`` appends a suffix (clusters whose fabric
hostnames differ from Slurm's node names); ``nodeaddr`` takes NodeAddr from Slurm's node
record; ``iface:NAME`` reads the IPv4 address of a local interface on the master node.
Whatever the policy, ``is_loopback`` lets the resolver refuse 127.x / ::1 (a rank on
another node would connect to itself). Split out of ``rankenv``, which re-exports these.
"""

from __future__ import annotations

from slurmfabric.errors import RankEnvError

TYPE_CHECKING = False  # no typing at run time: this is on the per-rank path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

LOOPBACK_HINT = (
    "use --addr-policy suffix:-ib, nodeaddr or iface:NAME to pick a routable address, "
    "or set SLURMFABRIC_ALLOW_LOOPBACK=1 on a single-host test cluster"
)


def is_loopback(addr: str) -> bool:
    lowered = addr.lower()
    return (
        lowered in ("localhost", "::1", "0:0:0:0:0:0:0:1")
        or lowered.startswith("localhost.")
        or lowered.startswith("127.")
        or lowered.startswith("::ffff:127.")
    )


def master_address(
    host: str,
    policy: str,
    env: Mapping[str, str],
    node_addr: Callable[[str], str] | None = None,
    iface_addr: Callable[[str], str] | None = None,
) -> str:
    """Apply an address policy to the first node's name.

    ``plain``: the node name. ``suffix:-ib``: name + suffix (fabric hostnames).
    ``nodeaddr``: NodeAddr from Slurm's node record (one scontrol call).
    ``iface:NAME``: the IPv4 address of interface NAME — readable only on the master node
    itself, so other nodes must inherit it (eval it once in the batch script).
    """
    kind, _, arg = policy.partition(":")
    if kind == "plain" and not arg:
        return host
    if kind == "suffix" and arg:
        return host + arg
    if kind == "nodeaddr" and not arg:
        lookup = node_addr or _slurm_node_addr
        addr = lookup(host)
        if not addr:
            raise RankEnvError(f"Slurm's node record of {host} has no NodeAddr")
        return addr
    if kind == "iface" and arg:
        here = env.get("SLURMD_NODENAME")
        if here and here != host:
            raise RankEnvError(
                f"--addr-policy {policy} can only be read on the master node {host}, "
                f"and this is {here}",
                f'run eval "$(slurmfabric env --addr-policy {policy})" in the batch script '
                "(it runs on the first node); steps then reuse that address",
            )
        return (iface_addr or interface_ipv4)(arg)
    raise RankEnvError(
        f"unknown address policy {policy!r}", "use plain, suffix:SUFFIX, nodeaddr or iface:NAME"
    )


def _slurm_node_addr(host: str) -> str:
    from slurmfabric.slurm import cmd as slurmcmd

    return slurmcmd.node(host).get("NodeAddr", "")


def interface_ipv4(name: str) -> str:
    """IPv4 address of a local interface via SIOCGIFADDR (no psutil, no subprocess)."""
    import fcntl
    import socket
    import struct

    siocgifaddr = 0x8915  # linux/sockios.h
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(
                sock.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15])
            )
        except OSError as error:
            raise RankEnvError(
                f"interface {name!r} has no IPv4 address here ({error.strerror})",
                "list interfaces with: ip -brief addr",
            ) from None
    return socket.inet_ntoa(packed[20:24])
