#!/usr/bin/env bash
# Install and configure podman the way these machines need it (docs/design.md, section 8):
# Debian's podman 4.3 with runc and cgroupfs (crun fails here on cgroups in hybrid mode and on
# RLIMIT settings), no default ulimits, and debootstrap for the stand-in base image.
# Idempotent; needs root (apt-get).
set -euo pipefail
need=()
for cmd in podman runc debootstrap; do
  command -v "$cmd" >/dev/null || need+=("$cmd")
done
if ((${#need[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
fi
mkdir -p /etc/containers
want='[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"'
if [ "$(cat /etc/containers/containers.conf 2>/dev/null)" != "$want" ]; then
  printf '%s\n' "$want" > /etc/containers/containers.conf
fi
podman --version
