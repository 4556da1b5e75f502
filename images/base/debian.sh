#!/usr/bin/env bash
# Make a Python 3.11 base image from Debian's packages, for machines that reach no container
# registry but do reach a Debian mirror:
#
#   images/base/debian.sh [NAME]        (default NAME: rlvr-base/python:3.11-bookworm; as root)
#
# The image is what FLAVOR=cpu images/build.sh needs from a base (CPU_BASE=NAME): Debian bookworm
# (minbase) with python3 3.11, ca-certificates, and a virtual environment at /opt/venv first on
# PATH, so `python`, `python3` and `pip` are the venv's and pip installs without PEP 668's
# refusal, as in the official python images. apt lists, docs, man pages and locales are left out.
#
# Environment:
#   DOCKER          container CLI (default: docker)
#   DEBIAN_MIRROR   the mirror (default: http://deb.debian.org/debian). A snapshot makes the base
#                   repeatable: http://snapshot.debian.org/archive/debian/20250520T000000Z
#   WORKDIR         where the root filesystem is assembled (default: a temporary directory)
set -euo pipefail

name=${1:-rlvr-base/python:3.11-bookworm}
docker=${DOCKER:-docker}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

die() {
  echo "debian.sh: $*" >&2
  exit 2
}

[[ $(id -u) -eq 0 ]] || die "debootstrap needs root (run it with sudo)"
command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
"$docker" info >/dev/null 2>&1 || die "no container engine answers '$docker info'"

work=${WORKDIR:-$(mktemp -d)}
rootfs=$work/rootfs
cleanup() {
  local status=$?
  rm -rf "$rootfs"
  # a failed run keeps its debootstrap.log
  if [[ -z ${WORKDIR:-} && $status -eq 0 ]]; then rm -rf "$work"; fi
}
trap cleanup EXIT

started=$SECONDS
echo "==> debootstrap bookworm from $mirror" >&2
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
  die "debootstrap failed; see $work/debootstrap.log"

# The venv's pip comes from Debian's ensurepip wheel; --without-pip would leave none.
chroot "$rootfs" python3 -m venv /opt/venv
chroot "$rootfs" /opt/venv/bin/python -m pip --version >/dev/null
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/log/* \
  "$rootfs"/usr/share/doc "$rootfs"/usr/share/man "$rootfs"/usr/share/info \
  "$rootfs"/usr/share/locale
python_version=$(chroot "$rootfs" python3 -c 'import platform; print(platform.python_version())')

echo "==> importing $name" >&2
tar --numeric-owner -C "$rootfs" -c . | "$docker" import \
  --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL org.opencontainers.image.description=\"Debian bookworm minbase, Python $python_version in /opt/venv\"" \
  --change 'CMD ["python3"]' \
  - "$name" >/dev/null
size=$("$docker" image inspect --format '{{.Size}}' "$name")
echo "made $name (Python $python_version, $((size / 1000000)) MB) in $((SECONDS - started)) s" >&2
echo "$name"
