#!/usr/bin/env bash
# fetch.sh: download NVIDIA's real user-space libraries (CUDA runtime, CUDA
# driver libcuda, NVML, CUPTI) from Debian's contrib/non-free components and
# unpack them with `dpkg -x` into a cache folder. The packages are never
# installed: libcuda1 depends on the kernel driver packages.
#
# Usage: scripts/nvidia/fetch.sh [--env | --candidates] [CACHE_DIR]
#   CACHE_DIR   default: $NVIDIA_CACHE, else <repo>/.cache/nvidia
#   --env       print only KEY=<library folder> lines (for eval / CI)
#   --candidates  print what the mirror serves now for each package, as
#                 versions.env lines; downloads nothing
#
# Versions come from versions.env next to this script (or $NVIDIA_VERSIONS).
# Each package ends up in CACHE_DIR/<package>-<version>/ (a dpkg -x tree).
# A second run with everything unpacked touches neither apt nor the network
# and does not need root. See docs/operating.md, "Commands".
set -euo pipefail

prog=${0##*/}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
versions_file=${NVIDIA_VERSIONS:-$here/versions.env}
cache=${NVIDIA_CACHE:-$repo/.cache/nvidia}
mode=fetch

# What gets written to the system's apt configuration.
apt_source=/etc/apt/sources.list.d/lanewatch-nvidia.sources
apt_pin=/etc/apt/preferences.d/lanewatch-nvidia-trixie

# The packages, in the order versions.env lists them. Each KEY names a
# versions.env entry KEY=<package>=<version>, plus optional KEY_SHA256_<ARCH>.
keys=(BOOKWORM_CUDART BOOKWORM_CUDA BOOKWORM_NVML BOOKWORM_CUPTI
	TRIXIE_CUDART TRIXIE_CUDA TRIXIE_NVML TRIXIE_CUPTI)

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
	--env) mode="env" ;;
	--candidates) mode="candidates" ;;
	--) ;;
	-*) die "unknown option: $1 (try --help)" ;;
	*) cache=$1 ;;
	esac
	shift
done

[ -r "$versions_file" ] || die "cannot read $versions_file"
# shellcheck source=/dev/null # only KEY=value lines, read via ${!key}
. "$versions_file"

arch=$(dpkg --print-architecture 2>/dev/null) || die "dpkg not found: this script needs a Debian-based system"
arch_uc=$(printf '%s' "$arch" | tr '[:lower:]' '[:upper:]')

# spec KEY: prints "package version sha256-or-empty".
spec() {
	local key=$1 val sha_key
	val=${!key:-}
	[ -n "$val" ] || die "$versions_file does not set $key"
	case $val in
	*=*) ;;
	*) die "$versions_file: $key=$val is not <package>=<version>" ;;
	esac
	sha_key=${key}_SHA256_${arch_uc}
	printf '%s %s %s\n' "${val%%=*}" "${val#*=}" "${!sha_key:-}"
}

# The folder a package version unpacks to (":" of an epoch kept out of paths).
pkgdir() { printf '%s/%s-%s\n' "$cache" "$1" "${2//:/%3a}"; }

# resolve KEY: like spec, but when the pinned version is not unpacked and an
# earlier run had to take another one (the mirror dropped the pin), that one.
resolve() {
	local pkg ver sha
	read -r pkg ver sha < <(spec "$1")
	if [ ! -f "$(pkgdir "$pkg" "$ver")/.lanewatch-deb" ] && [ -r "$cache/.resolved-$1" ]; then
		read -r pkg ver <"$cache/.resolved-$1"
		sha=
	fi
	printf '%s %s %s\n' "$pkg" "$ver" "$sha"
}

# newest KEY PACKAGE: the newest version the key's suite serves.
newest() {
	local suite=${1%%_*}
	suite=${suite,,}
	apt-cache madison "$2" | awk -F'|' -v s=" $suite/" 'index($3, s) {gsub(/ /,"",$2); print $2; exit}'
}

# ---------------------------------------------------------------- apt setup

need_root() {
	[ "$(id -u)" -eq 0 ] || die "writing $apt_source and running apt-get update needs root (run as root or with sudo)"
}

# base_source: prints "URIS<TAB>SIGNED_BY" of the machine's Debian entry: the
# first enabled deb stanza of /etc/apt/sources.list.d/debian.sources listing
# a base suite (one without a -updates/-security suffix), else the first such
# one-line entry of /etc/apt/sources.list. NVIDIA_APT_URIS and
# NVIDIA_APT_SIGNED_BY override both.
base_source() {
	if [ -n "${NVIDIA_APT_URIS:-}" ]; then
		printf '%s\t%s\n' "$NVIDIA_APT_URIS" "${NVIDIA_APT_SIGNED_BY:-}"
		return
	fi
	local f=/etc/apt/sources.list.d/debian.sources out=
	if [ -r "$f" ]; then
		# deb822: stanzas separated by blank lines; "#" lines are comments;
		# a field may continue on lines starting with a space (an inline
		# key in Signed-By), which are kept with "\n" joins.
		out=$(awk '
			function flush() {
				if (!done && types ~ /(^| )deb( |$)/ && enabled != "no" && uris != "" && base) {
					printf "%s\t%s\n", uris, signed; done = 1
				}
				types = uris = signed = enabled = ""; base = 0; field = ""
			}
			/^#/ { next }
			/^[ \t]*$/ { flush(); next }
			/^[ \t]/ { if (field == "signed-by") signed = signed "\\n" $0; next }
			{
				field = tolower(substr($0, 1, index($0, ":") - 1))
				val = substr($0, index($0, ":") + 1); gsub(/^[ \t]+|[ \t]+$/, "", val)
				if (field == "types") types = val
				else if (field == "uris") uris = val
				else if (field == "signed-by") signed = val
				else if (field == "enabled") enabled = tolower(val)
				else if (field == "suites") {
					n = split(val, s, /[ \t]+/)
					for (i = 1; i <= n; i++) if (s[i] != "" && s[i] !~ /-/) base = 1
				}
			}
			END { flush() }' "$f")
	fi
	if [ -z "$out" ] && [ -r /etc/apt/sources.list ]; then
		# deb [signed-by=/path ...] URI SUITE COMPONENTS...
		out=$(awk '
			$1 != "deb" { next }
			{
				signed = ""; i = 2
				if ($2 ~ /^\[/) {
					for (; i <= NF; i++) {
						o = $i; gsub(/[][]/, "", o)
						if (o ~ /^signed-by=/) signed = substr(o, 11)
						if ($i ~ /\]$/) break
					}
					i++
				}
				if ($(i + 1) !~ /-/) { printf "%s\t%s\n", $i, signed; exit }
			}' /etc/apt/sources.list)
	fi
	[ -n "$out" ] || die "no Debian deb entry found in $f or /etc/apt/sources.list; set NVIDIA_APT_URIS (and NVIDIA_APT_SIGNED_BY)"
	printf '%s\n' "$out"
}

# write_if_changed FILE CONTENT: prints "changed" when it (re)wrote FILE.
write_if_changed() {
	if [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; then
		return
	fi
	printf '%s\n' "$2" >"$1.tmp.$$"
	mv "$1.tmp.$$" "$1"
	echo changed
}

# stanza URIS SIGNED_BY_FIELD SUITE COMPONENTS: one deb822 entry.
stanza() {
	printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: %s\n' "$1" "$3" "$4"
	[ -z "$2" ] || printf '%s\n' "$2"
}

# setup_apt: writes the extra source and the trixie pin; prints "changed" if
# either file was (re)written.
setup_apt() {
	local line uris signed signed_field host_codename trixie_comps content pin changed=
	line=$(base_source)
	uris=${line%%$'\t'*}
	signed=${line#*$'\t'}
	signed_field=
	[ -z "$signed" ] || signed_field=$(printf 'Signed-By: %b' "$signed")
	# shellcheck source=/dev/null
	host_codename=$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-}")

	trixie_comps="main contrib non-free non-free-firmware"
	# On a trixie host main is configured already; the pin would hold back
	# the host's own packages, so it is only written on other hosts.
	[ "$host_codename" != trixie ] || trixie_comps="contrib non-free non-free-firmware"
	content="# Written by lanewatch scripts/nvidia/fetch.sh (copied from the machine's Debian entry).
# Only used to download NVIDIA user-space libraries; nothing is installed from it.
$(stanza "$uris" "$signed_field" bookworm "contrib non-free non-free-firmware")

$(stanza "$uris" "$signed_field" trixie "$trixie_comps")"
	[ -z "$(write_if_changed "$apt_source" "$content")" ] || changed=1

	if [ "$host_codename" != trixie ]; then
		# A negative priority: no trixie version is ever a candidate, so
		# neither "apt-get install" nor an upgrade or a dependency takes one;
		# "apt-get download name=version" still works.
		pin="# Written by lanewatch scripts/nvidia/fetch.sh: never install or upgrade from trixie;
# its NVIDIA libraries are only downloaded (apt-get download name=version).
Package: *
Pin: release n=trixie
Pin-Priority: -1"
		[ -z "$(write_if_changed "$apt_pin" "$pin")" ] || changed=1
	fi
	[ -z "$changed" ] || echo changed
}

# apt_update: refreshes only the lists of the extra source.
apt_update() {
	say "apt-get update (only $apt_source)"
	apt-get update -qq \
		-o Dir::Etc::SourceList="$apt_source" \
		-o Dir::Etc::SourceParts=- \
		-o APT::Get::List-Cleanup=0 \
		-o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false \
		-o Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false >&2 ||
		die "apt-get update failed for $apt_source (network or mirror problem?)"
}

# known PACKAGE VERSION: whether apt's lists have it ("apt-cache show p=v"
# exits 0 for an unknown version, madison does not lie).
known() {
	apt-cache madison "$1" 2>/dev/null | awk -F'|' -v v="$2" '{ gsub(/ /, "", $2) } $2 == v { f = 1 } END { exit !f }'
}

# ---------------------------------------------------------------- modes

print_candidates() {
	need_root
	setup_apt >/dev/null
	apt_update
	local key pkg ver sha newest
	for key in "${keys[@]}"; do
		read -r pkg ver sha < <(spec "$key")
		newest=$(newest "$key" "$pkg")
		[ -n "$newest" ] || die "the mirror serves no $pkg for ${key%%_*}"
		printf '%s=%s=%s' "$key" "$pkg" "$newest"
		[ "$newest" = "$ver" ] && printf '\n' || printf '   # versions.env has %s\n' "$ver"
	done
}

# report: what ended up where.
report() {
	local key pkg ver sha dir f libdir
	for key in "${keys[@]}"; do
		read -r pkg ver sha < <(resolve "$key")
		dir=$(pkgdir "$pkg" "$ver")
		if [ "$mode" = env ]; then
			libdir=$(find "$dir" -type f -name '*.so*' -printf '%h\n' | sort | head -n1)
			printf 'NVIDIA_%s_DIR=%s\n' "$key" "$libdir"
			continue
		fi
		printf '%-16s %-22s %s\n' "$key" "$pkg" "$ver"
		while IFS= read -r f; do
			printf '    %s\n' "$f"
		done < <(find "$dir" -type f -name '*.so*' | sort)
		while IFS= read -r f; do
			printf '    %s -> %s\n' "$f" "$(readlink "$f")"
		done < <(find "$dir" -type l -name '*.so*' | sort)
	done
	[ "$mode" = env ] || printf 'cache: %s (%s)\n' "$cache" "$(du -sh "$cache" | cut -f1)"
}

fetch() {
	local key pkg ver sha dir m tmp deb got alt missing=() updated=
	for key in "${keys[@]}"; do
		read -r pkg ver sha < <(resolve "$key")
		dir=$(pkgdir "$pkg" "$ver")
		[ -f "$dir/.lanewatch-deb" ] || missing+=("$key")
	done
	[ ${#missing[@]} -gt 0 ] || return 0

	need_root
	command -v apt-get >/dev/null || die "apt-get not found"
	mkdir -p "$cache"
	# Keep the cache out of git (and out of anything that copies untracked files).
	[ -f "$cache/.gitignore" ] || printf '*\n' >"$cache/.gitignore"
	exec 9>"$cache/.lock"
	flock 9

	[ -z "$(setup_apt)" ] || updated=0
	for key in "${missing[@]}"; do
		read -r pkg ver sha < <(spec "$key")
		if ! known "$pkg" "$ver"; then
			updated=0
			break
		fi
	done
	[ -z "$updated" ] || apt_update

	tmp=$(mktemp -d)
	# shellcheck disable=SC2064 # expand now: tmp is local
	trap "rm -rf '$tmp'" EXIT
	# apt-get download drops to the _apt user; let it write here.
	if id _apt >/dev/null 2>&1; then chown _apt "$tmp"; fi
	# Every version must be there before anything is downloaded. The mirror
	# keeps only a suite's current version: when a point release dropped the
	# pinned one, take the newest of the same suite (apt still checks its
	# signature; only the pinned sha256 is gone) and say so, unless
	# NVIDIA_STRICT=1 asks for the pin or nothing.
	for key in "${missing[@]}"; do
		read -r pkg ver sha < <(spec "$key")
		rm -f "$cache/.resolved-$key"
		known "$pkg" "$ver" && continue
		m=$(apt-cache madison "$pkg" 2>/dev/null | sed 's/^/    /')
		alt=$(newest "$key" "$pkg")
		if [ "${NVIDIA_STRICT:-0}" = 1 ] || [ -z "$alt" ]; then
			die "$key: $pkg=$ver is not on the mirror (any more?). It serves:
${m:-    (nothing: is $apt_source set up and updated?)}
Update $versions_file (see: $0 --candidates)."
		fi
		say "warning: $key: the mirror no longer serves the pinned $pkg=$ver; using $alt (update $versions_file: $0 --candidates)"
		printf '%s %s\n' "$pkg" "$alt" >"$cache/.resolved-$key"
	done
	for key in "${missing[@]}"; do
		read -r pkg ver sha < <(resolve "$key")
		dir=$(pkgdir "$pkg" "$ver")
		[ ! -f "$dir/.lanewatch-deb" ] || continue # another run got it meanwhile
		say "downloading $pkg=$ver"
		(cd "$tmp" && apt-get download -qq "$pkg=$ver" >&2) || die "apt-get download $pkg=$ver failed"
		deb=$(find "$tmp" -maxdepth 1 -name "${pkg}_*.deb" | head -n1)
		[ -n "$deb" ] || die "apt-get download $pkg=$ver left no .deb in $tmp"
		got=$(sha256sum "$deb" | cut -d' ' -f1)
		if [ -n "$sha" ] && [ "$got" != "$sha" ]; then
			die "$key: $(basename "$deb") has sha256 $got, versions.env expects $sha"
		elif [ -z "$sha" ]; then
			say "note: versions.env has no ${key}_SHA256_${arch_uc}; this file's is $got"
		fi
		rm -rf "$dir.tmp"
		dpkg -x "$deb" "$dir.tmp" || die "dpkg -x $(basename "$deb") failed"
		printf 'package=%s\nversion=%s\narch=%s\nfile=%s\nsha256=%s\n' \
			"$pkg" "$ver" "$arch" "$(basename "$deb")" "$got" >"$dir.tmp/.lanewatch-deb"
		rm -rf "$dir"
		mv "$dir.tmp" "$dir"
		rm -f "$deb"
	done
}

case $mode in
candidates) print_candidates ;;
*)
	fetch
	report
	;;
esac
