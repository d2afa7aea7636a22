#!/usr/bin/env bash
# Builds the real pyslurm (GPL-2.0, optional: never vendored here, imported lazily) for the
# installed libslurm into the test venv, so the cluster tests submit and drain through it.
#
# pyslurm's release line follows Slurm's (pyslurm README, "Versioning"): X.Y.Z builds only
# against Slurm X.Y's headers and library (its setup.py refuses another slurm_version.h).
# The tag is chosen from libslurm-dev's slurm_version.h:
#   Slurm 22.05 (Debian 12) -> v22.5.3    Slurm 24.11 (Debian 13) -> v24.11.0
# Sources: ../shared/vendor/pyslurm-<version>.tar.gz beside the checkout (git archive of the
# tag), else the same tag from https://github.com/PySlurm/pyslurm.
#
# The wheel is cached outside the checkout (keyed by pyslurm, Slurm and Python version); a
# second run with pyslurm already in the venv does nothing.
# Usage: scripts/build-pyslurm.sh   (SLURMFABRIC_VENV: the venv, default .venv)
set -euo pipefail
SF_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SF_VENV="${SLURMFABRIC_VENV:-$SF_ROOT/.venv}"
py="$SF_VENV/bin/python"
header=/usr/include/slurm/slurm_version.h

if [ ! -r "$header" ]; then
  echo "build-pyslurm: $header missing; install Debian's libslurm-dev" >&2
  exit 1
fi
hex="$(awk '$2 == "SLURM_VERSION_NUMBER" {print $3}' "$header")"
slurm="$(( hex >> 16 & 255 )).$(printf %02d $(( hex >> 8 & 255 ))).$(( hex & 255 ))"
case "$slurm" in
  22.05.*) want=22.5.3; cython='Cython>=0.29.30,<3.0' ;;  # its pyproject.toml: Cython<3.0
  24.11.*) want=24.11.0; cython='Cython>=0.29.37' ;;
  *)
    echo "build-pyslurm: no pyslurm release line chosen for Slurm $slurm" \
         "(known: 22.05 -> 22.5.3, 24.11 -> 24.11.0)" >&2
    exit 1 ;;
esac

have="$("$py" -c 'import importlib.metadata as m; print(m.version("pyslurm"))' 2>/dev/null \
        || true)"
stamp="$SF_VENV/.pyslurm-built-for"
if [ "$have" = "$want" ] && [ "$(cat "$stamp" 2>/dev/null || true)" = "$slurm" ]; then
  echo "== pyslurm $want for Slurm $slurm: already in $SF_VENV"
  exit 0
fi

pytag="$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/slurmfabric/pyslurm/$want-slurm$slurm-$pytag"
if ! ls "$cache"/pyslurm-*.whl >/dev/null 2>&1; then
  echo "== building pyslurm $want against libslurm $slurm (cold: about 12 minutes on 2 busy cores)"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  vendored="$SF_ROOT/../shared/vendor/pyslurm-$want.tar.gz"
  if [ -r "$vendored" ]; then
    tar -xzf "$vendored" -C "$work"
  else
    url="https://github.com/PySlurm/pyslurm/archive/refs/tags/v$want.tar.gz"
    echo "   $vendored not found; fetching $url"
    "$py" -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
      "$url" "$work/src.tar.gz"
    tar -xzf "$work/src.tar.gz" -C "$work"
  fi
  src="$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'pyslurm-*' | head -n 1)"
  # One build environment with the Cython its release needs (22.5.3 does not build with
  # Cython 3); the venv itself gets only the wheel.
  "$py" -m venv "$work/build-env"
  "$work/build-env/bin/pip" install -q --disable-pip-version-check \
    "$cython" "setuptools<70" wheel packaging
  multiarch="$(gcc -print-multiarch 2>/dev/null || true)"
  mkdir -p "$work/wheel"
  (cd "$src" && SLURM_INCLUDE_DIR=/usr/include \
     SLURM_LIB_DIR="/usr/lib${multiarch:+/$multiarch}" \
     "$work/build-env/bin/python" setup.py -q bdist_wheel -d "$work/wheel" >"$work/build.log" 2>&1) \
    || { tail -n 40 "$work/build.log" >&2; echo "build-pyslurm: build failed" >&2; exit 1; }
  mkdir -p "$cache"
  cp "$work"/wheel/pyslurm-*.whl "$cache/"
fi
"$SF_VENV/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall \
  "$cache"/pyslurm-*.whl
echo "$slurm" >"$stamp"
echo "== pyslurm $want for Slurm $slurm installed in $SF_VENV"
