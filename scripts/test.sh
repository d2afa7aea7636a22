#!/usr/bin/env bash
# The full test suite on a fresh Debian machine (as root): installs what the tests need,
# then runs ruff and pytest. The cluster tests bring the local Slurm testbed up themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup-env.sh
. scripts/setup-env.sh "shellcheck openmpi-bin libopenmpi-dev ibsim-utils libumad2sim0 infiniband-diags opensm slurmdbd mariadb-server lua5.1" "test,nvml"

echo "== ruff check"
ruff check slurmfabric tests benchmarks examples

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
exit "$rc"
