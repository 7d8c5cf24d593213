#!/usr/bin/env bash
# Make podman usable on a host whose hybrid cgroup layout crun cannot run
# containers on: runc with cgroupfs (the callers pass --runtime runc
# --cgroup-manager cgroupfs) and no default ulimits (podman's default
# nofile/nproc ulimits fail there). Idempotent: the setting is added once.
set -euo pipefail
conf=/etc/containers/containers.conf
mkdir -p /etc/containers
if [ -f "$conf" ] && grep -q '^[[:space:]]*default_ulimits[[:space:]]*=[[:space:]]*\[\]' "$conf"; then
  exit 0
fi
if [ -f "$conf" ] && grep -q '^\[containers\]' "$conf"; then
  sed -i '/^\[containers\]/a default_ulimits = []' "$conf"
else
  printf '[containers]\ndefault_ulimits = []\n' >>"$conf"
fi
