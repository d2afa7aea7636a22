"""Start-up cost of ``slurmfabric env`` / ``launch -- true`` vs a bare interpreter.

Runs each command N times in subprocesses (same venv) and prints medians and ratios for
a 2-node and a 10,000-node SLURM_JOB_NODELIST. Bytecode is compiled first, as it is on
an installed system. Run: .venv/bin/python benchmarks/bench_startup.py [N]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 40
PY = sys.executable


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
        SLURM_PROCID="9",
        SLURM_LOCALID="1",
        SLURM_NODEID="1",
    )
    return env


def median_ms(cmd: list[str], env: dict[str, str]) -> float:
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)  # warm + .pyc
    times = []
    for _ in range(N):
        start = time.perf_counter()
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    two = step_env("gpu[001-002]", 2)
    # 10,000 nodes written the way Slurm would compress a scattered allocation
    scattered = ",".join(f"r{r:03d}n[{1:02d}-{50:02d},{52:02d}-{100:02d}]" for r in range(102))
    big = step_env(scattered, 102 * 99)
    bare = median_ms([PY, "-c", "pass"], two)
    print(f"python -c pass: {bare:.1f} ms (median of {N})")
    for label, env in (("2 nodes", two), (f"{102 * 99} nodes", big)):
        for name, cmd in (
            ("slurmfabric env", [PY, "-m", "slurmfabric", "env"]),
            ("slurmfabric launch -- true", [PY, "-m", "slurmfabric", "launch", "--", "true"]),
        ):
            ms = median_ms(cmd, env)
            print(f"{name:28} {label:12} {ms:6.1f} ms  {ms / bare:4.2f}x bare")


if __name__ == "__main__":
    main()
