"""Prolog wall time on a healthy 8-GPU / 10-NIC fixture node (HGX H100, NDR rails).

Runs ``slurmfabric health prolog`` as Slurm would (a fresh process per job, SLURMD_NODENAME
and SLURM_JOB_ID set) against recorded nvidia-smi output and a fake sysfs tree, and prints
median / p90 / max wall seconds for the nvidia-smi source and for the NVML source (fake
pynvml in a child process). Target: < 0.5 s. ``python benchmarks/bench_prolog.py [runs]``
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "health"))
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "topology"))  # helpers imports nodes
sys.path.insert(0, str(ROOT / "tests"))
from helpers import NVML_FAKE, h100_tree, hgx_node, write_config  # noqa: E402


def measure(env: dict[str, str], runs: int) -> list[float]:
    times = []
    for i in range(runs):
        run_env = {**env, "SLURMD_NODENAME": "gpu001", "SLURM_JOB_ID": str(10_000 + i)}
        start = time.perf_counter()
        proc = subprocess.run([str(Path(sys.executable).parent / "slurmfabric"), "health",
                               "prolog"], env=run_env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"prolog failed (exit {proc.returncode}): {proc.stderr}")
    return times


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        sysfs = h100_tree(tmp_path / "root")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        rows = []
        for source in ("nvidia-smi", "nvml"):
            cfg = write_config(tmp_path / f"{source}.toml", tmp_path / f"state-{source}",
                               [hgx_node("gpu[001-128]", "h100-535-healthy", sysfs,
                                         gpu_source=source)])
            src_env = {**env, "SLURMFABRIC_HEALTH_CONFIG": str(cfg)}
            if source == "nvml":
                src_env["PYTHONPATH"] = str(NVML_FAKE)
                src_env["FAKE_NVML_JSON"] = str(NVML_FAKE / "h100-healthy.json")
            measure(src_env, 2)  # warm the page cache like a node that ran jobs before
            times = sorted(measure(src_env, runs))
            report = json.loads((tmp_path / f"state-{source}" / "reports" /
                                 "last-gpu001.json").read_text())
            rows.append((source, statistics.median(times), times[int(0.9 * (runs - 1))],
                         times[-1], report["seconds"], len(report["checks"])))
    print(f"healthy HGX H100 fixture (8 GPUs, 10 RDMA NICs), {runs} prolog runs each")
    print(f"{'source':<11} {'median_s':>9} {'p90_s':>7} {'max_s':>7} {'checks_s':>9} {'checks':>6}")
    for source, med, p90, worst, inner, count in rows:
        print(f"{source:<11} {med:9.3f} {p90:7.3f} {worst:7.3f} {inner:9.3f} {count:6d}")
    print("target: median < 0.5 s wall (process start to exit, like slurmd sees it)")


if __name__ == "__main__":
    main()
