from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmfabric.commands import nccl_log as cmd
from slurmfabric.nccl.log import classify_warning, parse_log

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def load(name: str, **kw):
    return parse_log((FIX / name).read_text(), source=name, **kw)


def by_key(report):
    return {r.key: r for r in report.ranks}


def kinds(report):
    return [p.kind for p in report.problems]


def test_socket_fallback_2_19_on_one_rank_is_said_not_failed():
    rep = load("nccl-2.19.3-socket-fallback.log")
    (r,) = rep.ranks
    assert (r.node, r.pid, r.device, r.rank) == ("instance-8g-96c-2", "525781", 0, 0)
    assert r.version == "2.19.3+cuda12.3"  # from the bare "NCCL version" line
    assert r.network == "Socket" and r.no_ib_device
    assert r.interfaces == ["ens7:10.128.0.31<0>"]
    assert r.bootstrap == ["ens7:10.128.0.31<0>"]
    assert r.channels == 32
    assert kinds(rep) == ["socket_fallback"]
    assert "NET/IB found no device" in rep.problems[0].message
    # "comm ... rank 0 nranks 1": the whole communicator is this one rank, so nothing
    # crossed a network (issue 46: single-host runs are not judged on the network)
    assert rep.problems[0].severity == "warning" and not rep.failed()
    assert "no traffic crossed the network" in rep.problems[0].message


def test_allow_socket_accepts_a_socket_only_cluster():
    rep = load("nccl-2.19.3-socket-fallback.log", allow_socket=True)
    assert not rep.failed()


def test_forced_socket_2_11_names_the_cause():
    rep = load("nccl-2.11.4-socket-forced.log")
    gpu01 = [r for r in rep.ranks if r.node == "gpu01"][0]
    assert gpu01.version == "2.11.4+cuda11.4" and gpu01.network == "Socket"
    assert kinds(rep) == ["socket_fallback"]


def test_ib_devices_and_oob_2_13():
    rep = load("nccl-2.13.4-ib.log")
    r = by_key(rep)["4c217144f0b1:113168[0]"]
    assert r.network == "IB"
    assert r.net_devices == ["mlx5_0:1/IB", "mlx5_1:1/IB", "mlx5_2:1/IB", "mlx5_3:1/IB"]
    assert r.interfaces == ["eth0:10.0.1.9<0>"]
    assert r.version.startswith("2.13.4")
    assert not rep.failed()


def test_roce_2_18_rank_from_comm_line():
    rep = load("nccl-2.18.3-roce.log")
    (r,) = rep.ranks
    assert r.net_devices == ["mlx5_0:1/RoCE"] and r.rank == 0 and r.nranks == 1
    assert r.version == "2.18.3+cuda12.2"
    assert rep.problems == []


def test_ibv_modify_qp_2_19_is_classified_with_gid_remedy():
    rep = load("nccl-2.19.3-roce-modify-qp.log")
    # the QP error propagates to proxy.cc: the communicator failed, rooted at that WARN
    assert kinds(rep) == ["comm_failed", "ibv_modify_qp", "nccl_warn", "peer_lost"]
    assert "ibv_modify_qp" in rep.problems[0].message
    qp = rep.problems[1]
    assert qp.severity == "error" and "GID index" in qp.remedy
    assert qp.where.startswith("dgxh100-3:225140[0] misc/ibvwrap.cc:187")
    nodes = {r.node for r in rep.ranks}
    assert nodes == {"dgxh100-3", "dgxh100-4"}


@pytest.mark.parametrize(
    "name,status",
    [("nccl-completion-error12-old.log", 12), ("nccl-ib-plugin-completion-status12.log", 12)],
)
def test_completion_errors_old_and_new_format(name, status):
    rep = load(name)
    comp = [p for p in rep.problems if p.kind == "ib_completion"]
    assert len(comp) == 1 and "IBV_WC_RETRY_EXC_ERR" in comp[0].message
    assert "cable" in comp[0].remedy


def test_completion_error_4_points_at_gdr():
    p = classify_warning(
        "NET/IB : Got completion from peer fe80::966d:ae03:8b:df78%ib0<53249> with error 4, "
        "opcode 32564, len 32564, vendor err 81 (Send)"
    )
    assert p.kind == "ib_completion" and "LOC_PROT" in p.message and "ACS" in p.remedy


def test_gdrdma_channels_mean_gdr_on():
    rep = load("nccl-gdrdma-aks.log")
    assert {r.device for r in rep.ranks} == {0, 4, 6}
    assert all(r.gdr is True and r.network == "IB" for r in rep.ranks)
    assert "NET/IB/4/GDRDMA" in by_key(rep)["leader-h2nng:527[4]"].transports
    assert rep.problems == []


def test_gdr_disabled_is_a_warning_or_an_error_when_expected():
    rep = load("nccl-gdr-disabled-roce.log")
    (r,) = rep.ranks
    assert r.gdr is False and r.gdr_disabled_hcas == ["mlx5_0", "mlx5_1"]
    assert [(p.kind, p.severity) for p in rep.problems] == [("gdr_off", "warning")]
    assert not rep.failed()
    strict = load("nccl-gdr-disabled-roce.log", expect_gdr=True)
    assert strict.failed() and strict.problems[0].severity == "error"


def test_ib_channels_without_gdrdma_and_no_module_reason():
    rep = load("nccl-gdr-no-module-channels.log")
    a = by_key(rep)["21346d5cefce:5325[0]"]
    assert a.gdr is False and a.ib_channels == 3
    assert "mlx5_1 (no module)" in a.gdr_disabled_hcas
    assert kinds(rep) == ["gdr_off", "gdr_off"]


def test_ib_plugin_ibext_counts_as_ib():
    rep = load("nccl-ib-plugin-completion-status12.log")
    r = by_key(rep)["hostname-test:984[4]"]
    assert r.network == "IBext_v8" and r.rank == 36 and r.nranks == 64
    assert by_key(rep)["hostname-test:983[3]"].channels == 16


def test_ofi_plugin_network_and_provider():
    rep = load("nccl-ofi-efa-p5en.log")
    keys = by_key(rep)
    assert keys["8h200-2:6831[0]"].network == "Libfabric"
    assert keys["8h200-3:6310[0]"].ofi_provider == "efa"
    assert not rep.failed()


def test_mpirun_tagged_ofi_log_labels_and_warning():
    rep = load("nccl-ofi-efa-horovod-tagged.log")
    r = by_key(rep)["ip-172-32-38-1:21471[7]"]
    assert r.label == "7" and r.network == "AWS Libfabric" and r.gdr is None
    assert kinds(rep) == ["ofi"]


def test_rank_labels_before_host_prefix():
    rep = load("nccl-rank-labels-socket.log")
    assert {(r.node, r.device, r.label) for r in rep.ranks} == {
        ("node0", 0, "0"), ("node2", 0, "1"), ("node2", 1, "3")}


def test_bare_dev_prefix_without_host():
    rep = load("nccl-2.5.7-bare-rank-prefix.log")
    (r,) = rep.ranks
    assert r.node == "nccl-2.5.7-bare-rank-prefix.log" and r.device == 0
    assert r.version.startswith("2.5.7") and r.channels == 2 and r.trees
    assert r.network == "IB" and r.gdr is False  # Ring ... via NET/IB/0 without GDRDMA


def test_no_device_lines_and_socket_lines_old_format():
    rep = load("nccl-no-device-multinode.log")
    assert kinds(rep).count("socket_fallback") == 2
    assert kinds(rep).count("no_ib_device") == 2


def test_torch_watchdog_timeout_counts():
    text = (
        "[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, "
        "NumelIn=544997376, NumelOut=68124672, Timeout(ms)=600000) ran for 600061 milliseconds "
        "before timing out.\n"
    )
    rep = parse_log(text)
    assert kinds(rep) == ["timeout"] and rep.failed()


def test_cli_exit_codes_table_and_json(capsys):
    assert cmd.main([str(FIX / "nccl-gdrdma-aks.log")]) == 0
    out = capsys.readouterr().out
    assert "leader-h2nng:527[4]" in out and "result: OK" in out
    assert cmd.main([str(FIX / "nccl-no-device-multinode.log"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and any(r["uses_socket"] for r in data["ranks"])
    assert "socket_fallback" in {p["kind"] for p in data["problems"]}


def test_cli_reads_several_files_and_rejects_non_logs(tmp_path, capsys):
    rc = cmd.main([str(FIX / "nccl-2.13.4-ib.log"), str(FIX / "nccl-gdr-disabled-roce.log"),
                   "--expect-gdr"])
    assert rc == 1
    empty = tmp_path / "x.log"
    empty.write_text("hello\n")
    with pytest.raises(Exception, match="no NCCL log lines"):
        cmd.main([str(empty)])
