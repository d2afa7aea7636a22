"""Shared fixtures. The real Slurm testbed is brought up once per test session.

Cluster tests (marker ``cluster``) must run in CI: if the cluster cannot start they fail
with the reason, and a CI run that executed none of them fails at the end.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

# Tests never write into the checkout: bytecode of this process's later imports and of every
# subprocess (the CLI, hooks, jobs on the testbed) goes under a temporary prefix (Python's
# PYTHONPYCACHEPREFIX, 3.8+); scripts/test.sh sets it for pytest's own imports too.
_PYCACHE = os.environ.setdefault("PYTHONPYCACHEPREFIX", os.path.join(
    tempfile.gettempdir(), f"slurmfabric-pycache-{os.getuid()}"))
sys.pycache_prefix = _PYCACHE

import pytest  # noqa: E402 - after the bytecode prefix, like everything below

from slurmfabric.testbed import Testbed, default_state_dir  # noqa: E402

# hypothesis keeps its storage (example database, the constants it collects from the code
# under test) in HYPOTHESIS_STORAGE_DIRECTORY, default ./.hypothesis: the temp dir instead.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(
    tempfile.gettempdir(), f"slurmfabric-hypothesis-{os.getuid()}"))

try:  # the example database in the same place, whatever hypothesis's defaults become
    from hypothesis import settings as _hypothesis_settings
    from hypothesis.database import DirectoryBasedExampleDatabase
except ImportError:  # the property tests then fail at their own import, loudly
    pass
else:
    _hypothesis_settings.register_profile("slurmfabric", database=DirectoryBasedExampleDatabase(
        os.path.join(os.environ["HYPOTHESIS_STORAGE_DIRECTORY"], "examples")))
    _hypothesis_settings.load_profile("slurmfabric")

# The test helpers (fake sysfs builder, fixture node descriptions, health fixtures, the
# fleet drills of benchmarks/) import by their module names everywhere: their directories
# go on sys.path here, once (the only other insert is tests/corpus's runner).
_TESTS = Path(__file__).resolve().parent
for _helpers in (_TESTS.parent / "benchmarks", _TESTS / "fixtures" / "health",
                 _TESTS / "fixtures" / "topology", _TESTS / "fixtures" / "pyslurm", _TESTS):
    if str(_helpers) not in sys.path:
        sys.path.insert(0, str(_helpers))

from testbed_cluster import Cluster  # noqa: E402 - found through the path set just above

_STATE = {"started_here": False, "cluster_tests_run": 0}

# Jobs the tests submit are recorded in a scratch directory, not the user's own (set before
# any fixture copies the environment for the testbed's commands).
os.environ["SLURMFABRIC_JOBS_DIR"] = tempfile.mkdtemp(prefix="slurmfabric-job-records-")
# The per-boot plan cache (rank/plancache.py) of every env/launch/TaskProlog a test runs, in
# process or not (tests/cleanenv.py keeps it): a private scratch directory, never /run or
# the user's own.
os.environ["SLURMFABRIC_PLAN_CACHE"] = tempfile.mkdtemp(prefix="slurmfabric-plan-cache-")


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    """The testbed as the cluster tests need it, whatever this machine had: reused when it
    runs with accounting; restarted with it when it runs without (the README's demo leaves
    one so); restarted when partly running; daemons of a killed run stopped first; started
    when stopped (then also stopped at the end)."""
    found = Testbed.from_state(default_state_dir())
    _STATE["started_here"] = not found.running()
    try:
        # Like a site: slurmdbd on MariaDB, so sacct and job history work (jobs tests).
        testbed = found.converge(accounting=True, timeout=90, log=lambda msg: None)
    except Exception as exc:  # the reason must reach the test report, not a skip
        pytest.fail(f"the local Slurm testbed could not start: {exc}", pytrace=False)
    handle = Cluster(testbed)
    yield handle
    if _STATE["started_here"] and not os.environ.get("SLURMFABRIC_KEEP_TESTBED"):
        testbed.down(log=lambda msg: None)


@pytest.fixture
def clean_sf_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No SLURMFABRIC_* leaks in from the developer's shell; no /etc site defaults file."""
    for name in list(os.environ):
        if name.startswith("SLURMFABRIC_") and name != "SLURMFABRIC_PLAN_CACHE":
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLURMFABRIC_SITE_DEFAULTS", "")


_CHECKOUT = _TESTS.parent
_CODE_DIRS = ("benchmarks", "examples", "tests", "tests/cluster", "tests/fixtures/health",
              "tests/fixtures/health/nvml", "tests/fixtures/topology", "tests/fixtures/pyslurm",
              "tests/fixtures/pyslurm/fake/pyslurm", "tests/hostile",
              "tests/sim", "tests/unit")


def _litter() -> set[str]:
    """Bytecode and hypothesis directories inside the checkout (a few ms: code dirs only)."""
    found = {str(p.relative_to(_CHECKOUT)) for d in _CODE_DIRS
             for p in [_CHECKOUT / d / "__pycache__"] if p.is_dir()}
    for top, dirs, _files in os.walk(_CHECKOUT / "slurmfabric"):
        if "__pycache__" in dirs:
            found.add(str(Path(top, "__pycache__").relative_to(_CHECKOUT)))
            dirs.remove("__pycache__")
    if (_CHECKOUT / ".hypothesis").is_dir():
        found.add(".hypothesis")
    return found


@pytest.fixture(autouse=True)
def _writes_nothing_into_the_checkout():
    """A test (or a subprocess it starts with a clean environment that drops
    PYTHONPYCACHEPREFIX) that writes bytecode or hypothesis data into the checkout fails,
    named, instead of leaving files that a later git status shows (issue 29)."""
    before = _litter()
    yield
    new = sorted(_litter() - before)
    if new:
        import shutil

        for rel in new:
            shutil.rmtree(_CHECKOUT / rel, ignore_errors=True)
        pytest.fail(f"this test wrote into the checkout: {', '.join(new)} (a subprocess env "
                    "without PYTHONPYCACHEPREFIX? use tests/cleanenv.py)", pytrace=False)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and "cluster" in report.keywords and not report.skipped:
        _STATE["cluster_tests_run"] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI, a run that executed no cluster test is a failure, never a silent pass."""
    if os.environ.get("CI") and exitstatus == 0 and not _STATE["cluster_tests_run"]:
        print("\nERROR: CI run executed no cluster test (marker 'cluster')")
        session.exitstatus = 1
