"""From slow pairs to the cable, on a real ibnetdiscover output of the simulated fat tree
(tests/fixtures/ib/sim_healthy_ibnetdiscover.txt: ibnetdiscover run against ibsim with
tests/fixtures/ib/fattree.net, see tests/fixtures/ib/SOURCES.md) and on the same fabric with
one spine taken out, where every path between the two leaves shares one uplink."""

from __future__ import annotations

import json
import re
from pathlib import Path

import fakebw

from slurmfabric.commands import pairs as cmd
from slurmfabric.ibaudit.names import NodeNamer
from slurmfabric.ibaudit.parse import parse_ibnetdiscover
from slurmfabric.pairsweep.paths import Fabric, shared_cables
from slurmfabric.pairsweep.report import analyze, with_cables

IB = Path(__file__).resolve().parents[1] / "fixtures" / "ib"
TOPO = IB / "sim_healthy_ibnetdiscover.txt"
NODES = [f"sfn0{i}" for i in range(1, 9)]
LEAF1 = set(NODES[:4])


def one_spine(text: str) -> str:
    """The same discovery without spine2 (guid 0x200001): its block and the cables to it."""
    blocks = [b for b in text.split("\n\n") if "switchguid=0x200001(" not in b]
    lines = [ln for ln in "\n\n".join(blocks).splitlines() if '"S-0000000000200001"[' not in ln]
    return "\n".join(lines) + "\n"


def sweep(tmp: Path, slow) -> Path:
    """A full 8-node sweep (the test double's output), with ``slow(pair)`` at 90 GB/s."""
    plan = fakebw.sweep_results(tmp / "res", NODES, {})
    for i, rnd in enumerate(plan.rounds):
        for a, b in rnd:
            if slow((a, b)):
                out = plan.results / f"round-{i + 1:02d}" / f"{a}+{b}.out"
                out.write_text(fakebw.render([a, b], 90.0, 1 << 30, 8 << 30, 2))
    return plan.results


def test_the_fabric_is_read_from_real_ibnetdiscover_output() -> None:
    fabric = Fabric.from_topology(parse_ibnetdiscover(TOPO.read_text()), NodeNamer())
    assert sorted(fabric.hcas) == NODES and len(fabric.cables) == 12
    every, some = fabric.cables_between("sfn01", "sfn05", {})
    labels = sorted(fabric.cables[i].label for i in every)
    assert labels == ["sfn01 HCA-1/1 <-> leaf1/1", "sfn05 HCA-1/1 <-> leaf2/1"]
    assert len(some) == 6  # and both spines' uplinks: two equal paths
    every, some = fabric.cables_between("sfn01", "sfn02", {})
    assert every == some and len(every) == 2  # one leaf: the two access cables only


def test_a_nodes_own_cable_is_named_with_the_commands_that_check_it(tmp_path, capsys):
    results = sweep(tmp_path, lambda p: "sfn02" in p)
    assert cmd.main(["report", str(results), "--topology", str(TOPO), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["suspect_nodes"] == ["sfn02"]
    (cable,) = data["cables"]
    assert cable["cable"] == "sfn02 HCA-1/1 <-> leaf1/2" and cable["node"] == "sfn02"
    assert len(cable["explains"]) == 7
    guid = re.search(r'switchguid=(0x200002)', TOPO.read_text()).group(1)
    assert cable["commands"][1] == f"perfquery -x -G 0x{guid[2:].rjust(16, '0')} 2"
    assert cable["commands"][2] == "ibstat (on sfn02)"


def test_a_shared_degraded_uplink_is_named_and_its_nodes_are_not_blamed(tmp_path, capsys):
    topo = tmp_path / "one-spine.txt"
    topo.write_text(one_spine(TOPO.read_text()))
    fabric = Fabric.from_topology(parse_ibnetdiscover(topo.read_text()), NodeNamer())
    assert len(fabric.cables) == 10  # 8 access cables and the two uplinks to spine1
    results = sweep(tmp_path, lambda p: (p[0] in LEAF1) != (p[1] in LEAF1))  # leaf to leaf
    # Most pairs are slow, so the median is too: judge against the sweep's best.
    assert cmd.main(["report", str(results), "--json", "--reference", "best"]) == 1
    blind = json.loads(capsys.readouterr().out)
    assert blind["suspect_nodes"] == NODES  # 4 of 7 partners bad: everyone looks guilty
    assert cmd.main(["report", str(results), "--topology", str(topo), "--json",
                     "--reference", "best"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["suspect_nodes"] == []
    assert [c["cable"] for c in data["cables"]] == ["spine1/1 <-> leaf1/5",
                                                   "spine1/2 <-> leaf2/5"]
    assert all(len(c["explains"]) == 16 and c["node"] is None for c in data["cables"])
    assert ("sfn03: every bad pair of it crosses a cable named above: not a suspect itself"
            in data["messages"])
    assert data["behind_cables"] == NODES  # none of them passes a burn-in gate either


def test_no_cable_is_blamed_that_a_good_pair_uses() -> None:
    fabric = Fabric.from_topology(parse_ibnetdiscover(TOPO.read_text()), NodeNamer())
    # One slow pair between good nodes: their access cables carry good pairs too.
    values = {(a, b): 360.0 for i, a in enumerate(NODES) for b in NODES[i + 1:]}
    values[("sfn01", "sfn05")] = 90.0
    analysis = analyze(NODES, values)
    assert analysis.suspect_links == [("sfn01", "sfn05")]
    good = [p for p in values if p != ("sfn01", "sfn05")]
    assert shared_cables(fabric, analysis.flagged, good) == []
    assert with_cables(analysis, []).suspect_links == [("sfn01", "sfn05")]


def test_topology_pattern_pairs_by_distance_in_few_rounds(tmp_path, capsys) -> None:
    from slurmfabric.pairsweep.paths import distances, topology_rounds

    fabric = Fabric.from_topology(parse_ibnetdiscover(TOPO.read_text()), NodeNamer())
    table = distances(fabric, NODES)
    assert table["sfn01"]["sfn02"] == 2 and table["sfn01"]["sfn05"] == 4  # leaf, via spine
    rounds = topology_rounds(fabric, NODES, [2, 4, 6])
    assert rounds == [[("sfn01", "sfn02"), ("sfn03", "sfn04"), ("sfn05", "sfn06"),
                       ("sfn07", "sfn08")],
                      [("sfn01", "sfn05"), ("sfn02", "sfn06"), ("sfn03", "sfn07"),
                       ("sfn04", "sfn08")]]  # no 6-cable path in a 2-level tree
    res = tmp_path / "r"
    assert cmd.main(["submit", "--nodes", "sfn0[1-8]", "--results", str(res), "--pattern",
                     "topology", "--topology", str(TOPO), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "8 nodes, 8 pairs in 2 rounds" in out


def test_topology_pattern_refuses_what_it_cannot_schedule(tmp_path) -> None:
    import pytest

    from slurmfabric.errors import UsageError

    base = ["submit", "--nodes", "sfn0[1-8]", "--results", str(tmp_path / "r"), "--pattern",
            "topology", "--dry-run"]
    for extra, message in (([], "needs --topology"),
                           (["--topology", str(TOPO), "--hops", "two"], "even cable counts"),
                           (["--topology", str(TOPO), "--hops", "6"], "no two nodes"),
                           (["--topology", str(TOPO), "--nodes", "gpu[1-2]"], "no HCA of")):
        with pytest.raises(UsageError, match=message):
            cmd.main([*base, *extra])


RAIL_TOPO = IB / "sim_rail_ibnetdiscover.txt"  # ibsim on railfabric.net, see SOURCES.md


def test_a_rail_optimised_fabric_keeps_rails_apart() -> None:
    """Two HCAs per node, each on its own rail's leaf: the pair's paths run rail 1 to rail
    1 and rail 2 to rail 2. Pairing each HCA with the *nearest* HCA of the other node sent
    both of sfn01's rails to sfn05's rail 1 (both at 4 cables), so sfn05's rail-2 cable was
    on no path and could never be named."""
    from slurmfabric.pairsweep.paths import distances, topology_rounds

    rail = Fabric.from_topology(parse_ibnetdiscover(RAIL_TOPO.read_text()), NodeNamer())
    assert rail.rails == 2
    assert Fabric.from_topology(parse_ibnetdiscover(TOPO.read_text()), NodeNamer()).rails == 0
    assert [rail.desc[d] for d in rail.hcas["sfn05"]] == ["sfn05 HCA-1", "sfn05 HCA-2"]
    every, _ = rail.cables_between("sfn01", "sfn05", {})
    assert sorted(rail.cables[i].label for i in every) == [
        "sfn01 HCA-1/1 <-> su1-rail1/1", "sfn01 HCA-2/1 <-> su1-rail2/1",
        "sfn05 HCA-1/1 <-> su2-rail1/1", "sfn05 HCA-2/1 <-> su2-rail2/1"]
    table = distances(rail, NODES)
    assert table["sfn01"]["sfn04"] == 2 and table["sfn04"]["sfn05"] == 4
    assert topology_rounds(rail, NODES, [2, 4])[-1] == [
        ("sfn01", "sfn05"), ("sfn02", "sfn06"), ("sfn03", "sfn07"), ("sfn04", "sfn08")]


def test_a_leaf_with_two_rails_is_not_rail_optimised() -> None:
    """sfn01's second HCA moved onto the rail-1 leaf of its unit: rails are not separable,
    so pairs fall back to the nearest HCA."""
    text = RAIL_TOPO.read_text()
    moved = '"H-0000000000100002"[1](100003) \t\t# "sfn01 HCA-2" lid 5 12xQDR\n'
    text = text.replace("[1]\t" + moved, "")
    text = text.replace('# "su1-rail1" base port 0 lid 4 lmc 0\n',
                        '# "su1-rail1" base port 0 lid 4 lmc 0\n'
                        "[7]\t" + moved)
    text = text.replace('[1](100003) \t"S-0000000000200003"[1]\t\t# lid 5 lmc 0 "su1-rail2"',
                        '[1](100003) \t"S-0000000000200002"[7]\t\t# lid 5 lmc 0 "su1-rail1"')
    fabric = Fabric.from_topology(parse_ibnetdiscover(text), NodeNamer())
    assert fabric.rails == 0 and len(fabric.hcas["sfn01"]) == 2
    every, _ = fabric.cables_between("sfn01", "sfn02", {})
    assert "sfn02 HCA-2/1 <-> su1-rail2/1" not in {fabric.cables[i].label for i in every}
