"""``slurmfabric ib routes`` on a simulated fabric whose routes the real OpenSM programs.

ibsim runs a 2-spine/3-leaf fat tree (tests/fixtures/ib/threeleaf.net). First opensm's
default engine (minhop) routes it: every pair takes a shortest path and the leaves spread
their destinations over both spines, so ``ib routes`` reports nothing. Then OpenSM's
``file`` routing engine (opensm(8) ``-R file -U FILE``: unicast routes loaded from a dump in
ibroute's format, the way a site pins routes) loads tables that a mistaken dump would give:
sfn05's LID goes leaf1 -> spine1 -> leaf2 -> spine2 -> leaf3, five switches where the cabling
allows three, and leaf1 sends all four remote destinations up through spine1. The audit
must name exactly those pairs, that path and that leaf, and its path must be the one the
real ``ibtracert`` walks. These tests fail (never skip) when the simulator packages are
missing: CI installs them (see tests/ib_sim.py PACKAGES).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import ib_sim
import pytest

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parent.parent.parent
NET = ROOT / "tests" / "fixtures" / "ib" / "threeleaf.net"


def routes(sim: ib_sim.SimFabric, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmfabric", "ib", "routes", *args],
                          capture_output=True, text=True, cwd=sim.workdir,
                          env={**os.environ, **sim.env}, timeout=120)


def set_route(dump: str, switch: str, lid: int, port: int) -> str:
    """One LFT entry of one switch changed in an ibroute dump."""
    out, current = [], None
    for line in dump.splitlines():
        head = re.match(r"Unicast lids .* \((.*)\):", line)
        if head:
            current = head.group(1)
        row = re.match(r"(0x[0-9a-f]{4}) \d{3} :", line)
        if row and current == switch and int(row.group(1), 16) == lid:
            line = f"{row.group(1)} {port:03d} :" + line[len(row.group(0)):]
        out.append(line)
    return "\n".join(out) + "\n"


def lids(sim: ib_sim.SimFabric) -> dict[str, int]:
    """Node description's first word -> LID, from the real ibroute's own rows (ibhosts
    prints no LID): one switch's table names every LID of the fabric."""
    first = re.search(r"lid (\d+) lmc", sim.run_tool(["ibswitches"]))
    assert first
    table = sim.run_tool(["ibroute", first.group(1)])
    return {m.group(2): int(m.group(1), 16)
            for m in re.finditer(r"^(0x[0-9a-f]+) \d+ : \(.*'(\S+)[^']*'\)$", table, re.M)}


def test_programmed_detours_and_a_lopsided_leaf_are_named(tmp_path: Path) -> None:
    sim = ib_sim.start(tmp_path / "fabric", NET.read_text())
    try:
        healthy = routes(sim, "--json")
        assert healthy.returncode == 0, healthy.stderr
        data = json.loads(healthy.stdout)
        assert data["findings"] == [] and data["switches"] == 5 and data["hcas"] == 6
        lid = lids(sim)
        dump = "".join(sim.run_tool(["ibroute", str(lid[s])])
                       for s in ("spine1", "spine2", "leaf1", "leaf2", "leaf3"))
        bad = dump
        for node in ("sfn03", "sfn04", "sfn05", "sfn06"):  # leaf1: every one via spine1
            bad = set_route(bad, "leaf1", lid[node], 5)
        bad = set_route(bad, "spine1", lid["sfn05"], 2)  # ... then to leaf2,
        bad = set_route(bad, "leaf2", lid["sfn05"], 6)  # back up to spine2,
        bad = set_route(bad, "spine2", lid["sfn05"], 3)  # and down to leaf3
        table = tmp_path / "pinned.lfts"
        table.write_text(bad)
        sim.run_tool(["opensm", "--once", "-R", "file", "-U", str(table), "-f",
                      str(tmp_path / "opensm-file.log")])
        trace = sim.run_tool(["ibtracert", str(lid["sfn01"]), str(lid["sfn05"])])
        traced = tuple(re.findall(r'-> switch port .* "(\S+)"', trace))
        assert traced == ("leaf1", "spine1", "leaf2", "spine2", "leaf3")  # what OpenSM set
        proc = routes(sim, "--json")
        assert proc.returncode == 1, proc.stderr
        found = json.loads(proc.stdout)["findings"]
        long = {f["where"]: tuple(f["path"]) for f in found if f["kind"] == "route-long"}
        assert long == {"sfn01 -> sfn05": traced, "sfn02 -> sfn05": traced}
        (lopsided,) = [f for f in found if f["kind"] == "uplink-unbalanced"]
        assert lopsided["where"] == "leaf1"
        assert "port 5 (spine1) 4, port 6 (spine2) 0" in lopsided["detail"]
        assert len(found) == 3
        # pairs of these nodes only: sfn05's detour is not theirs, and leaf1's two remote
        # destinations on one port are one away from even, which the rule tolerates
        mine = routes(sim, "--nodes", "sfn[01-04]")
        assert mine.returncode == 0, mine.stdout
        assert mine.stdout.startswith("routes: every pair takes a shortest path")
    finally:
        sim.stop()
