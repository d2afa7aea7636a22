"""Per-task cost of the TaskProlog on an 8-GPU / 10-NIC fixture node (HGX H100, NDR rails).

slurmstepd starts the TaskProlog before every task, so its cost is paid per task. This runs
the installed script (``slurmfabric site install``: /bin/sh, then Python -I straight into
the TaskProlog) as slurmstepd would, with task 5 of a 2-node x 8-task step's environment, and
prints median / p90 wall milliseconds for: a bare Python start (``python -c pass``, the
baseline, measured in the same run), the TaskProlog with the per-boot plan cache warm
(rank/plancache.py, shared with launch and env: every task after a node's first), the first
task of a boot (cold cache: sysfs discovery and the plan),
and an opted-out job (SLURMFABRIC_TASKPROLOG=off: the shell returns before Python).
Ratios are to the baseline. Goal: warm cache under 2x a bare Python start. Python -I
ignores PYTHONPATH: this measures the slurmfabric installed in the interpreter's venv.
``python benchmarks/bench_taskprolog.py [runs]``
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "health"))
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "topology"))
sys.path.insert(0, str(ROOT / "tests"))
from helpers import h100_tree  # noqa: E402


def task_env(tmp: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp),
            "TMPDIR": str(tmp / "tmp"), "SLURMFABRIC_PLAN_CACHE": str(tmp / "tmp" / "cache"),
            "SLURM_JOB_ID": "4242", "SLURM_PROCID": "5",
            "SLURM_NTASKS": "16", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[001-002]",
            "SLURM_STEP_NODELIST": "gpu[001-002]", "SLURM_LOCALID": "5", "SLURM_NODEID": "0",
            "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "16",
            "SLURM_JOB_NUM_NODES": "2", "SLURM_TASKS_PER_NODE": "8(x2)",
            "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURMD_NODENAME": "gpu001"}


def measure(argv: list[str], env: dict[str, str], runs: int, cold: Path | None = None,
            ) -> list[float]:
    times = []
    for _ in range(runs):
        if cold is not None:
            shutil.rmtree(cold, ignore_errors=True)
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0 or proc.stderr:
            raise SystemExit(f"{argv} failed: {proc.stderr}")
    return sorted(times)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        h100_tree(tmp_path / "gpu001")
        hooks = tmp_path / "hooks"
        subprocess.run([str(Path(sys.executable).parent / "slurmfabric"), "site", "install",
                        str(hooks), "--sysfs-root", str(tmp_path / "{node}")], check=True,
                       capture_output=True)
        script = [str(hooks / "slurmfabric-taskprolog")]
        env = task_env(tmp_path)
        (tmp_path / "tmp").mkdir()
        check = subprocess.run(script, env=env, capture_output=True, text=True).stdout
        if "export NCCL_IB_HCA=" not in check:
            raise SystemExit(f"no plan from the TaskProlog: {check}")
        measure([sys.executable, "-c", "pass"], env, 3)  # warm the page cache
        base = measure([sys.executable, "-c", "pass"], env, runs)
        cases = [("warm cache (every task after the first)", env, None),
                 ("cold cache (a node's first task per boot)", env,
                  tmp_path / "tmp" / "cache"),
                 ("opted out (SLURMFABRIC_TASKPROLOG=off)",
                  {**env, "SLURMFABRIC_TASKPROLOG": "off"}, None)]
        print(f"TaskProlog per task, {runs} runs each (median / p90 ms, ratio to baseline)")
        median = statistics.median(base)
        print(f"  {'baseline: python -c pass':44s} {1000 * median:6.1f} / "
              f"{1000 * base[int(0.9 * (runs - 1))]:6.1f}   1.00x")
        for name, case_env, cold in cases:
            times = measure(script, case_env, runs, cold)
            med = statistics.median(times)
            print(f"  {name:44s} {1000 * med:6.1f} / {1000 * times[int(0.9 * (runs - 1))]:6.1f}"
                  f"   {med / median:.2f}x")


if __name__ == "__main__":
    main()
