#!/usr/bin/env bash
# selftest-under-load.sh [RUNS]: run `agent selftest` RUNS times (default 20)
# in a row while busy loops keep every CPU busy, and stop at the first
# failure, keeping its output. A selftest row that fails one run in N on a
# loaded machine is a defect, not noise: this is how the project looks for
# one. Needs root and a built bin/agent and refpath (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
[ -x bin/agent ] || { echo "bin/agent not built: make build" >&2; exit 2; }

hogs=()
cleanup() { [ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq "$(nproc)"); do
	sh -c 'while :; do :; done' &
	hogs+=($!)
done
echo "$(nproc) busy loops running; $runs selftest runs"

out=$(mktemp)
for i in $(seq "$runs"); do
	start=$(date +%s)
	if ./bin/agent selftest >"$out" 2>&1; then
		echo "run $i/$runs: passed ($(( $(date +%s) - start )) s)"
	else
		echo "run $i/$runs: FAILED ($(( $(date +%s) - start )) s); its output:"
		cat "$out"
		rm -f "$out"
		exit 1
	fi
done
rm -f "$out"
echo "$runs/$runs selftest runs passed under load"
