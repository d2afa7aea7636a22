"""The plan on node layouts built from real public dumps (tests/fixtures/topology/real/),
field by field: rails, GID, socket interface, per-rank GPU/NIC/CPUs/memory node."""

from __future__ import annotations

from pathlib import Path

import fakesysfs
import pytest
import real_nodes

from slurmfabric._common.sysfs import format_cpulist
from slurmfabric.plan import make_plan, visible_gpus_from_env
from slurmfabric.topology import discover, nccl_topo

HERE = Path(__file__).resolve().parents[1]

REAL = HERE / "fixtures" / "topology" / "real"


def plan_for(tmp_path: Path, node, **kw):
    topo = discover(fakesysfs.build(node, tmp_path / "root"))
    return topo, make_plan(topo, len(topo.gpus), master_addr="10.0.0.1", **kw)


def bindings(plan) -> list[tuple]:
    return [(b.gpu.index, b.nic, b.nic_distance, format_cpulist(list(b.cpus)), b.mem_node)
            for b in plan.bindings]


def test_azure_ndv5_pairs_gpus_and_nics_from_its_topology_file(tmp_path: Path) -> None:
    topo, plan = plan_for(tmp_path, real_nodes.azure_ndv5())
    # the real paths under VMBus are followed: numa_node comes from sysfs (0/1 per dump)
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.bus_id for g in topo.gpus][:4] == ["0001:00:00.0", "0002:00:00.0",
                                                  "0003:00:00.0", "0008:00:00.0"]
    assert plan.fabric == "ib"
    assert plan.nccl_env["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_ib{i}:1" for i in range(8))
    assert "mlx5_an0:1" in plan.rails.excluded  # the accelerated-networking VF: no rail
    cpus = [f"{12 * i}-{12 * i + 11}" for i in range(8)]
    assert bindings(plan) == [(i, f"mlx5_ib{i}:1", "PIX", cpus[i], 0 if i < 4 else 1)
                              for i in range(8)]
    assert any("NCCL topology file /opt/microsoft/ndv5/topo.xml (set in /etc/nccl.conf)" in n
               for n in plan.notes), plan.notes
    assert not plan.warnings


def test_azure_ndv5_without_its_topology_file_says_so(tmp_path: Path) -> None:
    topo, plan = plan_for(tmp_path, real_nodes.azure_ndv5(with_topo_file=False))
    assert any(w.startswith("PCIe tree hidden") and "NCCL_TOPO_FILE" in w
               for w in plan.warnings), plan.warnings
    # every GPU-NIC pair looks the same (NODE/SYS): nothing pretends to be PIX
    assert all(b.nic_distance in ("NODE", "SYS") for b in plan.bindings)


def test_lag_bonds_next_to_gpus_are_rails_the_management_bond_is_not(tmp_path: Path) -> None:
    _, plan = plan_for(tmp_path, real_nodes.lag_b300())
    assert plan.fabric == "roce"
    assert plan.nccl_env["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_bond_{k}:1" for k in range(8))
    assert plan.nccl_env["NCCL_IB_GID_INDEX"] == "3"  # RoCE v2 IPv4, as show_gids prints
    assert plan.rails.excluded == {
        "mlx5_bond_8:1": "on bond8: a bonded frontend NIC (nearest GPU NODE)"}
    assert [b[1:3] for b in bindings(plan)] == [(f"mlx5_bond_{k}:1", "PXB") for k in range(8)]
    assert bindings(plan)[0][3:] == ("0-15,128-143", 0)
    assert any("bonded (hardware LAG) and within PXB of a GPU, so rails" in n
               for n in plan.notes)


def test_aws_p5_binds_each_rank_to_an_efa_of_its_gpu_and_sets_no_ib(tmp_path: Path) -> None:
    _, plan = plan_for(tmp_path, real_nodes.aws_p5())
    assert plan.fabric == "efa"
    assert plan.nccl_env == {"NCCL_SOCKET_IFNAME": "=ens32", "FI_PROVIDER": "efa"}
    assert [b[1] for b in bindings(plan)][:2] == ["rdmap79s0:1", "rdmap96s0:1"]
    assert all(b.nic_distance == "PIX" for b in plan.bindings)
    assert plan.summary.startswith("32 AWS EFA devices (rdmap79s0, rdmap80s0,")


@pytest.mark.parametrize(("name", "pairs"), [
    ("azhpc-images_ndv5-topo.xml", 16), ("azhpc-images_ndv4-topo.xml", 16),
    ("azhpc-images_ncv4-topo.xml", None), ("azhpc-images_ndv2-topo.xml", None),
])
def test_azure_topology_files_parse(name: str, pairs: int | None) -> None:
    table = nccl_topo.bridges((REAL / "azure" / name).read_text())
    assert table, name
    if pairs is not None:
        assert len(table) == pairs
        gpu_bridge = table["0001:00:00.0"][0]
        assert table["0101:00:00.0"][0] == gpu_bridge  # GPU 0 and IB VF 0 share a bridge
    assert nccl_topo.bridges("<system><cpu") == {}  # not XML: nothing, never a crash


@pytest.mark.parametrize("enabled", [False, True])
def test_sharp_plugin_plans_collnet_only_when_asked(tmp_path: Path, enabled: bool) -> None:
    import nodes

    node = nodes.h100_ib()
    node.files["/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so"] = ""
    user = {"NCCL_COLLNET_ENABLE": "1"} if enabled else {}
    _, plan = plan_for(tmp_path, node, user_env=user)
    notes = [n for n in plan.notes if n.startswith("SHARP plugin")]
    assert len(notes) == 1
    assert ("CollNet on as asked" in notes[0]) == enabled
    assert "NCCL_COLLNET_ENABLE" not in plan.nccl_env  # never turned on by the plan


def test_nccl_topology_xml_written_for_a_node_pairs_like_the_published_one(
        tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    import nodes

    published = nccl_topo.bridges((REAL / "azure" / "azhpc-images_ndv5-topo.xml").read_text())
    topo, _ = plan_for(tmp_path / "vm", real_nodes.azure_ndv5())
    written = nccl_topo.to_xml(topo)
    ET.fromstring(written)  # well-formed
    ours = nccl_topo.bridges(written)

    def pairs(table):  # the set of device groups sharing one bridge, per NUMA node
        groups: dict[tuple, set] = {}
        for busid, (bridge, numa) in table.items():
            groups.setdefault((bridge, numa), set()).add(busid)
        return sorted(sorted(g) for g in groups.values())

    # the same GPU+NIC groups; ours also lists the AN VF, on its own
    assert pairs({k: v for k, v in ours.items() if k in published}) == pairs(published)
    assert ours["c9a1:00:00.0"][0] is None
    # a bare-metal node: GPU and rail NIC under one switch, the storage NIC elsewhere
    h100, _ = plan_for(tmp_path / "h100", nodes.h100_ib())
    table = nccl_topo.bridges(nccl_topo.to_xml(h100))
    gpu0, rail0 = h100.gpus[0].pci.address, h100.device("mlx5_0").pci.address
    storage = h100.device("mlx5_4").pci.address
    assert table[gpu0] == table[rail0] and table[storage][0] != table[gpu0][0]
    assert 'affinity="' in nccl_topo.to_xml(h100)


def test_two_gpus_and_two_nics_per_switch_spread_one_nic_per_gpu(tmp_path: Path) -> None:
    _, plan = plan_for(tmp_path, real_nodes.a800_two_per_switch())
    assert plan.fabric == "roce" and len(plan.rails.rails) == 8
    got = bindings(plan)
    # both NICs of a switch are PIX to both of its GPUs: one each, never both on one NIC
    assert [b[1] for b in got] == [f"mlx5_bond_{k}:1" for k in range(8)]
    assert {b[2] for b in got} == {"PIX"}
    assert got[0][3:] == ("0-15", 0) and got[1][3].startswith("16-") and got[1][4] == 0


def test_the_topology_file_named_by_the_tasks_environment_is_used(tmp_path: Path) -> None:
    node = real_nodes.azure_ndv5(with_topo_file=False)
    node.files["/opt/site/topo.xml"] = (REAL / "azure" / "azhpc-images_ndv5-topo.xml").read_text()
    root = fakesysfs.build(node, tmp_path / "root")
    topo = discover(root, environ={"NCCL_TOPO_FILE": "/opt/site/topo.xml"})
    assert topo.markers["nccl_topo_file"] == "/opt/site/topo.xml"
    assert topo.markers["nccl_topo_source"] == "NCCL_TOPO_FILE"
    plan = make_plan(topo, 8)
    assert [b.nic_distance for b in plan.bindings] == ["PIX"] * 8
    assert "nccl_topo_file" not in discover(root, environ={}).markers


def test_oci_h100_sixteen_roce_rails_from_its_pcie_tree_frontends_out(tmp_path: Path) -> None:
    """Before: no fixture had two RDMA functions of one card per GPU plus frontend mlx5
    devices numbered among the rails (OCI's mlx5_2 and mlx5_11)."""
    topo, plan = plan_for(tmp_path, real_nodes.oci_h100())
    assert [g.bus_id[5:7] for g in topo.gpus] == ["0f", "2d", "44", "5b", "89", "a8", "c0", "d8"]
    assert plan.fabric == "roce"
    # the list OCI's /etc/nccl.conf writes as "=mlx5_0,1,3-10,12-17"
    rails = [0, 1, *range(3, 11), *range(12, 18)]
    assert plan.nccl_env["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}:1" for i in rails)
    assert plan.nccl_env["NCCL_IB_GID_INDEX"] == "3"  # OCI's configured value: RoCE v2 IPv4
    assert plan.nccl_env["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert set(plan.rails.excluded) == {"mlx5_2:1", "mlx5_11:1"}
    first_port = [0, 3, 5, 7, 9, 12, 14, 16]  # port 1 of each GPU's own card
    cpus = [f"{14 * i}-{14 * i + 13},{112 + 14 * i}-{125 + 14 * i}" for i in range(8)]
    assert bindings(plan) == [(i, f"mlx5_{first_port[i]}:1", "PIX", cpus[i], 0 if i < 4 else 1)
                              for i in range(8)]
    assert not plan.warnings


def test_gcp_a3_high_is_tcp_and_names_the_idle_data_nics(tmp_path: Path) -> None:
    """Before: a VM with no RDMA device but four GPU-side gVNICs got a TCP plan on eth0 with
    no word about the NICs that would carry GPUDirect-TCPX."""
    topo, plan = plan_for(tmp_path, real_nodes.gcp_a3_high())
    assert plan.fabric == "tcp" and plan.nccl_env == {"NCCL_SOCKET_IFNAME": "=eth0"}
    assert not any(k.startswith("NCCL_IB") for k in plan.nccl_env)
    assert any(n.startswith("TCP on eth0 only: 4 more physical NICs are up (eth1, eth2, eth3, "
                            "eth4)") for n in plan.notes), plan.notes
    assert [b[3:] for b in bindings(plan)][::3] == [("0-12,104-116", 0), ("39-51,143-155", 0),
                                                    ("78-90,182-194", 1)]


def test_gb200_binds_to_grace_cpus_and_memory_not_to_gpu_memory_nodes(tmp_path: Path) -> None:
    """Before: CPU-less NUMA nodes (each GPU's HBM on Grace) were never in a fixture, and a
    node whose NICs share no PCIe switch with a GPU by design was warned as 'virtualised'."""
    topo, plan = plan_for(tmp_path, real_nodes.gb200_tray())
    assert topo.cpuless_numa == tuple(range(2, 34))
    assert [g.bus_id for g in topo.gpus] == ["0008:01:00.0", "0009:01:00.0", "0018:01:00.0",
                                             "0019:01:00.0"]
    assert plan.fabric == "ib"
    assert plan.nccl_env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_4:1,mlx5_5:1"
    assert bindings(plan) == [(0, "mlx5_0:1", "NODE", "0-35", 0),
                              (1, "mlx5_1:1", "NODE", "36-71", 0),
                              (2, "mlx5_4:1", "NODE", "72-107", 1),
                              (3, "mlx5_5:1", "NODE", "108-143", 1)]
    assert not plan.warnings, plan.warnings
    assert any("CPU-less NUMA nodes 2-33" in n for n in plan.notes)


def test_mi300x_gpus_found_by_amdgpu_and_bound_across_interleaved_numa(tmp_path: Path) -> None:
    """Before: AMD GPUs were not discovered at all (NVIDIA vendor only), and no fixture had
    NUMA nodes whose CPUs interleave (even CPUs on node 0, odd on node 1)."""
    topo, plan = plan_for(tmp_path, real_nodes.dell_mi300x())
    assert [g.bus_id[5:7] for g in topo.gpus] == ["1b", "3d", "4e", "5f", "9d", "bd", "cd", "dd"]
    assert [g.minor for g in topo.gpus] == list(range(128, 136))  # /dev/dri/renderD128..
    assert topo.gdr.mode == "dmabuf" and "amdgpu" in topo.gdr.evidence
    b = bindings(plan)
    assert b[0][3:] == ("0,2,4,6,8,10,12,14,64,66,68,70,72,74,76,78", 0)
    assert b[4][3:] == ("1,3,5,7,9,11,13,15,65,67,69,71,73,75,77,79", 1)
    # Slurm's gres numbering (render minors or positions) and ROCm's variable both resolve
    for env in ({"SLURM_STEP_GPUS": "130,131"}, {"SLURM_STEP_GPUS": "2,3"},
                {"ROCR_VISIBLE_DEVICES": "2,3"}):
        visible = visible_gpus_from_env(env)
        step = make_plan(topo, 2, master_addr="10.0.0.1", visible_gpus=visible)
        assert [x.gpu.bus_id[5:7] for x in step.bindings] == ["4e", "5f"], env


def test_aws_p4d_two_gpus_share_each_efa_of_their_switch(tmp_path: Path) -> None:
    """Before: only p5 (4 EFA per GPU) was a fixture; on p4d two GPUs share one EFA."""
    _, plan = plan_for(tmp_path, real_nodes.aws_p4d())
    assert plan.fabric == "efa"
    assert plan.nccl_env == {"NCCL_SOCKET_IFNAME": "=ens32", "FI_PROVIDER": "efa"}
    # rdmap16s27 is the name the real p4d NCCL log prints for the EFA at 10:1b.0
    efa = ["rdmap16s27:1", "rdmap32s27:1", "rdmap144s27:1", "rdmap160s27:1"]
    assert [b[1:3] for b in bindings(plan)] == [(efa[i // 2], "PIX") for i in range(8)]
    assert [b[4] for b in bindings(plan)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert not plan.warnings


def test_udev_renamed_rdma_devices_are_rails_by_their_new_names(tmp_path: Path) -> None:
    """rdma-core's persistent names (rocep1s0f1, roceP2p1s0f1 in PCI domain 2): the plan
    names them exactly and leaves the down ports out."""
    _, plan = plan_for(tmp_path, real_nodes.renamed_cx7())
    assert plan.fabric == "roce"
    assert plan.nccl_env["NCCL_IB_HCA"] == "=roceP2p1s0f1:1,rocep1s0f1:1"
    assert plan.nccl_env["NCCL_IB_GID_INDEX"] == "3"
    assert plan.rails.excluded == {"roceP2p1s0f0:1": "port state DOWN",
                                   "rocep1s0f0:1": "port state DOWN"}


def test_nccl_topology_xml_for_oci_h100_groups_like_oracles_file(tmp_path: Path) -> None:
    """Our XML for the node built from OCI's tree puts each GPU with its card's functions,
    as OCI's published file does (its switch-level grouping, NUMA by NUMA)."""
    published = nccl_topo.bridges((REAL / "oci" / "oci-hpc_H100-topology.xml").read_text())
    topo, _ = plan_for(tmp_path, real_nodes.oci_h100())
    ours = nccl_topo.bridges(nccl_topo.to_xml(topo))
    gpu_numa = {g.bus_id: g.numa_node for g in topo.gpus}
    for gpu in topo.gpus:
        assert published[gpu.bus_id][1] == ours[gpu.bus_id][1] == gpu_numa[gpu.bus_id]
    # the GPU and NIC cards under each top bridge: one GPU with one card, in both files
    devices = {g.bus_id for g in topo.gpus} | {d.pci.address[:10] for d in topo.rdma}

    def groups(table: dict) -> list[list[str]]:
        found: dict = {}
        for busid, (bridge, _numa) in table.items():
            if busid in devices or busid[:10] in devices:
                found.setdefault(bridge, set()).add(busid[:10])
        return sorted(sorted(g) for g in found.values() if len(g) > 1)

    assert groups(ours) == groups(published)
    assert len(groups(published)) == 8 and all(len(g) == 2 for g in groups(published))


@pytest.mark.parametrize("name", sorted(real_nodes.REAL_NODES))
def test_every_real_node_survives_a_snapshot_and_writes_wellformed_xml(tmp_path: Path,
                                                                        name: str) -> None:
    import xml.etree.ElementTree as ET

    from slurmfabric.topology import snapshot

    topo, plan = plan_for(tmp_path, real_nodes.REAL_NODES[name]())
    again = snapshot.from_dict(snapshot.to_dict(topo))
    replan = make_plan(again, len(again.gpus), master_addr="10.0.0.1")
    assert (replan.nccl_env, bindings(replan)) == (plan.nccl_env, bindings(plan))
    root = ET.fromstring(nccl_topo.to_xml(topo))
    listed = {p.get("busid") for p in root.iter("pci")}
    assert {g.bus_id for g in topo.gpus} <= listed


def test_azure_ndv4_four_numa_nodes_pairs_from_its_topology_file(tmp_path: Path) -> None:
    """Before: ND A100 v4 was only a parsed XML, never a node: 4 NUMA nodes of 24 vCPUs and
    two GPUs with two NICs under each synthetic bridge of the file (the pairing a 2023 fix in
    Azure's file swapped between NUMA 0 and 1, see azure/SOURCES.md)."""
    topo, plan = plan_for(tmp_path, real_nodes.azure_ndv4())
    assert [g.numa_node for g in topo.gpus] == [1, 1, 0, 0, 3, 3, 2, 2]
    assert plan.fabric == "ib"
    assert plan.nccl_env["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_ib{i}:1" for i in range(8))
    cpus = ["24-35", "36-47", "0-11", "12-23", "72-83", "84-95", "48-59", "60-71"]
    assert bindings(plan) == [(i, f"mlx5_ib{i}:1", "PIX", cpus[i], [1, 1, 0, 0, 3, 3, 2, 2][i])
                              for i in range(8)]
    assert any("/opt/microsoft/ndv4/topo.xml (set in /etc/nccl.conf)" in n for n in plan.notes)
    assert not plan.warnings


# -- issue 46: rails that are not rails, GDR without CPU-less NUMA, topology-file hints -----

def test_p6_b200_efa_devices_are_the_rails_not_the_nvlink_management_ports(tmp_path: Path) -> None:
    """Before: the two InfiniBand NVLink-management devices were the plan's rails and the
    port check judged them, never the 8 EFA devices."""
    _, plan = plan_for(tmp_path, real_nodes.aws_p6_b200())
    efa = [f"rdmap{b}s0:1" for b in (79, 80, 113, 130, 147, 164, 181, 198)]
    assert plan.fabric == "efa"
    assert plan.nccl_env == {"NCCL_SOCKET_IFNAME": "=ens32", "FI_PROVIDER": "efa"}
    assert [p.name for p in plan.rails.rails] == efa
    for name in ("ibp115s0f0:1", "ibp116s0f0:1"):
        assert plan.rails.excluded[name].startswith("InfiniBand device on an EFA node: no "
                                                    "data NIC")
    assert [b[1:3] for b in bindings(plan)] == [(n, "PIX") for n in efa]
    assert not any("within PXB" in w for w in plan.warnings), plan.warnings


def test_p6_b200_port_check_judges_the_efa_devices(tmp_path: Path) -> None:
    from slurmfabric.health.checks import rdma

    node = real_nodes.aws_p6_b200()
    node.rdma[2].ports[1].state = "1: DOWN"  # rdmap113s0: a dead EFA
    node.rdma[2].ports[1].phys_state = "3: Disabled"
    root = fakesysfs.build(node, tmp_path / "root")
    facts = rdma.collect(str(root))
    assert facts.rails is not None and len(facts.rails) == 8
    result = rdma.check_ports(facts, {"rdma_ports": 8}, None)
    assert result.status == "fail"
    assert result.reason == "rdmap113s0:1 DOWN/Disabled"
    healthy = fakesysfs.build(real_nodes.aws_p6_b200(), tmp_path / "ok")
    ok = rdma.check_ports(rdma.collect(str(healthy)), {"rdma_ports": 8}, None)
    assert ok.status == "ok" and ok.values["healthy_ports"] == 8
    assert ok.reason == "not rails, not judged: ibp115s0f0:1, ibp116s0f0:1"


def test_gb300_without_cpuless_numa_nodes_is_coherent_and_keeps_gdr(tmp_path: Path) -> None:
    """Before: with no CPU-less NUMA node the plan warned 'no RDMA port is within PXB of a
    GPU (flat or virtualised PCIe?)' and that the GPUs' traffic crosses the CPU without
    GPUDirect RDMA, on nodes where GDR is measured (nebius-solutions-library#1135)."""
    topo, plan = plan_for(tmp_path, real_nodes.gb300_vm())
    assert topo.cpuless_numa == ()
    assert topo.coherent_gpus == "NVIDIA GB300: Grace superchip GPUs (coherent over NVLink-C2C)"
    assert plan.fabric == "ib" and len(plan.rails.rails) == 4
    assert not any("within PXB" in w for w in plan.warnings), plan.warnings
    assert any(n.startswith("GPUs attached coherently (NVIDIA GB300") for n in plan.notes)
    assert "NCCL_NET_GDR_LEVEL" not in plan.nccl_env


def test_an_azure_mi300x_vm_is_not_pointed_at_nvidias_topology_files(tmp_path: Path) -> None:
    topo, plan = plan_for(tmp_path, real_nodes.azure_ndmi300x())
    assert topo.markers.get("pcie_hidden") and len(topo.gpus) == 4
    line = next(w for w in plan.warnings if w.startswith("PCIe tree hidden"))
    assert "/opt/microsoft/" not in line
    assert line.endswith("(RCCL reads NCCL_TOPO_FILE too; no published file is known for "
                         "these GPUs)")
    _, nvidia = plan_for(tmp_path / "h100", real_nodes.azure_ndv5(with_topo_file=False))
    hint = next(w for w in nvidia.warnings if w.startswith("PCIe tree hidden"))
    assert hint.endswith("(Azure HPC images: /opt/microsoft/ndv5/topo.xml)")
