"""Start-up cost of every rank's ``slurmfabric launch`` / ``env`` vs a bare interpreter.

Runs each command N times in subprocesses (same venv) and prints, for every row, medians of
wall time and of CPU time as ratios to a bare ``python -c pass`` measured in the same rounds:

- the entry point alone (``--version``), also as ``python -m slurmfabric`` (runpy's cost);
- ``env`` and ``launch -- true`` without a plan (a node with neither GPUs nor RDMA devices:
  a 2-node and a 10,098-node SLURM_JOB_NODELIST);
- with the fabric plan on the 8-GPU H100 fixture, for each launcher mode: ``env``, an srun
  task (``launch``), a torchrun worker (``launch --mode torchrun`` under torchrun's
  variables), an Open MPI rank (``launch --mode mpi``), and an srun task on a RoCE node.
  Each plan row runs three ways: ``cache off`` (SLURMFABRIC_PLAN_CACHE=off: discover and plan
  in every rank), ``cold`` (the per-boot plan cache, rank/plancache.py, emptied before every
  run: the first rank of a step on a node) and ``warm`` (every other rank).

SLURMFABRIC_SYSFS_ROOT points at the fixture trees (tests/fakesysfs.py +
tests/fixtures/topology/nodes.py: h100_ib and h100_roce_numa_off); with it set, env and
launch always discover and plan (the /dev/nvidiactl + /sys/class/infiniband gate is only
for the real root), and the script checks that NCCL_IB_HCA really came out and that the
warm rows really read the cache. Bytecode is compiled first, as on an installed system.

Every row runs two ways, interleaved in the same rounds as the bare interpreter: ``srun
execs``, the installed ``slurmfabric`` command, exactly what the rendered scripts run on
each rank (``srun ... slurmfabric launch --mode srun -- CMD``), and ``direct``, ``python -c
'from slurmfabric import cli; cli.run()'`` (slurmfabric's own cost without the installer's
script). The command is the ``slurmfabric`` next to this interpreter, else on PATH, else the
path given. It imports whichever slurmfabric the environment gives it (PYTHONPATH, else the
installed one).

``--before DIR``: another checkout (``git archive COMMIT | tar -x -C DIR``) run in the same
rounds with ``PYTHONPATH=DIR``, and this checkout with ``PYTHONPATH`` set to it: before and
after under the same load. ``--markdown``: the table as Markdown rows (docs/speed.md).
``--only warm,no plan``: only the rows whose label contains one of these (more rounds in
the same time).
The last lines say whether the goals of issue 35 hold (CPU-time medians, srun execs): a warm
cache within 1.3x of a bare interpreter for every plan row, no plan within 1.2x.

Interleaving keeps the ratios honest on a shared machine: a burst of load hits every case
of a round. CPU time (user + system of the children, getrusage(2)) moves much less than wall
time under load, so it is the column to compare.

    .venv/bin/python benchmarks/bench_startup.py [N] [PATH-OF-slurmfabric] [--before DIR]
                                                 [--markdown] [--only TEXT,...]
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
TESTS = HERE / "tests"
PY = sys.executable
GOAL_WARM, GOAL_NO_PLAN = 1.3, 1.2
QUIET = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "check": True}
COLD_CACHE = "BENCH_COLD_CACHE"  # read by medians_ms only; slurmfabric ignores it


def parse_args(argv: list[str]) -> tuple[int, str | None, str | None, bool, list[str]]:
    rounds, script, before, markdown, only = 40, None, None, False, []
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--before" and rest:
            before = str(Path(rest.pop(0)).resolve())
        elif arg == "--only" and rest:
            only = [part.strip() for part in rest.pop(0).split(",") if part.strip()]
        elif arg == "--markdown":
            markdown = True
        elif arg.isdigit():
            rounds = int(arg)
        elif not arg.startswith("-") and script is None:
            script = arg
        else:
            sys.exit(__doc__.rsplit("\n\n", 1)[-1])
    if before and not (Path(before) / "slurmfabric" / "cli.py").is_file():
        sys.exit(f"--before {before}: no slurmfabric/cli.py there")
    return rounds, script, before, markdown, only


def step_env(nodelist: str, nnodes: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MASTER_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        SLURM_JOB_ID="4242",
        SLURM_CLUSTER_NAME="bench",
        SLURM_JOB_NODELIST=nodelist,
        SLURM_JOB_NUM_NODES=str(nnodes),
        SLURM_STEP_ID="0",
        SLURM_STEP_NODELIST=nodelist,
        SLURM_STEP_NUM_NODES=str(nnodes),
        SLURM_STEP_NUM_TASKS=str(8 * nnodes),
        SLURM_STEP_TASKS_PER_NODE=f"8(x{nnodes})",
        # local rank 0: its H100-fixture CPU set (0-13,112-125) includes this machine's CPUs
        # 0-1, so sched_setaffinity succeeds here as it would on the real node.
        SLURM_PROCID="8",
        SLURM_LOCALID="0",
        SLURM_NODEID="1",
    )
    return env


def medians_ms(cases: list[tuple[list[str], dict[str, str]]],
               rounds: int) -> list[tuple[float, float]]:
    """Median wall time and median CPU time of each (command, environment), in rounds that
    run every case once. A case whose environment has COLD_CACHE gets its plan cache
    emptied before each run (not timed). stdout and stderr are dropped."""
    for cmd, env in cases:
        subprocess.run(cmd, env=env, **QUIET)  # warm + .pyc
    wall: list[list[float]] = [[] for _ in cases]
    cpu: list[list[float]] = [[] for _ in cases]
    for _ in range(rounds):
        for index, (cmd, env) in enumerate(cases):
            if env.get(COLD_CACHE):
                shutil.rmtree(env["SLURMFABRIC_PLAN_CACHE"], ignore_errors=True)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(cmd, env=env, **QUIET)
            wall[index].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[index].append(after.ru_utime + after.ru_stime - before.ru_utime
                              - before.ru_stime)
    return [(statistics.median(w) * 1e3, statistics.median(c) * 1e3)
            for w, c in zip(wall, cpu)]


def fixture_root(tmp: str, name: str) -> str:
    sys.path[:0] = [str(TESTS), str(TESTS / "fixtures" / "topology")]
    import fakesysfs
    import nodes

    return str(fakesysfs.build(getattr(nodes, name)(), os.path.join(tmp, name)))


def srun_command(script: str | None) -> list[str]:
    """The ``slurmfabric`` a rank runs: next to this interpreter (a venv), else on PATH."""
    script = script or str(Path(PY).parent / "slurmfabric")
    if not os.path.isfile(script):
        script = shutil.which("slurmfabric") or ""
    if not script:
        sys.exit("no slurmfabric command installed: pip install -e . (or give its path)")
    return [script]


def describe(script: str) -> str:
    """Which kind of script the installer wrote: an entry-point wrapper imports re first."""
    with open(script, "rb") as handle:
        head = handle.read(4096)
    kind = "entry-point wrapper (imports re)" if b"import re\n" in head else "plain script"
    return f"{script} ({kind}; {head.splitlines()[0].decode(errors='replace')})"


def rows_for(tmp: str, script: list[str]) -> list[tuple[str, list[str], dict[str, str]]]:
    """(label, arguments, environment) of every row after the bare interpreter."""
    two = step_env("gpu[001-002]", 2)
    # 10,000 nodes written the way Slurm would compress a scattered allocation
    scattered = ",".join(f"r{r:03d}n[{1:02d}-{50:02d},{52:02d}-{100:02d}]" for r in range(102))
    big = step_env(scattered, 102 * 99)
    rows: list[tuple[str, list[str], dict[str, str]]] = [("--version", ["--version"], two)]
    rows += [(f"{name}, no plan, {label}", args, env)
             for name, args in (("env", ["env"]), ("launch", ["launch", "--", "true"]))
             for label, env in (("2 nodes", two), (f"{102 * 99} nodes", big))]
    planned = {**two, "SLURMFABRIC_SYSFS_ROOT": fixture_root(tmp, "h100_ib"),
               "SLURMFABRIC_PLAN_CACHE": "off"}
    roce = {**planned, "SLURMFABRIC_SYSFS_ROOT": fixture_root(tmp, "h100_roce_numa_off")}
    worker = {**planned, "TORCHELASTIC_RUN_ID": "bench-4242", "MASTER_ADDR": "10.1.0.2",
              "MASTER_PORT": "29500", "RANK": "8", "LOCAL_RANK": "0", "WORLD_SIZE": "16",
              "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}
    rank = {**planned, "OMPI_COMM_WORLD_RANK": "8", "OMPI_COMM_WORLD_SIZE": "16",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
            "SLURMD_NODENAME": "gpu002", "SLURMFABRIC_ALLOW_LOOPBACK": "1"}
    for env in (planned, roce):
        out = subprocess.run([*script, "env"], env=env, capture_output=True, text=True).stdout
        assert "NCCL_IB_HCA" in out, f"the fabric plan did not run:\n{out}"
    modes = [("env", ["env"], planned),
             ("launch (srun task)", ["launch", "--", "true"], planned),
             ("launch (torchrun worker)", ["launch", "--mode", "torchrun", "--", "true"], worker),
             ("launch (Open MPI rank)", ["launch", "--mode", "mpi", "--", "true"], rank),
             ("launch (RoCE node)", ["launch", "--", "true"], roce)]
    for index, (name, args, env) in enumerate(modes):
        for cache, extra in (("cache off", {}),
                             ("cold", {"SLURMFABRIC_PLAN_CACHE": os.path.join(tmp, f"cold-{index}"),
                                       COLD_CACHE: "1"}),
                             ("warm", {"SLURMFABRIC_PLAN_CACHE": os.path.join(tmp, "warm")})):
            rows.append((f"{name}, plan, {cache}", args, {**env, **extra}))
    return rows


def check_rows(rows: list[tuple[str, list[str], dict[str, str]]], script: list[str]) -> None:
    """Each plan row binds local rank 0; each warm row really reads the cache."""
    for label, args, env in rows:
        if ", plan, " not in label or args[0] != "launch":
            continue
        probe = ""
        for _ in range(2):  # a warm row: the first run writes the entry, the second reads it
            probe = subprocess.run([*script, "launch", "--print", *args[1:]], env=env,
                                   capture_output=True, text=True).stdout
        assert "# binding: local_rank=0 gpu=0 nic=mlx5_0:1" in probe, (label, probe)
        if label.endswith("warm"):
            assert "# plan: cache" in probe, (label, probe)


def with_tree(env: dict[str, str], tree: str | None, tag: str) -> dict[str, str]:
    """``env`` importing slurmfabric from ``tree`` (None: as given), with its own cold
    cache directories."""
    if tree is None:
        return env
    out = {**env, "PYTHONPATH": os.pathsep.join(
        p for p in (tree, os.environ.get("PYTHONPATH", "")) if p)}
    if out.get(COLD_CACHE):
        out["SLURMFABRIC_PLAN_CACHE"] += f"-{tag}"
    return out


def main() -> None:
    rounds, script_arg, before, markdown, only = parse_args(sys.argv[1:])
    script = srun_command(script_arg)
    entries = {"srun execs": script,
               # cli.run as the script calls it (main() for a build from before cli.run)
               "direct": [PY, "-c", "import sys; from slurmfabric import cli; "
                          "getattr(cli, 'run', lambda: sys.exit(cli.main()))()"]}
    trees: dict[str, str | None] = {"": None}
    if before:
        trees = {"before": before, "after": str(HERE)}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        rows = rows_for(tmp, script)
        plain = rows[0][2]  # the 2-node step's environment, no plan
        if only:
            rows = [row for row in rows if any(part in row[0] for part in only)]
        for tag, tree in trees.items():
            check_rows([(label, args, with_tree(env, tree, tag)) for label, args, env in rows],
                       script)
        bare_env = with_tree(plain, trees[next(reversed(trees))], "bare")
        # columns: (tree, entry); the python -m row only for srun execs' column
        columns = [(tag, name) for tag in trees for name in entries]
        cases = [([PY, "-c", "pass"], bare_env)]
        cases += [([PY, "-m", "slurmfabric", "--version"], with_tree(plain, tree, tag))
                  for tag, tree in trees.items()]
        cases += [([*entries[name], *args], with_tree(env, trees[tag], tag))
                  for _, args, env in rows for tag, name in columns]
        (bare, bare_cpu), *results = medians_ms(cases, rounds)
    module_rows, results = results[:len(trees)], results[len(trees):]
    print(f"srun execs: {describe(script[0])}\ndirect: {' '.join(entries['direct'])}")
    if before:
        print(f"before: PYTHONPATH={before}\nafter: PYTHONPATH={HERE}")
    print(f"medians of {rounds} interleaved rounds; load average at the end "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; each cell: wall ms, then wall "
          "and CPU time as ratios to the bare interpreter's")
    print(f"{'python -c pass':42} {bare:6.1f} ms (CPU {bare_cpu:.1f} ms)")

    def cell(wall: float, cpu: float) -> str:
        return f"{wall:6.1f} ms {wall / bare:5.2f}x {cpu / bare_cpu:5.2f}x"

    titles = [" ".join(filter(None, column)) + ": wall, CPU" for column in columns]
    print(f"{'':42} " + "  ".join(f"{t:>24}" for t in titles))
    table: list[tuple[str, list[tuple[float, float]]]] = []
    for index, (label, _, _) in enumerate(rows):
        pairs = results[index * len(columns):(index + 1) * len(columns)]
        table.append((label, pairs))
        print(f"{label:42} " + "  ".join(cell(*pair) for pair in pairs))
    for tag, (ms, cpu) in zip(trees, module_rows):
        print(f"{'--version, python -m slurmfabric ' + tag:42} {cell(ms, cpu)}")
    if markdown:
        print("\n| row | " + " | ".join(f"{' '.join(filter(None, c))} (CPU / wall)"
                                        for c in columns) + " |")
        print("|---|" + "---|" * len(columns))
        for label, pairs in table:
            print(f"| {label} | " + " | ".join(
                f"{cpu / bare_cpu:.2f}x / {ms / bare:.2f}x" for ms, cpu in pairs) + " |")
    for position, (tag, name) in enumerate(columns):
        if name != "srun execs":
            continue
        worst_warm = max(((pairs[position][1] / bare_cpu, label) for label, pairs in table
                          if label.endswith("plan, warm")), default=(0.0, "none run"))
        worst_bare = max(((pairs[position][1] / bare_cpu, label) for label, pairs in table
                          if ", no plan, " in label), default=(0.0, "none run"))
        print(f"goal{' (' + tag + ')' if tag else ''}, srun execs, CPU: warm cache "
              f"<= {GOAL_WARM}x: {'met' if worst_warm[0] <= GOAL_WARM else 'NOT met'} "
              f"(worst {worst_warm[0]:.2f}x, {worst_warm[1]}); no plan <= {GOAL_NO_PLAN}x: "
              f"{'met' if worst_bare[0] <= GOAL_NO_PLAN else 'NOT met'} "
              f"(worst {worst_bare[0]:.2f}x, {worst_bare[1]})")


if __name__ == "__main__":
    main()
