"""Parsers of infiniband-diags output, on recorded real outputs (see fixtures SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmfabric.errors import TopologyError
from slurmfabric.ibaudit import parse

FIX = Path(__file__).parent.parent / "fixtures" / "ib"


def read(name: str) -> str:
    return (FIX / name).read_text()


def test_iblinkinfo_default_format_real_edr() -> None:
    ports = parse.parse_iblinkinfo(read("real_edr_iblinkinfo.txt"))
    ca = ports[0]
    assert (ca.node_type, ca.desc, ca.guid, ca.lid, ca.port) == (
        "CA", "n02 HCA-1", "0xec0d9a03003d62be", 4, 1
    )
    assert (ca.width, ca.speed, ca.state, ca.phys) == ("4X", "25.78125 Gbps", "Active", "LinkUp")
    assert (ca.remote_lid, ca.remote_port, ca.remote_desc) == (2, 17, "MF0;SB7700:MSB7700/U1")
    assert ca.rate == 100.0  # EDR 4X
    switch = [p for p in ports if p.node_type == "Switch"]
    assert {p.guid for p in switch} == {"0x506b4b0300820910"}
    down = [p for p in switch if p.port == 16][0]
    assert (down.state, down.phys, down.width, down.up) == ("Down", "Polling", "", False)
    assert [p.remote_desc for p in switch if p.up] == ["n02 HCA-1", "n01 HCA-1"]


def test_iblinkinfo_line_format_real_fdr() -> None:
    (port,) = parse.parse_iblinkinfo(read("real_fdr_iblinkinfo_line.txt"))
    assert port.desc == "ib-test-7 mlx4_0"
    assert (port.guid, port.lid, port.port) == ("0xf452140300f55051", 37, 1)
    assert (port.remote_guid, port.remote_lid, port.remote_port) == ("0xf45214030067c630", 5, 16)
    assert port.rate == 56.0  # FDR 4X: 14.0625 Gbps signalling is 14 Gb/s of data per lane


def test_iblinkinfo_could_be_hints_from_simulated_fabric() -> None:
    ports = parse.parse_iblinkinfo(read("sim_faulty_iblinkinfo.txt"))
    by = {(p.desc, p.port): p for p in ports}
    narrow = by[("sfn02 HCA-1", 1)]
    assert (narrow.width, narrow.could_be_width, narrow.could_be_speed) == ("4X", "12X", "")
    slow = by[("sfn07 HCA-1", 1)]
    assert (slow.speed, slow.could_be_speed, slow.could_be_width) == (
        "2.5 Gbps", "10.0 Gbps", ""
    )
    healthy = by[("sfn01 HCA-1", 1)]
    assert (healthy.could_be_width, healthy.could_be_speed, healthy.rate) == ("", "", 120.0)
    # The unlinked port: leaf1 port 3 is Down/Polling with no peer; sfn03 is gone.
    leaf1 = [p for p in ports if p.desc == "leaf1" and p.port == 3][0]
    assert (leaf1.state, leaf1.phys, leaf1.up) == ("Down", "Polling", False)
    assert not any(p.desc.startswith("sfn03") for p in ports)


def test_iblinkinfo_line_mode_infers_switches_and_cas() -> None:
    ports = parse.parse_iblinkinfo(read("sim_healthy_iblinkinfo_line.txt"))
    kinds = {p.desc: p.node_type for p in ports}
    assert kinds["sfn01 HCA-1"] == "CA"
    assert kinds["leaf1"] == "Switch" and kinds["spine2"] == "Switch"
    up = [p for p in ports if p.up]
    assert len(up) == 24  # 12 cables seen from both ends
    assert all(p.remote_guid.startswith("0x") for p in up)


def test_iblinkinfo_fdr10_speed_label() -> None:
    line = (
        '         223   33[  ] ==( 4X  10.0 Gbps (FDR10) Active/  LinkUp)==>     145    1[  ] '
        '"gpfs-a4-005-p HCA-1" ( )'
    )
    (port,) = parse.parse_iblinkinfo("Switch: 0x0002c90200400000 sw1:\n" + line)
    assert (port.speed, port.state, port.remote_desc) == (
        "10.0 Gbps (FDR10)", "Active", "gpfs-a4-005-p HCA-1"
    )


def test_iblinkinfo_garbage_raises_quoting_output() -> None:
    with pytest.raises(TopologyError, match="ibwarn: cannot open"):
        parse.parse_iblinkinfo("ibwarn: cannot open umad port\n")
    assert parse.parse_iblinkinfo("") == []


@pytest.mark.parametrize(
    ("width", "speed", "rate"),
    [("4X", "53.125 Gbps", 200.0), ("4X", "106.25 Gbps", 400.0), ("2X", "106.25 Gbps", 200.0),
     ("12X", "10.0 Gbps", 120.0), ("1X", "2.5 Gbps", 2.5), ("", "", 0.0)],
)
def test_link_rate(width: str, speed: str, rate: float) -> None:
    assert parse.link_rate(width, speed) == rate


def test_perfquery_plain_and_extended_merge_from_simulator() -> None:
    plain = parse.parse_perfquery(read("sim_sfn05_perfquery.txt"))
    ext = parse.parse_perfquery(read("sim_sfn05_perfquery_x.txt"))
    assert (plain[0].lid, plain[0].port, plain[0].extended) == (9, 1, False)
    assert plain[0].values["SymbolErrorCounter"] == 42
    assert plain[0].values["LinkDownedCounter"] == 3
    assert "PortSelect" not in plain[0].values and "CounterSelect2" not in plain[0].values
    assert ext[0].extended and "SymbolErrorCounter" not in ext[0].values
    merged = parse.merge_counters(plain + ext)
    assert merged["SymbolErrorCounter"] == 42
    assert merged["PortXmitData"] == ext[0].values["PortXmitData"]  # 64-bit value wins


def test_perfquery_extended_with_additional_counters_real() -> None:
    (block,) = parse.parse_perfquery(read("real_perfquery_x_additional.txt"))
    assert (block.lid, block.port, block.extended) == (10, 1, True)
    assert block.values["SymbolErrorCounter"] == 0
    assert block.values["QP1Dropped"] == 0
    assert len(block.values) == 22


def test_ibstat_real_hdr() -> None:
    ports = parse.parse_ibstat(read("real_hdr_ibstat.txt"))
    assert [(p.ca, p.port, p.state, p.phys, p.rate, p.lid) for p in ports] == [
        ("mlx5_4", 1, "Active", "LinkUp", 200.0, 90),
        ("mlx5_2", 1, "Down", "Disabled", 10.0, 65535),
    ]
    assert ports[0].ca_type == "MT4123" and ports[0].link_layer == "InfiniBand"
    assert ports[0].node_guid == "0x0c42a1030017c078"


def test_ibstat_simulated_host() -> None:
    (port,) = parse.parse_ibstat(read("sim_sfn01_ibstat.txt"))
    assert (port.ca, port.state, port.rate, port.lid, port.sm_lid) == (
        "ibsim0", "Active", 120.0, 2, 1
    )


def test_ibnetdiscover_topology_from_simulator() -> None:
    links = parse.parse_ibnetdiscover(read("sim_healthy_ibnetdiscover.txt"))
    assert len(links) == 24
    ca = [t for t in links if t.node_desc == "sfn03 HCA-1"][0]
    assert (ca.node_type, ca.guid, ca.port) == ("CA", "0x0000000000100005", 1)
    assert (ca.remote_guid, ca.remote_port, ca.remote_desc) == ("0x0000000000200002", 3, "leaf1")
    sw = [t for t in links if t.node_desc == "leaf1" and t.port == 3][0]
    assert (sw.guid, sw.remote_guid, sw.remote_desc) == (
        "0x0000000000200002", "0x0000000000100005", "sfn03 HCA-1"
    )


def test_ibnetdiscover_reads_ibsim_net_file_ids() -> None:
    links = parse.parse_ibnetdiscover(read("fattree.net"))
    # ibsim files carry ids but no GUIDs: ports parse, GUIDs stay empty.
    assert {t.node_desc for t in links if t.node_type == "CA"} >= {"sfn01 HCA-1", "sfn08 HCA-1"}
    assert all(t.guid == "" for t in links)
