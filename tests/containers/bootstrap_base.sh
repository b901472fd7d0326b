#!/usr/bin/env bash
# Bootstrap a minimal Debian bookworm root filesystem with debootstrap from the Debian mirror apt
# uses on this machine, and import it into podman as IMAGE (default calib-standin/debian:bookworm).
# Docker Hub is not reachable here, so every stand-in base image (tests/containers/standins/) is
# built on this one. Idempotent: does nothing when IMAGE already exists.
#   tests/containers/bootstrap_base.sh [IMAGE]
set -euo pipefail
IMAGE=${1:-calib-standin/debian:bookworm}
if podman image exists "$IMAGE"; then
  echo "$IMAGE exists"
  exit 0
fi
# The first deb822 "URIs:" (or one-line "deb") entry that is not a security mirror.
mirror=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
  | grep -v security | head -1 | awk '{ print $2 }' || true)
mirror=${DEBIAN_MIRROR:-${mirror:-http://deb.debian.org/debian}}
command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install debootstrap" >&2; exit 1; }
rootfs=$(mktemp -d /var/tmp/bookworm-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap bookworm from $mirror" >&2
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
  || { tail -20 "$rootfs.log" >&2; exit 1; }
rm -f "$rootfs.log"
# apt inside the stand-in builds uses the same mirror (with updates and security).
cat > "$rootfs/etc/apt/sources.list" <<SRC
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian}/debian-security bookworm-security main
SRC
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | podman import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["bash"]' - "$IMAGE" >/dev/null
echo "$IMAGE imported"
