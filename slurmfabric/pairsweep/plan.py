"""Node-pair sweep: a round-robin schedule and the one sbatch script that runs it.

Every pair of nodes runs the bandwidth test once; within a round each node is in at most
one pair, so the pairs of a round run at the same time without sharing a NIC. The circle
method gives N-1 rounds for even N and N rounds (one node sitting out each round) for odd N.

The script records, per pair, the test's output (``<a>+<b>.out``), its exit code (``.rc``)
and one line per task with the node it really ran on (``.tasks``), so the report checks
the schedule from what happened, not from what was planned. The script is rendered from
templates/pairs.sh.j2 by render.environment(), whose quoting guard every value passes.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from slurmfabric import __version__
from slurmfabric.errors import UsageError
from slurmfabric.pairsweep.batch import group_name

Pair = tuple[str, str]
PLAN_FILE = "plan.json"
_SAFE_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

DEFAULT_COMMAND = ["all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "1"]


def round_robin(nodes: list[str]) -> list[list[Pair]]:
    """Circle method: fix the first node, rotate the others; a bye slot for odd N."""
    if len(set(nodes)) != len(nodes):
        raise UsageError(f"duplicate node names in {nodes}", hint="list each node once")
    if len(nodes) < 2:
        raise UsageError("a pair sweep needs at least 2 nodes")
    slots: list[str | None] = list(nodes) + ([None] if len(nodes) % 2 else [])
    n = len(slots)
    rounds = []
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = slots[i], slots[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((a, b))
        rounds.append(pairs)
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return rounds


def schedule_pairs(pairs: list[Pair]) -> list[list[Pair]]:
    """Rounds for a chosen subset of pairs: greedy, each node at most once per round."""
    rounds: list[list[Pair]] = []
    busy: list[set[str]] = []
    seen = set()
    for a, b in pairs:
        if a == b:
            raise UsageError(f"pair {a}:{b} names the same node twice")
        key = frozenset((a, b))
        if key in seen:
            continue
        seen.add(key)
        for i, used in enumerate(busy):
            if a not in used and b not in used:
                rounds[i].append((a, b))
                used.update((a, b))
                break
        else:
            rounds.append([(a, b)])
            busy.append({a, b})
    return rounds


def parse_pairs(text: str) -> list[Pair]:
    """``a:b,c:d`` -> [(a, b), (c, d)]."""
    pairs = []
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        a, sep, b = item.partition(":")
        if not sep or not a or not b:
            raise UsageError(f"--pairs item {item!r} is not NODE:NODE", hint="e.g. n1:n2,n3:n4")
        pairs.append((a, b))
    return pairs


@dataclass
class SweepPlan:
    """Everything the job needs; written to ``plan.json`` beside the results."""

    nodes: list[str]
    rounds: list[list[Pair]]
    results: Path
    command: list[str] = field(default_factory=lambda: list(DEFAULT_COMMAND))
    partition: str | None = None
    time_limit: str | None = None
    tasks_per_node: int = 1
    gpus_per_node: int | None = None
    mpi: str | None = None
    srun_args: list[str] = field(default_factory=list)
    sbatch_args: list[str] = field(default_factory=list)
    job_name: str = "sf-pairs"
    created: float = field(default_factory=time.time)
    # Burn-in: argv run once per node before the pairs ("slurmfabric health burn-in ...");
    # each node writes gpu-<node>.json into the results, which 'pairs report' judges.
    gpu_stage: list[str] | None = None
    # Retest passes after the rounds (``pairs retest-plan`` decides each pass's pairs) and
    # how a pair is judged, in the job and in 'pairs report' alike.
    retests: int = 0
    judge: dict = field(default_factory=dict)  # {"reference", "threshold", "expected"}
    retest_cmd: list[str] | None = None  # the slurmfabric executable's argv prefix
    test: str = "nccl-tests"  # or a perftest tool run per rail by 'pairs rdma-step'
    # "k-batch": each round's items are groups of k nodes (pairsweep/batch.py), not pairs.
    pattern: str = "round-robin"

    def __post_init__(self) -> None:
        for node in self.nodes:
            if not _SAFE_NODE.match(node):
                raise UsageError(f"node name {node!r} cannot be used in result file names")
        if re.search(r"[\s'\"\\$`]", str(self.results)):
            raise UsageError(
                f"results directory {str(self.results)!r} has spaces or quotes",
                hint="#SBATCH lines cannot carry them reliably; choose a plain path",
            )
        if not self.results.is_absolute():
            raise UsageError(
                f"results directory {self.results} must be absolute",
                hint="it is read and written on the compute nodes; use a shared path",
            )
        if self.tasks_per_node < 1:
            raise UsageError("--tasks-per-node must be at least 1")

    @property
    def pairs(self) -> list[Pair]:
        return [p for rnd in self.rounds for p in rnd]

    def to_json(self) -> str:
        return json.dumps({
            "version": 1, "generator": f"slurmfabric {__version__}", "nodes": self.nodes,
            "rounds": [[list(p) for p in rnd] for rnd in self.rounds],
            "command": self.command, "tasks_per_node": self.tasks_per_node,
            "created": self.created, "gpu_stage": self.gpu_stage, "retests": self.retests,
            "judge": self.judge, "test": self.test, "pattern": self.pattern,
        }, indent=2)


def pair_base(results: Path, round_index: int, pair: Pair) -> Path:
    """Where one pair's files live: ``round-01/sfn1+sfn2``."""
    return results / f"round-{round_index + 1:02d}" / f"{pair[0]}+{pair[1]}"


# One line per task before and after the command: "<procid> <node> <step> start|end <t> [rc]".
# A fixed literal: the job's values reach it only as positional arguments ($0, "$@"). The
# command runs through exec in a subshell, so its name is always a program: never a builtin
# ('eval' would run its arguments as code), a function, or, where /bin/sh is bash, the 'fg'
# that a leading '%' means (bash manual, "Job Control Basics").
_TASK_WRAPPER = (
    'echo "$SLURM_PROCID ${SLURMD_NODENAME:-$(hostname -s)} ${SLURM_STEP_ID:-?} start '
    '$(date +%s.%N)" >> "$0"; (exec "$@"); rc=$?; '
    'echo "$SLURM_PROCID ${SLURMD_NODENAME:-$(hostname -s)} ${SLURM_STEP_ID:-?} end '
    '$(date +%s.%N) $rc" >> "$0"; exit $rc'
)


def render_script(plan: SweepPlan) -> str:
    """The sbatch script: rounds of concurrent two-node steps, then ``wait``. Rendered by
    the same Jinja environment as every job script (templates/pairs.sh.j2): each value
    passes a quoting filter, and an ``--sbatch-arg`` that is not one plain option is refused
    (exit 2) like any ``#SBATCH`` value."""
    from slurmfabric.job.render import environment
    from slurmfabric.slurm import steps

    directives = [*steps.pinned_job_options(
        plan.nodes, job_name=plan.job_name, tasks_per_node=plan.tasks_per_node,
        output=plan.results / "job-%j.out", partition=plan.partition,
        time_limit=plan.time_limit, gpus_per_node=plan.gpus_per_node), *plan.sbatch_args]
    step = [*steps.exact_step_options(2, plan.tasks_per_node,
                                      gpus_per_node=plan.gpus_per_node, mpi=plan.mpi),
            *plan.srun_args]
    batch = plan.pattern == "k-batch"
    rounds = [{"tag": f"{i + 1:02d}", "pairs": [] if batch else rnd,
               "groups": [(group_name(j), len(g), ",".join(g)) for j, g in enumerate(rnd)]
               if batch else [],
               "banner": f"round {i + 1:02d}: " + (
                   f"{len(rnd)} groups" if batch else " ".join(f"{a}+{b}" for a, b in rnd))}
              for i, rnd in enumerate(plan.rounds)]
    group_step = step[2:]  # run_group gives --nodes and --ntasks per group
    gpu_step = ["--nodes", str(len(plan.nodes)),
                *steps.exact_step_options(None, 1, gpus_per_node=plan.gpus_per_node)]
    text = environment().get_template("pairs.sh.j2").render(
        plan=plan, directives=directives, step=step, rounds=rounds, gpu_step=gpu_step,
        group_step=group_step,
        retest_cmd=[*(plan.retest_cmd or ["slurmfabric"]), "pairs", "retest-plan",
                    str(plan.results)],
        task_wrapper=_TASK_WRAPPER, plan_file=str(plan.results / PLAN_FILE),
        version=__version__)
    return text.rstrip("\n") + "\n"


def write_plan(plan: SweepPlan) -> Path:
    plan.results.mkdir(parents=True, exist_ok=True)
    path = plan.results / PLAN_FILE
    path.write_text(plan.to_json() + "\n")
    return path


def _plan_problem(data: object) -> str | None:
    """What makes ``data`` something 'pairs submit' never writes, or None. The report builds
    file names from the node names and indexes its tables by them, so each must be a plain
    name listed once, and every pair or group must name listed nodes only."""
    from slurmfabric._common.textcheck import one_line

    def show(value: object) -> str:
        return one_line(repr(value), 80)

    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or len(nodes) < 2:
        return f"'nodes' is {show(nodes)}, not a list of at least 2 node names"
    for node in nodes:
        if not isinstance(node, str) or not _SAFE_NODE.fullmatch(node):
            return (f"node {show(node)} is not a node name (letters, digits, '.', '_', '-'; "
                    "it names result files)")
    if len(set(nodes)) != len(nodes):
        return f"node {show(next(n for n in nodes if nodes.count(n) > 1))} is listed twice"
    pattern = data.get("pattern")
    if pattern not in (None, "round-robin", "k-batch"):
        return f"'pattern' is {show(pattern)}, not 'round-robin' or 'k-batch'"
    rounds = data.get("rounds", [])
    if not isinstance(rounds, list) or not all(isinstance(r, list) for r in rounds):
        return f"'rounds' is {show(rounds)[:60]}, not a list of rounds (lists)"
    known = set(nodes)
    for number, rnd in enumerate(rounds, 1):
        for item in rnd:
            size_ok = isinstance(item, list) and (
                len(item) >= 2 if pattern == "k-batch" else len(item) == 2)
            if not size_ok:
                want = "2 or more" if pattern == "k-batch" else "2"
                return f"round {number}: {show(item)} is not a list of {want} nodes"
            unknown = [n for n in item if not isinstance(n, str) or n not in known]
            if unknown:
                return f"round {number}: node {show(unknown[0])} is not in 'nodes'"
            if len(set(item)) != len(item):
                return f"round {number}: {show(item)} names a node twice"
    for key in ("test", "gpu_stage", "judge"):
        value = data.get(key)
        kinds = {"test": str, "gpu_stage": list, "judge": dict}[key]
        if value is not None and not isinstance(value, kinds):
            return f"'{key}' is {show(value)}, not a {kinds.__name__}"
    judge = data.get("judge") or {}
    if judge.get("reference") not in (None, "median", "best"):
        return f"judge 'reference' is {show(judge.get('reference'))}, not 'median' or 'best'"
    for key, top in (("threshold", 1.0), ("expected", 1e6)):
        value = judge.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value <= top):
            return f"judge '{key}' is {show(value)}, not a number in (0, {top:g}]"
    return None


def read_plan(results: Path) -> dict:
    """The sweep's plan.json, its shape checked: a one-line UsageError naming the file and
    what is wrong, never an exception from deep inside the report."""
    from slurmfabric._common.inputfile import read_json

    path = results / PLAN_FILE
    if not results.is_dir():
        raise UsageError(f"{results}: not a directory",
                         hint="pass the results directory given to 'pairs submit'")
    data = read_json(str(path), "pair plan")
    problem = _plan_problem(data)
    if problem:
        raise UsageError(f"pair plan {path}: {problem}",
                         hint="use the plan.json that 'pairs submit' wrote into the results")
    data["rounds"] = [[tuple(p) for p in rnd] for rnd in data.get("rounds", [])]
    return data
