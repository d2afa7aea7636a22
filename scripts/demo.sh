#!/usr/bin/env bash
# The main job on a fresh Debian machine (as root): install slurmfabric, start the local
# 4-node Slurm cluster, render and submit a real 2-node torchrun job, print its result.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup-env.sh
. scripts/setup-env.sh "" "nvml"

slurmfabric testbed up
eval "$(slurmfabric testbed env)"
echo "== slurmfabric render -c examples/smoke-cpu.toml"
slurmfabric render -c examples/smoke-cpu.toml
echo "== slurmfabric submit -c examples/smoke-cpu.toml --wait"
slurmfabric submit -c examples/smoke-cpu.toml --wait
