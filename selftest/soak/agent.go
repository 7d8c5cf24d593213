package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// agentProc is the agent binary under test, run as `agent run`.
type agentProc struct {
	cmd     *exec.Cmd
	pid     int
	metrics string // http://host:port/metrics
	done    chan struct{}
	exitErr error
	log     *logTail
	scrape  *http.Client
}

// logTail keeps the agent's last log lines and counts its warnings and
// errors by message, so a failure can show them; everything also goes to
// file when one is given.
type logTail struct {
	mu     sync.Mutex
	last   []string
	next   int
	counts map[string]int
	ready  chan struct{}
	once   sync.Once
	file   io.Writer
}

const tailLines = 200

func newLogTail(file io.Writer) *logTail {
	return &logTail{last: make([]string, 0, tailLines), counts: map[string]int{}, ready: make(chan struct{}), file: file}
}

func (l *logTail) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if l.file != nil {
			fmt.Fprintln(l.file, line)
		}
		l.mu.Lock()
		if len(l.last) < tailLines {
			l.last = append(l.last, line)
		} else {
			l.last[l.next] = line
			l.next = (l.next + 1) % tailLines
		}
		if lvl := field(line, "level"); lvl == "WARN" || lvl == "ERROR" {
			l.counts[lvl+" "+field(line, "msg")]++
		}
		l.mu.Unlock()
		if strings.Contains(line, "lanewatch running") {
			l.once.Do(func() { close(l.ready) })
		}
	}
}

// field reads key=value (or key="quoted value") from a slog text line.
func field(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 && strings.HasPrefix(line, key+"=") {
		i = -1
	} else if i < 0 {
		return ""
	}
	v := line[i+len(key)+2:]
	if strings.HasPrefix(v, `"`) {
		if s, err := strconv.QuotedPrefix(v); err == nil {
			u, _ := strconv.Unquote(s)
			return u
		}
	}
	if j := strings.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return v
}

// Lines returns the kept lines, oldest first.
func (l *logTail) Lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append(append([]string(nil), l.last[l.next:]...), l.last[:l.next]...)
}

// Counts returns the warnings and errors by message.
func (l *logTail) Counts() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.counts))
	for k, v := range l.counts {
		out[k] = v
	}
	return out
}

// agentArgs are the flags and environment of one run.
type agentArgs struct {
	bin         string
	libs        []string
	output      string
	metrics     string // host:port
	grpc, http  string // OTLP listeners
	upstream    string // http://host:port (OTLP/HTTP)
	memoryLimit string // "": the agent's default
	ringBytes   uint64
}

func startAgent(a agentArgs, logFile io.Writer) (*agentProc, error) {
	args := []string{"run", "--output", a.output, "--web.listen-address", a.metrics,
		"--otlp.grpc-listen", a.grpc, "--otlp.http-listen", a.http, "--ring-bytes", strconv.FormatUint(a.ringBytes, 10),
		"--kernels"} // launches too: the compute-overlap windows are bounded like the rest
	if a.memoryLimit != "" {
		args = append(args, "--memory-limit", a.memoryLimit)
	}
	for _, l := range a.libs {
		args = append(args, "--lib", l)
	}
	cmd := exec.Command(a.bin, args...)
	env := []string{}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OTEL_") || strings.HasPrefix(kv, "GOMEMLIMIT=") || strings.HasPrefix(kv, "GOGC=") {
			continue // the soak sets the upstream; the memory limit is the flag's
		}
		env = append(env, kv)
	}
	cmd.Env = append(env, "OTEL_EXPORTER_OTLP_ENDPOINT="+a.upstream, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_RESOURCE_ATTRIBUTES=deployment.environment=soak")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", a.bin, err)
	}
	p := &agentProc{cmd: cmd, pid: cmd.Process.Pid, metrics: "http://" + a.metrics + "/metrics", done: make(chan struct{}),
		log: newLogTail(logFile), scrape: &http.Client{Timeout: 20 * time.Second}}
	logDone := make(chan struct{})
	go func() { p.log.read(stderr); close(logDone) }()
	go func() {
		<-logDone // Wait closes the pipe: read it to the end first
		p.exitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitReady waits for the agent's "lanewatch running" line.
func (p *agentProc) waitReady(timeout time.Duration) error {
	select {
	case <-p.log.ready:
		return nil
	case <-p.done:
		return fmt.Errorf("agent exited before it was ready: %v\n%s", p.exitErr, strings.Join(p.log.Lines(), "\n"))
	case <-time.After(timeout):
		return fmt.Errorf("agent not ready within %s:\n%s", timeout, strings.Join(p.log.Lines(), "\n"))
	}
}

// stop sends SIGINT and waits at most limit for a clean exit; past it the
// agent is killed. It returns how long the exit took.
func (p *agentProc) stop(limit time.Duration) (time.Duration, error) {
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		return 0, err
	}
	select {
	case <-p.done:
		return time.Since(start), p.exitErr
	case <-time.After(limit):
	}
	// Past the limit: say so, then wait for it a while longer before killing.
	select {
	case <-p.done:
		return time.Since(start), errors.Join(fmt.Errorf("exit took longer than %s", limit), p.exitErr)
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		return time.Since(start), fmt.Errorf("agent did not exit within %s of SIGINT: killed", limit+30*time.Second)
	}
}

func (p *agentProc) kill() {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Kill()
		<-p.done
	}
}

// procFigures is what /proc says of the agent.
type procFigures struct {
	RSS, HWM   uint64 // VmRSS, VmHWM in bytes
	Threads    int
	FDs        int
	Links      int // bpf_link fds
	Progs      int // bpf-prog fds
	Maps       int // bpf-map fds
	PerfEvents int // perf_event fds
	LinkIDs    []link.ID
	ProgIDs    []ebpf.ProgramID
}

// readProc reads the agent's memory and file descriptors; withIDs also
// reads each link's id from its fdinfo.
func readProc(pid int, withIDs bool) (procFigures, error) {
	var f procFigures
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return f, err
	}
	if f.RSS, f.HWM, f.Threads, err = parseStatus(string(b)); err != nil {
		return f, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return f, err
	}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		f.FDs++
		switch target {
		case "anon_inode:bpf_link":
			f.Links++
			if withIDs {
				if id, ok := fdinfoID(pid, e.Name(), "link_id"); ok {
					f.LinkIDs = append(f.LinkIDs, link.ID(id))
				}
			}
		case "anon_inode:bpf-prog":
			f.Progs++
			if withIDs {
				if id, ok := fdinfoID(pid, e.Name(), "prog_id"); ok {
					f.ProgIDs = append(f.ProgIDs, ebpf.ProgramID(id))
				}
			}
		case "anon_inode:bpf-map":
			f.Maps++
		case "anon_inode:[perf_event]":
			f.PerfEvents++
		}
	}
	return f, nil
}

// parseStatus reads VmRSS, VmHWM (bytes) and Threads from the text of
// /proc/PID/status; each must be there once, as a number (in kB for the
// sizes).
func parseStatus(text string) (rss, hwm uint64, threads int, err error) {
	seen := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM" && k != "Threads") {
			continue
		}
		if seen[k] {
			return 0, 0, 0, fmt.Errorf("%s twice", k)
		}
		seen[k] = true
		fs := strings.Fields(v)
		if len(fs) == 0 || (k != "Threads" && (len(fs) != 2 || fs[1] != "kB")) {
			return 0, 0, 0, fmt.Errorf("%s: %q", k, strings.TrimSpace(v))
		}
		n, err := strconv.ParseUint(fs[0], 10, 64)
		if err != nil || (k != "Threads" && n > 1<<50) {
			return 0, 0, 0, fmt.Errorf("%s: %q", k, fs[0])
		}
		switch k {
		case "VmRSS":
			rss = n << 10
		case "VmHWM":
			hwm = n << 10
		case "Threads":
			threads = int(min(n, 1<<31))
		}
	}
	for _, k := range []string{"VmRSS", "VmHWM", "Threads"} {
		if !seen[k] {
			return 0, 0, 0, fmt.Errorf("no %s", k)
		}
	}
	return rss, hwm, threads, nil
}

func fdinfoID(pid int, fd, key string) (uint32, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd))
	if err != nil {
		return 0, false
	}
	id, err := fdinfoValue(string(b), key)
	return id, err == nil
}

// fdinfoValue reads "key:\tN" (a 32-bit id) from the text of
// /proc/PID/fdinfo/FD.
func fdinfoValue(text, key string) (uint32, error) {
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", key, err)
			}
			return uint32(n), nil
		}
	}
	return 0, fmt.Errorf("no %s", key)
}

// linksLeft returns the ids among ids that still name a link in the kernel.
func linksLeft(ids []link.ID) ([]link.ID, error) {
	var left []link.ID
	for _, id := range ids {
		l, err := link.NewFromID(id)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return left, fmt.Errorf("link %d: %w", id, err)
		}
		l.Close()
		left = append(left, id)
	}
	return left, nil
}

// scrapeFigures is what the agent's /metrics says of itself.
type scrapeFigures struct {
	Goroutines   float64
	OpenFDs      float64
	Events       float64 // lanewatch_probe_events_total
	Drops        float64 // lanewatch_probe_dropped_events_total, every reason
	RingFull     float64 // ... of them, reason ring_full
	Probes       float64 // lanewatch_attached_probes, every library
	HeapInuse    float64
	HeapIdle     float64
	HeapReleased float64
	Families     map[string]float64 // every lanewatch_otlp_* / lanewatch_span_* family, summed
}

// scrapeMetrics GETs /metrics and reads the figures the soak follows.
func (p *agentProc) scrapeMetrics(ctx context.Context) (scrapeFigures, error) {
	var s scrapeFigures
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.metrics, nil)
	if err != nil {
		return s, err
	}
	resp, err := p.scrape.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("GET %s: %s", p.metrics, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return s, fmt.Errorf("parse %s: %w", p.metrics, err)
	}
	// Counters, gauges and untyped values summed over their label sets.
	sumOf := func(name string) float64 {
		total := 0.0
		for _, m := range fams[name].GetMetric() {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
		}
		return total
	}
	sum := sumOf
	s.Goroutines = sum("go_goroutines")
	s.OpenFDs = sum("process_open_fds")
	s.Events = sum("lanewatch_probe_events_total")
	s.Drops = sum("lanewatch_probe_dropped_events_total")
	s.Probes = sum("lanewatch_attached_probes")
	for _, m := range fams["lanewatch_probe_dropped_events_total"].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "reason" && lp.GetValue() == "ring_full" {
				s.RingFull += m.GetCounter().GetValue()
			}
		}
	}
	s.HeapInuse = sum("go_memstats_heap_inuse_bytes")
	s.HeapIdle = sum("go_memstats_heap_idle_bytes")
	s.HeapReleased = sum("go_memstats_heap_released_bytes")
	s.Families = map[string]float64{}
	for name := range fams {
		if strings.HasPrefix(name, "lanewatch_otlp_") || strings.HasPrefix(name, "lanewatch_span_") {
			s.Families[name] = sumOf(name)
		}
	}
	return s, nil
}
