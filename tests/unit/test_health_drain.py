"""Drain/resume rules against a fake scontrol: only our own reasons, breaker, retries."""

from __future__ import annotations

import json
import sys
import types

import pytest
from helpers import fake_slurm, hgx_node, scontrol_calls, slurm_nodes, write_config

from slurmfabric.errors import ConfigError, HealthError
from slurmfabric.health import drain, siteconfig
from slurmfabric.health.hookscript import EXIT_NODE_BAD
from slurmfabric.slurm import pyslurm as slurm_pyslurm


@pytest.fixture(autouse=True)
def _site_config(tmp_path, monkeypatch):
    """drain() without backend= reads the site config: point it at an empty one here."""
    path = tmp_path / "site-health.toml"
    path.write_text("")
    monkeypatch.setenv(siteconfig.CONFIG_ENV, str(path))
    return path


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    def make(nodes):
        env = fake_slurm(tmp_path, nodes)
        for key in ("PATH", "FAKE_SCONTROL_STATE"):
            monkeypatch.setenv(key, env[key])
        return env

    return make


def pol(state_dir=None, **kw) -> drain.DrainPolicy:
    """A drain policy for the tests: no settle wait (one process, no concurrent hooks)."""
    return drain.DrainPolicy(state_dir=str(state_dir or drain.DEFAULT_STATE_DIR), settle_s=0, **kw)


def test_drain_sets_our_reason(slurm, tmp_path) -> None:
    env = slurm({"n1": ("IDLE", ""), "n2": ("IDLE", "")})
    out = drain.drain(
        "n1", "gpu.ecc", "GPU3 2 uncorrected volatile ECC errors", pol(state_dir=tmp_path)
    )
    assert out.outcome == drain.DRAINED
    assert slurm_nodes(env)["n1"] == {
        "state": "IDLE+DRAIN",
        "reason": "slurmfabric: gpu.ecc: GPU3 2 uncorrected volatile ECC errors",
    }
    assert slurm_nodes(env)["n2"]["state"] == "IDLE"
    assert drain.remembered("n1", tmp_path)["applied"] is True


def test_admin_reason_is_never_overwritten_or_resumed(slurm, tmp_path) -> None:
    env = slurm({"n1": ("IDLE+DRAIN", "bad DIMM, ticket 4711")})
    out = drain.drain("n1", "gpu.ecc", "GPU3 bad", pol(state_dir=tmp_path))
    assert out.outcome == drain.KEPT_FOREIGN
    assert drain.resume_if_ours("n1", pol(state_dir=tmp_path)) is False
    assert slurm_nodes(env)["n1"] == {"state": "IDLE+DRAIN", "reason": "bad DIMM, ticket 4711"}
    assert not any(c[0] == "update" for c in scontrol_calls(env))


def test_resume_only_our_drained_nodes(slurm, tmp_path) -> None:
    env = slurm(
        {"n1": ("IDLE+DRAIN", "slurmfabric: rdma.ports: mlx5_0:1 DOWN/Polling"), "n2": ("IDLE", "")}
    )
    assert drain.resume_if_ours("n1", pol(state_dir=tmp_path)) is True
    assert slurm_nodes(env)["n1"] == {"state": "IDLE", "reason": ""}
    assert drain.resume_if_ours("n2", pol(state_dir=tmp_path)) is False


def test_prolog_error_counts_as_ours_only_with_our_state_file(slurm, tmp_path) -> None:
    slurm({"n1": ("IDLE+DRAIN", "Prolog error"), "n2": ("IDLE+DRAIN", "Prolog error")})
    drain._remember(tmp_path, "n1", "slurmfabric: gpu.count: 7 GPUs", applied=False)
    assert drain.resume_if_ours("n2", pol(state_dir=tmp_path)) is False
    assert drain.resume_if_ours("n1", pol(state_dir=tmp_path)) is True
    assert drain.remembered("n1", tmp_path) is None


def test_breaker_stops_draining_when_many_nodes_fail_the_same_check(slurm, tmp_path) -> None:
    nodes = {f"n{i}": ("IDLE", "") for i in range(1, 11)}
    for i in (1, 2, 3):
        nodes[f"n{i}"] = ("IDLE+DRAIN", f"slurmfabric: gpu.throttle: GPU{i} HW slowdown")
    env = slurm(nodes)
    out = drain.drain(
        "n9",
        "gpu.throttle",
        "GPU0 HW slowdown",
        pol(breaker_fraction=0.2, breaker_min_nodes=3, state_dir=tmp_path),
    )
    assert out.outcome == drain.BREAKER and "3 of 10 nodes" in out.detail
    assert slurm_nodes(env)["n9"]["state"] == "IDLE"
    # A different check is not held back by that breaker.
    other = drain.drain(
        "n9",
        "gpu.ecc",
        "GPU0 1 uncorrected",
        pol(breaker_fraction=0.2, breaker_min_nodes=3, state_dir=tmp_path),
    )
    assert other.outcome == drain.DRAINED


def test_unreachable_controller_retries_then_keeps_reason_locally(
    slurm, tmp_path, monkeypatch
) -> None:
    env = slurm({"n1": ("IDLE", "")})
    monkeypatch.setenv("FAKE_SCONTROL_DOWN", "1")
    out = drain.drain(
        "n1",
        "gpu.count",
        "7 GPUs visible, expected 8",
        pol(retries=3, retry_s=0.01, state_dir=tmp_path),
    )
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
    from slurmfabric._common import files
    from slurmfabric.health import state

    path = state.job_file(tmp_path, "../../etc", "1/../../passwd")
    assert path.parent == tmp_path / "jobs"
    assert "/" not in path.name and not path.name.startswith(".")
    assert files.safe_name("..") == "_"


# --- pyslurm backend, against a fake module with pyslurm 25.11's documented shapes ----------


class _RPCError(Exception):
    """pyslurm.RPCError (a PyslurmError)."""


def fake_pyslurm(mocker, nodes: dict[str, tuple[str, str | None]], down: bool = False):
    """A ``pyslurm`` module: ``Node(name=None, **kwargs)``, ``Node.load(name)``,
    ``node.modify(changes)``, ``Nodes.load().values()``; ``state`` is Slurm's complete state
    string, ``reason`` None when unset. modify() applies DRAIN/RESUME like slurmctld."""
    loaded: dict[str, types.SimpleNamespace] = {}

    def node(name=None, **kwargs):
        return types.SimpleNamespace(
            name=name, state=kwargs.get("state"), reason=kwargs.get("reason")
        )

    def modify_for(name):
        def modify(changes):
            state, reason = nodes[name]
            if changes.state == "DRAIN":
                nodes[name] = ("IDLE+DRAIN", changes.reason)
            elif changes.state == "RESUME":
                nodes[name] = (state.split("+")[0], None)

        return mocker.Mock(side_effect=modify, name=f"Node({name}).modify")

    def load(name):
        if down:
            raise _RPCError("Unable to contact slurm controller (connect failure)")
        if name not in nodes:
            raise _RPCError(f"Node '{name}' does not exist")
        state, reason = nodes[name]
        loaded[name] = types.SimpleNamespace(
            name=name, state=state, reason=reason, modify=modify_for(name)
        )
        return loaded[name]

    def load_all(preload_passwd_info=False):
        if down:
            raise _RPCError("Unable to contact slurm controller (connect failure)")
        return {n: types.SimpleNamespace(name=n, state=s, reason=r) for n, (s, r) in nodes.items()}

    mod = types.ModuleType("pyslurm")
    mod.RPCError = mod.PyslurmError = _RPCError
    mod.Node = mocker.Mock(side_effect=node, name="pyslurm.Node")
    mod.Node.load = mocker.Mock(side_effect=load, name="pyslurm.Node.load")
    mod.Nodes = types.SimpleNamespace(load=mocker.Mock(side_effect=load_all))
    mod.loaded = loaded
    mocker.patch.dict(sys.modules, {"pyslurm": mod})
    # the version check (slurm/pyslurm.py) passes: a 25.11 pyslurm on Slurm 25.11
    mocker.patch.object(slurm_pyslurm, "installed_version", return_value="25.11.2")
    mocker.patch.object(slurm_pyslurm.cmd, "slurm_version", return_value=(25, 11, 1))
    return mod


def test_pyslurm_drain_sets_our_reason(mocker, tmp_path) -> None:
    nodes = {"n1": ("IDLE", None), "n2": ("ALLOCATED", None)}
    mod = fake_pyslurm(mocker, nodes)
    out = drain.drain(
        "n1", "gpu.ecc", "GPU3 2 uncorrected", pol(state_dir=tmp_path, backend="pyslurm")
    )
    reason = "slurmfabric: gpu.ecc: GPU3 2 uncorrected"
    assert out.outcome == drain.DRAINED and out.reason == reason
    assert mod.Nodes.load.call_count == 2  # the breaker's view, before and after (settle)
    mod.Node.load.assert_called_once_with("n1")
    mod.Node.assert_called_once_with(state="DRAIN", reason=reason)
    changes = mod.loaded["n1"].modify.call_args.args[0]
    assert (changes.state, changes.reason) == ("DRAIN", reason)
    assert nodes == {"n1": ("IDLE+DRAIN", reason), "n2": ("ALLOCATED", None)}
    assert drain.remembered("n1", tmp_path)["applied"] is True
    # Same reason again: nothing to modify.
    again = drain.drain(
        "n1", "gpu.ecc", "GPU3 2 uncorrected", pol(state_dir=tmp_path, backend="pyslurm")
    )
    assert again.outcome == drain.ALREADY and mod.Node.load.call_count == 1


def test_pyslurm_admin_reason_kept_and_never_resumed(mocker, tmp_path) -> None:
    nodes = {"n1": ("IDLE+DRAIN", "bad DIMM, ticket 4711"), "n2": ("IDLE", None)}
    mod = fake_pyslurm(mocker, nodes)
    out = drain.drain("n1", "gpu.ecc", "GPU3 bad", pol(state_dir=tmp_path, backend="pyslurm"))
    assert out.outcome == drain.KEPT_FOREIGN and "bad DIMM" in out.detail
    assert drain.resume_if_ours("n1", pol(state_dir=tmp_path, backend="pyslurm")) is False
    assert drain.resume_if_ours("n2", pol(state_dir=tmp_path, backend="pyslurm")) is False
    mod.Node.assert_not_called()  # no change object was ever built
    assert all(not n.modify.called for n in mod.loaded.values())
    assert nodes["n1"] == ("IDLE+DRAIN", "bad DIMM, ticket 4711")


def test_pyslurm_resume_only_our_reason(mocker, tmp_path) -> None:
    nodes = {"n1": ("IDLE+DRAIN", "slurmfabric: rdma.ports: mlx5_0:1 DOWN")}
    mod = fake_pyslurm(mocker, nodes)
    drain._remember(tmp_path, "n1", "slurmfabric: rdma.ports: mlx5_0:1 DOWN", applied=True)
    assert drain.resume_if_ours("n1", pol(state_dir=tmp_path, backend="pyslurm")) is True
    mod.Node.assert_called_once_with(state="RESUME")
    mod.loaded["n1"].modify.assert_called_once()
    assert nodes["n1"] == ("IDLE", None)
    assert drain.remembered("n1", tmp_path) is None


def test_pyslurm_unreachable_controller_is_deferred(mocker, tmp_path) -> None:
    fake_pyslurm(mocker, {"n1": ("IDLE", None)}, down=True)
    out = drain.drain(
        "n1",
        "gpu.count",
        "7 GPUs",
        pol(retries=2, retry_s=0.01, state_dir=tmp_path, backend="pyslurm"),
    )
    assert out.outcome == drain.DEFERRED
    assert "pyslurm Nodes.load() failed: Unable to contact slurm controller" in out.detail
    assert sys.modules["pyslurm"].Nodes.load.call_count == 2
    assert drain.remembered("n1", tmp_path)["applied"] is False


def test_absent_pyslurm_defers_with_a_hint_and_resume_says_why(mocker, tmp_path) -> None:
    mocker.patch.object(slurm_pyslurm, "installed_version", return_value=None)  # absent
    out = drain.drain("n1", "gpu.ecc", "GPU3 bad", pol(state_dir=tmp_path, backend="pyslurm"))
    assert out.outcome == drain.DEFERRED and not out.drained
    assert "pyslurm cannot be used: pyslurm is not installed" in out.detail
    assert 'drain_backend = "scontrol"' in out.detail
    assert drain.remembered("n1", tmp_path)["reason"] == "slurmfabric: gpu.ecc: GPU3 bad"
    with pytest.raises(HealthError,
                       match="pyslurm cannot be used: pyslurm is not installed") as info:
        drain.resume_if_ours("n1", pol(state_dir=tmp_path, backend="pyslurm"))
    assert "release line" in info.value.hint


def test_backend_comes_from_the_site_config(mocker, slurm, tmp_path, _site_config) -> None:
    env = slurm({"n1": ("IDLE", "")})
    mocker.patch.object(slurm_pyslurm, "installed_version", return_value=None)  # absent
    # Default: scontrol, and pyslurm is never imported (it would fail here).
    policy = drain.DrainPolicy.load("n1", state_dir=str(tmp_path))
    assert policy.backend == "scontrol" and policy.state_dir == str(tmp_path)
    assert drain.drain("n1", "gpu.ecc", "x", pol(state_dir=tmp_path)).outcome == drain.DRAINED
    assert [c[0] for c in scontrol_calls(env)] == ["show", "update", "show"]
    _site_config.write_text('[runner]\ndrain_backend = "pyslurm"\n')
    mod = fake_pyslurm(mocker, {"n1": ("IDLE+DRAIN", "slurmfabric: gpu.ecc: x")})
    policy = drain.DrainPolicy.load("n1", state_dir=str(tmp_path))  # read by the caller
    assert policy.backend == "pyslurm"
    assert drain.resume_if_ours("n1", policy) is True
    mod.Node.assert_called_once_with(state="RESUME")
    assert len(scontrol_calls(env)) == 3  # nothing more went through scontrol
    with pytest.raises(ConfigError, match="unknown"):
        drain.backend_for("slurmrestd")


def test_bad_drain_backend_in_the_config_names_the_choices(tmp_path) -> None:
    path = tmp_path / "h.toml"
    path.write_text('[runner]\ndrain_backend = "rest"\n')
    with pytest.raises(ConfigError) as info:
        siteconfig.load("n1", str(path))
    assert "drain_backend = 'rest'; use one of 'scontrol', 'pyslurm'" in str(info.value)
    path.write_text("[runner]\ndrain_backend = 1\n")
    with pytest.raises(ConfigError, match="drain_backend = 1; use one of 'scontrol', 'pyslurm'"):
        siteconfig.load("n1", str(path))


def test_hook_with_pyslurm_absent_still_fails_and_keeps_the_reason(
    mocker, slurm, tmp_path, monkeypatch
) -> None:
    from slurmfabric.health import hooks

    env = slurm({"gpu007": ("IDLE", "")})
    state = tmp_path / "state"
    cfg = write_config(
        tmp_path / "health.toml",
        state,
        [hgx_node("gpu[001-016]", "h100-535-ecc", None)],
        {"drain_backend": "pyslurm"},
    )
    monkeypatch.setenv(siteconfig.CONFIG_ENV, str(cfg))
    monkeypatch.setenv("PATH", env["PATH"])  # run_hook may prepend to PATH
    mocker.patch.object(slurm_pyslurm, "installed_version", return_value=None)  # absent
    rc = hooks.run_hook("prolog", env={"SLURMD_NODENAME": "gpu007", "SLURM_JOB_ID": "9"})
    assert rc == EXIT_NODE_BAD  # Slurm drains the node ("Prolog error") and requeues the job
    report = json.loads((state / "reports" / "last-gpu007.json").read_text())
    assert report["drain"]["outcome"] == drain.DEFERRED
    assert "pyslurm cannot be used: pyslurm is not installed" in report["drain"]["detail"]
    saved = drain.remembered("gpu007", state)
    assert saved["applied"] is False and saved["reason"].startswith("slurmfabric: gpu.ecc:")
    assert scontrol_calls(env) == []  # no silent fallback to scontrol


@pytest.mark.parametrize("how", ["env", "--config"])
def test_hook_drains_through_pyslurm_when_configured(
    mocker, slurm, tmp_path, monkeypatch, how
) -> None:
    from slurmfabric.health import hooks

    env = slurm({"gpu007": ("IDLE", "")})
    state = tmp_path / "state"
    cfg = write_config(
        tmp_path / "health.toml",
        state,
        [hgx_node("gpu[001-016]", "h100-535-ecc", None)],
        {"drain_backend": "pyslurm"},
    )
    if how == "env":
        monkeypatch.setenv(siteconfig.CONFIG_ENV, str(cfg))
    else:  # an explicit config path, no environment variable: the backend must follow it
        monkeypatch.delenv(siteconfig.CONFIG_ENV, raising=False)
    monkeypatch.setenv("PATH", env["PATH"])
    nodes = {"gpu007": ("MIXED", None), "gpu008": ("IDLE", None)}
    mod = fake_pyslurm(mocker, nodes)
    rc = hooks.run_hook(
        "prolog",
        config=str(cfg) if how == "--config" else None,
        env={"SLURMD_NODENAME": "gpu007", "SLURM_JOB_ID": "9"},
    )
    assert rc == EXIT_NODE_BAD
    reason = "slurmfabric: gpu.ecc: GPU3 2 uncorrected volatile ECC errors"
    mod.Node.assert_called_once_with(state="DRAIN", reason=reason)
    assert nodes["gpu007"] == ("IDLE+DRAIN", reason) and nodes["gpu008"] == ("IDLE", None)
    assert scontrol_calls(env) == []


# --- burn-in: release a node we drained into a maintenance reservation --------------------


def test_burnin_releases_only_our_drains_and_remembers_them(slurm, tmp_path) -> None:
    env = slurm(
        {
            "n1": ("IDLE+DRAIN", "slurmfabric: pairs: every pair with n1 is at 50 %"),
            "n2": ("IDLE+DRAIN", "admin: cable swap"),
            "n3": ("IDLE", ""),
        }
    )
    assert drain.release_for_burnin("n2", pol(state_dir=tmp_path)) == (
        drain.KEPT_FOREIGN,
        "admin: cable swap",
    )
    assert drain.release_for_burnin("n3", pol(state_dir=tmp_path))[0] == drain.NOT_DRAINED
    assert not any(c[0] == "update" for c in scontrol_calls(env))
    out, reason = drain.release_for_burnin("n1", pol(state_dir=tmp_path))
    assert out == drain.RELEASED and reason.startswith("slurmfabric: pairs:")
    assert slurm_nodes(env)["n1"] == {"state": "IDLE", "reason": ""}
    assert slurm_nodes(env)["n2"] == {"state": "IDLE+DRAIN", "reason": "admin: cable swap"}
    assert drain.in_burnin("n1", tmp_path) and not drain.in_burnin("n2", tmp_path)
    assert drain.finish_burnin("n1", tmp_path) is True
    assert drain.remembered("n1", tmp_path) is None
    assert drain.finish_burnin("n1", tmp_path) is False


class _Racing:
    """A backend whose node list already holds the drains of hooks racing with ours."""

    name = "fake"

    def __init__(self, records):
        self.records, self.updates = records, []

    def nodes(self):
        return self.records

    def update(self, name, state, reason=None):
        self.updates.append((name, state))


@pytest.mark.parametrize(("me", "undone"), [("n1", False), ("n2", False), ("n3", True),
                                            ("n4", True)])
def test_settle_keeps_the_first_drains_by_time_then_name(me: str, undone: bool) -> None:
    tag = "slurmfabric: gpu.ecc: x"
    records = [{"NodeName": n, "State": "IDLE+DRAIN", "Reason": f"{tag} [root@{t}]"}
               for n, t in (("n4", "2026-12-01T10:00:01"), ("n3", "2026-12-01T10:00:01"),
                            ("n2", "2026-12-01T10:00:00"), ("n1", "2026-12-01T10:00:01"))]
    records.append({"NodeName": "n5", "State": "IDLE", "Reason": ""})
    backend = _Racing(records)
    policy = drain.DrainPolicy(breaker_min_nodes=2, breaker_fraction=0.1, settle_s=0)
    why = drain._settle(backend, me, "gpu.ecc", policy)
    # limit 2 of 5 nodes: n2 (earliest stamp), then n1 (same second as n3/n4, first by name)
    assert (why is not None) == undone
    assert backend.updates == ([(me, "RESUME")] if undone else [])
    if undone:
        assert "4 nodes drained for gpu.ecc at once, more than the limit of 2" in why
