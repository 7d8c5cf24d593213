package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
)

// TestRunStopsWithFullIndex: `agent run` whose span index is full of
// llm_request spans that all cover its held transfers (200 000 of them,
// past its budget) stops on SIGTERM at once and says what became of the
// transfers: ambiguous (too many requests cover them to tell), or not
// asked because it was stopping. The index once took minutes per
// evaluation here (every covering span compared with every other) and
// ignored the signal meanwhile. The 60 s limit only keeps a hang from
// stalling the suite; the time taken is logged.
func TestRunStopsWithFullIndex(t *testing.T) {
	testenv.RequireRoot(t)
	refDir := testenv.RefDir(t)
	upstream(t)
	grpcAddr := freePort(t)
	tmp := t.TempDir()
	a := startAgent(t, 30*time.Second, "--output", filepath.Join(tmp, "out.jsonl"),
		"--lib", filepath.Join(refDir, "lib", "libcuda.so.1"), "--lib", filepath.Join(refDir, "plain", "libcudart.so.12"),
		"--otlp.grpc-listen", grpcAddr, "--otlp.http-listen", "", "--spans.hold", "1h", "--web.listen-address", "")

	// Older vLLM's llm_request (no process attribute: any process), from
	// a minute ago to a minute ahead.
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := collectorpb.NewTraceServiceClient(conn)
	ids := shapes.NewIDs(0x570b)
	now := time.Now().UnixNano()
	const n, per = 200_000, 5_000
	for b := range n / per {
		spans := make([]*tracepb.Span, 0, per)
		for i := range per {
			_, sp := shapes.VLLMSpan(shapes.VLLMOlder, ids, shapes.VLLMRequest{ID: fmt.Sprintf("cmpl-flood-%d-0", b*per+i),
				Arrival: now - int64(time.Minute), Finish: now + int64(time.Minute)})
			spans = append(spans, sp)
		}
		req := &collectorpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
			shapes.Batch(shapes.VLLMResource(shapes.VLLMOlder, 0), shapes.VLLMScope(shapes.VLLMOlder), spans...)}}
		if _, err := client.Export(context.Background(), req); err != nil {
			t.Fatalf("send spans %d: %v", b*per, err)
		}
	}
	runScenario(t, refDir, "hicache-load", filepath.Join(tmp, "truth.jsonl"))
	time.Sleep(time.Second) // the engine emits the scenario's transfers at its exit

	sent := time.Now()
	a.stop(t, time.Minute)
	took := time.Since(sent)
	line := func(msg string) string {
		for _, l := range strings.Split(a.stderr.String(), "\n") {
			if strings.Contains(l, msg) && strings.Contains(l, "spans=") {
				return l
			}
		}
		return ""
	}
	spansLine, bridgeLine := line("transfer spans"), line("OTLP bridge")
	logs := spansLine + "\n" + bridgeLine
	t.Logf("stopped %v after SIGTERM\n%s", took.Round(time.Millisecond), logs)
	num := func(l, key string) int {
		m := regexp.MustCompile(`\b` + key + `=(\d+)`).FindStringSubmatch(l)
		if m == nil {
			return 0
		}
		v, _ := strconv.Atoi(m[1])
		return v
	}
	transfers := num(spansLine, "transfers")
	none := num(spansLine, "unattributed_ambiguous") + num(spansLine, "unattributed_stopping")
	if transfers < 32 || none != transfers || num(spansLine, "attributed") != 0 || num(spansLine, "batch") != 0 {
		t.Errorf("%d transfers, %d ambiguous or not asked; want the scenario's 32 at least, every one ambiguous or not asked:\n%s", transfers, none, logs)
	}
	if num(bridgeLine, "cap_evicted") == 0 {
		t.Errorf("the index never filled (no span evicted by its budget):\n%s", logs)
	}
}
