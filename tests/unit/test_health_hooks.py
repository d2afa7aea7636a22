"""Prolog/epilog end to end on fixture nodes: outputs, drain, deadline, concurrency, imports."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from helpers import (
    fake_slurm,
    h100_tree,
    hgx_node,
    scontrol_calls,
    slurm_nodes,
    write_config,
)

from slurmfabric._common.probe import ProbeError
from slurmfabric.health import runner
from slurmfabric.health.checks import node as node_checks
from slurmfabric.health.hookscript import EXIT_NODE_BAD

NODE = "gpu007"


def hook(kind: str, env: dict[str, str], job: str = "1001", timeout: float = 30,
         **extra: str) -> subprocess.CompletedProcess:
    env = {**env, "SLURMD_NODENAME": NODE, "SLURM_JOB_ID": job, **extra}
    return subprocess.run([sys.executable, "-m", "slurmfabric", "health", kind], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def setup(tmp_path):
    """(make_env(scenario, **node_extra, runner=...), state_dir, sysfs root)."""
    sysfs = h100_tree(tmp_path / "root")
    state = tmp_path / "state"

    def make(scenario: str = "h100-535-healthy", runner_opts: dict | None = None,
             root: Path | None = sysfs, slurm_state: str = "IDLE", **extra):
        cfg = write_config(tmp_path / "health.toml", state,
                           [hgx_node("gpu[001-016]", scenario, root, **extra)], runner_opts)
        env = fake_slurm(tmp_path, {NODE: (slurm_state, ""), "gpu008": ("IDLE", "")})
        env["SLURMFABRIC_HEALTH_CONFIG"] = str(cfg)
        return env
    return make, state, sysfs


def test_healthy_prolog_passes_and_writes_every_output(setup) -> None:
    make, state, _ = setup
    env = make()
    proc = hook("prolog", env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((state / "reports" / f"last-{NODE}.json").read_text())
    assert report["status"] == "ok" and report["hook"] == "prolog" and report["job_id"] == "1001"
    names = {c["check"] for c in report["checks"]}
    assert {"gpu.ecc", "gpu.throttle", "rdma.ports", "rdma.gdr", "node.memory"} <= names
    prom = (state / f"{NODE}.prom").read_text()
    assert f'slurmfabric_health_check_status{{node="{NODE}",check="rdma.ports"}} 0' in prom
    assert f'slurmfabric_rdma_port_rate_gbps{{node="{NODE}",device="mlx5_0",port="1"}} 400' in prom
    assert f'slurmfabric_gpu_temperature_celsius{{node="{NODE}",gpu="7"}}' in prom
    log = (state / "health.log").read_text()
    assert f"health prolog node={NODE} job=1001 status=ok exit=0" in log
    assert scontrol_calls(env) == []  # a healthy hook never talks to slurmctld
    assert (state / "jobs" / f"{NODE}-1001.json").exists()  # counters for the epilog


def test_failing_prolog_drains_with_precise_reason_and_says_node_bad(setup) -> None:
    make, state, _ = setup
    env = make("h100-535-ecc")
    proc = hook("prolog", env)
    assert proc.returncode == EXIT_NODE_BAD
    node = slurm_nodes(env)[NODE]
    assert node["state"] == "IDLE+DRAIN"
    assert node["reason"] == "slurmfabric: gpu.ecc: GPU3 2 uncorrected volatile ECC errors"
    report = json.loads((state / "reports" / f"last-{NODE}.json").read_text())
    assert report["drain"]["outcome"] == "drained" and report["exit_code"] == EXIT_NODE_BAD


def test_hung_nvidia_smi_is_reported_and_the_hook_finishes_on_time(setup) -> None:
    make, state, _ = setup
    budget = 3.0
    env = make("hang", runner_opts={"probe_timeout_s": 1.0, "budget_s": budget})
    start = time.monotonic()
    proc = hook("prolog", env, timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode == EXIT_NODE_BAD
    # The bound is the budget under test plus a start-up margin that holds on a loaded
    # 2-core machine (interpreter start, imports, drain); the hung tool would take 30 s.
    assert elapsed < budget + 6.0, f"hook took {elapsed:.1f} s with a {budget} s budget"
    reason = slurm_nodes(env)[NODE]["reason"]
    assert reason.startswith("slurmfabric: gpu.count: nvidia-smi did not return in 1 s")


def test_budget_bounds_a_collector_that_never_returns() -> None:
    start = time.monotonic()
    facts = runner.gather({"stuck": lambda t: time.sleep(30), "fine": lambda t: 42}, 0.3, 5)
    assert time.monotonic() - start < 1.5
    assert facts["fine"] == 42
    assert isinstance(facts["stuck"], ProbeError)
    assert str(facts["stuck"]) == "stuck did not finish within the 0.3 s budget"


@pytest.mark.parametrize("scenario,expect_rc", [("h100-535-healthy", 0),
                                                ("h100-535-hot", EXIT_NODE_BAD)])
def test_twenty_concurrent_hooks_on_one_node(setup, scenario, expect_rc) -> None:
    make, state, _ = setup
    env = make(scenario)
    with ThreadPoolExecutor(max_workers=20) as pool:
        procs = list(pool.map(lambda i: hook("prolog" if i % 2 else "epilog", env,
                                             job=str(5000 + i), timeout=120), range(20)))
    assert [p.returncode for p in procs] == [expect_rc] * 20, [p.stderr for p in procs]
    reports = [json.loads(p.read_text()) for p in (state / "reports").glob(f"{NODE}-*.json")]
    assert sorted(r["job_id"] for r in reports) == [str(5000 + i) for i in range(20)]
    heads = [line for line in (state / "health.log").read_text().splitlines()
             if f"node={NODE} job=" in line]
    assert len(heads) == 20 and all(f"exit={expect_rc}" in h for h in heads)
    assert not list(state.rglob("*.tmp")), "a half-written temporary file was left behind"
    json.loads((state / "reports" / f"last-{NODE}.json").read_text())
    if expect_rc:
        assert slurm_nodes(env)[NODE]["reason"].startswith("slurmfabric: gpu.temperature: GPU7")


def test_a_held_lock_is_loud_but_drains_only_a_failing_node(setup) -> None:
    """The lock is slurmfabric's own fault: logged and on the hook-error gauge; the exit
    code still follows the checks (a healthy node stays in service, a bad one is bad)."""
    make, state, _ = setup
    state.mkdir(parents=True, exist_ok=True)
    for scenario, expect in (("h100-535-healthy", 0), ("h100-535-ecc", EXIT_NODE_BAD)):
        env = make(scenario, runner_opts={"lock_timeout_s": 0.3,
                                          "prometheus_file": str(state / "n.prom")})
        with open(state / ".lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            proc = hook("prolog", env)
        assert proc.returncode == expect, (scenario, proc.stderr)
        assert "still held after 0.3 s" in (state / "health.log").read_text()
        assert 'hook="prolog"} 1' in (state / "n.hook.prom").read_text()


def test_hook_path_imports_no_heavy_modules(setup) -> None:
    make, _, _ = setup
    env = {**make(), "SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "77"}
    code = ("import sys, json; from slurmfabric.cli import main; rc = main(['health', "
            "'prolog']); heavy = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'pydantic', 'pydantic_settings', 'jinja2', 'torch', 'psutil', 'pynvml'}); "
            "print(json.dumps([rc, heavy]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [0, []], out.stderr


def test_counter_deltas_between_prolog_and_epilog(setup, tmp_path) -> None:
    make, state, sysfs = setup
    env = make()
    assert hook("prolog", env, job="300").returncode == 0
    # During the job mlx5_2 port 1 saw 50 symbol errors and one link down.
    counters = sysfs / "sys/class/infiniband/mlx5_2/ports/1/counters"
    (counters / "symbol_error").write_text("50\n")
    (counters / "link_downed").write_text("1\n")
    proc = hook("epilog", env, job="300")
    assert proc.returncode == EXIT_NODE_BAD
    reason = slurm_nodes(env)[NODE]["reason"]
    assert reason.startswith("slurmfabric: rdma.counters: mlx5_2:1 link_downed +1 during the job")
    assert not (state / "jobs" / f"{NODE}-300.json").exists()


def test_without_a_snapshot_counters_use_absolute_limits(setup) -> None:
    make, state, sysfs = setup
    env = make()
    (sysfs / "sys/class/infiniband/mlx5_6/ports/1/counters/symbol_error").write_text("50\n")
    assert hook("epilog", env, job="301").returncode == 0  # 50 <= 100 since boot
    (sysfs / "sys/class/infiniband/mlx5_6/ports/1/counters/symbol_error").write_text("5000\n")
    assert hook("epilog", env, job="302").returncode == EXIT_NODE_BAD
    assert "mlx5_6:1 symbol_error=5000 (limit 100)" in slurm_nodes(env)[NODE]["reason"]


def test_port_at_half_rate_and_missing_gpudirect(tmp_path) -> None:
    root = h100_tree(tmp_path / "r", port_changes={"mlx5_3": {"rate": "200 Gb/sec (4X HDR)"},
                                                   "mlx5_8": {"state": "1: DOWN",
                                                              "phys_state": "2: Polling"}},
                     modules=[])
    cfg_path = write_config(tmp_path / "h.toml", tmp_path / "s",
                            [hgx_node("*", "h100-535-healthy", root)])
    from slurmfabric.health import hooks

    run = hooks.check(NODE, str(cfg_path))
    by = {r.check: r for r in run.results}
    assert by["rdma.ports"].reason == ("mlx5_3:1 at 200 Gb/s, expected 400; "
                                       "mlx5_8:1 DOWN/Polling")
    assert by["rdma.gdr"].status == "fail" and "nvidia-peermem" in by["rdma.gdr"].reason


def test_config_error_fails_open_and_says_so(setup, tmp_path) -> None:
    make, _, _ = setup
    env = make()
    bad = tmp_path / "bad.toml"
    bad.write_text("[[nodes]]\ngpu_count = 8\n")
    proc = hook("prolog", {**env, "SLURMFABRIC_HEALTH_CONFIG": str(bad)})
    assert proc.returncode == 0
    assert "unknown key 'gpu_count'" in proc.stderr and "fail-open" in proc.stderr


def _job_process(**env: str) -> int:
    """A process of the job as the epilog meets it: not a child of the hook (double fork,
    reparented), with the job's variables in its environment. Returns its pid."""
    out = subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"],
                         env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return int(out.stdout)


def _kill(*pids: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def test_leftover_job_processes_are_found() -> None:
    job = _job_process(SLURM_JOB_ID="987654")
    other = hook_proc = None
    try:
        found = node_checks.collect_leftovers("987654", [])
        assert [p["pid"] for p in found] == [job]
        assert node_checks.collect_leftovers("987655", []) == []
        # A task of the same job on another virtual node, or another node's epilog, is not
        # a leftover of this node.
        assert node_checks.collect_leftovers("987654", [], node="sfn2") == [
            {"pid": job, "name": "sleep", "user": found[0]["user"]}]
        other = _job_process(SLURM_JOB_ID="987654", SLURMD_NODENAME="sfn1")
        hook_proc = _job_process(SLURM_JOB_ID="987654", SLURM_SCRIPT_CONTEXT="epilog_slurmd")
        pids = [p["pid"] for p in node_checks.collect_leftovers("987654", [], node="sfn2")]
        assert pids == [job]
    finally:
        _kill(job, *(p for p in (other, hook_proc) if p))


def test_the_hooks_own_tree_is_never_a_leftover(monkeypatch) -> None:
    """The epilog's own probes inherit SLURM_JOB_ID (and no SLURM_SCRIPT_CONTEXT when run by
    hand): a child, a grandchild, or a probe orphaned by its deadline kill is ours."""
    from slurmfabric._common import probe as _probe

    monkeypatch.setenv("SLURM_JOB_ID", "987656")
    child = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])  # child and grandchild
    # A probe whose child outlives it (reparented to init): found only by its mark.
    out = _probe.run(["sh", "-c", "setsid sleep 30 >/dev/null 2>&1 & echo $!"], 10)
    orphan = int(out.stdout)
    job = _job_process(SLURM_JOB_ID="987656")
    grandchildren: list[int] = []
    try:
        time.sleep(0.2)
        grandchildren = [p.pid for p in psutil.Process(child.pid).children()]
        assert grandchildren, "the child's sleep did not start"
        assert [p["pid"] for p in node_checks.collect_leftovers("987656", [])] == [job]
    finally:
        _kill(orphan, job, *grandchildren)
        child.kill()
        child.wait()


def test_manual_check_prints_a_table_and_never_drains(setup) -> None:
    make, _, _ = setup
    env = make("h100-535-pcie-x8")
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "check", "--node",
                           NODE], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "gpu.pcie           FAIL    GPU2 PCIe x8, expected x16" in proc.stdout
    assert scontrol_calls(env) == []


def test_resume_never_checks_another_node_under_its_name(setup) -> None:
    make, _, _ = setup
    env = make(slurm_state="IDLE+DRAIN")
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "resume", "--node",
                           "gpu008"], env={**env, "SLURMD_NODENAME": NODE},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "gpu008: not checked here, left as is: run 'slurmfabric health resume' on gpu008" \
        in proc.stdout
    assert not [c for c in scontrol_calls(env) if "update" in c]
