package diagnose

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

func findCheck(r *checks.Report, scopePrefix, name string) *checks.Check {
	for i, c := range r.Checks {
		if strings.HasPrefix(c.Scope, scopePrefix) && c.Name == name {
			return &r.Checks[i]
		}
	}
	return nil
}

func reportText(r *checks.Report) string {
	var b bytes.Buffer
	r.WriteText(&b)
	return b.String()
}

// On a host with nothing to check (one NUMA node, a virtio disk, no GPU,
// no RDMA, no process) the static checklist runs and says what is absent
// instead of failing.
func TestDiagnoseNothingToCheck(t *testing.T) {
	r, err := Run(context.Background(), Config{ProcRoot: t.TempDir(), SysRoot: sysfstest.Plain(t), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	text := reportText(r)
	if c := findCheck(r, "host", "PCI topology"); c == nil || c.Status != checks.Skip || !strings.Contains(c.Detail, "no GPU on this host") {
		t.Errorf("PCI topology: %+v", c)
	}
	if c := findCheck(r, "host", "RDMA NIC per GPU"); c == nil || c.Status != checks.Skip || !strings.Contains(c.Detail, "no RDMA device") {
		t.Errorf("RDMA: %+v", c)
	}
	if r.Failed() {
		t.Errorf("a host with nothing to check failed:\n%s", text)
	}
}

// diagnoseWhile runs diagnose with a live window during which the reference
// data path runs one scenario, and returns the report and the scenario's pid.
func diagnoseWhile(t *testing.T, sysRoot, scenario string, extra ...string) (*checks.Report, int) {
	t.Helper()
	ref := testenv.RefDir(t)
	var cmd *exec.Cmd
	started := make(chan error, 1)
	cfg := Config{
		SysRoot: sysRoot,
		Sample:  2 * time.Second,
		Libs:    []string{filepath.Join(ref, "plain", "libcudart.so.12"), filepath.Join(ref, "lib", "libcuda.so.1")},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Kernels: true, // as `agent diagnose` does by default
		OnSampleStart: func() {
			args := append([]string{"--scenario", scenario, "--truth", filepath.Join(t.TempDir(), "truth.jsonl")}, extra...)
			cmd = exec.Command(filepath.Join(ref, "bin", "kvpath"), args...)
			cmd.Stderr = os.Stderr
			started <- cmd.Start()
		},
	}
	done := make(chan struct{})
	var r *checks.Report
	var err error
	go func() { r, err = Run(context.Background(), cfg); close(done) }()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%s: %v", scenario, err)
	}
	<-done
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("agent diagnose --sample during %s:\n%s", scenario, reportText(r))
	return r, cmd.Process.Pid
}

func TestDiagnoseSamplePageableLoad(t *testing.T) {
	testenv.RequireRoot(t)
	r, pid := diagnoseWhile(t, sysfstest.Plain(t), "pageable-load")
	c := findCheck(r, "pid "+itoa(pid), "pageable copies")
	if c == nil || c.Status != checks.Fail || len(c.Findings) != 1 || c.Findings[0].Rule != "pageable-copy" ||
		!strings.Contains(c.Findings[0].Summary, "32 copies (32 MiB, 100% of the host↔GPU bytes)") {
		t.Fatalf("pageable copies: %+v\n%s", c, reportText(r))
	}
	if !r.Failed() {
		t.Error("report with a FAIL says it did not fail")
	}
}

func TestDiagnoseSampleHicacheLoad(t *testing.T) {
	testenv.RequireRoot(t)
	r, pid := diagnoseWhile(t, sysfstest.Plain(t), "hicache-load")
	c := findCheck(r, "pid "+itoa(pid), "pageable copies")
	if c == nil || c.Status != checks.Pass || !strings.Contains(c.Detail, "32 transfers, none from pageable memory") {
		t.Fatalf("pageable copies: %+v\n%s", c, reportText(r))
	}
	// The storage leg, from this host's /proc/diskstats placed in the
	// plain sysfs: listed, never judged.
	if c := findCheck(r, "host", checks.CheckStorage); c == nil || c.Status != checks.Info || !strings.Contains(c.Detail, " block devices, ") {
		t.Errorf("storage devices: %+v", c)
	}
	// No nvidia_fs in the plain sysfs: INFO, unless a process of this
	// machine maps libcufile (compatibility mode: WARN).
	gds := checks.Info
	if cufileMapped(t) {
		gds = checks.Warn
	}
	if c := findCheck(r, "host", checks.CheckGDS); c == nil || c.Status != gds || !strings.HasPrefix(c.Detail, "nvidia_fs module not loaded;") {
		t.Errorf("GPUDirect Storage: %+v, want %s", c, gds)
	}
	// Items 6 and 7: reads not traced without --trace-storage-reads; the
	// plain sysfs places no disk under a switch.
	if c := findCheck(r, "host", checks.CheckStorageDirect); c == nil || c.Status != checks.Skip || !strings.Contains(c.Detail, "--trace-storage-reads") {
		t.Errorf("storage into the pool: %+v", c)
	}
	if c := findCheck(r, "host", checks.CheckStorageUplink); c == nil || c.Status != checks.Skip ||
		(c.Detail != "no storage device was busy" && !strings.Contains(c.Detail, "no busy storage device shares a switch with a GPU")) {
		t.Errorf("storage vs H2D: %+v", c)
	}
	// Other tests' processes using the same reference libraries may share
	// the window: only the host and this scenario's process are judged.
	for _, c := range r.Checks {
		if c.Status == checks.Fail && (c.Scope == "host" || strings.HasPrefix(c.Scope+" ", "pid "+itoa(pid)+" ")) {
			t.Errorf("hicache-load failed %s/%s:\n%s", c.Scope, c.Name, reportText(r))
		}
	}
}

// A sysfs tree whose only GPU sits on node 1 while this machine put the
// pool's pages on node 0: the pool is remote.
func TestDiagnoseRemoteNUMAPool(t *testing.T) {
	testenv.RequireRoot(t)
	sys := sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0", Distance: "10 21", Package: "0"}, {CPUs: "1", Distance: "21 10", Package: "1"}},
		Funcs: []sysfstest.Func{
			{BDF: "0000:80:01.0", HB: "pci0000:80", Class: "0x060400", Vendor: "0x1022", Device: "0x14ab", NUMA: "1",
				Cur: "32.0 GT/s PCIe", Max: "32.0 GT/s PCIe", CurW: "16", MaxW: "16"},
			{BDF: "0000:81:00.0", Parent: "0000:80:01.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2335", NUMA: "1",
				Cur: "32.0 GT/s PCIe", Max: "32.0 GT/s PCIe", CurW: "16", MaxW: "16"},
		},
	})
	sysfstest.Write(t, filepath.Join(sys, "devices", "system", "node", "online"), "0-1\n")
	// 256 layers keep the process alive long enough for its pool to be located.
	r, pid := diagnoseWhile(t, sys, "hicache-load", "--layers", "256")
	c := findCheck(r, "pid "+itoa(pid), "pinned pool placement")
	if c == nil || c.Status != checks.Fail || len(c.Findings) == 0 || c.Findings[0].Rule != "remote-numa-pool" ||
		!strings.Contains(strings.Join(c.Findings[0].Evidence, " "), "N0=") {
		t.Fatalf("pool placement: %+v\n%s", c, reportText(r))
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// cufileMapped says whether a process of this machine maps libcufile, read
// from /proc/PID/maps text (the check reads map_files).
func cufileMapped(t *testing.T) bool {
	t.Helper()
	maps, err := filepath.Glob("/proc/[0-9]*/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range maps {
		if b, err := os.ReadFile(m); err == nil && strings.Contains(string(b), "/libcufile") {
			return true
		}
	}
	return false
}
