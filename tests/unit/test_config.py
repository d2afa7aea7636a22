"""Config sources, their precedence (one test per adjacent pair) and the error lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmfabric import cli
from slurmfabric.config import JobConfig, load_config
from slurmfabric.config.sources import parse_set
from slurmfabric.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
BASE = ["launcher.type=srun", "job.ntasks_per_node=2", 'program.command=["hostname"]']


@pytest.fixture(autouse=True)
def _clean_env(clean_sf_env: None) -> None:
    """Every test here starts from a clean SLURMFABRIC_* environment."""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def problems(**kwargs) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(**kwargs)
    return info.value.problems


# --- precedence: defaults < site < file < env < --set ------------------------------------


def test_site_defaults_beat_builtin_defaults(tmp_path: Path) -> None:
    site = write(tmp_path / "site.toml", '[job]\npartition = "gpu"\naccount = "ops"\n')
    config = load_config(sets=BASE, site_defaults=site)
    assert (config.job.partition, config.job.account) == ("gpu", "ops")
    assert load_config(sets=BASE).job.partition is None


def test_user_file_beats_site_defaults_and_merges_deeply(tmp_path: Path) -> None:
    site = write(tmp_path / "site.toml", '[job]\npartition = "gpu"\naccount = "ops"\n')
    user = write(tmp_path / "job.toml", '[job]\npartition = "debug"\n')
    config = load_config(user, sets=BASE, site_defaults=site)
    assert config.job.partition == "debug"
    assert config.job.account == "ops"  # untouched keys of the same table survive


def test_env_beats_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = write(tmp_path / "job.toml", "[job]\nnodes = 3\n")
    monkeypatch.setenv("SLURMFABRIC_JOB__NODES", "5")
    assert load_config(user, sets=BASE, environment=True).job.nodes == 5


def test_set_beats_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMFABRIC_JOB__NODES", "5")
    assert load_config(sets=[*BASE, "job.nodes=7"], environment=True).job.nodes == 7


def test_site_defaults_path_from_env_and_flag(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from_env = write(tmp_path / "env.toml", '[job]\nqos = "fromenv"\n')
    from_flag = write(tmp_path / "flag.toml", '[job]\nqos = "fromflag"\n')
    monkeypatch.setenv("SLURMFABRIC_SITE_DEFAULTS", str(from_env))
    assert load_config(sets=BASE, environment=True).job.qos == "fromenv"
    assert load_config(sets=BASE, site_defaults=from_flag, environment=True).job.qos == \
        "fromflag"


def test_env_keeps_case_of_env_var_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMFABRIC_PROGRAM__ENV__OMP_NUM_THREADS", "4")
    monkeypatch.setenv("SLURMFABRIC_FABRIC__NCCL__NCCL_IB_HCA", "=mlx5_0")
    config = load_config(sets=BASE, environment=True)
    assert config.program.env == {"OMP_NUM_THREADS": "4"}
    assert config.fabric.nccl == {"NCCL_IB_HCA": "=mlx5_0"}


def test_unrelated_slurmfabric_env_vars_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMFABRIC_SYSFS_ROOT", "/tmp/x")
    monkeypatch.setenv("SLURMFABRIC_RDZV_ID", "abc")
    assert load_config(sets=BASE).job.nodes == 1


def test_parse_set_forms() -> None:
    parsed = parse_set(["job.nodes=2", 'program.command=["python", "a b"]',
                        "program.env.X=a=b", "job.name=123"])
    assert parsed == {"job": {"nodes": "2", "name": "123"},
                      "program": {"command": ["python", "a b"], "env": {"X": "a=b"}}}


@pytest.mark.parametrize("item", ["nodes", "=2", "job..nodes=2", 'program.command=["x"'])
def test_parse_set_rejects_malformed(item: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_set([item])
    assert info.value.problems[0].startswith("--set")


def test_job_name_that_looks_like_a_number_stays_a_string() -> None:
    assert load_config(sets=[*BASE, "job.name=123"]).job.name == "123"


def test_toml_values_are_typed(tmp_path: Path) -> None:
    user = write(tmp_path / "job.toml", "[job]\ntime = 30\n[program.env]\nN = 4\nB = true\n")
    config = load_config(user, sets=BASE)
    assert config.job.time == "30"
    assert config.program.env == {"N": "4", "B": "true"}


def test_examples_load() -> None:
    for name in ("smoke-cpu", "h100-fsdp", "nccl-tests-sweep"):
        config = load_config(REPO / "examples" / f"{name}.toml")
        assert isinstance(config, JobConfig)


# --- errors: one line per problem, naming the field and the accepted values --------------


def test_bad_config_reports_every_problem_on_its_own_line(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.toml", '[job]\nnodez = 2\nnodes = -2\ntime = "1:2:3:4"\n')
    lines = problems(path=bad)
    assert len(lines) == 3
    by_field = {line.split(":")[0]: line for line in lines}
    assert "accepted fields here: name, partition" in by_field["job.nodez"]
    assert "got -2; accepted: a number >= 1" in by_field["job.nodes"]
    assert "DAYS-HOURS:MINUTES:SECONDS" in by_field["job.time"]


@pytest.mark.parametrize("time", ["30", "30:00", "1:00:00", "2-0", "2-12:00", "2-12:00:00",
                                  "UNLIMITED", "infinite"])
def test_time_limits_slurm_accepts(time: str) -> None:
    assert load_config(sets=[*BASE, f"job.time={time}"]).job.time == time


@pytest.mark.parametrize("time", ["1h", "1:2:3:4", "-5", "1-2-3", "", "10:00 "])
def test_time_limits_slurm_rejects(time: str) -> None:
    (line,) = problems(sets=[*BASE, f"job.time={time}"])
    assert line.startswith("job.time:") and "UNLIMITED" in line


@pytest.mark.parametrize("name", ["my job", "", "-x", "a'b", "a\nb", "x" * 129, "ok\n"])
def test_job_names_rejected(name: str) -> None:
    (line,) = problems(sets=[*BASE, f"job.name={name}"])
    # a control character is refused by the text rule (textcheck.py) before the name rule
    assert line.startswith("job.name:")
    assert ("letters, digits" in line) or ("'\\n' (U+000A)" in line), line


def test_unknown_launcher_lists_the_accepted_ones() -> None:
    (line,) = problems(sets=[*BASE, "launcher.type=torchrum"])
    assert line == ("launcher.type: got 'torchrum'; accepted: torchrun, srun, mpirun, "
                    "srun-pmix, nccl-tests")


def test_unknown_section_lists_sections() -> None:
    (line,) = problems(sets=[*BASE, "jobs.nodes=2"])
    assert line == ("jobs: unknown field; accepted fields here: job, launcher, program, "
                    "fabric, kubernetes, steps")


def test_torchrun_rules() -> None:
    lines = problems(sets=["launcher.type=torchrun", "job.gpus_per_node=8",
                           "job.ntasks_per_node=8", "launcher.nproc_per_node=4",
                           'program.command=["x"]'])
    assert any(line.startswith("job.ntasks_per_node: torchrun runs one task per node")
               for line in lines)
    assert any(line.startswith("launcher.nproc_per_node: torchrun runs one worker per GPU")
               and "accepted: 8 or unset" in line for line in lines)
    cpu = problems(sets=["launcher.type=torchrun", 'program.command=["x"]'])
    assert cpu == ["launcher.nproc_per_node: a CPU-only torchrun job (job.gpus_per_node=0) "
                   "needs the number of workers per node; accepted: an integer >= 1"]


def test_srun_needs_one_task_per_gpu() -> None:
    (line,) = problems(sets=["launcher.type=srun", "job.gpus_per_node=4",
                             "job.ntasks_per_node=2", 'program.command=["x"]'])
    assert line == ("job.ntasks_per_node: srun runs one task per GPU, got 2 with "
                    "job.gpus_per_node=4; accepted: 4 or unset")
    ok = load_config(sets=["launcher.type=srun", "job.gpus_per_node=4", 'program.command=["x"]'])
    assert ok.job.ntasks_per_node is None


def test_program_rules() -> None:
    assert problems(sets=["launcher.type=srun", "job.ntasks_per_node=1"])[0].startswith(
        "program.command: empty")
    lines = problems(sets=["launcher.type=mpirun", "job.ntasks_per_node=1",
                           'program.command=["x"]', "program.container_image=img"])
    assert lines[0].startswith("program.container_image:") and "not mpirun" in lines[0]
    lines = problems(sets=["launcher.type=nccl-tests", "job.gpus_per_node=8",
                           'program.command=["x"]'])
    assert lines[0].startswith("program.command: nccl-tests runs the binaries")


@pytest.mark.parametrize(("item", "field"), [
    ("program.env.1BAD=x", "program.env"),
    ("fabric.nccl.IB_HCA=x", "fabric.nccl"),
    ("fabric.type=infiniband", "fabric.type"),
    ("launcher.signal=KILL", "launcher.signal"),
    ("job.mem=10GiB", "job.mem"),  # Slurm takes 10G and 10GB, not 10GiB
    ("job.partition=a b", "job.partition"),
    ("job.output=/tmp/#x", "job.output"),
    ("job.extra_sbatch=[\"gres=x\"]", "job.extra_sbatch"),
    ("launcher.rendezvous.port_range=[30000, 20000]", "launcher.rendezvous.port_range"),
    ("launcher.nccl_tests.ops=[\"allreduce\"]", "launcher.nccl_tests.ops"),
])
def test_field_errors_name_the_field(item: str, field: str) -> None:
    lines = problems(sets=[*BASE, item])
    assert len(lines) == 1 and lines[0].startswith(field + ":"), lines


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    assert problems(path=tmp_path / "nope.toml") == [f"{tmp_path / 'nope.toml'}: no such "
                                                     "config file"]
    broken = write(tmp_path / "broken.toml", "[job\n")
    (line,) = problems(path=broken)
    assert line.startswith(f"{broken}: not valid TOML:")


def test_signal_name_normalised() -> None:
    config = load_config(sets=[*BASE, "launcher.signal=sigusr1"])
    assert config.launcher.signal == "USR1"


def test_cli_exit_2_one_line_per_problem_no_traceback(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    bad = write(tmp_path / "bad.toml", '[job]\nnodez = 2\nnodes = -2\ntime = "soon"\n')
    assert cli.main(["render", "-c", str(bad)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("slurmfabric: error: ")]
    assert len(errors) == 3
    assert "Traceback" not in err


def test_error_names_the_env_var_that_supplied_the_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMFABRIC_JOB__NODES", "abc")
    (line,) = problems(sets=BASE, environment=True)
    assert line == "job.nodes: got 'abc'; accepted: an integer (from $SLURMFABRIC_JOB__NODES)"


def test_from_script_errors_are_config_errors(tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    script = write(tmp_path / "s.sh", '#!/bin/bash\n# slurmfabric-config: {"job": {"nodes": -1}}\n')
    assert cli.main(["render", "--from-script", str(script)]) == 2
    err = capsys.readouterr().err
    assert "slurmfabric: error: job.nodes: got -1; accepted: a number >= 1" in err
    assert "Traceback" not in err
