"""What the input-bound tests share (tests/unit/test_progress_data.py,
tests/cluster/test_input_cluster.py): waiting for a job's ranks to beat, and what
``jobs stragglers --json`` must say about examples/train_input.py, slow on one node."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from slurmfabric.progress.watch import read_beats


def wait_for_steps(beats: Path, ranks: int, step: int, timeout: float,
                   alive: Callable[[], bool] = lambda: True) -> bool:
    """True once ``ranks`` ranks beat at ``step`` or later; False at the timeout or when
    ``alive()`` says the job is gone."""
    deadline = time.time() + timeout
    while time.time() < deadline and alive():
        seen = read_beats(str(beats))
        if len(seen) == ranks and min(b.step for b in seen.values()) >= step:
            return True
        time.sleep(0.5)
    return False


def assert_names_input_bound(stdout: str, slow: str, fast: str) -> dict:
    """``jobs stragglers --json`` names ``slow`` input-bound (its rank waits for most of
    each step: 0.08 s of loading against 0.02 s of compute) and not ``fast``, whose rank
    waits in the all_reduce; no rank is slow (their compute is the same)."""
    report = json.loads(stdout)
    nodes = report["nodes"]
    print("data share per node:", json.dumps(nodes, sort_keys=True))  # the figure (-s)
    assert nodes[slow]["input_bound"] and not nodes[fast]["input_bound"], report
    assert nodes[slow]["data_share"] >= 0.5 and nodes[fast]["data_share"] <= 0.15, report
    inputs = [f for f in report["findings"] if f["kind"] == "input"]
    assert len(inputs) == 1 and inputs[0]["detail"].startswith(
        f"input-bound node(s) {slow}: their ranks wait for their next batch"), report
    assert [r["host"] for r in inputs[0]["ranks"]] == [slow]
    assert not [f for f in report["findings"] if f["kind"] == "slow"], report
    return report
