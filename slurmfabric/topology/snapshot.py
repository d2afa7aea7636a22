"""Save a node's topology for a bug report or for planning offline on a login node.

Two forms: JSON of the parsed ``Topology`` (small, readable), or a tarball of exactly the
files, listings and symlinks discovery read (replayed by running discovery on it, so a
newer slurmfabric can re-parse an old capture).

``to_dict``/``from_dict`` also serve the TaskProlog's per-boot cache (site/taskprolog.py),
which runs before every task: the tarball and JSON modules are imported only by the
functions that use them.
"""

from __future__ import annotations

import os

from slurmfabric._common.record import as_plain, replace
from slurmfabric.errors import SnapshotError, TopologyError
from slurmfabric.topology._io import Reader, as_root
from slurmfabric.topology.model import (
    GdrSupport,
    Gid,
    Gpu,
    NetDev,
    NumaNode,
    PciDevice,
    RdmaDevice,
    RdmaPort,
    Route,
    Topology,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import tarfile  # imported at run time only by the functions that read or write tarballs
    from typing import Any

FORMAT = 1


def to_dict(topo: Topology) -> dict[str, Any]:
    data: dict[str, Any] = as_plain(topo)  # type: ignore[assignment]
    data["cpu_siblings"] = {str(k): list(v) for k, v in topo.cpu_siblings.items()}
    return data


def _pci(d: dict[str, Any] | None) -> PciDevice | None:
    if d is None:
        return None
    return PciDevice(**{**d, "path": tuple(d["path"]), "local_cpus": tuple(d["local_cpus"])})


def from_dict(data: dict[str, Any]) -> Topology:
    try:
        rdma = tuple(
            RdmaDevice(
                name=d["name"],
                pci=_pci(d["pci"]),
                ports=tuple(
                    RdmaPort(**{**p, "gids": tuple(Gid(**g) for g in p["gids"])})
                    for p in d["ports"]
                ),
                has_uverbs=d["has_uverbs"],
                node_type=d.get("node_type"),
                fw_ver=d.get("fw_ver"),
            )
            for d in data["rdma"]
        )
        netdevs = tuple(
            NetDev(**{**n, **{k: tuple(n[k]) for k in ("bond_slaves", "ipv4", "ipv6")}})
            for n in data["netdevs"]
        )
        gpus = tuple(Gpu(**{**g, "pci": _pci(g["pci"])}) for g in data["gpus"])
        return Topology(
            root=data["root"],
            rdma=rdma,
            netdevs=netdevs,
            gpus=gpus,
            numa=tuple(NumaNode(n["id"], tuple(n["cpus"])) for n in data["numa"]),
            allowed_cpus=tuple(data["allowed_cpus"]),
            cpu_siblings={int(k): tuple(v) for k, v in data["cpu_siblings"].items()},
            gdr=GdrSupport(**data["gdr"]),
            routes=tuple(Route(**r) for r in data["routes"]),
            markers=dict(data["markers"]),
            gpu_source=data.get("gpu_source", "sysfs"),
            notes=tuple(data.get("notes", ())),
        )
    except (KeyError, TypeError) as error:
        raise TopologyError(
            f"topology snapshot is not in slurmfabric's format ({error})",
            hint="create it with 'slurmfabric topo snapshot -o FILE.json'",
        ) from error


def write_json(topo: Topology, path: str | os.PathLike[str]) -> None:
    import json
    from pathlib import Path

    Path(path).write_text(
        json.dumps({"slurmfabric_topology": FORMAT, "topology": to_dict(topo)}, indent=1)
    )


def write_tarball(root: object, path: str | os.PathLike[str]) -> Topology:
    """Discover with a recording reader and tar up what it read (links kept as links)."""
    import io
    import tarfile

    from slurmfabric.topology import discover_with_reader

    reader = Reader(as_root(root), record=True)  # type: ignore[arg-type]
    topo = discover_with_reader(reader, nvml=False)
    files: dict[str, str | None] = {}
    for absolute, text in reader.files.items():
        files[reader.realpath(absolute)] = text
    for absolute in reader.present:
        files.setdefault(reader.realpath(absolute), "")
    dirs = {reader.realpath(d) for d in reader.dirs}
    links = dict(reader.links)
    for directory, entries in reader.dirs.items():
        real_dir = reader.realpath(directory)
        for entry in entries:
            child = f"{directory.rstrip('/')}/{entry}"
            host = reader.host(child)
            if os.path.islink(host):
                links.setdefault(f"{real_dir.rstrip('/')}/{entry}", os.readlink(host))
            elif os.path.isdir(host):
                dirs.add(f"{real_dir.rstrip('/')}/{entry}")
            else:
                files.setdefault(f"{real_dir.rstrip('/')}/{entry}", "")
    with tarfile.open(path, "w:gz") as tar:
        for directory in sorted(dirs | {p for p, t in files.items() if t is None}):
            info = tarfile.TarInfo(directory.lstrip("/") or ".")
            info.type, info.mode = tarfile.DIRTYPE, 0o755  # unreadable file -> EISDIR on replay
            tar.addfile(info)
        for file, text in sorted(files.items()):
            if text is None:
                continue
            data = (text + "\n").encode()
            info = tarfile.TarInfo(file.lstrip("/"))
            info.size, info.mode = len(data), 0o444
            tar.addfile(info, io.BytesIO(data))
        for link, target in sorted(links.items()):
            info = tarfile.TarInfo(link.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return topo


# A tarball from 'topo snapshot' holds a few thousand small sysfs files (~1 MB unpacked);
# these bounds only stop a crafted one (a gzip bomb, a million members) from filling /tmp.
TAR_MAX_MEMBERS = 200_000
TAR_MAX_BYTES = 256 << 20


def _tar_refusal(member: tarfile.TarInfo) -> str | None:
    """Why a member has no place in a snapshot: only relative files, directories and links
    inside the tree (what write_tarball writes); devices, FIFOs and escaping names are
    refused before anything is extracted."""
    name = member.name
    if name.startswith("/"):
        return "has an absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return "has a '..' component (a path out of the tree)"
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        kind = ("a device node" if member.ischr() or member.isblk() else
                "a FIFO" if member.isfifo() else f"of tar type {member.type!r}")
        return f"is {kind}, not a file, directory or link"
    if member.issym() or member.islnk():
        target = member.linkname
        here = os.path.dirname(name) if member.issym() else ""
        resolved = os.path.normpath(os.path.join(here, target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            return f"links out of the tree (to {target!r})"
    return None


def tar_mode(raw: bytes) -> str | None:
    """The tarfile mode for these bytes by their magic number, or None: not a tarball.

    Not ``tarfile.is_tarfile``/``"r:*"``: those try every decompressor first, and the xz
    decoder reads zero bytes as stream padding (xz file format 1.0.4, section 2.2), so 100 MB
    of zeros took 17 s to refuse. Magic numbers: gzip RFC 1952 (1f 8b), xz (fd 37 7a 58 5a
    00), bzip2 ("BZh"), POSIX/GNU tar ("ustar" at offset 257, tar(5))."""
    if raw[:2] == b"\x1f\x8b":
        return "r:gz"
    if raw[:6] == b"\xfd7zXZ\x00":
        return "r:xz"
    if raw[:3] == b"BZh":
        return "r:bz2"
    if raw[257:262] == b"ustar":
        return "r:"
    return None


def _extract(raw: bytes, path: object, dest: str, mode: str = "r:gz") -> None:
    """Unpack a snapshot tarball into ``dest``, or a one-line UsageError naming the file.

    Python's extraction filter ``data`` (tarfile docs, "Extraction filters", 3.11.4+) is the
    second line: it refuses absolute and escaping links and special files, but by raising
    FilterError, and a truncated gzip stream raises EOFError/zlib.error; all end here."""
    import io
    import tarfile
    import zlib

    from slurmfabric._common.textcheck import one_line
    from slurmfabric.errors import UsageError

    what = f"topology snapshot {path}"
    hint = "create it with 'slurmfabric topo snapshot -o FILE'"
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode=mode) as tar:
            members, total = [], 0
            for member in tar:
                label = one_line(repr(member.name), 120)
                why = _tar_refusal(member)
                if why:
                    raise UsageError(f"{what}: member {label} {why}", hint)
                total += member.size if member.isreg() else 0
                members.append(member)
                if len(members) > TAR_MAX_MEMBERS or total > TAR_MAX_BYTES:
                    raise UsageError(f"{what}: more than {TAR_MAX_MEMBERS} members or "
                                     f"{TAR_MAX_BYTES} bytes unpacked; not a snapshot", hint)
            if not hasattr(tarfile, "data_filter"):  # pragma: no cover - Python < 3.11.4
                raise UsageError(f"{what}: this Python cannot unpack a tarball safely",
                                 "use Python >= 3.11.4, or a JSON snapshot (topo snapshot --json)")
            tar.extractall(dest, members=members, filter="data")
    except tarfile.FilterError as exc:
        label = one_line(repr(exc.tarinfo.name), 120)
        raise UsageError(f"{what}: member {label} refused: {one_line(str(exc), 200)}",
                         hint) from None
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        detail = one_line((str(exc) or type(exc).__name__).splitlines()[0], 200)
        raise UsageError(f"{what}: not a readable tarball (truncated or corrupt: {detail})",
                         hint) from None


def load(path: str | os.PathLike[str]) -> Topology:
    """Read a snapshot written by ``write_json`` or ``write_tarball``."""
    import json
    import tempfile
    from pathlib import Path

    from slurmfabric._common.inputfile import read_bytes, shape_error

    path = Path(path)
    if not path.exists():
        raise SnapshotError(f"no such topology snapshot: {path}")
    raw = read_bytes(str(path), "topology snapshot", 256 << 20)  # regular file, capped
    mode = tar_mode(raw)
    if mode is not None:
        from slurmfabric.topology import discover

        with tempfile.TemporaryDirectory(prefix="slurmfabric-topo-") as tmp:
            _extract(raw, path, tmp, mode)
            if not os.path.isdir(os.path.join(tmp, "sys")):
                raise SnapshotError(f"{path}: the tarball holds no sys/ tree",
                                    hint="create it with 'slurmfabric topo snapshot -o FILE'")
            topo = discover(tmp, nvml=False)
            return replace(topo, root=f"{path} (tarball)")  # type: ignore[return-value]
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise SnapshotError(f"{path}: nested too deeply to be a topology snapshot") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise SnapshotError(
            f"{path} is neither a tarball nor JSON ({error})",
            hint="create it with 'slurmfabric topo snapshot -o FILE'",
        ) from error
    if isinstance(data, dict) and isinstance(data.get("plan"), dict) and "topology" in data:
        body = data["topology"]  # the output of 'slurmfabric topo --json'
    elif not isinstance(data, dict) or data.get("slurmfabric_topology") != FORMAT:
        raise SnapshotError(f"{path} is not a slurmfabric topology snapshot (format {FORMAT})")
    else:
        body = data.get("topology")
    try:
        return from_dict(body)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise shape_error(str(path), "topology snapshot", exc,
                          "a snapshot written by 'slurmfabric topo snapshot'") from None
