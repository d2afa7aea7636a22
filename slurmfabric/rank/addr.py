"""The lookups behind two MASTER_ADDR address policies (rank/env.master_address):
``nodeaddr`` (Slurm's node record) and ``iface:NAME`` (a local interface's IPv4 address).
Imported only by a job that chose one of them, so no other rank pays for it."""

from __future__ import annotations

from slurmfabric.errors import RankEnvError


def slurm_node_addr(host: str) -> str:
    from slurmfabric.slurm import cmd

    return cmd.node(host).get("NodeAddr", "")


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
