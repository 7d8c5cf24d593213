package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest"
	"github.com/lanewatch/lanewatch/selftest/refenv"
	"github.com/lanewatch/lanewatch/topology"
)

// topGPU is the one GPU of the test's sysfs: a Gen4 x16 link.
const topGPU = "0000:18:00.0"

// topHost is a host with one NVIDIA GPU on a Gen4 x16 link: the agent
// places every process's device 0 on it and knows its lanes' capacity.
func topHost(t *testing.T) string {
	return sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0-3", Distance: "10"}},
		Funcs: []sysfstest.Func{{BDF: topGPU, HB: "pci0000:17", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0",
			Cur: "16.0 GT/s PCIe", Max: "16.0 GT/s PCIe", CurW: "16", MaxW: "16"}},
	})
}

// topAgent starts `agent run` (this test binary as the agent) tracing only
// pid on the reference libraries with the host sys, and returns its
// metrics address once its probes are attached.
func topAgent(t *testing.T, ref, sys string, pid int) (addr string, logs *agentLog) {
	t.Helper()
	return agentProcess(t, "--output", os.DevNull, "--pid", strconv.Itoa(pid),
		"--lib", filepath.Join(ref, "plain", "libcudart.so.12"), "--lib", filepath.Join(ref, "lib", "libcuda.so.1"),
		"--path.sysfs", sys, "--gpu-counters", "off", "--web.listen-address", "127.0.0.1:0", "--evaluate-interval", "1s",
		"--otlp.grpc-listen", "", "--otlp.http-listen", "")
}

// tmuxServer is a tmux server of the test's own: its own socket, an empty
// configuration.
type tmuxServer struct {
	t          *testing.T
	bin, sock  string
	conf       string
	lastScreen string
}

func newTmux(t *testing.T) *tmuxServer {
	bin, err := exec.LookPath("tmux")
	if err != nil {
		t.Fatalf("tmux is needed (apt-get install tmux): %v", err)
	}
	conf := filepath.Join(t.TempDir(), "tmux.conf")
	if err := os.WriteFile(conf, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := &tmuxServer{t: t, bin: bin, sock: fmt.Sprintf("lanewatch-top-test-%d", os.Getpid()), conf: conf}
	t.Cleanup(func() { exec.Command(bin, "-L", s.sock, "kill-server").Run() })
	return s
}

func (s *tmuxServer) run(args ...string) string {
	s.t.Helper()
	out, err := exec.Command(s.bin, append([]string{"-L", s.sock, "-f", s.conf}, args...)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux %q: %v\n%s", args, err, out)
	}
	return string(out)
}

// screen is the pane as shown.
func (s *tmuxServer) screen() string {
	s.lastScreen = s.run("capture-pane", "-p", "-t", "top")
	return s.lastScreen
}

// topReading is one screen's H2D rate of topGPU and the interval it is
// over, in CLOCK_MONOTONIC ns (the truth's clock).
type topReading struct {
	from, to int64
	gbs      float64
	capacity string
	screen   string
}

var (
	topTitle = regexp.MustCompile(`(?m)^lanewatch top  \S+  (\d\d:\d\d:\d\d\.\d{3})  rates over (\d+\.\d{3}) s  q quits$`)
	topLane  = regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(topGPU) + `\s+H2D\s+(\d+\.\d\d)\s+(\S+)`)
)

// readTop parses a screen: ok false while it shows no rate yet.
func readTop(t *testing.T, screen string, wallToMono int64) (topReading, bool) {
	title, lane := topTitle.FindStringSubmatch(screen), topLane.FindStringSubmatch(screen)
	if title == nil || lane == nil {
		return topReading{}, false
	}
	now := time.Now()
	at, err := time.ParseInLocation("2006-01-02 15:04:05.000", now.Format("2006-01-02 ")+title[1], time.Local)
	if err != nil {
		t.Fatal(err)
	}
	if at.After(now.Add(12 * time.Hour)) { // read past midnight
		at = at.AddDate(0, 0, -1)
	}
	over, _ := strconv.ParseFloat(title[2], 64)
	gbs, _ := strconv.ParseFloat(lane[1], 64)
	to := at.UnixNano() - wallToMono
	return topReading{from: to - int64(over*1e9), to: to, gbs: gbs, capacity: lane[2], screen: screen}, true
}

// recordTopSamples writes two readings of the agent at addr, a second
// apart, into dir: live1.json, metrics1.txt, live2.json, metrics2.txt
// (LW_TOP_SAMPLES=testdata/top: the samples TestTopRender reads).
func recordTopSamples(t *testing.T, addr, dir string) {
	for i := 1; i <= 2; i++ {
		for name, path := range map[string]string{"live%d.json": "/api/v1/live", "metrics%d.txt": "/metrics"} {
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf(name, i)), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if i == 1 {
			time.Sleep(time.Second)
		}
	}
}

// TestTopUnderTmux is agent top's acceptance test: `agent run` on the
// reference path traces link-trains-up (two streams of 1 MiB H2D copies
// sharing a 1 GB/s reference lane, about 8 s) on a host whose one GPU is
// Gen4 x16, and `agent top` runs in a detached 80x24 tmux pane. Every
// screen that shows a rate is read; each rate must be within 10% of the
// truth's over the very interval the screen names (its end and length:
// the agent's reads of its counters), the copies the truth has returning
// in it, whatever the machine's load did to the scenario's pace. The
// lane's capacity is the link's; q must end agent top, leaving the
// alternate screen.
func TestTopUnderTmux(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	tm := newTmux(t)
	dir := t.TempDir()
	sys := topHost(t)

	truth := filepath.Join(dir, "truth.jsonl")
	const layers, layerBytes, rounds = 8, 1 << 20, 480 // 480 x 2 x 8 MiB: 7.5 GiB, about 8 s at 1 GB/s
	scen := exec.Command("sh", "-c", `read _ && exec "$@"`, "sh", filepath.Join(ref, "bin", "kvpath"), "--scenario", "link-trains-up",
		"--layers", strconv.Itoa(layers), "--layer-bytes", strconv.Itoa(layerBytes), "--iterations", strconv.Itoa(rounds), "--truth", truth)
	scen.Env = append(os.Environ(), refenv.H2DGBps(1))
	stdin, err := scen.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var scenOut strings.Builder
	scen.Stdout, scen.Stderr = &scenOut, &scenOut
	if err := scen.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { scen.Process.Kill(); scen.Wait() })
	addr, logs := topAgent(t, ref, sys, scen.Process.Pid)

	tm.run("new-session", "-d", "-s", "top", "-x", "80", "-y", "24",
		fmt.Sprintf(`env LW_AGENT_MAIN=1 '%s' top --web.listen-address %s; echo "agent top exited $?"; exec sleep 600`, os.Args[0], addr))
	var rt, mt unix.Timespec
	unix.ClockGettime(unix.CLOCK_REALTIME, &rt)
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &mt)
	wallToMono := rt.Nano() - mt.Nano()

	io.WriteString(stdin, "go\n")
	stdin.Close()
	done := make(chan error, 1)
	go func() { done <- scen.Wait() }()
	readings := map[int64]topReading{}
	alternate := false
	for running := true; running; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("link-trains-up: %v\n%s", err, scenOut.String())
			}
			running = false
		case <-time.After(100 * time.Millisecond):
		}
		screen := tm.screen()
		for i, l := range strings.Split(screen, "\n") {
			if n := len([]rune(l)); n >= 80 {
				t.Fatalf("line %d is %d wide on an 80-column terminal:\n%s", i+1, n, screen)
			}
		}
		if r, ok := readTop(t, screen, wallToMono); ok {
			readings[r.to] = r
			if dir := os.Getenv("LW_TOP_SAMPLES"); dir != "" && len(readings) == 3 {
				recordTopSamples(t, addr, dir)
			}
		}
		alternate = alternate || strings.TrimSpace(tm.run("display-message", "-p", "-t", "top", "#{alternate_on}")) == "1"
	}
	if !alternate {
		t.Errorf("agent top never switched to the alternate screen")
	}

	calls, err := selftest.ReadTruthFile(truth)
	if err != nil {
		t.Fatal(err)
	}
	var first, last int64 = math.MaxInt64, 0
	for _, c := range calls {
		if c.Op == selftest.TruthCopy {
			first, last = min(first, int64(c.TCallNs)), max(last, int64(c.TReturnNs))
		}
	}
	wantCap := fmt.Sprintf("%.2f", topology.LinkGBs(topology.GenGTs(4), 16))
	judged, capShown := 0, false
	for _, r := range readings {
		capShown = capShown || r.capacity == wantCap
		if r.from < first || r.to > last {
			continue // not all of it inside the copies
		}
		// The agent counts a copy when its call returns (BPF, at the
		// return probe): the truth's copies returned in the interval.
		var bytes uint64
		for _, c := range calls {
			if c.Op == selftest.TruthCopy && c.Direction == "H2D" && int64(c.TReturnNs) > r.from && int64(c.TReturnNs) <= r.to {
				bytes += c.Bytes
			}
		}
		want := float64(bytes) / float64(r.to-r.from) // bytes per ns: GB/s
		if judged++; judged == 1 {
			t.Logf("a screen:\n%s", strings.TrimRight(r.screen, "\n"))
		}
		if math.Abs(r.gbs-want) > 0.1*want {
			t.Errorf("the screen's rate over %.3f s is %.2f GB/s, the truth's %.3f GB/s:\n%s", float64(r.to-r.from)/1e9, r.gbs, want, r.screen)
		} else {
			t.Logf("over %.3f s: screen %.2f GB/s, truth %.3f GB/s", float64(r.to-r.from)/1e9, r.gbs, want)
		}
	}
	if judged < 3 {
		t.Errorf("%d screens showed a rate over an interval inside the copies (%d readings), want at least 3; last screen:\n%s\nagent log:\n%s",
			judged, len(readings), tm.lastScreen, logs.String())
	}
	if !capShown {
		t.Errorf("no screen showed the lane's capacity %s GB/s; last screen:\n%s", wantCap, tm.lastScreen)
	}

	// q ends agent top: the pane's shell says how, on the normal screen
	// again, and stays (tmux may drop what a pane wrote just before it
	// ended).
	tm.run("send-keys", "-t", "top", "q")
	exited := regexp.MustCompile(`(?m)^agent top exited (\d+)$`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := exited.FindStringSubmatch(tm.screen()); m != nil {
			if alt := strings.TrimSpace(tm.run("display-message", "-p", "-t", "top", "#{alternate_on}")); m[1] != "0" || alt != "0" {
				t.Errorf("after q: exit status %s, alternate screen %s (want 0 0)\n%s", m[1], alt, tm.lastScreen)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent top still running 10 s after q:\n%s", tm.lastScreen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
