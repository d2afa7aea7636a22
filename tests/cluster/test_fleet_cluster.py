"""The guard at fleet scale: fault drills on every node at once, at 4 and at 64 virtual nodes,
and a lemon node quarantined and seen in the fleet history.

These tests bring up their own testbed (module scope, one size after the other) in a state
directory and on ports of its own, so the 4-node session testbed of the other cluster tests
is never touched: ``$SLURMFABRIC_FLEET_TESTBED_DIR`` (default ``<testbed dir>-fleet``),
``$SLURMFABRIC_FLEET_PORTS`` ("CTLD,NODE_BASE", default "17817,17901"; slurmdbd and MariaDB
take CTLD+2 and CTLD+13), ``$SLURMFABRIC_FLEET_ADDR_PREFIX`` (127.0.78.) and
``$SLURMFABRIC_FLEET_PREFIX`` (sff). The drills themselves live in benchmarks/bench_fleet.py,
which prints the same table standalone. Real slurmctld, slurmd and slurmdbd; only
nvidia-smi is a recorded fake.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import bench_fleet  # the drills: benchmarks/ is on sys.path through tests/conftest.py
import pytest

from slurmfabric.slurm import cmd
from slurmfabric.testbed import default_state_dir

pytestmark = pytest.mark.cluster
RESULTS: list[bench_fleet.DrillResult] = []
ECC = "slurmfabric: gpu.ecc: GPU3 2 uncorrected volatile ECC errors"


def _settings(nodes: int):
    ctld, base = (int(p) for p in os.environ.get("SLURMFABRIC_FLEET_PORTS",
                                                 "17817,17901").split(","))
    state = Path(os.environ.get("SLURMFABRIC_FLEET_TESTBED_DIR")
                 or f"{default_state_dir()}-fleet")
    return bench_fleet.fleet_settings(
        state, nodes, os.environ.get("SLURMFABRIC_FLEET_PREFIX", "sff"), ctld, base,
        os.environ.get("SLURMFABRIC_FLEET_ADDR_PREFIX", "127.0.78."), accounting=True)


@pytest.fixture(scope="module", params=[4, 64], ids=lambda n: f"{n}nodes")
def fleet(request):
    """A testbed of ``param`` nodes with slurmdbd, brought up for this module and stopped
    at its end (or when the other size takes its place)."""
    try:
        testbed, up_s = bench_fleet.bring_up(_settings(request.param))
    except Exception as exc:  # the reason must reach the report, never a skip
        pytest.fail(f"the {request.param}-node fleet testbed could not start: {exc}",
                    pytrace=False)
    mem = bench_fleet.daemon_memory(testbed)
    print(f"\ntestbed up -n {request.param} --accounting: all idle in {up_s:.1f} s; munged+"
          f"slurmctld+slurmd RSS {mem['slurm_rss']:.0f} MiB (PSS {mem['slurm_pss']:.0f}), "
          f"slurmdbd+MariaDB RSS {mem['dbd_rss']:.0f} MiB (PSS {mem['dbd_pss']:.0f})")
    yield testbed
    if not os.environ.get("SLURMFABRIC_KEEP_TESTBED"):
        testbed.down(log=lambda m: None)


def _reason(testbed, node: str) -> str:
    return cmd.node_reason(cmd.node(node, env=testbed.env())).rsplit(" [", 1)[0]


def test_fleet_wide_faults_drain_at_most_the_breaker_limit(fleet, tmp_path) -> None:
    """Every node's prolog at once, through slurmd: healthy, the same failing check, a broken
    shared config and a hung nvidia-smi. Drains never pass the breaker limit, every hook
    ends well inside its cap, and healthy or failed-open hooks ask slurmctld nothing."""
    n = len(fleet.s.node_names)
    limit = bench_fleet.breaker_limit(n)
    ran = {d: bench_fleet.run_drill(fleet, d, tmp_path / d) for d in bench_fleet.DRILLS}
    RESULTS.extend(ran.values())
    print("\n" + bench_fleet.table(RESULTS))
    for result in ran.values():
        assert len(result.hook_s) == n, (result.drill, result.hook_s)
        assert max(result.hook_s) < 30, (result.drill, result.hook_s)  # cap: 40 s
        assert result.limit == limit and len(result.drained) <= limit, result
        # a hook only ever asks: show (all), update, show again, resume (the undo)
        assert result.hook_rpcs <= 4 * n, (result.drill, result.rpcs)
    for quiet in ("healthy", "broken-config"):
        result = ran[quiet]
        assert result.drained == [], (quiet, result.drained)
        assert result.hook_rpcs == 0, (quiet, result.rpcs)  # 0 slurmctld calls per hook
        assert set(result.exit_codes) == {0}, (quiet, result.exit_codes)
    log = (tmp_path / "broken-config" / "hook.log").read_text()
    assert log.count("config error, NOT draining (fail-open)") == n, log[-2000:]
    for faulty, words in (("same-check", ECC), ("hung-tool", "slurmfabric: gpu.count: "
                                                "nvidia-smi did not return in 8 s")):
        result = ran[faulty]
        # All fail: the breaker lets exactly its limit drain, the others undo or skip.
        assert len(result.drained) == min(limit, n), (faulty, result.drained)
        assert result.exit_codes.count(1) == len(result.drained), (faulty, result.exit_codes)
        assert result.rpcs.get("REQUEST_UPDATE_NODE", 0) >= len(result.drained)
        reasons = [ln for ln in (tmp_path / faulty / "hook.log").read_text().splitlines()
                   if "drain=drained" in ln]
        assert len(reasons) == len(result.drained) and all(words in ln for ln in reasons), \
            reasons


@pytest.mark.parametrize("fleet", [4], indirect=True, ids=["4nodes"])
def test_a_lemon_node_stays_drained_and_shows_in_the_fleet_history(fleet, tmp_path) -> None:
    """One node's prolog fails three times; slurmfabric resumes it twice (auto_resume via
    'health resume' once the fixture is healthy again). The third drain carries the lemon
    reason, which neither 'health resume' nor a passing periodic run lifts; 'health
    history' (slurmdbd's events) names it a lemon with 2 flaps; --clear-lemon resumes it."""
    env = fleet.env()
    lemon = fleet.s.node_names[1]
    work = tmp_path
    exe = bench_fleet._shim(work)
    run_env = {**env, "SLURMFABRIC_PLAN_CACHE": str(work / "plancache")}

    def config(fault: bool) -> Path:
        cfg = bench_fleet.health_config(work / "health.toml", work, fleet.s.node_names,
                                        "h100-535-healthy", env, auto_resume=True,
                                        lemon_drains=3, lemon_window_h=24.0)
        if fault:
            with cfg.open("a") as handle:
                handle.write(f'\n[[nodes]]\nmatch = "{lemon}"\nnvidia_smi = '
                             f'"{bench_fleet.NVSMI / "h100-535-ecc" / "nvidia-smi"}"\n')
        return cfg

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, "health", *args], capture_output=True, text=True,
                              env=run_env, timeout=120)

    def wait_drained(timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = cmd.node(lemon, env=env)
            if "DRAIN" in record.get("State", ""):
                return _reason(fleet, lemon)
            time.sleep(0.5)
        raise AssertionError(f"{lemon} not drained after {timeout} s")

    cfg = config(fault=True)
    wrapper = bench_fleet.install_prolog(work, cfg, env)
    bench_fleet.settle(fleet)
    # The window opens after the drills' drains ended: slurmdbd's events are per second and
    # 'history --since' counts every event that overlaps the window (a drill's drain that
    # ended within the second before made 4 drains of 3 in one full run).
    time.sleep(2)
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time()))
    try:
        bench_fleet._reconfigure(fleet, f"Prolog={wrapper}\n")
        for attempt in (1, 2, 3):
            config(fault=True)
            job = cmd.sbatch("#!/bin/sh\ntrue\n", ["-N", "1", "-w", lemon, "-t", "5",
                                                         "-o", "/dev/null"],
                                  workdir=work, env=env).job_id
            reason = wait_drained()
            # slurmctld requeues the job for the failed prolog (and would drain the node
            # itself, "Prolog error", if it were not drained yet): let that land first.
            deadline = time.monotonic() + 60
            while cmd.job(job, env=env).get("Restarts", "0") == "0":
                assert time.monotonic() < deadline, cmd.job(job, env=env)
                time.sleep(0.5)
            cmd.run(["scancel", job], env=env)
            if attempt < 3:
                assert reason == ECC, (attempt, reason)
                config(fault=False)  # repaired: the checks pass, our resume takes it back
                time.sleep(2)  # a drain that stays, not one the breaker undoes at once
                out = cli("resume", "--node", lemon, "--config", str(cfg))
                assert f"{lemon}: resumed (was: {ECC}" in out.stdout, out.stdout + out.stderr
                time.sleep(1)  # slurmdbd's events are per second: keep drains apart
        assert reason == ("slurmfabric: gpu.ecc: lemon: drained 3 times in 24 h, not "
                          "auto-resumed (slurmfabric health resume --clear-lemon): GPU3 2 "
                          "uncorrected volatile ECC errors"), reason
        config(fault=False)
        out = cli("resume", "--node", lemon, "--config", str(cfg))
        assert out.returncode == 1 and f"{lemon}: a lemon node, left drained" in out.stdout
        periodic = subprocess.run([exe, "health", "periodic", "--config", str(cfg)],
                                  env={**run_env, "SLURMD_NODENAME": lemon},
                                  capture_output=True, text=True, timeout=120)
        assert periodic.returncode == 0, periodic.stderr  # passes, and yet: auto_resume no
        assert "DRAIN" in cmd.node(lemon, env=env)["State"] and \
            _reason(fleet, lemon) == reason
        others = [n for n in fleet.s.node_names if n != lemon]
        assert not any("DRAIN" in cmd.node(n, env=env)["State"] for n in others)

        prom = work / "fleet.prom"
        deadline = time.monotonic() + 60
        while True:  # slurmctld hands node events to slurmdbd asynchronously
            hist = cli("history", "--json", "--since", since, "--undo-s", "0",
                       "--prometheus", str(prom))
            assert hist.returncode == 0, hist.stderr
            doc = json.loads(hist.stdout)
            mine = {h["node"]: h for h in doc["nodes"]}.get(lemon, {})
            if mine.get("drains") == 3 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert doc["lemons"] == [lemon], doc
        assert (mine["drains"], mine["resumes"], mine["flaps"], mine["by"]) == \
            (3, 2, 2, {"slurmfabric": 3}), (mine, doc["events"])
        assert f'slurmfabric_fleet_lemon{{node="{lemon}"}} 1' in prom.read_text()
        text = cli("history", "--since", since, "--undo-s", "0").stdout
        assert f"1 lemon nodes ({lemon})" in text and "LEMON" in text, text

        out = cli("resume", "--node", lemon, "--config", str(cfg), "--clear-lemon")
        assert f"{lemon}: resumed (was: slurmfabric: gpu.ecc: lemon: drained 3" in out.stdout
        assert "DRAIN" not in cmd.node(lemon, env=env)["State"]
    finally:
        bench_fleet.settle(fleet)
