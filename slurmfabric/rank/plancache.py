"""One per-boot cache of the node's topology and plan for ``launch``, ``env`` and the TaskProlog.

Every rank of every launcher runs ``slurmfabric launch``; without a cache each one
discovers the node (~400 sysfs/procfs reads) and plans again. With it, the first rank of a
step on a node discovers and plans and writes both; the others read the plan back: a
``marshal`` load (built in, no import) plus the fingerprint below. Ranks that start
together (srun starts a node's tasks at once) miss together: one takes the entry's lock
(flock(2) on ``<entry>.lock``) and discovers, the others wait for it (at most LOCK_WAIT)
and read what it wrote. The cached path imports
the standard library only; ``slurmfabric.topology`` and ``slurmfabric.plan`` load on a miss.

Where: ``$SLURMFABRIC_PLAN_CACHE`` when it names a directory (``off``/``0``/``no``/``false``:
no cache at all); else ``/run/slurmfabric`` for root (tmpfs, root-owned), else
``$XDG_RUNTIME_DIR/slurmfabric`` when that runtime directory is ours and private (the XDG
Base Directory spec requires 0700), else ``/tmp/slurmfabric-<uid>``. The directory is made
0700 and must be a real directory owned by this effective uid and not group/world-writable;
it is opened with O_NOFOLLOW and every file is opened relative to it, with O_NOFOLLOW, and
must be a regular file of ours that nobody else can write. Writes go to a unique temporary
file renamed over the entry (rename(2) is atomic within a directory), so a concurrent rank
reads the old entry or the new one, never half of one. Anything wrong (a foreign owner,
wide permissions, a symlink, a truncated or corrupt file, a stale entry) is a miss:
discovery runs, and the entry is written again where that is safe. ``marshal`` is not meant
for data others wrote (Python's marshal docs); these checks are why only our own files in
our own private directory are ever loaded.

An entry's name is a checksum of its key; the entry holds the full key, compared on load, so
two keys can never share an entry. The key: the entry format, this slurmfabric (version,
install path and the newest mtime of plan/, topology/, _common/sysfs.py, whose
format_cpulist wrote a binding's ``cpulist`` text, and this file: another checkout, or an
edited one, is another cache), the Python version (marshal's format is
Python's), the boot id (``/proc/sys/kernel/random/boot_id``: new on every boot, kernel docs
Documentation/admin-guide/sysctl/kernel.rst "random"), the sysfs root, the effective uid,
this process's CPU affinity (sched_getaffinity(2): the job's cpuset, which the binding
splits), and what the plan reads besides the topology: local world size, master address,
fabric type, node name, the GPU visibility variables and every ``NCCL_*`` / ``FI_*``
variable plus ``SLURMFABRIC_ROCE_VLAN`` (the user's overrides).

What can change within one boot is covered by a fingerprint, read before discovery runs and
again on every load (any change: a miss). It reads, under the sysfs root:

- ``/sys/class/infiniband`` (RDMA devices added, removed or renamed), each device's
  ``ports/``, and each port's ``link_layer``, ``state``, ``phys_state`` and ``rate``: these
  change with the link, without a reboot (Documentation/ABI/stable/sysfs-class-infiniband).
- the GID table of every port that is not InfiniBand (RoCE), slot by slot exactly as
  discovery walks it (topology/rdma.py read_gids): the kernel rewrites RoCE GIDs when an
  address of the netdev changes (same ABI document, ``gids/<N>``; drivers/infiniband/core/
  roce_gid_mgmt.c). A slot's type and netdev are read with its value by discovery only: the
  kernel sets them together with the value (drivers/infiniband/core/cache.c).
  InfiniBand GIDs are left out, as discovery's plan-only read leaves them out.
- ``/dev/infiniband`` (the uverbs nodes a container was given).
- ``/sys/class/net`` (netdevs added, removed, renamed), ``bonding_masters`` and each bond's
  ``bonding/slaves`` (under a fixture root without bonding_masters: every netdev's),
  and ``/proc/net/route``, ``/proc/net/fib_trie``, ``/proc/net/if_inet6``,
  ``/proc/net/vlan/config`` (addresses, routes and VLANs: proc(5); they decide
  NCCL_SOCKET_IFNAME and the RoCE GID choice).
- ``/sys/bus/pci/devices`` and the ``nvidia`` and ``amdgpu`` driver directories under
  ``/sys/bus/pci/drivers`` (PCI hotplug, GPUs bound or unbound: Documentation/ABI/testing/
  sysfs-bus-pci).
- ``/sys/devices/system/node`` and ``/sys/devices/system/cpu/online`` (NUMA nodes and CPU
  hotplug: Documentation/ABI/stable/sysfs-devices-node, Documentation/ABI/testing/
  sysfs-devices-system-cpu), and under a fixture root its ``/proc/self/status``.
- whether each GPUDirect RDMA module file and NCCL plugin marker discovery looks for
  exists, the NVIDIA driver version, and the size, mtime and inode of ``/etc/nccl.conf``
  and of the NCCL topology file (topology/numa.py, topology/nccl_topo.py; the list is
  written into the entry by the writer, so it has one owner).

Not covered, because it cannot change without a reboot or without also changing something
above: PCI bridge paths, NUMA placement and local CPU lists of devices (firmware), a
device's vendor and class, which netdev belongs to which port (the net listing changes).
The master address is resolved when the plan is made; a host name whose address changes
within one boot keeps the old route choice until the next boot or a change above.
A crash can leave a short entry behind only on a file system that lost data: the boot id
then differs and it is never read.
"""

from __future__ import annotations

import marshal
import os
import stat
import sys

FORMAT = "plancache-2"  # 2: a binding carries its cpulist text
ENV = "SLURMFABRIC_PLAN_CACHE"
_OFF = ("0", "off", "no", "false")
ROCE_VLAN_ENV = "SLURMFABRIC_ROCE_VLAN"  # plan.ROCE_VLAN_ENV (a unit test keeps them equal)
# What plan.visible_gpus_from_env reads (a unit test keeps this a superset of it)
GPU_VISIBILITY = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES",
                  "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
_MAX_BYTES = 16 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


# --- where: a directory only we can write ---------------------------------------------


class Cache:
    """An open cache directory (a file descriptor: names resolve inside it, never through a
    link swapped in later), or a closed one with the reason (``why``)."""

    __slots__ = ("fd", "path", "why", "fingerprint")

    def __init__(self, fd: int | None, path: str, why: str = "") -> None:
        self.fd, self.path, self.why = fd, path, why
        self.fingerprint: tuple | None = None  # computed once per process, before discovery

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _safe(info: os.stat_result) -> str:
    """Why a file or directory of the cache cannot be trusted, or ''."""
    if info.st_uid != os.geteuid():
        return f"owned by uid {info.st_uid}, not {os.geteuid()}"
    if info.st_mode & 0o022:
        return f"group- or world-writable (mode {info.st_mode & 0o777:o})"
    return ""


def _open_dir(path: str, create: bool) -> tuple[int | None, str]:
    """The directory opened (made 0700 first where it does not exist), or why not. Opened
    first: a warm rank's directory exists, so it pays no mkdir(2)."""
    flags = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        fd = None
    except OSError as error:  # ELOOP/ENOTDIR: a symlink or not a directory
        return None, f"cannot open {path}: {error.strerror}"
    if fd is None:
        if create:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            except OSError as error:
                return None, f"cannot create {path}: {error.strerror}"
        try:
            fd = os.open(path, flags)
        except OSError as error:
            return None, f"cannot open {path}: {error.strerror}"
    why = _safe(os.fstat(fd))
    if why:
        os.close(fd)
        return None, f"{path} is {why}"
    return fd, ""


def default_dir(environ: dict[str, str]) -> str:
    """Root: /run/slurmfabric; a user: $XDG_RUNTIME_DIR/slurmfabric, else /tmp/slurmfabric-UID."""
    uid = os.geteuid()
    if uid == 0:
        return "/run/slurmfabric"
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        try:
            info = os.lstat(runtime)
        except OSError:
            info = None
        if info is not None and stat.S_ISDIR(info.st_mode) and info.st_uid == uid \
                and not info.st_mode & 0o077:
            return os.path.join(runtime, "slurmfabric")
    return f"/tmp/slurmfabric-{uid}"


def open_cache(environ: dict[str, str]) -> Cache:
    """The cache this process may use; ``Cache.fd`` is None when there is none (``why``).
    The setting comes from the task's ``environ``, else from this process's own
    environment (a library caller that describes a task by a dict of its own)."""
    setting = (environ.get(ENV) or os.environ.get(ENV, "")).strip()
    if setting.lower() in _OFF:
        return Cache(None, "", f"off ({ENV}={setting})")
    path = setting if setting.startswith("/") else default_dir(environ)
    fd, why = _open_dir(path, create=True)
    return Cache(fd, path, why)


# --- the key and the fingerprint ---------------------------------------------------------


def boot_id() -> str | None:
    """This boot's id; None where there is none (no per-boot key: no cache)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as handle:
            text = handle.read(64).strip().decode("ascii", "replace")
    except OSError:
        return None
    return text or None


def plan_inputs(environ: dict[str, str], local_size: int, master_addr: str,
                fabric_type: str, node: str) -> list[str]:
    """What the plan reads besides the topology (see the module docstring)."""
    chosen = sorted(f"{k}={v}" for k, v in environ.items()
                    if k.startswith(("NCCL_", "FI_")) or k in GPU_VISIBILITY
                    or k == ROCE_VLAN_ENV)
    return [str(local_size), master_addr, fabric_type, node, *chosen]


def _key(kind: str, root: str, inputs: list[str]) -> str | None:
    boot = boot_id()
    if boot is None:
        return None
    from slurmfabric import __version__

    try:
        affinity = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        affinity = ""
    global _STAMP
    if _STAMP is None:
        _STAMP = _code_stamp()
    return "\0".join([FORMAT, kind, __version__, _STAMP, sys.version, boot,
                      os.path.abspath(root), str(os.geteuid()), affinity, *inputs])


_STAMP: str | None = None  # _code_stamp() of this process, read once


def _code_stamp(package: str | None = None) -> str:
    """Where this slurmfabric is and when the code that makes the plan last changed (the
    newest mtime in plan/, topology/, _common/sysfs.py, whose format_cpulist wrote the
    cpulist text, and this file): an edited checkout never reads an entry its old code
    wrote, even at the same version. ~30 stat calls."""
    package = package or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        newest = max(os.stat(__file__).st_mtime_ns,
                     os.stat(os.path.join(package, "_common", "sysfs.py")).st_mtime_ns)
    except NotADirectoryError:  # run from a zipapp (job/zipapp.py): one file holds the code
        archive = os.path.dirname(package)
        return f"{archive}:{os.stat(archive).st_mtime_ns}"
    except OSError:
        return f"{package}:unreadable:{os.getpid()}"
    for sub in ("plan", "topology"):
        try:
            with os.scandir(os.path.join(package, sub)) as entries:
                for entry in entries:
                    if entry.name.endswith(".py"):
                        newest = max(newest, entry.stat().st_mtime_ns)
        except OSError:
            return f"{package}:unreadable:{os.getpid()}"  # never matches another process
    return f"{package}:{newest}"


def _name(kind: str, key: str) -> str:
    """A file name from the key: hash() of an int is the same in every process (only str
    and bytes hashes are salted, PYTHONHASHSEED), and needs no import. Two keys with one
    name only take turns in one file: the entry holds the whole key."""
    data = key.encode("utf-8", "surrogateescape")
    return f"{kind}-{hash(int.from_bytes(data, 'little')) & 0xFFFFFFFFFFFFFFFF:016x}" \
           f"-{len(data)}.marshal"


def _read(path: str, dir_fd: int | None = None) -> bytes | None:
    """A file's bytes as they are, or None when unreadable. Raw: the fingerprint only
    compares them with what the same function read before. One read() is the whole of a
    sysfs attribute (a page at most); a full buffer means there may be more (/proc/net).
    ``dir_fd``: ``path`` is relative to that open directory (openat(2)), which spares the
    kernel the walk from the root (and the /sys/class symlink) for every file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        data = os.read(fd, 1 << 16)
        if len(data) == 1 << 16:
            chunks = [data]
            while len(chunks) <= 64 and (chunk := os.read(fd, 1 << 16)):
                chunks.append(chunk)
            data = b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data


def _list(path: str) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


def _gids(port_dir: str) -> list[object]:
    """The GID slots of a port as discovery walks them (the one walk, _common/gids.py): the
    same files, read relative to the open ``gids`` directory (a real port has 255 slots)."""
    try:
        gids = os.open(port_dir + "/gids", os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    except OSError:
        return []  # what _list's None gave: no slots to read
    try:
        return _slots(gids)
    finally:
        os.close(gids)


def _slots(gids: int) -> list[object]:
    try:
        names = os.listdir(gids)
    except OSError:
        return []
    from slurmfabric._common.gids import walk  # RoCE ports only: IB nodes never load it

    return [value for _index, value in walk(names, lambda name: _read(name, gids))]


def _port(port_dir: str) -> tuple[bytes | None, ...]:
    """A port's link_layer, state, phys_state and rate, read relative to its directory."""
    try:
        fd = os.open(port_dir, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    except OSError:
        return (None, None, None, None)
    try:
        return tuple(_read(name, fd) for name in ("link_layer", "state", "phys_state", "rate"))
    finally:
        os.close(fd)


def _stat(path: str) -> tuple[int, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_size, info.st_mtime_ns, info.st_ino)


def fingerprint(root: str, extra: tuple) -> tuple:
    """What can change on this node without a reboot (module docstring), as one value.
    ``extra``: ``(kind, path)`` pairs the writer chose (``e`` exists, ``r`` text, ``s`` stat)."""
    base = os.path.abspath(root).rstrip("/")
    out: list[object] = []
    add = out.append
    ib = f"{base}/sys/class/infiniband"
    devices = _list(ib)
    add(devices)
    for dev in devices or ():
        ports = _list(f"{ib}/{dev}/ports")
        add(ports)
        for port in ports or ():
            port_dir = f"{ib}/{dev}/ports/{port}"
            link = _port(port_dir)
            add(link)
            layer = link[0]
            if layer is None or layer.strip() != b"InfiniBand":
                add(_gids(port_dir))
    add(_list(base + "/dev/infiniband"))
    nets = _list(base + "/sys/class/net")
    add(nets)
    # bonding_masters lists every bond while the bonding driver is loaded (kernel docs,
    # Documentation/networking/bonding.rst; drivers/net/bonding/bond_sysfs.c): on the real
    # root no such file means no bond; a fixture tree may lack it, so every netdev is asked
    bonds = _read(base + "/sys/class/net/bonding_masters")
    add(bonds)
    asked = bonds.split() if bonds is not None else (nets or ()) if base else ()
    for net in asked:
        add(_read(f"{base}/sys/class/net/{net.decode() if isinstance(net, bytes) else net}"
                  "/bonding/slaves"))
    for name in ("route", "fib_trie", "if_inet6", "vlan/config"):
        add(_read(f"{base}/proc/net/{name}"))
    for name in ("devices", "drivers/nvidia", "drivers/amdgpu"):
        add(_list(f"{base}/sys/bus/pci/{name}"))
    add(_list(base + "/sys/devices/system/node"))
    add(_read(base + "/sys/devices/system/cpu/online"))
    if base:  # a fixture root: its status file stands for this process's affinity
        add(_read(base + "/proc/self/status"))
    for kind, path in extra:
        full = base + path
        add(os.path.lexists(full) if kind == "e" else _read(full) if kind == "r"
            else _stat(full))
    return tuple(out)


def extra_probes(root: str, environ: dict[str, str]) -> tuple:
    """The files discovery checks that topology/ owns the names of (write side only)."""
    from slurmfabric.topology import nccl_topo, numa
    from slurmfabric.topology._io import Reader, as_root

    probes: list[tuple[str, str]] = [("e", path) for path in numa.GDR_EXISTS]
    probes += [("e", path) for paths in numa.MARKERS.values() for path in paths]
    probes += [("r", numa.NVIDIA_VERSION), ("s", nccl_topo.CONF)]
    found = nccl_topo.configured_file(Reader(as_root(root)), environ)
    if found and found[0].startswith("/"):
        probes.append(("s", found[0]))
    return tuple(probes)


# --- entries ------------------------------------------------------------------------------


def _load_entry(cache: Cache, name: str) -> object:
    """The entry's value, or None (absent, unsafe, unreadable, corrupt)."""
    if cache.fd is None:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=cache.fd)
    except OSError:  # ENOENT, ELOOP (a symlink)
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or _safe(info) \
                or info.st_size > _MAX_BYTES:
            return None
        data = os.read(fd, info.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return marshal.loads(data)
    except Exception:  # noqa: BLE001 - EOFError, ValueError, TypeError: a miss
        return None


def _store_entry(cache: Cache, name: str, value: object) -> str:
    """Write ``value`` atomically; '' or why it was not written."""
    if cache.fd is None:
        return cache.why
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        data = marshal.dumps(value)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600,
                     dir_fd=cache.fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=cache.fd, dst_dir_fd=cache.fd)
    except (OSError, ValueError) as error:
        import contextlib  # the write path only: ~1 ms the cached path never pays

        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=cache.fd)
        return f"not written: {error}"
    return ""


def _valid(cache: Cache, root: str, entry: object, key: str) -> object:
    """The payload of a fresh entry for ``key``, else None."""
    if not (isinstance(entry, tuple) and len(entry) == 5 and entry[0] == FORMAT
            and entry[1] == key and isinstance(entry[2], tuple)):
        return None
    if cache.fingerprint is None:
        cache.fingerprint = fingerprint(root, entry[2])
    return entry[4] if entry[3] == cache.fingerprint else None


def load_plan(cache: Cache, root: str, inputs: list[str]) -> CachedPlan | None:
    """The cached plan for these inputs on this node now, or None (then discover)."""
    key = _key("plan", root, inputs)
    if key is None or cache.fd is None:
        return None
    payload = _valid(cache, root, _load_entry(cache, _name("plan", key)), key)
    if payload is None:
        return None
    try:
        return CachedPlan(payload)
    except (KeyError, TypeError, ValueError):
        return None


LOCK_WAIT = 5.0  # seconds a rank waits for another rank's discovery before its own


def lock(cache: Cache, root: str, inputs: list[str]) -> int | None:
    """On a miss: take the entry's lock, so that of the ranks srun starts at once on a node
    one discovers and the others wait and read its entry (flock(2): released when its holder
    exits, however it exits). None (and discovery goes ahead) when there is no lock to take
    or it is held for longer than LOCK_WAIT. The caller loads again once it holds the lock."""
    key = _key("plan", root, inputs)
    if key is None or cache.fd is None:
        return None
    try:
        fd = os.open(_name("plan", key)[:-len(".marshal")] + ".lock",
                     os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=cache.fd)
    except OSError:
        return None
    import fcntl  # the miss path only
    import time

    deadline = time.monotonic() + LOCK_WAIT
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode) and not _safe(os.fstat(fd)):
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.005)
    except OSError:
        pass
    os.close(fd)
    return None


def unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the descriptor releases the flock


def prepare(root: str, environ: dict[str, str]) -> tuple:
    """On a miss, before discovery: the fingerprint to store (``(extra, value)``)."""
    extra = extra_probes(root, environ)
    return extra, fingerprint(root, extra)


def load_topology(cache: Cache, root: str, environ: dict[str, str], before: tuple) -> object:
    """The node's Topology as cached (a plan for other inputs made it), or None."""
    key = _key("topology", root, [environ.get("NCCL_TOPO_FILE", "")])
    if key is None or cache.fd is None:
        return None
    entry = _load_entry(cache, _name("topology", key))
    if not (isinstance(entry, tuple) and len(entry) == 5 and entry[0] == FORMAT
            and entry[1] == key and (entry[2], entry[3]) == before):
        return None
    from slurmfabric.topology import snapshot

    try:
        return snapshot.from_dict(entry[4])
    except Exception:  # noqa: BLE001 - a corrupt entry: discover
        return None


def store(cache: Cache, root: str, environ: dict[str, str], inputs: list[str],
          before: tuple, topo: object, plan: object) -> str:
    """Write the topology and plan entries with the fingerprint read before discovery;
    '' or why not. A change during discovery makes the next load miss, never go stale."""
    if cache.fd is None:
        return cache.why
    plan_key = _key("plan", root, inputs)
    topo_key = _key("topology", root, [environ.get("NCCL_TOPO_FILE", "")])
    if plan_key is None or topo_key is None:
        return "no boot id (/proc/sys/kernel/random/boot_id)"
    from slurmfabric.topology import snapshot

    why = _store_entry(cache, _name("topology", topo_key),
                       (FORMAT, topo_key, before[0], before[1], snapshot.to_dict(topo)))
    return _store_entry(cache, _name("plan", plan_key),
                        (FORMAT, plan_key, before[0], before[1], plan_view(plan))) or why


# --- the plan as the cache holds it ---------------------------------------------------------


def plan_view(plan: object) -> dict:
    """What the per-rank path reads of a plan (env, launch, launch --print, the TaskProlog).
    A binding's CPUs also as kernel cpulist text (SLURMFABRIC_CPUS, rank/task.py
    cpu_list_text), so that a warm rank does not import _common/sysfs to format them."""
    from slurmfabric._common.sysfs import format_cpulist

    p = plan
    return {
        "fabric": p.fabric, "fabric_type": p.fabric_type, "summary": p.summary,  # type: ignore
        "nccl_env": dict(p.nccl_env), "warnings": [str(w) for w in p.warnings],  # type: ignore
        "notes": [str(n) for n in p.notes], "errors": [str(e) for e in p.errors],  # type: ignore
        "bindings": [{
            "local_rank": b.local_rank, "gpu": None if b.gpu is None else b.gpu.index,
            "visible_index": b.visible_index, "nic": b.nic, "nic_distance": b.nic_distance,
            "cpus": list(b.cpus), "cpulist": format_cpulist(list(b.cpus)),
            "mem_node": b.mem_node, "reason": b.reason,
        } for b in p.bindings],  # type: ignore[attr-defined]
    }


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("not text")
    return value


def _texts(value: object) -> list[str]:
    if not isinstance(value, list):
        raise TypeError("not a list")
    return [_text(item) for item in value]


def _int_or_none(value: object) -> int | None:
    if value is not None and type(value) is not int:
        raise TypeError("not an int")
    return value  # type: ignore[return-value]


_INT = frozenset((int,))


class CachedGpu:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class CachedBinding:
    """A RankBinding as read back: the fields the per-rank path uses, type-checked."""

    __slots__ = ("local_rank", "gpu", "visible_index", "nic", "nic_distance", "cpus",
                 "cpulist", "mem_node", "reason")

    def __init__(self, data: dict) -> None:
        self.local_rank = _int_or_none(data["local_rank"])
        gpu = _int_or_none(data["gpu"])
        self.gpu = None if gpu is None else CachedGpu(gpu)
        self.visible_index = _int_or_none(data["visible_index"])
        self.nic = None if data["nic"] is None else _text(data["nic"])
        self.nic_distance = None if data["nic_distance"] is None else _text(data["nic_distance"])
        cpus = data["cpus"]
        if not isinstance(cpus, list) or not _INT.issuperset(map(type, cpus)):  # no bool
            raise TypeError("cpus")
        self.cpus = tuple(cpus)
        self.cpulist = _text(data["cpulist"])
        self.mem_node = _int_or_none(data["mem_node"])
        self.reason = _text(data["reason"])


class CachedPlan:
    """A Plan as read back from the cache (``plan_view``), type-checked field by field:
    every value here can reach the program's environment."""

    __slots__ = ("fabric", "fabric_type", "summary", "nccl_env", "warnings", "notes", "errors",
                 "bindings")

    def __init__(self, data: object) -> None:
        if not isinstance(data, dict):
            raise TypeError("not a dict")
        self.fabric = _text(data["fabric"])
        self.fabric_type = _text(data["fabric_type"])
        self.summary = _text(data["summary"])
        env = data["nccl_env"]
        if not isinstance(env, dict):
            raise TypeError("nccl_env")
        self.nccl_env = {_text(k): _text(v) for k, v in env.items()}
        self.warnings = _texts(data["warnings"])
        self.notes = _texts(data["notes"])
        self.errors = _texts(data["errors"])
        bindings = data["bindings"]
        if not isinstance(bindings, list):
            raise TypeError("bindings")
        self.bindings = [CachedBinding(b) for b in bindings]
