from __future__ import annotations

import itertools
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import fakebw
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmfabric.commands import pairs as cmd
from slurmfabric.errors import UsageError
from slurmfabric.nccl.tests import parse
from slurmfabric.pairsweep import summary
from slurmfabric.pairsweep.heatmap import render_svg
from slurmfabric.pairsweep.plan import (
    SweepPlan,
    pair_base,
    parse_pairs,
    render_script,
    round_robin,
    schedule_pairs,
)
from slurmfabric.pairsweep.report import analyze, check_execution, load_results, matrix

NODES4 = ["sfn1", "sfn2", "sfn3", "sfn4"]


@given(st.integers(min_value=2, max_value=24))
def test_round_robin_covers_every_pair_once_and_no_node_twice_per_round(n):
    nodes = [f"n{i:02d}" for i in range(n)]
    rounds = round_robin(nodes)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    flat = [frozenset(p) for rnd in rounds for p in rnd]
    assert sorted(map(sorted, flat)) == sorted(map(sorted, itertools.combinations(nodes, 2)))
    for rnd in rounds:
        used = [x for p in rnd for x in p]
        assert len(used) == len(set(used))
        assert len(rnd) == n // 2


def test_round_robin_rejects_bad_input():
    with pytest.raises(UsageError):
        round_robin(["a"])
    with pytest.raises(UsageError):
        round_robin(["a", "b", "a"])


def test_schedule_subset_and_parse_pairs():
    pairs = parse_pairs("a:b,c:d,a:c,b:d,b:a")
    rounds = schedule_pairs(pairs)
    assert rounds == [[("a", "b"), ("c", "d")], [("a", "c"), ("b", "d")]]
    with pytest.raises(UsageError):
        parse_pairs("a-b")


def _plan(tmp_path, **kw):
    return SweepPlan(nodes=NODES4, rounds=round_robin(NODES4), results=tmp_path / "res", **kw)


def test_script_quotes_values_and_runs_rounds_concurrently(tmp_path):
    plan = _plan(tmp_path, command=["all_reduce_perf", "-b", "1G", "--x=$(reboot)"],
                 partition="gpu", mpi="pmix", gpus_per_node=8, tasks_per_node=8)
    text = render_script(plan)
    assert "'--x=$(reboot)'" in text  # quoted: data, not code
    assert "#SBATCH --nodelist=sfn1,sfn2,sfn3,sfn4" in text
    assert "#SBATCH --ntasks-per-node=8" in text and "#SBATCH --gpus-per-node=8" in text
    assert "--ntasks=16" in text and "--mpi=pmix" in text
    assert text.count("wait\n") == 3 and text.count(" &\n") == 6
    assert "run_pair \"$RESULTS\" 01 sfn1 sfn4 &" in text
    script = tmp_path / "s.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    shellcheck = subprocess.run(["shellcheck", "-S", "warning", str(script)],
                                capture_output=True, text=True)
    assert shellcheck.returncode == 0, shellcheck.stdout


def test_plan_rejects_relative_or_odd_paths(tmp_path):
    with pytest.raises(UsageError, match="absolute"):
        SweepPlan(nodes=NODES4, rounds=[], results=Path("rel"))
    with pytest.raises(UsageError, match="spaces"):
        SweepPlan(nodes=NODES4, rounds=[], results=tmp_path / "a b")
    with pytest.raises(UsageError, match="node name"):
        SweepPlan(nodes=["a/b", "c"], rounds=[], results=tmp_path)


def test_fakebw_output_is_nccl_tests_format_at_the_slower_rate():
    text = fakebw.render(["n1", "n2"], 180.0, 1 << 30, 8 << 30, 2, pid=100)
    (run,) = parse(text)
    assert [d.host for d in run.devices] == ["n1", "n2"]
    assert [r.size for r in run.rows] == [1 << 30, 2 << 30, 4 << 30, 8 << 30]
    assert 175 < run.large_message_busbw() <= 180 and run.out_of_bounds == 0
    assert run.rows[0].out_of_place.algbw == run.rows[0].out_of_place.busbw  # 2 ranks


def test_fakebw_main_uses_the_step_nodes_and_map(monkeypatch, capsys, tmp_path):
    mapping = tmp_path / "bw.json"
    mapping.write_text(json.dumps({"sfn3": 100}))
    monkeypatch.setenv("SLURMFABRIC_FAKEBW", f"@{mapping}")
    monkeypatch.setenv("SLURMFABRIC_FAKEBW_SECONDS", "0")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "sfn[2-3]")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURMD_NODENAME", "sfn2")
    assert fakebw.main(["-b", "1G", "-e", "2G"]) == 0
    (run,) = parse(capsys.readouterr().out)
    assert run.hosts == ["sfn2", "sfn3"] and run.large_message_busbw() < 100
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert fakebw.main([]) == 0 and capsys.readouterr().out == ""
    assert fakebw.parse_size("512M") == 512 << 20 and fakebw.parse_size("8") == 8


def _fake_results(tmp_path, rates, broken=()):
    return fakebw.sweep_results(tmp_path / "res", NODES4, rates, broken)


def test_report_names_the_slow_node_and_writes_svg(tmp_path, capsys):
    plan = _fake_results(tmp_path, {"sfn3": 180.0})
    svg = tmp_path / "m.svg"
    assert cmd.main(["report", str(plan.results), "--svg", str(svg)]) == 1
    out = capsys.readouterr().out
    assert "every pair with sfn3 is at 50 %" in out and "178.6!" in out
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert cmd.main(["report", str(plan.results), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["suspect_nodes"] == ["sfn3"] and data["execution_problems"] == []


def test_report_healthy_sweep_passes(tmp_path, capsys):
    plan = _fake_results(tmp_path, {})
    assert cmd.main(["report", str(plan.results)]) == 0
    assert "no outliers" in capsys.readouterr().out


def test_report_failed_pairs_name_the_node(tmp_path):
    plan = _fake_results(tmp_path, {}, broken=[("sfn2", "sfn4"), ("sfn1", "sfn4"),
                                               ("sfn3", "sfn4")])
    _, pairs = load_results(plan.results)
    values = {r.pair: (r.busbw if r.ok else None) for r in pairs}
    failed = [r.pair for r in pairs if not r.ok]
    analysis = analyze(NODES4, values, failed=failed)
    assert analysis.suspect_nodes == ["sfn4"] and analysis.suspect_links == []
    assert {r.error for r in pairs if not r.ok} == {"exit code 1"}


def test_low_link_between_two_good_nodes():
    values = {("a", "b"): 150.0, ("a", "c"): 358.0, ("a", "d"): 357.0,
              ("b", "c"): 357.0, ("b", "d"): 356.0, ("c", "d"): 359.0}
    analysis = analyze(["a", "b", "c", "d"], values)
    assert analysis.suspect_nodes == [] and analysis.suspect_links == [("a", "b")]
    assert "between them" in analysis.messages[0]


def test_execution_check_catches_a_node_in_two_pairs(tmp_path):
    plan = _fake_results(tmp_path, {})
    # Make round 1's second pair claim it ran on sfn1, which round 1 already used.
    base = pair_base(plan.results, 0, plan.rounds[0][1])
    base.with_suffix(".tasks").write_text("0 sfn1 5.0 start 1.0\n1 sfn3 5.0 start 1.0\n")
    plan_data, pairs = load_results(plan.results)
    problems = check_execution(plan_data, pairs)
    assert any("sfn1 ran in two pairs" in p for p in problems)
    assert any("ran on sfn1,sfn3" in p for p in problems)


def test_matrix_is_symmetric_and_svg_has_labels():
    values = {("a", "b"): 1.0, ("a", "c"): 2.0}
    m = matrix(["a", "b", "c"], values)
    assert m[1][0] == 1.0 and m[2][0] == 2.0 and m[1][2] is None and m[0][0] is None
    root = ET.fromstring(render_svg(["a", "b", "c"], m, 2.0, "t", ["note <x>"]))
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "a" in texts and "note <x>" in texts and "n/a" in texts


def test_submit_dry_run_prints_script_and_submit_uses_slurm_cmd(tmp_path, capsys, mocker):
    res = tmp_path / "r"
    assert cmd.main(["submit", "--nodes", "sfn[1-4]", "--results", str(res), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sbatch --parsable" in out and "all_reduce_perf -b 1G -e 8G" in out
    assert not res.exists()
    from slurmfabric.slurm import cmd as slurm_cmd
    sb = mocker.patch.object(slurm_cmd, "sbatch", return_value=slurm_cmd.JobId("42"))
    assert cmd.main(["submit", "--nodes", "sfn[1-3]", "--results", str(res)]) == 0
    assert "submitted job 42" in capsys.readouterr().out
    script = sb.call_args.args[0]
    assert script.count("\nwait\n") == 3  # odd N: N rounds with a bye (retests indented)
    assert "for pass in $(seq 1 2); do" in script  # two retest passes by default
    assert json.loads((res / "plan.json").read_text())["nodes"] == ["sfn1", "sfn2", "sfn3"]


def test_drain_and_resume_go_through_the_health_module(tmp_path, capsys, mocker):
    from slurmfabric.health import drain as drain_mod

    plan = _fake_results(tmp_path, {"sfn3": 180.0})
    dr = mocker.patch.object(drain_mod, "drain",
                             return_value=drain_mod.DrainOutcome("drained", "r"))
    rs = mocker.patch.object(drain_mod, "resume_if_ours", return_value=True)
    cmd.main(["report", str(plan.results), "--drain", "--resume-passing",
              "--state-dir", str(tmp_path / "st")])
    assert [c.args[:2] for c in dr.call_args_list] == [("sfn3", "pairs")]
    assert "every pair with sfn3" in dr.call_args.args[2]
    assert sorted(c.args[0] for c in rs.call_args_list) == ["sfn1", "sfn2", "sfn4"]
    assert "drain sfn3: drained" in capsys.readouterr().out


def test_sweep_script_matches_its_golden_file_and_passes_shellcheck(tmp_path) -> None:
    """The sweep script comes from templates/pairs.sh.j2 through the job scripts' Jinja
    environment; SLURMFABRIC_UPDATE_GOLDEN=1 rewrites tests/golden/pairs.sh."""
    import os
    import shutil
    import subprocess

    from slurmfabric import __version__
    from slurmfabric.pairsweep.plan import SweepPlan, render_script, round_robin

    golden = Path(__file__).resolve().parents[1] / "golden" / "pairs.sh"
    nodes = ["sfn1", "sfn2", "sfn3", "sfn4"]
    plan = SweepPlan(nodes=nodes, rounds=round_robin(nodes), results=Path("/shared/sweep1"),
                     partition="gpu", time_limit="30", tasks_per_node=8, gpus_per_node=8,
                     mpi="pmix", srun_args=["--cpu-bind=none"], created=0.0)
    text = render_script(plan).replace(f"slurmfabric {__version__} ", "slurmfabric VERSION ")
    if os.environ.get("SLURMFABRIC_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text()
    assert shutil.which("shellcheck"), "shellcheck missing: apt-get install shellcheck"
    script = tmp_path / "pairs.sh"
    script.write_text(text)
    lint = subprocess.run(["shellcheck", "--shell=bash", str(script)], capture_output=True,
                          text=True)
    assert lint.returncode == 0, lint.stdout


def _eight(slow: float) -> tuple[list[str], dict]:
    nodes = [f"n{i}" for i in range(8)]
    values = {p: (slow if "n5" in p else 360.0 - i % 3)
              for i, p in enumerate(itertools.combinations(nodes, 2))}
    return nodes, values


def test_the_sweeps_best_catches_a_node_the_median_rule_lets_pass():
    """A node at 89 % (320 of 360 GB/s): fine by 0.8 x median, suspect by ClusterKit's 0.93 x
    best, and by an expected figure."""
    nodes, values = _eight(320.0)
    assert analyze(nodes, values).suspect_nodes == []
    best = analyze(nodes, values, 0.93, reference="best")
    assert best.suspect_nodes == ["n5"] and best.suspect_links == []
    assert analyze(nodes, values, 0.8, expected=420.0).suspect_nodes == ["n5"]
    assert analyze(nodes, values, 0.8, expected=380.0).suspect_nodes == []
    with pytest.raises(ValueError, match="reference"):
        analyze(nodes, values, reference="mean")


def test_the_same_results_in_any_order_give_the_same_report():
    nodes, values = _eight(180.0)
    values[("n1", "n2")] = 150.0  # and one slow link between two good nodes
    first = analyze(nodes, values, 0.93, reference="best")
    shuffled = dict(reversed(list(values.items())))
    again = analyze(nodes, shuffled, 0.93, reference="best")
    assert (again.suspect_nodes, again.suspect_links, again.low_pairs, again.messages) == (
        first.suspect_nodes, first.suspect_links, first.low_pairs, first.messages)
    assert first.suspect_nodes == ["n5"] and first.suspect_links == [("n1", "n2")]


def test_a_large_sweep_prints_nodes_not_a_matrix(tmp_path, capsys, monkeypatch):
    nodes = [f"n{i:02d}" for i in range(40)]
    plan = fakebw.sweep_results(tmp_path / "res", nodes, {"n17": 180.0})
    assert cmd.main(["report", str(plan.results)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "40 nodes, 780 pairs; the 20 lowest node medians:"
    assert lines[2].split() == ["n17", "178.6!", "39", "39"]  # the suspect first
    assert len(lines) < 30  # not 41 rows of 40 cells
    monkeypatch.setattr(summary, "MATRIX_JSON_MAX", 16)
    assert cmd.main(["report", str(plan.results), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["matrix"] is None and len(data["pairs"]) == 780
    assert data["node_median"]["n17"] < 180


def _retest(results: Path, k: int, rates: dict[str, float], capsys) -> list[str]:
    """What the job does for pass k: ask retest-plan, run each pair (the double at the
    slower node's rate), keep the outputs where the script keeps them."""
    assert cmd.main(["retest-plan", str(results), "--pass", str(k)]) == 0
    lines = capsys.readouterr().out.splitlines()
    (results / f"retest-{k}.pairs").write_text("".join(f"{line}\n" for line in lines))
    for line in lines:
        rnd, a, b = line.split()
        base = results / f"retest-{k}" / f"round-{rnd}" / f"{a}+{b}"
        base.parent.mkdir(parents=True, exist_ok=True)
        base.with_suffix(".out").write_text(
            fakebw.render([a, b], min(rates.get(n, 360.0) for n in (a, b)), 1 << 30, 8 << 30, 2))
        base.with_suffix(".rc").write_text("0\n")
    return lines


def _one_round(tmp_path, rates):
    """A quick sweep: one round of the round robin only (each node has one partner)."""
    nodes = [f"n{i}" for i in range(8)]
    plan = fakebw.sweep_results(tmp_path / "res", nodes, rates)
    data = json.loads((plan.results / "plan.json").read_text())
    data["rounds"] = data["rounds"][:1]
    (plan.results / "plan.json").write_text(json.dumps(data))
    return plan.results, data["rounds"][0]


def test_a_retest_tells_the_bad_node_from_its_partner(tmp_path, capsys):
    results, first = _one_round(tmp_path, {"n5": 180.0})
    assert cmd.main(["report", str(results), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    pair = next(p for p in first if "n5" in p)
    assert data["suspect_nodes"] == [] and data["unresolved"] == [pair]  # node or link?
    lines = _retest(results, 1, {"n5": 180.0}, capsys)
    partner = next(n for n in pair if n != "n5")
    assert pair == ["n2", "n5"]  # round 1 of the circle method for n0..n7
    # the pair again, and each of its nodes with two nodes that were fine, in 3 rounds
    assert lines == ["01 n2 n5", "02 n2 n0", "02 n5 n3", "03 n2 n1", "03 n5 n4"]
    assert cmd.main(["report", str(results), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["suspect_nodes"] == ["n5"] and data["unresolved"] == []
    assert partner not in data["suspect_nodes"] and len(data["retests"]) == 5


def test_a_noisy_pair_that_recovers_on_retest_names_nothing(tmp_path, capsys):
    results = fakebw.sweep_results(tmp_path / "res", NODES4, {}).results
    noisy = results / "round-01" / "sfn1+sfn4.out"  # a hiccup on one pair, once
    noisy.write_text(fakebw.render(["sfn1", "sfn4"], 150.0, 1 << 30, 8 << 30, 2))
    assert cmd.main(["report", str(results)]) == 1
    assert "pair sfn1+sfn4 is at" in capsys.readouterr().out
    assert [x.split()[1:] for x in _retest(results, 1, {}, capsys)] == [["sfn1", "sfn4"]]
    assert cmd.main(["report", str(results), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["suspect_nodes"] == [] and data["suspect_links"] == []
    assert data["recovered"] == [["sfn1", "sfn4"]]
    assert _retest(results, 2, {}, capsys) == []  # nothing left: the job stops retesting


def test_a_bad_link_stays_a_link_after_retest(tmp_path, capsys):
    results = fakebw.sweep_results(tmp_path / "res", NODES4, {}).results
    slow = results / "round-01" / "sfn1+sfn4.out"
    slow.write_text(fakebw.render(["sfn1", "sfn4"], 150.0, 1 << 30, 8 << 30, 2))
    lines = _retest(results, 1, {}, capsys)
    # the retest measures it slow again (the double ignores the link, so write it again)
    (results / "retest-1" / "round-01" / "sfn1+sfn4.out").write_text(
        fakebw.render(["sfn1", "sfn4"], 150.0, 1 << 30, 8 << 30, 2))
    assert [x.split()[1:] for x in lines] == [["sfn1", "sfn4"]]
    assert cmd.main(["report", str(results), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["suspect_nodes"] == [] and data["suspect_links"] == [["sfn1", "sfn4"]]
    assert _retest(results, 2, {}, capsys) == []  # bad twice: confirmed, not run again


def test_baseline_from_good_sweeps_flags_a_drop_the_median_rule_misses(tmp_path, capsys):
    good = [fakebw.sweep_results(tmp_path / f"good{i}", NODES4, {}).results for i in (1, 2)]
    base = tmp_path / "baseline.json"
    assert cmd.main(["baseline", *map(str, good), "-o", str(base)]) == 0
    assert "4 nodes, 6 pairs from 2 sweep(s)" in capsys.readouterr().out
    data = json.loads(base.read_text())
    assert data["nodes"]["sfn2"]["samples"] == 2 and data["pairs"]["sfn1+sfn2"]["min"] > 350
    later = fakebw.sweep_results(tmp_path / "later", NODES4, {"sfn2": 330.0}).results
    assert cmd.main(["report", str(later)]) == 0  # 92 %: within 0.8 of the median
    capsys.readouterr()
    assert cmd.main(["report", str(later), "--baseline", str(base)]) == 1
    out = capsys.readouterr().out
    assert "drift: node sfn2 at 327.4 GB/s, 8 % below its baseline 357.2 GB/s" in out
    assert "drift: pair sfn1+sfn2 at 327.4 GB/s" in out and "sfn1+sfn3" not in out
    assert cmd.main(["report", str(later), "--baseline", str(base), "--drift", "0.1"]) == 0
    capsys.readouterr()
    assert cmd.main(["report", str(later), "--baseline", str(base), "--json"]) == 1
    drift = json.loads(capsys.readouterr().out)["drift"]
    assert [(d["kind"], d["what"]) for d in drift] == [
        ("node", "sfn2"), ("pair", "sfn1+sfn2"), ("pair", "sfn2+sfn3"), ("pair", "sfn2+sfn4")]


def test_a_broken_baseline_is_one_line_and_exit_2(tmp_path):
    results = fakebw.sweep_results(tmp_path / "res", NODES4, {}).results
    bad = tmp_path / "b.json"
    bad.write_text('{"version": 1, "nodes": {"sfn1": {"median": "fast"}}, "pairs": {}}')
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "pairs", "report", str(results),
                           "--baseline", str(bad)], capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 2 and "Traceback" not in proc.stderr
    assert lines[0].startswith("slurmfabric: error: pair-sweep baseline ")
    assert lines[0].endswith("b.json: not a file written by 'slurmfabric pairs baseline' "
                             "(ValueError: nodes.sfn1: no numeric median)")
    assert lines[1].startswith("HINT: ")


def test_markdown_report_lists_findings_and_every_node(tmp_path, capsys):
    results = fakebw.sweep_results(tmp_path / "res", NODES4, {"sfn3": 180.0}).results
    assert cmd.main(["report", str(results), "--markdown"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# Pair sweep report"
    assert "- every pair with sfn3 is at 50 % (178.6 vs 357.2 GB/s): suspect sfn3's NIC or " \
           "cable" in out
    rows = [line for line in out if line.startswith("| sfn")]
    assert rows[0] == "| sfn3 | 178.6 | suspect |" and len(rows) == 4


def test_a_large_sweeps_svg_is_one_bar_per_node_lowest_first(tmp_path, capsys):
    nodes = [f"n{i:02d}" for i in range(40)]
    plan = fakebw.sweep_results(tmp_path / "res", nodes, {"n17": 180.0})
    svg = tmp_path / "bars.svg"
    assert cmd.main(["report", str(plan.results), "--svg", str(svg)]) == 1
    root = ET.parse(svg).getroot()
    rects = [r for r in root.iter("{http://www.w3.org/2000/svg}rect")][1:]  # no background
    assert len(rects) == 40  # one bar per node, not 1,600 cells
    assert rects[0].find("{http://www.w3.org/2000/svg}title").text == "n17: 178.6 GB/s"
    red = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")
           if t.get("fill") == "#7f0000" and t.text in nodes]
    assert red == ["n17"]


@pytest.mark.parametrize("command", ["--command=-x", "--command= "])
def test_submit_refuses_a_test_command_without_a_program(tmp_path, command) -> None:
    """The task wrapper execs the command; a leading '-' would be exec's option."""
    with pytest.raises(UsageError, match="--command"):
        cmd.main(["submit", "--nodes", "n[1-4]", "--results", str(tmp_path / "r"), command,
                  "--dry-run"])


@pytest.mark.parametrize("name", ["%stub", "eval"])
def test_task_wrapper_runs_the_command_as_a_program(tmp_path, name) -> None:
    """'(exec "$@")': a name starting with '%' is not bash's fg ("Job Control Basics") and
    a builtin's name is looked up on PATH, in sh and in bash."""
    from slurmfabric.pairsweep.plan import _TASK_WRAPPER

    stub = tmp_path / name
    stub.write_text('#!/bin/sh\necho "ran $*"\n')
    stub.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_PROCID": "0"}
    for shell in ("/bin/sh", "bash"):
        proc = subprocess.run([shell, "-c", _TASK_WRAPPER, str(tmp_path / "t.tasks"), name,
                               "echo INJECTED"], env=env, capture_output=True, text=True)
        assert proc.stdout == "ran echo INJECTED\n", (shell, proc.stdout, proc.stderr)


def test_report_of_a_bimodal_sweep_names_a_slow_group_and_exits_1(tmp_path, capsys):
    # half the nodes at 42 % (synthetic through the nccl-tests double: issue 34); the
    # median of node medians falls to the slow rate, --expected blames every node
    nodes = [f"n{i}" for i in range(8)]
    plan = fakebw.sweep_results(tmp_path / "res", nodes, {n: 151.2 for n in nodes[:4]})
    for extra in ([], ["--expected", "360"]):
        assert cmd.main(["report", str(plan.results), "--json", *extra]) == 1
        data = json.loads(capsys.readouterr().out)
        assert data["slow_group"] == nodes[:4] and data["suspect_nodes"] == []
        assert data["messages"][0].startswith("4 of 8 nodes form a slow group at 42 %")
    assert cmd.main(["report", str(plan.results), "--markdown"]) == 1
    out = capsys.readouterr().out
    assert "| n0 | 150.0 | slow group |" in out and "| n7 | 150.0 | pass |" in out
