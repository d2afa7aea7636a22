"""The whatif model against published measurements (tests/fixtures/whatif/REFERENCES.md:
each number with its quote, URL and setup; T-numbers refer to its table) and the faults it
prices. Tolerances are the ones stated there."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from slurmfabric.nccl.tests import parse as parse_nccl_tests
from slurmfabric.whatif import model as whatif

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "whatif"
L70 = whatif.MODELS["llama3-70b"]


def job(**kw) -> whatif.Job:
    return whatif.Job(params=L70["params"], layers=L70["layers"], hidden=L70["hidden"], **kw)


def within(value: float, target: float, tolerance: float) -> bool:
    return abs(value - target) <= tolerance * target


def test_bus_bandwidth_matches_published_nccl_tests() -> None:
    # T4: one H100 node, ring: the recorded all_reduce_perf run itself
    (run,) = parse_nccl_tests((FIX / "nccl_tests_h100_1node_ring_together.txt").read_text())
    measured = run.large_message_busbw()
    assert measured == pytest.approx(368.0, abs=1.0)
    assert within(whatif.busbw(job(nodes=1))[0], measured, 0.05)
    assert within(whatif.busbw(job(nodes=1, nvls=True))[0], 480.0, 0.05)  # T5
    assert within(whatif.busbw(job(nodes=1, gpu="a100"))[0], 230.0, 0.05)  # T6
    # T9: 8 x 400G NDR per node, ring, many nodes: 370-396 GB/s ("roughly 350-380")
    for nodes in (2, 4, 16, 64):
        bw = whatif.expected_busbw([400.0] * 8, nodes=nodes)
        assert 350.0 <= bw <= 396.0
    # B200 + NDR, ring, 2-64 nodes: 388-390 measured, NIC-bound (Together scaling report)
    assert within(whatif.expected_busbw([400.0] * 8, gpu="b200"), 389.0, 0.03)
    # T10: DGX A100, 8 x 200G HDR: 192 GB/s (NVIDIA, nccl#812)
    assert within(whatif.expected_busbw([200.0] * 8, gpu="a100"), 192.0, 0.10)
    # T12: NCCL over TCP sockets on 100 GbE: 4-6 GB/s
    assert 4.0 <= whatif.busbw(job(nodes=4, fabric="tcp"))[0] <= 6.0
    # T13: RoCE against IB on the same 8 x 400G nodes: 0.9-1.05
    ratio = whatif.expected_busbw([400.0] * 8, "roce", gpu="b200") / \
        whatif.expected_busbw([400.0] * 8, "ib", gpu="b200")
    assert 0.9 <= ratio <= 1.05


def test_the_ring_runs_at_its_slowest_link() -> None:
    """Three 400G links and one 200G link make a 200G ring; one NIC at half rate halves the
    node count's share of every ring."""
    mixed = whatif.expected_busbw([400.0, 400.0, 400.0, 200.0], gpu="b200")
    assert mixed == pytest.approx(whatif.expected_busbw([200.0] * 4, gpu="b200"))
    assert mixed == pytest.approx(whatif.expected_busbw([400.0] * 4, gpu="b200") / 2)
    healthy = whatif.step(job(nodes=16, overlap=0.0))
    halved = whatif.step(job(nodes=16, overlap=0.0, slow_link=("gpu007", 0.5)))
    assert halved.busbw == pytest.approx(192.0) and healthy.busbw == pytest.approx(370.0)
    assert halved.comm == pytest.approx(healthy.comm * 370.0 / 192.0)


def test_training_throughput_matches_published_runs() -> None:
    # T18: torchtitan Llama3-70B, 64 A100, FSDP2 BF16, seq 8192, MFU 51.7 %: 331 tok/s/GPU
    a100 = job(nodes=8, gpu="a100", mfu=0.517, tokens_per_gpu=16384, port_rate=200.0)
    assert within(a100.tokens_per_gpu / whatif.step(a100).seconds, 331.0, 0.10)
    # T17: NeMo Llama3-70B, 64 H100, 719-738 model TFLOP/s per GPU: 1533-1621 tok/s/GPU
    for tflops, tokens in ((719.0, 1533.0), (738.0, 1621.0)):
        h100 = job(nodes=8, mfu=tflops * 1e12 / whatif.PEAK_FLOPS["h100"])
        assert within(h100.tokens_per_gpu / whatif.step(h100).seconds, tokens, 0.10)
    # without the attention term (shape unknown) the same run is ~15 % off: the term matters
    bare = replace(a100, layers=None, hidden=None)
    assert not within(bare.tokens_per_gpu / whatif.step(bare).seconds, 331.0, 0.10)


def test_tcp_costs_most_of_the_cluster_and_faults_are_priced() -> None:
    """16 x 8 H100, Llama3-70B sharded: over TCP the collectives alone take tens of seconds
    (the brief's "about 70 s a step"; the model says 84 s of collectives at 5 GB/s over one
    100 GbE NIC, and a scaling efficiency of a few percent with little compute per step)."""
    tcp = whatif.step(job(nodes=16, fabric="tcp", tokens_per_gpu=4096))
    assert 60.0 <= tcp.comm <= 100.0
    assert whatif.efficiency(job(nodes=16, fabric="tcp", tokens_per_gpu=4096)) < 0.08
    assert whatif.efficiency(job(nodes=16)) == pytest.approx(1.0)  # IB: hidden behind compute
    slow = whatif.faults(job(nodes=16, slow_gpu=("gpu003", 2, 0.5)))
    assert slow[0]["lost"] == pytest.approx(0.5, abs=0.01)  # everyone waits for it
    assert slow[0]["find"][0][0] == "slurmfabric health check"
    (gdr,) = whatif.faults(job(nodes=16, gdr=False, overlap=0.0))
    assert gdr["busbw"] == pytest.approx(8 * whatif.gdr_off_rate())
    assert gdr["lost"] > 0 and "nccl-log" in " ".join(c for c, _ in gdr["find"])


def test_the_command_prints_the_table_the_faults_and_an_svg(tmp_path) -> None:
    svg = tmp_path / "sweep.svg"
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "whatif", "--model",
                           "llama3-70b", "--nodes", "16", "--gpus-per-node", "8", "--fabric",
                           "ib", "--port-rate", "400", "--halve-cable", "gpu007",
                           "--overlap", "0", "--sweep", "--svg", str(svg)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "fault: one NIC of gpu007 at 0.5 of its rate" in out
    assert "busbw 370 -> 192 GB/s" in out
    assert "every pair with gpu007 is at 50 %" in out
    assert "   tcp     16" in out and "ib+fault     16" in out
    import xml.etree.ElementTree as ET

    root = ET.parse(svg).getroot()
    assert len(root.findall("{http://www.w3.org/2000/svg}polyline")) == 4
    data = json.loads(subprocess.run(
        [sys.executable, "-m", "slurmfabric", "whatif", "--params", "70e9", "--nodes", "4",
         "--json"], capture_output=True, text=True).stdout)
    assert data["step"]["busbw"] == 370.0 and data["faults"] == []
    for bad in (["--params", "nan"], ["--params", "70e9", "--slow-gpu", "n1:x:0.5"],
                ["--params", "70e9", "--nodes", "1", "--halve-cable", "n1"],
                ["--params", "70e9", "--svg", str(svg)]):
        proc = subprocess.run([sys.executable, "-m", "slurmfabric", "whatif", *bad],
                              capture_output=True, text=True)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (bad, proc.stderr)


def test_pairs_report_takes_its_expectation_from_the_model(tmp_path, capsys) -> None:
    """A sweep of H100 pairs at 300 GB/s, judged against what the fixture node's 8 NDR rails
    should carry (a 'topo snapshot' of it): 384 GB/s, so 0.8 x 384 = 307 flags every pair,
    while the sweep's own median would call it healthy."""
    import fakebw
    import fakesysfs
    import nodes as fixture_nodes

    from slurmfabric.commands import pairs
    from slurmfabric.topology import discover, snapshot

    root = fakesysfs.build(fixture_nodes.h100_ib(), tmp_path / "h100")
    snap = tmp_path / "gpu001.json"
    snapshot.write_json(discover(str(root)), snap)
    plan = fakebw.sweep_results(tmp_path / "res", ["n1", "n2", "n3", "n4"],
                                {n: 300.0 for n in ("n1", "n2", "n3", "n4")})
    assert pairs.main(["report", str(plan.results), "--json"]) == 0
    capsys.readouterr()
    assert pairs.main(["report", str(plan.results), "--json", "--expected-from",
                       str(snap)]) == 1
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["judge"]["expected"] == pytest.approx(8 * 48.0)
    assert len(data["low_pairs"]) == 6
    assert out.err.startswith("expected 384.0 GB/s: 8 ib rails of 400 Gb/s (mlx5_0:1,")


def test_the_testbed_shape_sweeps_over_tcp() -> None:
    """The README's second example, as written: 4 one-GPU nodes on a 10 GbE front end."""
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "whatif", "--params", "1e9",
                           "--nodes", "4", "--gpus-per-node", "1", "--fabric", "tcp",
                           "--frontend-rate", "10", "--sweep"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("   tcp")]
    assert [r[1] for r in rows] == ["1", "2", "4"]
    assert float(rows[1][3]) == pytest.approx(10 / 8 * whatif.TCP_EFFICIENCY)  # 0.5 GB/s
    assert float(rows[2][2]) > float(rows[0][2])  # more nodes, slower steps over TCP


def test_the_sweep_plot_draws_one_line_per_fabric_and_escapes_the_title() -> None:
    """whatif/svg.py owns the picture: one polyline per fabric of the rows it is given
    (the faulty job's ``+fault`` rows are a fabric of their own), markup in a title escaped."""
    import xml.etree.ElementTree as ET

    from slurmfabric.whatif import svg

    faulty = job(nodes=8, gpus_per_node=8, slow_link=("n3", 0.5))
    rows = whatif.sweep_rows(faulty)
    assert {r["fabric"] for r in rows} == {"ib", "roce", "tcp", "ib+fault"}
    root = ET.fromstring(svg.render(rows, "a <b> & c"))
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 4
    assert root.find(f"{ns}text").text == "a <b> & c"
    plain = whatif.sweep_rows(whatif.healthy(faulty))  # no fault: no "+fault" rows
    assert rows[:len(plain)] == plain and len(rows) > len(plain)
