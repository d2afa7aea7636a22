"""The dispatcher: version, help, unknown commands, and that it stays import-light."""

from __future__ import annotations

import subprocess
import sys

import slurmfabric
from slurmfabric import cli


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurmfabric", *args],
                          capture_output=True, text=True, timeout=60)


def test_version_matches_package():
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"slurmfabric {slurmfabric.__version__}"


def test_help_lists_every_command():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for name in cli.COMMANDS:
        assert f"  {name} " in proc.stdout


def test_unknown_command_exits_2_with_choices():
    proc = run_cli("frobnicate")
    assert proc.returncode == 2
    assert "unknown command 'frobnicate'" in proc.stderr
    assert "testbed" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_renamed_command_names_its_new_name_and_runs_nothing():
    proc = run_cli("fabric", "audit", "--input", "a b")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "slurmfabric: error: command 'fabric' is now 'ib'; run: slurmfabric ib audit --input 'a b'"
    )
    assert set(cli.RENAMED.values()) <= set(cli.COMMANDS)
    assert not set(cli.RENAMED) & set(cli.COMMANDS)


def test_no_arguments_prints_usage_and_exits_2():
    proc = run_cli()
    assert proc.returncode == 2
    assert proc.stdout.startswith("usage: slurmfabric")


def test_every_command_module_exists_and_has_main():
    import importlib

    for name, (module, _) in cli.COMMANDS.items():
        mod = importlib.import_module(f"slurmfabric.commands.{module}")
        assert callable(mod.main), name


def test_dispatcher_imports_no_heavy_module():
    code = (
        "import sys, slurmfabric.cli, slurmfabric;"
        "heavy = [m for m in ('pydantic', 'jinja2', 'torch', 'psutil') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_expected_errors_print_one_line_and_hint(capsys):
    from slurmfabric.errors import UsageError

    code = cli.report_error(UsageError("nodes: must be >= 1, got -2", hint="set job.nodes"))
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [
        "slurmfabric: error: nodes: must be >= 1, got -2",
        "HINT: set job.nodes",
    ]
