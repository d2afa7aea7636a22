"""Site-wide hooks: the TaskProlog's export lines on fixture nodes (tests/fixtures/topology/
nodes.py testbed_node, a real H100 node's shape scaled to this machine), and the
cli_filter.lua policy run by the real Lua 5.1 interpreter (Debian lua5.1; Slurm's
cli_filter/lua plugin links the same liblua5.1) against a stand-in for the ``slurm`` table
that the plugin provides. The real plugin runs it in tests/cluster/test_site_cluster.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import fakesysfs
import nodes
import pytest
from cleanenv import clean_env, python_with_prefix
from syslogsink import SyslogSink

from slurmfabric.errors import ConfigError
from slurmfabric.site import clifilter, taskprolog

CPUS = sorted(os.sched_getaffinity(0))


def task_env(tmp: Path, **extra: str) -> dict[str, str]:
    """Task 1 of a 2-node, 4-task srun step on sfn1, as slurmstepd gives it to TaskProlog
    (variables observed on the testbed, Slurm 22.05)."""
    env = clean_env(PATH=os.environ["PATH"], HOME=str(tmp), TMPDIR=str(tmp))
    env.update({
        "SLURM_JOB_ID": "77", "SLURM_PROCID": "1", "SLURM_NTASKS": "4",
        "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "sfn[1-2]",
        "SLURM_STEP_NODELIST": "sfn[1-2]", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURMD_NODENAME": "sfn1",
        "SLURMFABRIC_ALLOW_LOOPBACK": "1"})
    env.update(extra)
    return env


@pytest.fixture
def roots(tmp_path: Path) -> str:
    fakesysfs.build(nodes.testbed_node(CPUS, "InfiniBand"), tmp_path / "roots" / "sfn1")
    return str(tmp_path / "roots" / "{node}")


def exported(lines: list[str]) -> dict[str, str]:
    assert all(line.startswith("export ") for line in lines), lines
    return dict(line[len("export "):].split("=", 1) for line in lines)


def test_a_task_gets_the_plan_and_its_rank_as_literal_export_lines(tmp_path, roots) -> None:
    got = exported(taskprolog.exports(task_env(tmp_path), roots))
    assert (got["RANK"], got["LOCAL_RANK"], got["WORLD_SIZE"], got["MASTER_ADDR"]) == \
        ("1", "1", "4", "sfn1")
    assert got["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"  # the rails, not storage mlx5_2
    assert got["SLURMFABRIC_NIC"] == "mlx5_1:1"  # local rank 1's own rail
    # slurmstepd takes the value literally: no shell quotes around the marker's spaces
    assert got["SLURMFABRIC_ENV_SET"].startswith("RANK=1 LOCAL_RANK=1 ")


def test_values_the_task_has_are_never_replaced(tmp_path, roots) -> None:
    env = task_env(tmp_path, NCCL_IB_HCA="mlx5_9", MASTER_PORT="31000", RANK="1")
    got = exported(taskprolog.exports(env, roots))
    assert "NCCL_IB_HCA" not in got and "MASTER_PORT" not in got
    assert "RANK" not in got  # already the same value: nothing to print
    # A value slurmfabric set (the batch step's marker) is ours: recomputed for the step.
    env = task_env(tmp_path, MASTER_PORT="29999",
                   SLURMFABRIC_ENV_SET="MASTER_PORT=29999", SLURMFABRIC_ENV_JOB="77")
    got = exported(taskprolog.exports(env, roots))
    assert got["MASTER_PORT"] != "29999"


def test_opt_out_and_errors_export_nothing_and_never_fail(tmp_path, roots, capsys) -> None:
    for value in ("off", "0", "FALSE", "no"):
        assert taskprolog.exports(task_env(tmp_path, SLURMFABRIC_TASKPROLOG=value),
                                  roots) == []
    broken = task_env(tmp_path)
    del broken["SLURM_TASKS_PER_NODE"], broken["SLURM_STEP_TASKS_PER_NODE"]
    assert taskprolog.main(broken, roots, None, True) == 0
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("slurmfabric taskprolog: no variables set: ")
    assert len(out.err.splitlines()) == 1


def test_a_value_that_is_not_one_line_is_not_exported(tmp_path, roots) -> None:
    env = task_env(tmp_path, SLURM_JOB_ID="77\nexport LD_PRELOAD=/tmp/x.so")
    lines = taskprolog.exports(env, roots)
    assert not any("LD_PRELOAD" in line for line in lines)
    assert all("\n" not in line for line in lines)


def test_the_plan_is_made_once_per_boot_and_shared_with_launch(tmp_path, roots) -> None:
    """One cache (rank/plancache.py) for the TaskProlog, env and launch: the first task
    discovers, later tasks and the ranks launch starts read the plan back."""
    env = task_env(tmp_path, SLURMFABRIC_PLAN_CACHE=str(tmp_path / "cache"))
    first = exported(taskprolog.exports(env, roots))
    cache = tmp_path / "cache"
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    assert len(list(cache.glob("plan-*.marshal"))) == 1
    (entry,) = cache.glob("topology-*.marshal")
    # the same step's rank, through 'slurmfabric launch', finds the TaskProlog's plan
    from slurmfabric.rank import task as taskenv

    rank = taskenv.build({**env, "SLURMFABRIC_SYSFS_ROOT": roots.replace("{node}", "sfn1")})
    assert rank.plan_origin == "cache"
    assert rank.variables["NCCL_IB_HCA"] == first["NCCL_IB_HCA"]
    # A cache directory another user could write to is not trusted: discovery runs again.
    cache.chmod(0o777)
    again = taskenv.build({**env, "SLURMFABRIC_SYSFS_ROOT": roots.replace("{node}", "sfn1")})
    assert again.plan_origin.startswith("discovered; cache: ")
    assert "writable" in again.plan_origin
    assert exported(taskprolog.exports(env, roots))["NCCL_IB_HCA"] == first["NCCL_IB_HCA"]


def test_the_batch_step_gets_job_values_and_no_plan(tmp_path, roots) -> None:
    env = task_env(tmp_path, SLURM_PROCID="0", SLURM_LOCALID="0")
    del env["SLURM_STEP_ID"], env["SLURM_STEP_NODELIST"], env["SLURM_STEP_NUM_TASKS"]
    del env["SLURM_STEP_NUM_NODES"], env["SLURM_STEP_TASKS_PER_NODE"]
    env["SLURMFABRIC_PLAN_CACHE"] = str(tmp_path / "cache")
    got = exported(taskprolog.exports(env, roots))
    assert got["MASTER_ADDR"] == "sfn1" and got["NNODES"] == "2"
    assert "NCCL_IB_HCA" not in got and "RANK" not in got
    assert not (tmp_path / "cache").exists()  # nothing discovered, no cache opened


def test_the_command_line_never_fails_a_task(tmp_path, roots) -> None:
    env = task_env(tmp_path)
    cli = [sys.executable, "-m", "slurmfabric", "site", "taskprolog"]
    ok = subprocess.run([*cli, "--sysfs-root", roots], env=env, capture_output=True,
                        text=True)
    assert ok.returncode == 0 and "export NCCL_IB_HCA==mlx5_0:1,mlx5_1:1\n" in ok.stdout
    bad = subprocess.run([*cli, "--bogus"], env=env, capture_output=True, text=True)
    assert bad.returncode == 0 and bad.stdout == "" and "unknown option" in bad.stderr


# --- cli_filter ---------------------------------------------------------------------------

POLICY = """
[cli_filter]
gpu_partitions = ["gpu"]
default_partition = "gpu"
refuse_signals = ["USR1"]
require_gpus = true
[cli_filter.defaults.gpu]
requeue = true
signal = "B:USR2@120"
[cli_filter.defaults."*"]
requeue = false
[[cli_filter.refuse]]
option = "wrap"
partitions = ["gpu"]
message = "write a batch script: --wrap jobs cannot be requeued with their context"
"""

# The plugin's API as the script uses it (src/plugins/cli_filter/lua, Slurm 22.05):
# slurm.SUCCESS/ERROR, log_error/log_info with printf formats, options as a table.
HARNESS = r"""
slurm = {SUCCESS = 0, ERROR = -1}
function slurm.log_error(fmt, ...) io.write("error: " .. string.format(fmt, ...) .. "\n") end
function slurm.log_info(fmt, ...) io.write("info: " .. string.format(fmt, ...) .. "\n") end
dofile(arg[1])
local options = {}
for i = 2, #arg do
  local key, value = string.match(arg[i], "^([^=]+)=(.*)$")
  options[key] = value
end
local rc = slurm_cli_pre_submit(options, 0)
io.write("rc=" .. rc .. "\n")
for _, key in ipairs({"requeue", "no-requeue", "signal"}) do
  if options[key] ~= nil then io.write(key .. "=" .. options[key] .. "\n") end
end
"""

needs_lua = pytest.mark.skipif(shutil.which("lua5.1") is None and "CI" not in os.environ,
                               reason="lua5.1 not installed (scripts/test.sh installs it)")


def lua(tmp: Path, script: str, *options: str, env: dict | None = None) -> list[str]:
    harness = tmp / "harness.lua"
    harness.write_text(HARNESS)
    filt = tmp / "cli_filter.lua"
    filt.write_text(script)
    proc = subprocess.run(["lua5.1", str(harness), str(filt), *options], capture_output=True,
                          text=True, env=env or {"PATH": os.environ["PATH"]})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def policy(tmp: Path, text: str = POLICY) -> clifilter.Policy:
    path = tmp / "site.toml"
    path.write_text(text)
    return clifilter.load(str(path))


@needs_lua
def test_the_filter_applies_partition_defaults_the_user_did_not_give(tmp_path) -> None:
    script = clifilter.render(policy(tmp_path))
    out = lua(tmp_path, script, "type=sbatch", "requeue=unset", "signal=0@0", "gpus=8")
    assert out[0] == "info: slurmfabric policy: partition gpu: default --requeue"
    assert "rc=0" in out and "requeue=set" in out and "signal=B:USR2@120" in out
    out = lua(tmp_path, script, "type=sbatch", "partition=debug", "requeue=unset",
              "signal=0@0")
    assert "no-requeue=set" in out and "signal=0@0" in out  # the "*" defaults
    out = lua(tmp_path, script, "type=sbatch", "requeue=no-requeue", "signal=B:TERM@60",
              "gpus-per-node=8")
    assert "requeue=no-requeue" in out and "signal=B:TERM@60" in out  # the user's win


@needs_lua
def test_the_filter_refuses_with_the_sites_message(tmp_path) -> None:
    script = clifilter.render(policy(tmp_path))
    for spec in ("USR1@60", "B:USR1@90", "SIGUSR1", "10@30"):
        out = lua(tmp_path, script, "type=sbatch", f"signal={spec}", "gpus=8")
        assert "rc=-1" in out and "--signal=" + spec in out[0], (spec, out)
    out = lua(tmp_path, script, "type=sbatch", "signal=0@0")
    assert out[0] == ("error: slurmfabric policy: partition gpu is for GPU jobs: ask for "
                      "GPUs (--gpus-per-node=N, --gpus=N or --gres=gpu:N)")
    assert "rc=0" in lua(tmp_path, script, "type=sbatch", "gres=gres:gpu:4")
    out = lua(tmp_path, script, "type=sbatch", "wrap=hostname", "gpus=1")
    assert out == ["error: slurmfabric policy: --wrap is not allowed on partition gpu: write "
                   "a batch script: --wrap jobs cannot be requeued with their context",
                   "rc=-1"]
    assert "rc=0" in lua(tmp_path, script, "type=sbatch", "wrap=hostname",
                         "partition=debug")  # the rule names gpu only
    # srun inside an allocation is a step: never refused
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "5"}
    assert lua(tmp_path, script, "type=srun", "signal=USR1@5", env=env)[0] == "rc=0"


@needs_lua
def test_a_broken_policy_table_fails_open_and_says_so(tmp_path) -> None:
    script = clifilter.render(policy(tmp_path))
    start = script.index("local POLICY = ")
    end = script.index("\n", start)
    broken = script[:start] + 'local POLICY = {refuse = "oops"}' + script[end:]
    out = lua(tmp_path, broken, "type=sbatch", "gpus=1")
    assert out[-1] == "rc=0"
    assert out[0].startswith("error: slurmfabric policy: filter error, submission allowed: ")
    assert out[0].endswith("POLICY.gpu_partitions is a nil, not a table")


def test_a_bad_site_config_is_one_line_naming_the_key(tmp_path) -> None:
    cases = {
        "[cli_filter]\nrefuse_signal = [\"USR1\"]\n": "cli_filter.refuse_signal is not a "
        "known key",
        "[cli_filter.defaults.gpu]\nrequeue = \"yes\"\n": "cli_filter.defaults.gpu.requeue is "
        "'yes'",
        "[cli_filter.defaults.gpu]\nsignal = \"USR2; rm -rf /\"\n": "defaults.gpu.signal",
        "[[cli_filter.refuse]]\noption = \"wrap\"\nmessage = \"a\\nb\"\n":
        "refuse[0].message must be one printable line",
        "[[cli_filter.refuse]]\noption = \"--wrap\"\nmessage = \"m\"\n": "refuse[0].option",
        "[cli_filter]\ngpu_partitions = [\"gpu\\\"a\"]\n": "gpu_partitions has 'gpu\"a'",
        "[other]\n": "no [cli_filter] table",
    }
    for text, message in cases.items():
        with pytest.raises(ConfigError) as error:
            policy(tmp_path, text)
        assert message in str(error.value), (text, str(error.value))
        assert len(str(error.value).splitlines()) == 1


def test_strings_reach_lua_as_data(tmp_path) -> None:
    """A message with quotes, backslashes and Lua syntax is one Lua string literal."""
    text = POLICY.replace("write a batch script: --wrap jobs cannot be requeued with their "
                          "context", r'no \\\" ]] .. os.exit(3) -- \u00e9')
    script = clifilter.render(policy(tmp_path, text))
    assert "os.exit(3)" in script and '"no \\092\\034 ]] .. os.exit(3) -- ' in script
    if shutil.which("lua5.1"):
        out = lua(tmp_path, script, "type=sbatch", "wrap=x", "gpus=1")
        assert out[0].endswith('no \\" ]] .. os.exit(3) -- é') and "rc=-1" in out


def test_cli_filter_command_writes_nothing_from_a_bad_config(tmp_path, capsys) -> None:
    from slurmfabric.cli import main

    good = tmp_path / "site.toml"
    good.write_text(POLICY)
    out = tmp_path / "cli_filter.lua"
    assert main(["site", "cli-filter", "--config", str(good), "-o", str(out)]) == 0
    before = out.read_text()
    good.write_text(POLICY.replace("requeue = true", "requeue = 1"))
    assert main(["site", "cli-filter", "--config", str(good), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "cli_filter.defaults.gpu.requeue is 1" in err and "Traceback" not in err
    assert out.read_text() == before  # the running filter is untouched


def test_install_writes_the_hooks_and_prints_the_conf_lines(tmp_path, roots, capsys) -> None:
    from slurmfabric.cli import main

    site = tmp_path / "site.toml"
    site.write_text(POLICY)
    dest = tmp_path / "hooks"
    spaced = tmp_path / "sf env" / "python3"  # a path that needs quoting in the script
    spaced.parent.mkdir()
    spaced.symlink_to(python_with_prefix(tmp_path))
    assert main(["site", "install", str(dest), "--config", str(site), "--python",
                 str(spaced), "--sysfs-root", "/fix/{node}"]) == 0
    out = capsys.readouterr().out
    script = (dest / "slurmfabric-taskprolog").read_text()
    assert f"SLURMFABRIC_PYTHON='{spaced}'" in script
    assert "(sys.argv[1:]))' --sysfs-root '/fix/{node}' 2>&1 </dev/null) 2>/dev/null\n" \
        in script
    assert os.access(dest / "slurmfabric-taskprolog", os.X_OK)
    assert f"TaskProlog={dest.resolve()}/slurmfabric-taskprolog" in out
    assert "CliFilterPlugins=cli_filter/lua" in out and (dest / "cli_filter.lua").exists()
    if shutil.which("shellcheck"):
        assert subprocess.run(["shellcheck", str(dest / "slurmfabric-taskprolog")]).returncode \
            == 0
    assert main(["site", "install", str(tmp_path / "x"), "--python", "python3"]) == 2
    # The installed script itself, as slurmstepd runs it (no PATH), prints the plan. It runs
    # Python isolated (-I ignores PYTHONPYCACHEPREFIX), so this interpreter gets the bytecode
    # prefix as an -X option, which -I keeps: nothing is written into the checkout.
    python = python_with_prefix(tmp_path)
    assert main(["site", "install", str(tmp_path / "real"), "--sysfs-root", roots,
                 "--python", str(python)]) == 0
    env = {k: v for k, v in task_env(tmp_path).items() if k != "PATH"}
    ran = subprocess.run([str(tmp_path / "real" / "slurmfabric-taskprolog")], env=env,
                         capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stderr == ""
    assert "export NCCL_IB_HCA==mlx5_0:1,mlx5_1:1\n" in ran.stdout


def test_the_readme_policy_is_a_valid_site_config(tmp_path) -> None:
    import re

    readme = (Path(__file__).resolve().parents[2] / "docs" / "site.md").read_text()
    (block,) = [b for b in re.findall(r"```toml\n(.*?)```", readme, re.S)
                if b.startswith("[cli_filter]")]
    parsed = policy(tmp_path, block)
    assert parsed.refuse_signals == ["USR1"] and parsed.defaults["gpu"]["requeue"] is True
    assert parsed.refuse[0].option == "wrap" and parsed.default_partition == "gpu"


def test_a_hostile_node_name_cannot_move_the_sysfs_root(tmp_path, roots, capsys) -> None:
    for name in ("../../etc", "..", "a/b"):
        env = task_env(tmp_path, SLURMD_NODENAME=name)
        assert taskprolog.main(env, roots, None, True) == 0
        out = capsys.readouterr()
        assert out.out == "" and "cannot name a sysfs root" in out.err


# --- the TaskProlog fails open ------------------------------------------------------------

# Stand-ins for the ways an installed interpreter breaks on a node. Each prints what the real
# failure prints (CPython's last traceback line for a venv that lost slurmfabric).
BROKEN = {
    "missing": None,
    "false": "/usr/bin/false",
    "no-slurmfabric": "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
                      "echo \"ModuleNotFoundError: No module named 'slurmfabric'\" >&2\nexit 1\n",
    "signal": "#!/bin/sh\necho 'export NCCL_IB_HCA=half'\nkill -SEGV $$\n",
    "hang": "#!/bin/sh\nexec sleep 30\n",
    "hang-ignoring-term": "#!/bin/sh\ntrap '' TERM\nsleep 30\n",
    "not-a-file": "/",
}
CAUSE = {
    "missing": "is missing or not executable",
    "false": "/usr/bin/false failed (exit 1)",
    "no-slurmfabric": "failed (exit 1): ModuleNotFoundError: No module named 'slurmfabric'",
    "signal": "was killed by signal 11",
    "hang": "ran past 1 s and was stopped",
    "hang-ignoring-term": "was killed (SIGKILL",
    "not-a-file": "/ is missing or not executable",
}


def installed_with(tmp: Path, python: str, syslog: Path | None = None) -> Path:
    """The installed TaskProlog with its settings lines pointed at ``python`` (what an admin's
    edit, a removed venv or a broken upgrade leaves behind) and a 1-second time cap."""
    from slurmfabric.site import install

    text = install.taskprolog_script(str(python_with_prefix(tmp)))
    lines = [f"SLURMFABRIC_PYTHON={python}" if line.startswith("SLURMFABRIC_PYTHON=")
             else "SLURMFABRIC_TASKPROLOG_MAX_S=1"
             if line.startswith("SLURMFABRIC_TASKPROLOG_MAX_S=")
             else f"SLURMFABRIC_SYSLOG_SOCKET={syslog or tmp / 'no-syslog'}"
             if line.startswith("SLURMFABRIC_SYSLOG_SOCKET=") else line
             for line in text.splitlines()]
    script = tmp / "slurmfabric-taskprolog"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_interpreter_never_fails_the_task(tmp_path, kind) -> None:
    body = BROKEN[kind]
    if body is None:
        python = str(tmp_path / "gone" / "bin" / "python3")
    elif body.startswith("/"):
        python = body
    else:
        stub = tmp_path / "python3"
        stub.write_text(body)
        stub.chmod(0o755)
        python = str(stub)
    sink = SyslogSink(tmp_path / "log.sock")
    script = installed_with(tmp_path, python, sink.path)
    env = {k: v for k, v in task_env(tmp_path).items() if k != "PATH"}  # slurmstepd's
    ran = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=20)
    assert ran.returncode == 0 and ran.stdout == ""  # nothing half-made is exported
    assert ran.stderr.count("\n") == 1, ran.stderr  # one line, no traceback, no "Killed"
    assert ran.stderr.startswith("slurmfabric taskprolog: ")
    assert CAUSE[kind] in ran.stderr and "(fail-open)" in ran.stderr
    assert "export" not in ran.stderr
    logged = sink.lines()
    assert len(logged) == 1 and "slurmfabric-taskprolog" in logged[0], logged
    assert f"node=sfn1 job=77 step=0: {ran.stderr.strip()}" in logged[0]


def test_a_working_interpreter_exports_and_keeps_its_messages_on_stderr(tmp_path, roots,
                                                                        ) -> None:
    script = installed_with(tmp_path, str(python_with_prefix(tmp_path)))
    text = script.read_text().replace("sys.exit(taskprolog_main(sys.argv[1:]))'",
                                      f"sys.exit(taskprolog_main(sys.argv[1:]))' "
                                      f"--sysfs-root '{roots}' --bogus-later")
    script.write_text(text)
    env = {k: v for k, v in task_env(tmp_path).items() if k != "PATH"}
    ran = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60)
    # an unknown option: the Python side says so on stderr and exports nothing, exit 0
    assert ran.returncode == 0 and ran.stdout == ""
    assert "unknown option '--bogus-later'" in ran.stderr
    script.write_text(text.replace(" --bogus-later", ""))
    ran = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stderr == ""
    assert "export NCCL_IB_HCA==mlx5_0:1,mlx5_1:1\n" in ran.stdout
    assert all(line.startswith("export ") for line in ran.stdout.splitlines())


@pytest.mark.parametrize("python", ["/usr/bin/false", "stub", "/", "relative/python3"])
def test_install_refuses_an_interpreter_that_cannot_run_the_taskprolog(tmp_path, capsys,
                                                                       python) -> None:
    from slurmfabric.cli import main

    if python == "stub":  # a Python without slurmfabric, as a venv for another tool has
        stub = tmp_path / "python3"
        stub.write_text(BROKEN["no-slurmfabric"])
        stub.chmod(0o755)
        python = str(stub)
    assert main(["site", "install", str(tmp_path / "hooks"), "--python", python]) == 2
    err = capsys.readouterr().err
    assert err.startswith(("slurmfabric: error: --python " + python,
                           f"slurmfabric: error: --python {python!r}"))
    assert "Traceback" not in err
    assert not (tmp_path / "hooks" / "slurmfabric-taskprolog").exists()  # nothing written
