"""A minimal environment for a subprocess a test starts, that still keeps bytecode out of
the checkout: every such env carries PYTHONPYCACHEPREFIX (set by tests/conftest.py),
HYPOTHESIS_STORAGE_DIRECTORY and SLURMFABRIC_PLAN_CACHE (the test session's scratch plan
cache), and nothing else from the caller's environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

KEEP = ("PYTHONPYCACHEPREFIX", "HYPOTHESIS_STORAGE_DIRECTORY", "SLURMFABRIC_PLAN_CACHE")


def clean_env(**variables: str) -> dict[str, str]:
    """``variables`` plus the two names that keep the checkout clean."""
    env = {name: os.environ[name] for name in KEEP if name in os.environ}
    env.update(variables)
    return env


def python_with_prefix(directory: Path) -> Path:
    """An interpreter for scripts that run Python isolated (``-I``, like the TaskProlog):
    -I ignores PYTHONPYCACHEPREFIX, but keeps ``-X pycache_prefix``, which this wrapper adds."""
    wrapper = Path(directory) / "python-with-pycache-prefix"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -X pycache_prefix='
                       f'{os.environ["PYTHONPYCACHEPREFIX"]} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper
