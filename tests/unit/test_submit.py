"""Submission: the typed request, dry run, sbatch (--parsable, --test-only) and the optional
pyslurm backend, mocked against pyslurm 25.11's documented JobSubmitDescription API."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from slurmfabric import cli
from slurmfabric.config import load_config
from slurmfabric.errors import SubmitError, UsageError
from slurmfabric.job.submit import build_request, pyslurm_fields, resolve_backend, submit
from slurmfabric.slurm import cmd as slurmcmd

# Attributes documented for pyslurm.JobSubmitDescription in pyslurm 25.11.2
# (pyslurm/core/job/submission.pxd docstring) that slurmfabric may set.
DOCUMENTED = {
    "name", "account", "partitions", "qos", "time_limit", "nodes", "ntasks_per_node",
    "cpus_per_task", "memory_per_node", "constraints", "reservations", "standard_output",
    "standard_error", "array", "dependencies", "is_requeueable", "mail_types", "mail_user",
    "gres_per_node", "resource_sharing", "signal", "working_directory", "script",
}
SETS = ["launcher.type=srun", "job.nodes=2", "job.gpus_per_node=8", "job.partition=debug",
        "job.time=10", "job.exclusive=true", "launcher.signal=USR1", "job.requeue=false",
        'program.command=["python", "train.py"]', "launcher.slurmfabric=slurmfabric"]


@pytest.fixture(autouse=True)
def _clean_env(clean_sf_env: None) -> None:
    """Every test here starts from a clean SLURMFABRIC_* environment."""


@pytest.fixture
def config():
    return load_config(sets=SETS)


def completed(cmd, rc=0, out="", err=""):
    return subprocess.CompletedProcess(cmd, rc, out, err)


@pytest.fixture
def no_subprocess(mocker):
    return mocker.patch.object(slurmcmd.subprocess, "run",
                               side_effect=AssertionError("a dry run ran a command"))


def test_dry_run_shows_exact_command_and_script(config, no_subprocess) -> None:
    request = build_request(config, sbatch_args=["--hold"])
    text = request.describe()
    assert request.command() == ["sbatch", "--parsable", "--hold"]
    assert "# command: sbatch --parsable --hold < SCRIPT\n" in text
    assert text.endswith(request.script)
    assert request.script.startswith("#!/bin/bash\n#SBATCH ")
    no_subprocess.assert_not_called()


@pytest.mark.parametrize(("stdout", "job_id"), [
    ("4242\n", "4242"), ("4243;cluster-a\n", "4243"), ("4244_7\n", "4244_7"),
    ("4245+0\n", "4245+0"), ("sbatch: warning: can't honor --mem\n4246\n", "4246"),
])
def test_sbatch_backend_parses_parsable_output(config, mocker, stdout, job_id) -> None:
    run = mocker.patch.object(slurmcmd.subprocess, "run",
                              side_effect=lambda cmd, **kw: completed(cmd, out=stdout))
    request = build_request(config, workdir="/tmp")
    assert submit(request) == job_id
    (cmd,), kwargs = run.call_args
    assert cmd == ["sbatch", "--parsable"]
    assert kwargs["input"] == request.script and kwargs["cwd"] == "/tmp"


def test_sbatch_error_is_quoted_verbatim(config, mocker) -> None:
    err = "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
    mocker.patch.object(slurmcmd.subprocess, "run",
                        side_effect=lambda cmd, **kw: completed(cmd, rc=1, err=err))
    with pytest.raises(SubmitError) as info:
        submit(build_request(config))
    assert err.strip() in str(info.value)


def test_test_only_uses_sbatch_and_returns_slurms_verdict(config, mocker) -> None:
    verdict = ("sbatch: Job 12 to start at 2026-01-01T00:00:00 using 16 processors on nodes "
               "sfn[1-2] in partition debug")
    run = mocker.patch.object(slurmcmd.subprocess, "run",
                              side_effect=lambda cmd, **kw: completed(cmd, err=verdict + "\n"))
    request = build_request(config, test_only=True, backend="pyslurm")
    assert request.backend == "sbatch"
    assert submit(request) == verdict
    assert run.call_args.args[0] == ["sbatch", "--test-only"]


def fake_pyslurm(mocker, version="25.11.2", job_id=777):
    module = types.ModuleType("pyslurm")
    module.__version__ = version

    class RPCError(Exception):
        pass

    module.RPCError = RPCError
    description = mocker.MagicMock(name="JobSubmitDescription()")
    description.submit.return_value = job_id
    module.JobSubmitDescription = mocker.MagicMock(return_value=description)
    mocker.patch.dict(sys.modules, {"pyslurm": module})
    return module


def test_pyslurm_backend_submits_documented_fields(config, mocker) -> None:
    module = fake_pyslurm(mocker)
    mocker.patch.object(slurmcmd, "slurm_version", return_value=(25, 11, 1))
    request = build_request(config, backend="pyslurm", workdir="/work")
    assert submit(request) == "777"
    kwargs = module.JobSubmitDescription.call_args.kwargs
    assert set(kwargs) <= DOCUMENTED
    assert kwargs["script"] == request.script
    assert kwargs == {
        "script": request.script, "name": "slurmfabric", "nodes": 2, "ntasks_per_node": 8,
        "partitions": "debug", "time_limit": "10", "gres_per_node": "gpu:8",
        "resource_sharing": "exclusive", "signal": "SIGUSR1@120", "is_requeueable": False,
        "working_directory": "/work",
    }
    module.JobSubmitDescription.return_value.submit.assert_called_once_with()


def test_pyslurm_rpc_error_is_surfaced(config, mocker) -> None:
    module = fake_pyslurm(mocker)
    module.JobSubmitDescription.return_value.submit.side_effect = module.RPCError(
        "Invalid account or account/partition combination specified")
    mocker.patch.object(slurmcmd, "slurm_version", return_value=(25, 11, 0))
    with pytest.raises(SubmitError, match="Invalid account or account/partition combination"):
        submit(build_request(config, backend="pyslurm"))


def test_pyslurm_built_for_another_slurm(config, mocker) -> None:
    fake_pyslurm(mocker, version="25.11.2")
    mocker.patch.object(slurmcmd, "slurm_version", return_value=(22, 5, 8))
    request = build_request(config, backend="pyslurm")
    with pytest.raises(SubmitError) as info:
        submit(request)
    assert "pyslurm 25.11.2 was built for another Slurm than the running 22.05.8" in str(
        info.value)
    assert "--backend sbatch" in info.value.hint


def test_pyslurm_absent_says_what_to_install(config, mocker) -> None:
    mocker.patch.dict(sys.modules, {"pyslurm": None})  # import raises ImportError
    with pytest.raises(SubmitError) as info:
        submit(build_request(config, backend="pyslurm"))
    assert "pyslurm backend is not available" in str(info.value)
    assert "slurmfabric[pyslurm]" in info.value.hint


def test_auto_backend(mocker) -> None:
    mocker.patch.dict(sys.modules, {"pyslurm": None})
    assert resolve_backend("auto") == "sbatch"
    fake_pyslurm(mocker)
    version = mocker.patch.object(slurmcmd, "slurm_version", return_value=(25, 11, 3))
    assert resolve_backend("auto") == "pyslurm"
    version.return_value = (24, 11, 1)
    assert resolve_backend("auto") == "sbatch"
    with pytest.raises(UsageError):
        resolve_backend("slurmrestd")


def test_pyslurm_refuses_unmappable_extra_lines(mocker) -> None:
    config = load_config(sets=[*SETS, 'job.extra_sbatch=["--gres=nvme:1"]'])
    with pytest.raises(UsageError, match="extra_sbatch"):
        pyslurm_fields(config)


def test_cli_dry_run_and_submit(mocker, capsys, tmp_path) -> None:
    args = ["submit", *(x for s in SETS for x in ("--set", s))]
    mocker.patch.object(slurmcmd.subprocess, "run",
                        side_effect=AssertionError("dry run must not run commands"))
    assert cli.main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# command: sbatch --parsable < SCRIPT" in out and "#SBATCH --nodes=2" in out
    assert "# Re-render: slurmfabric render --set launcher.type=srun" in out
    mocker.patch.object(slurmcmd.subprocess, "run",
                        side_effect=lambda cmd, **kw: completed(cmd, out="99;c1\n"))
    assert cli.main(args) == 0
    assert capsys.readouterr().out == "99\n"


def test_render_cli_parts_and_output_file(capsys, tmp_path) -> None:
    args = ["render", *(x for s in SETS for x in ("--set", s))]
    assert cli.main([*args, "--part", "launch"]) == 0
    launch = capsys.readouterr().out
    assert launch.startswith("srun ") and "launch --mode srun -- python train.py" in launch
    assert cli.main([*args, "--part", "env"]) == 0
    assert capsys.readouterr().out.startswith("# --- environment ---")
    out = tmp_path / "job.sbatch"
    assert cli.main([*args, "-o", str(out)]) == 0
    assert out.read_text().startswith("#!/bin/bash") and os.access(out, os.X_OK)
    assert cli.main(["render", "--from-script", str(out)]) == 0
    rerendered = capsys.readouterr().out
    assert rerendered.split("# Re-render")[0] == out.read_text().split("# Re-render")[0]
