"""Smoke tests on the real local Slurm cluster."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path

import pytest
from testbed_cluster import Cluster

from slurmfabric.testbed import Settings, Testbed

pytestmark = pytest.mark.cluster


def idle_nodes(cluster: Cluster) -> dict[str, str]:
    out = cluster.run(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
    return dict(line.split() for line in out.splitlines())


def test_two_node_job_runs_on_two_distinct_nodes(cluster: Cluster):
    assert idle_nodes(cluster) == {n: "idle" for n in cluster.nodes}
    script = (
        "#!/bin/bash\n#SBATCH -N 2 -t 2\n"
        "srun bash -c 'echo task=$SLURM_PROCID node=$SLURMD_NODENAME'\n"
    )
    result = cluster.sbatch_wait(script, timeout=120)
    assert result.state == "COMPLETED", result
    seen = sorted(line.split("node=")[1] for line in result.output.splitlines()
                  if line.startswith("task="))
    assert len(seen) == 2 and len(set(seen)) == 2
    assert set(seen) <= set(cluster.nodes)
    deadline = time.monotonic() + 30
    while idle_nodes(cluster) != {n: "idle" for n in cluster.nodes}:
        assert time.monotonic() < deadline, idle_nodes(cluster)
        time.sleep(0.3)


def test_node_names_resolve_to_distinct_loopback_addresses(cluster: Cluster):
    addrs = [socket.gethostbyname(n) for n in cluster.nodes]
    assert len(set(addrs)) == len(addrs)
    assert all(a.startswith("127.") for a in addrs)


def test_status_and_env_commands(cluster: Cluster):
    status = cluster.run(["slurmfabric", "testbed", "status"]).stdout
    assert f"SLURM_CONF={cluster.conf_path}" in status
    assert "idle" in status
    env = cluster.run(["slurmfabric", "testbed", "env"]).stdout
    assert f"export SLURM_CONF={cluster.conf_path}\n" in env


def test_second_up_reports_running_cluster(cluster: Cluster):
    out = cluster.run(["slurmfabric", "testbed", "up"]).stdout
    assert "already running" in out


def test_separate_testbed_up_and_down_leaves_no_daemon(cluster: Cluster):
    """A second, differently configured testbed beside the shared one: up, job, down."""
    # not pytest's tmp_path: munged (user munge) cannot traverse /tmp/pytest-of-root (0700)
    tmp_path = Path(tempfile.mkdtemp(prefix="sf-testbed-", dir="/var/tmp"))
    tmp_path.chmod(0o755)
    s = Settings(state_dir=tmp_path / "tb", nodes=2, prefix="sfx", ctld_port=17817,
                 node_port_base=17901, addr_prefix="127.0.78.", cluster_name="sfx")
    tb = Testbed(s)
    elapsed = tb.up(timeout=60, log=lambda m: None)
    try:
        assert elapsed < 60
        env = tb.env()
        from slurmfabric.slurm import cmd

        out = cmd.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env)
        # one line per node and partition (debug, debug-urgent): the same state in each
        assert cmd.parse_node_states(out) == {"sfx1": "idle", "sfx2": "idle"}
        assert len(out.splitlines()) == 4
        pids = dict(tb.running())
        assert len(pids) == 4  # munged, slurmctld, 2 slurmd
    finally:
        tb.down(log=lambda m: None)
    for pid in pids.values():
        assert not _alive(pid), f"pid {pid} survived down"
    assert tb.running() == {}
    # the shared cluster is untouched
    assert idle_nodes(cluster) == {n: "idle" for n in cluster.nodes}
    assert (tmp_path / "tb" / "etc" / "slurm.conf").exists()  # down removes no files


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z" and os.path.exists(f"/proc/{pid}")


def test_up_on_a_stopped_state_dir_reuses_its_saved_settings(cluster: Cluster):
    """`testbed up --state-dir X` without options restarts X as configured, not on defaults."""
    state = Path(tempfile.mkdtemp(prefix="sf-testbed-", dir="/var/tmp"))
    state.chmod(0o755)
    base = ["slurmfabric", "testbed"]
    opts = ["--state-dir", str(state)]
    cluster.run([*base, "up", *opts, "-n", "1", "--prefix", "sfz", "--ctld-port", "17717",
                 "--node-port-base", "17801", "--addr-prefix", "127.0.76."])
    cluster.run([*base, "down", *opts])
    try:
        out = cluster.run([*base, "up", *opts]).stdout
        assert "1 idle nodes" in out
        conf = (state / "etc" / "slurm.conf").read_text()
        assert "SlurmctldPort=17717" in conf and "NodeName=sfz1 " in conf
    finally:
        cluster.run([*base, "down", *opts])
    assert idle_nodes(cluster) == {n: "idle" for n in cluster.nodes}


def test_up_converges_whatever_an_earlier_run_left(cluster: Cluster):
    """What test.sh meets after the README's demo or a killed run, on a separate testbed:
    running without accounting (restarted with it), a daemon dead (restarted), daemons no
    record knows (stopped, then started fresh), an unknown key in an older settings file.
    Each time one line says what changed, and all daemons end up running."""
    state = Path(tempfile.mkdtemp(prefix="sf-testbed-", dir="/var/tmp"))
    state.chmod(0o755)
    base = ["slurmfabric", "testbed"]
    opts = ["--state-dir", str(state)]
    cluster.run([*base, "up", *opts, "-n", "1", "--prefix", "sfc", "--ctld-port", "17617",
                 "--node-port-base", "17701", "--addr-prefix", "127.0.75."])
    try:
        first = cluster.run([*base, "up", *opts, "--accounting"]).stdout
        assert "testbed: restarted with accounting" in first, first
        tb = Testbed.from_state(state)
        assert tb.s.accounting and set(tb.running()) == set(tb.expected_keys())

        os.kill(tb.running()["slurmd:sfc1"], 9)
        time.sleep(0.5)
        second = cluster.run([*base, "up", *opts, "--accounting"]).stdout
        assert "restarted a partly running testbed (not running: slurmd:sfc1)" in second

        daemons = sorted(Testbed.from_state(state).running().values())
        (state / "pids.json").write_text("{}")  # a killed run: nothing recorded
        settings = json.loads((state / "settings.json").read_text())
        (state / "settings.json").write_text(json.dumps({**settings, "retired_key": 1}))
        third = cluster.run([*base, "up", *opts, "--accounting"], timeout=180).stdout
        assert "that no record knew" in third, third
        assert all(not _alive(pid) for pid in daemons)
        tb = Testbed.from_state(state)
        assert set(tb.running()) == set(tb.expected_keys()) and "mariadbd" in tb.running()
    finally:
        cluster.run([*base, "down", *opts])
    assert idle_nodes(cluster) == {n: "idle" for n in cluster.nodes}
