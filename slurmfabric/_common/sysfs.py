"""Shared readers for sysfs/procfs-style files, rooted anywhere so tests use fake trees.

Every reader takes a path already joined with the root (see ``Root``) and never raises
for the usual kernel quirks: a missing file, EINVAL on a GID without a netdev, ENODEV,
or unreadable attributes all read as ``None``.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # pathlib only when a caller asks for a Path
if TYPE_CHECKING:
    from pathlib import Path

ROOT_ENV = "SLURMFABRIC_SYSFS_ROOT"


class Root:
    """A filesystem root (``/`` on a real node, a fixture directory in tests)."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        if root is None:
            root = os.environ.get(ROOT_ENV) or "/"
        # A plain string: pathlib costs ~3 ms to import and the per-rank topology code
        # (``topology._io.Reader``) only joins strings. ``path`` still gives a Path.
        self.base = os.path.normpath(os.fspath(root))

    @property
    def path(self) -> Path:
        from pathlib import Path

        return Path(self.base)

    def __call__(self, absolute: str) -> Path:
        """Map an absolute path like ``/sys/class/net`` into this root."""
        return self.path / absolute.lstrip("/")

    def __repr__(self) -> str:
        return f"Root({self.base!r})"


# Reads ask the kernel for _CHUNK bytes at a time: /proc/sys refuses a single read larger
# than KMALLOC_MAX_SIZE with ENOMEM (proc_sys_call_handler, fs/proc/proc_sysctl.c), and a
# 4 MiB + 1 request is just over it. sysfs attributes are at most a page (stat says 4096
# whatever they hold), procfs files stat as 0 bytes: st_size sizes nothing here.
_CHUNK = 1 << 16
_MAX_BYTES = 4 << 20  # sysfs attributes are a page; /proc/net/* tables a few hundred KB


def open_nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK)


def read_text(path: str | os.PathLike[str]) -> str | None:
    """File content stripped of surrounding whitespace, or None if it cannot be read
    (ENOENT, EINVAL on a GID without netdev, EACCES, ENODEV, EIO from a driver's show(),
    EISDIR ...). Raw ``os`` calls: a text-mode ``open`` costs ~3x more, and discovery reads
    ~600 files on every rank. Under a fixture or replayed root a FIFO reads as empty
    (O_NONBLOCK: open does not wait for a writer) and anything past _MAX_BYTES (a link to
    /dev/zero) as unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        data = os.read(fd, _CHUNK)
        if data:  # read to EOF: a seq_file may hand out less than asked before its end
            chunks, total = [data], len(data)
            while chunk := os.read(fd, _CHUNK):
                chunks.append(chunk)
                total += len(chunk)
                if total > _MAX_BYTES:  # no attribute is this big: /dev/zero, not sysfs
                    return None
            data = b"".join(chunks) if len(chunks) > 1 else data
    except OSError:
        return None
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace")
    if "\r" in text:  # what text-mode open's universal newlines would have done
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.strip()


def list_dir(path: str | os.PathLike[str]) -> list[str]:
    """Sorted entry names, or [] when the directory is absent or unreadable."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def parse_cpulist(text: str | None) -> list[int]:
    """Parse a kernel CPU list like ``0-55,112-167`` (or ``0-7:2`` strides) into CPU ids."""
    cpus: list[int] = []
    if not text:
        return cpus
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        stride = 1
        if ":" in part:
            part, stride_text = part.split(":", 1)
            stride = int(stride_text)
        if "-" in part:
            low, high = part.split("-", 1)
            cpus.extend(range(int(low), int(high) + 1, stride))
        else:
            cpus.append(int(part))
    return cpus


def format_cpulist(cpus: list[int] | set[int]) -> str:
    """The inverse of ``parse_cpulist``: ``[0,1,2,5]`` -> ``0-2,5``."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
