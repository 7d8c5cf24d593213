package main

import (
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"0", 0}, {"4096", 4096}, {"4096B", 4096}, {"512MiB", 512 << 20}, {"2GiB", 2 << 30}, {"1TiB", 1 << 40},
		{"64KiB", 64 << 10}, {"off", math.MaxInt64}, {"9223372036854775807", math.MaxInt64},
	} {
		if got, err := parseSize(tc.in); err != nil || got != tc.want {
			t.Errorf("%q: %d %v, want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "MiB", "-1", "+5MiB", "512MB", "512M", "1.5GiB", "1 GiB", "8388608TiB", "OFF", "5iB", "KiB5"} {
		if got, err := parseSize(bad); err == nil {
			t.Errorf("%q accepted: %d", bad, got)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"512MiB", "off", "4096", "8191TiB", "-1KiB", "9223372036854775807B"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("%q: %d", s, n)
		}
		if s == "off" {
			return
		}
		// the number read, times its unit, is the size
		num := strings.TrimRight(s, "BKMGTi")
		v, _ := strconv.ParseInt(num, 10, 64)
		if unit := n / max(v, 1); v != 0 && (n%v != 0 || unit&(unit-1) != 0) {
			t.Fatalf("%q: %d is not %d times a unit", s, n, v)
		}
	})
}

func TestMemoryLimit(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		flag, env       string
		ring            uint64
		limit, goLimit  int64
		source, errText string
	}{
		{"", "", 0, 512 * mib, 512*mib - 72*mib, "default", ""},
		{"", "", 64 * mib, 512 * mib, 512*mib - 192*mib, "default", ""},
		{"1GiB", "", 0, 1024 * mib, 1024*mib - 72*mib, "--memory-limit", ""},
		{"1GiB", "300MiB", 0, 1024 * mib, 1024*mib - 72*mib, "--memory-limit", ""}, // the flag wins
		{"", "300MiB", 0, 372 * mib, 300 * mib, "GOMEMLIMIT", ""},                  // the runtime's own limit stands
		{"off", "", 0, math.MaxInt64, math.MaxInt64, "--memory-limit", ""},
		{"", "off", 0, math.MaxInt64, math.MaxInt64, "GOMEMLIMIT", ""},
		{"100MiB", "", 0, 0, 0, "", "leaves the Go heap 29360128 bytes after the ring and C libraries (75497472); want at least 142606336"},
		{"512MB", "", 0, 0, 0, "", `--memory-limit "512MB": unit "MB" is not B, KiB, MiB, GiB or TiB`},
		{"", "lots", 0, 0, 0, "", `GOMEMLIMIT "lots"`},
	} {
		limit, goLimit, source, err := memoryLimit(tc.flag, tc.env, tc.ring)
		if tc.errText != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errText) {
				t.Errorf("%q %q: %v, want error %q", tc.flag, tc.env, err, tc.errText)
			}
			continue
		}
		if err != nil || limit != tc.limit || goLimit != tc.goLimit || source != tc.source {
			t.Errorf("%q %q ring %d: %d %d %s %v; want %d %d %s", tc.flag, tc.env, tc.ring, limit, goLimit, source, err, tc.limit, tc.goLimit, tc.source)
		}
	}
}

// agent run sets the Go runtime's soft limit from --memory-limit (the
// process's go_gc_gomemlimit_bytes, as its metrics show it), by default
// 512 MiB less the ring and C allowance.
func TestRunMemoryLimit(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tc := range []struct {
		args []string
		want int64
	}{
		{[]string{"--memory-limit", "300MiB"}, 300<<20 - 72<<20},
		{nil, 512<<20 - 72<<20},
	} {
		cmd := exec.Command(os.Args[0], append([]string{"run", "--output", os.DevNull, "--web.listen-address", "127.0.0.1:0",
			"--otlp.grpc-listen", "", "--otlp.http-listen", ""}, tc.args...)...)
		cmd.Env = append(os.Environ(), "LW_AGENT_MAIN=1", "GOMEMLIMIT=")
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		l := newAgentLog(stderr)
		addr := l.waitFor(t, regexp.MustCompile(`msg="serving metrics" address=(\S+)`), 30*time.Second)[1]
		l.waitFor(t, regexp.MustCompile(`lanewatch running`), 30*time.Second)
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
		m := regexp.MustCompile(`(?m)^go_gc_gomemlimit_bytes (\S+)$`).FindSubmatch(body)
		if m == nil {
			t.Fatalf("%v: no go_gc_gomemlimit_bytes", tc.args)
		}
		if got, _ := strconv.ParseFloat(string(m[1]), 64); int64(got) != tc.want {
			t.Errorf("%v: Go soft limit %s, want %d", tc.args, m[1], tc.want)
		}
		if !strings.Contains(l.String(), `msg="memory limit"`) {
			t.Errorf("%v: the limit is not logged:\n%s", tc.args, l.String())
		}
	}
}
