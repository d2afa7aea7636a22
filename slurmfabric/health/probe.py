"""Run one external probe (nvidia-smi, a site command) with a hard deadline.

Every probe gets its own session and process group, so on timeout the whole group is killed
with SIGKILL (``slurmfabric._probe``, shared with the InfiniBand tools). A probe stuck in
uninterruptible sleep (state D, typical for nvidia-smi on a wedged GPU) survives even
SIGKILL; it is reported as such and the hook moves on, finishing on time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from slurmfabric import _probe
from slurmfabric._probe import process_state  # noqa: F401 - kept importable from here
from slurmfabric.health.model import ProbeError


@dataclass(frozen=True)
class CommandOutput:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_command(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None, name: str | None = None
) -> CommandOutput:
    """Run ``cmd`` (argv, no shell) and return its output; raise ProbeError on a deadline.

    The error text is what an operator reads in the drain reason, for example
    ``nvidia-smi did not return in 5 s``. Process group and kill: ``slurmfabric._probe``.
    """
    label = name or os.path.basename(cmd[0])
    try:
        done = _probe.run(cmd, timeout, env=env)
    except FileNotFoundError as exc:
        raise ProbeError(f"{label} not found at {cmd[0]}") from exc
    except PermissionError as exc:
        raise ProbeError(f"{label} at {cmd[0]} is not executable") from exc
    except _probe.Deadline as exc:
        message = f"{label} did not return in {timeout:g} s"
        if exc.state == "D":
            message += " (stuck in uninterruptible sleep, state D)"
        raise ProbeError(message) from None
    return CommandOutput(done.returncode, done.stdout, done.stderr, done.seconds)
