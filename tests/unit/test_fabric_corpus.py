"""The fabric plan and the RDMA port checks on layouts built from real public outputs
(tests/fixtures/corpus/fabric/, sources and verdicts in its SOURCES.md): IPv6-only RoCE
rails beside an IPv4 frontend, a rail that is down, VLAN and other second-netdev GIDs,
InfiniBand rails beside Ethernet ports, and link_downed growing between hook runs."""

from __future__ import annotations

import json
from pathlib import Path

import fakesysfs
import pytest
from fakesysfs import Gpu, Net, Node, Port, Rdma, v4gid, v6gid
from helpers import h100_tree, hgx_node, write_config

from slurmfabric.health import hooks, runner
from slurmfabric.health.checks import rdma
from slurmfabric.health.outputs import prometheus_text
from slurmfabric.plan import make_plan
from slurmfabric.topology import discover

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus" / "fabric"
NODE = "gpu042"


def corpus(name: str) -> str:
    return (CORPUS / name).read_text()


def show_gids(text: str) -> dict[tuple[str, int], list[tuple[int, str, str, str]]]:
    """show_gids rows -> {(dev, port): [(index, gid, type, ndev)]} as sysfs holds them
    (gids/<i>, gid_attrs/types/<i>, gid_attrs/ndevs/<i>)."""
    table: dict[tuple[str, int], list[tuple[int, str, str, str]]] = {}
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 6 or not cols[2].isdigit():
            continue
        dev, port, index, gid, ver, ndev = cols[0], int(cols[1]), int(cols[2]), cols[3], \
            cols[-2], cols[-1]
        kind = "RoCE v2" if ver == "v2" else "IB/RoCE v1"
        table.setdefault((dev, port), []).append((index, gid, kind, ndev))
    return table


def ipv6_addresses(text: str) -> dict[str, list[str]]:
    """``ip addr`` -> {ifname: [global inet6 CIDRs]}."""
    found: dict[str, list[str]] = {}
    name = ""
    for line in text.splitlines():
        if line[:1].isdigit():
            name = line.split(":")[1].strip()
        elif line.strip().startswith("inet6 ") and "scope global" in line:
            found.setdefault(name, []).append(line.split()[1])
    return found


def pcie_pair(k: int, bus: int) -> tuple[str, str]:
    """A GPU and a NIC under one PCIe switch (PIX): the dumps give no PCI paths, so every
    layout here uses this HGX-like shape, one switch per GPU/NIC pair."""
    top = f"pci0000:{bus:02x}/0000:{bus:02x}:01.0/0000:{bus + 1:02x}:00.0"
    return (f"{top}/0000:{bus + 2:02x}:00.0/0000:{bus + 3:02x}:00.0",
            f"{top}/0000:{bus + 2:02x}:01.0/0000:{bus + 4:02x}:00.0")


BUSES = [0x10, 0x20, 0x30, 0x40, 0x90, 0xA0, 0xB0, 0xC0]


def _gpu(k: int, path: str) -> Gpu:
    return Gpu(path, 0 if k < 4 else 1, f"GPU-c0ffee00-0000-4000-8000-00000000000{k}", k)


# -- 1. IPv6-only rails beside an IPv4 frontend ------------------------------------------------

def ipv6_rails_node() -> Node:
    """8 RoCE rails with IPv6 addresses only, in the /120 of the two SR-IOV rail netdevs
    of NVIDIA/nccl#1405 (net4 ...:ff20, net1 ...:ff22; the other six follow that pattern),
    and a frontend CX NIC with IPv4 on the CPU's root port, far from every GPU. The GID
    tables follow show_gids' usual order (link-local v1/v2, then the address v1/v2,
    NVIDIA/nccl#1131): the dump shows addresses, not GID indices."""
    real = ipv6_addresses(corpus("nccl-1405_ip-addr_ipv6-only-rails.txt"))
    assert real == {"net4": ["fd00:1148:9000:5000:4:200:3:ff20/120"],
                    "net1": ["fd00:1148:9000:5000:4:200:3:ff22/120"]}
    base = real["net4"][0].split("/")[0].rsplit(":", 1)[0]
    gpus, nics, nets = [], [], []
    for k, bus in enumerate(BUSES):
        gpu_path, nic_path = pcie_pair(k, bus)
        gpus.append(_gpu(k, gpu_path))
        ndev = f"net{k + 1}"
        addr = f"{base}:ff{0x20 + 2 * k:02x}"
        nics.append(Rdma(f"mlx5_{k}", nic_path, 0 if k < 4 else 1,
                         {1: Port(rate="400 Gb/sec (4X NDR)", link_layer="Ethernet",
                                  gids=fakesysfs.roce_gids(
                                      f"fe80:0000:0000:0000:a073:bfff:fe71:eb{k:02x}",
                                      ipv6=addr, ndev=ndev))}, netdev=ndev, uverbs=k))
        nets.append(Net(ndev, pci=nic_path, ipv6=[f"{addr}/120"], mtu="4200"))
    front = "pci0000:60/0000:60:01.0/0000:61:00.0"
    nics.append(Rdma("mlx5_8", front, 0,
                     {1: Port(rate="100 Gb/sec (4X EDR)", link_layer="Ethernet",
                              gids=fakesysfs.roce_gids(
                                  "fe80:0000:0000:0000:0ac0:ebff:fe00:0001",
                                  ipv4="10.0.5.7", ndev="eth0"))}, netdev="eth0", uverbs=8))
    nets.append(Net("eth0", pci=front, ipv4=["10.0.5.7/24"]))
    return Node(numa={0: "0-63", 1: "64-127"}, cpus="0-127", gpus=gpus, rdma=nics, nets=nets,
                modules=["nvidia_peermem"], routes=[("eth0", "0.0.0.0", "10.0.5.1", "0.0.0.0", 0)])


def test_an_ipv4_frontend_does_not_exclude_ipv6_only_rails(tmp_path: Path) -> None:
    topo = discover(fakesysfs.build(ipv6_rails_node(), tmp_path / "root"))
    plan = make_plan(topo, 8)
    rails = [f"mlx5_{k}:1" for k in range(8)]
    assert plan.fabric == "roce"
    assert plan.nccl_env["NCCL_IB_HCA"] == "=" + ",".join(rails)
    assert plan.nccl_env["NCCL_IB_ADDR_FAMILY"] == "AF_INET6"
    assert plan.nccl_env["NCCL_IB_GID_INDEX"] == "3"  # RoCE v2 of the global IPv6 address
    assert plan.rails.gids["mlx5_0:1"].gid == v6gid("fd00:1148:9000:5000:4:200:3:ff20")
    assert plan.rails.excluded["mlx5_8:1"].startswith("nearest GPU is")
    assert [b.nic for b in plan.bindings] == rails  # each GPU on its own rail, not GID 3 of eth0


def test_the_family_still_follows_the_user(tmp_path: Path) -> None:
    topo = discover(fakesysfs.build(ipv6_rails_node(), tmp_path / "root"))
    plan = make_plan(topo, 8, user_env={"NCCL_IB_ADDR_FAMILY": "AF_INET"})
    # asked for IPv4: the rails have none, and the frontend is still no rail
    assert plan.fabric == "tcp"
    assert plan.rails.excluded["mlx5_0:1"] == "no RoCE v2 IPv4 GID (no address on its netdev?)"


def test_an_ipv6_rail_range_sets_the_family_and_bad_ranges_are_ignored(tmp_path: Path) -> None:
    topo = discover(fakesysfs.build(ipv6_rails_node(), tmp_path / "root"))
    rail_net = "fd00:1148:9000:5000:4:200:3:ff00/120"  # the /120 of nccl#1405's net4/net1
    plan = make_plan(topo, 8, user_env={"NCCL_IB_ADDR_RANGE": rail_net})
    assert plan.rails.family == "AF_INET6" and len(plan.rails.rails) == 8
    assert plan.rails.gid_policy == f"NCCL_IB_ADDR_RANGE={rail_net}"
    for bad in ("10.0.0.0/33", "fd00::/129", "not-a-range"):
        odd = make_plan(topo, 8, user_env={"NCCL_IB_ADDR_RANGE": bad})
        assert any(w.startswith(f"NCCL_IB_ADDR_RANGE={bad!r} is not a CIDR range")
                   for w in odd.warnings), bad
        assert len(odd.rails.rails) == 8  # ignored, as if unset


# -- 2 and 4. InfiniBand rails, Ethernet ports, a rail that is down ---------------------------

def _down_state() -> str:
    """deepseek-ai/DeepEP#60's CX-7: ``state: PORT_DOWN (1)`` is sysfs's ``1: DOWN``."""
    line = next(x for x in corpus("deepep-60_ibv_devinfo_port_down.txt").splitlines()
                if x.strip().startswith("state:"))
    code = line.split("(")[1].rstrip(")")
    return f"{code}: {line.split()[1].removeprefix('PORT_')}"


DOWN_STATE = _down_state()


def ib_node_with_ethernet(down: str | None = None) -> Node:
    """imbue-ai/cluster-health#4: 8 CX-7 InfiniBand rails (mlx5_0,3,4,5,6,9,10,11) and
    two dual-port CX-6 Ethernet cards (mlx5_1/2 on bus 0x1b, mlx5_7/8 on 0x9d), half of
    their ports up; device names and netdevs from its ibdev2netdev. The Ethernet cards sit
    on root ports of their own (no GPU shares a switch with them: not in the dump). A
    ``down`` rail reads as nccl-tests#128's mlx5_1: State Down, Physical state Disabled,
    Rate 10."""
    rows = [line.split() for line in
            corpus("cluster-health-4_ibdev2netdev_ib-rails-and-ethernet.txt").splitlines()
            if line.startswith("mlx5_")]
    ib = [(r[0], r[4]) for r in rows if r[-1] == "infiniband"]
    eth = [(r[0], r[4], r[5] == "(Up)") for r in rows if "*ethernet*" in r]
    assert len(ib) == 8 and len(eth) == 4
    ib.sort(key=lambda item: int(item[1][3:-2]))  # by PCI bus of ibpNNNs0
    gpus, nics, nets = [], [], []
    for k, ((name, ndev), bus) in enumerate(zip(ib, BUSES)):
        gpu_path, nic_path = pcie_pair(k, bus)
        gpus.append(_gpu(k, gpu_path))
        port = Port(rate="400 Gb/sec (4X NDR)", counters={"link_downed": "0"})
        if name == down:
            port = Port(state=DOWN_STATE, phys_state="3: Disabled", rate="10 Gb/sec (4X SDR)",
                        counters={"link_downed": "0"})
        nics.append(Rdma(name, nic_path, 0 if k < 4 else 1, {1: port}, netdev=ndev,
                         uverbs=k))
        nets.append(Net(ndev, pci=nic_path, type="32", operstate="down"))
    for j, (name, ndev, up) in enumerate(eth):
        bus = 0x1B if ndev.startswith("enp27") else 0x9D
        path = f"pci0000:{bus - 1:02x}/0000:{bus - 1:02x}:02.0/0000:{bus:02x}:00.{ndev[-3]}"
        port = Port(rate="100 Gb/sec (4X EDR)" if up else "40 Gb/sec (4X QDR)",
                    link_layer="Ethernet",
                    state="4: ACTIVE" if up else "1: DOWN",
                    phys_state="5: LinkUp" if up else "3: Disabled",
                    gids=fakesysfs.roce_gids(f"fe80:0000:0000:0000:0ac0:ebff:fe00:00{j:02x}",
                                             ipv4=f"10.1.{j}.5" if up else None, ndev=ndev),
                    counters={"link_downed": "0"})
        nics.append(Rdma(name, path, 0 if bus < 0x80 else 1, {1: port}, netdev=ndev,
                         uverbs=8 + j))
        nets.append(Net(ndev, pci=path, ipv4=[f"10.1.{j}.5/24"] if up else [],
                        operstate="up" if up else "down"))
    return Node(numa={0: "0-63", 1: "64-127"}, cpus="0-127", gpus=gpus, rdma=nics, nets=nets,
                modules=["nvidia_peermem"])


def test_a_down_rail_is_named_with_what_replaced_it(tmp_path: Path) -> None:
    topo = discover(fakesysfs.build(ib_node_with_ethernet(down="mlx5_3"), tmp_path / "r"))
    plan = make_plan(topo, 8)
    assert plan.fabric == "ib" and "mlx5_3:1" not in plan.nccl_env["NCCL_IB_HCA"]
    assert plan.rails.excluded["mlx5_3:1"] == "port state DOWN"
    gpu = next(b for b in plan.bindings if b.gpu.index == 1)  # mlx5_3 sits by GPU 1
    assert gpu.nic != "mlx5_3:1"
    line = next(w for w in plan.warnings if w.startswith("rail mlx5_3:1"))
    assert line == (f"rail mlx5_3:1 is down (DOWN/Disabled): left out of the rails; GPU 1 "
                    f"uses {gpu.nic} ({gpu.nic_distance}) instead of mlx5_3:1 (PIX)")
    # the Ethernet cards are no rails, and a down Ethernet port is no down rail
    assert [p.name for p in plan.rails.down] == ["mlx5_3:1"]


def test_every_rail_up_means_no_down_rail_warning(tmp_path: Path) -> None:
    topo = discover(fakesysfs.build(ib_node_with_ethernet(), tmp_path / "r"))
    plan = make_plan(topo, 8)
    assert plan.rails.down == [] and not any(w.startswith("rail ") for w in plan.warnings)
    assert len(plan.rails.rails) == 8


README_CONFIG = {"rdma_ports": 8, "rdma_rate_gbps": 400, "rdma_link_layer": "InfiniBand"}


def _ports_result(root: Path, **expect):
    facts = rdma.collect(str(root))
    return rdma.check_ports(facts, {**README_CONFIG, **expect}, None)


def test_rdma_ports_judges_the_rails_not_the_ethernet_cards(tmp_path: Path) -> None:
    root = fakesysfs.build(ib_node_with_ethernet(), tmp_path / "r")
    result = _ports_result(root)
    assert result.status == "ok", result.reason
    assert result.values["healthy_ports"] == 8
    info = str(result.values["not_judged"])
    for name in ("mlx5_1:1", "mlx5_2:1", "mlx5_7:1", "mlx5_8:1"):
        assert name in info
    assert "mlx5_2:1 (port state DOWN)" in info
    assert result.reason == "not rails, not judged: mlx5_1:1, mlx5_2:1, mlx5_7:1, mlx5_8:1"


def test_rdma_ports_still_fails_a_down_rail(tmp_path: Path) -> None:
    root = fakesysfs.build(ib_node_with_ethernet(down="mlx5_3"), tmp_path / "r")
    result = _ports_result(root)
    assert result.status == "fail"
    assert result.reason == "mlx5_3:1 DOWN/Disabled at 10 Gb/s, expected 400"


def test_an_explicit_device_list_still_wins(tmp_path: Path) -> None:
    root = fakesysfs.build(ib_node_with_ethernet(), tmp_path / "r")
    result = _ports_result(root, rdma_ports=1, rdma_devices=["mlx5_1"])
    assert result.status == "fail"
    assert result.reason == "mlx5_1:1 at 100 Gb/s, expected 400 link layer Ethernet, " \
                            "expected InfiniBand"


def test_the_projects_own_8_gpu_fixture_passes_without_a_device_list(tmp_path: Path) -> None:
    root = h100_tree(tmp_path / "root")
    result = _ports_result(root)
    assert result.status == "ok", result.reason
    assert result.values["healthy_ports"] == 8


# -- 3. VLAN and second-netdev GIDs ----------------------------------------------------------

VLAN_CONFIG = "VLAN Dev name\t | VLAN ID\nName-Type: VLAN_NAME_TYPE_RAW_PLUS_VID_NO_PAD\n" \
              "eth2.10        | 10  | eth2\n"


def vlan_node() -> Node:
    """tensorflow#22077's mlx4_0: port 1 (eth2) holds 12.12.12.12 on eth2 and 10.10.10.2 on
    the VLAN netdev eth2.10, port 2 (eth3) only 12.12.10.12. That ConnectX-3 printed RoCE
    v1 entries only; on a RoCE v2 kernel each address gets a v1 and a v2 entry, as the
    same dump's mlx5_0 shows (index 2/3 for 12.12.11.12), so the table here adds the v2
    twin after each v1 row. /proc/net/vlan/config (net/8021q/vlanproc.c) names eth2.10 as
    VLAN 10 on eth2. Rates and PCI paths are not in the dump."""
    table = show_gids(corpus("tensorflow-22077_show_gids_vlan.txt"))
    ports = {}
    for number in (1, 2):
        rows = []
        for _, gid, _, ndev in table[("mlx4_0", number)]:
            rows += [(len(rows), gid, "IB/RoCE v1", ndev), (len(rows) + 1, gid, "RoCE v2", ndev)]
        ports[number] = Port(rate="40 Gb/sec (4X FDR10)", link_layer="Ethernet", gids=rows)
    gpu_path, nic_path = pcie_pair(0, 0x10)
    gpu2, _ = pcie_pair(1, 0x20)
    nets = [Net("eth2", pci=nic_path, ipv4=["12.12.12.12/24"], dev_port=0),
            Net("eth3", pci=nic_path, ipv4=["12.12.10.12/24"], dev_port=1),
            Net("eth2.10", ipv4=["10.10.10.2/24"])]
    node = Node(numa={0: "0-15"}, cpus="0-15", gpus=[_gpu(0, gpu_path), _gpu(1, gpu2)],
                rdma=[Rdma("mlx4_0", nic_path, 0, ports, vendor="0x15b3", device="0x1007")],
                nets=nets, modules=["nvidia_peermem"])
    node.files["/proc/net/vlan/config"] = VLAN_CONFIG
    return node


def test_proc_net_vlan_config_lines_that_are_not_vlans_are_skipped(tmp_path: Path) -> None:
    from slurmfabric._common.sysfs import Root
    from slurmfabric.topology._io import Reader
    from slurmfabric.topology.net import read_vlans

    (tmp_path / "proc/net/vlan").mkdir(parents=True)
    (tmp_path / "proc/net/vlan/config").write_text(
        VLAN_CONFIG + "bad | -5 | x\nonly|two\n | 7 | eth9\nbond0.200      | 200  | bond0\n")
    assert read_vlans(Reader(Root(str(tmp_path)))) == {"eth2.10": (10, "eth2"),
                                                        "bond0.200": (200, "bond0")}
    assert read_vlans(Reader(Root(str(tmp_path / "none")))) == {}


def test_vlan_and_untagged_gids_warn_when_nothing_chooses(tmp_path: Path) -> None:
    topo = discover(fakesysfs.build(vlan_node(), tmp_path / "r"))
    assert topo.netdev("eth2.10").vlan_id == 10 and topo.netdev("eth2.10").vlan_of == "eth2"
    plan = make_plan(topo, 1)
    assert plan.rails.gids["mlx4_0:1"].gid == v4gid("12.12.12.12")  # first in the table
    line = next(w for w in plan.warnings if w.startswith("RoCE rail GIDs"))
    assert "mlx4_0:1: index 3 on eth2, index 5 on eth2.10 (VLAN 10 on eth2)" in line
    assert "NCCL_IB_ADDR_RANGE" in line and "SLURMFABRIC_ROCE_VLAN" in line


def test_the_rail_subnet_chooses_the_vlan_gid(tmp_path: Path) -> None:
    topo = discover(fakesysfs.build(vlan_node(), tmp_path / "r"))
    plan = make_plan(topo, 1, user_env={"NCCL_IB_ADDR_RANGE": "10.10.10.0/24"})
    assert plan.rails.gids["mlx4_0:1"].gid == v4gid("10.10.10.2")
    assert plan.rails.gids["mlx4_0:1"].ndev == "eth2.10"
    assert plan.nccl_env["NCCL_IB_GID_INDEX"] == "5"
    assert plan.nccl_env["NCCL_IB_HCA"] == "=mlx4_0:1"  # eth3 carries no 10.10.10.0/24
    assert plan.rails.excluded["mlx4_0:2"] == (
        "no RoCE v2 IPv4 GID on NCCL_IB_ADDR_RANGE=10.10.10.0/24")
    assert not any(w.startswith("RoCE rail GIDs") for w in plan.warnings)


def test_the_site_vlan_chooses_and_pins_the_index_for_new_nccl(tmp_path: Path) -> None:
    topo = discover(fakesysfs.build(vlan_node(), tmp_path / "r"))
    plan = make_plan(topo, 1, user_env={"SLURMFABRIC_ROCE_VLAN": "10"}, nccl_version="2.23.4")
    assert plan.rails.gids["mlx4_0:1"].ndev == "eth2.10"
    # NCCL >= 2.21 alone would take index 3 (eth2): the index is set for the VLAN
    assert plan.nccl_env["NCCL_IB_GID_INDEX"] == "5"
    assert "VLAN 10" in plan.reasons["NCCL_IB_GID_INDEX"]
    untagged = make_plan(topo, 1, user_env={"SLURMFABRIC_ROCE_VLAN": "0"})
    assert untagged.rails.gids["mlx4_0:1"].ndev == "eth2"
    bad = make_plan(topo, 1, user_env={"SLURMFABRIC_ROCE_VLAN": "ten"})
    assert any("SLURMFABRIC_ROCE_VLAN='ten' is not a VLAN id" in w for w in bad.warnings)


def test_two_netdevs_with_one_address_are_ambiguous(tmp_path: Path) -> None:
    """Mellanox/ucx#9484: mlx5_bond_0 carries 30.153.10.175 on a VXLAN netdev
    (b3.vxlan.30100, indices 2/3) and on bond1 (4/5). The bond's slaves and the PCI path
    are not in the dump."""
    table = show_gids(corpus("ucx-9484_show_gids_two-netdevs.txt"))
    gpu_path, nic_path = pcie_pair(0, 0x10)
    node = Node(numa={0: "0-15"}, cpus="0-15", gpus=[_gpu(0, gpu_path)],
                rdma=[Rdma("mlx5_bond_0", nic_path, 0,
                           {1: Port(rate="200 Gb/sec (4X HDR)", link_layer="Ethernet",
                                    gids=table[("mlx5_bond_0", 1)])}, netdev="bond1")],
                nets=[Net("enp16s0f0np0", pci=nic_path, master="bond1"),
                      Net("bond1", slaves=["enp16s0f0np0"], ipv4=["30.153.10.175/24"]),
                      Net("b3.vxlan.30100", ipv4=["30.153.10.175/24"])],
                modules=["nvidia_peermem"])
    topo = discover(fakesysfs.build(node, tmp_path / "r"))
    plan = make_plan(topo, 1, user_env={"NCCL_IB_ADDR_RANGE": "30.153.10.0/24"})
    assert plan.rails.gids["mlx5_bond_0:1"].index == 3
    line = next(w for w in plan.warnings if w.startswith("RoCE rail GIDs"))
    assert "allowed by NCCL_IB_ADDR_RANGE=30.153.10.0/24" in line
    assert "index 3 on b3.vxlan.30100, index 5 on bond1" in line


# -- 5. link flaps -----------------------------------------------------------------------------

def ufm_link_downs() -> list[int]:
    """The last column of Mellanox/ufm_sdk_3.0#189's rows for port 50: 1 before a
    disable/enable bounce, 2 after it."""
    text = corpus("ufm-sdk-189_link-downed-counter-after-bounce.txt")
    return [int(line.rsplit(",", 1)[1]) for line in text.splitlines()
            if line.startswith("17") and ",50," in line]


def test_link_downed_history_counts_increases_in_the_window(tmp_path: Path) -> None:
    before, after = ufm_link_downs()
    assert (before, after) == (1, 2)
    path = str(tmp_path / "hist.json")

    def run(value: int, at: float) -> dict:
        port = rdma.PortFacts("mlx5_0:1", "ACTIVE", "LinkUp", 400.0, "InfiniBand",
                              {"link_downed": value})
        return rdma.record_link_downed(path, [port], 86400, now=at)

    t0 = 1_712_228_785.0
    assert run(before, t0) == {"mlx5_0:1": None}  # first sample: a baseline only
    assert run(after, t0 + 120) == {"mlx5_0:1": 1}  # the bounce of the UFM report
    assert run(after, t0 + 600) == {"mlx5_0:1": 1}  # unchanged: nothing stored
    assert run(after + 1, t0 + 3600) == {"mlx5_0:1": 2}  # a second down within 24 h
    assert run(after + 1, t0 + 86400 + 200) == {"mlx5_0:1": 1}  # the first left the window
    assert run(0, t0 + 90000) == {"mlx5_0:1": 1}  # a reset (reboot) counts from 0
    saved = json.loads(Path(path).read_text())
    assert len(saved["ports"]["mlx5_0:1"]) <= 3


def test_rdma_link_flaps_drains_a_port_that_went_down_twice(tmp_path: Path) -> None:
    before, after = ufm_link_downs()
    root = h100_tree(tmp_path / "root", counters={"link_downed": str(before)})
    cfg = write_config(tmp_path / "h.toml", tmp_path / "s",
                       [hgx_node("*", "h100-535-healthy", root, rdma_devices=[])])
    counter = root / "sys/class/infiniband/mlx5_3/ports/1/counters/link_downed"

    def flaps():
        run = hooks.check(NODE, str(cfg))
        return run, next(r for r in run.results if r.check == "rdma.link_flaps")

    _, first = flaps()
    assert first.status == "ok" and first.values["first_sample"] == 8
    counter.write_text(f"{after}\n")
    _, second = flaps()
    assert second.status == "ok" and second.values["mlx5_3:1"] == 1
    counter.write_text(f"{after + 1}\n")
    run, third = flaps()
    assert third.status == "fail"
    assert third.reason == "mlx5_3:1 link went down 2 times in 24 h (limit 2)"
    prom = prometheus_text(run)
    assert (f'slurmfabric_rdma_port_link_downs_window{{node="{NODE}",device="mlx5_3",'
            'port="1"} 2') in prom


def test_link_flap_site_keys_and_registration(tmp_path: Path) -> None:
    assert "rdma.link_flaps" in runner.EVENT_CHECKS  # passing later proves no repair
    assert "rdma.link_flaps" in {s.name for s in runner.registry()}
    facts = rdma.RdmaFacts(
        [rdma.PortFacts("mlx5_0:1", "ACTIVE", "LinkUp", 400.0, "InfiniBand", {})],
        "peermem", "", flaps={"mlx5_0:1": 2}, flap_window_s=6 * 3600)
    assert rdma.check_link_flaps(facts, {}, None).reason == (
        "mlx5_0:1 link went down 2 times in 6 h (limit 2)")
    assert rdma.check_link_flaps(facts, {"link_flap_threshold": 3}, None).status == "ok"
    from slurmfabric.errors import ConfigError
    from slurmfabric.health import siteconfig

    cfg = siteconfig.resolve({"nodes": [{"link_flap_threshold": 3, "link_flap_window_h": 6}]},
                             NODE, None)
    assert cfg.expect["link_flap_threshold"] == 3
    with pytest.raises(ConfigError, match="link_flap_threshold"):
        siteconfig.resolve({"nodes": [{"link_flap_threshold": 0}]}, NODE, None)


# -- 6. no rail known: judge what the site names (issue 46, item 1) ---------------------------

def _no_uverbs(node: Node) -> Node:
    """The same node in a pod the RDMA device plugin gave no /dev/infiniband/uverbs*: the
    rail rule finds no rail (plan/rails.py: no uverbs device)."""
    for dev in node.rdma:
        dev.uverbs = None
    return node


def test_no_rail_known_judges_only_the_link_layer_the_site_names(tmp_path: Path) -> None:
    """Before: every port was judged, and imbue-ai/cluster-health#4's healthy node failed on
    its CX-6 Ethernet cards ("at 100 Gb/s, expected 400 link layer Ethernet, expected
    InfiniBand") although the config names InfiniBand."""
    root = fakesysfs.build(_no_uverbs(ib_node_with_ethernet()), tmp_path / "r")
    facts = rdma.collect(str(root))
    assert facts.rails is None and facts.rails_unknown.startswith("no uverbs device")
    result = rdma.check_ports(facts, README_CONFIG, None)
    assert result.status == "ok", result.reason
    assert result.values["healthy_ports"] == 8
    assert result.reason == (f"rail set unknown ({facts.rails_unknown}): judged the InfiniBand "
                             "ports; not judged: mlx5_1:1, mlx5_2:1, mlx5_7:1, mlx5_8:1")
    down = fakesysfs.build(_no_uverbs(ib_node_with_ethernet(down="mlx5_3")), tmp_path / "d")
    failed = rdma.check_ports(rdma.collect(str(down)), README_CONFIG, None)
    assert failed.status == "fail"
    assert failed.reason == "mlx5_3:1 DOWN/Disabled at 10 Gb/s, expected 400"


def test_no_rail_known_and_no_port_named_only_counts_healthy_ports(tmp_path: Path) -> None:
    root = fakesysfs.build(_no_uverbs(ib_node_with_ethernet(down="mlx5_3")), tmp_path / "r")
    facts = rdma.collect(str(root))
    # 7 InfiniBand ports and 2 Ethernet ports up: no port fails alone, on its speed or state
    ok = rdma.check_ports(facts, {"rdma_ports": 8, "rdma_rate_gbps": 400}, None)
    assert ok.status == "ok", ok.reason
    assert ok.reason.startswith("rail set unknown (no uverbs device")
    assert "no port judged alone, only how many are up" in ok.reason
    few = rdma.check_ports(facts, {"rdma_ports": 10}, None)
    assert few.status == "fail"
    assert few.reason.startswith("9 RDMA ports up, expected 10 (rail set unknown: no uverbs")


# -- 7. RoCE link flaps from the netdev's carrier (issue 46, item 6) --------------------------

def test_roce_link_flaps_counted_from_carrier_downs(tmp_path: Path) -> None:
    """Before: only link_downed was read, which stays 0 here; net1 (mlx5_0's netdev on
    NVIDIA/nccl#1405's IPv6 rail layout) lost its carrier twice. carrier_changes counts a
    down and an up per flap; carrier_down_count (Linux >= 4.19) counts the downs, and wins
    when present (Documentation/ABI/testing/sysfs-class-net)."""
    root = fakesysfs.build(ipv6_rails_node(), tmp_path / "r")
    net1 = root / "sys/class/net/net1"
    net1_changes = net1 / "carrier_changes"
    history = str(tmp_path / "flaps.json")
    net1_changes.write_text("2\n")  # boot: carrier off -> on
    first = rdma.collect(str(root), history)
    assert first.flaps["mlx5_0:1"] is None  # a baseline
    net1_changes.write_text("6\n")  # two flaps later
    facts = rdma.collect(str(root), history)
    assert facts.flaps["mlx5_0:1"] == 2
    assert all(p.counters.get("link_downed") in (None, 0) for p in facts.ports)
    result = rdma.check_link_flaps(facts, {}, None)
    assert result.status == "fail"
    assert result.reason == "mlx5_0:1 link went down 2 times in 24 h (limit 2)"
    (net1 / "carrier_down_count").write_text("4\n")  # read first: a third down
    assert rdma.collect(str(root), history).flaps["mlx5_0:1"] == 3


# -- 8. ports as ibstat and ibstatus print them: Polling, Down/LinkUp, a lower rate ----------

_STATES = {"Active": "ACTIVE", "Down": "DOWN", "Initializing": "INIT", "Armed": "ARMED"}


def ports_from(text: str) -> list[rdma.PortFacts]:
    """``ibstat`` (CA 'x' / Port N: / State: Active) or ``ibstatus`` (Infiniband device 'x'
    port N status: / state: 4: ACTIVE) -> the port facts rdma.ports judges, as the sysfs
    reader makes them (topology/rdma.py: the word after "N: ", the rate's leading number)."""
    ports: list[rdma.PortFacts] = []
    fields: dict[str, str] = {}
    name = ""

    def flush() -> None:
        if name and fields:
            rate = fields.get("rate", "").split()
            ports.append(rdma.PortFacts(
                name, fields.get("state", ""), fields.get("phys state", ""),
                float(rate[0]) if rate else None, fields.get("link layer", ""), {}))

    ca = ""
    for line in text.splitlines():
        body = line.strip()
        if body.startswith("CA '"):
            ca = body.split("'")[1]
        elif body.startswith("Port ") and body.endswith(":"):
            flush()
            name, fields = f"{ca}:{body[5:-1]}", {}
        elif body.startswith("Infiniband device '"):
            flush()
            name, fields = f"{body.split(chr(39))[1]}:{body.split()[4]}", {}
        elif ":" in body:
            key, _, value = body.partition(":")
            key = key.strip().lower().replace("_", " ").replace("physical", "phys")
            value = value.strip()
            if key in ("state", "phys state") and value[:1].isdigit():
                value = value.split(": ", 1)[1]  # ibstatus: "4: ACTIVE", sysfs's own text
            fields[key] = _STATES.get(value, value) if key == "state" else value
    flush()
    return ports


@pytest.mark.parametrize(("name", "expect", "status", "reason"), [
    ("gpud-482_ibstat_cx7-down-polling.txt",
     {"rdma_ports": 1, "rdma_rate_gbps": 400, "rdma_link_layer": "InfiniBand"},
     "fail", "mlx5_10:1 DOWN/Polling at 10 Gb/s, expected 400"),
    ("network-operator-249_ibstat_down-linkup-200.txt",
     {"rdma_ports": 1, "rdma_rate_gbps": 200, "rdma_link_layer": "InfiniBand"},
     "fail", "mlx5_7:1 DOWN/LinkUp"),
    ("nccl-1866_ibstatus_roce-100.txt",
     {"rdma_ports": 2, "rdma_rate_gbps": 200, "rdma_link_layer": "Ethernet"},
     "fail", "mlx5_0:1 at 100 Gb/s, expected 200; mlx5_1:1 at 100 Gb/s, expected 200"),
    ("nccl-1866_ibstatus_roce-100.txt",
     {"rdma_ports": 2, "rdma_rate_gbps": 100, "rdma_link_layer": "Ethernet"}, "ok", ""),
    ("gpud-99_ibstat_cx6dx-down-disabled-no-rate.txt",  # the post stops after the state
     {"rdma_ports": 1, "rdma_rate_gbps": 100}, "fail", "mlx5_8:1 DOWN/Disabled rate unreadable"),
    ("gpud-752_ibstat_active-200-then-ibpanic-mlx5_8.txt",
     {"rdma_ports": 2, "rdma_rate_gbps": 200, "rdma_link_layer": "InfiniBand",
      "rdma_devices": ["mlx5_7", "mlx5_8"]},
     "fail", "1 RDMA ports found, expected 2; mlx5_8 missing"),
])
def test_ibstat_and_ibstatus_ports(name: str, expect: dict, status: str, reason: str) -> None:
    ports = ports_from(corpus(name))
    facts = rdma.RdmaFacts(ports, "peermem", "", tuple(p.name for p in ports))
    result = rdma.check_ports(facts, expect, None)
    assert (result.status, result.reason) == (status, reason)
