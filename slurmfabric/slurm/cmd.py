"""The one module that builds Slurm command lines and parses their output.

Everything that talks to sbatch, scontrol, sinfo, squeue, sacct or scancel goes through
here (argv and parser side by side), so that the
rest of slurmfabric sees Python values and a failed command always surfaces Slurm's own
error text verbatim (users search for that text). Parsers are pure functions over the
recorded output so they are tested without a cluster. Standard library only: the prolog
path drains nodes through ``update_node``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

from slurmfabric.errors import SlurmCommandError, SubmitError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import datetime as dt
    from collections.abc import Callable
    from typing import TypeVar, Union

    T = TypeVar("T")
    PathArg = Union[str, os.PathLike[str], None]  # a command's working directory


@dataclass(frozen=True)
class JobId:
    """What ``sbatch --parsable`` printed: ``123``, ``123;cluster``, ``123_4``, ``123+0``."""

    job_id: str
    cluster: str | None = None

    def __str__(self) -> str:
        """The id as sbatch printed it: ``123;cluster`` keeps the cluster, which every later
        command about the job needs (``--clusters``) on a multi-cluster setup."""
        return f"{self.job_id};{self.cluster}" if self.cluster else self.job_id


_JOBID = re.compile(r"^\d+(?:_\d+|_\[[\d,\-%]+\]|\+\d+)?$")


def parse_parsable_jobid(text: str) -> JobId:
    """Parse ``sbatch --parsable`` output; its last non-empty line carries the id.

    sbatch may print warnings before it (for example about ignored options), so only the
    last line counts. The cluster follows a semicolon on federated/multi-cluster setups.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise SubmitError("sbatch printed no job id", hint="run sbatch by hand to see why")
    job, _, cluster = lines[-1].partition(";")
    if not _JOBID.match(job):
        raise SubmitError(f"could not read a job id from sbatch output: {text.strip()!r}")
    return JobId(job, cluster or None)


def _execute(
    cmd: list[str],
    timeout: float,
    input: str | None,
    env: dict[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    error: type[SlurmCommandError],
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command; a missing binary, a timeout or (``check``) a non-zero exit raise
    ``error`` quoting the command's own text verbatim."""
    try:
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout,
            env=env, cwd=cwd, check=False,
        )
    except FileNotFoundError as exc:
        raise error(
            f"{cmd[0]}: command not found",
            hint="install Slurm's client commands or put them on PATH",
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise error(f"{' '.join(cmd[:3])} did not return within {timeout:g} s") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip() or f"exit code {proc.returncode}"
        raise error(f"{cmd[0]} failed: {detail}")
    return proc


def run(
    cmd: list[str],
    timeout: float = 30,
    input: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    error: type[SlurmCommandError] = SlurmCommandError,
) -> str:
    """Run a Slurm command and return its stdout; raise ``error`` quoting stderr verbatim."""
    return _execute(cmd, timeout, input, env, cwd, error).stdout


def sbatch_command(args: list[str] | None = None) -> list[str]:
    """The exact sbatch command line used to submit a script read from stdin."""
    return ["sbatch", "--parsable", *(args or [])]


def sbatch(script_text: str, args: list[str] | None = None, workdir: PathArg = None,
           env: dict[str, str] | None = None, timeout: float = 60,
           script_args: list[str] | None = None) -> JobId:
    """Submit a script text through ``sbatch --parsable`` and parse the id."""
    proc = _sbatch_run(sbatch_command(args), script_text, workdir, env, timeout, script_args)
    return parse_parsable_jobid(proc.stdout)


def _sbatch_run(command: list[str], script_text: str, workdir: PathArg,
                env: dict[str, str] | None, timeout: float,
                script_args: list[str] | None) -> subprocess.CompletedProcess[str]:
    """sbatch with the script on stdin; with ``script_args`` (the script's own "$@") the
    script goes as a file instead: sbatch takes arguments only after a script path
    (sbatch(1): ``sbatch [OPTIONS...] script [args...]``); Slurm keeps its own copy, so the
    temporary file goes when sbatch is done."""
    if not script_args:
        return _execute(command, timeout, script_text, env, workdir, SubmitError)
    with _script_file(script_text) as path:
        return _execute([*command, path, *script_args], timeout, None, env, workdir,
                        SubmitError)


@contextlib.contextmanager
def _script_file(text: str) -> Iterator[str]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", prefix="slurmfabric-", suffix=".sh",
                                     encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        yield handle.name


def sbatch_test_only_command(args: list[str] | None = None) -> list[str]:
    """``sbatch --test-only``: Slurm validates the script and estimates a start, no job."""
    return ["sbatch", "--test-only", *(args or [])]


def sbatch_test_only(script_text: str, args: list[str] | None = None, workdir: PathArg = None,
                     env: dict[str, str] | None = None, timeout: float = 60,
                     script_args: list[str] | None = None) -> str:
    """Slurm's verdict on a script (``sbatch: Job N to start at ...``), which sbatch prints
    on stderr even on success; a refusal raises SubmitError quoting sbatch verbatim."""
    proc = _sbatch_run(sbatch_test_only_command(args), script_text, workdir, env, timeout,
                       script_args)
    return (proc.stderr + proc.stdout).strip()


def parse_show_oneliner(line: str) -> dict[str, str]:
    """Parse one ``scontrol show -o`` record into a dict.

    Values may contain spaces (``Reason=slurmfabric: ib: mlx5_0 port 1 at 200 Gb/s
    [root@2024-01-01T00:00:00]``), so a value runs until the next `` Key=`` token whose key
    looks like a Slurm field name (starts with a capital letter).
    """
    fields: dict[str, str] = {}
    starts = [m for m in re.finditer(r"(?:^|\s)([A-Z][A-Za-z0-9_:/.]*)=", line)]
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(line)
        fields[match.group(1)] = line[match.end() : end].strip()
    return fields


def cluster_args(cluster: str | None) -> list[str]:
    """``--clusters=NAME`` for a job of another cluster (multi-cluster/federated setups)."""
    return [f"--clusters={cluster}"] if cluster else []


def show_command(kind: str, name: str | None = None, cluster: str | None = None) -> list[str]:
    """``scontrol [--clusters=C] show -o <kind> [name]``: one record per line."""
    return ["scontrol", *cluster_args(cluster), "show", "-o", kind, *([name] if name else [])]


def show(
    kind: str, name: str | None = None, env: dict[str, str] | None = None,
    cluster: str | None = None,
) -> list[dict[str, str]]:
    """``scontrol show -o <kind> [name]`` as a list of key/value records."""
    out = run(show_command(kind, name, cluster), env=env)
    return [parse_show_oneliner(line) for line in out.splitlines() if "=" in line]


def node(name: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """One node's record (``NodeName``, ``NodeAddr``, ``State``, ``Reason`` ...)."""
    records = show("node", name, env=env)
    if not records:
        raise SlurmCommandError(f"scontrol knows no node {name!r}")
    return records[0]


def job(job_id: str, env: dict[str, str] | None = None,
        cluster: str | None = None) -> dict[str, str]:
    """One job's record (``JobState``, ``NodeList``, ``StdOut`` ...)."""
    records = show("job", job_id, env=env, cluster=cluster)
    if not records:
        raise SlurmCommandError(f"scontrol knows no job {job_id!r}")
    return records[0]


def job_if_known(job_id: str, env: dict[str, str] | None = None,
                 cluster: str | None = None) -> dict[str, str] | None:
    """The job's record, or None once slurmctld has forgotten it (it keeps an ended job
    for MinJobAge, 300 s by default, then answers ``Invalid job id specified``)."""
    try:
        records = show("job", job_id, env=env, cluster=cluster)
    except SlurmCommandError as exc:
        if "Invalid job id" not in str(exc):
            raise
        return None
    return records[0] if records else None


def job_state(value: str | None) -> str:
    """The bare state of scontrol's ``JobState``, sacct's ``State`` or squeue's ``%T``.

    sacct(1) appends who cancelled (``CANCELLED by 1000``); a field that is empty or
    missing (a record read mid-transition, a truncated line) reads ``UNKNOWN``, never an
    error, so a waiter polls again instead of crashing.
    """
    words = (value or "").split()
    return words[0] if words else "UNKNOWN"


# sacct(1) fields for one job's allocation (-X: not its steps; -P: '|' between fields).
SACCT_JOB_FIELDS = ("JobID", "State", "ExitCode", "Elapsed", "NodeList", "Reason")

# What sacct says where the cluster keeps no accounting (AccountingStorageType=none).
_NO_ACCOUNTING = ("accounting_storage/none", "not running a supported accounting",
                  "Slurm accounting storage is disabled")


def sacct_job_command(job_id: str, cluster: str | None = None) -> list[str]:
    """``sacct -j ID -X -n -P -o SACCT_JOB_FIELDS``: one parsable row per allocation."""
    return ["sacct", *cluster_args(cluster), "-j", job_id, "-X", "-n", "-P", "-o",
            ",".join(SACCT_JOB_FIELDS)]


def parse_sacct_rows(text: str,
                     fields: tuple[str, ...] = SACCT_JOB_FIELDS) -> list[dict[str, str]]:
    """``sacct -n -P`` output -> one dict per row; a short row reads '' for the missing
    fields and the last field keeps any '|' of its own (a free-text Reason)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split("|", len(fields) - 1)
        rows.append(dict(zip(fields, values + [""] * (len(fields) - len(values)))))
    return rows


def accounting_job(job_id: str, env: dict[str, str] | None = None,
                   cluster: str | None = None) -> dict[str, str] | None:
    """The job's row in accounting (the latest allocation), or None if it has none.

    A cluster without slurmdbd raises an error that says so: once slurmctld has forgotten
    the job, its end state is gone and guessing would be wrong.
    """
    try:
        out = run(sacct_job_command(job_id, cluster), env=env)
    except SlurmCommandError as exc:
        if any(words in str(exc) for words in _NO_ACCOUNTING):
            raise SlurmCommandError(
                f"job {job_id} is no longer known to slurmctld (MinJobAge) and this "
                "cluster keeps no accounting, so its end state is gone",
                hint="configure slurmdbd (AccountingStorageType=accounting_storage/"
                "slurmdbd); 'slurmfabric testbed up --accounting' does it locally") from None
        raise
    rows = parse_sacct_rows(out)
    return rows[-1] if rows else None


# sacctmgr(1) "LIST/SHOW EVENT" fields of a node event; Reason last: it may hold '|'.
NODE_EVENT_FIELDS = ("NodeName", "TimeStart", "TimeEnd", "State", "User", "Reason")


def node_events_command(start: dt.datetime, end: dt.datetime,
                        nodes: str | None = None) -> list[str]:
    """``sacctmgr -n -P list events Event=Node``: node events overlapping [start, end]
    (local time, as sacctmgr reads and prints it), of the hostlist ``nodes`` or all."""
    return ["sacctmgr", "-n", "-P", "list", "events", "Event=Node",
            f"Start={start:%Y-%m-%dT%H:%M:%S}", f"End={end:%Y-%m-%dT%H:%M:%S}",
            "Format=" + ",".join(NODE_EVENT_FIELDS), *([f"Nodes={nodes}"] if nodes else [])]


def node_events(start: dt.datetime, end: dt.datetime, nodes: str | None = None,
                env: dict[str, str] | None = None,
                timeout: float = 60) -> list[dict[str, str]]:
    """slurmdbd's node events (drains, downs, their reasons and ends) as rows keyed by
    ``NODE_EVENT_FIELDS``; a cluster without slurmdbd raises SlurmCommandError quoting
    sacctmgr."""
    return parse_sacct_rows(run(node_events_command(start, end, nodes), timeout=timeout,
                                env=env), NODE_EVENT_FIELDS)


def add_cluster(name: str, env: dict[str, str] | None = None) -> None:
    """``sacctmgr -i add cluster NAME``; a cluster slurmdbd already knows is no error."""
    proc = _execute(["sacctmgr", "-i", "add", "cluster", name], 30, None, env, None,
                    SlurmCommandError, check=False)
    if proc.returncode != 0 and "already exists" not in proc.stdout + proc.stderr:
        raise SlurmCommandError(f"sacctmgr add cluster failed: {proc.stderr.strip()}")


def accounting_answers(env: dict[str, str] | None = None, timeout: float = 20) -> bool:
    """Whether slurmdbd answers sacctmgr (``show cluster``) now."""
    try:
        run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"], env=env,
            timeout=timeout)
    except SlurmCommandError:
        return False
    return True


def scancel_command(job_id: str, cluster: str | None = None,
                    signal: str | None = None) -> list[str]:
    """``scancel [--clusters=C] [--signal=SIG] ID``: without a signal the job ends."""
    return ["scancel", *cluster_args(cluster), *([f"--signal={signal}"] if signal else []),
            job_id]


def cancel(job_id: str, cluster: str | None = None, signal: str | None = None,
           env: dict[str, str] | None = None) -> None:
    """Cancel the job, or only send its processes ``signal``."""
    run(scancel_command(job_id, cluster, signal), env=env)


def update_command(kind: str, name: str, fields: dict[str, str]) -> list[str]:
    """``scontrol update <Kind>=<name> Key=Value ...`` (``NodeName``, ``JobId``); each value
    is one argv item and no shell is involved, so a reason with spaces or quotes stays data
    and a value starting with '-' is never an option (it follows ``update``)."""
    return ["scontrol", "update", f"{kind}={name}", *(f"{k}={v}" for k, v in fields.items())]


def update_node(name: str, env: dict[str, str] | None = None, **fields: str) -> None:
    """``scontrol update NodeName=<name> Key=Value ...`` (State, Reason ...)."""
    run(update_command("NodeName", name, fields), env=env)


def update_job(target: str, env: dict[str, str] | None = None, **fields: str) -> None:
    """``scontrol update JobId=<job> Key=Value ...``; an array task is
    ``<array id>_<task id>``. Slurm refuses some keys on a running job (ExcNodeList: "Job is
    no longer pending execution"), which raises SlurmCommandError quoting it."""
    run(update_command("JobId", target, fields), env=env)


def requeue(target: str, env: dict[str, str] | None = None) -> None:
    """``scontrol requeue <job>``: the job ends now and is pending again under the same id
    (an array task is ``<array id>_<task id>``, or the whole array would restart)."""
    run(["scontrol", "requeue", target], env=env)


def sbatch_file(path: str, args: list[str], env: dict[str, str] | None = None) -> JobId:
    """``sbatch --parsable ARGS PATH``: submit a script that is a file (a chained successor)."""
    return parse_parsable_jobid(run([*sbatch_command(args), path], env=env,
                                    error=SubmitError))


def parse_time_left(text: str) -> int | None:
    """squeue's ``%L``: ``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``, ``UNLIMITED`` -> seconds."""
    text = text.strip()
    days, _, rest = text.rpartition("-")
    parts = rest.split(":")
    if not all(part.isdigit() for part in parts) or len(parts) > 3 or (days and not
                                                                        days.isdigit()):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


def time_left(job_id: str, env: dict[str, str] | None = None,
              cluster: str | None = None) -> int | None:
    """Seconds before the job's time limit, as slurmctld counts them; None if unlimited."""
    return parse_time_left(run(["squeue", *cluster_args(cluster), "-h", "-j", job_id, "-o",
                                "%L"], env=env))


def node_states(nodelist: str | None = None,
                env: dict[str, str] | None = None) -> dict[str, str]:
    """``{node: state}`` for the nodes of a hostlist (sinfo expands it), or for all."""
    where = ["-n", nodelist] if nodelist else []
    return parse_node_states(run([*SINFO_NODE_STATES, *where], env=env))


def sinfo_summary(env: dict[str, str] | None = None) -> str:
    """Plain ``sinfo``: the partition/state table a person reads."""
    return run(["sinfo"], env=env)


def reconfigure(env: dict[str, str] | None = None) -> None:
    """``scontrol reconfigure``: the running daemons reread slurm.conf."""
    run(["scontrol", "reconfigure"], env=env)


# One "<node> <state>" line per node: ``sfn1 idle``, ``sfn4 drained``, ``sft3 idle*``.
SINFO_NODE_STATES = ["sinfo", "-h", "-N", "-o", "%N %T"]


def parse_node_states(text: str) -> dict[str, str]:
    """Output of ``SINFO_NODE_STATES`` -> ``{node: state}`` (same on 22.05 and 24.11).

    A node in several partitions appears once per partition with the same state.
    """
    states: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
        elif parts:
            raise SlurmCommandError(f"unexpected sinfo line {line!r}",
                                    hint="expected '<node> <state>' from sinfo -o '%N %T'")
    return states


def node_reason(record: dict[str, str]) -> str:
    """A node record's Reason as Slurm means it: '' for ``(null)``/``none`` (no reason);
    Slurm's ``[user@time]`` stamp is kept (health/drain.current_reason strips it)."""
    reason = record.get("Reason", "").strip()
    return "" if reason in ("(null)", "none", "None") else reason


def node_state_flags(state: str) -> set[str]:
    """``IDLE+DRAIN`` -> ``{"IDLE", "DRAIN"}``; a trailing ``*`` (not responding) is kept as
    ``NOT_RESPONDING`` so callers need not know Slurm's suffix characters."""
    flags = set()
    for part in state.split("+"):
        if part.endswith("*"):
            flags.add("NOT_RESPONDING")
            part = part[:-1]
        if part:
            flags.add(part.upper())
    return flags


def parse_version(text: str) -> tuple[int, int, int]:
    """``slurm 22.05.8`` / ``slurm-wlm 24.11.5`` (Debian's builds) -> ``(24, 11, 5)``.

    Every Slurm program's ``--version``/``-V`` prints this one line.
    """
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        raise SlurmCommandError(f"cannot read a Slurm version from {text.strip()!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def slurm_version(env: dict[str, str] | None = None) -> tuple[int, int, int]:
    """The installed client's version from ``scontrol --version``.

    Like every client, scontrol needs a slurm.conf (or DNS SRV records) even for this.
    """
    return parse_version(run(["scontrol", "--version"], env=env))


# Job states after which nothing more happens (squeue(1) "JOB STATE CODES").
FINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
    "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT",
})


def wait_until(
    read: Callable[[], T], state_of: Callable[[T], str], timeout: float, poll: float, *,
    done: Callable[[str], bool] = FINAL_STATES.__contains__, what: str = "job",
    hint: str = "", raise_on_timeout: bool = True,
) -> T:
    """The one job waiter: ``read()`` every ``poll`` seconds until ``done`` holds for its
    state; return that last value.

    Past ``timeout`` it raises SlurmCommandError naming the state it saw, or with
    ``raise_on_timeout=False`` returns the last value (a bounded wait for a transition
    that may not come, such as a requeue settling).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        state = state_of(value)
        if done(state):
            return value
        if time.monotonic() > deadline:
            if not raise_on_timeout:
                return value
            raise SlurmCommandError(f"{what} still {state} after {timeout:g} s", hint=hint)
        time.sleep(poll)


def wait_job(
    job_id: str, timeout: float = 600, poll: float = 0.5, env: dict[str, str] | None = None,
    *, cluster: str | None = None, done: Callable[[str], bool] = FINAL_STATES.__contains__,
    raise_on_timeout: bool = True,
) -> dict[str, str]:
    """Poll ``scontrol show job`` until ``done(state)`` (by default: the job ended); return
    the last record.

    Needs the job to stay in slurmctld's memory until it is read (MinJobAge, 300 s by
    default), which polling every ``poll`` seconds guarantees.
    """
    return wait_until(lambda: job(job_id, env=env, cluster=cluster),
                      lambda record: job_state(record.get("JobState")), timeout, poll,
                      done=done, what=f"job {job_id}", hint=f"scontrol show job {job_id}",
                      raise_on_timeout=raise_on_timeout)


def read_output_file(path: str | os.PathLike[str]) -> str:
    """A job's output file, or '' while it does not exist yet. Read through inputfile: a
    regular file after following links (the path comes from Slurm or a record, and a link to
    /dev/zero must not fill memory), at most LOG_MAX_BYTES."""
    from slurmfabric._common.inputfile import LOG_MAX_BYTES, read_text

    try:
        os.stat(path)
    except OSError:
        return ""
    return read_text(str(path), "job output", LOG_MAX_BYTES, lenient=True)
