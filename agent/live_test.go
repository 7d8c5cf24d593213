package agent

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
)

// The live view counts each second's transfers per process, stream and
// direction, shows the last whole second's, the most bytes first, and
// keeps at most maxLiveFlows flows a second: the transfers of the others
// are counted, never kept.
func TestLiveFlows(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	l := newLiveFlows(t0)
	xfer := func(pid uint32, stream uint64, dir string, bytes uint64) {
		l.Transfer(&correlate.Transfer{PID: pid, Stream: stream, Direction: dir, Bytes: bytes, GPU: "0000:18:00.0"})
	}
	for range 3 {
		xfer(7, 0xa, "H2D", 1<<20)
	}
	xfer(7, 0xa, "D2H", 4<<20)
	xfer(8, 0xb, "H2D", 512)
	l.Transfer(&correlate.Transfer{PID: 7, Stream: 0xa, Direction: "H2D", Bytes: 1 << 30, Error: &correlate.CallError{Code: 1, Name: "cudaErrorInvalidValue"}})
	l.Transfer(&correlate.Transfer{PID: 9, Stream: 0xc, Direction: "D2D", BytesUnknown: true, Mover: correlate.MoverSM})

	var v Live
	l.fill(&v, t.TempDir())
	if len(v.Flows) != 0 {
		t.Fatalf("before the first second ends: %+v", v.Flows)
	}
	l.roll(t0.Add(2 * time.Second))
	xfer(7, 0xa, "H2D", 1<<40) // the next second's: not shown yet
	v = Live{}
	l.fill(&v, t.TempDir())
	want := []LiveFlow{
		{PID: 7, Stream: "0xa", Direction: "D2H", GPU: "0000:18:00.0", Bytes: 4 << 20, Copies: 1, Bps: 2 << 20},
		{PID: 7, Stream: "0xa", Direction: "H2D", GPU: "0000:18:00.0", Bytes: 3 << 20, Copies: 3, Bps: 1.5 * (1 << 20)},
		{PID: 8, Stream: "0xb", Direction: "H2D", GPU: "0000:18:00.0", Bytes: 512, Copies: 1, Bps: 256},
		{PID: 9, Stream: "0xc", Direction: "D2D", Copies: 1},
	}
	if len(v.Flows) != len(want) {
		t.Fatalf("flows %+v, want %+v", v.Flows, want)
	}
	for i := range want {
		if v.Flows[i] != want[i] {
			t.Errorf("flow %d: %+v, want %+v", i, v.Flows[i], want[i])
		}
	}
	if !v.From.Equal(t0) || !v.To.Equal(t0.Add(2*time.Second)) || v.OverCap != 0 || v.Omitted != 0 {
		t.Errorf("window %s–%s, over cap %d, omitted %d", v.From, v.To, v.OverCap, v.Omitted)
	}

	// A second with more flows than fit.
	l.roll(t0.Add(3 * time.Second))
	for i := range maxLiveFlows + 10 {
		xfer(uint32(100+i), 1, "H2D", uint64(i+1))
	}
	xfer(100, 1, "H2D", 1) // a flow kept goes on counting
	l.roll(t0.Add(4 * time.Second))
	v = Live{}
	l.fill(&v, t.TempDir())
	if v.OverCap != 10 || len(v.Flows) != liveFlowsListed || v.Omitted != maxLiveFlows-liveFlowsListed {
		t.Errorf("over cap %d (want 10), listed %d (want %d), omitted %d (want %d)", v.OverCap, len(v.Flows), liveFlowsListed,
			v.Omitted, maxLiveFlows-liveFlowsListed)
	}
	if f := v.Flows[0]; f.PID != uint32(100+maxLiveFlows-1) || f.Bytes != maxLiveFlows {
		t.Errorf("first flow %+v, want pid %d with %d bytes", f, 100+maxLiveFlows-1, maxLiveFlows)
	}
	if len(l.idx) != 0 || len(l.cur) != 0 {
		t.Errorf("a new second holds %d flows", len(l.cur))
	}

	// Directions are told apart up to maxLiveDirs; a transfer of another
	// is counted, not kept.
	for i := range maxLiveDirs + 1 {
		xfer(1, 1, "dir"+strconv.Itoa(i), 1)
	}
	l.roll(t0.Add(5 * time.Second))
	v = Live{}
	l.fill(&v, t.TempDir())
	if v.OverCap != 4 || len(v.Flows) != maxLiveDirs-3 { // after H2D, D2H and D2D, 13 new ones fit
		t.Errorf("directions: over cap %d (want 4), %d flows (want %d)", v.OverCap, len(v.Flows), maxLiveDirs-3)
	}
}

// GET /api/v1/live answers JSON with the processes' names, the latest
// window's findings (at most maxLiveFindings), and only GET or HEAD.
func TestServeLive(t *testing.T) {
	proc := t.TempDir()
	pid := os.Getpid()
	if err := os.MkdirAll(filepath.Join(proc, strconv.Itoa(pid)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, strconv.Itoa(pid), "comm"), []byte("kvpath\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	m := &metrics{cfg: RunConfig{Trace: Config{ProcRoot: proc}}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), live: newLiveFlows(t0)}
	m.live.Transfer(&correlate.Transfer{PID: uint32(pid), Stream: 0x55aa, Direction: "H2D", Bytes: 1000})
	m.live.roll(t0.Add(time.Second))
	var fs []correlate.Finding
	for i := range maxLiveFindings + 2 {
		fs = append(fs, correlate.Finding{Rule: "pageable-copy", Severity: correlate.SevWarn, Subject: "pid " + strconv.Itoa(i), Summary: "s",
			Evidence: []string{"not served"}})
	}
	m.live.setFindings(t0.Add(time.Second), fs)

	srv := httptest.NewServer(http.HandlerFunc(m.serveLive))
	defer srv.Close()
	resp, err := http.Get(srv.URL + LivePath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "application/json" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, ct)
	}
	var v Live
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	if len(v.Flows) != 1 || v.Flows[0].Comm != "kvpath" || v.Flows[0].Stream != "0x55aa" || v.Flows[0].Bps != 1000 {
		t.Errorf("flows %+v", v.Flows)
	}
	if len(v.Findings) != maxLiveFindings || v.FindingsOmitted != 2 || v.Findings[0] != (LiveFinding{"pageable-copy", "warn", "pid 0", "s"}) {
		t.Errorf("findings: %d listed, %d omitted, first %+v", len(v.Findings), v.FindingsOmitted, v.Findings[0])
	}
	if v.Lanes != nil || v.At.IsZero() {
		t.Errorf("before the probes load: lanes %+v at %s", v.Lanes, v.At)
	}
	post, err := http.Post(srv.URL+LivePath, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	post.Body.Close()
	if post.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", post.StatusCode)
	}
}

// BenchmarkLiveFlows is the live view's cost per transfer: two streams of
// one process interleaved copy by copy (link-trains-up's shape, the map
// asked at each switch), a second rolled per 400 000 transfers.
func BenchmarkLiveFlows(b *testing.B) {
	l := newLiveFlows(time.Now())
	ts := []correlate.Transfer{{PID: 7, Stream: 0xa, Direction: "H2D", Bytes: 1 << 20, GPU: "0000:18:00.0"},
		{PID: 7, Stream: 0xb, Direction: "H2D", Bytes: 1 << 20, GPU: "0000:18:00.0"}}
	b.ReportAllocs()
	for i := range b.N {
		l.Transfer(&ts[i&1])
		if i%evalEvery == evalEvery-1 {
			l.roll(time.Now())
		}
	}
}

// The page locator's goroutine and the reading one both hand transfers on
// while the second rolls and the server reads: go test -race judges it.
func TestLiveFlowsConcurrent(t *testing.T) {
	l := newLiveFlows(time.Now())
	done := make(chan struct{})
	for g := range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 20000 {
				l.Transfer(&correlate.Transfer{PID: uint32(g), Stream: uint64(i % 7), Direction: "H2D", Bytes: 1})
			}
		}()
	}
	var total uint64
	for range 50 {
		l.roll(time.Now())
		var v Live
		l.fill(&v, t.TempDir())
		for _, f := range v.Flows {
			total += f.Bytes
		}
	}
	<-done
	<-done
	l.roll(time.Now())
	var v Live
	l.fill(&v, t.TempDir())
	for _, f := range v.Flows {
		total += f.Bytes
	}
	if total != 40000 || v.OverCap != 0 {
		t.Errorf("%d bytes over the seconds, want 40000 (over cap %d)", total, v.OverCap)
	}
}
