"""Lemon nodes against a fake scontrol: the Nth drain in the window gets the lemon reason,
nothing of ours resumes it, --clear-lemon does and resets the count; breaker undos and
drains outside the window do not count."""

from __future__ import annotations

import time

import pytest
from helpers import fake_slurm, slurm_nodes, write_config

from slurmfabric.errors import ConfigError
from slurmfabric.health import drain, lemon, siteconfig

ECC = "GPU3 2 uncorrected volatile ECC errors"


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    def make(nodes):
        env = fake_slurm(tmp_path, nodes)
        for key in ("PATH", "FAKE_SCONTROL_STATE"):
            monkeypatch.setenv(key, env[key])
        return env

    return make


def pol(state_dir, **kw) -> drain.DrainPolicy:
    return drain.DrainPolicy(state_dir=str(state_dir), settle_s=0, **kw)


def _cycle(env, state, policy) -> drain.DrainOutcome:
    """One failure and one resume by us (what auto_resume or 'health resume' does)."""
    out = drain.drain("n1", "gpu.ecc", ECC, policy)
    if not lemon.is_lemon(out.reason):
        assert drain.resume_if_ours("n1", policy) is True
    return out


def test_third_drain_in_the_window_is_a_lemon_and_stays_drained(slurm, tmp_path) -> None:
    env = slurm({"n1": ("IDLE", ""), "n2": ("IDLE", "")})
    policy = pol(tmp_path, lemon_drains=3, lemon_window_h=24)
    first, second = _cycle(env, tmp_path, policy), _cycle(env, tmp_path, policy)
    assert first.reason == second.reason == f"slurmfabric: gpu.ecc: {ECC}"
    third = drain.drain("n1", "gpu.ecc", ECC, policy)
    assert third.outcome == drain.DRAINED
    assert third.reason == ("slurmfabric: gpu.ecc: lemon: drained 3 times in 24 h, not "
                            "auto-resumed (slurmfabric health resume --clear-lemon): " + ECC)
    assert slurm_nodes(env)["n1"] == {"state": "IDLE+DRAIN", "reason": third.reason}
    # the same failure again: already drained, the lemon reason kept (not replaced)
    again = drain.drain("n1", "gpu.ecc", ECC, policy)
    assert again.outcome == drain.ALREADY and slurm_nodes(env)["n1"]["reason"] == third.reason
    assert drain.resume_if_ours("n1", policy) is False  # auto_resume / health resume
    assert slurm_nodes(env)["n1"]["state"] == "IDLE+DRAIN"
    assert drain.resume_if_ours("n1", policy, clear_lemon=True) is True
    assert slurm_nodes(env)["n1"] == {"state": "IDLE", "reason": ""}
    assert lemon.drain_times(tmp_path, "n1") == []  # the admin's clear resets the count
    assert drain.drain("n1", "gpu.ecc", ECC, policy).reason == f"slurmfabric: gpu.ecc: {ECC}"


def test_drains_outside_the_window_and_breaker_undos_do_not_count(slurm, tmp_path) -> None:
    env = slurm({"n1": ("IDLE", "")})
    policy = pol(tmp_path, lemon_drains=2, lemon_window_h=1)
    lemon.record(tmp_path, "n1", time.time() - 2 * 3600, 1000)  # 2 h ago: outside 1 h
    assert len(lemon.drain_times(tmp_path, "n1")) == 1
    out = drain.drain("n1", "gpu.ecc", ECC, policy)
    assert not lemon.is_lemon(out.reason), out
    assert len(lemon.recent(tmp_path, "n1", 1)) == 1
    drain.resume_if_ours("n1", policy)
    assert lemon.is_lemon(drain.drain("n1", "gpu.ecc", ECC, policy).reason)
    assert slurm_nodes(env)["n1"]["reason"].startswith("slurmfabric: gpu.ecc: lemon: drained 2")


def test_lemon_rule_off_with_zero(slurm, tmp_path) -> None:
    slurm({"n1": ("IDLE", "")})
    policy = pol(tmp_path, lemon_drains=0)
    for _ in range(5):
        out = drain.drain("n1", "gpu.ecc", ECC, policy)
        assert out.reason == f"slurmfabric: gpu.ecc: {ECC}"
        assert drain.resume_if_ours("n1", policy)
    assert lemon.drain_times(tmp_path, "n1") == []


def test_is_lemon_reads_only_our_reason_format() -> None:
    assert lemon.is_lemon(drain.make_reason("gpu.ecc", lemon.detail(3, 24, "x")))
    assert not lemon.is_lemon("admin: lemon: drained 3 times")
    assert not lemon.is_lemon("slurmfabric: gpu.ecc: GPU0 lemon: drained 3")
    assert drain.reason_check(drain.make_reason("gpu.ecc", lemon.detail(3, 24, "x"))) == \
        "gpu.ecc"  # the breaker still groups a lemon with its check


def test_site_config_sets_the_rule_and_refuses_bad_values(tmp_path) -> None:
    cfg = write_config(tmp_path / "h.toml", tmp_path / "state-{node}", [],
                       runner={"lemon_drains": 5, "lemon_window_h": 72.0})
    site = siteconfig.load("gpu7", str(cfg))
    policy = drain.DrainPolicy.from_site(site)
    assert (policy.lemon_drains, policy.lemon_window_h) == (5, 72.0)
    assert policy.state_dir == str(tmp_path / "state-gpu7")  # {node} expanded per node
    defaults = drain.DrainPolicy.from_site(siteconfig.resolve({}, "n", None))
    assert (defaults.lemon_drains, defaults.lemon_window_h) == (3, 24.0)
    for bad in ('lemon_drains = 2.5', 'lemon_window_h = 0', 'lemon_drains = -1'):
        path = tmp_path / "bad.toml"
        path.write_text(f"[runner]\n{bad}\n")
        with pytest.raises(ConfigError) as err:
            siteconfig.load("n", str(path))
        assert bad.split()[0] in str(err.value), err.value
