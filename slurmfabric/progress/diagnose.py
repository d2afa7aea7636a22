"""``slurmfabric jobs diagnose``: every rank's stack of a running job, and who holds the rest.

One ``srun --overlap --jobid JOB --ntasks-per-node=1`` step runs the collector
(``slurmfabric.progress.collect``) on every node of the job (``--overlap``: the step
shares the job's resources instead of waiting for them, srun(1)); each prints JSON lines
with its ranks' stacks, states, heartbeats and flight recorder summaries. ``analyse``
groups the ranks by where their main thread is and names:

- the ranks not in the collective the others wait in (the most common collective call
  site: torch.distributed's all_reduce, barrier, ... found by frame names), or not at the
  synchronisation they wait at (DDP's backward, a native ``c10d::Work::wait`` under an
  async collective's ``wait()``; without a recognised wait, where more than half of the
  ranks stand together);
- the ranks one or more collectives behind or ahead (in another collective, or in the same
  one at another step, from the heartbeat ``slurmfabric.progress`` writes);
- stopped (``T``), uninterruptible (``D``), zombie and gone ranks (the job's world size
  says which ranks should exist);
- from PyTorch's NCCL flight recorder dumps, where present, the ranks that did not enqueue
  the last collective the others did.

Each with node, PID and frame.
"""

from __future__ import annotations

import collections
import json
import sys
from dataclasses import asdict, dataclass, field

from slurmfabric.errors import SlurmCommandError

# torch.distributed's blocking collectives and waits, as their Python frames are named
# (torch/distributed/distributed_c10d.py), and native names py-spy --native shows.
COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor",
    "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "all_to_all",
    "all_to_all_single", "reduce", "gather", "gather_object", "scatter", "scatter_object_list",
    "send", "recv", "send_object_list", "recv_object_list", "batch_isend_irecv", "wait",
    "synchronize", "new_group", "init_process_group"})
NATIVE_WAITS = ("ncclGroupEnd", "ncclAllReduce", "gloo::", "c10d::", "ProcessGroupNCCL",
                "ProcessGroupGloo", "cudaStreamSynchronize", "cudaDeviceSynchronize")
# Where a rank waits for the others outside any collective call: the autograd engine (DDP's
# reducer issues the all-reduce from its hooks and backward() returns once it is done),
# torch/autograd/graph.py _engine_run_backward (older releases: backward in
# torch/autograd/__init__.py). Native frames (py-spy --native) show the rest, e.g.
# c10d::Work::wait under an async_op collective's wait() (recorded on the testbed).
SYNC_WAITS = frozenset({"_engine_run_backward", "run_backward", "backward"})
BAD_STATES = {"T": "stopped (SIGSTOP)", "t": "stopped by a tracer",
              "D": "in uninterruptible sleep (D state: a stuck driver or file system)",
              "Z": "a zombie (exited, not reaped)", "X": "dead", "gone": "gone"}


def _short(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if "site-packages" in path else parts[-1]


def _in_torch(path: str) -> bool:
    return "/torch/" in path.replace("\\", "/")


def _is_python(frame: dict[str, object]) -> bool:
    return str(frame["file"]).endswith(".py")


def _where(frame: dict[str, object]) -> str:
    return f"{frame['name']} ({_short(str(frame['file']))}:{frame['line']})"


def classify(frames: list[dict[str, object]]) -> tuple[str | None, str, str]:
    """(collective or synchronisation, or None; where; innermost frame) of one thread,
    frames innermost first. ``where`` names the collective and the program's frame that
    called it, so the same collective at two call sites are two places. Native frames
    (py-spy --native) count for the wait they are in; the places named are Python's."""
    if not frames:
        return None, "no Python frame", ""
    inner = next((f for f in frames if _is_python(f)), frames[0])
    innermost = _where(inner)
    # torch's own Python frame names the call (all_reduce, backward) where there is one;
    # else the native wait under the program's line (an async_op work's wait())
    for python in (True, False):
        for i, frame in enumerate(frames):
            name = str(frame["name"]).rsplit(".", 1)[-1]
            if python:
                found = (name in COLLECTIVES or name in SYNC_WAITS) and _is_python(frame) \
                    and _in_torch(str(frame["file"]))
            else:
                found = not _is_python(frame) and any(mark in str(frame["name"])
                                                      for mark in NATIVE_WAITS)
            if found:
                caller = next((f for f in frames[i + 1:] if _is_python(f)
                               and not _in_torch(str(f["file"]))), None)
                op = name if python else str(frame["name"]).split("(")[0]
                where = op + (f" called from {_where(caller)}" if caller else "")
                return op, where, innermost
    return None, innermost, innermost


@dataclass
class RankView:
    rank: int
    host: str
    pid: int
    state: str
    where: str
    frame: str
    collective: str | None = None
    step: int | None = None  # the step in progress, from the heartbeat
    error: str = ""


@dataclass
class Diagnosis:
    job: str
    ranks: list[RankView]
    waiting_in: str | None
    culprits: list[dict[str, object]]
    groups: list[dict[str, object]]
    nodes: list[dict[str, object]] = field(default_factory=list)
    flight: list[dict[str, object]] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def text(self) -> str:
        hosts = sorted({r.host for r in self.ranks})
        waiting = next((g for g in self.groups if g["where"] == self.waiting_in), None)
        lines = [f"job {self.job}: {len(self.ranks)} rank(s) found on {len(hosts)} node(s)"
                 + (f"; {len(waiting['ranks'])} wait in {self.waiting_in}" if waiting else "")]
        for c in self.culprits:
            lines.append(f"culprit: rank {c['rank']} on {c['host'] or '?'} (pid "
                         f"{c['pid'] or '?'}): {c['why']}"
                         + (f"; at {c['frame']}" if c.get("frame") else "")
                         + (f"; step {c['step']}" if c.get("step") is not None else ""))
        if not self.culprits:
            lines.append("no rank process found" if not self.ranks else
                         "no culprit: every rank found is in the same place"
                         if len(self.groups) == 1 else
                         f"no culprit: the ranks are in {len(self.groups)} places and none "
                         "holds most of them")
        lines.append("groups (where each rank's main thread is):")
        for g in self.groups:
            lines.append(f"  {len(g['ranks'])} rank(s) {_ranges(g['ranks'])}: {g['where']}")
        for f in self.flight:
            lines.append(f"flight recorder: {f['text']}")
        for n in self.nodes:
            if n.get("error"):
                lines.append(f"node {n.get('host')}: {n['error']}")
        lines += [f"rank {r.rank} on {r.host}: {r.error}" for r in self.ranks if r.error]
        return "\n".join(lines)


def _ranges(ranks: list[int]) -> str:
    return "[" + ",".join(str(r) for r in ranks) + "]"


def _current_step(beat: dict[str, object] | None) -> int | None:
    if not beat or not isinstance(beat.get("step"), int):
        return None
    return int(beat["step"]) + 1  # the step in progress  # type: ignore[call-overload]


def analyse(job: str, records: list[dict[str, object]]) -> Diagnosis:
    """The diagnosis from the collectors' JSON lines (``kind`` rank / node)."""
    nodes = [r for r in records if r.get("kind") == "node"]
    beats: dict[int, dict[str, object]] = {}
    dumps: dict[int, dict[str, object]] = {}
    for node in nodes:
        for rank, beat in (node.get("beats") or {}).items():  # type: ignore[union-attr]
            beats[int(rank)] = beat
        for rank, dump in (node.get("flight") or {}).items():  # type: ignore[union-attr]
            dumps[int(rank)] = dump
    views = []
    worlds = set()
    for r in records:
        if r.get("kind") != "rank":
            continue
        threads = r.get("threads") or []
        frames = threads[0]["frames"] if threads else []  # type: ignore[index]
        op, where, frame = classify(frames) if threads else (None, "no stack", "")
        rank = int(r["rank"])  # type: ignore[call-overload]
        views.append(RankView(rank=rank, host=str(r.get("host", "")),
                              pid=int(r.get("pid") or 0),  # type: ignore[call-overload]
                              state=str(r.get("state", "")), where=where, frame=frame,
                              collective=op, step=_current_step(beats.get(rank)),
                              error=str(r.get("error") or "")))
        if str(r.get("world", "")).isdigit():
            worlds.add(int(str(r["world"])))
    views.sort(key=lambda v: v.rank)
    by_where: dict[str, list[int]] = collections.defaultdict(list)
    for v in views:
        by_where[v.where].append(v.rank)
    groups = sorted(({"where": w, "ranks": rs} for w, rs in by_where.items()),
                    key=lambda g: (-len(g["ranks"]), g["where"]))
    in_collective = collections.Counter(v.where for v in views if v.collective)
    waiting_in = None
    if in_collective:
        top, count = in_collective.most_common(1)[0]
        waiting_in = top if count >= 2 or len(views) <= 2 else None
    alive = [v for v in views if v.state not in BAD_STATES]
    if waiting_in is None and len(alive) >= 3 and groups:
        # No wait recognised by name (an async_op wait() without native frames is just
        # a line of the program): in a hang, where more than half the ranks stand
        # together is where they wait, and the others are what they wait for.
        top_group = max(groups, key=lambda g: len(g["ranks"]))  # type: ignore[arg-type]
        count = len(top_group["ranks"])  # type: ignore[arg-type]
        if count >= 2 and 2 * count > len(alive) and count < len(alive):
            waiting_in = str(top_group["where"])
    waiting = [v for v in views if v.where == waiting_in]
    waiting_op = waiting[0].collective if waiting else None
    steps = collections.Counter(v.step for v in waiting if v.step is not None)
    common_step = steps.most_common(1)[0][0] if steps else None
    culprits: list[dict[str, object]] = []

    def name(v: RankView, why: str) -> None:
        culprits.append({"rank": v.rank, "host": v.host, "pid": v.pid, "why": why,
                         "frame": v.frame, "where": v.where, "state": v.state,
                         "step": v.step})

    for v in views:
        if v.state in BAD_STATES:
            name(v, f"process {BAD_STATES[v.state]}")
    for v in views:
        if v.state in BAD_STATES or waiting_in is None:
            continue
        relation = ""
        if common_step is not None and v.step is not None and v.step != common_step:
            relation = (f"{abs(common_step - v.step)} step(s) "
                        f"{'behind' if v.step < common_step else 'ahead'} of the others")
        if v.where == waiting_in:
            if relation:
                name(v, f"in the same collective but {relation}")
        elif v.collective:
            name(v, f"in another collective ({v.where}) than the others ({waiting_in})"
                 + (f", {relation}" if relation else ""))
        else:
            name(v, ("not in the collective the others wait in" if waiting_op in COLLECTIVES
                     else "not at the synchronisation the others wait at")
                 + (f" ({relation})" if relation else ""))
    found = {v.rank for v in views}
    world = max(worlds) if worlds else 0
    for rank in range(world):
        if rank not in found:
            beat = beats.get(rank) or {}
            culprits.append({"rank": rank, "host": str(beat.get("host", "")),
                             "pid": beat.get("pid", 0), "why": "process gone (no such rank "
                             "on its node)", "frame": "", "where": "", "state": "gone",
                             "step": _current_step(beat) if beat else None})
    flight_notes = _flight(dumps)
    return Diagnosis(job=job, ranks=views, waiting_in=waiting_in, culprits=culprits,
                     groups=groups, nodes=nodes, flight=flight_notes)


def _flight(dumps: dict[int, dict[str, object]]) -> list[dict[str, object]]:
    """Per process group: the ranks whose last enqueued collective is behind the others'."""
    notes: list[dict[str, object]] = []
    per_group: dict[str, dict[int, dict[str, object]]] = collections.defaultdict(dict)
    for rank, dump in dumps.items():
        if "error" in dump:
            notes.append({"rank": rank, "text": f"rank {rank}: {dump['error']}"})
            continue
        for pg, summary in (dump.get("groups") or {}).items():  # type: ignore[union-attr]
            per_group[pg][rank] = summary
    for pg, ranks in sorted(per_group.items()):
        top = max(int(s["last_enqueued"]) for s in ranks.values())  # type: ignore[call-overload]
        ahead = next(r for r, s in ranks.items() if s["last_enqueued"] == top)
        for rank, s in sorted(ranks.items()):
            if int(s["last_enqueued"]) < top:  # type: ignore[call-overload]
                notes.append({"rank": rank, "group": pg, "last": s["last_enqueued"],
                              "others": top, "text": (
                                  f"process group {pg}: rank {rank} last enqueued collective "
                                  f"#{s['last_enqueued']} ({s['op']}, {s['frame'] or '?'}); "
                                  f"rank {ahead} reached #{top} ({ranks[ahead]['op']})")})
    return notes


def collector_command(job_id: str, python: str | None = None,
                      progress_dir: str | None = None,
                      flight_prefix: str | None = None) -> list[str]:
    """The collector each node runs, in the one ``srun --overlap`` step of ``diagnose``
    (slurm/steps.overlap_step: one task per node)."""
    argv = [python or sys.executable, "-m", "slurmfabric.progress.collect", job_id]
    if progress_dir:
        argv += ["--progress-dir", progress_dir]
    if flight_prefix:
        argv += ["--flight-prefix", flight_prefix]
    return argv


def parse_output(text: str) -> list[dict[str, object]]:
    """The collectors' records: framed (``progress.frames``, any size) or whole JSON lines,
    with or without srun's ``--label`` prefix (``N: ``)."""
    from slurmfabric.progress import frames

    framed, lines = frames.reassemble(text)
    records = []
    for body in [*framed, *lines]:
        try:
            record = json.loads(body)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") in ("rank", "node"):
            records.append(record)
    return records


def _node_count(job_id: str, env: dict[str, str] | None, cluster: str | None) -> int | None:
    """The job's NumNodes from scontrol; None when it cannot say (srun then decides)."""
    from slurmfabric.errors import SlurmfabricError
    from slurmfabric.slurm import cmd

    try:
        record = cmd.job(job_id, env=env, cluster=cluster)
    except (SlurmfabricError, OSError):
        return None
    count = str(record.get("NumNodes", "")).split("-")[0]
    return int(count) if count.isdigit() and int(count) > 0 else None


def diagnose(job_id: str, cluster: str | None = None, timeout: float = 60.0,
             progress_dir: str | None = None, flight_prefix: str | None = None,
             env: dict[str, str] | None = None) -> Diagnosis:
    """Run the collector step on the job's nodes and analyse what it printed."""
    from slurmfabric.slurm import steps

    done = steps.overlap_step(
        job_id, collector_command(job_id, progress_dir=progress_dir,
                                  flight_prefix=flight_prefix),
        timeout=timeout, cluster=cluster, nodes=_node_count(job_id, env, cluster),
        job_name="slurmfabric-diagnose", env=env)
    records = parse_output(done.stdout)
    if not records and done.returncode != 0:
        raise SlurmCommandError(f"srun failed: {(done.stderr or '').strip() or done.returncode}")
    return analyse(job_id, records)
