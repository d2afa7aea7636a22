"""Hook wall time on a healthy 8-GPU / 10-NIC fixture node (HGX H100, NDR rails).

Runs ``slurmfabric health prolog`` as Slurm would (a fresh process per job, SLURMD_NODENAME
and SLURM_JOB_ID set) against recorded nvidia-smi output and a fake sysfs tree, and prints
median / p90 / max wall seconds for the nvidia-smi source, the NVML source (fake pynvml in a
child process), an HGX board with NVSwitches (the NVLink, NVLink-counter and fabric checks
on top, recorded ``nvlink -s``/``-e``/``-q`` output), and ``health periodic`` on that board.
Each median is also printed as a ratio to a baseline measured in the same run: the bare
process start of ``slurmfabric --version``. Targets: prolog median < 0.2 s with every check;
periodic cheaper than the prolog. ``python benchmarks/bench_prolog.py [runs]``
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
from helpers import (  # noqa: E402
    NVML_FAKE,
    h100_tree,
    hgx_node,
    hgx_root,
    nvlink_scenario,
    write_config,
)


def measure(env: dict[str, str], runs: int, args: tuple[str, ...] = ("health", "prolog"),
            ) -> list[float]:
    times = []
    for i in range(runs):
        run_env = {**env, "SLURMD_NODENAME": "gpu001", "SLURM_JOB_ID": str(10_000 + i)}
        start = time.perf_counter()
        proc = subprocess.run([str(Path(sys.executable).parent / "slurmfabric"), *args],
                              env=run_env, capture_output=True, text=True)
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
        base = sorted(measure(env, runs, ("--version",)))
        hgx = hgx_root(h100_tree(tmp_path / "hgx-root"))
        smi = nvlink_scenario(tmp_path / "hgx")
        cases = [("nvidia-smi", "prolog", {"gpu_source": "nvidia-smi"}, sysfs),
                 ("nvml", "prolog", {"gpu_source": "nvml"}, sysfs),
                 ("hgx+nvlink", "prolog", {"gpu_source": "nvidia-smi",
                                           "nvidia_smi": str(smi)}, hgx),
                 ("hgx+nvlink", "periodic", {"gpu_source": "nvidia-smi",
                                             "nvidia_smi": str(smi)}, hgx)]
        rows = []
        for n, (source, hook, extra, root) in enumerate(cases):
            state = tmp_path / f"state-{n}"
            cfg = write_config(tmp_path / f"{n}.toml", state,
                               [hgx_node("gpu[001-128]", "h100-535-healthy", root, **extra)])
            src_env = {**env, "SLURMFABRIC_HEALTH_CONFIG": str(cfg)}
            if source == "nvml":
                src_env["PYTHONPATH"] = str(NVML_FAKE)
                src_env["FAKE_NVML_JSON"] = str(NVML_FAKE / "h100-healthy.json")
            measure(src_env, 2, ("health", hook))  # warm the page cache like a busy node
            times = sorted(measure(src_env, runs, ("health", hook)))
            report = json.loads((state / "reports" / "last-gpu001.json").read_text())
            if report["status"] != "ok":
                raise SystemExit(f"{source} {hook}: not healthy: {report['checks']}")
            rows.append((source, hook, statistics.median(times), times[int(0.9 * (runs - 1))],
                         times[-1], report["seconds"], len(report["checks"])))
    baseline = statistics.median(base)
    print(f"healthy HGX H100 fixture (8 GPUs, 10 RDMA NICs), {runs} runs each; baseline "
          f"'slurmfabric --version' median {baseline:.3f} s")
    print(f"{'source':<11} {'hook':<9} {'median_s':>9} {'x_base':>7} {'p90_s':>7} "
          f"{'max_s':>7} {'checks_s':>9} {'checks':>6}")
    for source, hook, med, p90, worst, inner, count in rows:
        print(f"{source:<11} {hook:<9} {med:9.3f} {med / baseline:7.2f} {p90:7.3f} "
              f"{worst:7.3f} {inner:9.3f} {count:6d}")
    print(f"periodic / prolog on the HGX board: {rows[3][2] / rows[2][2]:.2f}")
    print("targets: prolog median < 0.2 s wall (process start to exit, like slurmd sees it); "
          "periodic / prolog < 1")


if __name__ == "__main__":
    main()
