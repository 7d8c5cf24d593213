package diagnose

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/probes"
)

// A real process that dlopens an object posting through mlx5 direct verbs
// is named by `agent diagnose` with the object and why; the test's own
// process, which maps none, passes.
func TestDiagnoseNamesUntracedProcess(t *testing.T) {
	testenv.RequireRoot(t)
	lib := testenv.DirectVerbsLib(t, t.TempDir())
	pid, _ := testenv.LoadingProcess(t, lib)
	r, err := Run(context.Background(), Config{SysRoot: sysfstest.Plain(t), PIDs: []int{pid, os.Getpid()},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	c := findCheck(r, "pid "+itoa(pid)+" ", CheckTraced)
	if c == nil || c.Status != checks.Skip || !strings.Contains(c.Detail, lib+" (imports mlx5dv_init_obj): mlx5 direct verbs") || c.Fix == "" {
		t.Errorf("%s: %+v\n%s", CheckTraced, c, reportText(r))
	}
	if c := findCheck(r, "pid "+itoa(os.Getpid())+" ", CheckTraced); c == nil || c.Status != checks.Pass {
		t.Errorf("%s of a process mapping none: %+v", CheckTraced, c)
	}
}

// A PASS of an RDMA check never vouches for a process whose RDMA is not
// seen: its own rows and every GPU's lane rows become SKIPs saying why,
// followed by what was seen; findings, other processes' rows, checks that
// do not judge RDMA, and processes whose blind spot is not RDMA stand.
func TestQualifyRDMA(t *testing.T) {
	ibgda := untracedTarget{pid: 7, scope: "pid 7 (sglang)", objects: []probes.Untraced{
		{Kind: probes.UntracedGPUInitiated, Path: "/opt/nvshmem_transport_ibgda.so.3", Sign: "named nvshmem_transport_ibgda.so.3"}}}
	gdr := untracedTarget{pid: 8, scope: "pid 8 (lmcache)", objects: []probes.Untraced{
		{Kind: probes.UntracedGDRCopy, Path: "/opt/libkv.so", Sign: "imports gdr_map"}}}
	finding := correlate.Finding{Rule: "same-direction-overlap", Severity: correlate.SevWarn}
	in := []checks.Check{
		{Scope: "pid 7 (sglang)", Name: judge.CheckOrdering, Status: checks.Pass, Detail: "3 notifications after their data"},
		{Scope: "pid 7 (sglang)", Name: checks.CheckPageable, Status: checks.Pass, Detail: "none pageable"},
		{Scope: "pid 7 (sglang)", Name: judge.CheckOrdering, Status: checks.Skip, Detail: "no notification"},
		{Scope: "pid 9 (vllm)", Name: judge.CheckOrdering, Status: checks.Pass, Detail: "2 notifications after their data"},
		{Scope: "pid 8 (lmcache)", Name: judge.CheckOrdering, Status: checks.Pass, Detail: "1 notification after its data"},
		{Scope: "GPU 0000:18:00.0", Name: checks.CheckOverlap, Status: checks.Pass, Detail: "inbound: 2 flows"},
		{Scope: "GPU 0000:18:00.0", Name: checks.CheckInFlight, Status: checks.Warn, Detail: "inbound: 1 flow", Findings: []correlate.Finding{finding}},
		{Scope: "host", Name: checks.CheckCongestion, Status: checks.Pass, Detail: "no CNP"},
	}
	want := []struct {
		status checks.Status
		detail string // prefix
	}{
		{checks.Skip, "its RDMA is not seen: /opt/nvshmem_transport_ibgda.so.3 (named nvshmem_transport_ibgda.so.3): GPU-initiated networking"},
		{checks.Pass, "none pageable"},
		{checks.Skip, "no notification"},
		{checks.Pass, "2 notifications"},
		{checks.Pass, "1 notification"},
		{checks.Skip, "the RDMA of pid 7 is not seen (transfers traced): which GPU links it crosses is unknown; what was seen: inbound: 2 flows"},
		{checks.Warn, "inbound: 1 flow"},
		{checks.Pass, "no CNP"},
	}
	r := &checks.Report{Checks: append([]checks.Check(nil), in...)}
	qualifyRDMA(r, []untracedTarget{ibgda, gdr, {pid: 9, scope: "pid 9 (vllm)"}})
	for i, c := range r.Checks {
		if c.Status != want[i].status || !strings.HasPrefix(c.Detail, want[i].detail) || len(c.Findings) != len(in[i].Findings) {
			t.Errorf("row %d %s/%s: %s %q, want %s %q…", i, c.Scope, c.Name, c.Status, c.Detail, want[i].status, want[i].detail)
		}
	}
	if !strings.HasSuffix(r.Checks[0].Detail, "; what was seen: 3 notifications after their data") {
		t.Errorf("what was seen is lost: %q", r.Checks[0].Detail)
	}
	// No process whose RDMA is unseen: nothing changes.
	r = &checks.Report{Checks: append([]checks.Check(nil), in...)}
	qualifyRDMA(r, []untracedTarget{gdr})
	for i, c := range r.Checks {
		if c.Status != in[i].Status || c.Detail != in[i].Detail {
			t.Errorf("row %d changed without an RDMA blind spot: %+v", i, c)
		}
	}
}
