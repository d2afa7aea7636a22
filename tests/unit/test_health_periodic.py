"""``health periodic`` (slurm.conf's HealthCheckProgram) and the Xid-to-job attribution.

Periodic runs judge the node, not a job: nothing a running job owns (its GPU processes, its
memory, its leftovers) is checked, no job state is written, a failing node is drained by the
run itself, and a passing run never resumes a node (an Xid is an event: the next run does
not see it again, and that says nothing about the GPU).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from helpers import fake_slurm, hgx_node, nvsmi, scontrol_calls, slurm_nodes, write_config

from slurmfabric.health.hookscript import EXIT_NODE_BAD

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "health" / "xid"
LINES = (FIX / "kmsg_lines.txt").read_text().splitlines()
NODE = "gpu007"


def run(kind: str, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess:
    env = {**env, "SLURMD_NODENAME": NODE, **extra}
    return subprocess.run([sys.executable, "-m", "slurmfabric", "health", kind], env=env,
                          capture_output=True, text=True, timeout=60)


def logging_nvidia_smi(tmp: Path, scenario: str) -> tuple[str, Path]:
    """A wrapper that records each argv, then runs the recorded scenario's nvidia-smi."""
    calls = tmp / "nvidia-smi.calls"
    wrapper = tmp / "nvidia-smi"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {nvsmi(scenario)} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), calls


def setup(tmp: Path, scenario: str, **extra) -> tuple[dict[str, str], Path]:
    state = tmp / "state"
    cfg = write_config(tmp / "health.toml", state, [hgx_node(NODE, scenario, None, **extra)],
                       runner={"auto_resume": True})
    env = fake_slurm(tmp, {NODE: ("ALLOCATED", "")})
    env["SLURMFABRIC_HEALTH_CONFIG"] = str(cfg)
    return env, state


def test_periodic_skips_what_a_running_job_owns(tmp_path: Path) -> None:
    """A job's python on GPU0 fails the prolog (the GPU is not free) but not the periodic
    run on the allocated node; the compute-apps query is not even made."""
    smi, calls = logging_nvidia_smi(tmp_path, "h100-535-busy")
    env, state = setup(tmp_path, "h100-535-busy", nvidia_smi=smi)
    proc = run("periodic", env, SLURM_JOB_ID="77")  # a stray job id in slurmd's env
    assert proc.returncode == 0, proc.stderr
    report = json.loads((state / "reports" / f"last-{NODE}.json").read_text())
    assert report["hook"] == "periodic" and report["job_id"] is None
    names = {c["check"] for c in report["checks"]}
    assert {"gpu.count", "gpu.ecc", "gpu.xid", "gpu.temperature"} <= names
    assert not names & {"gpu.processes", "node.memory", "node.leftovers"}
    assert "--query-compute-apps" not in calls.read_text()
    assert not (state / "jobs").exists() or not list((state / "jobs").iterdir())
    assert scontrol_calls(env) == []
    # the prolog does judge it
    assert run("prolog", env, SLURM_JOB_ID="78").returncode == EXIT_NODE_BAD
    assert "--query-compute-apps" in calls.read_text()
    assert slurm_nodes(env)[NODE]["reason"].startswith("slurmfabric: gpu.processes: GPU")


def test_periodic_drains_by_itself_and_resumes_only_a_repaired_state(tmp_path: Path) -> None:
    """ECC is a state: once it reads clean again, auto_resume may resume the node. An Xid is
    an event: the next run no longer sees it, which proves nothing, so the node stays."""
    env, state = setup(tmp_path, "h100-535-ecc")
    assert run("periodic", env).returncode == EXIT_NODE_BAD
    node = slurm_nodes(env)[NODE]
    assert node["state"] == "ALLOCATED+DRAIN"
    assert node["reason"] == "slurmfabric: gpu.ecc: GPU3 2 uncorrected volatile ECC errors"
    log = tmp_path / "kmsg"
    log.write_text(record("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01", 1, 0))
    healthy, _ = setup(tmp_path, "h100-535-healthy", kmsg_source=str(log))
    healthy["FAKE_SCONTROL_STATE"] = env["FAKE_SCONTROL_STATE"]
    assert run("periodic", healthy).returncode == 0  # ECC clean again (after a GPU reset)
    assert "DRAIN" not in slurm_nodes(env)[NODE]["state"]
    with open(log, "a") as handle:
        handle.write(record(LINES[0], 2, 5_000_000))  # Xid 79
    assert run("periodic", healthy).returncode == EXIT_NODE_BAD
    assert slurm_nodes(env)[NODE]["reason"].startswith("slurmfabric: gpu.xid: Xid 79")
    for kind in ("periodic", "epilog"):  # nothing new in the log: every check passes
        assert run(kind, healthy, SLURM_JOB_ID="91").returncode == 0
        assert slurm_nodes(env)[NODE]["state"] == "ALLOCATED+DRAIN", kind
    assert (state / f"drain-{NODE}.json").exists()


def record(message: str, seq: int, us: int) -> str:
    return f"3,{seq},{us},-;{message}\n"


def test_an_xid_during_a_job_is_attributed_to_it(tmp_path: Path) -> None:
    """The prolog of job 501 leaves its start time; an Xid logged afterwards names the job
    in the epilog's drain reason, an Xid from before the job names no job."""
    log = tmp_path / "kmsg"
    log.write_text(record("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01", 1, 0))
    env, state = setup(tmp_path, "h100-535-healthy", kmsg_source=str(log))
    assert run("prolog", env, SLURM_JOB_ID="501").returncode == 0  # sets the cursor
    job = json.loads((state / "jobs" / f"{NODE}-501.json").read_text())
    assert abs(job["time"] - time.time()) < 30
    now_us = int(time.monotonic() * 1e6)  # the kernel's clock: microseconds since boot
    with open(log, "a") as handle:
        handle.write(record(LINES[9], 2, 5_000_000))  # Xid 13 long before the job
        handle.write(record(LINES[0], 3, now_us))  # Xid 79 now, during job 501
    assert run("epilog", env, SLURM_JOB_ID="501").returncode == EXIT_NODE_BAD
    reason = slurm_nodes(env)[NODE]["reason"]
    assert reason.startswith("slurmfabric: gpu.xid: Xid 79 on GPU 0000:2b:00 during job 501 "
                             "(ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, RESTART_BM)"), reason
    report = json.loads((state / "reports" / f"last-{NODE}.json").read_text())
    xids = next(c for c in report["checks"] if c["check"] == "gpu.xid")["values"]["xids"]
    assert [(x["xid"], x["jobs"], x["drains"]) for x in xids] == [
        (13, [], False), (79, ["501"], True)]
    assert not (state / "jobs" / f"{NODE}-501.json").exists()


def test_periodic_attributes_an_xid_to_every_job_running_then(tmp_path: Path) -> None:
    """Two jobs share the node; the periodic run reads the Xid first and names both."""
    log = tmp_path / "kmsg"
    log.write_text(record("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01", 1, 0))
    env, state = setup(tmp_path, "h100-535-healthy", kmsg_source=str(log))
    for job in ("601", "602"):
        assert run("prolog", env, SLURM_JOB_ID=job).returncode == 0
    with open(log, "a") as handle:
        handle.write(record(LINES[20], 2, int(time.monotonic() * 1e6)))  # Xid 119, GSP
    assert run("periodic", env).returncode == EXIT_NODE_BAD
    reason = slurm_nodes(env)[NODE]["reason"]
    assert " during job 601,602 (GSP_RPC_TIMEOUT, RESET_GPU)" in reason, reason
    calls = len(scontrol_calls(env))
    assert run("epilog", env, SLURM_JOB_ID="602").returncode == 0  # judged once, by periodic
    assert len(scontrol_calls(env)) == calls
    assert sorted(p.name for p in (state / "jobs").iterdir()) == [f"{NODE}-601.json"]
