# lanewatch — see README.md. Every target that loads BPF needs root.
GO      ?= go
PYTHON  ?= python3
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
REFPATH := refpath/build
# go-nvml's cgo prologue calls functions NVML marks deprecated: keep the build quiet.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: help generate generate-check refpath nvidia-libs build image lint test deploy-generate deploy-check docs jaeger-e2e run bench rss selftest-load soak fuzz clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

generate: ## regenerate the Go bindings and .o files from bpf/*.c (needs clang, libbpf-dev)
	$(GO) generate ./probes

generate-check: generate ## regenerate and fail if the committed bindings differ
	@git diff --exit-code --stat -- probes/ bpf/ || { echo "generated BPF files are stale: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- probes/ | grep '^??')" || { echo "untracked generated files in probes/"; exit 1; }

refpath: ## build the reference KV data path (C libraries and scenario drivers)
	$(MAKE) -C refpath

nvidia-libs: ## fetch NVIDIA's real user-space libraries (Debian contrib/non-free, unpacked, never installed) into .cache/nvidia
	$(SUDO) bash scripts/nvidia/fetch.sh >/dev/null

build: refpath ## build bin/agent and the reference data path
	$(GO) build -o bin/agent ./cmd/agent

image: build ## the agent's container image (podman, FROM scratch: bin/agent and the C libraries it loads, no shell) and its seccomp profile; prints the size
	$(SUDO) bash scripts/image/build.sh bin/agent localhost/lanewatch-agent:dev

# staticcheck is a tool in go.mod; `go tool -n` builds it for this machine, so the arm64
# run and deploy/ (its own module, without the tool) reuse that binary.
lint: ## staticcheck on the tree (also its arm64 build, as vet) and on deploy/
	$(GO) tool staticcheck ./...
	GOARCH=arm64 CGO_ENABLED=0 $$($(GO) tool -n staticcheck) ./...
	cd deploy && $$($(GO) -C .. tool -n staticcheck) ./...

test: build nvidia-libs ## vet, staticcheck, check generated files, promtool on the alert rules, the GPU check script's and the seccomp script's unit tests, run every test (BPF tests need root), deploy-check
	$(GO) vet ./...
	GOARCH=arm64 CGO_ENABLED=0 $(GO) vet ./... # the arm64 build (its BPF objects, the site policy) cannot rot
	$(MAKE) lint
	$(MAKE) generate-check
	bash dashboards/check.sh
	$(PYTHON) -m unittest discover -s scripts/gpucheck -p 'test_*.py' # the GPU check script's non-GPU parts (and, as root, the script under the agent on the reference data path)
	$(PYTHON) -m unittest discover -s scripts/image -p 'test_*.py' # the image's seccomp profiles: derived from podman's, resolved for Kubernetes
	$(SUDO) $(GO) test -count=1 -p 1 ./... # one package at a time: the BPF and e2e tests judge rates, and each package traces every process using the reference libraries
	$(GO) test -run '^$$' -bench . -benchtime 1x ./correlate ./event ./exporters ./judge ./otlpbridge # every benchmark once (the probe costs one short round), so `make bench` cannot rot
	$(SUDO) $(GO) test -short -p 1 -run '^$$' -bench . -benchtime 1x ./probes ./agent # one package at a time: the agent's would trace the probes' runs
	$(MAKE) deploy-check

deploy-generate: ## regenerate deploy/'s plain manifests and the chart's copies of dashboards/ from the Helm chart
	cd deploy && $(GO) generate ./...

deploy-check: ## render the Helm chart in both modes, decode every object and manifest strictly into the Kubernetes types, check generated files (deploy/ is its own module)
	cd deploy && $(GO) vet ./... && $(GO) test -count=1 ./...

docs: ## write docs/rules.md, docs/metrics.md and docs/flags.md from the code (cmd/agent's TestGeneratedDocs fails when they are stale)
	$(GO) test -count=1 -run '^TestGeneratedDocs$$' ./cmd/agent -args -update-docs

jaeger-e2e: build ## the traces section's end-to-end check against a real Jaeger v2 (first run builds Jaeger into .cache/jaeger: minutes)
	$(SUDO) bash scripts/jaeger-e2e.sh

run: build ## agent run on a reference KV load with agent top's live view (a block of lines per second), then the selftest's table
	$(SUDO) bash scripts/run.sh

bench: build nvidia-libs ## per-call probe cost (reference stack: none / bpftrace-equivalent pair / bpftrace / lanewatch; NVIDIA's drivers: none / empty program / lanewatch; a UCX put: the same), the whole agent run beside 1 and 2 full-speed copiers and a burst (events/s, drops, agent CPU per event, added ns per call; CPU per event per output: metrics only, JSONL, spans), the agent's UCX records/s at a perftest's full rate, pipeline throughput and the agent's CPU per event beside it (BenchmarkAgentHandle), span attribution cost vs spans held, agent peak RSS (selftest; make rss)
	$(SUDO) $(GO) test -p 1 -run '^$$' -bench . -benchtime 1x -count 1 ./probes ./agent
	{ $(GO) test -run '^$$' -bench Pipeline -benchmem -cpu 1 ./correlate; $(SUDO) $(GO) test -run '^$$' -bench AgentHandle -benchmem -cpu 1 ./agent; } | awk '{print} $$1 ~ /^BenchmarkPipeline(-[0-9]+)?$$/{p=$$3} $$1 ~ /^BenchmarkAgentHandle/{for (i=1;i<NF;i++) if ($$(i+1)=="cpu-ns/event") a=$$i} END{if (p > 0 && a > 0) printf "the agent'"'"'s CPU per event (handle, page stage, metrics, evaluator) / BenchmarkPipeline: %.1fx\n", a/p}'
	$(GO) test -run '^$$' -bench CorrelateExport -cpu 1 ./exporters   # correlate + batched spans: events/s, spans per 1 000 transfers
	$(GO) test -run '^$$' -bench SpanVolume -benchtime 1x ./exporters   # spans per second per node at 20 requests/s, by span mode and sampling (docs/measurements.md, "Trace volume")
	$(GO) test -run '^$$' -bench Attribute -cpu 1 ./otlpbridge | awk '{print} /spans=/{ns[++n]=$$3} END{if (n == 3) printf "attribution ns/op ratio 10k/1k %.2f, 100k/1k %.2f (flat: ~1; a scan per transfer: 10, 100)\n", ns[2]/ns[1], ns[3]/ns[1]}'
	$(SUDO) ./bin/agent selftest | tail -n 3
	$(MAKE) rss

rss: build ## `agent run`'s peak RSS with the DaemonSet's flags under the load copy-flood+churn for RSS_SECONDS (default 30): the figure behind the Helm chart's memory request
	$(SUDO) bash scripts/rss.sh $(or $(RSS_SECONDS),30)

selftest-load: build ## agent selftest RUNS times (default 20) in a row with every CPU kept busy; stops at the first failure
	$(SUDO) bash scripts/selftest-under-load.sh $(or $(RUNS),20)

soak: build ## bin/agent for DURATION (default 10m) under process churn, normal and hostile OTLP traffic, scrapes and a flapping upstream; a line every interval; fails on growth after warm-up, any lost or wrong record, any drop, an unclean exit (SOAKFLAGS: more flags, bin/soak -h)
	$(GO) build -o bin/soak ./selftest/soak/cmd/soak
	$(SUDO) ./bin/soak -duration $(or $(DURATION),10m) $(SOAKFLAGS)

# Go minimises every new interesting input with O(n²) runs, up to a minute each by
# default, fuzzing nothing meanwhile (golang/go#48820): FUZZMINIMIZE bounds it in runs.
fuzz: ## run every fuzz target for FUZZTIME (default 15s) each, minimising each new input in at most FUZZMINIMIZE runs (default 2000x)
	@for pkg in $$($(GO) list ./...); do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$t"; $(GO) test $$pkg -run '^$$' -fuzz "^$$t$$" -fuzztime $(or $(FUZZTIME),15s) -fuzzminimizetime $(or $(FUZZMINIMIZE),2000x) || exit 1; \
	  done; \
	done

clean: ## remove build outputs
	rm -rf bin
	$(MAKE) -C refpath clean
