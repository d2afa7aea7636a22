"""Issue 31, launch side: program.setup / teardown / task_setup (code by explicit choice,
verbatim, shellchecked), [[steps]], run-time parameters and "$@", torchrun's own forms, MPI
sized by the allocation. Scripts are rendered and run by bash among fake binaries on PATH
(srun, mpirun, torchrun, slurmfabric), never mocks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cleanenv import clean_env

from slurmfabric.config import load_config
from slurmfabric.errors import ConfigError, UsageError
from slurmfabric.job import k8s
from slurmfabric.job.render import render_sbatch

REPO = Path(__file__).resolve().parents[2]

# Fake launchers: record their argv (NUL-separated, one record per line of REC), then run
# what follows their own options, the way the real ones start the ranks. The fake
# slurmfabric answers 'env' with a fixed job env and runs the real 'launch' (this checkout).
RECORD = 'printf "%s\\0" "$(basename "$0")" "$@" >> "$REC"; printf "\\n" >> "$REC"\n'
FAKES = {
    "srun": RECORD + ('export SLURM_STEP_ID=0\n'
                      'for ((i = 1; i <= $#; i++)); do case ${!i} in bash|slurmfabric|probe|'
                      'hostname) exec "${@:i}";; esac; done; exit 97'),
    "mpirun": RECORD + ('export OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_LOCAL_RANK=0 '
                        'OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_SIZE=2\n'
                        'for ((i = 1; i <= $#; i++)); do [ "${!i}" = slurmfabric ] && '
                        'exec "${@:i}"; done; exit 97'),
    "torchrun": RECORD + ('export RANK=0 LOCAL_RANK=0 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 '
                          'GROUP_RANK=0 ROLE_RANK=0 TORCHELASTIC_RUN_ID=7\n'
                          'for ((i = 1; i <= $#; i++)); do [ "${!i}" = slurmfabric ] && '
                          'exec "${@:i}"; done; exit 97'),
    "slurmfabric": RECORD + ('if [ "$1" = env ]; then echo "export MASTER_ADDR=n1 '
                             'MASTER_PORT=29500 RDZV_ID=7"; exit 0; fi\n'
                             'exec "$FAKE_PY" -m slurmfabric "$@"'),
    "probe": RECORD + 'echo "probe ran in $PWD with MARK=${MARK:-unset}" >> "$REC.log"; '
                      'exit "${PROBE_EXIT:-0}"',
    "dcgmi": RECORD,
}


@pytest.fixture
def fakes(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _config(*sets: str, launcher: str = "srun"):
    base = [f"launcher.type={launcher}", "job.nodes=2", 'program.command=["probe", "a b"]']
    base += ["launcher.nproc_per_node=2"] if launcher == "torchrun" else ["job.ntasks_per_node=2"]
    return load_config(sets=[*base, *sets], site_defaults="")


def _run(script: str, fakes: Path, tmp_path: Path, args: tuple[str, ...] = (),
         **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    path = tmp_path / "job.sh"
    path.write_text(script)
    environ = clean_env(**{
        "PATH": f"{fakes}:/usr/bin:/bin", "REC": str(tmp_path / "rec"), "FAKE_PY": sys.executable,
        "PYTHONPATH": str(REPO), "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0",
        "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4",
        "SLURM_TASKS_PER_NODE": "2(x2)", "SLURMD_NODENAME": "n1", "HOME": str(tmp_path),
        **env})
    proc = subprocess.run(["bash", str(path), *args], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=120)
    raw = (tmp_path / "rec").read_bytes() if (tmp_path / "rec").exists() else b""
    records = [line.split(b"\x00")[:-1] for line in raw.split(b"\n") if line]
    return proc, [[p.decode() for p in r] for r in records]


def _section(script: str, title: str) -> list[str]:
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"# --- {title}"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("# --- end of"))
    return lines[start + 1:end]


# --- program.setup / teardown / task_setup --------------------------------------------------

SETUP = ['echo "setup on $(hostname)" > setup.out', "export MARK=from-setup",
         'for f in *.none; do echo "$f"; done']


def test_setup_and_teardown_are_verbatim_sections_around_the_launch() -> None:
    script = render_sbatch(_config('program.setup=' + _toml(SETUP),
                                   'program.teardown=["dcgmi profile --resume"]'))
    assert _section(script, "program.setup (verbatim)") == SETUP
    assert _section(script, "program.teardown (verbatim)") == ["dcgmi profile --resume"]
    lines = script.splitlines()
    order = [next(i for i, line in enumerate(lines) if line.startswith(mark)) for mark in (
        'eval "$slurmfabric_job_env"', "# --- program.setup", "# --- launch",
        "# --- program.teardown")]
    assert order == sorted(order)


def _toml(items: list[str]) -> str:
    import json

    return json.dumps(items)


def test_setup_runs_in_the_batch_shell_and_teardown_after_success(fakes: Path,
                                                                  tmp_path: Path) -> None:
    config = _config("program.setup=" + _toml(SETUP),
                     'program.teardown=["dcgmi profile --resume"]')
    proc, records = _run(render_sbatch(config), fakes, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "setup.out").read_text().startswith("setup on ")
    names = [r[0] for r in records]
    assert names.index("probe") < names.index("dcgmi")
    # the batch shell's export reaches the task (srun passes the environment)
    assert "MARK=from-setup" in (tmp_path / "rec.log").read_text()


@pytest.mark.parametrize("on_failure, teardown_ran", [(True, True), (False, False)])
def test_teardown_after_a_failed_launch_only_when_asked(fakes: Path, tmp_path: Path,
                                                        on_failure: bool,
                                                        teardown_ran: bool) -> None:
    config = _config('program.teardown=["dcgmi profile --resume"]',
                     f"program.teardown_on_failure={str(on_failure).lower()}")
    proc, records = _run(render_sbatch(config), fakes, tmp_path, PROBE_EXIT="3")
    assert proc.returncode == 3, proc.stderr  # the launch's exit code, either way
    assert ("dcgmi" in [r[0] for r in records]) is teardown_ran


def test_teardown_with_an_exec_launcher_still_runs(fakes: Path, tmp_path: Path) -> None:
    """mpirun is exec'd without a teardown; with one, the exec stays inside a subshell."""
    config = _config('program.teardown=["dcgmi profile --resume"]', launcher="mpirun")
    proc, records = _run(render_sbatch(config), fakes, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [r[0] for r in records][-1] == "dcgmi"


@pytest.mark.parametrize("launcher", ["srun", "srun-pmix", "mpirun", "torchrun", "nccl-tests"])
def test_task_setup_runs_in_every_task_before_the_program(fakes: Path, tmp_path: Path,
                                                          launcher: str) -> None:
    sets = ['program.task_setup=["export MARK=from-task-setup", "cd /"]']
    if launcher == "nccl-tests":
        (fakes / "all_reduce_perf").symlink_to(fakes / "probe")
        sets = ['program.command=[]', *sets]
    config = _config(*sets, launcher=launcher)
    script = render_sbatch(config)
    assert _section(script, "program.task_setup") == [
        "sf_task_setup=$(cat <<'SLURMFABRIC_TASK_SETUP_END'", "export MARK=from-task-setup",
        "cd /", "SLURMFABRIC_TASK_SETUP_END", ")"]
    proc, records = _run(script, fakes, tmp_path)
    assert proc.returncode == 0, proc.stderr
    probe = [r for r in records if r[0] in ("probe", "all_reduce_perf")]
    assert probe, records
    if launcher != "nccl-tests":
        assert probe[0][1:] == ["a b"]  # argv untouched by the code
    assert "in / with MARK=from-task-setup" in (tmp_path / "rec.log").read_text()


def test_launch_setup_keeps_the_argv_as_data(tmp_path: Path) -> None:
    """'slurmfabric launch --setup CODE -- CMD': CODE runs, CMD's words are not code."""
    canary = tmp_path / "pwned"
    env = clean_env(**{"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "SLURM_PROCID": "0",
                     "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "SLURM_NNODES": "1",
                     "SLURM_JOB_ID": "7", "SLURM_NODEID": "0", "SLURMD_NODENAME": "n1",
                     "SLURM_STEP_ID": "0",
                     "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_NUM_NODES": "1",
                     "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1",
                     "MASTER_ADDR": "n1", "MASTER_PORT": "29500"})
    out = subprocess.run(
        [sys.executable, "-m", "slurmfabric", "launch", "--no-plan", "--mode", "srun",
         "--setup", "set -- injected; X=set-by-setup", "--", "bash", "-c",
         'printf "%s|" "$X" "$@"', "name", f"$(touch {canary})", "two words"],
        env={**env, "X": "old"}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"set-by-setup|$(touch {canary})|two words|"
    assert not canary.exists()


@pytest.mark.parametrize("field", ["setup", "teardown", "task_setup"])
def test_a_shellcheck_error_refuses_the_config_naming_field_and_code(field: str) -> None:
    assert shutil.which("shellcheck"), "shellcheck missing: apt-get install shellcheck"
    config = _config(f'program.{field}=["if [ -f x]; then echo y; fi"]')
    with pytest.raises(ConfigError) as err:
        render_sbatch(config)
    text = "\n".join(err.value.problems)
    assert f"program.{field}: ShellCheck SC1020 (error)" in text


def test_without_shellcheck_a_warning_not_an_error(tmp_path: Path, monkeypatch) -> None:
    from slurmfabric.job import usercode

    monkeypatch.setenv("PATH", str(tmp_path))  # no shellcheck here
    config = _config('program.setup=["if [ -f x]; then echo y; fi"]')
    assert usercode.check_code(config) == [usercode.SHELLCHECK_MISSING]
    assert "# --- program.setup" in render_sbatch(config)


@pytest.mark.parametrize("line, says", [
    ("#SBATCH --exclusive", "#SBATCH directive"),
    ("  #sbatch --nodes=9", "#SBATCH directive"),
    ("SLURMFABRIC_TASK_SETUP_END", "marker"),
    ("echo a\necho b", "line break"),
])
def test_code_lines_that_would_change_the_script_are_refused(line: str, says: str) -> None:
    import json

    with pytest.raises(ConfigError) as err:
        _config(f"program.task_setup={json.dumps([line])}")
    text = "\n".join(err.value.problems)
    assert "program.task_setup" in text and says in text


@pytest.mark.parametrize("field", ["setup", "teardown", "task_setup"])
def test_kubernetes_refuses_the_code_fields(field: str) -> None:
    config = load_config(sets=["launcher.type=torchrun", "program.container_image=img:1",
                               "job.gpus_per_node=8", 'program.command=["python", "t.py"]',
                               f'program.{field}=["echo hi"]'], site_defaults="")
    with pytest.raises(UsageError, match=f"program.{field} has no Kubernetes form"):
        k8s.build(config, "pytorchjob")


def test_teardown_is_refused_with_resume() -> None:
    with pytest.raises(ConfigError, match="program.teardown: cannot run with launcher.resume"):
        _config('program.teardown=["echo bye"]', 'launcher.resume.events=["timeout"]',
                "job.time=60")


def test_rendered_scripts_with_code_pass_shellcheck(tmp_path: Path) -> None:
    assert shutil.which("shellcheck"), "shellcheck missing: apt-get install shellcheck"
    paths = []
    for i, launcher in enumerate(["srun", "mpirun", "torchrun"]):
        config = _config("program.setup=" + _toml(SETUP), 'program.task_setup=["umask 022"]',
                         'program.teardown=["echo finished"]', "program.teardown_on_failure=true",
                         'program.params={q = "a\'b\\"c", w = "x y"}', "program.pass_args=true",
                         'steps=[{name = "s", when = "after", command = ["echo", "it\'s"]}]',
                         launcher=launcher)
        paths.append(tmp_path / f"{i}.sh")
        paths[-1].write_text(render_sbatch(config))
    proc = subprocess.run(["shellcheck", "-s", "bash", *map(str, paths)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout



# --- [[steps]] ------------------------------------------------------------------------------

STEPS = ('steps=[{name = "probe", command = ["probe", "before; touch x"]}, '
         '{name = "gen", when = "after", nodes = 1, ntasks_per_node = 3, '
         'container_image = "img#tag", srun_args = ["--mpi=none"], command = ["probe", "$y"]}]')


def test_steps_render_as_srun_lines_with_their_own_layout() -> None:
    script = render_sbatch(_config(STEPS))
    lines = script.splitlines()
    before = lines.index("# --- step probe (before the launch) ---")
    after = lines.index("# --- step gen (after the launch) ---")
    assert before < lines.index("# --- launch (srun) ---") < after
    assert lines[before + 1] == ('srun --job-name=probe --nodes="$SLURM_NNODES" '
                                 '--ntasks="$((SLURM_NNODES * 1))" --ntasks-per-node=1 '
                                 '--kill-on-bad-exit=1 \\')
    assert lines[before + 2] == "  probe 'before; touch x'"
    assert lines[after + 1] == ("srun --job-name=gen --nodes=1 --ntasks=3 --ntasks-per-node=3 "
                                "--kill-on-bad-exit=1 --container-image='img#tag' --mpi=none \\")
    assert lines[after + 2] == "  probe '$y'"


def test_steps_run_in_order_and_after_steps_only_after_success(fakes: Path,
                                                               tmp_path: Path) -> None:
    config = _config(STEPS, 'program.teardown=["dcgmi x"]', "program.teardown_on_failure=true",
                     launcher="mpirun")
    script = render_sbatch(config)
    proc, records = _run(script, fakes, tmp_path)
    assert proc.returncode == 0, proc.stderr
    probes = [r[1:] for r in records if r[0] == "probe"]
    assert probes == [["before; touch x"], ["a b"], ["$y"]]
    assert records[-1][0] == "dcgmi" and not (tmp_path / "x").exists()
    (tmp_path / "rec").unlink()
    proc, records = _run(script, fakes, tmp_path, PROBE_EXIT="5")
    assert proc.returncode == 5  # the before step failed: set -e stops there
    assert [r[0] for r in records if r[0] in ("probe", "mpirun", "dcgmi")] == ["probe"]


@pytest.mark.parametrize("sets, says", [
    (['steps=[{name = "a", nodes = 3, command = ["x"]}]'], "steps[0].nodes: 3 is more than"),
    (['steps=[{name = "a", command = ["x"]}, {name = "a", command = ["y"]}]'],
     "steps[1].name: 'a' names more than one step"),
    (['steps=[{name = "a", command = ["-x"]}]'], "starts with '-'"),
    (['steps=[{name = "a b", command = ["x"]}]'], "step name 'a b' is not accepted"),
    (['steps=[{name = "a", when = "after", command = ["x"]}]',
      'launcher.resume.events=["timeout"]', "job.time=60"], "steps[0].when: 'after' cannot"),
])
def test_bad_steps_are_refused_naming_the_step(sets: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(*sets)
    assert says in "\n".join(err.value.problems)


def test_kubernetes_refuses_steps() -> None:
    config = load_config(sets=["launcher.type=torchrun", "program.container_image=img:1",
                               "job.gpus_per_node=8", 'program.command=["python", "t.py"]',
                               'steps=[{name = "a", command = ["x"]}]'], site_defaults="")
    with pytest.raises(UsageError, match="steps has no Kubernetes form"):
        k8s.build(config, "pytorchjob")


# --- program.params, program.pass_args, submit --param / -- ARGS ------------------------------

PARAMS = ['program.command=["probe", "--lr=${lr}", "${DATA}/x", "${nope}", "$(touch pwned)"]',
          'program.params={lr = 3e-4, DATA = "/data set"}']


def test_params_have_defaults_and_expand_only_in_their_own_name(fakes: Path,
                                                                tmp_path: Path) -> None:
    script = render_sbatch(_config(*PARAMS))
    assert "probe --lr=\"${lr}\" \"${DATA}\"/x '${nope}' '$(touch pwned)'" in script
    proc, records = _run(script, fakes, tmp_path)
    assert proc.returncode == 0, proc.stderr
    probe = [r[1:] for r in records if r[0] == "probe"]
    assert probe == [["--lr=0.0003", "/data set/x", "${nope}", "$(touch pwned)"]]
    assert not (tmp_path / "pwned").exists()
    (tmp_path / "rec").unlink()
    proc, records = _run(script, fakes, tmp_path, lr="1e-3,x", DATA="")  # sbatch --export
    probe = [r[1:] for r in records if r[0] == "probe"]
    assert probe == [["--lr=1e-3,x", "/x", "${nope}", "$(touch pwned)"]]


def test_pass_args_appends_the_scripts_own_arguments(fakes: Path, tmp_path: Path) -> None:
    for launcher in ("srun", "mpirun", "torchrun"):
        script = render_sbatch(_config("program.pass_args=true", launcher=launcher))
        proc, records = _run(script, fakes, tmp_path, ("--epochs", "2 3", "$(touch pwned)"))
        assert proc.returncode == 0, proc.stderr
        assert [r[1:] for r in records if r[0] == "probe"][-1] == [
            "a b", "--epochs", "2 3", "$(touch pwned)"], launcher
    without = render_sbatch(_config())
    assert '"$@"' not in without.split("# --- launch")[1]


@pytest.mark.parametrize("name", ["PATH", "SLURM_NNODES", "1x", "a-b", "sf_bin", "RANK"])
def test_param_names_that_would_fight_the_shell_or_slurm_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="program.params"):
        _config(f'program.params={{"{name}" = "1"}}')


def test_param_declared_dollar_forms_are_not_warned_about() -> None:
    from slurmfabric.job.expansion import lookalikes

    warned = "\n".join(lookalikes(_config(*PARAMS)))
    assert "command[3]" in warned and "command[4]" in warned
    assert "command[1]" not in warned and "command[2]" not in warned


SBATCH = ('#!/bin/bash\nprintf "%s\\0" "$@" > "$REC.argv"; printf "%s" "${lr-unset}" > '
          '"$REC.lr"\nfor a; do [ -f "$a" ] && cp "$a" "$REC.script"; done\n'
          '[ -t 0 ] || cat > "$REC.stdin"\necho 42\n')


def test_submit_carries_params_in_the_environment_and_args_after_the_script(
        tmp_path: Path, monkeypatch) -> None:
    from slurmfabric.job import submit

    (tmp_path / "sbatch").write_text(SBATCH)
    (tmp_path / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("REC", str(tmp_path / "rec"))
    config = _config(*PARAMS, "program.pass_args=true")
    request = submit.build_request(config, params={"lr": "1e-3,2"}, script_args=["a b", "-x"])
    assert request.command() == ["sbatch", "--parsable", "--export=ALL,lr", "SCRIPT", "a b",
                                 "-x"]
    assert "# command: lr=1e-3,2 sbatch --parsable --export=ALL,lr SCRIPT 'a b' -x\n" in \
        request.describe()
    assert submit.submit(request) == "42"
    argv = (tmp_path / "rec.argv").read_bytes().split(b"\0")[:-1]
    assert [a.decode() for a in argv[:2]] == ["--parsable", "--export=ALL,lr"]
    assert [a.decode() for a in argv[3:]] == ["a b", "-x"]
    assert (tmp_path / "rec.lr").read_text() == "1e-3,2"
    assert (tmp_path / "rec.script").read_text() == request.script
    assert not Path(argv[2].decode()).exists()  # the temporary script is gone


def test_submit_without_params_still_uses_stdin(tmp_path: Path, monkeypatch) -> None:
    from slurmfabric.job import submit

    request = submit.build_request(_config())
    assert request.command() == ["sbatch", "--parsable"]
    assert request.environment() is None


@pytest.mark.parametrize("argv, says", [
    (["--param", "lr=1"], "--param lr: not declared in program.params"),
    (["--", "x"], "arguments after -- reach the program only with program.pass_args"),
    (["--param", "oops"], "--param 'oops' is not NAME=VALUE"),
])
def test_submit_refuses_undeclared_params_and_unwanted_args(argv: list[str], says: str,
                                                            tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[launcher]\ntype = "srun"\n[job]\nntasks_per_node = 1\n'
                   '[program]\ncommand = ["probe"]\n')
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "submit", "-c", str(job),
                           "--site-defaults", "", "--dry-run", *argv],
                          env=clean_env(PYTHONPATH=str(REPO), PATH="/usr/bin:/bin"),
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("field", ['program.params={x = "1"}', "program.pass_args=true"])
def test_kubernetes_refuses_params_and_pass_args(field: str) -> None:
    config = load_config(sets=["launcher.type=torchrun", "program.container_image=img:1",
                               "job.gpus_per_node=8", 'program.command=["python", "t.py"]',
                               field], site_defaults="")
    with pytest.raises(UsageError, match="has no Kubernetes form"):
        k8s.build(config, "pytorchjob")


# --- torchrun as people write it --------------------------------------------------------------

def test_torchrun_as_a_command_list_with_its_own_options(fakes: Path, tmp_path: Path) -> None:
    (fakes / "python").symlink_to(fakes / "torchrun")
    config = _config('launcher.torchrun=["python", "-m", "torch.distributed.run"]',
                     'launcher.torchrun_args=["--tee", "3", "--log-dir=/tmp/l x", "-r3", '
                     '"--local-ranks-filter=0"]', launcher="torchrun")
    proc, records = _run(render_sbatch(config), fakes, tmp_path)
    assert proc.returncode == 0, proc.stderr
    (agent,) = [r for r in records if r[0] == "python"]
    assert agent[1:4] == ["-m", "torch.distributed.run", "--rdzv-conf=is_host=1"]
    tail = agent[agent.index("--rdzv-id=7") + 1:]
    assert tail[:6] == ["--tee", "3", "--log-dir=/tmp/l x", "-r3", "--local-ranks-filter=0",
                        "--no-python"]
    assert [r[1:] for r in records if r[0] == "probe"] == [["a b"]]


def test_torchrun_as_one_word_still_works_and_words_with_spaces_are_refused() -> None:
    assert _config("launcher.torchrun=/opt/t/torchrun",
                   launcher="torchrun").launcher.torchrun == ["/opt/t/torchrun"]
    with pytest.raises(ConfigError) as err:
        _config("launcher.torchrun=python -m torch.distributed.run", launcher="torchrun")
    (line,) = err.value.problems
    assert line.startswith("launcher.torchrun: ") and \
        'launcher.torchrun = ["python", "-m", "torch.distributed.run"]' in line


@pytest.mark.parametrize("args, says", [
    (["--nnodes=4"], "--nnodes is set by job.nodes"),
    (["--nproc_per_node", "8"], "--nproc_per_node is set by launcher.nproc_per_node"),
    (["--rdzv-endpoint=x:1"], "--rdzv-endpoint is set by launcher.rendezvous"),
    (["--standalone"], "--standalone is set by"),
    (["--no-python"], "--no-python is set by slurmfabric"),
    (["-m"], "-m is set by program.command"),
    (["--tea", "3"], "'--tea' is not a torchrun option"),
    (["--max-restart=3"], "'--max-restart=3' is not a torchrun option"),
    (["--role"], "--role needs a value"),
])
def test_torchrun_args_are_checked_against_torchruns_options(args: list[str],
                                                             says: str) -> None:
    import json

    with pytest.raises(ConfigError) as err:
        _config(f"launcher.torchrun_args={json.dumps(args)}", launcher="torchrun")
    text = "\n".join(err.value.problems)
    assert "launcher.torchrun_args: " in text and says in text


def test_max_restarts_belongs_to_resume_when_it_restarts_workers() -> None:
    _config('launcher.torchrun_args=["--max-restarts=2"]', launcher="torchrun")  # accepted
    with pytest.raises(ConfigError, match="set by launcher.resume.max_restarts"):
        _config('launcher.torchrun_args=["--max-restarts=2"]', "job.time=60",
                'launcher.resume.events=["worker_fail"]', launcher="torchrun")


def test_torchrun_args_only_with_torchrun() -> None:
    with pytest.raises(ConfigError, match="launcher.torchrun_args: only used by torchrun"):
        _config('launcher.torchrun_args=["--tee=3"]')


def test_a_python_script_first_under_torchrun_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        _config('program.command=["train.py", "--lr", "1"]', launcher="torchrun")
    text = "\n".join(err.value.problems)
    assert "program.command: 'train.py' is a Python script" in text
    assert "[\"python\", 'train.py', ...]" in text
    # other launchers exec the script itself (its shebang), as srun and mpirun would
    _config('program.command=["train.py"]')


def test_kubernetes_torchrun_command_uses_the_configured_words() -> None:
    config = load_config(sets=["launcher.type=torchrun", "program.container_image=img:1",
                               "job.gpus_per_node=8", 'program.command=["python", "t.py"]',
                               'launcher.torchrun=["python", "-m", "torch.distributed.run"]',
                               'launcher.torchrun_args=["--tee=3"]'], site_defaults="")
    text = str(k8s.build(config, "pytorchjob"))
    assert "'python', '-m', 'torch.distributed.run', '--tee=3', '--no-python'" in text


# --- MPI sized by the allocation, user mapping, no binding, the cluster's MPI default -----------

def _mpirun_argv(records: list[list[str]]) -> list[str]:
    (call,) = [r for r in records if r[0] == "mpirun"]
    return call[1:call.index("slurmfabric")]


def test_mpirun_takes_the_rank_count_from_the_allocation(fakes: Path, tmp_path: Path) -> None:
    """Rendered for 2 nodes, submitted with sbatch -N8: one rank per task slot on 8 nodes."""
    script = render_sbatch(_config(launcher="mpirun"))
    assert "#SBATCH --nodes=2" in script
    proc, records = _run(script, fakes, tmp_path, SLURM_NNODES="8", SLURM_JOB_NUM_NODES="8",
                         SLURM_JOB_NODELIST="n[1-8]")
    assert proc.returncode == 0, proc.stderr
    assert _mpirun_argv(records) == ["-np", "16", "--map-by", "ppr:2:node", "--bind-to", "none"]


@pytest.mark.parametrize("args", [["--rankfile", "rf"], ["-rf", "rf"], ["--map-by=slot"],
                                  ["-npernode", "2"], ["--map-by", "ppr:1:numa"]])
def test_no_forced_map_by_when_the_user_maps(fakes: Path, tmp_path: Path,
                                             args: list[str]) -> None:
    import json

    script = render_sbatch(_config(f"launcher.mpirun_args={json.dumps(args)}",
                                   launcher="mpirun"))
    proc, records = _run(script, fakes, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _mpirun_argv(records) == ["-np", "4", "--bind-to", "none", *args]


@pytest.mark.parametrize("arg", ["-np", "-n", "--np=4"])
def test_a_fixed_rank_count_in_mpirun_args_is_refused(arg: str) -> None:
    with pytest.raises(ConfigError, match="launcher.mpirun_args: .* sets the rank count"):
        _config(f'launcher.mpirun_args=["{arg}", "4"]', launcher="mpirun")


@pytest.mark.parametrize("launcher", ["srun", "srun-pmix", "torchrun", "mpirun"])
def test_bind_false_reaches_launch_and_srun(fakes: Path, tmp_path: Path,
                                            launcher: str) -> None:
    script = render_sbatch(_config("launcher.bind=false", launcher=launcher))
    proc, records = _run(script, fakes, tmp_path)
    assert proc.returncode == 0, proc.stderr
    (launch,) = [r for r in records if r[0] == "slurmfabric" and "launch" in r]
    assert "--no-bind" in launch[:launch.index("--")]
    if launcher != "mpirun":
        main = [r for r in records if r[0] == "srun"][-1]
        assert "--cpu-bind=none" in main
    bound = render_sbatch(_config(launcher=launcher))
    assert "--no-bind" not in bound and "--cpu-bind=none" not in bound


def test_bind_false_leaves_a_users_cpu_bind_alone() -> None:
    script = render_sbatch(_config("launcher.bind=false",
                                   'launcher.srun_args=["--cpu-bind=cores"]'))
    assert "--cpu-bind=none" not in script and "--cpu-bind=cores" in script


def test_nccl_tests_mpi_default_sends_no_mpi_option() -> None:
    script = render_sbatch(_config('program.command=[]', "launcher.nccl_tests.mpi=default",
                                   launcher="nccl-tests"))
    launch = script.split("# --- launch")[1]
    assert 'srun --nodes="$SLURM_NNODES" --ntasks-per-node=2 --kill' in launch
    assert "--mpi" not in launch
    assert "srun --mpi=pmix " in render_sbatch(_config('program.command=[]',
                                                       launcher="nccl-tests"))


def test_the_docs_block_renders_what_it_says(tmp_path: Path) -> None:
    """docs/launch.md's setup/steps/params example, loaded as written: it renders, passes
    ShellCheck and puts each part where the page says."""
    import re

    text = (REPO / "docs" / "launch.md").read_text()
    block = re.search(r"```toml\n(\[launcher\]\ntype = \"torchrun\".*?)```", text, re.S)
    job = tmp_path / "job.toml"
    job.write_text("[job]\nnodes = 2\ngpus_per_node = 8\n" + block.group(1))
    script = render_sbatch(load_config(str(job), site_defaults=""))
    assert _section(script, "program.setup (verbatim)") == [
        "set -x", 'echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"']
    assert "[ -n \"${lr+set}\" ] || lr=3e-4" in script
    assert "  3 python -m torch.distributed.run --nnodes=" in script
    assert ' --tee 3 --log-dir logs --no-python' in script
    assert ('launch --mode torchrun --setup "$sf_task_setup" -- python train.py --lr "${lr}" '
            '--epochs "${epochs}" "$@"') in script
    assert "# --- step hosts (before the launch) ---" in script
    assert "# --- step collect (after the launch) ---" in script
    assert script.rstrip().endswith('exit "$sf_launch_rc"')
    (tmp_path / "job.sh").write_text(script)
    if shutil.which("shellcheck"):
        lint = subprocess.run(["shellcheck", "-S", "warning", str(tmp_path / "job.sh")],
                              capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout


def test_the_launch_part_alone_defines_its_task_setup(fakes: Path, tmp_path: Path) -> None:
    """render_launch (the generator API) is self-contained: it carries the task setup it
    passes to 'slurmfabric launch --setup'; the whole script defines it once."""
    from slurmfabric.job.render import render_launch

    config = _config('program.task_setup=["export MARK=alone"]')
    launch = render_launch(config)
    assert launch.startswith("# --- program.task_setup")
    assert render_sbatch(config).count("sf_task_setup=") == 1
    head = 'set -euo pipefail\nexport MASTER_ADDR=n1 MASTER_PORT=29500 RDZV_ID=7\n'
    proc, _ = _run(head + launch, fakes, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "MARK=alone" in (tmp_path / "rec.log").read_text()


def test_a_dollar_in_a_step_argument_is_named() -> None:
    from slurmfabric.job.expansion import lookalikes

    warned = lookalikes(_config('steps=[{name = "a", command = ["echo", "$HOSTNAME"]}]'))
    assert any(line.startswith("steps[0].command[1]: '$HOSTNAME' reaches the step as literal")
               for line in warned), warned


def test_pass_args_is_refused_with_chained_resume() -> None:
    with pytest.raises(ConfigError, match="program.pass_args: launcher.resume.mode = 'chain'"):
        _config("program.pass_args=true", 'launcher.resume.events=["timeout"]', "job.time=60",
                "launcher.resume.mode=chain")
    _config("program.pass_args=true", 'launcher.resume.events=["timeout"]', "job.time=60")


def test_params_from_the_environment_keep_their_spelling(monkeypatch) -> None:
    """SLURMFABRIC_PROGRAM__PARAMS__DATA_DIR declares DATA_DIR, not data_dir (found by the
    hostile suite: ${DATA_DIR} then stayed literal)."""
    monkeypatch.setenv("SLURMFABRIC_PROGRAM__PARAMS__DATA_DIR", "/d")
    assert load_config(sets=["launcher.type=srun", "job.ntasks_per_node=1",
                             'program.command=["probe"]'],
                       site_defaults="",
                       environment=True).program.params == {"DATA_DIR": "/d"}


def test_the_launch_part_alone_shellchecks_its_task_setup() -> None:
    from slurmfabric.job.render import render_launch

    assert shutil.which("shellcheck"), "shellcheck missing: apt-get install shellcheck"
    with pytest.raises(ConfigError, match="program.task_setup: ShellCheck SC1020"):
        render_launch(_config('program.task_setup=["if [ -f x]; then echo y; fi"]'))
