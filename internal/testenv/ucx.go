package testenv

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Tool finds a program a test runs; CI installs it (.ci/run), so there its
// absence is a failure.
func Tool(tb testing.TB, name, pkg string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s not installed (Debian package %s; .ci/run installs it)", name, pkg)
		}
		tb.Skipf("%s not installed (apt-get install %s)", name, pkg)
	}
	return path
}

// FreePort is a TCP port nothing listened on a moment ago: tests of other
// worktrees run perftest pairs on this host at the same time.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// WaitListen waits until a socket listens on the TCP port (procfs).
func WaitListen(tb testing.TB, port int) {
	tb.Helper()
	want := fmt.Sprintf(":%04X", port)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			b, _ := os.ReadFile(f)
			for _, line := range strings.Split(string(b), "\n") {
				fields := strings.Fields(line)
				if len(fields) > 3 && strings.HasSuffix(fields[1], want) && fields[3] == "0A" {
					return
				}
			}
		}
	}
	tb.Fatalf("nothing listens on port %d", port)
}

// PerftestFinal is the "Final:" line of a ucx_perftest client's report:
// the whole measured phase (after the warm-up iterations).
type PerftestFinal struct {
	Iterations int
	// Microseconds per iteration: the median, the average of the last
	// report interval, and over the whole phase ("overhead" for a
	// bandwidth test, "latency" for a latency test).
	P50Us, AverageUs, OverallUs float64
	// MB/s and messages per second, of the last interval and overall.
	BandwidthMBs, OverallMBs float64
	MsgRate, OverallMsgRate  float64
}

// NsPerMessage is the time of one message over the whole phase, from the
// overall message rate (the per-iteration columns have 1 ns resolution).
func (f PerftestFinal) NsPerMessage() float64 { return 1e9 / f.OverallMsgRate }

// ParsePerftest reads the one "Final:" line of a ucx_perftest client's
// output (name says whose, for errors): iterations then seven numbers.
// Progress lines ("[thread 0] ...") and the table's borders are skipped.
func ParsePerftest(name string, out []byte) (PerftestFinal, error) {
	var f PerftestFinal
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "Final:")
		if !ok {
			continue
		}
		if found++; found > 1 {
			return PerftestFinal{}, fmt.Errorf("%s:%d: a second Final line: %q", name, n, line)
		}
		fields := strings.Fields(rest)
		if len(fields) != 8 {
			return PerftestFinal{}, fmt.Errorf("%s:%d: %d fields after Final:, want 8 (iterations, 3 times, 2 bandwidths, 2 rates): %q", name, n, len(fields), line)
		}
		it, err := strconv.Atoi(fields[0])
		if err != nil || it <= 0 {
			return PerftestFinal{}, fmt.Errorf("%s:%d: iterations %q: not a positive count: %q", name, n, fields[0], line)
		}
		f.Iterations = it
		for i, dst := range []*float64{&f.P50Us, &f.AverageUs, &f.OverallUs, &f.BandwidthMBs, &f.OverallMBs, &f.MsgRate, &f.OverallMsgRate} {
			v, err := strconv.ParseFloat(fields[i+1], 64)
			if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
				return PerftestFinal{}, fmt.Errorf("%s:%d: field %d %q: not a finite number ≥ 0: %q", name, n, i+2, fields[i+1], line)
			}
			*dst = v
		}
		if f.OverallMsgRate == 0 {
			return PerftestFinal{}, fmt.Errorf("%s:%d: overall message rate 0: %q", name, n, line)
		}
	}
	if err := sc.Err(); err != nil {
		return PerftestFinal{}, fmt.Errorf("%s: %w", name, err)
	}
	if found == 0 {
		return PerftestFinal{}, fmt.Errorf("%s: no Final: line in %d bytes of output", name, len(out))
	}
	return f, nil
}

// Perftest is a ucx_perftest server on loopback, serving one client; the
// test's cleanup ends it if the client never came.
type Perftest struct {
	Bin  string
	Port int
	Env  []string // the server's and the client's: UCX_TLS and the like
	// CPUs, when set, pins the server and the client to these CPUs
	// (taskset's list: "0"), before either runs a line of UCX.
	CPUs   string
	srv    *exec.Cmd
	exited chan error
}

// StartPerftest starts a server with these UCX variables (besides the
// environment's) and waits until it listens.
func StartPerftest(tb testing.TB, bin string, ucxEnv ...string) *Perftest {
	return StartPerftestOn(tb, "", bin, ucxEnv...)
}

// StartPerftestOn starts a server pinned to cpus (taskset's list; "" for
// none), as its client will be.
func StartPerftestOn(tb testing.TB, cpus, bin string, ucxEnv ...string) *Perftest {
	tb.Helper()
	p := &Perftest{Bin: bin, Port: FreePort(tb), Env: append(os.Environ(), ucxEnv...), CPUs: cpus, exited: make(chan error, 1)}
	p.srv = p.command("-p", strconv.Itoa(p.Port))
	p.srv.Env = p.Env
	if err := p.srv.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { p.exited <- p.srv.Wait() }()
	tb.Cleanup(func() { p.srv.Process.Kill() })
	WaitListen(tb, p.Port)
	return p
}

// Pid is the server's process id.
func (p *Perftest) Pid() int { return p.srv.Process.Pid }

// Client is the client command of a test against this server: test
// (ucp_put_bw, ...), message size and iterations, no warm-up (every call
// the client makes is measured).
func (p *Perftest) Client(test string, size, iterations int) *exec.Cmd {
	return p.command("127.0.0.1", "-p", strconv.Itoa(p.Port), "-t", test, "-s", strconv.Itoa(size),
		"-n", strconv.Itoa(iterations), "-w", "0")
}

// command runs ucx_perftest with args, through taskset when pinned (it
// execs ucx_perftest: the pid is the same).
func (p *Perftest) command(args ...string) *exec.Cmd {
	cmd := exec.Command(p.Bin, args...)
	if p.CPUs != "" {
		cmd = exec.Command("taskset", append([]string{"-c", p.CPUs, p.Bin}, args...)...)
	}
	cmd.Env = p.Env
	return cmd
}

// Run runs the client to its end and returns its Final line and its wall
// time (from its start: UCX's setup included), once the server, which
// serves one client, exited too: the next measurement shares the CPUs
// with neither.
func (p *Perftest) Run(tb testing.TB, cl *exec.Cmd) (PerftestFinal, time.Duration) {
	tb.Helper()
	var out bytes.Buffer
	cl.Stdout, cl.Stderr = &out, &out
	start := time.Now()
	err := cl.Run()
	wall := time.Since(start)
	if err != nil {
		tb.Fatalf("%s: %v\n%s", cl, err, out.Bytes())
	}
	f, err := ParsePerftest(cl.String(), out.Bytes())
	if err != nil {
		tb.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		tb.Fatalf("ucx_perftest server on port %d still runs 20 s after its client ended", p.Port)
	}
	return f, wall
}
