"""The RoCE audit as a real Slurm job on the testbed: one step per sample over the four
virtual nodes, each reading its own fixture tree (tests/roce_nodes.py, built from the
recorded outputs in tests/fixtures/roce/) through fake ethtool/mlnx_qos/dcb that print
per-node recordings. sfn3's second rail is left at the defaults (trust pcp, no PFC); sfn2's
first rail drops packets between the two samples. The report must name exactly those."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
import roce_nodes
from helpers import write_config
from roce_nodes import NETDEVS, PROFILE, outputs
from testbed_cluster import Cluster

pytestmark = pytest.mark.cluster


def test_the_audit_names_the_misconfigured_node_and_the_dropping_port(cluster: Cluster,
                                                                       tmp_path: Path):
    nodes = cluster.nodes
    assert len(nodes) == 4
    bad, dropping = nodes[2], nodes[1]
    out = tmp_path / "out"
    for node in nodes:
        roce_nodes.build(tmp_path / "roots" / node)
        for netdev in NETDEVS.values():
            outputs(out, node, netdev)
    outputs(out, bad, "ens2np0", mlnx_qos="mlnx_qos_trust_pcp_no_pfc.txt")
    (tmp_path / "roots" / bad / "sys/class/net/ens2np0/qos/trust").write_text("pcp\n")
    paths = roce_nodes.tools(tmp_path / "bin", out)
    results = tmp_path / "audit"
    sub = cluster.run([sys.executable, "-m", "slurmfabric", "roce", "audit", "--nodes",
                       ",".join(nodes), "--results", str(results), "--interval", "4",
                       "--partition", cluster.partition, "--time", "5",
                       "--sysfs-root", f"{tmp_path / 'roots'}/{{node}}",
                       "--ethtool", paths["ethtool"], "--mlnx-qos", paths["mlnx_qos"],
                       "--dcb", paths["dcb"]])
    job_id = re.search(r"submitted job (\d+)", sub.stdout).group(1)
    deadline = time.monotonic() + 120
    while len(list(results.glob("*.0.json"))) < 4:  # the first step has run everywhere
        assert time.monotonic() < deadline, cluster.job(job_id)
        time.sleep(0.2)
    grown = roce_nodes.ethtool_lossless(loss={"rx_discards_phy": 441063206498 + 4000})
    outputs(out, dropping, "ens1np0", ethtool=grown)
    assert cluster.wait(job_id, timeout=120) == "COMPLETED", \
        "".join(p.read_text() for p in results.glob("job-*.out"))
    assert sorted(p.name for p in results.glob("*.json")) == sorted(
        f"{n}.{k}.json" for n in nodes for k in (0, 1))
    health = write_config(tmp_path / "health.toml", tmp_path / "state",
                          [{"match": "*", "roce_profile": PROFILE}])
    rep = cluster.run([sys.executable, "-m", "slurmfabric", "roce", "report", str(results),
                       "--health-config", str(health), "--json",
                       "--prom", str(tmp_path / "roce.prom")], check=False)
    assert rep.returncode == 1, rep.stderr
    data = json.loads(rep.stdout)
    assert [f["node"] for f in data["findings"]] == [bad]
    problems = data["findings"][0]["problems"]
    assert "mlx5_1:1 (ens2np0): trust pcp (majority: trust dscp on 3 of 4 nodes)" in problems
    assert "mlx5_1:1 (ens2np0): trust pcp (profile dscp) [profile]" in problems
    assert "mlx5_1:1 (ens2np0): PFC on priorities none (profile [3]) [profile]" in problems
    (growth,) = data["growth"]
    assert (growth["node"], growth["port"]) == (dropping, "mlx5_0:1 (ens1np0)")
    assert growth["top"][0][0] == "rx_discards_phy" and growth["loss_per_s"] > 0
    assert data["missing"] == [] and data["unseen"] == {}
    prom = (tmp_path / "roce.prom").read_text()
    assert f'slurmfabric_roce_setting_findings{{node="{bad}"}} 4' in prom
    table = cluster.run([sys.executable, "-m", "slurmfabric", "roce", "report", str(results),
                         "--health-config", str(health)], check=False)
    print(table.stdout)  # the report, for the issue note (pytest -s)
    assert table.stdout.splitlines()[1] == f"{bad}:"
