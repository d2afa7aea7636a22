"""Site config resolution and per-check policy (severity, action, fail-open/closed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import nvsmi, write_config

from slurmfabric.errors import ConfigError
from slurmfabric.health import runner, siteconfig
from slurmfabric.health.model import Context


def test_node_sets_merge_in_file_order_by_hostlist(tmp_path) -> None:
    path = write_config(tmp_path / "h.toml", tmp_path, [
        {"match": "gpu[001-128]", "gpus": 8, "rdma_rate_gbps": 400},
        {"match": "gpu[009-010],login1", "gpus": 4},
    ])
    assert siteconfig.load("gpu009", str(path)).expect["gpus"] == 4
    assert siteconfig.load("gpu011", str(path)).expect["gpus"] == 8
    assert siteconfig.load("gpu011", str(path)).expect["rdma_rate_gbps"] == 400
    assert siteconfig.load("gpu200", str(path)).expect["gpus"] is None


def test_config_path_from_env_and_missing_named_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(siteconfig.CONFIG_ENV, str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="nope.toml does not exist"):
        siteconfig.load("n1")
    monkeypatch.setenv(siteconfig.CONFIG_ENV, siteconfig.DEFAULT_PATH)
    if not Path(siteconfig.DEFAULT_PATH).exists():
        assert siteconfig.load("n1").path is None  # defaults when the default file is absent


@pytest.mark.parametrize(("text", "message"), [
    ("[[nodes]]\ngpu_count = 8\n", "unknown key 'gpu_count' in [[nodes]] #1"),
    ("[runner]\nbudget_s = \"20\"\n", "budget_s = '20' should be a number"),
    ("[[nodes]]\nmatch = \"n[3-1]\"\n", "match:"),
    ('[checks."gpu.ecc"]\nseverity = "info"\n', "severity = 'info'"),
    ("[runner\n", "not valid TOML"),
])
def test_config_errors_name_the_key_and_the_fix(tmp_path, text, message) -> None:
    path = tmp_path / "h.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        siteconfig.load("n1", str(path))
    assert message in str(info.value)


def _run(tmp_path, scenario, checks=None, hook="prolog", **node):
    path = write_config(tmp_path / "h.toml", tmp_path / "s", [
        {"gpus": 8, "gpu_source": "nvidia-smi", "nvidia_smi": nvsmi(scenario),
         "rdma_ports": 0, **node}], checks=checks)
    cfg = siteconfig.load("n1", str(path))
    return {r.check: r for r in runner.run(cfg, Context(hook, "n1", "5")).results}


def test_severity_warn_turns_a_failure_into_a_warning(tmp_path) -> None:
    plain = _run(tmp_path, "h100-535-hot")["gpu.temperature"]
    assert plain.status == "fail" and plain.blocking
    softened = _run(tmp_path, "h100-535-hot", {"gpu.temperature": {"severity": "warn"}})
    assert softened["gpu.temperature"].status == "warn"
    assert not softened["gpu.temperature"].blocking


def test_fail_open_and_fail_closed_checker_errors(tmp_path) -> None:
    # nvidia-smi missing is an error of the checker, not a node fault.
    closed = _run(tmp_path, "h100-535-healthy", nvidia_smi=str(tmp_path / "missing"))
    assert closed["gpu.ecc"].status == "error" and closed["gpu.ecc"].blocking
    opened = _run(tmp_path, "h100-535-healthy", {"gpu": {"on_error": "pass"}},
                  nvidia_smi=str(tmp_path / "missing"))
    assert opened["gpu.ecc"].status == "error" and not opened["gpu.ecc"].blocking
    # A node fault (exit 15) fails even where errors are fail-open.
    lost = _run(tmp_path, "fell-off-bus", {"gpu": {"on_error": "pass"}})
    assert lost["gpu.count"].status == "fail" and lost["gpu.count"].blocking


def test_disabled_checks_and_hook_selection(tmp_path) -> None:
    results = _run(tmp_path, "h100-535-healthy", {"gpu.pcie": {"enabled": False}})
    assert "gpu.pcie" not in results and "gpu.ecc" in results
    epilog = _run(tmp_path, "h100-535-healthy", hook="epilog")
    assert "node.leftovers" in epilog
    assert "node.leftovers" not in _run(tmp_path, "h100-535-healthy")


def test_site_command_runs_only_in_deep_epilog(tmp_path) -> None:
    cmd = [{"name": "diag", "argv": ["sh", "-c", "echo 'diag: SM stress failed' >&2; exit 3"],
            "hooks": ["epilog_failed"]}]
    path = write_config(tmp_path / "h.toml", tmp_path / "s", [{"gpus": 0, "rdma_ports": 0}])
    text = path.read_text() + ('commands = [{name = "diag", argv = ["sh", "-c", '
                               '"echo \'diag: SM stress failed\' >&2; exit 3"], '
                               'hooks = ["epilog_failed"]}]\n')
    path.write_text(text)
    cfg = siteconfig.load("n1", str(path))
    assert cfg.expect["commands"][0]["argv"] == cmd[0]["argv"]
    calm = runner.run(cfg, Context("epilog", "n1", "5"))
    assert "site.diag" not in {r.check for r in calm.results}
    deep = runner.run(cfg, Context("epilog", "n1", "5", deep=True))
    diag = next(r for r in deep.results if r.check == "site.diag")
    assert diag.status == "fail" and diag.reason == "exit 3: diag: SM stress failed"
