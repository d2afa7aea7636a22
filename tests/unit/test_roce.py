"""RoCE lossless checks on recorded real outputs (tests/fixtures/roce/, sources in
SOURCES.md) and fixture nodes built from them (tests/roce_nodes.py): parsers, per-port
facts with and without the tools, the health checks against a profile, counter deltas over
a job, the cluster audit and topo --explain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import roce_nodes
from cleanenv import clean_env
from helpers import write_config
from roce_nodes import NETDEVS, PROFILE, outputs, recorded

from slurmfabric.health.checks import roce as health_roce
from slurmfabric.health.model import FAIL, OK, WARN, Context
from slurmfabric.roce import audit, parse
from slurmfabric.roce.facts import RocePort, Tools, collect
from slurmfabric.roce.profile import Profile, differences


def tools_of(paths: dict[str, str]) -> Tools:
    return Tools(ethtool=paths["ethtool"], mlnx_qos=paths["mlnx_qos"], dcb=paths["dcb"])


# --- parsers on recorded outputs ----------------------------------------------------------

def test_mlnx_qos_outputs_parse_to_trust_pfc_and_the_dscp_map() -> None:
    good = parse.mlnx_qos(recorded("mlnx_qos_trust_dscp_pfc3.txt"))
    assert good.trust == "dscp" and good.pfc == (False,) * 3 + (True,) + (False,) * 4
    assert good.dscp2prio[26] == 3 and good.dscp2prio[48] == 6 and len(good.dscp2prio) == 64
    assert good.prio_tc[0] == 1 and good.tsa[3] == "vendor"
    collapsed = parse.mlnx_qos(recorded("mlnx_qos_pfc_0_2_6_7_ets_strict.txt"))
    assert [p for p, on in enumerate(collapsed.pfc) if on] == [0, 2, 6, 7]
    assert collapsed.tsa[6] == "strict" and collapsed.tsa[7] == "ets, bw: 40%"
    assert collapsed.prio_tc[7] == 7
    script = parse.mlnx_qos(recorded("spiderpool_qos_query_pfc5_ecn_cnp48.txt"))
    assert script.trust == "dscp" and [p for p, on in enumerate(script.pfc) if on] == [5]
    pcp = parse.mlnx_qos(recorded("mlnx_qos_trust_pcp_no_pfc.txt"))
    assert pcp.trust == "pcp" and pcp.pfc == (False,) * 8 and pcp.dscp2prio == {}


def test_dcb_ethtool_and_traffic_class_outputs_parse() -> None:
    assert [p for p, on in enumerate(parse.dcb_pfc(recorded("dcb_pfc_show_manpage.txt")))
            if on] == [6, 7]
    assert [p for p, on in enumerate(parse.dcb_pfc(recorded("dcb_pfc_show_commit_6567cb5.txt")))
            if on] == [1, 7]  # pre-release "pg-pfc"
    # The first "show" output of the transcript; CS3/CS6 are DSCP 24/48 (rt_dsfield names)
    first = recorded("dcb_app_show_commit_8e9bed1.txt").split("# dcb app add dev eni1np1 "
                                                               "dscp-prio CS3:4")[0]
    assert parse.dcb_app_dscp(first) == {0: 0, 24: 3, 48: 6}
    stats = parse.ethtool_stats(recorded("ethtool_mlx5_cx6dx_global_pause_discards.txt"))
    assert stats["rx_discards_phy"] == 441063206498 and stats["tx_global_pause"] == 44414017
    assert not any(k.endswith("_pause") and "prio" in k for k in stats)  # no PFC there
    assert parse.ethtool_stats("NIC statistics:\n  bad line\n  x: 1e9\n  ok: 7\n") == {"ok": 7}
    text = recorded("spiderpool_qos_query_pfc5_ecn_cnp48.txt")
    assert parse.traffic_class(text) == 160 and parse.traffic_class("") is None
    assert parse.tos_priority(106) == (26, 3) and parse.tos_priority(160) == (40, 5)


# --- per-port facts ------------------------------------------------------------------------

def test_a_lossless_node_matches_the_profile(tmp_path) -> None:
    root, paths = roce_nodes.healthy(tmp_path)
    ports = collect(str(root), tools_of(paths))
    assert [p.name for p in ports] == ["mlx5_0:1", "mlx5_1:1"]  # not the IB storage HCA
    for port in ports:
        assert (port.netdev, port.mtu, port.trust, port.roce_tos) == \
            (NETDEVS[port.device], 4200, "dscp", 106)
        assert port.pfc_source == "mlnx_qos" and port.ecn_np == (True,) * 8
        assert port.counters["rx_prio3_pause"] == 0 and "np_cnp_sent" in port.counters
        assert differences(port, Profile(**PROFILE)) == [] and port.unseen == []
    result = health_roce.check_qos(ports, {"roce_profile": PROFILE}, Context("prolog", "n"))
    assert result.status == OK and result.reason == ""
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "roce", "facts",
                           "--sysfs-root", str(root), "--ethtool", paths["ethtool"],
                           "--mlnx-qos", paths["mlnx_qos"], "--dcb", paths["dcb"]],
                          capture_output=True, text=True)
    assert proc.stdout.splitlines() == [
        f"mlx5_{i}:1 (ens{i + 1}np0): mtu 4200 trust dscp PFC [3] ECN [0, 1, 2, 3, 4, 5, 6, 7] "
        "ToS 106" for i in (0, 1)]


def test_each_misconfiguration_is_named_with_its_port(tmp_path) -> None:
    root = roce_nodes.build(tmp_path / "root" / "local", mtu=1500, tclass=0,
                            ecn={"ens2np0": [3]})
    out = tmp_path / "out"
    outputs(out, "local", "ens1np0", mlnx_qos="mlnx_qos_pfc_0_2_6_7_ets_strict.txt")
    outputs(out, "local", "ens2np0", mlnx_qos="mlnx_qos_trust_pcp_no_pfc.txt",
            ethtool=recorded("ethtool_mlx5_cx6dx_global_pause_discards.txt"))
    ports = collect(str(root), tools_of(roce_nodes.tools(tmp_path / "bin", out)))
    profile = Profile(**PROFILE)
    assert differences(ports[0], profile) == [
        "PFC on priorities [0, 2, 6, 7] (profile [3])",
        "RoCE ToS 0 (profile 106; /sys/class/infiniband/mlx5_0/tc/1/traffic_class)",
        "MTU 1500 (profile 4200)"]
    assert differences(ports[1], profile) == [
        "trust pcp (profile dscp)", "PFC on priorities none (profile [3])",
        "802.3x global pause is on (ethtool -S lists global pause counters): lossless RoCE "
        "uses PFC",
        "ECN off at the notification point (roce_np) for priority 3",
        "ECN off at the reaction point (roce_rp) for priority 3",
        "RoCE ToS 0 (profile 106; /sys/class/infiniband/mlx5_1/tc/1/traffic_class)",
        "MTU 1500 (profile 4200)"]
    result = health_roce.check_qos(ports, {"roce_profile": PROFILE}, Context("prolog", "n"))
    assert result.status == FAIL
    assert result.reason.startswith("mlx5_0:1 (ens1np0): PFC on priorities [0, 2, 6, 7]")
    assert "; mlx5_1:1 (ens2np0): trust pcp (profile dscp);" in result.reason


def test_without_the_tools_sysfs_and_counters_still_tell_and_the_rest_is_unseen(tmp_path):
    root = roce_nodes.build(tmp_path / "root", trust=None, tclass=None)
    none = Tools(ethtool=None, mlnx_qos=None, dcb=None)
    (port, _) = collect(str(root), none)
    assert port.ecn_np == (True,) * 8 and port.mtu == 4200 and port.pfc is None
    assert "PFC: no mlnx_qos, no dcb and no per-priority ethtool counters" in port.unseen
    result = health_roce.check_qos([port], {"roce_profile": PROFILE}, Context("check", "n"))
    assert result.status == WARN  # never a drain for what could not be read
    assert result.reason.startswith("mlx5_0:1 (ens1np0) could not see trust; PFC; RoCE ToS (")
    # ethtool alone: PFC from the per-priority pause counters mlx5 lists (PFC on 3 only)
    out = tmp_path / "out"
    outputs(out, "local", "ens1np0", mlnx_qos=None)
    paths = roce_nodes.tools(tmp_path / "bin", out)
    (port, _) = collect(str(root), Tools(ethtool=paths["ethtool"], mlnx_qos=None, dcb=None))
    assert port.pfc == (False,) * 3 + (True,) + (False,) * 4
    assert port.pfc_source.startswith("ethtool -S")
    # and the PFC-off recording shows no PFC priority at all
    outputs(out, "local", "ens1np0", mlnx_qos=None,
            ethtool="NIC statistics:\n" + recorded("ethtool_mlx5_grep_prio_no_pfc.txt"))
    (port, _) = collect(str(root), Tools(ethtool=paths["ethtool"], mlnx_qos=None, dcb=None))
    assert port.pfc == (False,) * 8


def test_dcb_gives_pfc_and_trust_where_mlnx_qos_is_absent(tmp_path) -> None:
    root = roce_nodes.build(tmp_path / "root", trust=None)
    out = tmp_path / "out"
    outputs(out, "local", "ens1np0", mlnx_qos=None, dcb_pfc="dcb_pfc_show_manpage.txt",
            dcb_app="dcb_app_show_commit_8e9bed1.txt")
    paths = roce_nodes.tools(tmp_path / "bin", out)
    (port, _) = collect(str(root), Tools(ethtool=None, mlnx_qos=paths["mlnx_qos"],
                                         dcb=paths["dcb"]))
    assert port.pfc_source == "dcb pfc" and [p for p, on in enumerate(port.pfc) if on] == \
        [6, 7]
    assert port.trust == "dscp" and port.trust_source == "dcb app"
    assert "mlnx_qos: mlnx_qos exit 1: Interface ens1np0 not found" in port.unseen


def test_loss_during_a_job_fails_pause_is_reported(tmp_path) -> None:
    root, paths = roce_nodes.healthy(tmp_path)
    before = health_roce.snapshot(collect(str(root), tools_of(paths)))
    grown = roce_nodes.ethtool_lossless(loss={"rx_discards_phy": 441063206498 + 1234},
                                        pause=5000)
    outputs(tmp_path / "out", "local", "ens2np0", ethtool=grown)
    after = collect(str(root), tools_of(paths))
    ctx = Context("epilog", "n", "42", roce_before=before)
    result = health_roce.check_counters(after, {}, ctx)
    assert result.status == FAIL
    assert result.reason == ("mlx5_1:1 (ens2np0) rx_discards_phy +1234 during the job "
                             "(limit 0)")
    assert result.values["mlx5_1:1 rx_prio3_pause"] == "+5000"
    assert health_roce.check_counters(after, {"roce_delta_max": {"rx_discards_phy": 2000}},
                                      ctx).status == OK
    # No prolog snapshot: totals since boot say nothing about this job.
    assert health_roce.check_counters(after, {}, Context("check", "n")).status == OK


def test_the_health_hooks_drain_a_misconfigured_port_with_the_setting(tmp_path) -> None:
    """`health check` with the site config: the report names the port and what differs."""
    root, paths = roce_nodes.healthy(tmp_path)
    outputs(tmp_path / "out", "local", "ens2np0", mlnx_qos="mlnx_qos_trust_pcp_no_pfc.txt")
    state = tmp_path / "state"
    cfg = write_config(tmp_path / "health.toml", state, [{
        "match": "*", "sysfs_root": str(root), "gpus": 0, "roce_profile": PROFILE,
        **paths, "mlnx_qos": paths["mlnx_qos"]}], runner={"drain": False})
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "check", "--config",
                           str(cfg), "--json"], capture_output=True, text=True,
                          env=clean_env(PATH="/usr/bin:/bin", SLURMD_NODENAME="local"))
    report = json.loads(proc.stdout)
    check = next(c for c in report["checks"] if c["check"] == "rdma.roce_qos")
    assert proc.returncode == 1 and check["status"] == "fail", proc.stdout
    assert check["reason"] == ("mlx5_1:1 (ens2np0): trust pcp (profile dscp); PFC on "
                               "priorities none (profile [3])")


def test_a_bad_profile_is_one_config_error_naming_the_key(tmp_path) -> None:
    from slurmfabric.health import siteconfig

    for table, message in (({"pfc_priorities": [8]}, "roce_profile.pfc_priorities = [8]"),
                           ({"trust": "l3"}, 'should be "dscp" or "pcp"'),
                           ({"tos": 106}, "roce_profile.'tos' is not a profile key")):
        cfg = write_config(tmp_path / "h.toml", tmp_path, [{"roce_profile": table}])
        with pytest.raises(Exception) as error:
            siteconfig.load("n", str(cfg))
        assert message in str(error.value), str(error.value)


# --- the cluster audit ---------------------------------------------------------------------

def sample(node: str, when: float, ports: list[RocePort], where: Path, k: int) -> None:
    (where / f"{node}.{k}.json").write_text(json.dumps(
        {"node": node, "time": when, "ports": [p.to_dict() for p in ports]}))


def test_the_audit_names_the_node_that_differs_and_the_port_losing_packets(tmp_path):
    root, paths = roce_nodes.healthy(tmp_path)
    good = collect(str(root), tools_of(paths))
    results = tmp_path / "results"
    results.mkdir()
    for node in ["n1", "n2", "n3", "n4"]:
        ports = [RocePort.from_dict(p.to_dict()) for p in good]
        if node == "n3":
            ports[1].pfc, ports[1].trust = (False,) * 8, "pcp"
        sample(node, 100.0, ports, results, 0)
        if node == "n2":
            ports[0].counters["rx_discards_phy"] += 500  # 50 per second over 10 s
            ports[0].counters["tx_prio3_pause"] += 100
        sample(node, 110.0, ports, results, 1)
    samples = audit.load(results)
    report = audit.analyze(samples, {"n1": Profile(**PROFILE)})
    assert [f.node for f in report.findings] == ["n3"]
    assert report.findings[0].problems == [
        "mlx5_1:1 (ens2np0): trust pcp (majority: trust dscp on 3 of 4 nodes)",
        "mlx5_1:1 (ens2np0): pfc on no priority (majority: pfc on [3] on 3 of 4 nodes)"]
    (growth,) = report.growth
    assert (growth.node, growth.port, growth.loss_per_s) == ("n2", "mlx5_0:1 (ens1np0)", 50.0)
    assert growth.line() == "n2 mlx5_0:1 (ens1np0): rx_discards_phy +50/s, tx_prio3_pause +10/s"
    prom = audit.prometheus(samples, report)
    assert 'slurmfabric_roce_setting_findings{node="n3"} 2' in prom
    assert 'slurmfabric_roce_loss_per_second{node="n2",port="mlx5_0:1 (ens1np0)"} 50' in prom
    assert audit.to_json(audit.analyze(audit.load(results))) == audit.to_json(
        audit.analyze(audit.load(results)))  # the same files, the same report
    from slurmfabric.cli import main

    assert main(["roce", "report", str(results), "--prom", str(tmp_path / "r.prom")]) == 1
    assert (tmp_path / "r.prom").read_text() == audit.prometheus(samples, audit.analyze(
        samples))


def test_the_audit_job_script_is_one_step_per_sample(tmp_path, capsys) -> None:
    from slurmfabric.cli import main

    assert main(["roce", "audit", "--nodes", "gpu[01-04]", "--results", str(tmp_path / "r"),
                 "--interval", "5", "--dry-run"]) == 0
    script = capsys.readouterr().out.split("\n", 2)[-1]
    assert script.count("srun \"${STEP[@]}\" \"${FACTS[@]}\" --sample") == 2
    assert "#SBATCH --nodelist=gpu01,gpu02,gpu03,gpu04" in script and "sleep 5" in script
    path = tmp_path / "job.sh"
    path.write_text(script[script.index("#!/bin/bash"):])
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


# --- topo --explain ------------------------------------------------------------------------

def test_topo_explain_warns_when_ncccl_traffic_lands_on_a_lossy_priority(tmp_path) -> None:
    """No traffic_class set: NCCL's QPs carry NCCL_IB_TC, default 0 = priority 0, which has no
    PFC on a lossless port; with NCCL_IB_TC=106 it lands on priority 3."""
    from slurmfabric.plan import make_plan
    from slurmfabric.roce.explain import lines
    from slurmfabric.topology import discover

    root, paths = roce_nodes.healthy(tmp_path, tclass=None)
    topo = discover(str(root))
    plan = make_plan(topo, 2)
    ports = collect(str(root), tools_of(paths))
    text = "\n".join(lines(topo, plan, ports, {}))
    assert "NCCL ToS 0 (NCCL_IB_TC unset (NCCL's default 0)) = DSCP 0 -> priority 0" in text
    assert ("warning: NCCL's traffic on mlx5_0:1 lands on priority 0, which has no PFC (PFC "
            "on [3]): lossy. Set NCCL_IB_TC to a ToS whose DSCP maps to a PFC priority (e.g. "
            "98)") in text
    text = "\n".join(lines(topo, plan, ports, {"NCCL_IB_TC": "106"}))
    assert "= DSCP 26 -> priority 3" in text and "warning" not in text
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "topo", "--sysfs-root",
                           str(root), "--explain"], capture_output=True, text=True)
    assert "RoCE traffic (lossless check):" in proc.stdout
    assert "ethtool, mlnx_qos and dcb not run" in proc.stdout  # a fixture root


def test_the_readme_profile_is_a_valid_health_config(tmp_path) -> None:
    import re

    from slurmfabric.health import siteconfig

    readme = (Path(__file__).resolve().parents[2] / "docs" / "roce.md").read_text()
    (block,) = [b for b in re.findall(r"```toml\n(.*?)```", readme, re.S) if "roce_profile" in b]
    path = tmp_path / "health.toml"
    path.write_text(block)
    expect = siteconfig.load("gpu007", str(path)).expect
    assert expect["roce_profile"] == PROFILE and expect["roce_delta_max"] == {
        "out_of_sequence": 1000}


def test_health_check_speaks_node_problem_detector_and_node_conditions(tmp_path) -> None:
    """The misconfigured RoCE node as an NPD custom plugin would run it (one line, at most
    80 characters, exit 1) and as a NodeCondition; a healthy node exits 0."""
    root, paths = roce_nodes.healthy(tmp_path)
    outputs(tmp_path / "out", "local", "ens2np0", mlnx_qos="mlnx_qos_trust_pcp_no_pfc.txt")
    cfg = write_config(tmp_path / "health.toml", tmp_path / "state", [{
        "match": "*", "sysfs_root": str(root), "gpus": 0, "roce_profile": PROFILE, **paths}],
        runner={"drain": False})
    base = [sys.executable, "-m", "slurmfabric", "health", "check", "--config", str(cfg)]
    env = clean_env(PATH="/usr/bin:/bin", SLURMD_NODENAME="local")
    npd = subprocess.run([*base, "--npd"], capture_output=True, text=True, env=env)
    assert npd.returncode == 1 and len(npd.stdout.strip()) <= 80
    assert npd.stdout.startswith("rdma.roce_qos: mlx5_1:1 (ens2np0): trust pcp")
    cond = json.loads(subprocess.run([*base, "--condition"], capture_output=True, text=True,
                                     env=env).stdout)
    assert cond["type"] == "SlurmfabricHealthy" and cond["status"] == "False"
    assert cond["reason"] == "RdmaRoceQos" and "PFC on priorities none" in cond["message"]
    outputs(tmp_path / "out", "local", "ens2np0")  # fixed
    ok = subprocess.run([*base, "--npd"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and ok.stdout.strip().endswith("checks passed")
