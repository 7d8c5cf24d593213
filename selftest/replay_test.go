package selftest

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// Every real trace of testdata/replay, replayed under the real probes: for
// every copy that has a call, CUPTI's and the agent's counts and bytes
// agree per direction/host memory; every record matches the replay's
// truth; the expected verdicts (NAME.expect.json, a reader's) hold.
func TestReplayTraces(t *testing.T) {
	testenv.RequireRoot(t)
	traces, err := filepath.Glob("testdata/replay/*.json.gz")
	if err != nil || len(traces) < 4 {
		t.Fatalf("want the real traces of testdata/replay, got %v %v", traces, err)
	}
	began := time.Now()
	var out bytes.Buffer
	results, stats, err := Replay(context.Background(), Config{RefDir: testenv.RefDir(t)}, traces, DefaultReplayMaxGap)
	if err != nil {
		t.Fatal(err)
	}
	PrintReplay(&out, results, stats)
	t.Logf("replayed %d traces in %s\n%s", len(results), time.Since(began).Round(time.Millisecond), out.String())
	if len(results) != len(traces) {
		t.Fatalf("%d results for %d traces", len(results), len(traces))
	}
	graphCopies := 0
	for _, r := range results {
		if r.Expect == nil {
			t.Errorf("%s: no expected verdicts (%s)", r.Trace, ExpectPath(r.Trace))
		}
		if !r.CountsAgree() {
			t.Errorf("%s: CUPTI's copies %v, the agent's %v", r.Trace, r.CUPTI, r.Agent)
		}
		if !r.Records.OK() {
			t.Errorf("%s: records %d/%d, bytes %d/%d, %d wrong direction, %d wrong memory, %d other, %d drops: %v", r.Trace,
				r.Records.Got, r.Records.WantRecords, r.Records.GotBytes, r.Records.WantBytes, r.Records.DirectionErrs,
				r.Records.MemoryErrs, r.Records.OtherErrs, r.Records.Drops, r.Records.Problems)
		}
		for _, v := range r.Verdicts {
			t.Errorf("%s: %s", r.Trace, v)
		}
		for _, p := range r.Problems {
			t.Errorf("%s: %s", r.Trace, p)
		}
		graphCopies += r.InGraphs
	}
	if graphCopies == 0 {
		t.Error("no trace has a copy inside a graph launch")
	}
}
