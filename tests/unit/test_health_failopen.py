"""The hooks fail open on their own faults: a broken site config never drains a node.

Every case below is a config that parses far enough to be dangerous (or not at all); the
prolog must exit 0 without calling scontrol, log one line that names the problem, and set
slurmfabric_health_hook_error 1; ``health check`` reports the same problem with exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fake_slurm, scontrol_calls

NODE = "gpu007"
DEEP = "a = " + "[" * 20000 + "]" * 20000 + "\n"

# name -> (config bytes, or a callable making the path; text the error must contain)
CASES: dict[str, tuple[object, str]] = {
    "nodes-list-of-strings": (b'nodes = ["gpu001", "gpu002"]\n',
                              "nodes should be an array of tables"),
    "runner-int": (b"runner = 5\n", "runner should be a table"),
    "checks-int": (b"checks = 5\n", "checks should be a table"),
    "non-utf8-comment": (b"# caf\xe9\n[runner]\nbudget_s = 20\n", "not UTF-8 text (byte 0xe9"),
    "budget-inf": (b"[runner]\nbudget_s = inf\n", "budget_s = inf: not a finite number"),
    "budget-nan": (b"[runner]\nbudget_s = nan\n", "budget_s = nan: not a finite number"),
    "budget-negative": (b"[runner]\nbudget_s = -1\n", "budget_s = -1 is outside 0.1..3600"),
    "deep-nesting": (DEEP.encode(), "nested too deeply to be a config"),
    "huge-integer": (b"[runner]\ndrain_retries = " + b"9" * 5000 + b"\n", "not valid TOML"),
    "match-int": (b"[[nodes]]\nmatch = 7\n", "match = 7 should be a hostlist string"),
    "gpus-string": (b'[[nodes]]\ngpus = "eight"\n', "gpus = 'eight' should be a number"),
    "gpus-float": (b"[[nodes]]\ngpus = 7.5\n", "gpus = 7.5 should be a whole number"),
    "disks-string-value": (b'[[nodes]]\ndisks = { "/tmp" = "20G" }\n',
                           "disks./tmp = '20G' should be a number"),
    "rdma-devices-not-list": (b'[[nodes]]\nrdma_devices = "mlx5_0"\n',
                              "rdma_devices should be a list of strings"),
    "commands-not-tables": (b'[[nodes]]\ncommands = ["true"]\n',
                            "commands #1 should be a table"),
    "check-hooks-string": (b'[checks.gpu]\nhooks = "prolog"\n', "hooks should be a list"),
    "control-char-key": (b'[runner]\n"bud\\nget" = 1\n', "unknown key 'bud\\nget'"),
    "link-layer-typo": (b'[[nodes]]\nrdma_link_layer = "IB"\n', "rdma_link_layer = 'IB'"),
    "not-toml": (b"[runner\n", "not valid TOML"),
    "a-directory": ("dir", "not a regular file"),
    "a-fifo": ("fifo", "not a regular file"),
    "unreadable": ("unreadable", "cannot read"),
    "huge-file": (b"#" * (2 << 20), "larger than 1048576 bytes"),
}


def _config(tmp_path: Path, name: str) -> Path:
    content = CASES[name][0]
    path = tmp_path / "health.toml"
    if content == "dir":
        path.mkdir()
    elif content == "fifo":
        os.mkfifo(path)
    elif content == "unreadable":
        path.write_text("[runner]\n")
        path.chmod(0)
    else:
        assert isinstance(content, bytes)
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_broken_config_fails_open_and_is_reported(tmp_path: Path, name: str) -> None:
    if name == "unreadable" and os.geteuid() == 0:
        # root reads mode-000 files: a dangling link is what root cannot open
        cfg = tmp_path / "health.toml"
        cfg.symlink_to(tmp_path / "missing-target")
        expected = "does not exist"
    else:
        cfg = _config(tmp_path, name)
        expected = CASES[name][1]
    env = fake_slurm(tmp_path, {NODE: ("IDLE", "")})
    env.update(SLURMD_NODENAME=NODE, SLURM_JOB_ID="77", SLURMFABRIC_HEALTH_CONFIG=str(cfg))
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "prolog"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr  # Slurm drains a node whose prolog fails
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "config error, NOT draining (fail-open)" in lines[0] and expected in lines[0], lines
    assert not [c for c in scontrol_calls(env) if "update" in c]  # nothing drained
    check = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "check",
                            "--config", str(cfg)], env=env, capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 2 and "Traceback" not in check.stderr, check.stderr
    assert expected in check.stderr


def test_the_metric_and_log_of_a_failed_open_hook(tmp_path: Path) -> None:
    """Where the broken config still names its log and metrics files, they are used."""
    prom = tmp_path / "m" / "health.prom"
    cfg = tmp_path / "health.toml"
    cfg.write_text(f'[runner]\nlog_file = "{tmp_path / "hook.log"}"\n'
                   f'prometheus_file = "{prom}"\nbudget_s = inf\n')
    env = fake_slurm(tmp_path, {NODE: ("IDLE", "")})
    env.update(SLURMD_NODENAME=NODE, SLURM_JOB_ID="77", SLURMFABRIC_HEALTH_CONFIG=str(cfg))
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "prolog"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    gauge = (tmp_path / "m" / "health.hook.prom").read_text()
    assert f'slurmfabric_health_hook_error{{node="{NODE}",hook="prolog"}} 1' in gauge
    assert "budget_s = inf: not a finite number" in (tmp_path / "hook.log").read_text()
    # fixed config: the next hook runs the checks and clears the gauge
    cfg.write_text(f'[runner]\nlog_file = "{tmp_path / "hook.log"}"\nsyslog = false\n'
                   f'prometheus_file = "{prom}"\nstate_dir = "{tmp_path / "state"}"\n'
                   '[[nodes]]\ngpus = 0\nrdma_ports = 0\n')
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "prolog"], env=env,
                          capture_output=True, text=True, timeout=60)
    gauge = (tmp_path / "m" / "health.hook.prom").read_text()
    assert f'slurmfabric_health_hook_error{{node="{NODE}",hook="prolog"}} 0' in gauge, \
        proc.stderr


def test_an_internal_error_fails_open_too(tmp_path: Path) -> None:
    """A bug in slurmfabric (here: a check module that raises) is not the node's fault."""
    sitecustom = tmp_path / "site"
    sitecustom.mkdir()
    (sitecustom / "sitecustomize.py").write_text(
        "import slurmfabric.health.runner as r\n"
        "def boom(*a, **k):\n    raise RuntimeError('bug in a check')\n"
        "r.run = boom\n")
    cfg = tmp_path / "health.toml"
    cfg.write_text(f'[runner]\nsyslog = false\nstate_dir = "{tmp_path / "s"}"\n'
                   f'log_file = "{tmp_path / "hook.log"}"\n')
    env = fake_slurm(tmp_path, {NODE: ("IDLE", "")})
    env.update(SLURMD_NODENAME=NODE, SLURM_JOB_ID="77", SLURMFABRIC_HEALTH_CONFIG=str(cfg),
               PYTHONPATH=str(sitecustom))
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "prolog"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert "internal error, NOT draining (fail-open): RuntimeError: bug in a check" \
        in proc.stderr
    assert "RuntimeError: bug in a check" in (tmp_path / "hook.log").read_text()
