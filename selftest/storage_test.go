package selftest

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// storage-load read into its node-0 pool from this machine's disk: placed on
// node 0 the device gives PASS and no finding, placed on node 1 a WARN
// with storage-far-pool. OK() fails on any other verdict or on a flow that
// differs from the truth's bytes, device and pool node.
func TestStorageRuns(t *testing.T) {
	testenv.RequireRoot(t)
	var out bytes.Buffer
	results, stats, err := Run(context.Background(), Config{RefDir: testenv.RefDir(t), Out: &out, Scenarios: []string{},
		Runtimes: []string{}, RDMA: []string{}, Pairs: []string{}, Storage: true})
	if err != nil {
		t.Fatal(err)
	}
	ok := PrintResults(&out, results, stats)
	t.Log("\n" + out.String())
	if !ok {
		t.Fatal("selftest failed")
	}
	want := map[string]string{"storage-near-pool": "storage into the pool PASS", "storage-far-pool": "storage into the pool WARN"}
	for _, r := range results {
		w, ok := want[r.Scenario]
		if !ok {
			continue
		}
		delete(want, r.Scenario)
		if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "finding: "+w) || r.Got != 16 {
			t.Errorf("%s: %d records, %q", r.Scenario, r.Got, r.Problems)
		}
	}
	if len(want) > 0 {
		t.Errorf("rows missing: %v", want)
	}
}
