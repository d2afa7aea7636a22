"""Shared fixtures. The real Slurm testbed is brought up once per test session.

Cluster tests (marker ``cluster``) must run in CI: if the cluster cannot start they fail
with the reason, and a CI run that executed none of them fails at the end.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from pathlib import Path

import pytest

# The test helpers (fake sysfs builder, fixture node descriptions, health fixtures) import
# by their module names everywhere: their directories go on sys.path here, once.
from slurmfabric.testbed import Testbed, default_state_dir

_TESTS = Path(__file__).resolve().parent
for _helpers in (_TESTS / "fixtures" / "health", _TESTS / "fixtures" / "topology", _TESTS):
    if str(_helpers) not in sys.path:
        sys.path.insert(0, str(_helpers))

from testbed_cluster import Cluster  # noqa: E402 - found through the path set just above

_STATE = {"started_here": False, "cluster_tests_run": 0}

# Jobs the tests submit are recorded in a scratch directory, not the user's own (set before
# any fixture copies the environment for the testbed's commands).
os.environ["SLURMFABRIC_JOBS_DIR"] = tempfile.mkdtemp(prefix="slurmfabric-job-records-")


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    testbed = Testbed.from_state(default_state_dir())
    if not testbed.running():
        _STATE["started_here"] = True
        # Like a site: slurmdbd on MariaDB, so sacct and job history work (jobs tests).
        testbed = Testbed(dataclasses.replace(testbed.s, accounting=True))
    elif not testbed.s.accounting:
        pytest.fail("the running testbed has no accounting, which the cluster tests need: "
                    "run 'slurmfabric testbed down' and let the tests start it",
                    pytrace=False)
    try:
        if not _STATE["started_here"]:
            testbed.resume_all()  # an earlier session may have left a node drained
        testbed.up(timeout=90, log=lambda msg: None)
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
        if name.startswith("SLURMFABRIC_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLURMFABRIC_SITE_DEFAULTS", "")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and "cluster" in report.keywords and not report.skipped:
        _STATE["cluster_tests_run"] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI, a run that executed no cluster test is a failure, never a silent pass."""
    if os.environ.get("CI") and exitstatus == 0 and not _STATE["cluster_tests_run"]:
        print("\nERROR: CI run executed no cluster test (marker 'cluster')")
        session.exitstatus = 1
