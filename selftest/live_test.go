package selftest

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// TestLiveLine feeds the live view records of a real `agent selftest`
// run (testdata/live/records.jsonl: copies of private-lane processes,
// failed calls, kernel copies and copies on a shared reference GPU,
// a peer copy, RDMA receives and WRITE_IMMs into another process's
// GPU) and rows shaped as Run finishes them, and checks the second's
// line to the character: its format is what `make run` shows.
func TestLiveLine(t *testing.T) {
	f, err := os.Open("testdata/live/records.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []correlate.Transfer
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		var r correlate.Transfer
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("records.jsonl:%d: %v", line, err)
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	v := newLiveView(nil)
	// The run's reference GPUs by name; the address of one the records
	// name but no process sees (the peer copy's) stays an address.
	names := map[string]string{}
	for _, n := range []string{"gpu-prefill", "gpu-decode", "selftest-26737"} {
		names[refenv.BusID(n)] = n
	}
	v.gpuName = func(busID string, _ uint32) string { return names[busID] }
	for i := range recs {
		v.transfer(&recs[i])
	}
	v.row(Result{Scenario: "pageable-load", Runtime: "plain", WantRecords: 32, Got: 32, Overlap: "none", Raised: []string{"pageable-copy/fail"}})
	v.row(Result{Scenario: "inflight-serial", Runtime: "plain", WantRecords: 256, Got: 256, Overlap: "none",
		Raised: []string{"fragmented-copies/warn", "too-little-in-flight/warn"}})
	v.row(Result{Scenario: "h2d-overlap", Runtime: "cet", WantRecords: 64, Got: 63, Overlap: "flagged", Raised: []string{"same-direction-overlap/warn"}})
	v.row(Result{Scenario: "hicache-load", Runtime: "cet", WantRecords: 32, Got: 32, Overlap: "none"})

	got := v.take(3*time.Second, time.Second).line()
	// in: 3 MiB by pid 26745 and by selftest-26737's H2Ds, 2 MiB of
	// WRITE_IMM into pid 26911's GPU (the agent knows it by placement
	// only); out: those 2 MiB from gpu-prefill, 2 MiB of pid 26748's D2Hs,
	// 1 MiB off selftest-26737. Failed calls, kernel copies (bytes
	// unknown), the peer copy and the receives (into memory not known to
	// be a GPU's) are on no lane.
	want := "   3.0s     18 copies (2 failed)" +
		"  in pid 26745 0.00315, selftest-26737 0.00315, pid 26911 0.0021" +
		"  out gpu-prefill 0.0021, pid 26748 0.0021, selftest-26737 0.00105" +
		"  rows 4 (FAIL h2d-overlap/cet)  findings 4: fragmented-copies, pageable-copy, same-direction-overlap, too-little-in-flight"
	if got != want {
		t.Errorf("live line\n got %q\nwant %q", got, want)
	}
	// The second is handed over: the next one has nothing, and says nothing.
	if got := v.take(4*time.Second, time.Second).line(); got != "" {
		t.Errorf("an empty second printed %q", got)
	}
}

// TestLiveLineBounded: a second on many GPUs names the busiest few of
// each direction and counts the rest, so its line stays one line.
func TestLiveLineBounded(t *testing.T) {
	s := liveSecond{At: 12400 * time.Millisecond, Copies: 2048,
		In:  []laneRate{{"gpu-3", 3.98}, {"gpu-1", 0.5}, {"gpu-0", 0.0004}, {"gpu-2", 0.0003}, {"gpu-4", 0.0001}},
		Out: []laneRate{{"pid 7", 0.25}}, Rows: 2}
	want := "  12.4s   2048 copies  in gpu-3 3.98, gpu-1 0.5, gpu-0 <0.001, +2 more  out pid 7 0.25  rows 2" // rows that raised nothing: no findings part
	if got := s.line(); got != want {
		t.Errorf("live line\n got %q\nwant %q", got, want)
	}
	if strings.Contains(s.line(), "\n") {
		t.Error("a second took more than a line")
	}
}
