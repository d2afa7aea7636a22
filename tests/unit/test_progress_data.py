"""The data-loading share of each step (slurmfabric.progress, issue 43 item 6): what the
helper measures, how the watch names an input-bound node, and a real torch DataLoader over
gloo on CPU whose dataset is slow on one "node", read by ``jobs stragglers`` as it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from input_bound import assert_names_input_bound, wait_for_steps

import slurmfabric.progress as progress
from slurmfabric.progress.watch import Beat, Watch, node_shares, prom_text, read_beats

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def beat_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(progress.ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    progress._reset_for_tests()
    yield tmp_path
    progress._reset_for_tests()


def test_the_gap_before_compute_is_the_wait_for_the_batch(beat_dir):
    """No code change beyond the contract: step() ends a step, compute() starts the next;
    the time between is the loader's. The first step is not counted."""
    for _ in range(4):
        time.sleep(0.06)  # the loader's __next__
        with progress.compute():
            time.sleep(0.02)
        progress.step()
    beat = read_beats(str(beat_dir))[0]
    assert beat.data_timed == 3
    assert 0.17 <= beat.data_sum <= 0.17 + 0.1  # 3 x 0.06, plus a loaded machine's delay
    share = beat.data_sum / beat.wall_sum
    assert 0.6 <= share <= 0.85, share  # 0.06 of 0.08 s


def test_timed_loader_counts_fetches_inside_the_compute_block(beat_dir):
    """A loop that fetches inside compute() has no gap; timed() measures the fetches."""
    def slow_batches():
        for i in range(5):
            time.sleep(0.05)
            yield i

    batches = iter(progress.timed(slow_batches()))
    progress.step()  # the step before: the first wait is counted from here
    for _ in range(5):
        with progress.compute():
            next(batches)
            time.sleep(0.01)
        progress.step()
    beat = read_beats(str(beat_dir))[0]
    assert beat.data_timed == 5 and 0.25 <= beat.data_sum <= 0.25 + 0.1
    assert beat.data_sum / beat.wall_sum >= 0.7
    assert beat.compute_sum >= beat.data_sum  # compute() still timed its whole block


def test_the_programs_own_figure_wins(beat_dir):
    progress.step()
    progress.step(data_seconds=0.0)
    time.sleep(0.01)
    with progress.compute():
        pass
    progress.step(data_seconds=0.002)
    beat = read_beats(str(beat_dir))[0]
    assert beat.data_sum == pytest.approx(0.002) and beat.data_timed == 2


def test_timed_is_a_plain_iterator_without_the_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    progress._reset_for_tests()
    assert list(progress.timed(range(3))) == [0, 1, 2] and len(progress.timed(range(3))) == 3
    progress._reset_for_tests()


def feed(watch: Watch, shares: dict[int, float], seconds: int = 30,
         hosts: dict[int, str] | None = None) -> list:
    """Observe ranks every 5 s whose steps of 0.2 s wait ``shares[r]`` of each for data."""
    found, sums = [], {r: [0.0, 0.0] for r in shares}
    for k in range(seconds // 5 + 1):
        beats = {}
        for r, share in shares.items():
            sums[r][0] += 5.0 * share
            sums[r][1] += 5.0
            beats[r] = Beat(rank=r, step=25 * k, phase="step", time=1000.0 + 5 * k,
                            host=(hosts or {}).get(r, f"n{r // 2}"), pid=100 + r,
                            data_sum=sums[r][0], wall_sum=sums[r][1], data_timed=25 * k)
        found += watch.inputs(beats, 1000.0 + 5 * k)
    return found


def test_one_nodes_ranks_waiting_for_data_name_that_node_input_bound():
    watch = Watch(window=40)
    found = feed(watch, {0: 0.02, 1: 0.03, 2: 0.61, 3: 0.58})
    assert [f.kind for f in found] == ["input"]
    assert [r["rank"] for r in found[0].ranks] == [2, 3]
    assert found[0].detail.startswith("input-bound node(s) n1: their ranks wait for their "
                                      "next batch 61% of each step over the last 40 s, the "
                                      "other ranks 2%")
    assert found[0].ranks[0]["why"] == "61% of each step waiting for data"
    nodes = node_shares(watch, {r: Beat(rank=r, step=1, phase="step", time=1.0,
                                        host=f"n{r // 2}") for r in range(4)})
    assert nodes["n1"]["input_bound"] and not nodes["n0"]["input_bound"]
    assert nodes["n1"]["data_share"] == pytest.approx(0.595, abs=0.001)
    text = prom_text(watch, {2: Beat(rank=2, step=1, phase="step", time=1.0, host="n1")},
                     "9", 2.0)
    assert 'slurmfabric_progress_data_share{job="9",rank="2",host="n1",gpu=""} 0.6100' in text


def test_every_rank_waiting_alike_is_a_job_bound_by_its_input():
    found = feed(Watch(window=40), {0: 0.4, 1: 0.45, 2: 0.5, 3: 0.42})
    assert len(found) == 1 and found[0].detail.startswith(
        "every rank waits for its next batch 40%-50% of each step over the last 40 s: the "
        "job is input-bound (data loading or storage), not network-bound")


def test_a_loader_that_keeps_up_is_not_reported():
    assert feed(Watch(window=40), {0: 0.05, 1: 0.2, 2: 0.1, 3: 0.0}, seconds=120) == []


def test_a_real_dataloader_slow_on_one_node_is_named_input_bound(tmp_path):
    """Two gloo ranks on CPU (examples/train_input.py), each a real DataLoader with one
    worker; rank 1's dataset takes 0.08 s per item ("node" slow), rank 0's none. Rank 0
    waits in the all_reduce, so its compute is not slower and only the data share tells:
    ``jobs stragglers`` names rank 1's node input-bound and not rank 0's."""
    script = ROOT / "examples" / "train_input.py"
    beats = tmp_path / "beats"
    env = {**os.environ, progress.ENV: str(beats), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(20000 + os.getpid() % 20000), "WORLD_SIZE": "2",
           "OMP_NUM_THREADS": "1", "TRAIN_SECONDS": "40"}
    ranks = [subprocess.Popen([sys.executable, str(script)], env={
        **env, "RANK": str(r), "SLURMD_NODENAME": name, "SLURM_NODEID": str(r)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r, name in ((0, "fast1"), (1, "slow2"))]
    proc = None
    try:
        if wait_for_steps(beats, 2, 5, 120, lambda: all(p.poll() is None for p in ranks)):
            proc = subprocess.run([sys.executable, "-m", "slurmfabric", "jobs", "stragglers",
                                   "7", "--progress-dir", str(beats), "--seconds", "8",
                                   "--every", "1", "--json"], capture_output=True, text=True,
                                  timeout=60)
    finally:
        for p in ranks:
            p.kill()
        outs = [p.communicate()[0][-2000:] for p in ranks]
    assert proc is not None, f"the ranks did not reach step 5 in 120 s: {outs}"
    assert proc.returncode == 0, proc.stderr
    assert_names_input_bound(proc.stdout, "slow2", "fast1")
