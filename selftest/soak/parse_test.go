package soak

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/selftest"
)

func TestJudgeGrowth(t *testing.T) {
	mib := float64(1 << 20)
	for _, c := range []struct {
		name   string
		values []float64
		rel    float64
		floor  float64
		fail   bool
		few    bool
	}{
		{"flat", []float64{10, 10, 10, 10, 10, 10}, 0.1, 0, false, false},
		{"grows 50%", []float64{10, 10, 10, 15, 15, 15}, 0.1, 0, true, false},
		{"grows 10% exactly", []float64{10, 10, 10, 11, 11, 11}, 0.1, 0, false, false},
		{"one spike at the end is not the median", []float64{10, 10, 10, 10, 10, 10, 10, 99, 10}, 0.1, 0, false, false},
		{"shrinks", []float64{20, 20, 20, 10, 10, 10}, 0.1, 0, false, false},
		{"within the absolute floor", []float64{100 * mib, 100 * mib, 130 * mib, 130 * mib}, 0.1, 32 * mib, false, false},
		{"beyond the absolute floor", []float64{100 * mib, 100 * mib, 140 * mib, 140 * mib}, 0.1, 32 * mib, true, false},
		{"too few", []float64{1, 2}, 0.1, 0, false, true},
		{"steady climb", []float64{10, 11, 12, 13, 14, 15, 16, 17, 18}, 0.1, 0, true, false},
	} {
		g := judgeGrowth("x", c.values, c.rel, c.floor)
		if g.Fail != c.fail || g.TooFewSince != c.few {
			t.Errorf("%s: fail %v too-few %v, want %v %v (%s)", c.name, g.Fail, g.TooFewSince, c.fail, c.few, g)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

const statusText = "Name:\tagent\nVmPeak:\t 2000000 kB\nVmHWM:\t  300000 kB\nVmRSS:\t  200000 kB\nThreads:\t12\n"

func TestParseStatus(t *testing.T) {
	for _, c := range []struct {
		name, text        string
		rss, hwm, threads uint64
		err               string
	}{
		{"real", statusText, 200000 << 10, 300000 << 10, 12, ""},
		{"no VmRSS (a kernel thread)", "Name:\tkthreadd\nThreads:\t1\n", 0, 0, 0, "no VmRSS"},
		{"not a number", "VmRSS:\t  x kB\nVmHWM:\t 1 kB\nThreads:\t1\n", 0, 0, 0, "VmRSS"},
		{"no unit", "VmRSS:\t  1\nVmHWM:\t 1 kB\nThreads:\t1\n", 0, 0, 0, "VmRSS"},
		{"twice", "VmRSS:\t 1 kB\nVmRSS:\t 2 kB\nVmHWM:\t 1 kB\nThreads:\t1\n", 0, 0, 0, "twice"},
		{"empty", "", 0, 0, 0, "no VmRSS"},
		{"huge", "VmRSS:\t 99999999999999999 kB\nVmHWM:\t 1 kB\nThreads:\t1\n", 0, 0, 0, "VmRSS"},
	} {
		rss, hwm, threads, err := parseStatus(c.text)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want one naming %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || rss != c.rss || hwm != c.hwm || uint64(threads) != c.threads {
			t.Errorf("%s: %d %d %d %v", c.name, rss, hwm, threads, err)
		}
	}
	// And this process's own.
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if rss, _, threads, err := parseStatus(string(b)); err != nil || rss == 0 || threads == 0 {
		t.Errorf("/proc/self/status: rss %d threads %d: %v", rss, threads, err)
	}
}

func FuzzParseStatus(f *testing.F) {
	f.Add(statusText)
	f.Add("VmRSS:\n")
	f.Fuzz(func(t *testing.T, s string) {
		rss, _, _, err := parseStatus(s)
		if err == nil && rss > 1<<60 {
			t.Fatalf("rss %d accepted", rss)
		}
	})
}

const fdinfoText = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2090\nlink_type:\tuprobe_multi\nlink_id:\t4242\nprog_tag:\tabc\nprog_id:\t77\n"

func TestFdinfoValue(t *testing.T) {
	for _, c := range []struct {
		text, key string
		want      uint32
		err       bool
	}{
		{fdinfoText, "link_id", 4242, false},
		{fdinfoText, "prog_id", 77, false},
		{fdinfoText, "map_id", 0, true},
		{"link_id:\tx\n", "link_id", 0, true},
		{"link_id:\t4294967296\n", "link_id", 0, true},
		{"", "link_id", 0, true},
	} {
		got, err := fdinfoValue(c.text, c.key)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("%q %s: %d %v", c.text, c.key, got, err)
		}
	}
}

func FuzzFdinfoValue(f *testing.F) {
	f.Add(fdinfoText)
	f.Fuzz(func(t *testing.T, s string) { fdinfoValue(s, "link_id") })
}

func TestField(t *testing.T) {
	line := `time=2026-12-01T17:08:24.222Z level=WARN msg="forward OTLP traces upstream" err="503: x y" n=3`
	for _, c := range []struct{ line, key, want string }{
		{line, "level", "WARN"},
		{line, "msg", "forward OTLP traces upstream"},
		{line, "err", "503: x y"},
		{line, "n", "3"},
		{line, "time", "2026-12-01T17:08:24.222Z"},
		{line, "missing", ""},
		{`msg="unterminated`, "msg", `"unterminated`},
		{"level=", "level", ""},
		{"", "level", ""},
	} {
		if got := field(c.line, c.key); got != c.want {
			t.Errorf("field(%q, %s) = %q, want %q", c.line, c.key, got, c.want)
		}
	}
}

func FuzzField(f *testing.F) {
	f.Add(`time=x level=INFO msg="a b" k=v`)
	f.Fuzz(func(t *testing.T, s string) {
		field(s, "level")
		field(s, "msg")
	})
}

// truthOf is a scenario's truth: n host-to-device copies of pid from tid,
// the agent's records of them, and a failed call.
func truthOf(pid uint32, start uint64, n int) ([]selftest.TruthCall, []correlate.Transfer) {
	var truth []selftest.TruthCall
	var got []correlate.Transfer
	for i := range n {
		at := start + uint64(i+1)*1000
		truth = append(truth, selftest.TruthCall{Seq: i, PID: pid, TID: pid, API: "cudaMemcpyAsync", Op: selftest.TruthCopy, Dst: 0x7000 + uint64(i),
			Src: 0x1000 + uint64(i), Bytes: 4096, Direction: "H2D", Stream: 9, ExpectHostMem: "pinned", Layer: -1, TCallNs: at, TReturnNs: at + 10})
		got = append(got, correlate.Transfer{PID: pid, TID: pid, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: "H2D", Bytes: 4096,
			Src: correlate.Side{Addr: 0x1000 + uint64(i)}, Dst: correlate.Side{Addr: 0x7000 + uint64(i)}, HostMem: "pinned", Stream: 9,
			SubmitNs: at, Layer: -1})
	}
	return truth, got
}

func TestLedger(t *testing.T) {
	l := newLedger()
	now := time.Now()
	// A process known from its start; one of its records came before.
	truth, got := truthOf(100, 1_000_000, 3)
	l.add(got[0], now)
	f := l.begin(100, "a", 1_000_000)
	l.add(got[1], now)
	l.add(got[2], now)
	if st := l.stats(); st.Matched != 0 {
		t.Fatalf("judged before it exited: %+v", st)
	}
	l.exit(f, "a", 2_000_000, truth, false)
	if st := l.stats(); st.Matched != 1 || st.GotRecords != 3 || st.WantRecords != 3 {
		t.Fatalf("after exit: %+v %v", st, l.problemList())
	}
	// The pid reused: the new incarnation's records are its own.
	truth2, got2 := truthOf(100, 3_000_000, 2)
	f2 := l.begin(100, "b", 3_000_000)
	l.add(got2[0], now)
	l.exit(f2, "b", 4_000_000, truth2, false)
	if n, _ := l.pending(now); n != 1 {
		t.Fatalf("pending %d, want 1", n)
	}
	// A record of another program, and one that differs from the truth.
	l.add(correlate.Transfer{PID: 555, SubmitNs: 5}, now)
	truth3, got3 := truthOf(200, 5_000_000, 2)
	f3 := l.begin(200, "c", 5_000_000)
	got3[1].Bytes = 1
	l.add(got3[0], now)
	l.add(got3[1], now)
	l.exit(f3, "c", 6_000_000, truth3, false)
	l.forget(now.Add(time.Hour), time.Minute)
	l.close()
	st := l.stats()
	want := ledgerStats{Finished: 3, Matched: 1, Mismatched: 1, WantRecords: 7, GotRecords: 6, Foreign: 1, Lost: 1, LostProcs: 1}
	if st != want {
		t.Errorf("stats %+v\nwant  %+v", st, want)
	}
	if p := l.problemList(); len(p) != 2 || !strings.Contains(p[0], "c pid 200") || !strings.Contains(p[1], "b pid 100: lost 1 of 2") {
		t.Errorf("problems %q", p)
	}
}

// A record after its process was judged makes it a mismatch; a record of
// a process that was abandoned (its run failed) is foreign.
func TestLedgerLateAndAbandoned(t *testing.T) {
	l := newLedger()
	now := time.Now()
	truth, got := truthOf(7, 100, 1)
	f := l.begin(7, "a", 100)
	l.add(got[0], now)
	l.exit(f, "a", 1_000_000, truth, false)
	l.add(got[0], now)
	g := l.begin(8, "b", 100)
	l.abandon(g)
	l.add(correlate.Transfer{PID: 8, SubmitNs: 200}, now)
	l.close()
	if st := l.stats(); st.Matched != 0 || st.Mismatched != 1 || st.ExtraRecords != 1 || st.Foreign != 1 {
		t.Errorf("%+v", st)
	}
}

// The tailer reads whole lines as they are written, a line split across
// writes included, and counts a line that is not a record.
func TestTailer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	w, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	tl, err := openTailer(path)
	if err != nil {
		t.Fatal(err)
	}
	defer tl.close()
	l := newLedger()
	f := l.begin(9, "a", 0)
	rec, _ := json.Marshal(correlate.Transfer{PID: 9, Op: event.OpCopy, SubmitNs: 10})
	w.Write(append(rec, '\n'))
	w.Write(rec[:5])
	if err := tl.poll(l); err != nil {
		t.Fatal(err)
	}
	w.Write(append(rec[5:], '\n'))
	w.Write([]byte("not json\n"))
	if err := tl.poll(l); err != nil {
		t.Fatal(err)
	}
	if tl.lines != 3 || tl.bad != 1 || len(f.got) != 2 {
		t.Errorf("lines %d bad %d records %d", tl.lines, tl.bad, len(f.got))
	}
}

// The OTLP/JSON the normal traffic sends has its ids in hex, as OTLP
// says (protojson writes base64).
func TestOTLPJSONHexIDs(t *testing.T) {
	req := &collectorpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{ScopeSpans: []*tracepb.ScopeSpans{{
		Spans: []*tracepb.Span{{TraceId: []byte{0: 0xab, 15: 0xcd}, SpanId: []byte{0: 0x12, 7: 0x34}, Name: "x"}}}}}}}
	b, err := otlpJSON(req)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.Contains(s, `"traceId":"ab0000000000000000000000000000cd"`) || !strings.Contains(s, `"spanId":"1200000000000034"`) {
		t.Errorf("ids not in hex: %s", s)
	}
}
