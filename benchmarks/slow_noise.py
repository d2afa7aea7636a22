"""How far a healthy rank's compute ratio to its peers wanders on the testbed: the noise
the slow verdict's thresholds (``progress.watch.Watch``: ``slow_ratio`` against a rank's
own baseline, ``imbalance`` against its peers) must stay above (issue 45).

Submits JOBS healthy 2-node x 2-rank jobs at once (examples/faults-cpu.toml, CPU-bound
compute: ``TRAIN_BUSY`` loop iterations, so ranks that share a core compute slower), reads
each job's heartbeats every 5 s for SECONDS as the supervisor does, and prints per rank
its baseline ratio to its peers (median of the first 3 intervals) and the highest lower
quartile over the 40 s window, against its peers and against its own baseline. Needs
the testbed (``eval "$(slurmfabric testbed env)"``).

``python benchmarks/slow_noise.py [--jobs 3] [--seconds 150] [--busy 60000]``
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurmfabric.progress.watch import Watch, read_beats  # noqa: E402


def submit(work: Path, name: str, busy: int) -> str:
    sets = [f"job.name={name}", f"job.output={name}-%j.out", "job.time=00:15:00",
            f"launcher.resume.checkpoint_dir=checkpoints/{name}",
            'launcher.resume.events=["node_fail"]', "launcher.resume.hang_timeout=600",
            "program.env.TRAIN_STEPS=1000000", f"program.env.TRAIN_BUSY={busy}"]
    argv = [sys.executable, "-m", "slurmfabric", "submit", "-c", "examples/faults-cpu.toml"]
    for item in sets:
        argv += ["--set", item]
    out = subprocess.run(argv, cwd=work, capture_output=True, text=True, check=True).stdout
    return out.split()[0]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=150.0)
    p.add_argument("--busy", type=int, default=60000)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="slow-noise-"))
    shutil.copytree(ROOT / "examples", work / "examples")
    jobs = {f"noise{i}": submit(work, f"noise{i}", args.busy) for i in range(args.jobs)}
    watches = {name: Watch(slow_ratio=99.0, imbalance=99.0) for name in jobs}
    peak: dict[tuple[str, int], tuple[float, float]] = {}
    try:
        started: dict[str, float] = {}
        end = None
        while end is None or time.time() < end:
            for name, job in jobs.items():
                directory = work / "checkpoints" / name / ".slurmfabric" / f"progress-{job}"
                beats = read_beats(str(directory))
                if len(beats) < 4:
                    continue
                started.setdefault(name, time.time())
                watch = watches[name]
                watch.observe(beats, time.time())
                for rank, ratio in watch.ratios.items():
                    base = watch.baselines.get(rank)
                    if base is None:
                        continue
                    high, rel = peak.get((name, rank), (0.0, 0.0))
                    peak[(name, rank)] = (max(high, ratio), max(rel, ratio / base))
            if end is None and len(started) == len(jobs):
                end = time.time() + args.seconds
            time.sleep(5.0)
    finally:
        subprocess.run(["scancel", *jobs.values()], check=False)
    print(f"{args.jobs} healthy jobs x 4 ranks, {args.seconds:.0f} s each, TRAIN_BUSY "
          f"{args.busy}: per rank baseline, highest lower-quartile ratio to peers and to "
          "its own baseline (40 s window)")
    for (name, rank), (high, rel) in sorted(peak.items()):
        base = watches[name].baselines[rank]
        print(f"  {name} rank {rank}: baseline {base:.3f}  peers {high:.3f}  own {rel:.3f}")
    print(f"max: peers {max(h for h, _ in peak.values()):.3f}, own baseline "
          f"{max(r for _, r in peak.values()):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
