"""Submission: the typed request, dry run, sbatch (--parsable, --test-only) and the optional
pyslurm backend, run against a stand-in pyslurm (tests/fixtures/pyslurm/fake) that accepts
only the JobSubmitDescription names recorded from the real pyslurm 25.11.2 sdist."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cleanenv import clean_env
from extract_names import read_fixture

from slurmfabric import cli
from slurmfabric.config import load_config
from slurmfabric.errors import SubmitError, UsageError
from slurmfabric.job.submit import build_request, pyslurm_fields, resolve_backend, submit
from slurmfabric.slurm import cmd
from slurmfabric.slurm import pyslurm as slurm_pyslurm

REPO = Path(__file__).resolve().parents[2]
PYSLURM_FIXTURES = REPO / "tests" / "fixtures" / "pyslurm"
# JobSubmitDescription's attributes in the real pyslurm 25.11.2 sdist (extract_names.py)
RECORDED_NAMES = read_fixture(PYSLURM_FIXTURES / "jobsubmitdescription.txt")[1]
SETS = ["launcher.type=srun", "job.nodes=2", "job.gpus_per_node=8", "job.partition=debug",
        "job.time=10", "job.exclusive=true", "launcher.signal=USR1", "job.requeue=false",
        'program.command=["python", "train.py"]', "launcher.slurmfabric=slurmfabric"]


@pytest.fixture(autouse=True)
def _clean_env(clean_sf_env: None) -> None:
    """Every test here starts from a clean SLURMFABRIC_* environment."""


@pytest.fixture
def config():
    return load_config(sets=SETS)


def completed(argv, rc=0, out="", err=""):
    return subprocess.CompletedProcess(argv, rc, out, err)


@pytest.fixture
def no_subprocess(mocker):
    return mocker.patch.object(cmd.subprocess, "run",
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
    ("4242\n", "4242"), ("4243;cluster-a\n", "4243;cluster-a"), ("4244_7\n", "4244_7"),
    ("4245+0\n", "4245+0"), ("sbatch: warning: can't honor --mem\n4246\n", "4246"),
])
def test_sbatch_backend_parses_parsable_output(config, mocker, stdout, job_id) -> None:
    run = mocker.patch.object(cmd.subprocess, "run",
                              side_effect=lambda argv, **kw: completed(argv, out=stdout))
    request = build_request(config, workdir="/tmp")
    assert submit(request) == job_id
    (argv,), kwargs = run.call_args
    assert argv == ["sbatch", "--parsable"]
    assert kwargs["input"] == request.script and kwargs["cwd"] == "/tmp"


def test_sbatch_error_is_quoted_verbatim(config, mocker) -> None:
    err = "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
    mocker.patch.object(cmd.subprocess, "run",
                        side_effect=lambda argv, **kw: completed(argv, rc=1, err=err))
    with pytest.raises(SubmitError) as info:
        submit(build_request(config))
    assert err.strip() in str(info.value)


def test_test_only_uses_sbatch_and_returns_slurms_verdict(config, mocker) -> None:
    verdict = ("sbatch: Job 12 to start at 2026-01-01T00:00:00 using 16 processors on nodes "
               "sfn[1-2] in partition debug")
    run = mocker.patch.object(cmd.subprocess, "run",
                              side_effect=lambda argv, **kw: completed(argv, err=verdict + "\n"))
    request = build_request(config, test_only=True, backend="pyslurm")
    assert request.backend == "sbatch"
    assert submit(request) == verdict
    assert run.call_args.args[0] == ["sbatch", "--test-only"]


def _dist_info(where: Path, version: str) -> Path:
    """A pyslurm distribution's metadata (what pip writes), which the version check reads."""
    info = where / f"pyslurm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: pyslurm\nVersion: {version}\n")
    return where


@pytest.fixture
def fake_pyslurm(monkeypatch, tmp_path):
    """The stand-in pyslurm (tests/fixtures/pyslurm/fake) on sys.path with its distribution
    metadata, and a stand-in scontrol on PATH whose --version the real
    cmd.slurm_version parses. Returns a function that sets both versions and gives the
    file the submitted fields land in."""
    monkeypatch.syspath_prepend(str(PYSLURM_FIXTURES / "fake"))
    monkeypatch.delitem(sys.modules, "pyslurm", raising=False)
    monkeypatch.setenv("PATH", f"{PYSLURM_FIXTURES / 'bin'}{os.pathsep}{os.environ['PATH']}")
    record = tmp_path / "fields.json"
    monkeypatch.setenv("FAKE_PYSLURM_RECORD", str(record))

    def versions(pyslurm: str = "25.11.2", slurm: str = "25.11.1"):
        monkeypatch.syspath_prepend(str(_dist_info(tmp_path / f"dist-{pyslurm}", pyslurm)))
        monkeypatch.setenv("FAKE_SLURM_VERSION", slurm)
        sys.modules.pop("pyslurm", None)
        return record

    yield versions
    sys.modules.pop("pyslurm", None)


def test_pyslurm_backend_submits_documented_fields(config, fake_pyslurm) -> None:
    """The table's fields, the script itself, and none of pyslurm's own defaults that sbatch
    lacks (ntasks=1, cpus_per_task=1): the job slurmctld gets is sbatch's. The dry run
    prints the fields sent."""
    record = fake_pyslurm()
    request = build_request(config, backend="pyslurm", workdir="/work")
    assert submit(request) == "4242"
    fields = json.loads(record.read_text())
    printed = request.describe().split("# fields: ", 1)[1].split("\n", 1)[0]
    assert ast.literal_eval(printed) == {k: v for k, v in fields.items()
                                         if k not in ("script", "environment")}
    assert set(fields) <= RECORDED_NAMES
    assert fields == {
        "script": request.script, "name": "slurmfabric", "nodes": 2, "ntasks_per_node": 8,
        "partitions": "debug", "time_limit": "10", "gres_per_node": "gpu:8",
        "resource_sharing": "exclusive", "signal": "SIGUSR1@120", "is_requeueable": False,
        "working_directory": "/work", "environment": "ALL",
        # sbatch's own counts: 2 nodes x 8 tasks; the minimum CPUs, one per task (no -c)
        "ntasks": 16, "min_cpus_per_node": 16,
    }


def test_the_fake_refuses_what_pyslurm_refuses(fake_pyslurm) -> None:
    """The stand-in can fail: an unknown attribute and a signal without SIG are refused, and
    its defaults are pyslurm's."""
    fake_pyslurm()
    import pyslurm

    with pytest.raises(AttributeError, match="gpus_per_node"):
        pyslurm.JobSubmitDescription(gpus_per_node=8)
    with pytest.raises(ValueError, match="Invalid Signal: USR2"):
        pyslurm.JobSubmitDescription(signal="B:USR2@60").submit()
    plain = pyslurm.JobSubmitDescription(script="#!/bin/sh\n")
    plain.submit()
    assert (plain.ntasks, plain.cpus_per_task) == (1, 1)


def test_pyslurm_rpc_error_is_surfaced(config, fake_pyslurm, monkeypatch) -> None:
    fake_pyslurm()
    monkeypatch.setenv("FAKE_PYSLURM_RPC_ERROR",
                       "Invalid account or account/partition combination specified")
    with pytest.raises(SubmitError, match="Invalid account or account/partition combination"):
        submit(build_request(config, backend="pyslurm"))


def test_pyslurm_built_for_another_slurm(config, fake_pyslurm) -> None:
    record = fake_pyslurm(pyslurm="25.11.2", slurm="22.05.8")
    request = build_request(config, backend="pyslurm")
    with pytest.raises(UsageError) as info:
        submit(request)
    assert str(info.value) == ("pyslurm 25.11.2 is built for Slurm 25.11, but this Slurm is "
                               "22.05.8 (scontrol --version): their release lines must match")
    assert "release line" in info.value.hint and "--backend sbatch" in info.value.hint
    assert not record.exists()


def test_pyslurm_mismatch_on_the_command_line(fake_pyslurm, tmp_path) -> None:
    """`submit --backend pyslurm` against another Slurm: exit 2, one error line naming both
    versions (plus the HINT), nothing submitted; the pyslurm of the release line submits."""
    record = tmp_path / "fields.json"
    dist = _dist_info(tmp_path / "dist", "25.11.2")
    env = clean_env(PYTHONPATH=os.pathsep.join([str(dist), str(REPO),
                                                str(PYSLURM_FIXTURES / "fake")]),
                    PATH=f"{PYSLURM_FIXTURES / 'bin'}{os.pathsep}/usr/bin:/bin",
                    SLURMFABRIC_JOBS_DIR=str(tmp_path / "jobs"), SLURMFABRIC_SITE_DEFAULTS="",
                    FAKE_SLURM_VERSION="24.05.3", FAKE_PYSLURM_RECORD=str(record))
    command = [sys.executable, "-m", "slurmfabric", "submit", "-c",
               str(REPO / "examples" / "resume-cpu.toml"), "--backend", "pyslurm"]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tmp_path)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("slurmfabric:")]
    assert proc.returncode == 2 and errors == [
        "slurmfabric: error: pyslurm 25.11.2 is built for Slurm 25.11, but this Slurm is "
        "24.05.3 (scontrol --version): their release lines must match"], proc.stderr
    assert "Traceback" not in proc.stderr and not record.exists()
    proc = subprocess.run(command, env={**env, "FAKE_SLURM_VERSION": "25.11.1"},
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "4242\n", proc.stderr
    fields = json.loads(record.read_text())
    assert (fields["is_requeueable"], fields["signal"], fields["log_files_open_mode"]) == (
        True, "B:SIGUSR2@60", "append")
    # sbatch's counts (2 nodes x 1 torchrun task, 2 CPUs each), not pyslurm's 1 and 1
    assert (fields["ntasks"], fields["cpus_per_task"], fields["min_cpus_per_node"]) == (2, 2, 4)


def test_pyslurm_absent_says_what_to_install(config, monkeypatch) -> None:
    monkeypatch.setattr(slurm_pyslurm, "installed_version", lambda: None)
    with pytest.raises(UsageError) as info:
        submit(build_request(config, backend="pyslurm"))
    assert str(info.value) == "pyslurm is not installed"
    assert "tag of this Slurm's release line" in info.value.hint


@pytest.mark.parametrize(("fields", "counts"), [
    ({"nodes": 2, "ntasks_per_node": 8}, {"ntasks": 16, "min_cpus_per_node": 16}),
    ({"nodes": 2, "ntasks_per_node": 1, "cpus_per_task": 96},
     {"ntasks": 2, "min_cpus_per_node": 192}),
    ({"nodes": "2-4", "ntasks_per_node": 2}, {"min_cpus_per_node": 1}),  # no fixed count
    ({"nodes": 3}, {"min_cpus_per_node": 1}),
    ({"nodes": 2, "ntasks": 5, "cpus_per_task": 3}, {"min_cpus_per_node": 15}),
])
def test_sbatch_counts(fields, counts) -> None:
    """sbatch's derived ntasks and minimum CPU count (the cluster test checks them against
    sbatch's job on the testbed)."""
    assert slurm_pyslurm.sbatch_counts(fields) == counts


def test_what_pyslurm_cannot_send_is_refused_naming_the_field() -> None:
    """mem = "0" (all memory) becomes no memory request in every release line; pyslurm
    22.5.x never sends the warning signal. Refused before anything is submitted."""
    h100 = load_config(REPO / "examples" / "h100-fsdp.toml")
    with pytest.raises(UsageError) as info:
        pyslurm_fields(h100, version="25.11.2")
    assert str(info.value) == ("job.mem = '0': pyslurm sends 0 (all memory, sbatch --mem=0) "
                               "as no memory request at all")
    assert info.value.hint == "use --backend sbatch"
    resume = load_config(REPO / "examples" / "resume-cpu.toml")
    assert pyslurm_fields(resume, version="24.11.0")["signal"] == "B:SIGUSR2@60"
    with pytest.raises(UsageError, match=r"^launcher.signal/launcher.resume = 'B:USR2@60': "
                       "pyslurm 22.5.3 never sends the warning signal"):
        pyslurm_fields(resume, version="22.5.3")


def test_auto_backend(monkeypatch, fake_pyslurm, mocker) -> None:
    """auto: pyslurm when installed, of the running Slurm's line and able to send the
    config; a dry run decides without asking Slurm."""
    smoke = load_config(REPO / "examples" / "smoke-cpu.toml")
    h100 = load_config(REPO / "examples" / "h100-fsdp.toml")
    mocker.patch.object(cmd.subprocess, "run",
                        side_effect=AssertionError("a dry run asked Slurm"))
    with monkeypatch.context() as patch:
        patch.setattr(slurm_pyslurm, "installed_version", lambda: None)
        assert resolve_backend("auto", smoke, dry_run=True) == "sbatch"
    fake_pyslurm(pyslurm="25.11.2", slurm="24.11.1")
    assert resolve_backend("auto", smoke, dry_run=True) == "pyslurm"  # no_subprocess: no Slurm
    assert resolve_backend("auto", h100, dry_run=True) == "sbatch"  # mem = "0"
    mocker.stopall()
    assert resolve_backend("auto", smoke) == "sbatch"  # 24.11 runs
    fake_pyslurm(pyslurm="25.11.2", slurm="25.11.1")
    assert resolve_backend("auto", smoke) == "pyslurm"
    with pytest.raises(UsageError):
        resolve_backend("slurmrestd")


def test_pyslurm_refuses_unmappable_extra_lines(mocker) -> None:
    config = load_config(sets=[*SETS, 'job.extra_sbatch=["--gres=nvme:1"]'])
    with pytest.raises(UsageError, match="extra_sbatch"):
        pyslurm_fields(config)


def test_cli_dry_run_and_submit(mocker, capsys, tmp_path) -> None:
    args = ["submit", *(x for s in SETS for x in ("--set", s))]
    mocker.patch.object(cmd.subprocess, "run",
                        side_effect=AssertionError("dry run must not run commands"))
    assert cli.main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# command: sbatch --parsable < SCRIPT" in out and "#SBATCH --nodes=2" in out
    assert "# Re-render: slurmfabric render --set launcher.type=srun" in out
    mocker.patch.object(cmd.subprocess, "run",
                        side_effect=lambda argv, **kw: completed(argv, out="99;c1\n"))
    assert cli.main(args) == 0
    assert capsys.readouterr().out == "99;c1\n"  # the cluster is kept (issue 31)


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
