# shellcheck shell=bash
# Sourced by scripts/demo.sh and scripts/test.sh: system packages and the project venv.
# Usage: . scripts/setup-env.sh "<extra apt packages>" "<pip extras>"
set -euo pipefail
SF_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SF_VENV="${SLURMFABRIC_VENV:-$SF_ROOT/.venv}"
sf_apt_packages="slurm-wlm munge python3-venv $1"
sf_extras="$2"

sf_missing=""
for pkg in $sf_apt_packages; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
    || sf_missing="$sf_missing $pkg"
done
if [ -n "$sf_missing" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "missing Debian packages:$sf_missing; as root run: apt-get install -y$sf_missing" >&2
    exit 1
  fi
  echo "== apt-get install$sf_missing"
  apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $sf_missing >/dev/null
fi

if [ ! -x "$SF_VENV/bin/python" ]; then
  echo "== creating $SF_VENV"
  python3 -m venv "$SF_VENV"
fi
echo "== pip install -e .[$sf_extras]"
# torch: the CPU build (2.13.0) is what the end-to-end launch tests run on.
"$SF_VENV/bin/pip" install -q --disable-pip-version-check "torch==2.13.0" numpy \
  -e "${SF_ROOT}[${sf_extras}]" 2>&1 | grep -v "is ignored: it is neither" || true
"$SF_VENV/bin/python" -c "import slurmfabric, torch" \
  || { echo "installation failed" >&2; exit 1; }
export PATH="$SF_VENV/bin:$PATH"
