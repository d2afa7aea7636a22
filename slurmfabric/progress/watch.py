"""Hang and straggler detection from the ranks' heartbeats (``slurmfabric.progress``).

``Watch.observe(beats, now)`` is called periodically (every few seconds) by whoever
watches the job (the batch-shell supervisor, a CLI) with every rank's latest beat; it
keeps a short history and returns the findings that are new:

- ``hang``: no rank advanced for longer than ``timeout`` (the ranks behind the others'
  position are named: a rank still computing while the others entered the step's
  communication is the one they wait for), or one rank has not advanced for ``timeout``
  while the others moved past it. When every rank stopped at the same point the beats
  cannot tell which one holds the others: the finding says so, and the stack diagnosis
  (``slurmfabric.progress.diagnose``) names it.
- ``slow``: a rank whose compute time per step became at least ``slow_ratio`` times its
  own baseline ratio to its peers (the median of its first ``baseline_intervals``
  intervals, at least 1.0), or is at least ``imbalance`` times the median of its peers',
  as the lower quartile over the last ``window`` seconds of the per-interval ratio
  (each interval between two observations: the mean from the beats' running sums, so an
  interval longer than a step loses nothing), at ``persist`` consecutive observations;
  cleared after ``persist`` observations below. The ratio per interval cancels stalls that
  hit every rank alike (a checkpoint, a garbage collection); the lower quartile over
  intervals and the persistence keep it quiet on jitter, on a few slow steps and on a
  burst shorter than half the window. A 30% slowdown is reported after about three
  quarters of the window plus ``persist`` observations (45 s with the defaults, observing
  every 5 s).
- ``input`` (``Watch.inputs``, not part of ``observe``: nothing restarts for it): a rank
  that waits for its next batch at least ``input_share`` of its steps' wall time over the
  last ``window`` seconds (from the beats' running sums of data wait and step time). Its
  node is input-bound: a slow loader or data mount on that node, not the network. Its
  peers' compute is not slower: they wait for it inside the collectives, so ``slow``
  cannot see it and the data share is what names it. When every rank waits alike the
  whole job is input-bound (a shared file system, too few loader workers).

Output: ``Finding.log_line()`` for the job log, ``prom_text()`` for node_exporter's textfile
collector, ``Finding.to_dict()`` for JSON. Standard library only.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import deque
from dataclasses import asdict, dataclass, field

from slurmfabric._common import prom

MAX_BEAT = 4096


@dataclass(frozen=True)
class Beat:
    """One rank's latest heartbeat."""

    rank: int
    step: int
    phase: str  # "step": between steps; "comm": compute done, in the step's collectives
    time: float
    compute_sum: float = 0.0
    timed: int = 0
    pid: int = 0
    host: str = ""
    local: str = ""
    gpus: str = ""
    compute: float | None = None
    data_sum: float = 0.0  # the steps' wait for their next batch (progress.step)
    wall_sum: float = 0.0  # those steps' wall time
    data_timed: int = 0

    @property
    def position(self) -> int:
        """Order of progress: step N's communication comes after step N's beat."""
        return 2 * self.step + (1 if self.phase == "comm" else 0)

    @property
    def gpu(self) -> str:
        """The GPU this rank drives, as far as its environment tells."""
        devices = [d for d in self.gpus.split(",") if d]
        if len(devices) == 1:
            return devices[0]
        if self.local.isdigit() and int(self.local) < len(devices):
            return devices[int(self.local)]
        return self.local


def parse_beat(text: str) -> Beat | None:
    """A beat from a record's text, or None when it does not parse (a write caught
    half done, a foreign file)."""
    try:
        data = json.loads(text)
        return Beat(rank=int(data["rank"]), step=int(data["step"]),
                    phase=str(data.get("phase", "step")), time=float(data["time"]),
                    compute_sum=float(data.get("compute_sum") or 0.0),
                    timed=int(data.get("timed") or 0), pid=int(data.get("pid") or 0),
                    host=str(data.get("host", "")), local=str(data.get("local", "")),
                    gpus=str(data.get("gpus", "")),
                    compute=None if data.get("compute") is None else float(data["compute"]),
                    data_sum=float(data.get("data_sum") or 0.0),
                    wall_sum=float(data.get("wall_sum") or 0.0),
                    data_timed=int(data.get("data_timed") or 0))
    except (ValueError, KeyError, TypeError):
        return None


def read_beats(directory: str) -> dict[int, Beat]:
    """Every rank's beat in ``directory`` (``rank-<R>.beat``); unreadable ones are left
    out, and read once more (a write caught half done parses on the second read)."""
    beats: dict[int, Beat] = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return beats
    for name in names:
        if not (name.startswith("rank-") and name.endswith(".beat")):
            continue
        for _ in range(2):
            try:
                with open(os.path.join(directory, name), "rb") as handle:
                    text = handle.read(MAX_BEAT).decode("utf-8", "replace")
            except OSError:
                break
            beat = parse_beat(text)
            if beat is not None:
                beats[beat.rank] = beat
                break
    return beats


@dataclass
class Finding:
    """A hang or a slow rank. ``ranks`` are the culprits (empty: not known from beats)."""

    kind: str  # "hang" | "slow"
    ranks: list[dict[str, object]]
    detail: str
    time: float
    # what saw it: "heartbeats" (the ranks' beats) or "log_silence" (no beats, and the
    # launch printed nothing for the hang timeout: restart.hang.LogSilence)
    signal: str = "heartbeats"
    # when the stall began (the last beat that advanced, the last output): a hang's time
    # lost starts here, not when it was noticed
    since: float | None = None

    def log_line(self) -> str:
        named = "; ".join(
            f"rank {r['rank']} on {r['host'] or '?'} (pid {r['pid']}, gpu {r['gpu'] or '?'}, "
            f"step {r['step']}{', ' + str(r['why']) if r.get('why') else ''})"
            for r in self.ranks)
        return (f"slurmfabric: {self.kind}: {self.detail}" + (f": {named}" if named else "")
                + f" [signal: {self.signal}]")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _who(beat: Beat, **more: object) -> dict[str, object]:
    return {"rank": beat.rank, "host": beat.host, "pid": beat.pid, "gpu": beat.gpu,
            "step": beat.step, "phase": beat.phase, **more}


@dataclass
class Watch:
    """Decides hangs and slow ranks from successive observations of the beats."""

    timeout: float = 300.0
    slow_ratio: float = 1.10  # against the rank's own baseline: it became slower
    window: float = 40.0
    persist: int = 3
    min_intervals: int = 4
    # the first intervals set each rank's baseline ratio to its peers (at least 1.0): a
    # rank that always ran a little slower (pinned beside another rank on a shared core:
    # 1.12-1.17x on the testbed, issue 45) is not slow, one that became slower is; a rank
    # at least ``imbalance`` x its peers is reported whatever its baseline
    baseline_intervals: int = 3
    imbalance: float = 1.25
    baselines: dict[int, float] = field(default_factory=dict)
    early: dict[int, list[float]] = field(default_factory=dict)
    last: dict[int, tuple[float, int]] = field(default_factory=dict)
    history: dict[int, deque[tuple[float, float, float]]] = field(default_factory=dict)
    streak: dict[int, int] = field(default_factory=dict)
    calm: dict[int, int] = field(default_factory=dict)
    slow: set[int] = field(default_factory=set)
    hung: bool = False
    ratios: dict[int, float] = field(default_factory=dict)
    per_step: dict[int, float] = field(default_factory=dict)
    # the data-loading share (``inputs``): a rank waiting this share of its steps for
    # data is input-bound
    input_share: float = 0.25
    data_last: dict[int, tuple[float, float]] = field(default_factory=dict)
    data_history: dict[int, deque[tuple[float, float, float]]] = field(default_factory=dict)
    shares: dict[int, float] = field(default_factory=dict)
    input_bound: set[int] = field(default_factory=set)

    def observe(self, beats: dict[int, Beat], now: float) -> list[Finding]:
        """The findings that are new at ``now`` (each is reported once, again only
        after it cleared)."""
        return self._hang(beats, now) + self._slow(beats, now)

    def _hang(self, beats: dict[int, Beat], now: float) -> list[Finding]:
        if not beats:
            return []
        newest = max(b.time for b in beats.values())
        top = max(b.position for b in beats.values())
        found: Finding | None = None
        if now - newest > self.timeout:
            low = min(b.position for b in beats.values())
            behind = [b for b in beats.values() if b.position == low] if low < top else []
            quiet = f"no rank advanced for {now - newest:.0f} s"
            if behind:
                found = Finding("hang", [_who(b, why=_why(b, top)) for b in behind],
                                quiet + "; the others wait for", now, since=newest)
            else:
                step = next(iter(beats.values())).step
                found = Finding("hang", [], quiet + f"; every rank stopped at the same point "
                                f"(step {step}): run `slurmfabric jobs diagnose` to name "
                                "the rank the others wait for", now, since=newest)
        else:
            stale = [b for b in beats.values()
                     if now - b.time > self.timeout and b.position < top]
            if stale:
                found = Finding("hang", [_who(b, why=f"no beat for {now - b.time:.0f} s")
                                         for b in stale],
                                "the others advanced and these did not", now,
                                since=min(b.time for b in stale))
        if found is None:
            self.hung = False
            return []
        if self.hung:
            return []
        self.hung = True
        return [found]

    def _slow(self, beats: dict[int, Beat], now: float) -> list[Finding]:
        # per interval between two observations: each rank's mean compute per step over
        # that interval, divided by the median of its peers' over the same interval. A
        # change that hits every rank (a checkpoint stall, another phase of training)
        # cancels in the ratio; the lower quartile of the ratios over the window ignores a
        # few slow steps (a data-loader hiccup) and a burst shorter than half the window.
        means: dict[int, float] = {}
        for rank, beat in beats.items():
            before = self.last.get(rank)
            if before is not None and beat.timed > before[1]:
                means[rank] = (beat.compute_sum - before[0]) / (beat.timed - before[1])
            self.last[rank] = (beat.compute_sum, beat.timed)
        for rank, mine in means.items():
            peers = [v for r, v in means.items() if r != rank]
            median = statistics.median(peers) if peers else 0.0
            if median > 0:
                self.history.setdefault(rank, deque()).append((now, mine / median, mine))
                self._baseline(rank, mine / median)
        self.ratios, self.per_step = {}, {}
        new: list[Finding] = []
        for rank, samples in self.history.items():
            while samples and samples[0][0] <= now - self.window:
                samples.popleft()
            if len(samples) < self.min_intervals or rank not in beats:
                continue
            # the lower quartile: three quarters of the window's intervals are at least
            # this slow, which a few unlucky steps in a row do not reach
            ratio = sorted(r for _, r, _ in samples)[len(samples) // 4]
            self.ratios[rank] = ratio
            self.per_step[rank] = statistics.median(m for _, _, m in samples)
            if rank not in means:
                continue  # no new interval: nothing new to count
            base = self.baselines.get(rank)
            above = ratio >= self.imbalance or (base is not None
                                                and ratio / base >= self.slow_ratio)
            self.streak[rank] = self.streak.get(rank, 0) + 1 if above else 0
            self.calm[rank] = 0 if above else self.calm.get(rank, 0) + 1
            if self.streak[rank] >= self.persist and rank not in self.slow:
                self.slow.add(rank)
                mine = self.per_step[rank]
                own = f" ({ratio / base:.2f}x its own baseline {base:.2f}x)" if base else ""
                new.append(Finding(
                    "slow", [_who(beats[rank], why=f"{ratio:.2f}x",
                                  compute_per_step=round(mine, 6))],
                    f"compute time per step {mine:.4f} s is {ratio:.2f}x the median of its "
                    f"{len(beats) - 1} peers{own} over the last {self.window:.0f} s", now))
            elif self.calm[rank] >= self.persist:
                self.slow.discard(rank)
        return new


    def inputs(self, beats: dict[int, Beat], now: float) -> list[Finding]:
        """The ranks newly input-bound at ``now``: each rank's share of step time spent
        waiting for its next batch over the window (``shares``), from the growth of its
        beats' running sums between observations."""
        for rank, beat in beats.items():
            before = self.data_last.get(rank)
            self.data_last[rank] = (beat.data_sum, beat.wall_sum)
            if before is not None and beat.wall_sum > before[1]:
                self.data_history.setdefault(rank, deque()).append(
                    (now, beat.data_sum - before[0], beat.wall_sum - before[1]))
        self.shares = {}
        for rank, samples in self.data_history.items():
            while samples and samples[0][0] <= now - self.window:
                samples.popleft()
            wall = sum(w for _, _, w in samples)
            if len(samples) >= self.min_intervals and wall > 0 and rank in beats:
                self.shares[rank] = min(1.0, sum(d for _, d, _ in samples) / wall)
        high = {r for r, share in self.shares.items() if share >= self.input_share}
        new = sorted(high - self.input_bound)
        self.input_bound = high
        if not new:
            return []
        named = [_who(beats[r], why=f"{self.shares[r]:.0%} of each step waiting for data",
                      data_share=round(self.shares[r], 4)) for r in new]
        span = f"over the last {self.window:.0f} s"
        if high == set(self.shares):
            low, top = min(self.shares.values()), max(self.shares.values())
            return [Finding("input", named, (
                f"every rank waits for its next batch {low:.0%}-{top:.0%} of each step "
                f"{span}: the job is input-bound (data loading or storage), not "
                "network-bound"), now)]
        hosts = sorted({beats[r].host or "?" for r in new})
        others = [v for r, v in self.shares.items() if r not in high]
        return [Finding("input", named, (
            f"input-bound node(s) {', '.join(hosts)}: their ranks wait for their next batch "
            f"{max(self.shares[r] for r in new):.0%} of each step {span}, the other ranks "
            f"{statistics.median(others):.0%}; the others wait for them in the collectives: "
            "a slow loader or data mount on those nodes, not the network"), now)]

    def _baseline(self, rank: int, ratio: float) -> None:
        """The median of a rank's first ``baseline_intervals`` ratios, at least 1.0 (a
        rank faster than its peers is not excused for becoming as fast as them)."""
        if rank in self.baselines:
            return
        first = self.early.setdefault(rank, [])
        first.append(ratio)
        if len(first) >= self.baseline_intervals:
            self.baselines[rank] = max(1.0, statistics.median(first))
            del self.early[rank]


def _why(beat: Beat, top: int) -> str:
    if beat.phase == "step" and top == beat.position + 1:
        return "still computing while the others entered the step's collectives"
    return f"{(top - beat.position + 1) // 2} step(s) behind"


def prom_text(watch: Watch, beats: dict[int, Beat], job: str, now: float) -> str:
    """The Prometheus textfile: per rank step, beat age, compute per step and ratio to
    peers, and whether it is reported slow; the job's hang flag."""
    lines = [
        "# HELP slurmfabric_progress_step Last step the rank reported.",
        "# TYPE slurmfabric_progress_step gauge",
        "# HELP slurmfabric_progress_beat_age_seconds Seconds since the rank's last beat.",
        "# TYPE slurmfabric_progress_beat_age_seconds gauge",
        "# HELP slurmfabric_progress_compute_seconds Compute seconds per step over the window.",
        "# TYPE slurmfabric_progress_compute_seconds gauge",
        "# HELP slurmfabric_progress_slow_ratio Compute per step over the peers' median.",
        "# TYPE slurmfabric_progress_slow_ratio gauge",
        "# HELP slurmfabric_progress_straggler 1 while the rank is reported slow.",
        "# TYPE slurmfabric_progress_straggler gauge",
        "# HELP slurmfabric_progress_data_share Share of step time waiting for the next batch.",
        "# TYPE slurmfabric_progress_data_share gauge",
    ]
    for rank in sorted(beats):
        beat = beats[rank]
        tag = prom.labels(job=job, rank=str(rank), host=beat.host, gpu=beat.gpu)
        lines.append(f"slurmfabric_progress_step{tag} {beat.step}")
        lines.append(f"slurmfabric_progress_beat_age_seconds{tag} {max(0.0, now - beat.time):.3f}")
        if rank in watch.per_step:
            lines.append(f"slurmfabric_progress_compute_seconds{tag} {watch.per_step[rank]:.6f}")
        if rank in watch.ratios:
            lines.append(f"slurmfabric_progress_slow_ratio{tag} {watch.ratios[rank]:.4f}")
        lines.append(f"slurmfabric_progress_straggler{tag} {int(rank in watch.slow)}")
        if rank in watch.shares:
            lines.append(f"slurmfabric_progress_data_share{tag} {watch.shares[rank]:.4f}")
    lines += ["# HELP slurmfabric_progress_hang 1 while the job is reported hung.",
              "# TYPE slurmfabric_progress_hang gauge",
              f"slurmfabric_progress_hang{prom.labels(job=job)} {int(watch.hung)}"]
    return "\n".join(lines) + "\n"


def observe(directory: str, seconds: float, every: float = 5.0, watch: Watch | None = None,
            clock=None, sleep=None) -> tuple[Watch, dict[int, Beat], list[Finding]]:
    """Watch ``directory`` for ``seconds`` (one look every ``every``): what ``jobs
    stragglers`` prints. Returns the watch (its per-rank ratios), the last beats and every
    finding."""
    import time

    clock, sleep = clock or time.time, sleep or time.sleep
    watch = watch or Watch(window=max(every * 4, min(seconds, 40.0)))
    found: list[Finding] = []
    end = clock() + seconds
    while True:
        beats = read_beats(directory)
        now = clock()
        found += watch.observe(beats, now) + watch.inputs(beats, now)
        if clock() + every > end:
            return watch, beats, found
        sleep(every)


def node_shares(watch: Watch, beats: dict[int, Beat]) -> dict[str, dict[str, object]]:
    """Per node: its ranks, their mean data-loading share, and whether it is input-bound
    (one of its ranks is): what ``jobs stragglers`` prints per node."""
    nodes: dict[str, dict[str, object]] = {}
    for rank in sorted(beats):
        node = nodes.setdefault(beats[rank].host or "?", {"ranks": [], "shares": []})
        node["ranks"].append(rank)  # type: ignore[union-attr]
        if rank in watch.shares:
            node["shares"].append(watch.shares[rank])  # type: ignore[union-attr]
    out: dict[str, dict[str, object]] = {}
    for host, node in nodes.items():
        shares = node["shares"]
        out[host] = {"ranks": node["ranks"],
                     "data_share": round(statistics.mean(shares), 4) if shares else None,
                     "input_bound": any(r in watch.input_bound for r in node["ranks"])}
    return out
