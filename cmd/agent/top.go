package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/agent"
)

// The series agent top reads from /metrics besides the live view: the
// lanes' capacities (the evaluator's, by inbound and outbound) and the
// per-request summaries, where the agent makes them.
const (
	seriesCapacity     = "lanewatch_lane_capacity_bytes_per_second"
	seriesSummaries    = "lanewatch_request_kv_summaries_total"
	seriesTTFTShare    = "lanewatch_request_kv_ttft_share"
	topMaxLanes        = 6 // rows for lanes on a screen at most; the others are counted
	topMaxFindings     = 4 // ... for findings
	topDefaultWidth    = 80
	topDefaultHeight   = 24
	topScrapeTimeout   = 2 * time.Second
	topMetricsMaxBytes = 64 << 20
)

func cmdTop(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("top", "warn", stderr, "A terminal view of a running agent (`agent run`): per GPU lane and direction the rate\n"+
		"its copies move against the lane's capacity, the processes and streams moving the most,\n"+
		"requests per second and the share of their time to first token spent on KV movement,\n"+
		"and the latest window's findings. It reads the agent's /metrics and its live view\n"+
		"(GET "+agent.LivePath+", docs/operating.md) every --interval; q or Ctrl-C quits.\n"+
		"On a terminal it redraws one screen, never wider than the terminal (80x24 over SSH\n"+
		"is enough); without one (a pipe, a log) it prints a block of lines per refresh, and\n"+
		"--once prints one block, the rates over one --interval, and exits.")
	addr := fs.String("web.listen-address", "127.0.0.1:9464", "the agent's metrics address, as given to agent run")
	path := fs.String("web.telemetry-path", "/metrics", "the agent's metrics path, as given to agent run")
	interval := fs.Duration("interval", time.Second, "how often to read the agent and redraw; rates are over the last interval")
	once := fs.Bool("once", false, "print one block of lines (rates over one --interval) and exit: 0 when the agent answered, 1 when not")
	if log, code := parse(fs, args, stderr); log == nil {
		return code
	}
	flagErr := positive("interval", *interval)
	if *addr == "" {
		flagErr = errors.Join(flagErr, errors.New("--web.listen-address is empty: the agent serves no metrics to read"))
	} else if _, _, err := net.SplitHostPort(*addr); err != nil {
		flagErr = errors.Join(flagErr, fmt.Errorf("--web.listen-address %s: %w", *addr, err))
	}
	if code := usageErrors(stderr, "top", flagErr); code != 0 {
		return code
	}
	t := &top{addr: *addr, metricsURL: "http://" + *addr + *path, liveURL: "http://" + *addr + agent.LivePath,
		client: &http.Client{Timeout: topScrapeTimeout}}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer cancel()
	if *once {
		return t.once(ctx, *interval, stdout, stderr)
	}
	if term := terminalOf(stdout); term != nil {
		return t.screen(ctx, *interval, term, stderr)
	}
	return t.lines(ctx, *interval, stdout)
}

// top reads one agent.
type top struct {
	addr, metricsURL, liveURL string
	client                    *http.Client
}

// topSample is one reading of the agent: its live view and what agent top
// takes from /metrics; at is when agent top began reading it.
type topSample struct {
	at   time.Time
	live agent.Live
	caps map[laneID]float64 // bytes/s by GPU ("unknown" when unknown) and inbound/outbound
	// Requests: whether the agent exports per-request summaries at all,
	// how many it summarised, and its TTFT-share histogram's count and sum.
	requests             bool
	summaries            float64
	shareCount, shareSum float64
}

type laneID struct{ gpu, dir string }

// read takes one sample: the live view, then /metrics.
func (t *top) read(ctx context.Context) (*topSample, error) {
	s := &topSample{at: time.Now()}
	live, err := t.get(ctx, t.liveURL, "application/json")
	if err != nil {
		return nil, err
	}
	if err := decodeLive(live, t.liveURL, &s.live); err != nil {
		return nil, err
	}
	metrics, err := t.get(ctx, t.metricsURL, "text/plain;version=0.0.4")
	if err != nil {
		return nil, err
	}
	if err := parseTopMetrics(metrics, t.metricsURL, s); err != nil {
		return nil, err
	}
	return s, nil
}

func (t *top) get(ctx context.Context, url, accept string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	resp, err := t.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, topMetricsMaxBytes+1))
	if err == nil && len(b) > topMetricsMaxBytes {
		err = fmt.Errorf("larger than %d MiB", topMetricsMaxBytes>>20)
	}
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return b, nil
}

// decodeLive decodes a live view; an error names the source and, for
// malformed JSON, the line.
func decodeLive(b []byte, source string, v *agent.Live) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		off := int64(-1)
		switch {
		case errors.As(err, &se):
			off = se.Offset
		case errors.As(err, &te):
			off = te.Offset
		}
		if off >= 0 {
			return fmt.Errorf("%s: line %d: %w", source, 1+bytes.Count(b[:min(off, int64(len(b)))], []byte("\n")), err)
		}
		return fmt.Errorf("%s: %w", source, err)
	}
	if dec.More() {
		return fmt.Errorf("%s: more than one JSON value", source)
	}
	return nil
}

// parseTopMetrics takes the lanes' capacities and the request summaries
// from a Prometheus text exposition; an error names the source and line.
func parseTopMetrics(b []byte, source string, s *topSample) error {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%s: %w", source, err) // expfmt's errors say the line
	}
	s.caps = map[laneID]float64{}
	for _, m := range fams[seriesCapacity].GetMetric() {
		var id laneID
		for _, lp := range m.GetLabel() {
			switch lp.GetName() {
			case "gpu":
				id.gpu = lp.GetValue()
			case "direction":
				id.dir = lp.GetValue()
			}
		}
		if v := m.GetGauge().GetValue(); v > 0 {
			s.caps[id] = v
		}
	}
	if f, ok := fams[seriesSummaries]; ok {
		s.requests = true
		for _, m := range f.GetMetric() {
			s.summaries += m.GetCounter().GetValue() + m.GetUntyped().GetValue()
		}
	}
	if f, ok := fams[seriesTTFTShare]; ok {
		s.requests = true
		for _, m := range f.GetMetric() {
			s.shareCount += float64(m.GetHistogram().GetSampleCount())
			s.shareSum += m.GetHistogram().GetSampleSum()
		}
	}
	return nil
}

// capacityDir is the lane-capacity series' direction of a copy direction:
// H2D copies use a GPU's inbound lane, D2H its outbound one; others none.
func capacityDir(dir string) string {
	switch dir {
	case "H2D":
		return "inbound"
	case "D2H":
		return "outbound"
	}
	return ""
}

// render is the view of cur, rates against prev (nil: none yet), as lines
// of at most width-1 runes (width 0: any) and at most height lines
// (0: every line).
func render(addr string, prev, cur *topSample, readErr error, width, height int) []string {
	screen := height > 0
	var head []string
	title := "lanewatch top  " + addr
	if cur != nil {
		title += "  " + cur.live.At.Local().Format("15:04:05.000")
		if prev != nil && cur.live.At.After(prev.live.At) {
			title += fmt.Sprintf("  rates over %.3f s", cur.live.At.Sub(prev.live.At).Seconds())
		}
	}
	if screen {
		title += "  q quits"
	}
	head = append(head, title)
	if readErr != nil {
		head = append(head, "cannot read the agent: "+readErr.Error())
	}
	if cur == nil {
		return fit(head, width, height)
	}
	secs := 0.0
	if prev != nil {
		secs = cur.live.At.Sub(prev.live.At).Seconds()
	}

	// Lanes: the BPF counters' rates, against the evaluator's capacities.
	lanes := []string{fmt.Sprintf("%-14s %-7s %8s %10s %5s %9s", "GPU LANE", "DIR", "GB/s", "CAP GB/s", "USE", "COPIES/s")}
	before := map[laneID]agent.LiveLane{}
	if prev != nil {
		for _, l := range prev.live.Lanes {
			before[laneID{l.GPU, l.Direction}] = l
		}
	}
	switch {
	case cur.live.Lanes == nil:
		lanes = append(lanes, "  no lane counters yet: the agent's probes are loading")
	case len(cur.live.Lanes) == 0:
		lanes = append(lanes, "  no copy counted yet")
	}
	for _, l := range cur.live.Lanes {
		gpu := cmp.Or(l.GPU, "unknown")
		rate, copies := "…", ""
		var bps float64
		// A rate needs the lane in both reads, its counters grown: a lane
		// can appear with bytes counted before (a stream placed on its GPU
		// late moves them from unknown), and shrink (the agent restarted).
		if b, ok := before[laneID{l.GPU, l.Direction}]; ok && secs > 0 && l.Bytes >= b.Bytes && l.Copies >= b.Copies {
			bps = float64(l.Bytes-b.Bytes) / secs
			rate = fmt.Sprintf("%.2f", bps/1e9)
			copies = fmt.Sprintf("%.0f", float64(l.Copies-b.Copies)/secs)
		}
		capacity, use := "", ""
		if cd := capacityDir(l.Direction); cd == "" {
			capacity = "not a lane"
		} else if c, ok := cur.caps[laneID{gpu, cd}]; ok {
			capacity = fmt.Sprintf("%.2f", c/1e9)
			if rate != "…" {
				use = fmt.Sprintf("%.0f%%", 100*bps/c)
			}
		} else {
			capacity = "unknown"
		}
		lanes = append(lanes, fmt.Sprintf("%-14s %-7s %8s %10s %5s %9s", gpu, l.Direction, rate, capacity, use, copies))
	}

	// Requests: rates of the per-request summaries, where the agent has them.
	var req string
	switch {
	case !cur.requests:
		req = "requests  no request spans"
	case prev == nil || !prev.requests:
		req = fmt.Sprintf("requests  %.0f summarised", cur.summaries)
	default:
		dt := cur.at.Sub(prev.at).Seconds()
		req = fmt.Sprintf("requests  %.1f/s", (cur.summaries-prev.summaries)/dt)
		if n := cur.shareCount - prev.shareCount; n > 0 {
			req += fmt.Sprintf("  KV share of TTFT %.0f%% (mean of %.0f)", 100*(cur.shareSum-prev.shareSum)/n, n)
		} else {
			req += "  KV share of TTFT: none with a TTFT"
		}
	}

	// Flows: the live view's last second.
	flows := []string{fmt.Sprintf("%-7s %-15s %-14s %-4s %7s %8s %s", "PID", "COMM", "STREAM", "DIR", "GB/s", "COPIES/s", "GPU")}
	flowSecs := cur.live.To.Sub(cur.live.From).Seconds()
	for _, f := range cur.live.Flows {
		copies := "…"
		if flowSecs > 0 {
			copies = fmt.Sprintf("%.0f", float64(f.Copies)/flowSecs)
		}
		flows = append(flows, fmt.Sprintf("%-7d %-15s %-14s %-4s %7.2f %8s %s", f.PID, cmp.Or(f.Comm, "(gone)"), f.Stream, f.Direction,
			f.Bps/1e9, copies, cmp.Or(f.GPU, "unknown")))
	}
	if len(cur.live.Flows) == 0 {
		flows = append(flows, "  no transfer in the last second")
	}
	if n := cur.live.Omitted; n > 0 {
		flows = append(flows, fmt.Sprintf("  … %d more flows", n))
	}
	if n := cur.live.OverCap; n > 0 {
		flows = append(flows, fmt.Sprintf("  %d transfers of flows over the live view's cap", n))
	}

	// Findings of the latest window.
	var findings []string
	if at := cur.live.FindingsAt; at.IsZero() {
		findings = append(findings, "findings  no window judged yet")
	} else {
		findings = append(findings, fmt.Sprintf("findings  window judged %s: %d", at.Local().Format("15:04:05"), len(cur.live.Findings)+cur.live.FindingsOmitted))
	}
	for _, f := range cur.live.Findings {
		findings = append(findings, fmt.Sprintf("  %-4s %s  %s: %s", strings.ToUpper(f.Severity), f.Rule, f.Subject, f.Summary))
	}

	a := cur.live.Agent
	foot := fmt.Sprintf("agent  events %d  drops %d  transfers %d  pending %d", a.Events, a.Drops, a.Transfers, a.Pending)
	if prev != nil && secs > 0 && a.Events >= prev.live.Agent.Events {
		foot = fmt.Sprintf("agent  events %.0f/s  drops %d  transfers %.0f/s  pending %d", float64(a.Events-prev.live.Agent.Events)/secs, a.Drops,
			float64(a.Transfers-prev.live.Agent.Transfers)/secs, a.Pending)
	}
	if a.Uncounted > 0 {
		foot += fmt.Sprintf("  uncounted copies %d", a.Uncounted)
	}

	if !screen {
		out := append(head, lanes...)
		out = append(out, req)
		out = append(out, flows...)
		out = append(out, findings...)
		return fit(append(out, foot), width, 0)
	}
	// A screen: every section keeps its head; lanes and findings get at
	// most their share of the rows left, flows the rest.
	body := height - len(head) - 5 // the lanes', flows' and findings' heads, requests, the agent
	laneRows := min(len(lanes)-1, topMaxLanes, max(body/3, 1))
	findingRows := min(len(findings)-1, topMaxFindings, max(body/4, 1))
	lanes = capRows(lanes, laneRows, "lanes")
	findings = capRows(findings, findingRows, "findings")
	flows = capRows(flows, max(body-laneRows-findingRows, 1), "flows")
	out := append(head, lanes...)
	out = append(out, req)
	out = append(out, flows...)
	out = append(out, findings...)
	return fit(append(out, foot), width, height)
}

// capRows keeps a section's head (rows[0]) and at most n rows under it,
// the last of them saying how many were left out.
func capRows(rows []string, n int, what string) []string {
	if len(rows)-1 <= n {
		return rows
	}
	if n < 1 {
		return rows[:1]
	}
	return append(rows[:n:n], fmt.Sprintf("  … %d more %s", len(rows)-n, what))
}

// fit cuts lines to width-1 runes (the last column is never written: a
// terminal may wrap there) and keeps the first height lines; 0: no limit.
func fit(lines []string, width, height int) []string {
	if height > 0 && len(lines) > height {
		lines = lines[:height]
	}
	if width <= 0 {
		return lines
	}
	for i, l := range lines {
		if utf8.RuneCountInString(l) >= width {
			r := []rune(l)
			lines[i] = string(r[:max(width-1, 0)])
		}
	}
	return lines
}

// once prints the rates over one interval and returns.
func (t *top) once(ctx context.Context, interval time.Duration, stdout, stderr io.Writer) int {
	first, err := t.read(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "agent top: %v\n", err)
		return 1
	}
	select {
	case <-ctx.Done():
		return 0
	case <-time.After(interval):
	}
	cur, err := t.read(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "agent top: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, strings.Join(render(t.addr, first, cur, nil, 0, 0), "\n"))
	return 0
}

// lines prints a block of lines per refresh until ctx is done.
func (t *top) lines(ctx context.Context, interval time.Duration, stdout io.Writer) int {
	var prev *topSample
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		cur, err := t.read(ctx)
		if ctx.Err() != nil {
			return 0
		}
		if cur != nil || err != nil {
			fmt.Fprintln(stdout, strings.Join(render(t.addr, prev, cur, err, 0, 0), "\n")+"\n")
		}
		if cur != nil {
			prev = cur
		}
		select {
		case <-ctx.Done():
			return 0
		case <-tick.C:
		}
	}
}

// screen redraws the terminal every interval until q, Ctrl-C or a signal;
// the terminal is restored however it ends.
func (t *top) screen(ctx context.Context, interval time.Duration, term *terminal, stderr io.Writer) int {
	restore, err := term.raw()
	if err != nil {
		fmt.Fprintf(stderr, "agent top: %v\n", err)
		return 1
	}
	defer restore()
	ctx, quit := context.WithCancel(ctx)
	defer quit()
	go func() { // keys: q, Q, Ctrl-C (a byte here when ISIG is off), or the terminal gone
		defer quit()
		var b [64]byte
		for {
			n, err := term.in.Read(b[:])
			if bytes.ContainsAny(b[:n], "qQ\x03") || err != nil {
				return
			}
		}
	}()
	resize := make(chan os.Signal, 1)
	signal.Notify(resize, syscall.SIGWINCH)
	defer signal.Stop(resize)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var prev, cur *topSample
	for {
		s, readErr := t.read(ctx) // a key that quits cancels the read too
		if ctx.Err() != nil {
			return 0
		}
		if s != nil {
			prev, cur = cur, s
		}
		for waiting := true; waiting; {
			w, h := term.size()
			term.draw(render(t.addr, prev, cur, readErr, w, h))
			select {
			case <-ctx.Done():
				return 0
			case <-resize: // redraw at the new size
			case <-tick.C:
				waiting = false
			}
		}
	}
}

// terminal is agent top's terminal: stdin and stdout both on one.
type terminal struct {
	in, out *os.File
}

// terminalOf is the terminal when stdout and stdin are both one; nil
// otherwise (lines, not a screen).
func terminalOf(stdout io.Writer) *terminal {
	out, ok := stdout.(*os.File)
	if !ok || !isTerminal(out) || !isTerminal(os.Stdin) {
		return nil
	}
	return &terminal{in: os.Stdin, out: out}
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// raw turns off line buffering and echo (keys arrive as typed; signals
// stay on), switches to the alternate screen and hides the cursor; the
// returned function undoes all of it.
func (t *terminal) raw() (restore func(), err error) {
	fd := int(t.in.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, fmt.Errorf("terminal: %w", err)
	}
	raw := *old
	raw.Lflag &^= unix.ICANON | unix.ECHO
	raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil, fmt.Errorf("terminal: %w", err)
	}
	io.WriteString(t.out, "\x1b[?1049h\x1b[?25l")
	return func() {
		io.WriteString(t.out, "\x1b[?25h\x1b[?1049l")
		unix.IoctlSetTermios(fd, unix.TCSETS, old)
	}, nil
}

// size is the terminal's columns and rows, 80x24 when it does not say.
func (t *terminal) size() (w, h int) {
	ws, err := unix.IoctlGetWinsize(int(t.out.Fd()), unix.TIOCGWINSZ)
	if err != nil || ws.Col == 0 || ws.Row == 0 {
		return topDefaultWidth, topDefaultHeight
	}
	return int(ws.Col), int(ws.Row)
}

// draw writes lines from the top left, each line's rest and the rows
// below cleared, in one write.
func (t *terminal) draw(lines []string) {
	var b strings.Builder
	b.WriteString("\x1b[H")
	for i, l := range lines {
		if i > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString(l)
		b.WriteString("\x1b[K")
	}
	b.WriteString("\x1b[J")
	io.WriteString(t.out, b.String())
}
