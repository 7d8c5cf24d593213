#!/usr/bin/env bash
# make image: assemble the agent's root filesystem from this host's files
# (no registry is needed) and build the image FROM scratch with podman.
# The root filesystem holds bin/agent, the C libraries it links (ldd) and
# those NVML's library links when the agent loads it at run time (glibc's
# libm, libdl, libpthread, librt), /etc/passwd and /etc/group naming the
# agent's user, and the CA certificates for an OTLP upstream over TLS.
# No shell. Beside it, bin/image/seccomp.json: podman's default seccomp
# profile with what the agent's capabilities need (seccomp.py), and
# bin/image/lanewatch.json: the same resolved for the chart's capabilities,
# the Localhost profile Kubernetes nodes load (docs/deploy.md "DaemonSet").
# Usage: build.sh BINARY TAG [OUTDIR (bin/image)]
set -euo pipefail
bin=$(realpath "${1:-bin/agent}")
tag=${2:-localhost/lanewatch-agent:dev}
out=$(realpath -m "${3:-bin/image}")
cd "$(dirname "$0")/../.."
bash scripts/image/podman-setup.sh
root=$out/rootfs
rm -rf "$root"
mkdir -p "$root/etc/ssl/certs" "$root/tmp"
chmod 1777 "$root/tmp"
install -m 0755 "$bin" "$root/agent"
# The agent's capabilities as file capabilities, permitted only: Kubernetes
# gives a non-root process no ambient ones, so these are what it gets (at
# most the container's bounding set); without the effective bit an exec
# never fails for one the bounding set lacks, and the agent raises the
# permitted ones itself (cmd/agent/caps_linux.go) and names what is missing.
caps=cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search,cap_checkpoint_restore=p
setcap "$caps" "$root/agent"

# copy FILE into the root filesystem at the same path; a symlink is copied
# as one and its target too (ld.so finds libraries by their sonames).
copy() {
  local f=$1
  while :; do
    mkdir -p "$root$(dirname "$f")"
    cp -a "$f" "$root$f"
    [ -L "$f" ] || break
    local t
    t=$(readlink "$f")
    case $t in /*) f=$t ;; *) f=$(dirname "$f")/$t ;; esac
  done
}
libs=$(ldd "$bin" | awk '/=>/ {print $3} /^\t\// {print $1}')
libdir=$(dirname "$(ldd "$bin" | awk '/libc.so/ {print $3}')")
for l in $libs; do copy "$l"; done
# NVML (libnvidia-ml.so.1, mounted from the host) needs these at dlopen.
for l in libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1; do copy "$libdir/$l"; done
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
printf 'root:x:0:0:root:/:/sbin/nologin\nlanewatch:x:65532:65532:lanewatch:/:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nlanewatch:x:65532:\n' >"$root/etc/group"

python3 scripts/image/seccomp.py /usr/share/containers/seccomp.json "$out/seccomp.json" "$out/lanewatch.json"
podman --runtime runc --cgroup-manager cgroupfs build -q -f Containerfile -t "$tag" "$root" >/dev/null
# The image's layer keeps them (the security.capability xattr) or the build fails.
mnt=$(podman image mount "$tag")
got=$(getcap "$mnt/agent" | awk '{print $2}')
podman image unmount "$tag" >/dev/null
want=$(getcap "$root/agent" | awk '{print $2}') # getcap's order
[ -n "$want" ] && [ "$got" = "$want" ] || {
  echo "image $tag: /agent has file capabilities \"$got\", want $caps" >&2
  exit 1
}
size=$(podman image inspect --format '{{.Size}}' "$tag")
echo "image $tag: $((size / 1024 / 1024)) MiB ($size bytes; the agent alone $(($(stat -c %s "$bin") / 1024 / 1024)) MiB)"
