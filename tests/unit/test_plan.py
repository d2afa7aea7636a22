"""The NCCL/NUMA plan for each fixture node, asserted field by field."""

from __future__ import annotations

from pathlib import Path

import fakesysfs
import nodes
import pytest

from slurmfabric.plan import make_plan, parse_nccl_version, visible_gpus_from_env
from slurmfabric.topology import Topology, discover

HERE = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def topos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Topology]:
    return {
        name: discover(fakesysfs.build(make(), tmp_path_factory.mktemp(name)))
        for name, make in nodes.NODES.items()
    }


def _bind(plan) -> list[tuple[object, ...]]:
    from slurmfabric._common.sysfs import format_cpulist

    return [
        (
            b.local_rank,
            b.gpu.index if b.gpu else None,
            b.nic,
            format_cpulist(list(b.cpus)),
            b.mem_node,
        )
        for b in plan.bindings
    ]


def test_h100_ib(topos: dict[str, Topology]) -> None:
    plan = make_plan(topos["h100_ib"], 8, master_addr="10.1.0.2")
    assert plan.fabric == "ib"
    assert plan.nccl_env == {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_6:1,mlx5_7:1,mlx5_8:1,mlx5_9:1",
        "NCCL_NET": "IB",
        "NCCL_SOCKET_IFNAME": "=eno1",
    }
    assert set(plan.reasons) == set(plan.nccl_env)
    assert "PXB" in plan.reasons["NCCL_IB_HCA"] and "eno1" in plan.reasons["NCCL_SOCKET_IFNAME"]
    assert plan.rails.excluded == {
        "mlx5_4:1": "nearest GPU is NODE: a storage/frontend NIC, not a rail",
        "mlx5_5:1": "nearest GPU is NODE: a storage/frontend NIC, not a rail",
    }
    assert plan.warnings == []
    assert _bind(plan) == [
        (0, 0, "mlx5_0:1", "0-13,112-125", 0),
        (1, 1, "mlx5_1:1", "14-27,126-139", 0),
        (2, 2, "mlx5_2:1", "28-41,140-153", 0),
        (3, 3, "mlx5_3:1", "42-55,154-167", 0),
        (4, 4, "mlx5_6:1", "56-69,168-181", 1),
        (5, 5, "mlx5_7:1", "70-83,182-195", 1),
        (6, 6, "mlx5_8:1", "84-97,196-209", 1),
        (7, 7, "mlx5_9:1", "98-111,210-223", 1),
    ]
    assert all(b.nic_distance == "PIX" for b in plan.bindings)


def test_h100_roce_bond_down_numa_off(topos: dict[str, Topology]) -> None:
    plan = make_plan(topos["h100_roce_numa_off"], 8, master_addr="10.2.0.5")
    assert plan.fabric == "roce"
    assert plan.nccl_env == {
        # mlx5_1 and mlx5_11 both present: only '=' keeps mlx5_1 from matching mlx5_11
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_5:1,mlx5_6:1,mlx5_7:1,mlx5_8:1,mlx5_11:1",
        "NCCL_NET": "IB",
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_SOCKET_IFNAME": "=bond0",
    }
    assert plan.rails.excluded == {
        "mlx5_3:1": "on bond0: a bonded frontend NIC (nearest GPU SYS)",
        "mlx5_4:1": "port state DOWN",
        "mlx5_9:1": "on bond0: a bonded frontend NIC (nearest GPU SYS)",
        "mlx5_10:1": "port state DOWN",
    }
    assert {g.index for g in plan.rails.gids.values()} == {3}
    assert any("numa_node is -1" in w for w in plan.warnings)
    binds = _bind(plan)
    assert binds[0] == (0, 0, "mlx5_0:1", "0-11,96-107", None)
    assert binds[7] == (7, 7, "mlx5_11:1", "84-95,180-191", None)
    # NCCL >= 2.21 picks the GID itself
    newer = make_plan(topos["h100_roce_numa_off"], 8, nccl_version="2.21.5")
    assert "NCCL_IB_GID_INDEX" not in newer.nccl_env
    assert any("picks the RoCE GID itself (would be index 3)" in n for n in newer.notes)


def test_sister_node_numbers_nics_differently(tmp_path: Path) -> None:
    node = nodes.h100_roce_numa_off()
    rename = {"mlx5_0": "mlx5_5", "mlx5_5": "mlx5_0", "mlx5_3": "mlx5_4", "mlx5_4": "mlx5_3"}
    for dev in node.rdma:
        dev.name = rename.get(dev.name, dev.name)
    plan = make_plan(discover(fakesysfs.build(node, tmp_path)), 8)
    assert plan.nccl_env["NCCL_IB_HCA"] == (
        "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_5:1,mlx5_6:1,mlx5_7:1,mlx5_8:1,mlx5_11:1"
    )
    assert plan.bindings[0].nic == "mlx5_5:1" and plan.bindings[3].nic == "mlx5_0:1"
    assert plan.rails.excluded["mlx5_3:1"] == "port state DOWN"


def test_pod_gid_index_starts_at_6(topos: dict[str, Topology]) -> None:
    plan = make_plan(topos["pod_gids_from_6"], 2, master_addr="10.244.1.2")
    assert plan.nccl_env == {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
        "NCCL_NET": "IB",
        "NCCL_IB_GID_INDEX": "7",
        "NCCL_SOCKET_IFNAME": "=eth0",
    }
    # only CPUs 2-9 are allowed (the pod's cpuset): split between the two GPUs
    assert _bind(plan) == [(0, 0, "mlx5_0:1", "2-5", 0), (1, 1, "mlx5_1:1", "6-9", 0)]


def test_oci_nested_switches_dual_function(topos: dict[str, Topology]) -> None:
    plan = make_plan(topos["oci_nested"], 2, master_addr="10.0.0.1")
    assert plan.nccl_env == {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
        "NCCL_NET": "IB",
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_SOCKET_IFNAME": "=ens300",
    }
    assert plan.rails.excluded == {
        "mlx5_4:1": "nearest GPU is NODE: a storage/frontend NIC, not a rail"
    }
    assert [(b.nic, b.nic_distance) for b in plan.bindings] == [
        ("mlx5_0:1", "PXB"),
        ("mlx5_2:1", "PXB"),
    ]
    assert _bind(plan) == [(0, 0, "mlx5_0:1", "0-31", 0), (1, 1, "mlx5_2:1", "32-63", 1)]


def test_aws_efa_sets_no_ib_variables(topos: dict[str, Topology]) -> None:
    plan = make_plan(topos["aws_efa"], 4, master_addr="172.31.8.99")
    assert plan.fabric == "efa"
    # the plugin or fail (plan/contract.py), never an IB verbs variable
    # NCCL_NET is not forced: the plugin's name changed between releases (contract.py)
    assert plan.nccl_env == {"NCCL_SOCKET_IFNAME": "=ens32", "FI_PROVIDER": "efa"}
    assert not any(k.startswith("NCCL_IB_") for k in plan.nccl_env)
    assert plan.warnings == []
    assert any("aws-ofi-nccl" in n for n in plan.notes)
    # each rank's nearest EFA device (same PCIe switch as its GPU), still no NCCL_IB_*
    assert _bind(plan) == [
        (0, 0, "rdmap20s0:1", "0-23", 0),
        (1, 1, "rdmap36s0:1", "24-47", 0),
        (2, 2, "rdmap52s0:1", "48-71", 1),
        (3, 3, "rdmap68s0:1", "72-95", 1),
    ]


def test_tcp_only_is_loud(topos: dict[str, Topology]) -> None:
    plan = make_plan(topos["tcp_only"], 2, master_addr="10.0.0.7")
    assert plan.fabric == "tcp"
    assert plan.nccl_env == {"NCCL_SOCKET_IFNAME": "=eth0"}
    assert plan.warnings[0].startswith("TCP ONLY: no RDMA devices")
    assert _bind(plan) == [(0, 0, None, "0-31", 0), (1, 1, None, "32-63", 1)]


def test_four_nics_shared_by_eight_gpus(topos: dict[str, Topology]) -> None:
    plan = make_plan(topos["shared_nics"], 8)
    assert plan.nccl_env == {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
        "NCCL_NET": "IB",
    }
    assert [b.nic for b in plan.bindings] == [f"mlx5_{i // 2}:1" for i in range(8)]
    assert _bind(plan)[:2] == [(0, 0, "mlx5_0:1", "0-7", 0), (1, 1, "mlx5_0:1", "8-15", 0)]
    assert any("no master address" in n for n in plan.notes)


def test_ports_in_init_fall_back_loudly(topos: dict[str, Topology]) -> None:
    plan = make_plan(topos["ports_init"], 8)
    assert plan.fabric == "tcp" and plan.nccl_env == {}
    assert "TCP ONLY: all 4 RDMA ports are unusable (4 x port state INIT" in plan.warnings[0]
    assert "no subnet manager" in plan.warnings[0]
    assert all(b.nic is None for b in plan.bindings)


def test_sriov_vfs_beside_pf(topos: dict[str, Topology], tmp_path: Path) -> None:
    plan = make_plan(topos["sriov"], 2)
    assert plan.nccl_env == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_NET": "IB"}
    assert plan.rails.excluded["mlx5_2:1"] == "SR-IOV VF of mlx5_0 (its PF is visible here)"
    assert plan.rails.excluded["mlx5_5:1"] == "SR-IOV VF of mlx5_1 (its PF is visible here)"
    # in a VM only the VFs are passed through: then a VF is a rail (if it has uverbs)
    node = nodes.sriov()
    node.rdma = [d for d in node.rdma if d.physfn]
    vm = make_plan(discover(fakesysfs.build(node, tmp_path)), 2)
    assert vm.nccl_env["NCCL_IB_HCA"] == "=mlx5_2:1,mlx5_4:1"
    assert vm.rails.excluded["mlx5_3:1"].startswith("no uverbs device")


def test_ipv6_only_roce(topos: dict[str, Topology]) -> None:
    plan = make_plan(topos["roce_ipv6_only"], 2, master_addr="2001:db8:ff::1")
    assert plan.nccl_env == {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
        "NCCL_NET": "IB",
        "NCCL_IB_ADDR_FAMILY": "AF_INET6",
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_SOCKET_IFNAME": "=eth0",
    }
    assert plan.rails.gids["mlx5_0:1"].gid.startswith("2001:0db8:0000")
    newer = make_plan(topos["roce_ipv6_only"], 2, nccl_version=(2, 23, 4))
    assert newer.nccl_env == {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
        "NCCL_NET": "IB",
        "NCCL_IB_ADDR_FAMILY": "AF_INET6",
    }


def test_user_settings_win_and_are_reported(topos: dict[str, Topology]) -> None:
    user = {"NCCL_IB_HCA": "mlx5_1", "NCCL_IB_GID_INDEX": "3", "NCCL_DEBUG": "INFO"}
    plan = make_plan(topos["h100_roce_numa_off"], 8, user_env=user)
    assert plan.nccl_env["NCCL_IB_HCA"] == "mlx5_1"
    assert plan.reasons["NCCL_IB_HCA"].startswith(
        "set by the user (slurmfabric would set '=mlx5_0:1,"
    )
    assert plan.reasons["NCCL_IB_GID_INDEX"].startswith("set by the user (same value")
    assert plan.user_set == user
    assert any("prefix 'mlx5_1' also matches mlx5_10, mlx5_11" in w for w in plan.warnings)
    family = make_plan(topos["roce_ipv6_only"], 2, user_env={"NCCL_IB_ADDR_FAMILY": "AF_INET"})
    assert family.fabric == "tcp" and family.nccl_env == {}  # asked for IPv4 GIDs: none
    assert family.rails.excluded["mlx5_0:1"] == "no RoCE v2 IPv4 GID (no address on its netdev?)"


def test_allowed_cpus_visible_gpus_and_fallbacks(topos: dict[str, Topology]) -> None:
    topo = topos["h100_ib"]
    # Slurm gave GPUs 4,5 and CPUs from the wrong socket: warn and use what is allowed
    plan = make_plan(topo, 2, visible_gpus=["4", "5"], allowed_cpus=range(0, 8))
    assert [(b.gpu.index, b.visible_index, b.nic) for b in plan.bindings] == [
        (4, 0, "mlx5_6:1"),
        (5, 1, "mlx5_7:1"),
    ]
    assert [list(b.cpus) for b in plan.bindings] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [b.mem_node for b in plan.bindings] == [None, None]
    assert sum("allowed CPUs" in w for w in plan.warnings) == 2
    by_uuid = make_plan(topo, 1, visible_gpus=["GPU-6b7c8d9e-0000-4000-8000-000000000007"])
    assert by_uuid.bindings[0].gpu.index == 7
    missing = make_plan(topo, 1, visible_gpus=["12"])
    assert any("matches no GPU" in w for w in missing.warnings)
    over = make_plan(topos["sriov"], 4)
    assert [b.gpu.index for b in over.bindings] == [0, 1, 0, 1]
    assert any("ranks share GPUs" in w for w in over.warnings)


def test_gdr_level_only_when_nics_are_phb(tmp_path: Path) -> None:
    node = nodes.sriov()
    # move each GPU to its own root port under the NIC's host bridge: GPU-NIC becomes PHB
    for gpu in node.gpus:
        hb = gpu.pci.split("/")[0]
        bus = int(hb[-2:], 16)
        gpu.pci = f"{hb}/0000:{bus:02x}:07.0/0000:{bus + 9:02x}:00.0"
    plan = make_plan(discover(fakesysfs.build(node, tmp_path)), 2)
    assert [b.nic_distance for b in plan.bindings] == ["PHB", "PHB"]
    assert plan.nccl_env["NCCL_NET_GDR_LEVEL"] == "PHB"
    assert "paths.cc" in plan.reasons["NCCL_NET_GDR_LEVEL"]


def test_gdr_missing_is_a_warning(tmp_path: Path) -> None:
    node = nodes.shared_nics()
    node.modules = []
    plan = make_plan(discover(fakesysfs.build(node, tmp_path)), 8)
    assert "NCCL_NET_GDR_LEVEL" not in plan.nccl_env
    assert any(
        w.startswith("GPUDirect RDMA unavailable: no peer-memory module") for w in plan.warnings
    )


def test_gcp_markers(tmp_path: Path) -> None:
    node = nodes.h100_roce_numa_off()
    node.files["/usr/local/gib/scripts/set_nccl_env.sh"] = "export NCCL_NET=gIB"
    plan = make_plan(discover(fakesysfs.build(node, tmp_path)), 8)
    assert plan.fabric == "gib"
    assert not any(k.startswith("NCCL_IB_") for k in plan.nccl_env)
    assert any("/usr/local/gib/scripts/set_nccl_env.sh" in n for n in plan.notes)


def test_no_gpus_no_rdma(tmp_path: Path) -> None:
    plan = make_plan(discover(tmp_path), 2, allowed_cpus=[0, 1, 2, 3])
    assert plan.fabric == "tcp" and plan.nccl_env == {}
    assert [(b.gpu, b.nic, b.cpus) for b in plan.bindings] == [
        (None, None, (0, 1)),
        (None, None, (2, 3)),
    ]


def test_helpers() -> None:
    assert parse_nccl_version("2.21.5") == (2, 21, 5)
    assert parse_nccl_version(22105) == (2, 21, 5)
    assert parse_nccl_version("2.18.1+cuda12.1") == (2, 18, 1)
    assert parse_nccl_version(None) is None
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "4,5"}
    assert visible_gpus_from_env(env) == ["4", "5"]
    assert visible_gpus_from_env({"CUDA_VISIBLE_DEVICES": "GPU-ab,GPU-cd"}) == ["GPU-ab", "GPU-cd"]
    assert visible_gpus_from_env({}) is None


def test_apply_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from slurmfabric.plan import RankBinding
    from slurmfabric.rank import binding

    calls: list[object] = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: calls.append((pid, set(cpus))))
    monkeypatch.setattr(binding, "set_preferred_node", lambda node: calls.append(node))
    binding.apply_binding(RankBinding(0, None, None, None, None, (2, 3), 1, "r"))
    # pinned to CPUs of node 1: the default local policy already allocates there
    assert calls == [(0, {2, 3})]
    calls.clear()
    binding.apply_binding(RankBinding(0, None, None, None, None, (), 1, "r"))
    assert calls == [1]  # no CPUs to pin: the memory node is set explicitly

    def refuse(pid: int, cpus: object) -> None:
        raise OSError(22, "Invalid argument")

    warnings: list[str] = []
    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    monkeypatch.setattr(binding, "set_preferred_node", lambda node: "set_mempolicy: ENOSYS")
    binding.apply_binding(
        RankBinding(0, None, None, None, None, (99,), 5, "r"), warn=warnings.append
    )
    assert len(warnings) == 2 and "Invalid argument" in warnings[0] and "ENOSYS" in warnings[1]


def test_set_preferred_node_reports_instead_of_raising() -> None:
    from slurmfabric.rank.binding import set_preferred_node

    assert set_preferred_node(4095) is not None  # no such node: an error text, no exception


@pytest.mark.parametrize("name", sorted(nodes.NODES))
def test_plan_only_discovery_gives_the_same_plan(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """env/launch discover with plan_only=True (fewer files on every rank): same plan."""
    root = fakesysfs.build(nodes.NODES[name](), tmp_path_factory.mktemp(f"lean-{name}"))
    full, lean = discover(root), discover(root, plan_only=True)
    for master in ("10.1.0.2", None):
        assert (
            make_plan(lean, 8, master_addr=master).to_dict()
            == make_plan(full, 8, master_addr=master).to_dict()
        )
    # and it did skip something: counters/firmware are never read in plan_only mode
    assert all(p.counters == {} for p in lean.ports)
    assert all(d.fw_ver is None for d in lean.rdma)
    if any(d.fw_ver for d in full.rdma):
        assert lean != full
