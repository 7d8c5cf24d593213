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
// seen. An object that certainly posts past the probes turns the
// process's own rows and every GPU's lane rows into SKIPs saying why,
// followed by what was seen; one that only can (known by its imports)
// leaves the PASS standing on what was seen, saying what it leaves out.
// Findings, other processes' rows, checks that do not judge RDMA, and
// processes whose blind spot is not RDMA stand.
func TestQualifyRDMA(t *testing.T) {
	ibgda := untracedTarget{pid: 7, scope: "pid 7 (sglang)", objects: []probes.Untraced{
		{Kind: probes.UntracedGPUInitiated, Path: "/opt/nvshmem_transport_ibgda.so.3", Sign: "named nvshmem_transport_ibgda.so.3"}}}
	gdr := untracedTarget{pid: 8, scope: "pid 8 (lmcache)", objects: []probes.Untraced{
		{Kind: probes.UntracedGDRCopy, Path: "/opt/libkv.so", Sign: "imports gdr_map"}}}
	mooncake := untracedTarget{pid: 9, scope: "pid 9 (vllm)", objects: []probes.Untraced{
		{Kind: probes.UntracedMLX5DV, Path: "/opt/libtransfer_engine.so", Sign: "imports mlx5dv_init_obj"}}}
	finding := correlate.Finding{Rule: "same-direction-overlap", Severity: correlate.SevWarn}
	in := []checks.Check{
		{Scope: "pid 7 (sglang)", Name: judge.CheckOrdering, Status: checks.Pass, Detail: "3 notifications after their data"},
		{Scope: "pid 7 (sglang)", Name: checks.CheckPageable, Status: checks.Pass, Detail: "none pageable"},
		{Scope: "pid 7 (sglang)", Name: judge.CheckOrdering, Status: checks.Skip, Detail: "no notification"},
		{Scope: "pid 9 (vllm)", Name: judge.CheckOrdering, Status: checks.Pass, Detail: "2 notifications after their data"},
		{Scope: "pid 8 (lmcache)", Name: judge.CheckOrdering, Status: checks.Pass, Detail: "1 notification after its data"},
		{Scope: "pid 10 (vllm)", Name: judge.CheckOrdering, Status: checks.Pass, Detail: "4 notifications after their data"},
		{Scope: "GPU 0000:18:00.0", Name: checks.CheckOverlap, Status: checks.Pass, Detail: "inbound: 2 flows"},
		{Scope: "GPU 0000:18:00.0", Name: checks.CheckInFlight, Status: checks.Warn, Detail: "inbound: 1 flow", Findings: []correlate.Finding{finding}},
		{Scope: "host", Name: checks.CheckCongestion, Status: checks.Pass, Detail: "no CNP"},
	}
	for _, tc := range []struct {
		name     string
		untraced []untracedTarget
		want     []string // each row: status, then its detail
	}{
		{"certain", []untracedTarget{ibgda, gdr, mooncake, {pid: 10, scope: "pid 10 (vllm)"}}, []string{
			"SKIP its RDMA is not seen: /opt/nvshmem_transport_ibgda.so.3 (named nvshmem_transport_ibgda.so.3): GPU-initiated networking: GPU kernels post the RDMA work requests themselves, with no CPU call to probe; what was seen: 3 notifications after their data",
			"PASS none pageable",
			"SKIP no notification",
			"PASS 2 notifications after their data; not judged: what it may post past the probes: /opt/libtransfer_engine.so (imports mlx5dv_init_obj): mlx5 direct verbs: it can build its own RDMA work requests and ring the NIC's doorbell, past ibv_post_send and the provider functions the agent probes",
			"PASS 1 notification after its data",
			"PASS 4 notifications after their data",
			"SKIP the RDMA of pid 7 is not seen (transfers traced): which GPU links it crosses is unknown; what was seen: inbound: 2 flows",
			"WARN inbound: 1 flow",
			"PASS no CNP",
		}},
		{"possible", []untracedTarget{gdr, mooncake}, []string{
			"PASS 3 notifications after their data",
			"PASS none pageable",
			"SKIP no notification",
			"PASS 2 notifications after their data; not judged: what it may post past the probes: /opt/libtransfer_engine.so (imports mlx5dv_init_obj): mlx5 direct verbs: it can build its own RDMA work requests and ring the NIC's doorbell, past ibv_post_send and the provider functions the agent probes",
			"PASS 1 notification after its data",
			"PASS 4 notifications after their data",
			"PASS inbound: 2 flows; not judged: what pid 9 may post past the probes (transfers traced)",
			"WARN inbound: 1 flow",
			"PASS no CNP",
		}},
		{"no RDMA blind spot", []untracedTarget{gdr}, []string{
			"PASS 3 notifications after their data", "PASS none pageable", "SKIP no notification", "PASS 2 notifications after their data",
			"PASS 1 notification after its data", "PASS 4 notifications after their data", "PASS inbound: 2 flows", "WARN inbound: 1 flow", "PASS no CNP",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &checks.Report{Checks: append([]checks.Check(nil), in...)}
			qualifyRDMA(r, tc.untraced)
			for i, c := range r.Checks {
				if got := string(c.Status) + " " + c.Detail; got != tc.want[i] || len(c.Findings) != len(in[i].Findings) {
					t.Errorf("row %d %s/%s:\n got %s\nwant %s", i, c.Scope, c.Name, got, tc.want[i])
				}
			}
		})
	}
}
