"""Run one external command in its own process group with a deadline.

Shared by the prolog/epilog probes (``run_command``: nvidia-smi, site commands) and the
InfiniBand tools (``ibaudit.runner``: iblinkinfo, perfquery, ...). Both can hang: nvidia-smi
on a wedged GPU, a MAD query on a dead port or subnet manager. The command gets its own
session, so on timeout the whole group (grandchildren included) is killed with SIGKILL.

A process stuck in uninterruptible sleep (state D) survives even SIGKILL. We never wait
for it or for its pipes (a grandchild may still hold them open): the caller learns the
state and moves on, so a hook finishes on time. Standard library only, light imports:
the prolog runs this on every job start. Callers turn ``Deadline`` and the ``OSError``
of a missing program into their own error types and messages.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from slurmfabric._common.record import Record


class Finished(Record):
    """What a command that returned in time printed, and how long it took."""

    __slots__ = ("returncode", "stdout", "stderr", "seconds")
    returncode: int
    stdout: str
    stderr: str
    seconds: float


class ProbeError(Exception):
    """A probe (nvidia-smi, a sysfs read ...) could not produce facts.

    ``node_fault`` is True when the failure itself says the node is broken (nvidia-smi exit 15
    "GPU has fallen off the bus"), so checks report ``fail`` rather than a checker ``error``.
    """

    def __init__(self, message: str, node_fault: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.node_fault = node_fault

    def __str__(self) -> str:
        return self.message


class Deadline(Exception):
    """The command did not return in ``timeout`` seconds; its group has been killed.

    ``state`` is the leader's /proc state letter if it is still there after SIGKILL
    (``"D"``: uninterruptible sleep, it cannot die until the kernel call returns).
    """

    def __init__(self, timeout: float, state: str | None) -> None:
        super().__init__(f"no answer within {timeout:g} s")
        self.timeout = timeout
        self.state = state


class OutputLimit(Deadline):
    """The command printed more than ``max_bytes``: killed like a hung one (an endless
    ``iblinkinfo`` must not fill memory before its deadline)."""

    def __init__(self, max_bytes: int, state: str | None) -> None:
        Exception.__init__(self, f"printed more than {max_bytes} bytes")
        self.timeout = 0.0
        self.state = state
        self.max_bytes = max_bytes


MAX_OUTPUT = 256 << 20  # a 10,000-port iblinkinfo is a few MB


def proc_stat(pid: int) -> tuple[str, list[str]] | None:
    """(command name, the fields after it) from /proc/<pid>/stat, None if gone: the one
    reader of that file. proc(5): fields[0] is the state, [1] the parent pid, [19] the
    start time. The name is in parentheses and may itself hold spaces or ')'."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    head, _, tail = text.rpartition(")")
    return head.partition("(")[2], tail.split()


def process_state(pid: int) -> str | None:
    """The one-letter state from /proc/<pid>/stat (R, S, D, Z ...), None if gone."""
    stat = proc_stat(pid)
    return stat[1][0] if stat and stat[1] else None


def kill_group(proc: subprocess.Popen[bytes]) -> str | None:
    """SIGKILL the command's process group; return its state if it is still not gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # the group changed hands (setsid in the child): the leader only
        with contextlib.suppress(OSError):
            proc.kill()
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


PROBE_MARK = "SLURMFABRIC_PROBE_OF"


def run(
    cmd: list[str],
    timeout: float,
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    max_bytes: int = MAX_OUTPUT,
) -> Finished:
    """Run ``cmd`` (argv, never a shell) with stdin closed; raise ``Deadline`` on timeout
    and ``OutputLimit`` (a Deadline) when stdout or stderr passes ``max_bytes``.

    ``FileNotFoundError``/``PermissionError`` from starting it propagate unchanged.
    Output is decoded as UTF-8 with replacement: tools may print anything.
    """
    start = time.monotonic()
    # Marked as ours: a hook's probe inherits the job's SLURM_JOB_ID, and node.leftovers
    # must not count it (or its orphaned children) as a job process left behind.
    env = dict(os.environ if env is None else env, **{PROBE_MARK: str(os.getpid())})
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
        cwd=cwd,
        close_fds=True,
    )
    out, err = _collect(proc, start + max(timeout, 0.001), timeout, max_bytes)
    return Finished(
        proc.returncode,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
        time.monotonic() - start,
    )


def _collect(proc: subprocess.Popen[bytes], deadline: float, timeout: float,
             max_bytes: int) -> tuple[bytes, bytes]:
    """Read both pipes until EOF, the deadline or the byte cap, whichever comes first."""
    import selectors

    buffers: dict[int, bytearray] = {}
    with selectors.DefaultSelector() as selector:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                selector.register(stream, selectors.EVENT_READ)
                buffers[stream.fileno()] = bytearray()
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Deadline(timeout, kill_group(proc))
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer = buffers[key.fd]
                buffer += chunk
                if len(buffer) > max_bytes:
                    raise OutputLimit(max_bytes, kill_group(proc))
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0.001))
    except subprocess.TimeoutExpired:  # pipes closed early, the process lingers
        raise Deadline(timeout, kill_group(proc)) from None
    out = bytes(buffers.get(proc.stdout.fileno(), b"")) if proc.stdout else b""
    err = bytes(buffers.get(proc.stderr.fileno(), b"")) if proc.stderr else b""
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return out, err


def run_command(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None, name: str | None = None
) -> Finished:
    """Run ``cmd`` (argv, no shell) and return its output; raise ProbeError on a deadline.

    The error text is what an operator reads in the drain reason, for example
    ``nvidia-smi did not return in 5 s``. A probe stuck in uninterruptible sleep (state D,
    typical for nvidia-smi on a wedged GPU) survives even SIGKILL; it is reported as such.
    """
    label = name or os.path.basename(cmd[0])
    try:
        return run(cmd, timeout, env=env)
    except FileNotFoundError as exc:
        raise ProbeError(f"{label} not found at {cmd[0]}") from exc
    except PermissionError as exc:
        raise ProbeError(f"{label} at {cmd[0]} is not executable") from exc
    except Deadline as exc:
        message = f"{label} did not return in {timeout:g} s"
        if exc.state == "D":
            message += " (stuck in uninterruptible sleep, state D)"
        raise ProbeError(message) from None
