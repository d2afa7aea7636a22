#!/usr/bin/env bash
# The full test suite on a fresh Debian machine (as root): installs what the tests need,
# brings the local Slurm testbed to the state the cluster tests need (saying what changed),
# then runs ruff and pytest. Bytecode and caches go to the temp dir; a check at the end
# lists anything a test still left in the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-${TMPDIR:-/tmp}/slurmfabric-pycache-$(id -u)}"
# bubblewrap: the container runtime a Kubernetes pod's command runs in (tests/unit/test_k8s_pods.py)
# shellcheck source=scripts/setup-env.sh
. scripts/setup-env.sh "shellcheck bubblewrap openmpi-bin libopenmpi-dev ibsim-utils libumad2sim0 infiniband-diags opensm slurmdbd mariadb-server lua5.1 chromium fonts-dejavu-core libslurm-dev gcc python3-dev" "test,nvml,diagnose"
# The real pyslurm for the installed Slurm (GPL, optional, never vendored here): built once
# into the venv from the tag of its release line, cached outside the checkout.
bash scripts/build-pyslurm.sh

echo "== ruff check"
ruff check --no-cache slurmfabric tests benchmarks examples

echo "== pyxis and enroot for the container tests (cached: seconds after the first run)"
bash scripts/build-containers.sh

echo "== slurmfabric testbed up --accounting"
# Whatever the README's demo or an earlier run left (running without accounting, stopped,
# partly running, stray daemons), the cluster tests get 4 idle nodes with slurmdbd.
slurmfabric testbed up --accounting --timeout 120

sf_untracked() { git status --porcelain --ignored 2>/dev/null | sort || true; }
sf_before="$(sf_untracked)"

echo "== pytest"
set +e
# --durations: the slowest tests (the hostile-input suites, the cluster jobs) with their times
python -m pytest -p no:cacheprovider --durations=8 "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
sf_new="$(comm -13 <(printf '%s\n' "$sf_before") <(sf_untracked))"
if [ -n "$sf_new" ]; then
  # Each test already fails when it writes bytecode or .hypothesis here (tests/conftest.py);
  # this catches the rest (any file, from any step), so the checkout stays as it was.
  echo "the test run wrote into the checkout (git status --ignored):" >&2
  printf '%s\n' "$sf_new" >&2
  [ "$rc" != 0 ] || rc=1
fi
exit "$rc"
