"""Bus bandwidth against message size (slurmfabric/nccl/curve.py) on a real sweep: the
recorded 1-node H100 ring run of tests/fixtures/whatif/ (Together's nccl-tests results,
cited there), whole, halved from 128 MiB up (the same rows at half their busbw: what one
NVLink or NIC at half rate gives a ring), and cut short. The expected curve is the whatif
collective model's."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from slurmfabric.nccl import curve
from slurmfabric.nccl import tests as nccl_tests

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "whatif"
RING = curve.Shape(nodes=1, gpus_per_node=8, rates_gbps=(), algo="ring")


@pytest.fixture(scope="module")
def rows() -> list[tuple[int, float]]:
    (run,) = nccl_tests.parse((FIX / "nccl_tests_h100_1node_ring_together.txt").read_text())
    assert run.collective == "all_reduce_perf"
    return [(row.size, row.busbw) for row in run.rows]


def test_a_healthy_sweep_is_within_the_curve(rows) -> None:
    got = curve.judge("all_reduce_perf", rows, RING)
    assert got.state == "OK" and got.findings == ["within the expected curve from 1M to 8G"]
    assert not any(p.short for p in got.points)
    # the model's curve rises with size like the measurement: latency-bound, then the plateau
    want = [p.expected for p in got.points]
    assert want == sorted(want) and 360 < want[-1] < 375


def test_a_halved_range_is_named_with_its_worst_size(rows) -> None:
    halved = [(s, b / 2 if s >= 1 << 27 else b) for s, b in rows]
    got = curve.judge("all_reduce_perf", halved, RING)
    assert got.state == "SHORT"
    assert got.findings == ["short of the expected curve from 128M to 8G: at 256M 173.9 GB/s "
                            "against 357.6 expected (49 %)"]
    assert [p.size for p in got.points if p.short][0] == 1 << 27


def test_a_dip_in_the_middle_is_its_own_range(rows) -> None:
    dip = [(s, b * 0.5 if s == 1 << 24 else b) for s, b in rows]
    got = curve.judge("all_reduce_perf", dip, RING)
    assert got.state == "SHORT" and got.findings[0].startswith(
        "short of the expected curve from 16M to 16M")


def test_a_short_sweep_cannot_tell_never_ok(rows) -> None:
    short = [r for r in rows if r[0] <= 1 << 27]
    got = curve.judge("all_reduce_perf", short, RING)
    assert got.state == "CANNOT_TELL"
    assert got.findings == ["cannot tell above 128M: bus bandwidth saturates from 1G; rerun "
                            "up to -e 8G"]
    tiny = curve.judge("all_reduce_perf", [(8, 0.0), (1024, 0.03)], RING)
    assert tiny.state == "CANNOT_TELL" and "no size of 1M or more" in tiny.findings[0]
    other = curve.judge("alltoall_perf", rows, RING)
    assert other.state == "CANNOT_TELL" and "no model of alltoall_perf" in other.findings[0]


def test_the_default_expectation_is_ncclss_own_pick(rows) -> None:
    """Without --algo the curve is NCCL's fastest algorithm: on H100 that is NVLink SHARP, so
    a run forced to the ring shows short at large sizes (the reason to say --algo ring)."""
    got = curve.judge("all_reduce_perf", rows, curve.Shape(1, 8, ()))
    assert got.state == "SHORT" and got.points[-1].expected > 470


def test_the_svg_and_the_page_show_both_curves_and_the_short_range(rows) -> None:
    halved = [(s, b / 2 if s >= 1 << 27 else b) for s, b in rows]
    got = curve.judge("all_reduce_perf", halved, RING)
    root = ET.fromstring(curve.svg(got, "all_reduce_perf <1 node>"))
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    assert [line.find(f"{ns}title").text for line in lines] == ["measured busbw", "expected"]
    assert len(lines[0].get("points").split()) == len(rows)
    assert root.find(f"{ns}rect[@class='short']") is not None
    assert "all_reduce_perf &lt;1 node&gt;" in curve.svg(got, "all_reduce_perf <1 node>")
    page = curve.html(got, "sweep")
    assert "default-src 'none'" in page and "<script" not in page
    assert len(re.findall(r'<tr class="short">', page)) == 7
    assert "result: <strong>SHORT</strong>" in page


def cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "slurmfabric", "nccl-tests", "parse", *args],
                          capture_output=True, text=True)


def test_the_command_draws_and_judges_the_curve(tmp_path, rows) -> None:
    ring = FIX / "nccl_tests_h100_1node_ring_together.txt"
    svg, page = tmp_path / "c.svg", tmp_path / "c.html"
    ok = cli(str(ring), "--svg", str(svg), "--html", str(page), "--nodes", "1",
             "--gpus-per-node", "8", "--algo", "ring")
    assert ok.returncode == 0, ok.stderr
    assert "  curve: within the expected curve from 1M to 8G" in ok.stdout
    assert ET.fromstring(svg.read_text()).tag.endswith("svg") and "<svg" in page.read_text()
    # the same rows halved from 128 MiB: exit 1, the range named
    text = ring.read_text().splitlines()
    halved = []
    for line in text:
        parts = line.split()
        if parts and parts[0].isdigit() and int(parts[0]) >= 1 << 27:
            parts[7], parts[11] = (f"{float(parts[7]) / 2:.2f}", f"{float(parts[11]) / 2:.2f}")
            line = "  " + "  ".join(parts)
        halved.append(line)
    bad = tmp_path / "halved.txt"
    bad.write_text("\n".join(halved) + "\n")
    short = cli(str(bad), "--curve", "--nodes", "1", "--gpus-per-node", "8", "--algo", "ring",
                "--json")
    assert short.returncode == 1
    import json

    data = json.loads(short.stdout)
    assert data["runs"][0]["curve"]["state"] == "SHORT"
    assert data["runs"][0]["curve"]["findings"][0].startswith(
        "short of the expected curve from 128M to 8G")
    refused = cli(str(ring), "--curve", "--algo", "bogus")
    assert refused.returncode == 2 and "--algo 'bogus'" in refused.stderr
    assert "Traceback" not in refused.stderr
