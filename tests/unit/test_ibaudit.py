"""Audit rules, node naming, metrics and the CLI on recorded outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmfabric._common import prom
from slurmfabric.commands import ib as cmd
from slurmfabric.errors import UsageError
from slurmfabric.ibaudit import audit as fa
from slurmfabric.ibaudit import metrics, names, parse

FIX = Path(__file__).parent.parent / "fixtures" / "ib"
NAMER = names.NodeNamer()


def links_of(name: str) -> list[fa.Link]:
    return fa.build_links(parse.parse_iblinkinfo((FIX / name).read_text()), NAMER)


def test_build_links_pairs_both_ends_and_names_nodes() -> None:
    links = links_of("sim_healthy_iblinkinfo_line.txt")
    assert len(links) == 12
    nodes = sorted(link.node for link in links if link.node)
    assert nodes == [f"sfn0{i}" for i in range(1, 9)]
    sfn03 = [link for link in links if link.node == "sfn03"][0]
    assert sfn03.label == "sfn03 HCA-1/1 <-> leaf1/3"
    assert (sfn03.a.lid, sfn03.b.lid, sfn03.state, sfn03.rate) == (7, 4, "Active", 120.0)
    assert all(link.node is None for link in links if link.a.node_type == "Switch")


def test_healthy_fabric_has_no_findings() -> None:
    links = links_of("sim_healthy_iblinkinfo_line.txt")
    topo = parse.parse_ibnetdiscover((FIX / "sim_healthy_ibnetdiscover.txt").read_text())
    expected = fa.expected_from_topology(topo, NAMER)
    assert len(expected) == 12
    counters = {link.a.key: {"SymbolErrorCounter": 0} for link in links}
    assert fa.audit(links, counters, expected=expected, expect_nodes=["sfn01", "sfn08"]) == []
    assert fa.format_table([]) == "ib audit: no problems found"


def test_faulty_fabric_findings_name_the_nodes() -> None:
    links = links_of("sim_faulty_iblinkinfo_line.txt")
    topo = parse.parse_ibnetdiscover((FIX / "sim_healthy_ibnetdiscover.txt").read_text())
    sfn05 = [link for link in links if link.node == "sfn05"][0]
    counters = {sfn05.a.key: {"SymbolErrorCounter": 42, "LinkDownedCounter": 3}}
    findings = fa.audit(
        links, counters, expected=fa.expected_from_topology(topo, NAMER),
        thresholds={"LinkDownedCounter": 0},
    )
    got = [(f.severity, f.check, f.node) for f in findings]
    assert got == [
        ("critical", "link-down", "sfn03"),
        ("error", "link-degraded", "sfn02"),
        ("error", "link-degraded", "sfn07"),
        ("warning", "port-errors", "sfn05"),
    ]
    assert "could be 12X" in findings[1].detail and "40 Gb/s" in findings[1].detail
    assert "could be 10.0 Gbps" in findings[2].detail
    assert "SymbolErrorCounter=42" in findings[3].detail
    assert "LinkDownedCounter=3" in findings[3].detail


def test_default_thresholds_are_ibqueryerrors_ones() -> None:
    links = links_of("sim_healthy_iblinkinfo_line.txt")
    key = links[0].a.key
    quiet = fa.audit(links, {key: {"SymbolErrorCounter": 10, "LinkDownedCounter": 3}})
    assert quiet == []
    loud = fa.audit(links, {key: {"SymbolErrorCounter": 11}})
    assert [f.check for f in loud] == ["port-errors"]


def test_baseline_deltas_and_counter_reset() -> None:
    links = links_of("sim_healthy_iblinkinfo_line.txt")
    key = links[0].a.key
    base = {key: {"SymbolErrorCounter": 100}}
    assert fa.audit(links, {key: {"SymbolErrorCounter": 105}}, baseline_counters=base) == []
    (grew,) = fa.audit(links, {key: {"SymbolErrorCounter": 120}}, baseline_counters=base)
    assert "SymbolErrorCounter +20" in grew.detail and "since baseline" in grew.detail
    assert fa.counter_increase(7, 100) == 7  # reset since the baseline
    assert fa.counter_increase(7, None) == 7


def test_expectations_and_missing_nodes() -> None:
    links = links_of("sim_healthy_iblinkinfo_line.txt")
    found = fa.audit(links, {}, expect_rate=200, expect_nodes=["sfn01", "sfn09"])
    assert [f.check for f in found].count("link-degraded") == 12
    missing = [f for f in found if f.check == "node-missing"]
    assert [(f.node, f.severity) for f in missing] == [("sfn09", "critical")]
    assert fa.audit(links, {}, expect_width="12X") == []
    assert len(fa.audit(links, {}, expect_width="16X")) == 12


def test_link_not_active() -> None:
    text = (FIX / "sim_healthy_iblinkinfo_line.txt").read_text().replace("Active/", "Initialize/")
    findings = fa.audit(fa.build_links(parse.parse_iblinkinfo(text), NAMER), {})
    assert {f.check for f in findings} == {"link-not-active"}
    assert len(findings) == 12


def test_node_map_and_pattern() -> None:
    text = '# comment\n0x100001 "gpu-a01"\n0x0000000000100003   "gpu-a02" extra\n'
    mapping = names.parse_node_map(text)
    assert mapping == {"0x0000000000100001": "gpu-a01", "0x0000000000100003": "gpu-a02"}
    namer = names.NodeNamer(mapping)
    assert namer.name("0x0000000000100001", "whatever") == "gpu-a01"
    assert namer.name("0x0000000000100005", "sfn03 HCA-1") == "sfn03"
    assert namer.name("0x0000000000200002", "leaf1", "Switch") is None
    assert names.NodeNamer(pattern=r"host=(\w+)").name("0x1", "mlx5_0 host=gpu7") == "gpu7"
    with pytest.raises(UsageError, match="node map:2"):
        names.parse_node_map("0x1 \"a\"\nnot a line\n")


def test_metrics_render_is_valid_exposition(tmp_path: Path) -> None:
    links = links_of("sim_faulty_iblinkinfo_line.txt")
    counters = {links[0].a.key: {"SymbolErrorCounter": 42}}
    findings = fa.audit(links, counters, thresholds={"SymbolErrorCounter": 0})
    text = metrics.render(links, counters, findings, 1700000000.0)
    assert 'slurmfabric_fabric_link_degraded{node="sfn02",a="sfn02 HCA-1"' in text
    assert 'slurmfabric_fabric_findings{severity="error"} 2' in text
    assert 'counter="SymbolErrorCounter"} 42' in text
    for line in text.splitlines():
        assert line.startswith("#") or line.split()[-1].replace(".", "").isdigit()
    target = tmp_path / "fabric.prom"
    prom.write_textfile(target, text)
    assert target.read_text() == text and list(tmp_path.iterdir()) == [target]


def test_cli_links_and_audit_on_recorded_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    healthy = str(FIX / "sim_healthy_iblinkinfo_line.txt")
    faulty = str(FIX / "sim_faulty_iblinkinfo_line.txt")
    assert cmd.main(["links", "--input", healthy, "--node", "sfn02"]) == 0
    out = capsys.readouterr().out
    assert "sfn02 HCA-1/1" in out and "leaf1/2" in out and "sfn01" not in out
    save = tmp_path / "base.json"
    assert cmd.main(["audit", "--input", healthy, "--save", str(save)]) == 0
    assert "no problems found" in capsys.readouterr().out
    rc = cmd.main(["audit", "--input", faulty, "--baseline", str(save), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert [(f["check"], f["node"]) for f in doc["findings"]] == [
        ("link-down", "sfn03"), ("link-degraded", "sfn02"), ("link-degraded", "sfn07")
    ]
    with pytest.raises(UsageError, match="NAME=N"):
        cmd.main(["audit", "--input", healthy, "--threshold", "SymbolErrorCounter"])
    with pytest.raises(UsageError, match="no up link of node"):
        cmd.main(["links", "--input", healthy, "--node", "sfn99"])


def test_cli_local_ibstat(capsys: pytest.CaptureFixture[str]) -> None:
    assert cmd.main(["links", "--local", "--input", str(FIX / "real_hdr_ibstat.txt")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("mlx5_4/1  Active/LinkUp  rate 200")
    assert out[1].startswith("mlx5_2/1  Down/Disabled")


def test_cli_drain_goes_through_health_drain(
    mocker, capsys: pytest.CaptureFixture[str]  # type: ignore[no-untyped-def]
) -> None:
    from slurmfabric.health import drain as drain_mod

    calls = mocker.patch.object(
        drain_mod, "drain", return_value=drain_mod.DrainOutcome(drain_mod.DRAINED, "r")
    )
    faulty = str(FIX / "sim_faulty_iblinkinfo_line.txt")
    topo = str(FIX / "sim_healthy_ibnetdiscover.txt")
    assert cmd.main(["audit", "--input", faulty, "--topology", topo, "--drain"]) == 1
    drained = [(c.args[0], c.args[1]) for c in calls.call_args_list]
    assert drained == [
        ("sfn03", "fabric-link-down"), ("sfn02", "fabric-link-degraded"),
        ("sfn07", "fabric-link-degraded"),
    ]
    assert calls.call_args_list[1].args[2].startswith("sfn02 HCA-1/1 <-> leaf1/2: 4X")
    assert "drain sfn03: drained" in capsys.readouterr().err


def test_a_saved_audit_read_back_as_baseline_gives_the_same_findings(tmp_path: Path) -> None:
    """ibaudit/document.py owns the format both ways: the links and counters a saved audit
    holds come back equal, so an audit against the file finds what one against the
    in-memory links and counters finds (a link gone, a counter grown since)."""
    from slurmfabric.ibaudit import document

    namer = names.NodeNamer()
    healthy = fa.build_links(parse.parse_iblinkinfo(
        (FIX / "sim_healthy_iblinkinfo_line.txt").read_text()), namer)
    faulty = fa.build_links(parse.parse_iblinkinfo(
        (FIX / "sim_faulty_iblinkinfo_line.txt").read_text()), namer)
    key = healthy[0].a.key
    before = {key: {"SymbolErrorCounter": 100}}
    saved = document.AuditDocument(created=1.5, findings=[], links=healthy, counters=before)
    path = tmp_path / "audit.json"
    saved.save(path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(saved.to_dict()))
    base = document.load_baseline(str(path))
    assert base.links == healthy and base.counters == before
    now = {key: {"SymbolErrorCounter": 120}}
    from_file = fa.audit(faulty, now, expected=base.links, baseline_counters=base.counters)
    in_memory = fa.audit(faulty, now, expected=healthy, baseline_counters=before)
    assert from_file == in_memory
    assert {f.check for f in from_file} >= {"link-down", "port-errors"}
    path.write_text('{"version": 1, "findings": []}')
    with pytest.raises(UsageError, match="has no 'links'"):
        document.load_baseline(str(path))
