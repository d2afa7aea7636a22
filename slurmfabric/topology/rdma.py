"""RDMA devices and ports from /sys/class/infiniband (kernel ABI: sysfs-class-infiniband)."""

from __future__ import annotations

from slurmfabric._common import gids
from slurmfabric.topology import pci
from slurmfabric.topology._io import Reader
from slurmfabric.topology.model import Gid, RdmaDevice, RdmaPort

CLASS = "/sys/class/infiniband"


def _after_colon(text: str | None) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``; ``5: LinkUp`` -> ``LinkUp``; unreadable -> UNKNOWN."""
    if not text:
        return "UNKNOWN"
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def parse_rate(text: str | None) -> float | None:
    """``400 Gb/sec (4X NDR)`` -> 400.0. RoCE ports print IB speed names too."""
    rest = (text or "").lstrip()
    end = _digits(rest, 0)
    if end == 0:
        return None
    if rest[end : end + 1] == "." and _digits(rest, end + 1) > end + 1:
        end = _digits(rest, end + 1)
    if not rest[end:].lstrip().startswith("Gb/sec"):
        return None
    return float(rest[:end])


def _digits(text: str, start: int) -> int:
    """Index just past the ASCII digits that begin at ``start``."""
    end = start
    while end < len(text) and text[end] in "0123456789":
        end += 1
    return end


def read_gids(reader: Reader, port_dir: str) -> tuple[Gid, ...]:
    """The port's populated GID slots, walked as the plan cache's check walks them
    (_common/gids.py). A slot outside the container's network namespace, or with no
    netdev, reads as None (EINVAL) and is passed over."""
    slots = gids.walk(reader.listdir(f"{port_dir}/gids"),
                      lambda index: reader.text(f"{port_dir}/gids/{index}"))
    return tuple(
        Gid(index=index, gid=value.lower(),
            type=reader.text(f"{port_dir}/gid_attrs/types/{index}"),
            ndev=reader.text(f"{port_dir}/gid_attrs/ndevs/{index}"))
        for index, value in slots if value and value != gids.ZERO_GID)


def read_counters(reader: Reader, port_dir: str) -> dict[str, int | None]:
    # Counters can read "N/A (no PMA)" (drivers/infiniband/core/sysfs.c, show_pma_counter):
    # kept as None, never an error.
    return {
        name: reader.int(f"{port_dir}/counters/{name}")
        for name in reader.listdir(f"{port_dir}/counters")
    }


def _port_netdev(reader: Reader, dev_dir: str, port: int, gids: tuple[Gid, ...]) -> str | None:
    names = reader.listdir(f"{dev_dir}/device/net")
    if len(names) == 1:
        return names[0]
    for name in names:
        # dev_port is 0-based (Documentation/ABI/testing/sysfs-class-net)
        if reader.int(f"{dev_dir}/device/net/{name}/dev_port") == port - 1:
            return name
    return next((g.ndev for g in gids if g.ndev), None)


def _has_uverbs(reader: Reader, dev_dir: str, name: str) -> bool:
    """True when a uverbs char device exists for ``name``: without it verbs cannot open it.

    sysfs shows every device of the host, also inside a container; ``/dev/infiniband`` holds
    only the uverbs nodes the container was given (the Kubernetes RDMA device plugin mounts
    the allocated ones). So where ``/dev/infiniband`` exists, the device's ``uverbsN`` must
    be in it; a tree without ``/dev`` (a sysfs snapshot) is judged by sysfs alone."""
    entry = _uverbs_entry(reader, dev_dir, name)
    if entry is None:
        return False
    if reader.exists("/dev/infiniband"):
        return reader.exists(f"/dev/infiniband/{entry}")
    return True


def _uverbs_entry(reader: Reader, dev_dir: str, name: str) -> str | None:
    for entry in reader.listdir(f"{dev_dir}/device/infiniband_verbs"):
        if reader.text(f"{dev_dir}/device/infiniband_verbs/{entry}/ibdev") == name:
            return entry
    for entry in reader.listdir("/sys/class/infiniband_verbs"):
        if (
            entry.startswith("uverbs")
            and reader.text(f"/sys/class/infiniband_verbs/{entry}/ibdev") == name
        ):
            return entry
    return None


def read_port(
    reader: Reader, dev_dir: str, name: str, port: int, *, plan_only: bool = False
) -> RdmaPort:
    """One port. ``plan_only`` skips what the plan never reads (see ``discover_rdma``)."""
    port_dir = f"{dev_dir}/ports/{port}"
    link_layer = reader.text(f"{port_dir}/link_layer") or "Unknown"
    skip_gids = plan_only and link_layer == "InfiniBand"
    gids = () if skip_gids else read_gids(reader, port_dir)
    rate = reader.text(f"{port_dir}/rate")
    return RdmaPort(
        device=name,
        port=port,
        state=_after_colon(reader.text(f"{port_dir}/state")),
        phys_state=_after_colon(reader.text(f"{port_dir}/phys_state")),
        rate_gbps=parse_rate(rate),
        rate=rate,
        link_layer=link_layer,
        gids=gids,
        netdev=_port_netdev(reader, dev_dir, port, gids),
        counters={} if plan_only else read_counters(reader, port_dir),
    )


def discover_rdma(reader: Reader, *, plan_only: bool = False) -> tuple[RdmaDevice, ...]:
    """Every RDMA device and port. ``plan_only`` (the per-rank path of ``env``/``launch``)
    leaves out what the plan never reads: port counters, node type, firmware version and the
    GID tables of InfiniBand ports (NCCL addresses IB by LID; their GIDs carry no netdev).
    That is about a third of the files a node's discovery reads."""
    devices: list[RdmaDevice] = []
    for name in reader.listdir(CLASS):
        dev_dir = f"{CLASS}/{name}"
        ports = tuple(
            read_port(reader, dev_dir, name, int(p), plan_only=plan_only)
            for p in sorted(reader.listdir(f"{dev_dir}/ports"), key=_num)
            if p.isdigit()
        )
        devices.append(
            RdmaDevice(
                name=name,
                pci=pci.read_device(reader, f"{dev_dir}/device"),
                ports=ports,
                has_uverbs=_has_uverbs(reader, dev_dir, name),
                node_type=None if plan_only else reader.text(f"{dev_dir}/node_type"),
                fw_ver=None if plan_only else reader.text(f"{dev_dir}/fw_ver"),
            )
        )
    devices.sort(key=lambda d: _natural(d.name))
    return tuple(devices)


def _num(text: str) -> int:
    return int(text) if text.isdigit() else 0


def _natural(name: str) -> tuple[object, ...]:
    """mlx5_2 before mlx5_10: alternating text and numbers, text first and last."""
    parts: list[object] = []
    text_start = index = 0
    while index < len(name):
        if name[index].isdecimal():
            end = index
            while end < len(name) and name[end].isdecimal():
                end += 1
            parts += [name[text_start:index], int(name[index:end])]
            text_start = index = end
        else:
            index += 1
    parts.append(name[text_start:])
    return tuple(parts)
