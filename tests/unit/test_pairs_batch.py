"""k-batch sweeps (Microsoft SuperBench's pattern: groups of k nodes, all at once): the two
rounds, the rendered job, and the verdicts from results the double writes in the job's
layout (round-NN/group-NNN.{out,rc,tasks})."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import fakebw
import pytest

from slurmfabric.commands import pairs as cmd
from slurmfabric.errors import UsageError
from slurmfabric.pairsweep.batch import analyze_batches, batch_rounds, group_name
from slurmfabric.pairsweep.plan import SweepPlan, render_script, write_plan

NODES = [f"gpu{i:02d}" for i in range(1, 17)]


def test_two_rounds_regroup_so_no_two_nodes_meet_twice() -> None:
    rounds = batch_rounds(NODES, 4)
    assert [len(r) for r in rounds] == [4, 4] and all(len(g) == 4 for r in rounds for g in r)
    for rnd in rounds:  # each node exactly once per round
        assert sorted(n for g in rnd for n in g) == sorted(NODES)
    met = [frozenset((a, b)) for rnd in rounds for g in rnd for a in g for b in g if a < b]
    assert len(met) == len(set(met))  # N >= k^2: any two nodes share at most one group
    # The remainder joins groups instead of sitting out (SuperBench drops it).
    odd = batch_rounds(NODES[:10], 4)
    assert sorted(n for g in odd[0] for n in g) == sorted(NODES[:10])
    assert [len(g) for g in odd[0]] == [5, 5]
    with pytest.raises(UsageError, match="one group"):
        batch_rounds(NODES[:5], 4)


def write_batch(results: Path, nodes: list[str], k: int, rates: dict[str, float],
                broken: tuple[int, int] | None = None) -> SweepPlan:
    """A k-batch results directory as its job writes it: each group at its slowest node."""
    plan = SweepPlan(nodes=nodes, rounds=batch_rounds(nodes, k), results=results,
                     pattern="k-batch")
    write_plan(plan)
    for i, rnd in enumerate(plan.rounds):
        for j, group in enumerate(rnd):
            base = results / f"round-{i + 1:02d}" / group_name(j)
            base.parent.mkdir(parents=True, exist_ok=True)
            failed = broken == (i, j)
            bw = min(rates.get(n, 360.0) for n in group)
            base.with_suffix(".out").write_text(
                "" if failed else fakebw.render(list(group), bw, 1 << 30, 8 << 30, 2))
            base.with_suffix(".rc").write_text("1\n" if failed else "0\n")
            base.with_suffix(".tasks").write_text("".join(
                f"{t} {n} {j}.0 start 1.0\n{t} {n} {j}.0 end 2.0 0\n"
                for t, n in enumerate(group)))
    return plan


def report(results: Path, capsys, *extra: str) -> tuple[int, dict]:
    rc = cmd.main(["report", str(results), "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_one_slow_node_is_named_and_its_group_mates_are_not(tmp_path, capsys) -> None:
    write_batch(tmp_path / "r", NODES, 4, {"gpu07": 150.0})
    rc, data = report(tmp_path / "r", capsys)
    assert rc == 1 and data["suspect_nodes"] == ["gpu07"]
    assert data["unresolved"] == [] and data["unexplained"] == []
    assert data["messages"][0].startswith("gpu07 is in 2 slow group(s) (round 1: 42 %, "
                                          "round 2: 42 %)")
    assert data["follow_up"] is None and data["execution_problems"] == []
    assert [g["busbw"] for g in data["groups"]].count(None) == 0


def test_a_failed_group_counts_and_a_healthy_sweep_passes(tmp_path, capsys) -> None:
    write_batch(tmp_path / "ok", NODES, 4, {})
    rc, data = report(tmp_path / "ok", capsys)
    assert rc == 0 and data["suspect_nodes"] == [] and data["messages"][0].startswith(
        "no outliers")
    # Round 1's third group (gpu09-12) fails and gpu10 is slow: gpu10 is named from its
    # round-2 group; the failed group's other members are cleared by round 2.
    write_batch(tmp_path / "bad", NODES, 4, {"gpu10": 100.0}, broken=(0, 2))
    rc, data = report(tmp_path / "bad", capsys)
    assert rc == 1 and data["suspect_nodes"] == ["gpu10"] and data["unresolved"] == []


def test_what_two_rounds_cannot_tell_apart_gets_the_pair_sweep(tmp_path, capsys) -> None:
    """8 nodes in groups of 4: round 2 groups share two nodes with each round-1 group, so
    a slow node has a partner it is never cleared from: both are unresolved and the report
    prints the pair sweep (with one cleared node) that settles it."""
    nodes = NODES[:8]
    write_batch(tmp_path / "r", nodes, 4, {"gpu01": 100.0})
    rc, data = report(tmp_path / "r", capsys)
    assert rc == 1 and data["suspect_nodes"] == []
    assert data["unresolved"] == ["gpu01", "gpu03"]
    assert data["follow_up"] == (f"slurmfabric pairs submit --nodes gpu01,gpu03,gpu02 "
                                 f"--results {tmp_path / 'r'}-pairs")
    text = cmd.main(["report", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert text == 1 and f"next: {data['follow_up']}" in out


def test_a_slow_group_of_cleared_nodes_is_the_path_not_a_node() -> None:
    groups = [(1, ("a", "b"), 360.0), (1, ("c", "d"), 100.0),
              (2, ("a", "c"), 360.0), (2, ("b", "d"), 360.0)]
    result = analyze_batches(groups)
    assert result.suspect_nodes == [] and result.unexplained == [(1, ("c", "d"))]
    assert "switch path of that group" in result.messages[0]
    # Deterministic: the same groups in another order give the same verdict.
    again = analyze_batches(list(reversed(groups)))
    assert (again.suspect_nodes, again.unexplained) == ([], [(1, ("c", "d"))])


def test_the_job_runs_each_group_as_one_step(tmp_path, capsys) -> None:
    results = tmp_path / "r"
    assert cmd.main(["submit", "--nodes", "gpu[01-16]", "--results", str(results),
                     "--pattern", "k-batch", "--batch", "4", "--tasks-per-node", "8",
                     "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert "16 nodes, 8 groups in 2 rounds" in script
    assert "run_group \"$RESULTS\" 01 group-001 4 gpu01,gpu02,gpu03,gpu04 &" in script
    assert "run_group \"$RESULTS\" 02 group-004 4 gpu04,gpu08,gpu12,gpu16 &" in script
    assert "run_pair \"$RESULTS\"" not in script.split("run_pair() {")[1].split("}\n", 1)[1]
    assert "retest-plan" not in script  # no pair retests: the report prints a pair sweep
    assert "--ntasks=\"$(($4 * 8))\"" in script
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    for extra, message in ((["--batch", "2", "--test", "ib_write_bw", "--rails", "mlx5_0"],
                            "runs nccl-tests on groups"), ([], "needs --batch"),
                           (["--batch", "9"], "one group")):
        with pytest.raises(UsageError, match=message):
            cmd.main(["submit", "--nodes", "gpu[01-16]", "--results", str(results),
                      "--pattern", "k-batch", "--dry-run", *extra])


def test_render_script_keeps_pair_sweeps_unchanged(tmp_path) -> None:
    plan = SweepPlan(nodes=NODES[:4], rounds=[[("gpu01", "gpu02"), ("gpu03", "gpu04")]],
                     results=tmp_path)
    assert "run_group" not in render_script(plan)
