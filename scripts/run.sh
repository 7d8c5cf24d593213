#!/usr/bin/env bash
# run.sh: `make run`, a newcomer's first look. Needs root and a built
# bin/agent and refpath (make build).
#
# 1. The live view: `agent run` traces a reference KV load while `agent top`
#    prints what it sees, a block of lines per second (its line mode): the
#    lane's rate and its capacity, the processes and streams, the findings.
#    The load is kvpath link-trains-up (two streams of 1 MiB H2D copies
#    sharing the reference GPU's 1 GB/s inbound lane, about 6 s) and, two
#    seconds in, fragmented-load (2,048 copies of 4 KiB: fragmented-copies
#    fires). Each waits after its setup until released, so the agent traces
#    these two processes only (--pid). The reference GPU has no PCI
#    identity and this host's sysfs may show no GPU: the lane's GPU and
#    capacity then read unknown, as the agent says on such a host.
# 2. The selftest's table: every scenario's records against its truth.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=refpath/build
for f in bin/agent "$ref/bin/kvpath"; do
	[ -e "$f" ] || { echo "$f not built: make build" >&2; exit 2; }
done
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

# waitfor FILE PATTERN SECONDS: the first line of FILE matching PATTERN.
waitfor() {
	for _ in $(seq $((10 * $3))); do
		if grep -m1 -E "$2" "$1" 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	echo "run.sh: no '$2' in $1 within $3 s:" >&2
	cat "$1" >&2
	return 1
}

# hold FD NAME ARGS...: kvpath NAME held at its --hold point (its pid in
# held) until a line on FD, the write end of a FIFO of its own.
hold() {
	local fd=$1 name=$2
	shift 2
	mkfifo "$tmp/$name.go"
	eval "exec $fd<>\"\$tmp/\$name.go\"" # read-write: kvpath's open does not block
	LW_REF_H2D_GBPS=1 "$ref/bin/kvpath" --hold --scenario "$name" --truth "$tmp/$name.truth" "$@" <"$tmp/$name.go" >"$tmp/$name.out" 2>&1 &
	held=$!
	pids+=("$held")
	waitfor "$tmp/$name.out" '^ready' 30 >/dev/null
}
hold 3 link-trains-up --layers 8 --layer-bytes 1048576 --iterations 360
lt=$held
hold 4 fragmented-load
fl=$held

echo "== agent run, tracing kvpath link-trains-up (pid $lt) and fragmented-load (pid $fl)"
./bin/agent run --output off --pid "$lt,$fl" --lib "$ref/plain/libcudart.so.12" --lib "$ref/lib/libcuda.so.1" \
	--evaluate-interval 1s \
	--web.listen-address 127.0.0.1:0 --otlp.grpc-listen "" --otlp.http-listen "" 2>"$tmp/agent.log" &
agent=$!
pids+=($agent)
addr=$(waitfor "$tmp/agent.log" 'msg="serving metrics"' 30 | sed -E 's/.* address=([^ ]+).*/\1/')
waitfor "$tmp/agent.log" 'lanewatch running' 30 >/dev/null

echo "== agent top --once --web.listen-address $addr, every second until the load ends (q quits it on a terminal)"
echo go >&3
n=0
while kill -0 "$lt" 2>/dev/null; do
	./bin/agent top --once --web.listen-address "$addr" || break
	echo
	if [ $((n += 1)) = 2 ]; then echo go >&4; fi
done
./bin/agent top --once --web.listen-address "$addr" # the last second's findings
kill -INT "$agent"
wait "$agent" || true
grep -E 'msg=summary' "$tmp/agent.log" || true

echo
echo "== agent selftest: every reference scenario under the probes, each record against its truth"
./bin/agent selftest
