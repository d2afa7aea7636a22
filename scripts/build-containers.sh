#!/usr/bin/env bash
# Real pyxis and enroot for the testbed's container jobs (issue 42), as root on Debian 12/13:
# - pyxis compiled against this machine's spank.h (Debian's libslurm-dev, the Slurm the
#   testbed runs: a plugin built for another release is refused, pyxis README);
# - enroot with FORCE_GLIBC=1 and Debian's makeself (the upstream archive has no musl,
#   linux-headers or makeself submodules);
# - a small Debian image (debootstrap --variant=minbase, plus python3, no slurmfabric) as a
#   squashfs file, which pyxis takes as --container-image=/path/image.sqsh.
# Sources: ../shared/vendor/ (git archives of the upstream tags) when beside the checkout,
# else the same tags from GitHub (that path needs internet access; it is not tested here).
# Everything goes to one directory per (pyxis, enroot, Slurm) version under
# $SLURMFABRIC_CONTAINERS_CACHE (default /var/cache/slurmfabric-testbed/containers);
# manifest.json is written last, so a second run finds it and does nothing.
# 'slurmfabric testbed up' loads pyxis from there (slurmfabric/testbed/containers.py).
set -euo pipefail
cd "$(dirname "$0")/.."

PYXIS_VERSION=0.24.0
ENROOT_VERSION=4.1.2
VENDOR="${SLURMFABRIC_VENDOR_DIR:-../shared/vendor}"
CACHE="${SLURMFABRIC_CONTAINERS_CACHE:-/var/cache/slurmfabric-testbed/containers}"
# enroot's runtime needs (its pkg/deb/control Depends) and what the three builds need.
PACKAGES=(bash curl gawk jq parallel passwd squashfs-tools zstd bsdmainutils pigz
          gcc make libc6-dev libslurm-dev libbsd-dev makeself debootstrap)
# The image's ENV, as a training image sets it (enroot writes an image's ENV to
# /etc/environment: enroot doc/image-format.md). The cluster tests check that the job's plan
# wins over the NCCL values and that UCX_TLS, which the plan does not set, stays.
IMAGE_ENV=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
           "NCCL_SOCKET_IFNAME=eth9" "NCCL_IB_HCA=mlx5_9" "UCX_TLS=rc,sm")

missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}\n' "$package" 2>/dev/null | grep -q '^install ok installed$' \
    || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null 2>&1
fi

# Slurm's release as slurmd -V gives it, from the header pyxis compiles against (22.5.8)
number="$(sed -n 's/^#define SLURM_VERSION_NUMBER \(0x[0-9a-fA-F]*\)$/\1/p' \
  /usr/include/slurm/slurm_version.h)"
if [ -z "$number" ]; then
  echo "build-containers: no SLURM_VERSION_NUMBER in /usr/include/slurm/slurm_version.h" >&2
  exit 1
fi
slurm="$((number >> 16 & 255)).$((number >> 8 & 255)).$((number & 255))"
dest="$CACHE/pyxis-$PYXIS_VERSION-enroot-$ENROOT_VERSION-slurm-$slurm"
if [ -f "$dest/manifest.json" ]; then
  echo "== containers: $dest is built"
  exit 0
fi

start=$SECONDS
work="$(mktemp -d /var/tmp/sf-build-containers.XXXXXX)"
trap 'rm -rf "$work"' EXIT
rm -rf "$dest"
mkdir -p "$dest/pyxis" "$dest/images"

# unpack NAME VERSION URL: the tag's source tree as $work/NAME-VERSION
unpack() {
  local archive="$VENDOR/$1-$2.tar.gz"
  if [ ! -f "$archive" ]; then
    archive="$work/$1-$2.tar.gz"
    echo "== $1 $2 from $3"
    curl -fsSL -o "$archive" "$3"
  fi
  tar -xzf "$archive" -C "$work"
  [ -d "$work/$1-$2" ]
}
unpack pyxis "$PYXIS_VERSION" "https://github.com/NVIDIA/pyxis/archive/refs/tags/v$PYXIS_VERSION.tar.gz"
unpack enroot "$ENROOT_VERSION" "https://github.com/NVIDIA/enroot/archive/refs/tags/v$ENROOT_VERSION.tar.gz"

echo "== pyxis $PYXIS_VERSION against Slurm $slurm's spank.h"
make -s -C "$work/pyxis-$PYXIS_VERSION" >"$work/pyxis.log" 2>&1 || { cat "$work/pyxis.log" >&2; exit 1; }
install -m 644 "$work/pyxis-$PYXIS_VERSION/spank_pyxis.so" "$dest/pyxis/"

echo "== enroot $ENROOT_VERSION (FORCE_GLIBC=1, Debian's makeself)"
src="$work/enroot-$ENROOT_VERSION"
# glibc < 2.38 has no strlcpy/strlcat, which musl gave the upstream build: Debian's libbsd.
libs="-l:libbsd.a $(gcc -print-file-name=libbsd.a) $(gcc -print-file-name=libmd.a)"
{
  make -C "$src/deps" libbsd FORCE_GLIBC=1
  install -m 755 -D "$(command -v makeself)" "$src/deps/dist/makeself/bin/enroot-makeself"
  # the linux-headers submodule is absent: the system's (linux-libc-dev) serve instead
  touch "$src/deps/makeself/.stamp" "$src/deps/linux-headers/.stamp"
  make -C "$src" install FORCE_GLIBC=1 prefix="$dest/enroot" LDLIBS="$libs"
} >"$work/enroot.log" 2>&1 || { cat "$work/enroot.log" >&2; exit 1; }

codename="$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release)"
echo "== image: Debian $codename minbase + python3 (debootstrap from deb.debian.org)"
rootfs="$work/rootfs"
debootstrap --variant=minbase --include=python3 "$codename" "$rootfs" \
  http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
rm -rf "$rootfs"/usr/share/{doc,man,info,locale} "$rootfs"/var/cache/apt/* \
  "$rootfs"/var/lib/apt/lists/*
printf '%s\n' "${IMAGE_ENV[@]}" >"$rootfs/etc/environment"
# enroot's own squashfs options (enroot.in: ENROOT_SQUASH_OPTIONS)
mksquashfs "$rootfs" "$dest/images/debian-python3.sqsh" -noappend -quiet -comp lzo -noD \
  >/dev/null

cat >"$dest/manifest.json" <<EOF
{"slurm": "$slurm", "pyxis": "$PYXIS_VERSION", "enroot": "$ENROOT_VERSION",
 "plugin": "pyxis/spank_pyxis.so", "enroot_bin": "enroot/bin",
 "image": "images/debian-python3.sqsh"}
EOF
echo "== containers: built $dest in $((SECONDS - start)) s"
