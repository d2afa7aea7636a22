"""``slurmfabric ib routes`` on recorded outputs of the real tools (tests/fixtures/ib/
SOURCES.md: ibsim + OpenSM, threeleaf.net): the LFT walk, the shortest path the cabling
allows, the up-link balance, and bad input. The live run is tests/sim/test_ibroutes_sim.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmfabric.ibaudit import names, parse, routes

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ib"
LINKS = FIX / "sim_threeleaf_iblinkinfo_line.txt"


def fabric(lfts: str) -> routes.Fabric:
    return routes.build(parse.parse_iblinkinfo(LINKS.read_text()),
                        routes.parse_ibroute((FIX / lfts).read_text()), names.NodeNamer())


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmfabric", "ib", "routes", *args],
                          capture_output=True, text=True)


def test_ibroute_tables_parse_to_every_switch_and_destination() -> None:
    tables = routes.parse_ibroute((FIX / "sim_threeleaf_lfts_minhop.txt").read_text())
    assert sorted(sw.desc for sw in tables.values()) == ["leaf1", "leaf2", "leaf3", "spine1",
                                                         "spine2"]
    leaf1 = next(sw for sw in tables.values() if sw.desc == "leaf1")
    assert len(leaf1.lft) == 11 and leaf1.lft[leaf1.lid] == 0  # 11 LIDs, itself on port 0
    net = fabric("sim_threeleaf_lfts_minhop.txt")
    assert [h.name for h in net.hcas] == [f"sfn0{i}" for i in range(1, 7)]


def test_minhop_routes_are_shortest_and_balanced() -> None:
    net = fabric("sim_threeleaf_lfts_minhop.txt")
    assert routes.check(net) == []
    sfn01, sfn05 = net.hcas[0], net.hcas[4]
    path, error = routes.walk(net, sfn01, sfn05)
    assert error == "" and len(path) == 3


def test_a_pinned_detour_and_a_lopsided_leaf_are_named() -> None:
    found = routes.check(fabric("sim_threeleaf_lfts_pinned.txt"))
    long = sorted(f.where for f in found if f.kind == "route-long")
    assert long == ["sfn01 -> sfn05", "sfn02 -> sfn05"]
    detour = next(f for f in found if f.kind == "route-long")
    assert detour.path == ("leaf1", "spine1", "leaf2", "spine2", "leaf3")
    assert "5 switches" in detour.detail and "the cabling allows 3" in detour.detail
    (lop,) = [f for f in found if f.kind == "uplink-unbalanced"]
    assert lop.where == "leaf1" and "port 5 (spine1) 4, port 6 (spine2) 0" in lop.detail


def test_a_missing_entry_and_a_loop_are_broken_routes() -> None:
    net = fabric("sim_threeleaf_lfts_minhop.txt")
    by_desc = {sw.desc: sw for sw in net.switches.values()}
    sfn05 = net.hcas[4]
    del by_desc["leaf1"].lft[sfn05.lid]
    by_desc["leaf2"].lft[net.hcas[5].lid] = 5  # sfn06 via spine1 ...
    spine1 = by_desc["spine1"]
    spine1.lft[net.hcas[5].lid] = next(p for (g, p), (peer, _) in net.peers.items()
                                       if g == spine1.guid and net.name(peer) == "leaf2")
    found = {(f.kind, f.where): f.detail for f in routes.check(net)}
    assert found[("route-broken", "sfn01 -> sfn05")] == \
        f"leaf1 has no route to LID {sfn05.lid}"
    assert found[("route-broken", "sfn03 -> sfn06")].startswith("loop at leaf2")


def test_the_command_on_recorded_input_and_bad_input() -> None:
    proc = cli("--input", str(LINKS), "--lfts", str(FIX / "sim_threeleaf_lfts_pinned.txt"),
               "--json")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["switches"] == 5 and data["hcas"] == 6 and len(data["findings"]) == 3
    ok = cli("--input", str(LINKS), "--lfts", str(FIX / "sim_threeleaf_lfts_minhop.txt"))
    assert ok.returncode == 0 and ok.stdout.startswith("routes: every pair takes a shortest")
    for args, says in ((["--input", str(LINKS)], "--input and --lfts go together"),
                       (["--input", str(LINKS), "--lfts", str(LINKS)],
                        "no switch forwarding table found")):
        bad = cli(*args)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("limit", [1, 50])
def test_the_text_report_caps_its_lines_and_counts_every_kind(limit) -> None:
    found = routes.check(fabric("sim_threeleaf_lfts_pinned.txt"))
    text = routes.format_findings(found, limit)
    assert text.splitlines()[-1] == "routes: 2 route-long, 1 uplink-unbalanced"
    assert ("... and 2 more" in text) == (limit == 1)
