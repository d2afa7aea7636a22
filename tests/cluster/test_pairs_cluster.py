"""Pair sweep on the real local Slurm testbed: one degraded node must be named, alone."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET

import pytest

pytestmark = pytest.mark.cluster

DEGRADED = 180.0  # GB/s for the bad node; the others run at the fake's default 360


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "slurmfabric", *args]


def test_pair_sweep_finds_the_degraded_node(cluster, tmp_path):
    nodes = cluster.nodes
    assert len(nodes) == 4
    bad = nodes[2]
    results = tmp_path / "sweep"
    env = {
        "SLURMFABRIC_FAKEBW": json.dumps({bad: DEGRADED}),
        "SLURMFABRIC_FAKEBW_SECONDS": "2",  # long enough that a round's steps overlap
    }
    fake = f"{sys.executable} -m slurmfabric.validate.fakebw -b 256M -e 8G -f 2 -g 1"
    sub = cluster.run(_cli("pairs", "submit", "--nodes", ",".join(nodes),
                           "--results", str(results), "--partition", cluster.partition,
                           "--time", "5", "--command", fake), env=env)
    job_id = re.search(r"submitted job (\d+)", sub.stdout).group(1)
    state = cluster.wait(job_id, timeout=240)
    job_out = "".join(p.read_text() for p in results.glob("job-*.out"))
    assert state == "COMPLETED", job_out

    svg = tmp_path / "pairs.svg"
    rep = cluster.run(_cli("pairs", "report", str(results), "--json", "--svg", str(svg)),
                      check=False)
    assert rep.returncode == 1, rep.stderr  # a suspect was found
    data = json.loads(rep.stdout)
    assert data["suspect_nodes"] == [bad]
    assert data["suspect_links"] == []
    assert data["execution_problems"] == []
    assert any(m.startswith(f"every pair with {bad} is at 50 %") for m in data["messages"])

    # The matrix holds every pair exactly once, with the slow node's pairs at its rate.
    pairs = data["pairs"]
    keys = [frozenset(p["pair"]) for p in pairs]
    assert len(keys) == len(set(keys)) == 6
    for p in pairs:
        assert p["busbw"] is not None and p["rc"] == 0
        expected = DEGRADED if bad in p["pair"] else 360.0
        assert expected * 0.95 < p["busbw"] <= expected
    m = data["matrix"]
    assert all(m[i][i] is None for i in range(4))
    assert all(m[i][j] == m[j][i] for i in range(4) for j in range(4))

    # From what the job recorded (not the schedule function): per round, every task line
    # names a node of its own pair and no node shows up in two pairs of the same round.
    rounds = sorted(results.glob("round-*"))
    assert len(rounds) == 3
    for round_dir in rounds:
        seen: list[str] = []
        spans = []
        for tasks in sorted(round_dir.glob("*.tasks")):
            lines = [line.split() for line in tasks.read_text().splitlines()]
            starts = [ln for ln in lines if ln[3] == "start"]
            ends = [ln for ln in lines if ln[3] == "end"]
            ran_on = {ln[1] for ln in starts}
            assert ran_on == set(tasks.stem.split("+")), tasks
            assert all(ln[5] == "0" for ln in ends) and len(ends) == 2
            seen += sorted(ran_on)
            spans.append((min(float(ln[4]) for ln in starts), max(float(ln[4]) for ln in ends)))
        assert len(seen) == len(set(seen)) == 4, (round_dir.name, seen)
        # The two steps of a round really ran at the same time.
        assert max(s for s, _ in spans) < min(e for _, e in spans), (round_dir.name, spans)

    # The picture is a valid SVG naming every node and the suspect.
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert all(any(t == n for t in texts) for n in nodes)
    assert any(f"suspect {bad}'s NIC" in t for t in texts)
    rects = list(root.iter("{http://www.w3.org/2000/svg}rect"))
    assert len(rects) == 1 + 16  # background + 4 x 4 cells

    table = cluster.run(_cli("pairs", "report", str(results)), check=False)
    print(table.stdout)  # the report table, for the issue note (pytest -s)
    assert f"every pair with {bad}" in table.stdout
