package diagnose

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// Checklist item 3 during a live window: the reference path's HiCache load
// whose forward synchronizes the load stream before each layer's compute
// WARNs serialized-load; the same load with no compute at all SKIPs with
// the reason; without --sample the row SKIPs at host scope.
func TestDiagnoseSampleComputeOverlap(t *testing.T) {
	testenv.RequireRoot(t)
	r, pid := diagnoseWhile(t, sysfstest.Plain(t), "layer-compute-sync")
	c := findCheck(r, "pid "+itoa(pid), checks.CheckComputeOverlap)
	if c == nil || c.Status != checks.Warn || len(c.Findings) != 1 || c.Findings[0].Rule != "serialized-load" ||
		!strings.Contains(strings.Join(c.Findings[0].Evidence, "; "), "cudaStreamSynchronize x8") {
		t.Fatalf("item 3: %+v\n%s", c, reportText(r))
	}
	r, pid = diagnoseWhile(t, sysfstest.Plain(t), "hicache-load")
	if c := findCheck(r, "pid "+itoa(pid), checks.CheckComputeOverlap); c == nil || c.Status != checks.Skip ||
		!strings.Contains(c.Detail, "no compute kernel launched") {
		t.Fatalf("item 3 with no compute: %+v\n%s", c, reportText(r))
	}
}

func TestDiagnoseComputeOverlapNeedsSample(t *testing.T) {
	r, err := Run(context.Background(), Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if c := findCheck(r, "host", checks.CheckComputeOverlap); c == nil || c.Status != checks.Skip || !strings.Contains(c.Detail, "--sample") {
		t.Errorf("item 3 without a window: %+v", c)
	}
}
