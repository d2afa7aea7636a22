"""Issue 47: every script of the real-script corpus (tests/corpus) through ``import``, the
loader, ``render`` and the check on real Slurm, on a testbed of its own.

Each script is a test: its result (tests/corpus/run_corpus.py) must be the one the table in
docs/import.md states (so the table cannot go stale), and it must be honest: ``import``
exits 0 only when the config loads, renders and runs the same job on Slurm; 1 with what is
left to fix; 2 refused. A changed result fails until the table row is regenerated
(``python tests/corpus/run_corpus.py --update``).

The testbed is its own (module scope), so that its nodes can declare the CPUs real GPU nodes
have (8 tasks of 12 CPUs per node) without touching the session testbed:
``$SLURMFABRIC_CORPUS_TESTBED_DIR`` (default ``<testbed dir>-corpus``),
``$SLURMFABRIC_CORPUS_PORTS`` ("CTLD,NODE_BASE", default "17617,17701"),
``$SLURMFABRIC_CORPUS_ADDR_PREFIX`` (127.0.79.), ``$SLURMFABRIC_CORPUS_PREFIX`` (sfc).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmfabric.testbed import Settings, Testbed, default_state_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "corpus"))
import run_corpus  # noqa: E402 - the corpus runner, from the directory just added

pytestmark = pytest.mark.cluster
CORPUS_CPUS = 256  # declared (config_overrides): 8 tasks x 32 CPUs fit on one node
_ROWS: dict[str, run_corpus.Row] = {}
_TIME: dict[str, float] = {}


def _documented() -> dict[str, str]:
    rows = {}
    for line in run_corpus.documented().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[cells[0].strip("`")] = line
    return rows


DOCUMENTED = _documented()


@pytest.fixture(scope="module")
def corpus_env():
    """A 4-node testbed with big nodes and slurmdbd (like the session testbed: jobs see
    SLURM_JOB_ACCOUNT), brought up for this module and stopped after it."""
    ctld, base = (int(p) for p in os.environ.get("SLURMFABRIC_CORPUS_PORTS",
                                                 "17617,17701").split(","))
    settings = Settings(
        state_dir=Path(os.environ.get("SLURMFABRIC_CORPUS_TESTBED_DIR")
                       or f"{default_state_dir()}-corpus"),
        nodes=4, cpus=CORPUS_CPUS, prefix=os.environ.get("SLURMFABRIC_CORPUS_PREFIX", "sfc"),
        ctld_port=ctld, node_port_base=base, dbd_port=ctld + 2, db_port=ctld + 13,
        addr_prefix=os.environ.get("SLURMFABRIC_CORPUS_ADDR_PREFIX", "127.0.79."))
    testbed = Testbed(settings)
    try:
        testbed.converge(accounting=True, timeout=120, log=lambda msg: None)
    except Exception as exc:  # the reason must reach the report, never a skip
        pytest.fail(f"the corpus testbed could not start: {exc}", pytrace=False)
    yield testbed.env()
    if not os.environ.get("SLURMFABRIC_KEEP_TESTBED"):
        testbed.down(log=lambda msg: None)


@pytest.fixture(scope="module")
def rows(corpus_env) -> dict[str, run_corpus.Row]:
    """Every script's row, computed once, check pairs several at a time."""
    if not _ROWS:
        start = time.monotonic()
        for row in run_corpus.results(corpus_env):
            _ROWS[row.script] = row
        _TIME["wall_s"] = time.monotonic() - start
        print(f"\ncorpus: {len(_ROWS)} scripts imported, rendered and checked on Slurm in "
              f"{_TIME['wall_s']:.0f} s")
    return _ROWS


def test_the_corpus_is_at_least_40_cited_scripts_none_a_fixture() -> None:
    names = run_corpus.names()
    assert len(names) >= 40
    cited = run_corpus.sources()
    assert sorted(cited) == names  # every file cited, every citation a file
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"
    known = {p.read_bytes() for p in fixtures.iterdir() if p.is_file()}
    assert not [n for n in names if (run_corpus.SCRIPTS / n).read_bytes() in known]
    assert sorted(DOCUMENTED) == names  # one table row per script


@pytest.mark.parametrize("name", run_corpus.names())
def test_corpus_script_result_is_documented_and_honest(name: str, rows) -> None:
    row = rows[name]
    line = run_corpus.table([row]).splitlines()[-1]
    assert line == DOCUMENTED.get(name), (
        f"{name}: the result changed; run python tests/corpus/run_corpus.py --update\n"
        f"now:        {line}\ndocumented: {DOCUMENTED.get(name)}")
    assert row.honest, row.result


def test_corpus_checks_stay_within_the_ci_budget(rows) -> None:
    """45 check pairs on a 2-core machine: a few minutes (205 s measured), not the CI hour."""
    assert _TIME["wall_s"] < 600, f"the corpus took {_TIME['wall_s']:.0f} s"


def test_the_docs_walkthrough_runs_as_shown(corpus_env, tmp_path: Path) -> None:
    """docs/import.md's walk-through, run as shown against the corpus testbed (256 CPUs per
    node, the `testbed up --cpus 256` of the page): import with --check prints exactly the
    shown lines; submit is the cluster's step, run here as --dry-run (the testbed has no
    GPUs to grant)."""
    import readme_examples

    shown = {e.command: e for e in readme_examples.examples(page="docs/import.md")}
    (tmp_path / "princeton_ddp.slurm").write_bytes(
        (run_corpus.SCRIPTS / "princeton_ddp.slurm").read_bytes())
    env = dict(corpus_env, SLURMFABRIC_TESTBED_DIR=str(
        Path(corpus_env["SLURM_CONF"]).parents[1]))
    command = "slurmfabric import princeton_ddp.slurm -o job.toml --check --quiet"
    done = subprocess.run(command.split(), cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    printed = (done.stdout + done.stderr).splitlines()
    assert readme_examples.mismatch(shown[command].output, printed) is None, done.stderr
    assert "slurmfabric testbed up --cpus 256" in shown
    submit = subprocess.run(["slurmfabric", "submit", "-c", "job.toml", "--dry-run"],
                            cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert submit.returncode == 0, submit.stderr
    assert "srun" in submit.stdout and "mnist_classify_ddp.py" in submit.stdout
    assert "slurmfabric submit -c job.toml" in shown


SMALL = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --gres=gpu:2\n"
         "#SBATCH --partition=site-gpu\nexport NCCL_DEBUG=INFO\n"
         "export LD_LIBRARY_PATH=/opt/x/lib:$LD_LIBRARY_PATH\nsrun python train.py --lr 1\n")


def test_the_real_check_finds_the_same_job_same_and_each_mutation(corpus_env) -> None:
    """A script whose import is exact checks the same on Slurm (the GPUs and the site's
    partition neutralised in both) but for one real detail; each mutation of its config is
    named: the task layout of the step, the program's argv, the environment it sees."""
    from slurmfabric.config.models import JobConfig
    from slurmfabric.job.importer import import_script, realcheck

    data = import_script(SMALL).config
    report = realcheck.check(SMALL, JobConfig.model_validate(data), corpus_env)
    # The job's LD_LIBRARY_PATH is unset: the original's '/opt/x/lib:$LD_LIBRARY_PATH'
    # leaves a trailing ':' (an empty entry: the current directory, ld.so(8)), which
    # env_prepend does not. Nothing else differs.
    assert report.differences == [
        "step #1 (python train.py --lr 1): env LD_LIBRARY_PATH: '/opt/x/lib:' becomes "
        "'/opt/x/lib'"]
    assert report.original_exit == report.rendered_exit == 0
    mutations = {
        "tasks per node [2, 2] becomes 2 node(s), tasks per node [1, 1]":
            ("job", "ntasks_per_node", 1),
        "argv ['python', 'train.py', '--lr', '1'] becomes ['python', 'train.py', '--lr', '2']":
            ("program", "command", ["python", "train.py", "--lr", "2"]),
        "env NCCL_DEBUG: 'INFO' becomes 'WARN'": ("program", "env", {"NCCL_DEBUG": "WARN"}),
    }
    pending = []
    for expected, (section, key, value) in mutations.items():
        changed = {**data, section: {**data[section], key: value}}
        if section == "job":
            changed["job"].pop("gpus_per_node", None)  # one task per GPU otherwise
        pending.append((expected, realcheck.submit(SMALL, JobConfig.model_validate(changed),
                                                   corpus_env)))
    for expected, job in pending:
        found = realcheck.finish(job, corpus_env)
        assert any(expected in line for line in found.differences), found.differences
