package agent

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A library's own lines (net/http's accept errors) become structured WARN
// lines, one per cause per interval whatever the address or delay in them.
func TestLineLogger(t *testing.T) {
	var buf bytes.Buffer
	l := newLimitedLog(slog.New(slog.NewTextHandler(&buf, nil)), time.Minute)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	lg := l.lineLogger("OTLP HTTP receiver")
	for _, d := range []string{"5ms", "10ms", "20ms"} {
		lg.Printf("http: Accept error: accept tcp 127.0.0.1:14318: accept4: too many open files; retrying in %s", d)
	}
	lg.Printf("http: TLS handshake error from 127.0.0.1:5555: EOF")
	now = now.Add(time.Minute)
	lg.Printf("http: Accept error: accept tcp 127.0.0.1:14318: accept4: too many open files; retrying in 1s")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 lines (accept, TLS, accept again), got:\n%s", buf.String())
	}
	for _, l := range lines {
		if !strings.Contains(l, `level=WARN msg="OTLP HTTP receiver" err="http: `) {
			t.Errorf("not structured: %s", l)
		}
	}
	if !strings.Contains(lines[2], "repeated=2") {
		t.Errorf("the held-back lines are not counted: %s", lines[2])
	}
	for in, want := range map[string]string{
		"traces export: context deadline exceeded":  "traces export: context deadline exceeded",
		"http: Accept error: accept tcp 10.0.0.1:1": "http: Accept error: accept tcp ",
		strings.Repeat("x", 200):                    strings.Repeat("x", 80),
	} {
		if got := lineCause(in); got != want {
			t.Errorf("lineCause(%q) = %q, want %q", in, got, want)
		}
	}
}
