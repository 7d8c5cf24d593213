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
// differs from the truth's bytes, device and pool node. storage-writeback
// reads beside D2H: the disk and the GPU under one switch, a WARN with
// storage-shared-uplink; apart, a SKIP.
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
	want := map[string]string{"storage-near-pool": "storage into the pool PASS", "storage-far-pool": "storage into the pool WARN",
		"uplink-shared": "storage vs H2D WARN", "uplink-apart": "storage vs H2D SKIP"}
	records := map[string]int{"storage-near-pool": 16, "storage-far-pool": 16, "uplink-shared": 64, "uplink-apart": 64}
	for _, r := range results {
		w, ok := want[r.Scenario]
		if !ok {
			continue
		}
		delete(want, r.Scenario)
		last := r.Problems[len(r.Problems)-1]
		if !strings.HasPrefix(last, "finding: "+w) || r.Got != records[r.Scenario] {
			t.Errorf("%s: %d records, %q", r.Scenario, r.Got, r.Problems)
		}
	}
	if len(want) > 0 {
		t.Errorf("rows missing: %v", want)
	}
}
