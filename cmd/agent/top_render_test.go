package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/lanewatch/lanewatch/agent"
)

// Samples of a real agent (testdata/top): live1/metrics1 and a second
// later live2/metrics2, recorded by TestTopUnderTmux (LW_TOP_SAMPLES) while
// link-trains-up ran on a Gen4 x16 GPU of the test's sysfs; live-findings
// from `make run` (scripts/run.sh) while fragmented-copies had fired, on a
// host whose sysfs shows no GPU.
func readSample(t testing.TB, live, metrics string) *topSample {
	t.Helper()
	s := &topSample{}
	b, err := os.ReadFile(filepath.Join("testdata", "top", live))
	if err != nil {
		t.Fatal(err)
	}
	if err := decodeLive(b, live, &s.live); err != nil {
		t.Fatal(err)
	}
	if b, err = os.ReadFile(filepath.Join("testdata", "top", metrics)); err != nil {
		t.Fatal(err)
	}
	if err := parseTopMetrics(b, metrics, s); err != nil {
		t.Fatal(err)
	}
	s.at = s.live.At // the samples' own reads stand for top's
	return s
}

// requestLines are lanewatch_request_kv_* series as exporters'
// Prometheus collector writes them: summaries by whether the TTFT was
// known, and the TTFT-share histogram.
func requestLines(summaries, count int, sum float64) string {
	return fmt.Sprintf(`# HELP lanewatch_request_kv_summaries_total Requests summarised.
# TYPE lanewatch_request_kv_summaries_total counter
lanewatch_request_kv_summaries_total{ttft="known"} %d
lanewatch_request_kv_summaries_total{ttft="unknown"} 0
# HELP lanewatch_request_kv_ttft_share Share of TTFT waited on KV movement.
# TYPE lanewatch_request_kv_ttft_share histogram
lanewatch_request_kv_ttft_share_bucket{le="0.5"} %d
lanewatch_request_kv_ttft_share_bucket{le="1"} %d
lanewatch_request_kv_ttft_share_bucket{le="+Inf"} %d
lanewatch_request_kv_ttft_share_sum %g
lanewatch_request_kv_ttft_share_count %d
`, summaries, count, count, count, sum, count)
}

func TestTopRender(t *testing.T) {
	prev, cur := readSample(t, "live1.json", "metrics1.txt"), readSample(t, "live2.json", "metrics2.txt")
	l1, l2 := prev.live.Lanes[0], cur.live.Lanes[0]
	secs := cur.live.At.Sub(prev.live.At).Seconds()
	wantRate := fmt.Sprintf("%.2f", float64(l2.Bytes-l1.Bytes)/secs/1e9)
	wantCap := fmt.Sprintf("%.2f", cur.caps[laneID{l2.GPU, "inbound"}]/1e9)
	if wantCap == "0.00" {
		t.Fatalf("the sample has no inbound capacity for %s: %v", l2.GPU, cur.caps)
	}

	screen := render("127.0.0.1:9464", prev, cur, nil, 80, 24)
	text := strings.Join(screen, "\n")
	t.Logf("80x24:\n%s", text)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^lanewatch top  127\.0\.0\.1:9464  \d\d:\d\d:\d\d\.\d{3}  rates over ` + regexp.QuoteMeta(fmt.Sprintf("%.3f", secs)) + ` s  q quits$`),
		regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(l2.GPU) + `\s+H2D\s+` + regexp.QuoteMeta(wantRate) + `\s+` + regexp.QuoteMeta(wantCap) + `\s+\d+%\s+\d+$`),
		regexp.MustCompile(`(?m)^requests  no request spans$`),
		regexp.MustCompile(`(?m)^` + strconv.Itoa(int(cur.live.Flows[0].PID)) + `\s+kvpath\s+` + cur.live.Flows[0].Stream + `\s+H2D\s+0\.49\s+464 `),
		regexp.MustCompile(`(?m)^findings  window judged \d\d:\d\d:\d\d: 0$`),
		regexp.MustCompile(`(?m)^agent  events \d+/s  drops 0  transfers \d+/s  pending 16$`),
	} {
		if !want.MatchString(text) {
			t.Errorf("no line matching %s in\n%s", want, text)
		}
	}

	// The first refresh has no rate yet; the line mode has no key help.
	first := strings.Join(render("a:1", nil, prev, nil, 0, 0), "\n")
	if !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(l1.GPU)+`\s+H2D\s+…\s+`+regexp.QuoteMeta(wantCap)+`\s*$`).MatchString(first) ||
		strings.Contains(first, "q quits") || strings.Contains(first, "rates over") {
		t.Errorf("first refresh, line mode:\n%s", first)
	}

	// A lane not in the previous read has no rate yet: its counters may
	// hold bytes of copies placed on its GPU late.
	moved := *cur
	moved.live.Lanes = []agent.LiveLane{{GPU: "0000:3b:00.0", Direction: "H2D", Copies: l2.Copies, Bytes: l2.Bytes}}
	if got := strings.Join(render("a:1", prev, &moved, nil, 80, 24), "\n"); !regexp.MustCompile(`(?m)^0000:3b:00\.0\s+H2D\s+…\s`).MatchString(got) {
		t.Errorf("a lane new since the last read:\n%s", got)
	}

	// Requests, where the agent summarises them: 30 in a second, 20 with a
	// TTFT whose mean share grew by 5 over 20 (25%).
	withReq := func(s *topSample, metrics string, extra string) *topSample {
		c := *s
		b, err := os.ReadFile(filepath.Join("testdata", "top", metrics))
		if err != nil {
			t.Fatal(err)
		}
		if err := parseTopMetrics(append(b, extra...), metrics, &c); err != nil {
			t.Fatal(err)
		}
		return &c
	}
	rp, rc := withReq(prev, "metrics1.txt", requestLines(100, 80, 10)), withReq(cur, "metrics2.txt", requestLines(130, 100, 15))
	rc.at = rp.at.Add(2 * 1e9)
	got := strings.Join(render("a:1", rp, rc, nil, 80, 24), "\n")
	if !strings.Contains(got, "requests  15.0/s  KV share of TTFT 25% (mean of 20)") {
		t.Errorf("requests:\n%s", got)
	}

	// Findings, and a host with no GPU in sysfs: lane and capacity unknown.
	f := readSample(t, "live-findings.json", "metrics2.txt")
	f.caps = map[laneID]float64{}
	got = strings.Join(render("a:1", prev, f, nil, 80, 24), "\n")
	for _, want := range []string{"WARN fragmented-copies  pid ", "(gone)", "findings  window judged "} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
	if !regexp.MustCompile(`(?m)^unknown\s+H2D\s+\S+\s+unknown\s*`).MatchString(got) {
		t.Errorf("no unknown lane of unknown capacity in\n%s", got)
	}

	// The agent unreachable: said, with the last screen's title.
	if got := render("a:1", nil, nil, fmt.Errorf("connection refused"), 80, 24); len(got) != 2 || got[1] != "cannot read the agent: connection refused" {
		t.Errorf("unreachable: %q", got)
	}
}

// However small the terminal, no line reaches its width and no more lines
// than its height are written; sections cut say how many they left out.
func TestTopRenderFits(t *testing.T) {
	prev, cur := readSample(t, "live1.json", "metrics1.txt"), readSample(t, "live-findings.json", "metrics2.txt")
	for i := range 40 { // many lanes, flows and findings
		cur.live.Lanes = append(cur.live.Lanes, agent.LiveLane{GPU: fmt.Sprintf("0000:%02x:00.0", i), Direction: "D2H", Bytes: 1})
		cur.live.Flows = append(cur.live.Flows, cur.live.Flows[0])
		cur.live.Findings = append(cur.live.Findings, cur.live.Findings[0])
	}
	for _, size := range [][2]int{{80, 24}, {40, 10}, {20, 5}, {1, 1}, {200, 60}} {
		w, h := size[0], size[1]
		lines := render("127.0.0.1:9464", prev, cur, nil, w, h)
		if len(lines) > h {
			t.Errorf("%dx%d: %d lines", w, h, len(lines))
		}
		for _, l := range lines {
			if utf8.RuneCountInString(l) >= w && w > 0 && l != "" {
				t.Errorf("%dx%d: %q is %d wide", w, h, l, utf8.RuneCountInString(l))
			}
		}
		if h >= 8 && !strings.HasPrefix(lines[len(lines)-1], "agent"[:min(5, w-1)]) {
			t.Errorf("%dx%d: the agent's line is not the last: %q", w, h, lines[len(lines)-1])
		}
		if w == 80 || w == 40 {
			t.Logf("%dx%d:\n%s", w, h, strings.Join(lines, "\n"))
		}
		if w == 80 {
			text := strings.Join(lines, "\n")
			for _, want := range []string{"more lanes", "more findings", "more flows", "agent  events"} {
				if !strings.Contains(text, want) {
					t.Errorf("80x24: no %q in\n%s", want, text)
				}
			}
		}
	}
}

// Bad input from the agent is an error naming its source and line.
func TestTopParseErrors(t *testing.T) {
	var s topSample
	for _, tc := range []struct {
		name, in, want string
		live           bool
	}{
		{"metrics", "lanewatch_lane_capacity_bytes_per_second{gpu=\"a\"} 1\nbroken{ 2\n", `http://a/metrics: text format parsing error in line 2`, false},
		{"live", "{\"at\": \"2026-12-06T12:00:00Z\",\n\"lanes\": [{\"gpu\": 7}]}", `http://a/api/v1/live: line 2: json: cannot unmarshal`, true},
		{"live", "{\"at\":\n}", `http://a/api/v1/live: line 2: invalid character '}'`, true},
		{"live", "{} {}", `http://a/api/v1/live: more than one JSON value`, true},
	} {
		var err error
		if tc.live {
			err = decodeLive([]byte(tc.in), "http://a/api/v1/live", &s.live)
		} else {
			err = parseTopMetrics([]byte(tc.in), "http://a/metrics", &s)
		}
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s %q: %v, want %q…", tc.name, tc.in, err, tc.want)
		}
	}
}

// FuzzTopParse: whatever the agent's address answers, decoding and
// rendering never panic and the screen keeps its bounds.
func FuzzTopParse(f *testing.F) {
	for _, pair := range [][2]string{{"live1.json", "metrics1.txt"}, {"live2.json", "metrics2.txt"}, {"live-findings.json", "metrics2.txt"}} {
		live, err := os.ReadFile(filepath.Join("testdata", "top", pair[0]))
		if err != nil {
			f.Fatal(err)
		}
		metrics, err := os.ReadFile(filepath.Join("testdata", "top", pair[1]))
		if err != nil {
			f.Fatal(err)
		}
		// The families agent top reads: a mutated 30 KB scrape fuzzes
		// the others' lines more than these.
		var keep []byte
		for _, l := range strings.SplitAfter(string(metrics), "\n") {
			if strings.Contains(l, "lanewatch_lane_capacity") || strings.Contains(l, "lanewatch_lane_bytes") {
				keep = append(keep, l...)
			}
		}
		f.Add(live, append(keep, requestLines(3, 2, 0.5)...))
	}
	base := readSample(f, "live1.json", "metrics1.txt")
	f.Fuzz(func(t *testing.T, live, metrics []byte) {
		s := &topSample{}
		if decodeLive(live, "live", &s.live) != nil || parseTopMetrics(metrics, "metrics", s) != nil {
			return
		}
		s.at = s.live.At
		for _, prev := range []*topSample{nil, base, s} {
			lines := render("a:1", prev, s, nil, 80, 24)
			if len(lines) > 24 {
				t.Fatalf("%d lines", len(lines))
			}
			for _, l := range lines {
				if utf8.RuneCountInString(l) >= 80 {
					t.Fatalf("%q is %d wide", l, utf8.RuneCountInString(l))
				}
			}
			render("a:1", prev, s, nil, 0, 0)
		}
	})
}

// agent top --once reads twice an --interval apart and prints one block of
// lines; an agent that does not answer is exit 1. The agent here serves
// the recorded answers in their order.
func TestTopOnce(t *testing.T) {
	var lives, metrics [][]byte
	for i := 1; i <= 2; i++ {
		for _, f := range []struct {
			name string
			into *[][]byte
		}{{"live%d.json", &lives}, {"metrics%d.txt", &metrics}} {
			b, err := os.ReadFile(filepath.Join("testdata", "top", fmt.Sprintf(f.name, i)))
			if err != nil {
				t.Fatal(err)
			}
			*f.into = append(*f.into, b)
		}
	}
	var nLive, nMetrics atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc(agent.LivePath, func(w http.ResponseWriter, _ *http.Request) {
		w.Write(lives[min(nLive.Add(1)-1, 1)])
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Write(metrics[min(nMetrics.Add(1)-1, 1)])
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	var out, errb bytes.Buffer
	if code := realMain([]string{"top", "--once", "--interval", "10ms", "--web.listen-address", addr}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !regexp.MustCompile(`(?m)^0000:18:00\.0\s+H2D\s+0\.98\s+31\.51\s+3%\s+931$`).MatchString(out.String()) ||
		strings.Contains(out.String(), "\x1b") || nLive.Load() != 2 || nMetrics.Load() != 2 {
		t.Errorf("%d live views, %d scrapes read; printed:\n%s", nLive.Load(), nMetrics.Load(), out.String())
	}

	srv.Close()
	out.Reset()
	errb.Reset()
	if code := realMain([]string{"top", "--once", "--web.listen-address", addr}, &out, &errb); code != 1 ||
		!strings.HasPrefix(errb.String(), "agent top: Get \"http://"+addr+agent.LivePath+"\"") || out.Len() != 0 {
		t.Errorf("no agent: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}
