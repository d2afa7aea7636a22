"""MASTER_PORT that no other job on the node holds: checked and reserved by the batch shell.

The hash in rankenv.port_for spreads jobs over the port range, but two jobs on one node
still collide once in 10,000 pairs, and a fixed preferred port (``--port``) collides always.
So the batch shell, which runs on the job's first node (the master), walks the range from
the preferred port, ``port, port+1, ...`` wrapping at the top, and takes the first port
that (a) no live job has reserved and (b) can be bound right now. Reservations are files in
a node-local directory, ``<port>`` holding ``job pid starttime``, made under an flock so two
batch shells starting together cannot take the same port. A reservation is alive while its
owner process lives (the job's ``slurmstepd``, found among our ancestors; else the shell that
ran us): a pid is matched with its start time (proc(5), /proc/PID/stat field 22), so a
reused pid does not keep a dead job's port. The directory is ``$SLURMFABRIC_PORT_DIR`` or
``/dev/shm/slurmfabric-ports`` (tmpfs: gone at reboot, like every owner), mode 1777.
Where the directory is private to each job (job_container/tmpfs), only the bind check works.
"""

from __future__ import annotations

import os

from slurmfabric.errors import RankEnvError

DEFAULT_DIR = "/dev/shm/slurmfabric-ports"
DIR_ENV = "SLURMFABRIC_PORT_DIR"


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(comm, ppid, starttime) of ``pid``, or None if it is gone."""
    from slurmfabric._common.probe import proc_stat

    stat = proc_stat(pid)
    if stat is None or len(stat[1]) < 20:
        return None
    return stat[0], int(stat[1][1]), stat[1][19]


def owner() -> tuple[int, str]:
    """(pid, starttime) of the process whose life is the job's: its slurmstepd if found."""
    pid = os.getppid()
    first = None
    for _ in range(16):
        info = _stat(pid)
        if info is None:
            break
        if first is None:
            first = (pid, info[2])
        if info[0].startswith("slurmstepd"):
            return pid, info[2]
        if info[1] <= 1:
            break
        pid = info[1]
    if first is None:
        return os.getpid(), (_stat(os.getpid()) or ("", 0, "0"))[2]
    return first


def _alive(record: str) -> tuple[str, bool]:
    parts = record.split()
    if len(parts) != 3 or not parts[1].isdigit():
        return "", False
    info = _stat(int(parts[1]))
    return parts[0], info is not None and info[2] == parts[2]


def _open_dir(directory: str) -> str | None:
    try:
        os.makedirs(directory, exist_ok=True)
        if os.stat(directory).st_uid == os.geteuid():
            os.chmod(directory, 0o1777)  # shared by every user's jobs, like /tmp
    except OSError:
        return None
    return directory


def choose(
    start: int,
    port_range: tuple[int, int],
    job_id: str,
    is_free,
    directory: str | None = None,
) -> tuple[int, list[str]]:
    """The first port from ``start`` that is neither reserved by a live job nor bound.

    Returns (port, notes). Raises RankEnvError when every port in the range is taken.
    """
    lo, hi = port_range
    size = hi - lo + 1
    notes: list[str] = []
    path = _open_dir(directory or os.environ.get(DIR_ENV) or DEFAULT_DIR)
    lock = None
    if path is not None:
        import fcntl

        try:
            lock = os.open(os.path.join(path, ".lock"), os.O_RDONLY | os.O_CREAT, 0o644)
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            lock = None
    if lock is None:
        notes.append("no port reservation directory: only checked that the port is unbound")
    me = owner()
    try:
        for step in range(size):
            port = lo + (start - lo + step) % size
            if lock is not None and not _take(path, port, job_id, me, notes):
                continue
            if not is_free(port):
                notes.append(f"port {port} is in use on this node")
                if lock is not None:
                    _release(path, port, job_id)
                continue
            if port != start:
                notes.append(f"MASTER_PORT moved from {start} to {port}")
            return port, notes
    finally:
        if lock is not None:
            os.close(lock)  # releases the flock
    raise RankEnvError(
        f"no free MASTER_PORT in {lo}-{hi} on this node ({'; '.join(notes[-3:])})",
        "widen the range with --port-range or SLURMFABRIC_PORT_RANGE",
    )


def _take(path: str, port: int, job_id: str, me: tuple[int, str], notes: list[str]) -> bool:
    """Reserve ``port`` for ``job_id`` unless a live other job holds it (under the flock)."""
    name = os.path.join(path, str(port))
    try:
        with open(name) as handle:
            record = handle.read()
    except FileNotFoundError:
        record = ""
    except OSError:
        return False
    if record:
        holder, alive = _alive(record)
        if holder == job_id:
            return True  # ours already (env run twice in the same job)
        if alive:
            notes.append(f"port {port} is reserved by job {holder}")
            return False
        try:
            os.unlink(name)
        except OSError:  # a stale reservation of another user in the sticky directory
            notes.append(f"port {port} has a stale reservation we cannot remove")
            return False
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{job_id} {me[0]} {me[1]}\n")
    return True


def _release(path: str, port: int, job_id: str) -> None:
    name = os.path.join(path, str(port))
    try:
        with open(name) as handle:
            if handle.read().split()[:1] == [job_id]:
                os.unlink(name)
    except (OSError, IndexError):
        pass


def port_is_free(port: int) -> bool:
    """True if nothing listens on (any address, port) on this host."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True
