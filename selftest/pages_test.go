package selftest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// checkPages passes only when every copy's pages are where the scenario
// found them, byte for byte, and the verdicts follow; each mismatch fails.
func TestCheckPages(t *testing.T) {
	truth := func(t *testing.T, end string) string {
		p := filepath.Join(t.TempDir(), "truth.jsonl")
		if err := os.WriteFile(p, []byte(`{"seq":0,"api":"cudaMemcpyAsync","op":"copy"}`+"\n"+end+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	copyOn := func(dir string, bytes uint64, nodes ...int) correlate.Transfer {
		tr := correlate.Transfer{PID: 7, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: dir, Bytes: bytes, SubmitNs: bytes, BatchIndex: -1, Layer: -1}
		tr.SetPages(correlate.PagesOn(nodes...))
		return tr
	}
	good := func() []correlate.Transfer {
		return []correlate.Transfer{
			copyOn(correlate.DirH2D, 32<<20, 0, 0, 0),
			copyOn(correlate.DirD2H, 16<<20, 0, 0, 0),
			{PID: 7, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: correlate.DirD2D, Bytes: 1 << 20}, // not host memory: not counted
		}
	}
	end := `{"end":true,"calls":1,"host_page_node":0,"copies":2}`
	for _, tc := range []struct {
		name    string
		end     string
		mutate  func([]correlate.Transfer) []correlate.Transfer
		problem string // "" : passes
	}{
		{"exact", end, func(g []correlate.Transfer) []correlate.Transfer { return g }, ""},
		{"a copy on another node", end, func(g []correlate.Transfer) []correlate.Transfer {
			g[1] = copyOn(correlate.DirD2H, 16<<20, 1, 1, 1)
			return g
		}, "numa_node N1"},
		{"one sampled page elsewhere", end, func(g []correlate.Transfer) []correlate.Transfer {
			g[0] = copyOn(correlate.DirH2D, 32<<20, 0, 1, 0)
			return g
		}, "sampled pages [0,1,0]"},
		{"a copy not located", end, func(g []correlate.Transfer) []correlate.Transfer {
			g[0] = copyOn(correlate.DirH2D, 32<<20)
			return g
		}, "numa_node unknown"},
		{"a copy missing", end, func(g []correlate.Transfer) []correlate.Transfer { return g[1:] }, "1 host↔device copies reported, the scenario made 2"},
		{"pages on several nodes", `{"end":true,"calls":1,"host_page_node":-1,"copies":2}`, func(g []correlate.Transfer) []correlate.Transfer { return g },
			"not all on one node"},
		{"no node in the truth", `{"end":true,"calls":1,"copies":2}`, func(g []correlate.Transfer) []correlate.Transfer { return g }, "no host_page_node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Result{}
			checkPages(&res, PagesScenario, 7, truth(t, tc.end), tc.mutate(good()))
			text := strings.Join(res.Problems, "\n")
			if tc.problem == "" {
				if !res.OK() || len(res.Problems) != 1 || !strings.HasPrefix(res.Problems[0], "finding: 100% of the bytes") {
					t.Errorf("want a pass with the finding noted, got %q", res.Problems)
				}
				return
			}
			if res.OK() || !strings.Contains(text, tc.problem) {
				t.Errorf("want a failure naming %q, got ok=%v %q", tc.problem, res.OK(), res.Problems)
			}
		})
	}
	// Other scenarios are not judged here.
	res := Result{}
	checkPages(&res, "hicache-load", 7, "/nonexistent", nil)
	if !res.OK() || len(res.Problems) != 0 {
		t.Errorf("hicache-load: %+v", res)
	}
}
