"""Property test: hostile program arguments, environment values and paths reach the program
byte for byte when the rendered script runs under bash.

srun, torchrun, mpirun and slurmfabric are replaced by stubs that drop their own options
and exec the rest, so what is tested is exactly the quoting bash sees in the script.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmfabric.config import load_config
from slurmfabric.errors import ConfigError
from slurmfabric.job.render import render_sbatch

MAX_EXAMPLES = 200

PROBE = (
    "import json, os, sys\n"
    "names = os.environ['PROBE_NAMES'].split(',') if os.environ['PROBE_NAMES'] else []\n"
    "with open(os.environ['PROBE_OUT'], 'w', encoding='utf-8', errors='surrogateescape') as f:\n"
    "    json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd(),\n"
    "               'env': {n: os.environ.get(n) for n in names}}, f)\n"
)

STUBS = {
    # srun/torchrun: drop their own --options (all in --opt=value form), exec the rest
    "srun": 'while [ "${1#-}" != "$1" ]; do shift; done; exec "$@"',
    "torchrun": 'while [ "${1#-}" != "$1" ]; do shift; done; exec "$@"',
    # mpirun -np N --map-by X [--bind-to Y] PROGRAM...
    "mpirun": 'while case "$1" in -np|--map-by|--bind-to) true;; *) false;; esac; do shift 2;'
              ' done; exec "$@"',
    # slurmfabric env -> job-level exports; slurmfabric launch ... -- CMD -> exec CMD
    "slurmfabric": (
        'if [ "$1" = env ]; then\n'
        '  echo "export MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 RDZV_ID=sf-7"; exit 0\nfi\n'
        'while [ "$1" != -- ]; do shift; done; shift; exec "$@"'
    ),
}

NASTY = [
    "", " ", "a b'c\"$(touch {canary})", "`touch {canary}`", "$HOME", "${PATH}", "\\", "'",
    '"', "\n", "-", "--", "--help", "*", "~", "!!", "; touch {canary}", "| cat", "&", "#x",
    "$'\\x41'", "é中\U0001f600", "\t\r\x1b[31m", "a=b", "%s%n",
]

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=40)


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A space and a quote in the directory: the slurmfabric path must be quoted too.
    root = tmp_path_factory.mktemp("stubs") / "my stubs 'x'"
    root.mkdir()
    for name, body in STUBS.items():
        path = root / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)
    return root


@settings(max_examples=MAX_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    launcher=st.sampled_from(["torchrun", "srun", "srun-pmix", "mpirun"]),
    args=st.lists(st.one_of(st.sampled_from(NASTY), text), max_size=6),
    env=st.dictionaries(st.from_regex(r"\AHX_[A-Z0-9_]{1,8}\Z"),
                        st.one_of(st.sampled_from(NASTY), text), max_size=4),
    workdir=st.one_of(st.none(), st.sampled_from(NASTY[2:6]), text),
)
def test_hostile_values_arrive_byte_for_byte(stub_dir: Path, tmp_path_factory, launcher: str,
                                             args: list[str], env: dict[str, str],
                                             workdir: str | None) -> None:
    base = tmp_path_factory.mktemp("run")
    canary = base / "pwned"
    args = [a.replace("{canary}", str(canary)) for a in args]
    env = {k: v.replace("{canary}", str(canary)) for k, v in env.items()}
    workdir_path = None
    if workdir is not None:
        name = workdir.replace("/", "_").replace("{canary}", "c")
        if name not in ("", ".", "..") and len(name.encode()) < 200:
            workdir_path = base / name
            workdir_path.mkdir()
    sets = [f"launcher.type={launcher}", "job.nodes=2",
            f"launcher.slurmfabric={stub_dir / 'slurmfabric'}",
            # a path with spaces goes as a list: a string is one word (launcher.torchrun)
            f"launcher.torchrun={json.dumps([str(stub_dir / 'torchrun')])}",
            f"launcher.mpirun={stub_dir / 'mpirun'}"]
    sets.append("launcher.nproc_per_node=2" if launcher == "torchrun" else "job.ntasks_per_node=2")
    refused = _refused(args, env, workdir_path)
    if refused:  # the text rules of slurmfabric/_common/textcheck.py: a clear error, never a script
        with pytest.raises(ConfigError) as error:
            _config(sets, args, env, workdir_path)
        assert refused in str(error.value), (refused, str(error.value))
        return
    config = _config(sets, args, env, workdir_path)
    script = base / "job.sh"
    script.write_text(render_sbatch(config))
    out = base / "probe.json"
    run_env = {"PATH": f"{stub_dir}:/usr/bin:/bin", "SLURM_NNODES": "2", "SLURM_JOB_ID": "7",
               "PROBE_OUT": str(out), "PROBE_NAMES": ",".join(env), "LANG": "C.UTF-8"}
    proc = subprocess.run(["bash", str(script)], env=run_env, cwd=base, capture_output=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    got = json.loads(out.read_text(encoding="utf-8", errors="surrogateescape"))
    assert got["argv"] == args
    assert got["env"] == env
    if workdir_path is not None:
        assert got["cwd"] == str(workdir_path)
    assert not canary.exists()


def _refused(args: list[str], env: dict[str, str], workdir: Path | None) -> str | None:
    """The field the text rules must refuse, or None when every value may pass."""
    from slurmfabric._common.textcheck import problem

    for i, arg in enumerate(args, start=5):  # after python -I -S -c PROBE
        if problem(arg, "free"):
            return f"program.command[{i}]"
    for name, value in env.items():
        if problem(value, "free"):
            return f"program.env.{name}"
    if workdir is not None and problem(str(workdir), "strict"):
        return "program.workdir"
    return None


def _config(sets: list[str], args: list[str], env: dict[str, str], workdir: Path | None):
    """A validated config with the hostile values set the way a TOML file would set them."""
    from slurmfabric.config import JobConfig

    data = load_config(sets=[*sets, 'program.command=["x"]']).model_dump()
    data["program"].update(command=[sys.executable, "-I", "-S", "-c", PROBE, *args], env=env,
                           workdir=str(workdir) if workdir else None)
    return JobConfig.model_validate(data)


def test_probe_detects_a_quoting_bug(stub_dir: Path, tmp_path: Path) -> None:
    """The harness itself must fail on a broken script (an unquoted argument)."""
    out = tmp_path / "probe.json"
    script = tmp_path / "bad.sh"
    script.write_text(f"{sys.executable} -I -S -c {shlex.quote(PROBE)} a b\n")  # "a b" unquoted
    subprocess.run(["bash", str(script)], env={"PROBE_OUT": str(out), "PROBE_NAMES": "",
                                               "PATH": os.environ["PATH"]}, check=True)
    assert json.loads(out.read_text())["argv"] == ["a", "b"]  # two words, not "a b"
