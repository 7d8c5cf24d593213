#!/usr/bin/env bash
# The traces section's end-to-end check against a real Jaeger v2 (docs/operating.md,
# "Traces"): builds Jaeger once in a throwaway module outside the project
# (about 8 minutes; cached in .cache/jaeger), starts it (OTLP gRPC on
# 127.0.0.1:4317, query API on 127.0.0.1:16686), then runs
# TestJaegerE2E (cmd/agent, build tag jaeger): `agent run` forwarding to
# Jaeger, the reference path's hicache-load, SGLang-shaped spans sent to the
# agent; Jaeger's query API must then hold the server's spans and one
# transfer span per copy in its request's trace, under its forward slice.
# Needs root (BPF), network access to the Go module proxy for the first build.
# With BUILD_ONLY=1 it only builds Jaeger.
set -euo pipefail
cd "$(dirname "$0")/.."
version=v1.76.0
bin=.cache/jaeger/$version/jaeger
if [ ! -x "$bin" ]; then
  tmp=$(mktemp -d)
  echo "building Jaeger $version in $tmp (takes minutes)" >&2
  (cd "$tmp" && go mod init j >/dev/null 2>&1 \
    && go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$version" \
    && go build -o jaeger github.com/jaegertracing/jaeger/cmd/jaeger)
  mkdir -p "$(dirname "$bin")"
  mv "$tmp/jaeger" "$bin"
  rm -rf "$tmp"
fi
[ "${BUILD_ONLY:-}" = 1 ] && exit 0

for port in 4317 4318 16686; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "jaeger-e2e: 127.0.0.1:$port is taken: stop what listens there" >&2
    exit 1
  fi
done
log=$(mktemp)
"$bin" >"$log" 2>&1 &
jaeger=$!
trap 'kill "$jaeger" 2>/dev/null; wait "$jaeger" 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 120); do
  if curl -fsS -o /dev/null http://127.0.0.1:16686/api/services 2>/dev/null \
    && (exec 3<>/dev/tcp/127.0.0.1/4317) 2>/dev/null; then
    break
  fi
  kill -0 "$jaeger" 2>/dev/null || { echo "jaeger exited:" >&2; cat "$log" >&2; exit 1; }
  sleep 0.5
done
curl -fsS -o /dev/null http://127.0.0.1:16686/api/services || { echo "jaeger not up after 60 s:" >&2; cat "$log" >&2; exit 1; }
LANEWATCH_JAEGER_OTLP=http://127.0.0.1:4317 LANEWATCH_JAEGER_QUERY=http://127.0.0.1:16686 \
  go test -tags jaeger -count=1 -run '^TestJaegerE2E$' -v ./cmd/agent
