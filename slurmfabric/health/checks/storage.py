"""Data mounts: how fast a read from each one is, against the site's threshold.

The whole family is this file (``FAMILY``): its site key (``data_mounts``, checked by
``mounts_problem``), its fact (``collect``), its check (``CHECKS``: ``storage.read``) and
when it runs (``enabled``). Training GPUs starve when the data mount is slow; health checks that
see only that a mount exists pass such a node.

Each mount is read by a child process (``READER``, standard library only) under the
probe deadline, killed with its process group when it does not answer: a hung NFS mount
blocks a reader in the kernel, and a hook must finish on time. The child only reads: it
opens the site's probe file ``O_RDONLY | O_NOFOLLOW | O_NONBLOCK`` (a FIFO or a symlink
planted in its place neither blocks the open nor redirects it) and ``O_NOATIME`` where
the kernel allows (no access-time update: nothing is written, not even metadata).

The page cache must not lie: a region read recently comes from memory at gigabytes per
second whatever the mount does. Neither O_DIRECT nor dropping the node's caches is
acceptable in a prolog (the first is not supported by every file system and changes the
read path, the second throws away every job's cached data). So the reader picks a fresh
region of the file at random (1 MiB-aligned; a file several times ``read_mb`` gives
different regions on successive runs) and calls ``posix_fadvise(POSIX_FADV_DONTNEED)`` on
that region first: the kernel drops this file's clean cached pages of that range only
(posix_fadvise(2)), so the read goes to the device or server. It advises the same after
the read, so the probe leaves nothing of its own in the job's memory.

A job cannot make the check pass or drain the node: the probe file must be a regular
file owned by root and writable by no one else (else the check errs, naming the fix; a
checker error does not drain by default), it must lie on the mount (same ``st_dev`` as
the mount point) and the mount point must be mounted. A job can plant nothing the reader
follows. Standard library only: this module is on the prolog's path.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from slurmfabric._common.probe import Deadline, run
from slurmfabric._common.textcheck import one_line
from slurmfabric.health.family import Fact, Family, Key
from slurmfabric.health.model import ERROR, FAIL, OK, CheckResult, Metric

FACT = "storage"
MOUNT_KEYS = {"path", "file", "read_mb", "min_mb_s", "max_seconds", "timeout_s"}
READ_MB_DEFAULT = 64
MB = 1_000_000  # throughput in MB/s, as storage vendors and fio state it
CHUNK = 1 << 20

# The child: argv[1] mount point, argv[2] probe file, argv[3] bytes to read. Prints one
# JSON object. No import beyond the standard library's os/json/time (it runs with -I -S).
READER = r"""
import json, os, stat, sys, time
mount, path, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = {"mounted": os.path.ismount(mount)}
def done(**more):
    out.update(more)
    print(json.dumps(out))
    sys.exit(0)
if not out["mounted"]:
    done(error="not mounted")
flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
began = time.monotonic()
try:
    fd = os.open(path, flags | getattr(os, "O_NOATIME", 0))
except PermissionError:
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        done(error=exc.strerror or str(exc), errno=exc.errno)
except OSError as exc:
    done(error=exc.strerror or str(exc), errno=exc.errno)
st = os.fstat(fd)
out.update(regular=stat.S_ISREG(st.st_mode), uid=st.st_uid, mode=st.st_mode & 0o7777,
           size=st.st_size, same_dev=st.st_dev == os.stat(mount).st_dev,
           open_s=time.monotonic() - began)
if not out["regular"] or st.st_uid != 0 or st.st_mode & 0o022 or not out["same_dev"]:
    done()
os.set_blocking(fd, True)
size = min(want, st.st_size)
regions = max(1, (st.st_size - size) // (1 << 20) + 1)
offset = (int.from_bytes(os.urandom(4), "big") % regions) << 20
advise = getattr(os, "posix_fadvise", None)
if advise:
    advise(fd, offset, size, os.POSIX_FADV_DONTNEED)
began, got = time.monotonic(), 0
while got < size:
    chunk = os.pread(fd, min(1 << 20, size - got), offset + got)
    if not chunk:
        break
    got += len(chunk)
seconds = time.monotonic() - began
if advise:
    advise(fd, offset, size, os.POSIX_FADV_DONTNEED)
done(offset=offset, bytes=got, read_s=seconds, advised=bool(advise))
"""


def enabled(expect: dict) -> bool:
    return bool(expect.get("data_mounts"))


def mounts_problem(value: Any) -> str | None:
    """Why ``data_mounts`` is wrong (None: it is right): a list of tables, each an
    absolute ``path``, an absolute ``file`` under it, ``read_mb`` > 0 and at least one of
    ``min_mb_s``/``max_seconds``."""
    example = ('data_mounts = [{ path = "/datasets", file = "/datasets/.probe/1g.bin", '
               "min_mb_s = 200 }]")
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        return f"data_mounts should be a list of tables, e.g. {example}"
    for i, mount in enumerate(value, 1):
        at = f"data_mounts #{i}"
        unknown = sorted(set(mount) - MOUNT_KEYS)
        if unknown:
            return (f"{at}: unknown key {one_line(repr(unknown[0]))}; known keys: "
                    f"{', '.join(sorted(MOUNT_KEYS))}")
        for key in ("path", "file"):
            text = mount.get(key)
            if not isinstance(text, str) or not text.startswith("/") or "\x00" in text \
                    or "\n" in text:
                return (f"{at}: {key} = {one_line(repr(text))[:80]} should be an absolute "
                        f"path, e.g. {example}")
        root = mount["path"].rstrip("/") + "/"
        if not os.path.normpath(mount["file"]).startswith(root) or ".." in mount["file"]:
            return (f"{at}: file {one_line(repr(mount['file']))[:80]} should lie under "
                    f"path {one_line(repr(mount['path']))[:80]}")
        for key, low, high in (("read_mb", 1, 65536), ("min_mb_s", 0.001, 10**7),
                               ("max_seconds", 0.001, 600), ("timeout_s", 0.1, 600)):
            number = mount.get(key)
            if number is None:
                continue
            if isinstance(number, bool) or not isinstance(number, (int, float)) \
                    or not low <= number <= high:
                return (f"{at}: {key} = {one_line(repr(number))[:40]} should be a number "
                        f"in {low}..{high}")
        if mount.get("min_mb_s") is None and mount.get("max_seconds") is None:
            return f"{at}: set min_mb_s (MB/s) or max_seconds (for the read), e.g. {example}"
    return None


def read_mount(mount: dict, timeout: float) -> dict[str, Any]:
    """One mount's read, as the child reports it; ``{"hung": True, ...}`` when it did
    not answer within ``timeout`` (killed with its group; ``state`` D when it could not
    even be killed, the sign of a hard-mounted server that stopped answering)."""
    want = int(float(mount.get("read_mb") or READ_MB_DEFAULT) * MB)
    argv = [sys.executable, "-I", "-S", "-B", "-c", READER, mount["path"], mount["file"],
            str(want)]
    try:
        done = run(argv, timeout, max_bytes=1 << 16)
    except Deadline as exc:
        return {"hung": True, "timeout": round(timeout, 3), "state": exc.state}
    except OSError as exc:
        return {"error": f"cannot start the reader: {exc}"}
    try:
        found = json.loads(done.stdout)
    except ValueError:
        last = (done.stderr.strip() or "no output").splitlines()[-1]
        return {"error": f"reader exit {done.returncode}: {one_line(last)[:160]}"}
    return found if isinstance(found, dict) else {"error": "reader printed no object"}


def collect(expect: dict, timeout: float) -> dict[str, dict[str, Any]]:
    """Every configured mount read at once, each under its own deadline (its
    ``timeout_s``, at most what the hook's budget leaves): a hung mount costs no other
    mount its answer."""
    mounts = list(expect.get("data_mounts") or [])
    found: dict[str, dict[str, Any]] = {}
    end = time.monotonic() + timeout

    def one(mount: dict) -> None:
        limit = min(float(mount.get("timeout_s") or timeout), end - time.monotonic() - 0.05)
        found[mount["path"]] = read_mount(mount, max(0.05, limit))

    threads = [threading.Thread(target=one, args=(m,), daemon=True) for m in mounts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    for mount in mounts:
        found.setdefault(mount["path"], {"hung": True, "timeout": round(timeout, 3)})
    return found


def _judge(mount: dict, fact: dict[str, Any]) -> tuple[str, str, float | None]:
    """(status, reason, MB/s) of one mount."""
    path, file = mount["path"], mount["file"]
    if fact.get("hung"):
        stuck = " (reader stuck in uninterruptible sleep, state D)" \
            if fact.get("state") == "D" else ""
        return FAIL, (f"{path}: reading {file} gave no answer within {fact['timeout']:g} s: "
                      f"mount hung or too slow{stuck}"), None
    if fact.get("mounted") is False:
        return FAIL, f"{path}: not mounted", None
    if "error" in fact:
        return ERROR, f"{path}: {file}: {fact['error']}", None
    if not fact.get("regular") or fact.get("uid") != 0 or int(fact.get("mode", 0)) & 0o022:
        return ERROR, (f"{path}: {file} is not a regular file owned by root and writable "
                       "by root only: a job could replace it; chown root and chmod 644 it"), None
    if not fact.get("same_dev"):
        return ERROR, f"{path}: {file} is not on the mount {path}", None
    want = int(float(mount.get("read_mb") or READ_MB_DEFAULT) * MB)
    got, seconds = int(fact.get("bytes", 0)), max(float(fact.get("read_s", 0.0)), 1e-9)
    if got < want:
        return ERROR, (f"{path}: {file} has {got / MB:.0f} MB, read_mb asks for "
                       f"{want / MB:.0f}: name a larger file or lower read_mb"), None
    rate = got / MB / seconds
    low, most = mount.get("min_mb_s"), mount.get("max_seconds")
    said = f"{path}: {rate:.1f} MB/s, {got / MB:.0f} MB of {file} in {seconds:.2f} s"
    if low is not None and rate < float(low):
        return FAIL, f"{said} (expected at least {low:g} MB/s)", rate
    if most is not None and seconds > float(most):
        return FAIL, f"{said} (expected at most {most:g} s)", rate
    return OK, said, rate


def check_read(facts: dict[str, dict[str, Any]], expect: dict, ctx) -> CheckResult:
    """``storage.read``: every data mount read at least as fast as the site asks."""
    bad: list[tuple[str, str]] = []
    said: list[str] = []
    values: dict[str, Any] = {}
    metrics = []
    for mount in expect.get("data_mounts") or []:
        status, reason, rate = _judge(mount, facts.get(mount["path"], {"error": "not read"}))
        values[mount["path"]] = None if rate is None else round(rate, 1)
        if rate is not None:
            metrics.append(Metric("slurmfabric_storage_read_mb_per_second", rate,
                                  (("path", mount["path"]),)))
        if status != OK:
            bad.append((status, reason))
        said.append(reason)
    if not bad:
        return CheckResult("storage.read", OK, "; ".join(said), values, tuple(metrics))
    status = FAIL if any(s == FAIL for s, _ in bad) else ERROR
    return CheckResult("storage.read", status, "; ".join(r for _, r in bad), values,
                       tuple(metrics))


# name -> (function, default on_error, hooks)
CHECKS = {
    "storage.read": (check_read, "pass", ("prolog", "check", "periodic")),
}

# [{path = "/datasets", file = "/datasets/.slurmfabric/probe-4g.bin", read_mb = 64,
#   min_mb_s = 200, max_seconds = 2, timeout_s = 5}]; docs/health.md, "Data mounts"
FAMILY = Family("storage", keys={"data_mounts": Key([], check=mounts_problem)},
                facts=(Fact(FACT, lambda run, t: collect(run.expect, t), CHECKS,
                            gate=lambda run: enabled(run.expect)),))
