"""Process helpers for the testbed: find programs, check recorded PIDs, signal them."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

from slurmfabric.errors import SlurmfabricError


def which(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join(
        [os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def munge_ids() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("munge")
    except KeyError as exc:
        raise SlurmfabricError("user 'munge' does not exist", hint="apt-get install munge") from exc
    return entry.pw_uid, entry.pw_gid


def resolves(name: str) -> bool:
    try:
        socket.gethostbyname(name)
        return True
    except OSError:
        return False


def pid_runs(pid: int, program: str) -> bool:
    """True if ``pid`` is alive and runs ``program`` (guards against recycled PIDs)."""
    from slurmfabric._common.probe import process_state

    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if process_state(pid) in (None, "Z"):
        return False
    return any(Path(arg.decode(errors="replace")).name == program for arg in cmdline[:4])


def send_signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise SlurmfabricError(f"timed out waiting for {what}")


def slurmd_version() -> tuple[int, int, int]:
    """The installed daemons' version; ``slurmd -V`` needs no slurm.conf, unlike clients."""
    from slurmfabric.slurm.cmd import parse_version

    try:
        proc = subprocess.run([which("slurmd") or "slurmd", "-V"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmfabricError(f"slurmd -V failed: {exc}",
                               hint="apt-get install slurm-wlm") from exc
    return parse_version(proc.stdout + proc.stderr)


def own_host_names() -> list[str]:
    """This machine's names as Slurm clients report them (full and short)."""
    full = socket.gethostname()
    return list(dict.fromkeys([full, full.split(".")[0]]))


DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")


def strays(state_dir: Path, known: set[int]) -> list[tuple[int, str]]:
    """Daemons of this testbed that no PID record knows: left by a killed run, or by an
    older state layout. A process is ours when its command line or environment names the
    state directory (slurmd/slurmctld ``-f <state>/etc/slurm.conf``, munged's socket,
    mariadbd's datadir, slurmdbd's SLURM_CONF); never another site's daemons."""
    marker = str(state_dir).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in known or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            program = Path(cmdline.split(b"\0")[0].decode(errors="replace")).name
            if program not in DAEMONS and not any(
                    Path(arg.decode(errors="replace")).name in DAEMONS
                    for arg in cmdline.split(b"\0")[:4]):
                continue
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if marker in cmdline or marker in environ:
            found.append((int(entry), program))
    return found


def stop(pids: list[int], timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after ``timeout``."""
    import signal

    for pid in pids:
        send_signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        send_signal(pid, signal.SIGKILL)
