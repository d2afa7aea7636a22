"""Run one external probe (nvidia-smi, a site command) with a hard deadline.

Every probe gets its own session and process group, so on timeout the whole group is killed
with SIGKILL. A probe stuck in uninterruptible sleep (state D, typical for nvidia-smi on a
wedged GPU) survives even SIGKILL; we never wait for it or for its pipes (a grandchild may
still hold them open), we report it and move on so the hook finishes on time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass

from slurmfabric.health.model import ProbeError


@dataclass(frozen=True)
class CommandOutput:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def process_state(pid: int) -> str | None:
    """The one-letter state from /proc/<pid>/stat (R, S, D, Z ...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or ')'.
    tail = text.rpartition(")")[2].split()
    return tail[0] if tail else None


def _kill_group(proc: subprocess.Popen[bytes]) -> str | None:
    """SIGKILL the probe's process group; return its state if it is still not gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=0.1)
        state = None
    except subprocess.TimeoutExpired:
        state = process_state(proc.pid)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    return state


def run_command(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None, name: str | None = None
) -> CommandOutput:
    """Run ``cmd`` (argv, no shell) and return its output; raise ProbeError on a deadline.

    The error text is what an operator reads in the drain reason, for example
    ``nvidia-smi did not return in 5 s``.
    """
    label = name or os.path.basename(cmd[0])
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=env,
            close_fds=True,
        )
    except FileNotFoundError as exc:
        raise ProbeError(f"{label} not found at {cmd[0]}") from exc
    except PermissionError as exc:
        raise ProbeError(f"{label} at {cmd[0]} is not executable") from exc
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.001))
    except subprocess.TimeoutExpired:
        state = _kill_group(proc)
        message = f"{label} did not return in {timeout:g} s"
        if state == "D":
            message += " (stuck in uninterruptible sleep, state D)"
        raise ProbeError(message) from None
    return CommandOutput(
        proc.returncode,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
        time.monotonic() - start,
    )
