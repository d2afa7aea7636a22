"""After submit: a job's record, status, logs, wait, cancel, and why it failed.

``slurmfabric submit`` keeps one small JSON record per job under the user's state directory
(``$SLURMFABRIC_JOBS_DIR``, else ``$XDG_STATE_HOME/slurmfabric/jobs``, else
``~/.local/state/slurmfabric/jobs``). ``Job`` reads the live state from slurmctld
(``scontrol show job``) while it still knows the job, then from accounting (``sacct``),
which needs slurmdbd. The failure summary is built from what Slurm itself printed into the
job's output (``srun: error: NODE: task N: Exited with exit code C``, slurmstepd's OOM and
cancel lines), from NCCL's own log lines (``slurmfabric.nccl.log``) and from the drain
reasons slurmfabric's hooks set on the job's nodes.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurmfabric._common.files import write_atomic
from slurmfabric.errors import SlurmCommandError, UsageError
from slurmfabric.slurm import cmd

# srun(1) reports each failed task group on stderr; these are its own words.
_SRUN_TASK = re.compile(
    r"^srun: error: (?P<node>[^\s:]+): tasks? (?P<tasks>[0-9][0-9,\-]{0,200}): "
    r"(?P<what>Exited with exit code (?P<code>[0-9]{1,3})|Killed|Terminated|Aborted"
    r"|Segmentation fault|Bus error|Out Of Memory)")
_OOM = re.compile(r"(?:Detected [0-9]{1,9} oom[-_]kill event|oom-kill|Out Of Memory)",
                  re.IGNORECASE)
_CANCELLED = re.compile(r"\*\*\* (?:JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT "
                        r"(?P<time>\S+)(?P<why>[^*]*)\*\*\*")
_JOB_ID = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,9}|\+[0-9]{1,4})?$")
TAIL = 20


def records_dir() -> Path:
    """Where job records live (one JSON file per job)."""
    explicit = os.environ.get("SLURMFABRIC_JOBS_DIR")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state")
    return Path(state) / "slurmfabric" / "jobs"


def job_key(job_id: str, cluster: str | None) -> str:
    """The one spelling of a job shown to people and stored: sbatch --parsable's own."""
    return f"{job_id};{cluster}" if cluster else job_id


def parse_job_id(text: str) -> tuple[str, str | None]:
    """``123``, ``123;c1`` (a cluster), ``123_4`` (an array task), ``123+1`` (a het
    component) -> (job id, cluster)."""
    job, semicolon, cluster = text.strip().partition(";")
    if not _JOB_ID.match(job) or (semicolon and not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}",
                                                                     cluster)):
        raise UsageError(f"job id {text!r} is not one Slurm knows: use 123, 123;cluster, "
                         "123_4 (array task) or 123+1 (het component)")
    return job, cluster or None


@dataclass
class Record:
    """What submit remembered about a job."""

    job_id: str
    cluster: str | None = None
    name: str = ""
    digest: str = ""
    script: str = ""  # the rendered script, saved beside the record
    workdir: str = ""
    output: str = ""  # the job's --output pattern, as given
    task_output: str = ""  # per-task output pattern (launcher.task_output), if any
    submitted: float = 0.0

    @property
    def key(self) -> str:
        return job_key(self.job_id, self.cluster)


def save_record(record: Record, script: str) -> Path:
    directory = records_dir()
    directory.mkdir(parents=True, exist_ok=True)
    base = record.key.replace(";", "@")
    script_path = directory / f"{base}.sh"
    script_path.write_text(script)
    record.script = str(script_path)
    path = directory / f"{base}.json"
    write_atomic(path, json.dumps(asdict(record), indent=1, sort_keys=True))
    return path


def load_records() -> list[Record]:
    from slurmfabric._common.inputfile import read_json
    from slurmfabric.errors import UsageError

    out = []
    for path in sorted(records_dir().glob("*.json")):
        try:  # a record is small: read capped, a regular file after links, else skipped
            data = read_json(str(path), "job record", 1 << 20)
            out.append(Record(**{k: v for k, v in data.items()
                                 if k in Record.__dataclass_fields__}))
        except (UsageError, ValueError, TypeError, AttributeError):
            continue
    return sorted(out, key=lambda r: r.submitted)


def find_record(job_id: str, cluster: str | None = None) -> Record | None:
    base = job_id.split("_")[0].split("+")[0]
    for record in reversed(load_records()):
        if record.job_id in (job_id, base) and (cluster is None or record.cluster == cluster):
            return record
    return None


@dataclass
class Status:
    job_id: str
    state: str
    cluster: str | None = None
    reason: str = ""
    nodes: str = ""
    elapsed: str = ""
    restarts: int = 0
    exit_code: str = ""
    stdout: str = ""
    source: str = "slurmctld"  # or "sacct"

    @property
    def done(self) -> bool:
        return self.state in cmd.FINAL_STATES

    @property
    def key(self) -> str:
        """``123`` or ``123;cluster``: the id as sbatch printed it."""
        return job_key(self.job_id, self.cluster)


@dataclass
class TaskFailure:
    rank: int
    node: str
    what: str  # "exit code 7", "Killed", ...
    exit_code: int | None = None
    line: int = 0  # line number in the job output (the first one is the first failure)


@dataclass
class Summary:
    job_id: str
    state: str
    exit_code: str
    failures: list[TaskFailure] = field(default_factory=list)
    oom: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    nccl: list[str] = field(default_factory=list)
    drains: dict[str, str] = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)  # the failing rank's last lines

    @property
    def first(self) -> TaskFailure | None:
        return self.failures[0] if self.failures else None

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["first"] = asdict(self.first) if self.first else None
        return data

    def text(self) -> str:
        lines = [f"job {self.job_id} {self.state} (exit {self.exit_code})"]
        if self.first:
            f = self.first
            lines.append(f"first failure: rank {f.rank} on {f.node}: {f.what}")
            others = [x for x in self.failures[1:]]
            if others:
                lines.append("then: " + "; ".join(f"rank {x.rank} on {x.node}: {x.what}"
                                                  for x in others[:8]))
        lines += [f"out of memory: {line}" for line in self.oom[:4]]
        lines += [f"cancelled: {line}" for line in self.cancelled[:2]]
        lines += [f"nccl: {line}" for line in self.nccl[:6]]
        lines += [f"drained by slurmfabric: {node}: {why}" for node, why in self.drains.items()]
        if self.tail:
            who = f"rank {self.first.rank}" if self.first else "the job"
            lines.append(f"last lines of {who}:")
            lines += [f"  {line}" for line in self.tail]
        return "\n".join(lines)


def _ranks(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            out += list(range(int(low), int(high or low) + 1))[:4096]
    return out


def task_failure(line: str, number: int = 0) -> list[TaskFailure]:
    """The failed tasks srun reports in one line of its stderr (none: not such a line)."""
    match = _SRUN_TASK.match(line) if len(line) <= 4096 else None
    if not match:
        return []
    code = match.group("code")
    what = f"exit code {code}" if code else match.group("what")
    return [TaskFailure(rank, match.group("node"), what, int(code) if code else None, number)
            for rank in _ranks(match.group("tasks"))]


# A task killed by srun after the first failure (exit 143/137 or "Killed") is a
# consequence: the first real failure is the first non-signal exit, if any.
CONSEQUENCES = ("exit code 143", "exit code 137", "Killed", "Terminated")


def first_failures(failures: list[TaskFailure]) -> list[TaskFailure]:
    """The failures, the cause first: consequences (srun's kills) after the rest."""
    return sorted(failures, key=lambda f: (f.what in CONSEQUENCES, f.line))


def summarize(job_id: str, state: str, exit_code: str, output: str,
              drains: dict[str, str] | None = None) -> Summary:
    """The diagnosis of a job from Slurm's and NCCL's own lines in its output."""
    from slurmfabric.nccl.log import merge, parse_log

    s = Summary(job_id=job_id, state=state, exit_code=exit_code, drains=dict(drains or {}))
    lines = output.splitlines()
    for number, line in enumerate(lines, 1):
        if len(line) > 4096:
            continue
        failed = task_failure(line, number)
        if failed:
            s.failures += failed
        elif _OOM.search(line):
            s.oom.append(line.strip()[:300])
        else:
            cancelled = _CANCELLED.search(line)
            if cancelled:
                s.cancelled.append(line.strip()[:300])
    s.failures = first_failures(s.failures)
    report = merge([parse_log(lines)])
    s.nccl = [f"{p.severity} [{p.kind}] {p.message}" for p in report.problems][:20]
    if s.first:
        s.tail = [line for line in lines if line.startswith(f"{s.first.rank}: ")][-TAIL:] or \
            lines[-TAIL:]
    elif state != "COMPLETED":
        s.tail = lines[-TAIL:]
    return s


class Job:
    """A submitted job: status, wait, logs, cancel, summary."""

    def __init__(self, job_id: str, cluster: str | None = None, record: Record | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.record = record if record is not None else find_record(job_id, cluster)
        if cluster is None and self.record is not None:
            cluster = self.record.cluster  # `jobs status 123` of a job submitted as 123;c1
        self.job_id, self.cluster = job_id, cluster
        self.env = env

    @property
    def key(self) -> str:
        """``123`` or ``123;cluster``, as sbatch printed it."""
        return job_key(self.job_id, self.cluster)

    def __str__(self) -> str:
        return self.key

    def __repr__(self) -> str:
        return f"Job({self.key!r})"

    @classmethod
    def from_text(cls, text: str, env: dict[str, str] | None = None) -> Job:
        job_id, cluster = parse_job_id(text)
        return cls(job_id, cluster, env=env)

    def status(self) -> Status:
        """From slurmctld while it knows the job, else from accounting."""
        r = cmd.job_if_known(self.job_id, env=self.env, cluster=self.cluster)
        if r is None:
            return self._from_accounting()
        restarts = r.get("Restarts", "0")
        return Status(job_id=self.job_id, cluster=self.cluster,
                      state=cmd.job_state(r.get("JobState")),
                      reason=r.get("Reason", ""), nodes=r.get("NodeList", ""),
                      elapsed=r.get("RunTime", ""), exit_code=r.get("ExitCode", ""),
                      restarts=int(restarts) if restarts.isdigit() else 0,
                      stdout=r.get("StdOut", ""))

    def _from_accounting(self) -> Status:
        row = cmd.accounting_job(self.job_id, env=self.env, cluster=self.cluster)
        if row is None:
            raise SlurmCommandError(f"job {self.key} is known neither to slurmctld nor to "
                                    "accounting", hint="check the id (and its ;cluster)")
        return Status(job_id=self.job_id, cluster=self.cluster,
                      state=cmd.job_state(row["State"]),
                      exit_code=row["ExitCode"], elapsed=row["Elapsed"],
                      nodes=row["NodeList"], reason=row["Reason"], source="sacct",
                      stdout=self._output_path())

    def _output_path(self) -> str:
        record = self.record
        if record is None or not record.output:
            return ""
        pattern = record.output.replace("%j", self.job_id).replace("%x", record.name)
        return pattern if os.path.isabs(pattern) else os.path.join(record.workdir, pattern)

    def wait(self, timeout: float = 3600, poll: float = 1.0) -> Status:
        """Until the job ends, following it into accounting once slurmctld forgets it."""
        return cmd.wait_until(self.status, lambda status: status.state, timeout, poll,
                                   what=f"job {self.key}",
                                   hint=f"slurmfabric jobs status '{self.key}'")

    def cancel(self, signal: str | None = None) -> None:
        cmd.cancel(self.job_id, self.cluster, signal, env=self.env)

    def log_path(self, rank: int | None = None) -> str:
        if rank is not None:
            record = self.record
            if record is None or not record.task_output:
                raise UsageError("this job has no per-rank output files",
                                 hint="set launcher.task_output (e.g. '%x-%j-%t.out') when "
                                 "submitting; srun then writes one file per rank")
            pattern = (record.task_output.replace("%j", self.job_id)
                       .replace("%x", record.name).replace("%t", str(rank)))
            return pattern if os.path.isabs(pattern) else os.path.join(record.workdir, pattern)
        return self.status().stdout or self._output_path()

    def logs(self, rank: int | None = None, tail: int | None = None) -> str:
        text = cmd.read_output_file(self.log_path(rank))
        if tail is not None:
            text = "\n".join(text.splitlines()[-tail:]) + ("\n" if text else "")
        return text

    def summary(self) -> Summary:
        status = self.status()
        output = cmd.read_output_file(status.stdout or self._output_path())
        drains: dict[str, str] = {}
        if status.nodes:
            try:  # one scontrol call for every node, not one per node of a large job
                ours = set(_expand(status.nodes))
                for record in cmd.show("node", env=self.env, cluster=self.cluster):
                    reason = cmd.node_reason(record)
                    if record.get("NodeName") in ours and reason.startswith("slurmfabric:"):
                        drains[record["NodeName"]] = reason
            except SlurmCommandError:
                pass
        s = summarize(self.key, status.state, status.exit_code, output, drains)
        if s.first is not None and self.record is not None and self.record.task_output:
            own = cmd.read_output_file(self.log_path(s.first.rank))
            if own:
                s.tail = own.splitlines()[-TAIL:]
        return s


def _expand(nodes: str) -> list[str]:
    from slurmfabric.slurm.hostlist import expand

    return expand(nodes)


def submit_job(config: object, **options: object) -> Job:
    """Render, submit and record a job config; the ``Job`` to follow it."""
    from slurmfabric.job import submit as submitting

    request = submitting.build_request(config, **options)  # type: ignore[arg-type]
    job_id = submitting.submit(request)
    record = record_for(config, job_id, request.script, request.workdir)
    return Job(record.job_id, record.cluster, record=record)


def record_for(config: object, job_id: str, script: str, workdir: str | None) -> Record:
    """Keep the record of a job just submitted; returns it."""
    from slurmfabric.job.render import config_digest

    job, _, cluster = job_id.partition(";")
    launcher = config.launcher  # type: ignore[attr-defined]
    record = Record(job_id=job, cluster=cluster or None, name=config.job.name,  # type: ignore
                    digest=config_digest(config),  # type: ignore[arg-type]
                    workdir=os.path.abspath(workdir or os.getcwd()),
                    output=config.job.output or "slurm-%j.out",  # type: ignore[attr-defined]
                    task_output=getattr(launcher, "task_output", None) or "",
                    submitted=time.time())
    save_record(record, script)
    return record
