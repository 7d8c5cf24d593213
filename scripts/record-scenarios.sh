#!/usr/bin/env bash
# Records the raw probe events (agent run --record: struct lw_event records)
# of reference scenarios, for the replay tests and benchmarks that read them:
#   correlate/testdata/hicache-load.events (+ its truth)
#   checks/testdata/events/{pageable-load,fragmented-load,h2d-overlap,writeback-duplex}.events
# Run it (as root, after `make build`) whenever struct lw_event or the probe
# table changes: a recording of the old layout no longer decodes.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=refpath/build
if [ ! -x bin/agent ] || [ ! -x "$ref/bin/kvpath" ]; then echo "run make build first" >&2; exit 1; fi

# record SCENARIO EVENTS [TRUTH]
record() {
	local scenario=$1 out=$2 truth=${3:-} tmp agent
	tmp=$(mktemp -d)
	./bin/agent run --lib "$ref/lib/libcuda.so.1" --lib "$ref/plain/libcudart.so.12" \
		--record "$tmp/run.events" --output /dev/null \
		--web.listen-address "" --otlp.grpc-listen "" --otlp.http-listen "" 2>"$tmp/log" &
	agent=$!
	for _ in $(seq 100); do
		grep -q "probes attached" "$tmp/log" && break
		sleep 0.1
	done
	grep -q "probes attached" "$tmp/log" || { cat "$tmp/log" >&2; kill "$agent"; exit 1; }
	"$ref/bin/kvpath" --scenario "$scenario" --truth "$tmp/truth.jsonl" >/dev/null
	sleep 1 # the process's exit and last events reach the ring
	kill -INT "$agent"
	wait "$agent"
	cp "$tmp/run.events" "$out"
	[ -z "$truth" ] || cp "$tmp/truth.jsonl" "$truth"
	echo "$scenario: $(($(stat -c %s "$out") / 128)) events -> $out"
	rm -rf "$tmp"
}

record hicache-load correlate/testdata/hicache-load.events correlate/testdata/hicache-load.truth.jsonl
for s in pageable-load fragmented-load h2d-overlap writeback-duplex; do
	record "$s" "checks/testdata/events/$s.events"
done
