#!/usr/bin/env bash
# rss.sh [SECONDS]: `agent run`'s own peak RSS under a named load, the figure
# that sizes the Helm chart's memory request (docs/measurements.md, "Agent
# memory"). Needs root and a built bin/agent and refpath (make build).
#
# The agent runs with the DaemonSet's flags (deploy/helm/lanewatch, mode
# daemonset): records to /dev/null, --memory-limit the chart's limit, the
# host's sysfs and root (the pod's /host/sys and /proc/1/root), the OTLP
# receivers on; only its listen addresses are free loopback ports, so it can
# run beside another agent. No --lib: it finds the reference libraries in
# the load's processes, as on a node.
#
# The load, "copy-flood+churn", for SECONDS (default 30):
#   flood  kvpath callbench, 200 000 pinned 64 B cudaMemcpyAsync calls per
#          process, one process after another: the event rate
#   churn  short kvpath scenarios one after another: a new process to find,
#          attach and forget every few tens of milliseconds
# It prints the agent's VmHWM (read from /proc/PID/status before SIGINT),
# the load's copies per second as the load counted them, and the agent's
# probe events, transfers and drops per second from its /metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
limit=${RSS_MEMORY_LIMIT:-$(awk '/^resources:/{r=1} r && /^  limits:/{l=1} l && /memory:/{print $2; exit}' deploy/helm/lanewatch/values.yaml)}
limit=${limit}B # Kubernetes' 512Mi is GOMEMLIMIT's 512MiB
ref=refpath/build
for f in bin/agent "$ref/bin/kvpath"; do
	[ -x "$f" ] || { echo "$f not built: make build" >&2; exit 2; }
done

tmp=$(mktemp -d /tmp/lanewatch-rss.XXXXXX)
pids=()
cleanup() {
	[ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

read -r pm pg ph < <(python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
env -u GOMEMLIMIT -u GOGC -u OTEL_EXPORTER_OTLP_ENDPOINT -u OTEL_EXPORTER_OTLP_TRACES_ENDPOINT \
	./bin/agent run --output=/dev/null --memory-limit="$limit" --web.listen-address=127.0.0.1:"$pm" \
	--path.sysfs=/sys --path.rootfs=/ --otlp.grpc-listen=127.0.0.1:"$pg" --otlp.http-listen=127.0.0.1:"$ph" \
	2>"$tmp/agent.log" &
agent=$!
pids+=("$agent")
for _ in $(seq 600); do
	grep -q 'lanewatch running' "$tmp/agent.log" && break
	kill -0 "$agent" 2>/dev/null || { cat "$tmp/agent.log" >&2; exit 1; }
	sleep 0.1
done
grep -q 'lanewatch running' "$tmp/agent.log" || { echo "agent not running after 60 s" >&2; cat "$tmp/agent.log" >&2; exit 1; }
hwm_idle=$(awk '/^VmHWM:/{print $2}' /proc/"$agent"/status)

# metric NAME: the sum of a counter's series on the agent's /metrics.
metric() {
	python3 -c 'import sys, urllib.request
t = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=20).read().decode()
print(int(sum(float(l.rsplit(" ", 1)[1]) for l in t.splitlines() if l.startswith(sys.argv[2] + "{") or l.startswith(sys.argv[2] + " "))))' "$pm" "$1"
}
ev0=$(metric lanewatch_probe_events_total) tr0=$(metric lanewatch_transfers_total) dr0=$(metric lanewatch_probe_dropped_events_total)

start=$(date +%s.%N)
end=$(python3 -c "print($start + $seconds)")
before() { python3 -c "import time, sys; sys.exit(time.time() >= $end)"; }
(
	while before; do
		"$ref/bin/kvpath" --scenario callbench --iterations 200000 --truth /dev/null | sed -n 's/.*"calls":\([0-9]*\).*/\1/p' >>"$tmp/flood"
	done
) &
pids+=($!)
(
	while before; do
		for sc in hicache-load pageable-load fragmented-load writeback-duplex h2d-overlap big-and-trickle inflight-queued no-overlap; do
			"$ref/bin/kvpath" --scenario "$sc" --truth "$tmp/truth.jsonl" >/dev/null 2>>"$tmp/churn.log"
			grep -c '"op":"copy"' "$tmp/truth.jsonl" >>"$tmp/churn"
			echo >>"$tmp/procs"
		done
	done
) &
pids+=($!)
for p in "${pids[@]:1}"; do wait "$p" || { echo "the load failed:" >&2; cat "$tmp/churn.log" >&2; exit 1; }; done
elapsed=$(python3 -c "import time; print(time.time() - $start)")
sleep 1 # the agent's reader and evaluator catch up with the last process
hwm=$(awk '/^VmHWM:/{print $2}' /proc/"$agent"/status)
ev=$(metric lanewatch_probe_events_total) tr=$(metric lanewatch_transfers_total) dr=$(metric lanewatch_probe_dropped_events_total)
kill -INT "$agent"
wait "$agent" || { echo "agent exited uncleanly:" >&2; tail -20 "$tmp/agent.log" >&2; exit 1; }
pids=()

flood=$(awk '{s+=$1} END{print s+0}' "$tmp/flood")
churn=$(awk '{s+=$1} END{print s+0}' "$tmp/churn")
procs=$(wc -l <"$tmp/procs")
python3 - "$elapsed" "$flood" "$churn" "$procs" "$((ev - ev0))" "$((tr - tr0))" "$((dr - dr0))" "$hwm_idle" "$hwm" "$limit" <<'EOF'
import sys
el, flood, churn, procs, ev, tr, dr, idle, hwm = (float(a) for a in sys.argv[1:10])
print(f"load copy-flood+churn for {el:.1f} s: {flood:.0f} flood copies + {churn:.0f} churn copies in {procs:.0f} processes"
      f" = {(flood + churn) / el:,.0f} copies/s")
print(f"agent (--memory-limit {sys.argv[10]}): {ev / el:,.0f} probe events/s, {tr / el:,.0f} transfers/s, {dr:.0f} events dropped")
print(f"agent peak RSS (VmHWM) {hwm / 1024:.1f} MiB (idle, before the load: {idle / 1024:.1f} MiB)")
EOF
