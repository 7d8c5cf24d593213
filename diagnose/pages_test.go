package diagnose

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/internal/ktext"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// Late attach with a pool the agent never saw registered: the pool was
// registered before the window opened, the copies from and into it (and
// from fresh pageable memory) come during it. The sysfs tree puts the only
// GPU on a node past this machine's last, where no page of it can be; the
// pages are where this machine put them, which the scenario reads itself
// (host_page_node). remote-numa-pool fires from the copies' pages, on every
// byte; the registration-based pool check says why it has nothing, and the
// numa_maps picture lists the process's memory.
func TestDiagnoseLatePoolPages(t *testing.T) {
	testenv.RequireRoot(t)
	online, err := os.ReadFile("/sys/devices/system/node/online")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := ktext.ParseList(strings.TrimSpace(string(online)))
	if err != nil {
		t.Fatal(err)
	}
	far := slices.Max(ids) + 1
	fx := sysfstest.Host{Funcs: []sysfstest.Func{
		{BDF: "0000:80:01.0", HB: "pci0000:80", Class: "0x060400", Vendor: "0x1022", Device: "0x14ab", NUMA: itoa(far),
			Cur: "32.0 GT/s PCIe", Max: "32.0 GT/s PCIe", CurW: "16", MaxW: "16"},
		{BDF: "0000:81:00.0", Parent: "0000:80:01.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2335", NUMA: itoa(far),
			Cur: "32.0 GT/s PCIe", Max: "32.0 GT/s PCIe", CurW: "16", MaxW: "16"},
	}}
	for i := 0; i <= far; i++ {
		dist := make([]string, far+1)
		for j := range dist {
			dist[j] = "21"
		}
		dist[i] = "10"
		// Each node its own socket (package i): the GPU's node is across
		// the socket interconnect from every other.
		fx.Nodes = append(fx.Nodes, sysfstest.Node{CPUs: itoa(i), Distance: strings.Join(dist, " "), Package: itoa(i)})
	}
	sys := sysfstest.Build(t, fx)
	sysfstest.Write(t, filepath.Join(sys, "devices", "system", "node", "online"), fmt.Sprintf("0-%d\n", far))

	ref := testenv.RefDir(t)
	truth := filepath.Join(t.TempDir(), "truth.jsonl")
	cmd := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "late-pool-pages", "--truth", truth, "--hold")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	out := bufio.NewReader(stdout)
	if line, err := out.ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		t.Fatalf("want a ready line, got %q: %v", line, err)
	}
	copied := make(chan string, 1)
	cfg := Config{
		SysRoot: sys,
		PIDs:    []int{cmd.Process.Pid},
		Sample:  3 * time.Second,
		Libs:    []string{filepath.Join(ref, "plain", "libcudart.so.12"), filepath.Join(ref, "lib", "libcuda.so.1")},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnSampleStart: func() {
			// The registration is behind it; the copies come now. The
			// scenario then holds, its memory mapped, until the report is made.
			io.WriteString(stdin, "go\n")
			go func() {
				line, _ := out.ReadString('\n')
				copied <- line
			}()
		},
	}
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, "go\n")
	stdin.Close()
	go io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("late-pool-pages: %v", err)
	}
	t.Logf("agent diagnose --sample during late-pool-pages:\n%s", reportText(r))
	if line := <-copied; !strings.HasPrefix(line, "copied 37") {
		t.Fatalf("the scenario did not finish its copies in the window: %q", line)
	}
	node := hostPageNode(t, truth)
	scope := "pid " + itoa(cmd.Process.Pid)

	c := findCheck(r, scope, checks.CheckPages)
	if c == nil || c.Status != checks.Fail || len(c.Findings) != 1 || c.Findings[0].Rule != "remote-numa-pool" {
		t.Fatalf("host pages of copies: %+v\n%s", c, reportText(r))
	}
	f := c.Findings[0]
	// 32 loads and 4 writebacks of 1 MiB, 2 MiB of fresh pageable memory.
	for _, want := range []string{"100% of the bytes", "(38 MiB of 38 MiB located)", fmt.Sprintf("N%d=38 MiB", node),
		fmt.Sprintf("GPU 0000:81:00.0 NUMA node %d", far), "37 copies, 0 B of them not located"} {
		if !strings.Contains(f.Summary+" "+strings.Join(f.Evidence, " "), want) {
			t.Errorf("finding lacks %q: %+v", want, f)
		}
	}
	if c := findCheck(r, scope, "pinned pool placement"); c == nil || c.Status != checks.Skip ||
		!strings.Contains(c.Detail, "registered before it are judged by the pages their copies read") {
		t.Errorf("pinned pool placement: %+v", c)
	}
	if c := findCheck(r, scope, checks.CheckMemory); c == nil || c.Status != checks.Info ||
		!strings.Contains(c.Detail, fmt.Sprintf("100%% of the anonymous memory is off GPU node %d", far)) {
		t.Errorf("memory by NUMA node: %+v", c)
	}
}

// hostPageNode reads the node the scenario found all its copied pages on.
func hostPageNode(t *testing.T, truth string) int {
	t.Helper()
	raw, err := os.ReadFile(truth)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	var end struct {
		Node *int `json:"host_page_node"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &end); err != nil || end.Node == nil || *end.Node < 0 {
		t.Fatalf("end line %q: %v", lines[len(lines)-1], err)
	}
	return *end.Node
}
