"""Discovery on fake sysfs trees: ports, GIDs, quirks, distances, snapshots, the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import fakesysfs
import nodes
import pytest

from slurmfabric._common.record import replace
from slurmfabric.commands import topo as topo_cmd
from slurmfabric.topology import discover, snapshot
from slurmfabric.topology.model import pci_distance as distance
from slurmfabric.topology.pci import chain_from_path
from slurmfabric.topology.rdma import parse_rate

HERE = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    roots = {}
    for name, make in nodes.NODES.items():
        roots[name] = fakesysfs.build(make(), tmp_path_factory.mktemp(name))
    return roots


def test_h100_ports_and_attributes(built: dict[str, Path]) -> None:
    topo = discover(built["h100_ib"])
    assert [d.name for d in topo.rdma][:3] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    port = topo.port("mlx5_0", 1)
    assert port is not None
    assert (port.state, port.phys_state, port.rate_gbps, port.link_layer) == (
        "ACTIVE",
        "LinkUp",
        400.0,
        "InfiniBand",
    )
    assert port.netdev == "ibp25s0"
    assert port.counters["symbol_error"] == 0 and port.counters["port_xmit_data"] == 123456789
    assert port.gids[0].index == 0 and port.gids[0].gid.startswith("fe80:")
    dev = topo.device("mlx5_0")
    assert dev.pci.address == "0000:19:00.0" and dev.numa_node == 0 and dev.vendor == "0x15b3"
    assert dev.has_uverbs and not dev.is_vf
    assert topo.port("mlx5_4", 1).rate_gbps == 200.0
    assert topo.port("mlx5_0", 2) is None and topo.port("nope", 1) is None
    assert topo.gdr.mode == "peermem" and "nvidia_peermem" in topo.gdr.evidence
    assert [(n.id, len(n.cpus)) for n in topo.numa] == [(0, 112), (1, 112)]
    assert topo.cpu_siblings[3] == (3, 115)
    eno1 = topo.netdev("eno1")
    assert eno1.ipv4 == ("10.1.0.15/16",) and eno1.pci_address == "0000:01:00.0"


def test_gpus_from_sysfs_and_procfs(built: dict[str, Path]) -> None:
    topo = discover(built["h100_ib"], nvml=False)
    assert topo.gpu_source == "sysfs"
    assert [g.bus_id for g in topo.gpus][:2] == ["0000:18:00.0", "0000:29:00.0"]
    gpu = topo.gpus[4]
    assert (gpu.index, gpu.numa_node, gpu.minor) == (4, 1, 4)
    assert gpu.uuid == "GPU-6b7c8d9e-0000-4000-8000-000000000004"
    assert gpu.name == "NVIDIA H100 80GB HBM3"


def test_distances_follow_nvidia_smi(built: dict[str, Path]) -> None:
    topo = discover(built["h100_ib"])
    g0, g4 = topo.gpus[0], topo.gpus[4]
    assert topo.distance(g0, topo.device("mlx5_0")) == "PIX"  # same switch
    assert topo.distance(g0, topo.device("mlx5_1")) == "NODE"  # other host bridge, same node
    assert topo.distance(g0, topo.device("mlx5_6")) == "SYS"  # other socket
    assert topo.distance(g4, topo.device("mlx5_6")) == "PIX"
    oci = discover(built["oci_nested"])
    assert oci.distance(oci.gpus[0], oci.device("mlx5_0")) == "PXB"  # nested switches
    assert oci.distance(oci.device("mlx5_0"), oci.device("mlx5_1")) == "PIX"  # .0 and .1
    assert oci.distance(oci.gpus[0], oci.device("mlx5_4")) == "NODE"


def test_distance_rules_on_paths() -> None:
    chain = chain_from_path("/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/infiniband/mlx5_0")
    assert chain == ("pci0000:17", "0000:17:01.0", "0000:18:00.0")
    from slurmfabric.topology.model import PciDevice

    def dev(path: str, numa: int | None = None) -> PciDevice:
        parts = tuple(path.split("/"))
        return PciDevice(parts[-1], parts, numa_node=numa)

    a = dev("pci0000:17/0000:17:01.0/0000:18:00.0")
    b = dev("pci0000:17/0000:17:02.0/0000:19:00.0")
    assert distance(a, b) == "PHB"  # different root ports, one host bridge
    assert (
        distance(
            dev("pci0000:17/0000:17:01.0/0000:18:00.0"), dev("pci0000:97/0000:97:01.0/0000:98:00.0")
        )
        == "SYS"
    )
    assert (
        distance(
            dev("pci0000:17/0000:17:01.0/0000:18:00.0", 0),
            dev("pci0000:27/0000:27:01.0/0000:28:00.0", 0),
        )
        == "NODE"
    )
    assert distance(a, None) == "SYS"


def test_parse_rate() -> None:
    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate("garbage") is None and parse_rate(None) is None


def test_pod_gids_outside_namespace_read_as_unknown(built: dict[str, Path]) -> None:
    topo = discover(built["pod_gids_from_6"])
    port = topo.port("mlx5_0", 1)
    by_index = {g.index: g for g in port.gids}
    assert by_index[3].type is None and by_index[3].ndev is None  # EINVAL in the pod
    assert by_index[7].type == "RoCE v2" and by_index[7].ndev == "net1"
    assert by_index[7].ipv4 == "10.152.0.12"
    assert topo.allowed_cpus == tuple(range(2, 10))  # Cpus_allowed_list, not all CPUs


def test_odd_files_never_crash(tmp_path: Path) -> None:
    node = nodes.h100_ib()
    node.rdma[0].ports[1].counters = {"symbol_error": "N/A (no PMA)"}
    node.rdma[0].ports[1].state = ""
    node.rdma[1].numa = -1
    node.rdma[2].ports[1].rate = "weird"
    root = fakesysfs.build(node, tmp_path)
    (root / "sys/class/infiniband/mlx5_3/ports/1/link_layer").unlink()
    topo = discover(root)
    assert topo.port("mlx5_0", 1).counters["symbol_error"] is None
    assert topo.port("mlx5_0", 1).state == "UNKNOWN"
    assert topo.device("mlx5_1").numa_node is None
    assert topo.port("mlx5_2", 1).rate_gbps is None
    assert topo.port("mlx5_3", 1).link_layer == "Unknown"


def test_bonds_vfs_efa_and_empty_root(built: dict[str, Path], tmp_path: Path) -> None:
    roce = discover(built["h100_roce_numa_off"])
    bond = roce.netdev("bond0")
    assert bond.is_bond and set(bond.bond_slaves) == {"ens5bf0np0", "ensdbf0np0"}
    assert roce.netdev("ens5bf0np0").master == "bond0"
    assert all(d.numa_node is None for d in roce.rdma)  # numa=off: every numa_node is -1
    vf = discover(built["sriov"]).device("mlx5_2")
    assert vf.is_vf and vf.pci.physfn == "0000:1b:00.0"
    assert discover(built["sriov"]).device("mlx5_3").has_uverbs is False
    efa = discover(built["aws_efa"])
    assert all(d.is_efa for d in efa.rdma) and efa.ports[0].link_layer == "Unknown"
    assert efa.markers == {"aws-ofi-nccl": "/opt/amazon/ofi-nccl/lib/libnccl-net.so"}
    empty = discover(tmp_path)
    assert (empty.gpus, empty.rdma, empty.netdevs) == ((), (), ())
    assert empty.notes and "missing or empty" in empty.notes[0]


def test_dmabuf_detected_without_peermem(built: dict[str, Path]) -> None:
    oci = discover(built["oci_nested"])
    assert oci.gdr.mode == "dmabuf" and "6.5.0" in oci.gdr.evidence
    assert discover(built["tcp_only"]).gdr.mode == "none"


@pytest.mark.parametrize("name", ["h100_roce_numa_off", "pod_gids_from_6", "sriov", "aws_efa"])
def test_snapshots_round_trip(built: dict[str, Path], tmp_path: Path, name: str) -> None:
    topo = discover(built[name])
    tar, js = tmp_path / "t.tar.gz", tmp_path / "t.json"
    snapshot.write_tarball(built[name], tar)
    snapshot.write_json(topo, js)
    for loaded in (snapshot.load(tar), snapshot.load(js)):
        assert replace(loaded, root="") == replace(topo, root="")


def test_snapshot_rejects_foreign_files(tmp_path: Path) -> None:
    from slurmfabric.errors import TopologyError

    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(TopologyError, match="not a slurmfabric topology snapshot"):
        snapshot.load(bad)
    with pytest.raises(TopologyError, match="no such"):
        snapshot.load(tmp_path / "missing.json")


def test_topo_cli_on_this_machine_says_nothing_found(tmp_path: Path, capsys, monkeypatch) -> None:
    # This machine (and a root with an empty sys/) has no GPUs and no RDMA: say so plainly.
    monkeypatch.delenv("SLURMFABRIC_SYSFS_ROOT", raising=False)
    (tmp_path / "sys").mkdir()
    for argv in ([], ["--sysfs-root", str(tmp_path)]):
        assert topo_cmd.main(argv) == 0
        text = capsys.readouterr().out
        assert "GPUs: none found" in text
        assert "RDMA ports: none found" in text
        assert "TCP ONLY" in text


def test_topo_cli_h100_table_json_explain_and_snapshot(
    built: dict[str, Path], tmp_path: Path, capsys
) -> None:
    root = str(built["h100_ib"])
    assert topo_cmd.main(["--sysfs-root", root, "--master-addr", "10.1.0.2", "--explain"]) == 0
    text = capsys.readouterr().out
    assert "  mlx5_0:1  ACTIVE  400   InfiniBand  0     0000:19:00.0  ibp25s0   rail" in text
    assert (
        "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_6:1,mlx5_7:1,mlx5_8:1,mlx5_9:1"
        in text
    )
    assert "not a rail: mlx5_4:1: nearest GPU is NODE" in text
    assert (
        "  mlx5_4:1  ACTIVE  200   InfiniBand  0     0000:5b:00.0  ibp91s0   storage/frontend"
        in text
    )
    assert "  0     0    mlx5_0:1  0-13,112-125    0" in text
    assert topo_cmd.main(["--sysfs-root", root, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["nccl_env"]["NCCL_NET"] == "IB"
    assert len(data["topology"]["gpus"]) == 8
    out = tmp_path / "snap.tar.gz"
    assert topo_cmd.main(["snapshot", "-o", str(out), "--sysfs-root", root]) == 0
    assert "8 GPUs, 10 RDMA ports" in capsys.readouterr().out
    assert topo_cmd.main(["--from", str(out), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["plan"]["rails"] == data["plan"]["rails"]


def test_per_rank_modules_stay_light() -> None:
    import subprocess

    code = (
        "import sys, slurmfabric.topology, slurmfabric.plan, slurmfabric.rank.binding\n"
        "from slurmfabric.topology import discover\n"
        "from slurmfabric.plan import make_plan\n"
        "make_plan(discover(nvml=False), 1)\n"
        "heavy = ('pydantic', 'pydantic_settings', 'jinja2', 'psutil', 'torch', 'pynvml')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_nvml_names_gpus_when_available(built: dict[str, Path], monkeypatch) -> None:
    import types

    fake = types.ModuleType("pynvml")
    buses = {0: b"00000000:29:00.0", 1: b"00000000:18:00.0"}  # NVML's 8-digit domain
    fake.nvmlInit = lambda: None
    fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: 2
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=buses[h])
    fake.nvmlDeviceGetUUID = lambda h: f"GPU-nvml-{h}"
    fake.nvmlDeviceGetName = lambda h: "NVIDIA H100 (nvml)"

    def no_minor(handle: int) -> int:
        raise RuntimeError("NVMLError_NotSupported")

    fake.nvmlDeviceGetMinorNumber = no_minor
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    topo = discover(built["h100_ib"], nvml=True)
    assert topo.gpu_source == "nvml"
    first = topo.gpus[0]  # 0000:18:00.0 is NVML index 1 here
    assert (first.bus_id, first.index, first.uuid, first.name) == (
        "0000:18:00.0",
        1,
        "GPU-nvml-1",
        "NVIDIA H100 (nvml)",
    )
    assert first.minor == 0  # NVML could not say: /proc/driver/nvidia fills it in

    def broken() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    fake.nvmlInit = broken
    assert discover(built["h100_ib"], nvml=True).gpu_source == "sysfs"


def test_root_from_environment_and_json_output_replays(
    built: dict[str, Path], tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("SLURMFABRIC_SYSFS_ROOT", str(built["sriov"]))
    assert [d.name for d in discover().rdma][:2] == ["mlx5_0", "mlx5_1"]
    assert topo_cmd.main(["--json"]) == 0
    saved = tmp_path / "topo.json"
    saved.write_text(capsys.readouterr().out)
    monkeypatch.delenv("SLURMFABRIC_SYSFS_ROOT")
    replay = snapshot.load(saved)
    assert replace(replay, root="") == replace(
        discover(built["sriov"]), root=""
    )


def test_a_snapshot_of_zeros_is_refused_at_once_as_bad_input(tmp_path) -> None:
    """100 MB of zeros: ``tarfile.is_tarfile`` spent 17 s in the xz decoder (zeros are xz
    stream padding) before refusing it; the magic numbers decide in microseconds, and the
    refusal is bad input (exit 2), not a discovery failure."""
    import time

    from slurmfabric.errors import UsageError

    zeros = tmp_path / "zeros"
    with open(zeros, "wb") as handle:
        handle.truncate(100 << 20)
    start = time.monotonic()
    with pytest.raises(UsageError, match="neither a tarball nor JSON") as caught:
        snapshot.load(zeros)
    assert time.monotonic() - start < 5, "the refusal must not decode 100 MB"
    assert caught.value.exit_code == 2
    assert snapshot.tar_mode(b"\x1f\x8b" + bytes(600)) == "r:gz"
    assert snapshot.tar_mode(bytes(257) + b"ustar\x0000" + bytes(300)) == "r:"
    assert snapshot.tar_mode(b"\xfd7zXZ\x00" + bytes(10)) == "r:xz"
    assert snapshot.tar_mode(bytes(600)) is None
