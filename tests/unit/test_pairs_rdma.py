"""Per-rail RDMA pairs: perftest output parsed from recorded real runs, the two-task step
with a stand-in ib_write_bw (tests/fakeperftest.py: a real TCP handshake, a recorded real
client output), and the report naming the one slow rail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fakeperftest
import pytest

from slurmfabric.commands import pairs as cmd
from slurmfabric.errors import UsageError
from slurmfabric.pairsweep.perftest import parse
from slurmfabric.pairsweep.plan import SweepPlan, pair_base, round_robin, write_plan
from slurmfabric.pairsweep.rdmastep import split_rails

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "perftest"


@pytest.mark.parametrize(("name", "device", "link", "cuda", "unit", "rows", "gbps"), [
    ("ib_write_bw-ib-all-sizes-client.txt", "mlx5_0", "IB", False, "Gb/sec", 23, 98.38),
    ("ib_write_bw-ib-all-sizes-server.txt", "mlx5_0", "IB", False, "Gb/sec", 1, 98.38),
    ("ib_write_bw-cuda-ib-client.txt", "mlx5_0", "IB", True, "Gb/sec", 23, 80.96),
    ("ib_write_bw-cuda-dmabuf-roce-client.txt", "mlx5_3", "Ethernet", True, "Gb/sec", 23,
     140.40),
    ("ib_write_bw-all-sizes-mb.txt", "mlx4_0", "IB", False, "MB/sec", 23, 3662.02 * 0.008),
])
def test_recorded_runs_parse(name, device, link, cuda, unit, rows, gbps) -> None:
    run = parse((FIX / name).read_text())
    assert (run.test, run.device, run.link_type, run.cuda, run.unit, len(run.rows)) == (
        "RDMA_Write BW Test", device, link, cuda, unit, rows)
    assert run.ok and abs(run.bandwidth_gbps - gbps) < 0.01
    assert run.gid_index == ("3" if link == "Ethernet" else "")  # RoCE: the GID index used


@pytest.mark.parametrize(("name", "error"), [
    ("ib_write_bw-connect-failed.txt", "Couldn't connect to 192.168.125.211:18515"),
    ("ib_write_bw-modify-qp-rtr-failed.txt", "Failed to modify QP 122273 to RTR"),
    ("ib_write_bw-roce-all-sizes-completion-error-client.txt",
     "Completion with error at client"),
])
def test_failed_runs_are_failures_even_with_rows(name, error) -> None:
    run = parse((FIX / name).read_text())
    assert not run.ok and run.errors[0] == error


def test_the_two_task_step_measures_every_rail_at_once(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "ib_write_bw"
    tool.write_text(f"#!/bin/sh\nexec {sys.executable} {fakeperftest.__file__} \"$@\"\n")
    tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "SLURM_STEP_NODELIST": "localhost,127.0.0.1", "SLURMD_NODENAME": "localhost",
           "SLURMFABRIC_FAKEPERF": json.dumps({"localhost/mlx5_3": 0.5})}
    argv = [sys.executable, "-m", "slurmfabric", "pairs", "rdma-step", "--rails",
            "mlx5_0,mlx5_3", "--", "ib_write_bw", "--report_gbits"]
    server = subprocess.Popen(argv, env={**env, "SLURM_PROCID": "0"}, stdout=subprocess.PIPE,
                              text=True)
    client = subprocess.run(argv, env={**env, "SLURM_PROCID": "1"}, capture_output=True,
                            text=True, timeout=60)
    assert server.wait(timeout=60) == 0 and client.returncode == 0, client.stdout
    rails = {rail: parse(text) for rail, text in split_rails(client.stdout).items()}
    assert list(rails) == ["mlx5_0", "mlx5_3"]
    assert rails["mlx5_0"].device == "mlx5_0" and rails["mlx5_0"].bandwidth_gbps == 98.38
    assert rails["mlx5_3"].bandwidth_gbps == 49.19


def test_the_report_names_the_one_slow_rail(tmp_path: Path, capsys) -> None:
    nodes, rails = ["sfn1", "sfn2", "sfn3", "sfn4"], ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    plan = SweepPlan(nodes=nodes, rounds=round_robin(nodes), results=tmp_path / "res",
                     test="ib_write_bw")
    write_plan(plan)
    for i, rnd in enumerate(plan.rounds):
        for pair in rnd:
            base = pair_base(plan.results, i, pair)
            base.parent.mkdir(parents=True, exist_ok=True)
            text = "".join(f"== rail {rail} ==\n" + fakeperftest.client_output(
                rail, 0.4 if "sfn3" in pair and rail == "mlx5_2" else 1.0) for rail in rails)
            base.with_suffix(".out").write_text(text)
            base.with_suffix(".rc").write_text("0\n")
    assert cmd.main(["report", str(plan.results), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["suspect_nodes"] == ["sfn3"]
    assert data["slow_rails"] == ["rail mlx5_2 of sfn3 is at 40 % of its best rail (39.4 vs "
                                  "98.4 Gb/s)"]
    pair = next(p for p in data["pairs"] if p["pair"] == ["sfn1", "sfn2"])
    assert pair["rails"] == {r: 98.38 for r in rails} and pair["busbw"] == 98.38


def test_submit_builds_the_per_rail_step_and_refuses_what_cannot_work(tmp_path, capsys):
    res = tmp_path / "r"
    assert cmd.main(["submit", "--nodes", "sfn[1-4]", "--results", str(res), "--test",
                     "ib_write_bw", "--rails", "mlx5_0,mlx5_1", "--cuda", "--perftest-arg=-s",
                     "--perftest-arg=8388608", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "pairs rdma-step --rails mlx5_0,mlx5_1 --cuda -- ib_write_bw --report_gbits -s " \
           "8388608" in out
    for extra, message in ((["--rails", "mlx5_0;reboot"], "not an HCA name"), ([], "needs "
                           "--rails"), (["--rails", "mlx5_0", "--tasks-per-node", "8"],
                                        "one task per node")):
        with pytest.raises(UsageError, match=message):
            cmd.main(["submit", "--nodes", "sfn[1-4]", "--results", str(res), "--test",
                      "ib_write_bw", "--dry-run", *extra])
