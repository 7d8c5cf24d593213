package selftest

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// The whole selftest passes: every scenario, both runtime builds.
func TestSelftest(t *testing.T) {
	testenv.RequireRoot(t)
	var out bytes.Buffer
	results, stats, err := Run(context.Background(), Config{RefDir: testenv.RefDir(t), Out: &out, KernelCopy: true, NoDevice: true, TPWorkers: true})
	if err != nil {
		t.Fatal(err)
	}
	ok := PrintResults(&out, results, stats)
	t.Log("\n" + out.String())
	if !ok {
		t.Fatal("selftest failed")
	}
	// late-attach, late-pool-pages, kernel-copy, no-device per runtime, two
	// roles per RDMA scenario, two processes per pair scenario, hicache-spans
	// three tp-workers ranks per runtime build, one per transfer-library row
	if want := 3*len(Runtimes) + 3 + (len(Scenarios)+1)*len(Runtimes) + 2*len(RDMAScenarios) + 2*len(PairScenarios) + 1 + len(XferScenarios); len(results) != want {
		t.Fatalf("%d results, want %d", len(results), want)
	}
	// The overlap verdicts by design: h2d-overlap, pd-overlap and
	// two-proc-lane flagged; the duplex scenarios (opposite directions),
	// no-overlap and big-and-trickle not. OK() already failed on a
	// wrong verdict; say which it was.
	// late-pool-pages: remote-numa-pool found from the copies' pages, the
	// pool never seen registered (OK() failed on any mismatch).
	for _, r := range results {
		if r.Scenario == PagesScenario && (len(r.Problems) == 0 || !strings.Contains(r.Problems[0], "finding: 100% of the bytes")) {
			t.Errorf("%s: no remote-numa-pool from the copies' pages: %q", r.Scenario, r.Problems)
		}
	}
	for _, r := range results {
		want := fires(r.Scenario, "same-direction-overlap")
		if r.Overlap != "" && r.Overlap != "-" && strings.HasPrefix(r.Overlap, "flagged") != want {
			t.Errorf("%s %s: overlap %s", r.Scenario, r.Runtime, r.Overlap)
		}
	}
}
