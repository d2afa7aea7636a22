"""Start-up cost of ``slurmfabric env`` / ``launch -- true`` vs a bare interpreter.

Runs each command N times in subprocesses (same venv) and prints medians and ratios for
a 2-node and a 10,000-node SLURM_JOB_NODELIST, and for the 2-node case on a GPU/RDMA node
where the fabric plan runs, also as a torchrun worker (``launch --mode torchrun`` under
torchrun's variables), as an Open MPI rank (``launch --mode mpi``) and on a RoCE node: the
cost each worker or rank pays for its plan and binding. Each plan row runs three ways:
``cache off`` (SLURMFABRIC_PLAN_CACHE=off: discover and plan in every rank), ``cold`` (the
per-boot plan cache, rank/plancache.py, emptied before every run: the first rank of a step
on a node) and ``warm`` (every other rank). SLURMFABRIC_SYSFS_ROOT points at the 8-GPU H100
fixture trees (tests/fakesysfs.py + tests/fixtures/topology/nodes.py: h100_ib and
h100_roce_numa_off). With that variable set, env and launch always discover and plan (the
/dev/nvidiactl + /sys/class/infiniband gate is only for the real root), and the script
checks that NCCL_IB_HCA really came out. Bytecode is compiled first, as it is on an
installed system.

Every row runs two ways, interleaved in the same rounds as the bare ``python -c pass``:
``srun execs``, the installed ``slurmfabric`` command, exactly what the rendered scripts run
on each rank (``srun ... slurmfabric launch --mode srun -- CMD``), and ``direct``,
``python -c 'from slurmfabric import cli; cli.run()'``: slurmfabric's own cost without the
installer's script. The entry point alone (``--version``) also runs as ``python -m
slurmfabric`` (runpy's cost). The command is the ``slurmfabric`` next to this interpreter,
else on PATH, else the path given.

    .venv/bin/python benchmarks/bench_startup.py [N] [PATH-OF-slurmfabric]
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

N = int(sys.argv[1]) if len(sys.argv) > 1 else 40
SCRIPT = sys.argv[2] if len(sys.argv) > 2 else None
PY = sys.executable
TESTS = Path(__file__).resolve().parents[1] / "tests"


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


QUIET = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "check": True}
COLD_CACHE = "BENCH_COLD_CACHE"  # read by medians_ms only; slurmfabric ignores it


def medians_ms(cases: list[tuple[list[str], dict[str, str]]]) -> list[tuple[float, float]]:
    """Median wall time and median CPU time (user + system, getrusage(2) RUSAGE_CHILDREN) of
    each (command, environment), in rounds that run every case once.

    Interleaving keeps the ratios honest on a shared machine: a burst of load hits every
    case of a round instead of whichever case happened to be running. CPU time is what the
    start costs the node; on a loaded machine it moves much less than wall time. stderr is
    dropped. A case whose environment has COLD_CACHE gets its plan cache emptied before each
    run (not timed).
    """
    for cmd, env in cases:
        subprocess.run(cmd, env=env, **QUIET)  # warm + .pyc
    wall: list[list[float]] = [[] for _ in cases]
    cpu: list[list[float]] = [[] for _ in cases]
    for _ in range(N):
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


def srun_command() -> list[str]:
    """The ``slurmfabric`` a rank runs: next to this interpreter (a venv), else on PATH."""
    script = SCRIPT or str(Path(PY).parent / "slurmfabric")
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


def main() -> None:
    two = step_env("gpu[001-002]", 2)
    # 10,000 nodes written the way Slurm would compress a scattered allocation
    scattered = ",".join(f"r{r:03d}n[{1:02d}-{50:02d},{52:02d}-{100:02d}]" for r in range(102))
    big = step_env(scattered, 102 * 99)
    entries = {"srun execs": srun_command(),
               # cli.run as the script calls it (main() for a build from before cli.run)
               "direct": [PY, "-c", "import sys; from slurmfabric import cli; "
                          "getattr(cli, 'run', lambda: sys.exit(cli.main()))()"]}
    script = entries["srun execs"]
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        planned = {**two, "SLURMFABRIC_SYSFS_ROOT": fixture_root(tmp, "h100_ib"),
                   "SLURMFABRIC_PLAN_CACHE": "off"}
        roce = {**planned, "SLURMFABRIC_SYSFS_ROOT": fixture_root(tmp, "h100_roce_numa_off")}
        for env in (planned, roce):
            out = subprocess.run([*script, "env"], env=env, capture_output=True,
                                 text=True).stdout
            assert "NCCL_IB_HCA" in out, f"the fabric plan did not run:\n{out}"
        alone = [(f"--version: {label}", cmd, two) for label, cmd in (
            ("slurmfabric (srun execs)", [*script, "--version"]),
            ("python -m slurmfabric", [PY, "-m", "slurmfabric", "--version"]),
            ("direct", [*entries["direct"], "--version"]))]
        rows = [
            (f"{name} ({label})", args, env)
            for label, env in (("2 nodes", two), (f"{102 * 99} nodes", big))
            for name, args in (("env", ["env"]), ("launch -- true", ["launch", "--", "true"]))
        ]
        worker = {**planned, "TORCHELASTIC_RUN_ID": "bench-4242", "MASTER_ADDR": "10.1.0.2",
                  "MASTER_PORT": "29500", "RANK": "8", "LOCAL_RANK": "0", "WORLD_SIZE": "16",
                  "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}
        rank = {**planned, "OMPI_COMM_WORLD_RANK": "8", "OMPI_COMM_WORLD_SIZE": "16",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
                "SLURMD_NODENAME": "gpu002", "SLURMFABRIC_ALLOW_LOOPBACK": "1"}
        modes = [("env", ["env"], planned), ("launch -- true", ["launch", "--", "true"], planned)]
        for label, mode, env in (("torchrun worker", "torchrun", worker),
                                 ("Open MPI rank", "mpi", rank)):
            probe = subprocess.run([*script, "launch", "--mode", mode, "--print", "--", "true"],
                                   env=env, capture_output=True, text=True).stdout
            assert "# binding: local_rank=0 gpu=0 nic=mlx5_0:1" in probe, probe
            modes.append((f"launch -- true ({label})", ["launch", "--mode", mode, "--", "true"],
                          env))
        modes.append(("launch -- true (RoCE node)", ["launch", "--", "true"], roce))
        for index, (name, args, env) in enumerate(modes):
            cold = os.path.join(tmp, f"cold-{index}")
            for cache, extra in (("cache off", {}),
                                 ("cold", {"SLURMFABRIC_PLAN_CACHE": cold, COLD_CACHE: "1"}),
                                 ("warm", {"SLURMFABRIC_PLAN_CACHE": os.path.join(tmp, "warm")})):
                rows.append((f"{name}, plan, {cache}", args, {**env, **extra}))
        for env in (planned, roce):
            warm = {**env, "SLURMFABRIC_PLAN_CACHE": os.path.join(tmp, "warm")}
            for _ in range(2):  # the first run writes the entry, the second reads it
                probe = subprocess.run([*script, "launch", "--print", "--", "true"], env=warm,
                                       capture_output=True, text=True).stdout
            assert "# plan: cache" in probe, probe  # the warm rows really read the cache
        cases = [([PY, "-c", "pass"], two)] + [(cmd, env) for _, cmd, env in alone]
        cases += [([*entry, *args], env) for _, args, env in rows for entry in entries.values()]
        (bare, bare_cpu), *results = medians_ms(cases)
        print(f"srun execs: {describe(script[0])}\ndirect: {' '.join(entries['direct'])}\n"
              f"medians of {N} interleaved rounds; load average {os.getloadavg()[0]:.2f}; "
              "each cell: wall ms, wall and CPU time as ratios to the bare interpreter's")

        def cell(wall: float, cpu: float) -> str:
            return f"{wall:6.1f} ms {wall / bare:5.2f}x {cpu / bare_cpu:5.2f}x"

        print(f"{'python -c pass':50} {bare:6.1f} ms (CPU {bare_cpu:.1f} ms)")
        for (label, _, _), (ms, cpu) in zip(alone, results):
            print(f"{label:50} {cell(ms, cpu)}")
        results = results[len(alone):]
        print(f"{'':50} {'srun execs: wall, CPU':>24}  {'direct: wall, CPU':>24}")
        for index, (label, _, _) in enumerate(rows):
            cells = [cell(*pair)
                     for pair in results[index * len(entries):(index + 1) * len(entries)]]
            print(f"{label:50} {'  '.join(cells)}")

if __name__ == "__main__":
    main()
