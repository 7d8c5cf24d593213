package selftest

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// link-trains-up on a reference GPU whose link idles at Gen1 x8: trained up
// to its Gen3 x8 maximum under load, the lane capacity is that maximum, the
// two flows are not a saturated lane and the link is not degraded; trained
// only to Gen2 x8, link-degraded fails. OK() fails on any other shape.
func TestLinkTrains(t *testing.T) {
	testenv.RequireRoot(t)
	var out bytes.Buffer
	results, stats, err := Run(context.Background(), Config{RefDir: testenv.RefDir(t), Out: &out, Scenarios: []string{},
		Runtimes: []string{}, RDMA: []string{}, Pairs: []string{}, LinkTrains: []LinkTrain{LinkTrainsUp, LinkStaysDown}})
	if err != nil {
		t.Fatal(err)
	}
	ok := PrintResults(&out, results, stats)
	t.Log("\n" + out.String())
	if !ok {
		t.Fatal("selftest failed")
	}
	seen := map[string]Result{}
	for _, r := range results {
		seen[r.Scenario] = r
	}
	up, down := seen[LinkTrainsUp.Name], seen[LinkStaysDown.Name]
	if up.Overlap != "none" || !strings.Contains(up.Latency, "capacity 7.88 GB/s (idle 2.00); Gen3 x8 under load") || len(up.Problems) != 0 {
		t.Errorf("%s: %s %q %q", up.Scenario, up.Overlap, up.Latency, up.Problems)
	}
	if len(down.Problems) != 1 || !strings.Contains(down.Problems[0], "finding: link runs at 5.0 GT/s of 8.0 while carrying") ||
		!strings.Contains(down.Latency, "Gen2 x8 under load") {
		t.Errorf("%s: %q %q", down.Scenario, down.Latency, down.Problems)
	}
}
