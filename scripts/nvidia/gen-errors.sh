#!/usr/bin/env bash
# gen-errors.sh: generate event/cudaerrors.go, the names of the results of
# the CUDA runtime (cudaError_t: enum cudaError in driver_types.h) and of
# the CUDA driver (CUresult: enum cudaError_enum in cuda.h), from NVIDIA's
# own headers as Debian ships them. Nothing is typed by hand.
#
# Usage: scripts/nvidia/gen-errors.sh [--check] [CACHE_DIR]
#   CACHE_DIR  default: $NVIDIA_CACHE, else <repo>/.cache/nvidia (the cache
#              of fetch.sh); the headers go to CACHE_DIR/headers/<pkg>-<ver>/
#   --check    write nothing; fail when event/cudaerrors.go is not what
#              the headers give (needs the headers, like a normal run)
#
# Sources (the only Debian packages with cuda.h and driver_types.h; both
# headers are in /usr/include of the CUDA toolkit's -dev package, and no
# smaller package has them: libcupti-dev, nvidia-cuda-toolkit (its
# /usr/lib/cuda/include/cuda.h is a symlink into nvidia-cuda-dev),
# nvidia-cuda-gdb and nvidia-cuda-toolkit-doc were checked):
#   nvidia-cuda-dev=12.4.127~12.4.1-2        Debian 13 trixie non-free, CUDA 12.4.1, 934 MB
#   nvidia-cuda-dev=11.8.89~11.8.0-5~deb12u1 Debian 12 bookworm non-free, CUDA 11.8.0, 774 MB
# The newer one comes first: the tables are the union of both enums, and a
# code both know takes 12.4's name (see scripts/nvidia/generrors for the
# parsing and the alias rules). The versions are pinned here rather than in
# versions.env because fetch.sh's packages are what tests load, while these
# are only needed to regenerate a committed file.
#
# Each .deb is downloaded with `apt-get download` into a temporary folder
# ($TMPDIR, about 1 GB free needed), checked against the sha256 below,
# and only its two headers are unpacked (dpkg-deb --fsys-tarfile | tar);
# the .deb is deleted right away. Nothing is installed. The apt sources
# for bookworm contrib/non-free and trixie (pinned -1: only name=version
# downloads reach it) are the ones scripts/nvidia/fetch.sh writes; run
# `sudo scripts/nvidia/fetch.sh --candidates` once if apt does not know a
# version. A run whose headers are in the cache needs neither apt, network
# nor root, only `go`. Root is not needed for the download either, as long
# as apt's lists know the versions.
#
# To move to newer headers: change the pins below (apt-cache madison
# nvidia-cuda-dev; apt-cache show nvidia-cuda-dev=<version> gives the
# SHA256), rerun, and commit event/cudaerrors.go.
set -euo pipefail

prog=${0##*/}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${NVIDIA_CACHE:-$repo/.cache/nvidia}
out=$repo/event/cudaerrors.go
check=

# Newest first: "package=version|sha256 of the amd64 .deb|what it is".
sources=(
	"nvidia-cuda-dev=12.4.127~12.4.1-2|d846838f914a0176948d48a8bcade5d6dbcccb5c9374343f6475f5503f173ee0|Debian 13 trixie non-free, CUDA 12.4.1"
	"nvidia-cuda-dev=11.8.89~11.8.0-5~deb12u1|dc63bf2fb94aaaf903e9bad0c35f631266077d016b34329ec7af456bd7fed5ec|Debian 12 bookworm non-free, CUDA 11.8.0"
)
headers=(cuda.h driver_types.h)

die() {
	printf '%s: error: %s\n' "$prog" "$*" >&2
	exit 1
}
say() { printf '%s: %s\n' "$prog" "$*" >&2; }
usage() { sed -n '2,/^set -euo/{/^#/{s/^# \{0,1\}//;p}}' "$0"; }

while [ $# -gt 0 ]; do
	case $1 in
	-h | --help)
		usage
		exit 0
		;;
	--check) check=1 ;;
	--) ;;
	-*) die "unknown option: $1 (try --help)" ;;
	*) cache=$1 ;;
	esac
	shift
done

command -v go >/dev/null || die "go not found"

# hdrdir PACKAGE VERSION: where a package's two headers are kept.
hdrdir() { printf '%s/headers/%s-%s\n' "$cache" "$1" "${2//:/%3a}"; }

have() {
	local h
	[ -f "$1/.lanewatch-deb" ] || return 1
	for h in "${headers[@]}"; do [ -f "$1/$h" ] || return 1; done
}

# get PACKAGE VERSION SHA256 DIR: download, check, unpack the two headers.
get() {
	local pkg=$1 ver=$2 sha=$3 dir=$4 tmp deb got size avail h members=()
	command -v apt-get >/dev/null || die "apt-get not found: this needs a Debian-based system (or copy the headers into $dir)"
	apt-cache madison "$pkg" 2>/dev/null | awk -F'|' -v v="$ver" '{ gsub(/ /, "", $2) } $2 == v { f = 1 } END { exit !f }' ||
		die "apt does not know $pkg=$ver. It knows:
$(apt-cache madison "$pkg" 2>/dev/null | sed 's/^/    /')
Set up and refresh the bookworm/trixie sources with: sudo $here/fetch.sh --candidates
(or move the pins in $0)."
	size=$(apt-cache show "$pkg=$ver" 2>/dev/null | awk '/^Size:/ { print $2; exit }')
	tmp=$(mktemp -d)
	# shellcheck disable=SC2064 # expand now: tmp is local
	trap "rm -rf '$tmp'" EXIT
	avail=$(df -P -B1 "$tmp" | awk 'NR == 2 { print $4 }')
	if [ -n "$size" ] && [ -n "$avail" ] && [ "$avail" -lt $((size + 64 * 1024 * 1024)) ]; then
		die "$tmp has $((avail / 1048576)) MiB free, $pkg=$ver needs $((size / 1048576)) MiB (set TMPDIR)"
	fi
	# apt-get download drops to the _apt user when run as root.
	if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then chown _apt "$tmp"; fi
	say "downloading $pkg=$ver ($((${size:-0} / 1048576)) MiB; only two headers are kept)"
	(cd "$tmp" && apt-get download -qq "$pkg=$ver" >&2) || die "apt-get download $pkg=$ver failed"
	deb=$(find "$tmp" -maxdepth 1 -name "${pkg}_*.deb" | head -n1)
	[ -n "$deb" ] || die "apt-get download $pkg=$ver left no .deb in $tmp"
	got=$(sha256sum "$deb" | cut -d' ' -f1)
	[ "$got" = "$sha" ] || die "$(basename "$deb") has sha256 $got, $0 expects $sha"
	rm -rf "$dir.tmp"
	mkdir -p "$dir.tmp"
	for h in "${headers[@]}"; do members+=("./usr/include/$h"); done
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" "${members[@]}" ||
		die "could not unpack ${members[*]} from $(basename "$deb")"
	for h in "${headers[@]}"; do mv "$tmp/usr/include/$h" "$dir.tmp/$h"; done
	printf 'package=%s\nversion=%s\nfile=%s\nsha256=%s\n' "$pkg" "$ver" "$(basename "$deb")" "$got" >"$dir.tmp/.lanewatch-deb"
	rm -rf "$tmp" "$dir"
	trap - EXIT
	mv "$dir.tmp" "$dir"
}

args=()
for s in "${sources[@]}"; do
	IFS='|' read -r pv sha what <<<"$s"
	pkg=${pv%%=*} ver=${pv#*=}
	dir=$(hdrdir "$pkg" "$ver")
	if ! have "$dir"; then
		mkdir -p "$cache/headers"
		# Keep the cache out of git (fetch.sh does the same).
		[ -f "$cache/.gitignore" ] || printf '*\n' >"$cache/.gitignore"
		exec 9>"$cache/headers/.lock"
		flock 9
		have "$dir" || get "$pkg" "$ver" "$sha" "$dir"
	fi
	grep -qx "sha256=$sha" "$dir/.lanewatch-deb" || die "$dir is from another .deb than $pv (sha256 $sha): remove it and rerun"
	args+=(-src "$pkg $ver ($what; .deb sha256 $sha): $(printf '/usr/include/%s ' "${headers[@]}" | sed 's/ $//')=$dir")
done

gen=$(mktemp)
trap 'rm -f "$gen"' EXIT
(cd "$repo" && go run ./scripts/nvidia/generrors -by scripts/nvidia/gen-errors.sh -o "$gen" "${args[@]}")
if [ -n "$check" ]; then
	diff -u "$out" "$gen" >&2 || die "${out#"$repo"/} is stale: run $0 and commit it"
	say "${out#"$repo"/} is up to date"
	exit 0
fi
cp "$gen" "$out"
say "wrote ${out#"$repo"/}"
