"""The testbed's generated files: pure functions, checked without starting daemons."""

from __future__ import annotations

from pathlib import Path

from slurmfabric.testbed import Settings, hosts_block, merge_hosts, render_slurm_conf


def settings(tmp_path: Path, **kw) -> Settings:
    return Settings(state_dir=tmp_path, **kw)


def test_conf_has_one_node_line_per_node_with_own_port_and_address(tmp_path):
    conf = render_slurm_conf(settings(tmp_path, nodes=3, node_port_base=20001))
    node_lines = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert len(node_lines) == 3
    assert "NodeName=sfn2 " in node_lines[1]
    assert "Port=20002" in node_lines[1]
    assert "NodeAddr=127.0.77.2" in node_lines[1]
    # several slurmd on one host need per-node spool, pid and log paths
    for key in ("SlurmdSpoolDir", "SlurmdPidFile", "SlurmdLogFile"):
        (line,) = [x for x in conf.splitlines() if x.startswith(key + "=")]
        assert "%n" in line
    # srun --mpi=pmix: the plugin's spmix_appdir lives under TmpFS, expanded per node
    assert f"TmpFS={tmp_path}/tmp/%n" in conf
    assert "PartitionName=debug Nodes=sfn1,sfn2,sfn3" in conf
    assert f"Include {tmp_path}/etc/slurm.extra.conf" in conf


def test_merge_hosts_replaces_only_its_own_block(tmp_path):
    original = "127.0.0.1 localhost\n10.1.2.3 login1\n"
    first = merge_hosts(original, hosts_block(settings(tmp_path, nodes=2)))
    assert first.startswith(original)
    assert "127.0.77.2 sfn2\n" in first
    other = hosts_block(settings(tmp_path, nodes=1, prefix="zz", addr_prefix="127.0.78."))
    both = merge_hosts(first, other)
    again = merge_hosts(both, hosts_block(settings(tmp_path, nodes=3)))
    assert again.count("sfn1") == 1
    assert "127.0.77.3 sfn3" in again
    assert "127.0.78.1 zz1" in again  # the other testbed's block survives
    assert again.startswith(original)


def test_merge_hosts_adds_missing_final_newline(tmp_path):
    merged = merge_hosts("127.0.0.1 localhost", hosts_block(settings(tmp_path, nodes=1)))
    assert "localhost\n# BEGIN slurmfabric testbed sfn\n" in merged
