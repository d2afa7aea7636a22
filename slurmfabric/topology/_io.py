"""File access for discovery, rooted anywhere, optionally recording what it read.

Every reader goes through ``Reader`` so that ``slurmfabric topo snapshot`` can write a
tarball of exactly the files, directory listings and symlinks discovery used, and a user
can replay it on a login node (``topo --from``). Readers never raise for kernel quirks:
``_sysfs.read_text`` already turns ENOENT/EINVAL/EACCES/ENODEV/EIO into None.
"""

from __future__ import annotations

import os

from slurmfabric._common import sysfs as _sysfs

# One reader for every kernel file (sized reads /proc/sys accepts, None when unreadable).
_read = _sysfs.read_text


_O_PATH = getattr(os, "O_PATH", 0)  # Linux: open a path without reading it


def _realpath(path: str) -> str:
    """``os.path.realpath`` in three syscalls: open the path, ask the kernel where it is.

    posixpath.realpath lstat()s every component of a ~12-deep sysfs device path in Python;
    with O_PATH and /proc/self/fd the kernel resolves it once. Anything odd (no O_PATH, no
    /proc, a dangling link) falls back to os.path.realpath, so results are the same.
    """
    if _O_PATH:
        try:
            fd = os.open(path, _O_PATH)
        except OSError:
            return os.path.realpath(path)
        try:
            resolved = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            resolved = ""
        finally:
            os.close(fd)
        if resolved.startswith("/") and not resolved.endswith(" (deleted)"):
            return resolved
    return os.path.realpath(path)


class Reader:
    """Reads absolute paths (``/sys/...``) inside ``root``; records them when asked."""

    def __init__(self, root: _sysfs.Root, record: bool = False) -> None:
        self.root = root
        self.base = root.base
        self._prefix = self.base.rstrip("/") + "/"
        self._real_base: str | None = None
        self.record = record
        self.files: dict[str, str | None] = {}
        self.dirs: dict[str, list[str]] = {}
        self.links: dict[str, str] = {}
        self.present: set[str] = set()  # checked for existence only (plugin .so markers)

    @property
    def real_base(self) -> str:
        """The root with symlinks resolved (``/`` on a real node), computed once."""
        if self._real_base is None:
            self._real_base = os.path.realpath(self.base)
        return self._real_base

    def host(self, absolute: str) -> str:
        return self._prefix + absolute.lstrip("/")

    def text(self, absolute: str) -> str | None:
        value = _read(self._prefix + absolute.lstrip("/"))
        if self.record:
            self._note_links(absolute)
            self.files[absolute] = value
        return value

    def int(self, absolute: str, base: int = 10) -> int | None:
        text = self.text(absolute)
        if text is None:
            return None
        try:
            return int(text, base)
        except ValueError:  # "N/A (no PMA)" and other non-numbers
            return None

    def listdir(self, absolute: str) -> list[str]:
        entries = _sysfs.list_dir(self.host(absolute))
        if self.record:
            self._note_links(absolute)
            self.dirs[absolute] = entries
        return entries

    def exists(self, absolute: str) -> bool:
        found = os.path.lexists(self.host(absolute))
        if self.record and found:
            self._note_links(absolute)
            if os.path.isfile(self.host(absolute)):
                self.present.add(absolute)
        return found

    def is_dir(self, absolute: str) -> bool:
        return os.path.isdir(self.host(absolute))

    def realpath(self, absolute: str) -> str:
        """The absolute in-root path with every symlink resolved (``/sys/devices/...``)."""
        resolved = _realpath(self.host(absolute))
        if self.record:
            self._note_links(absolute)
        base = self.real_base
        if resolved == base:
            return "/"
        if resolved.startswith(base.rstrip("/") + "/"):
            return "/" + resolved[len(base.rstrip("/")) + 1 :]
        return resolved  # escaped the root (absolute link in a fixture): keep as is

    def readlink_name(self, absolute: str) -> str | None:
        """Name of what a symlink points at (``device/physfn`` -> ``0000:17:00.0``)."""
        host = self.host(absolute)
        if not os.path.islink(host):
            return None
        if self.record:
            self._note_links(absolute)
        # realpath, not the raw target: the kernel writes ``../../../0000:01:00.0`` but a
        # link may end in ``..``; a dangling physfn (PF not passed through) still resolves.
        return os.path.basename(_realpath(host).rstrip("/"))

    def _note_links(self, absolute: str, depth: int = 0) -> None:
        """Remember every symlink along ``absolute`` so a tarball can rebuild the path."""
        if depth > 40:  # the kernel's own ELOOP limit: a link cycle, stop following
            return
        parts = [p for p in absolute.split("/") if p]
        current = ""
        for index, part in enumerate(parts):
            current = f"{current}/{part}"
            host = self.host(current)
            if current in self.links:
                target = self.links[current]
            elif os.path.islink(host):
                try:
                    target = os.readlink(host)
                except OSError:
                    return
                self.links[current] = target
            else:
                continue
            # continue inside the resolved directory, as the kernel does
            joined = os.path.normpath(os.path.join(os.path.dirname(current), target))
            rest = "/".join(parts[index + 1 :])
            if rest:
                self._note_links(f"{joined}/{rest}", depth + 1)
            else:
                self._note_links(joined, depth + 1)
            return


def as_root(root: str | os.PathLike[str] | _sysfs.Root | None) -> _sysfs.Root:
    if isinstance(root, _sysfs.Root):
        return root
    return _sysfs.Root(None if root is None else os.fspath(root))
