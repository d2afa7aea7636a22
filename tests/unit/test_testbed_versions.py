"""Testbed files that depend on the Slurm release (22.05 on Debian 12, 24.11 on Debian 13)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmfabric.slurm import cmd
from slurmfabric.testbed import Settings, hosts_block, merge_hosts, render_slurm_conf
from slurmfabric.testbed.config import current_block, render_cgroup_conf

FIXTURES = Path(__file__).parent.parent / "fixtures"


def settings_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize(("version", "expected"), [
    ("slurm22", []),  # 22.05 rejects 'disabled' and needs nothing
    ("slurm24", ["CgroupPlugin=disabled"]),  # 24.11 slurmd exits without a cgroup tree
])
def test_cgroup_conf_follows_recorded_slurmd_version(version, expected):
    found = cmd.parse_version((FIXTURES / version / "slurmd_V.txt").read_text())
    text = render_cgroup_conf(found)
    assert settings_lines(text) == expected
    assert ".".join(map(str, found)) in text.splitlines()[0]


@pytest.mark.parametrize(("version", "disabled"), [
    ((23, 2, 0), True), ((23, 1, 9), False), ((25, 5, 1), True), ((21, 8, 8), False)])
def test_cgroup_conf_switch_is_at_23_02(version, disabled):
    assert ("CgroupPlugin=disabled" in settings_lines(render_cgroup_conf(version))) is disabled


def test_conf_sets_mailprog_and_cgroup_conf_sits_beside_slurm_conf(tmp_path):
    s = Settings(state_dir=tmp_path)
    assert "MailProg=/bin/true" in render_slurm_conf(s).splitlines()
    assert s.cgroup_conf_path.parent == s.conf_path.parent
    assert s.cgroup_conf_path.name == "cgroup.conf"


def test_hosts_block_with_own_names_survives_a_second_merge(tmp_path):
    s = Settings(state_dir=tmp_path, nodes=2, prefix="sft", addr_prefix="127.0.80.")
    block = hosts_block(s, ["vm.example.org", "vm"])
    assert "127.0.0.1 vm.example.org vm\n" in block
    hosts = merge_hosts("127.0.0.1 localhost\n", block)
    found = current_block(hosts, "sft")
    assert found == block
    assert {"vm", "vm.example.org", "sft1", "sft2"} <= set(found.split())
    assert merge_hosts(hosts, block) == hosts  # idempotent
    assert current_block(hosts, "sfn") == ""  # another testbed's prefix: no block
    assert "127.0.0.1" not in hosts_block(s).replace("127.0.0.1 localhost", "")
