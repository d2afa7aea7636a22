"""Drain/resume rules against a fake scontrol: only our own reasons, breaker, retries."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "health"))
from helpers import fake_slurm, scontrol_calls, slurm_nodes  # noqa: E402

from slurmfabric.health import drain  # noqa: E402


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    def make(nodes):
        env = fake_slurm(tmp_path, nodes)
        for key in ("PATH", "FAKE_SCONTROL_STATE"):
            monkeypatch.setenv(key, env[key])
        return env
    return make


def test_drain_sets_our_reason(slurm, tmp_path) -> None:
    env = slurm({"n1": ("IDLE", ""), "n2": ("IDLE", "")})
    out = drain.drain("n1", "gpu.ecc", "GPU3 2 uncorrected volatile ECC errors",
                      state_dir=tmp_path)
    assert out.outcome == drain.DRAINED
    assert slurm_nodes(env)["n1"] == {
        "state": "IDLE+DRAIN",
        "reason": "slurmfabric: gpu.ecc: GPU3 2 uncorrected volatile ECC errors"}
    assert slurm_nodes(env)["n2"]["state"] == "IDLE"
    assert drain.remembered("n1", tmp_path)["applied"] is True


def test_admin_reason_is_never_overwritten_or_resumed(slurm, tmp_path) -> None:
    env = slurm({"n1": ("IDLE+DRAIN", "bad DIMM, ticket 4711")})
    out = drain.drain("n1", "gpu.ecc", "GPU3 bad", state_dir=tmp_path)
    assert out.outcome == drain.KEPT_FOREIGN
    assert drain.resume_if_ours("n1", state_dir=tmp_path) is False
    assert slurm_nodes(env)["n1"] == {"state": "IDLE+DRAIN", "reason": "bad DIMM, ticket 4711"}
    assert not any(c[0] == "update" for c in scontrol_calls(env))


def test_resume_only_our_drained_nodes(slurm, tmp_path) -> None:
    env = slurm({"n1": ("IDLE+DRAIN", "slurmfabric: rdma.ports: mlx5_0:1 DOWN/Polling"),
                 "n2": ("IDLE", "")})
    assert drain.resume_if_ours("n1", state_dir=tmp_path) is True
    assert slurm_nodes(env)["n1"] == {"state": "IDLE", "reason": ""}
    assert drain.resume_if_ours("n2", state_dir=tmp_path) is False


def test_prolog_error_counts_as_ours_only_with_our_state_file(slurm, tmp_path) -> None:
    slurm({"n1": ("IDLE+DRAIN", "Prolog error"), "n2": ("IDLE+DRAIN", "Prolog error")})
    drain._remember(tmp_path, "n1", "slurmfabric: gpu.count: 7 GPUs", applied=False)
    assert drain.resume_if_ours("n2", state_dir=tmp_path) is False
    assert drain.resume_if_ours("n1", state_dir=tmp_path) is True
    assert drain.remembered("n1", tmp_path) is None


def test_breaker_stops_draining_when_many_nodes_fail_the_same_check(slurm, tmp_path) -> None:
    nodes = {f"n{i}": ("IDLE", "") for i in range(1, 11)}
    for i in (1, 2, 3):
        nodes[f"n{i}"] = ("IDLE+DRAIN", f"slurmfabric: gpu.throttle: GPU{i} HW slowdown")
    env = slurm(nodes)
    out = drain.drain("n9", "gpu.throttle", "GPU0 HW slowdown", breaker_fraction=0.2,
                      breaker_min_nodes=3, state_dir=tmp_path)
    assert out.outcome == drain.BREAKER and "3 of 10 nodes" in out.detail
    assert slurm_nodes(env)["n9"]["state"] == "IDLE"
    # A different check is not held back by that breaker.
    other = drain.drain("n9", "gpu.ecc", "GPU0 1 uncorrected", breaker_fraction=0.2,
                        breaker_min_nodes=3, state_dir=tmp_path)
    assert other.outcome == drain.DRAINED


def test_unreachable_controller_retries_then_keeps_reason_locally(slurm, tmp_path,
                                                                  monkeypatch) -> None:
    env = slurm({"n1": ("IDLE", "")})
    monkeypatch.setenv("FAKE_SCONTROL_DOWN", "1")
    out = drain.drain("n1", "gpu.count", "7 GPUs visible, expected 8", retries=3, retry_s=0.01,
                      state_dir=tmp_path)
    assert out.outcome == drain.DEFERRED and "Unable to contact slurm controller" in out.detail
    assert len(scontrol_calls(env)) == 3
    saved = drain.remembered("n1", tmp_path)
    assert saved["applied"] is False and saved["reason"].startswith("slurmfabric: gpu.count:")


def test_reason_is_one_bounded_line() -> None:
    reason = drain.make_reason("gpu.pcie", "GPU1 x8\nGPU2 x8 " + "y" * 400)
    assert "\n" not in reason and len(reason) == drain.MAX_REASON and reason.endswith("...")
    stamped = {"Reason": "slurmfabric: gpu.ecc: GPU3 [root@2024-05-01T10:00:00]"}
    assert drain.current_reason(stamped) == "slurmfabric: gpu.ecc: GPU3"


def test_state_file_names_cannot_escape_the_state_dir(tmp_path):
    from slurmfabric.health import state

    path = state.job_file(tmp_path, "../../etc", "1/../../passwd")
    assert path.parent == tmp_path / "jobs"
    assert "/" not in path.name and not path.name.startswith(".")
    assert state.safe_name("..") == "_"
