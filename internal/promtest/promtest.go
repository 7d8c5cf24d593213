// Package promtest runs the Prometheus tools the metrics and alerting tests
// need: promtool, and a real Prometheus server on a loopback port. Outside
// CI a missing tool skips the test; under CI=true it fails it (.ci/run
// installs Debian's prometheus package).
package promtest

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Tool finds a Prometheus binary (promtool, prometheus) in PATH or
// /usr/bin.
func Tool(tb testing.TB, name string) string {
	tb.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if p := filepath.Join("/usr/bin", name); fileExists(p) {
		return p
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s not found and CI=true forbids skipping: apt-get install prometheus", name)
	}
	tb.Skipf("%s not found (apt-get install prometheus)", name)
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// FreePort returns a loopback address with a port free at the time of the call.
func FreePort(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Server is a Prometheus server started for a test.
type Server struct {
	URL string // http://127.0.0.1:port
	cmd *exec.Cmd
	log *strings.Builder
}

// Start runs prometheus with config (YAML) on a free loopback port, its
// TSDB in a temporary directory, and waits (bounded) until it is ready. The
// server is killed when the test ends. ruleFiles are copied next to the
// config so that relative rule_files entries resolve.
func Start(tb testing.TB, config string, ruleFiles ...string) *Server {
	tb.Helper()
	return StartWithFlags(tb, nil, config, ruleFiles...)
}

// StartWithFlags is Start with further command-line flags
// (--enable-feature=exemplar-storage).
func StartWithFlags(tb testing.TB, flags []string, config string, ruleFiles ...string) *Server {
	tb.Helper()
	bin := Tool(tb, "prometheus")
	dir := tb.TempDir()
	for _, rf := range ruleFiles {
		b, err := os.ReadFile(rf)
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(rf)), b, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		tb.Fatal(err)
	}
	addr := FreePort(tb)
	s := &Server{URL: "http://" + addr, log: &strings.Builder{}}
	s.cmd = exec.Command(bin, append([]string{"--config.file=" + cfg, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr, "--log.level=warn"}, flags...)...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		tb.Fatalf("start prometheus: %v", err)
	}
	tb.Cleanup(func() {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		if tb.Failed() {
			tb.Logf("prometheus log:\n%s", s.log.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(s.URL + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	tb.Fatalf("prometheus not ready after 20s:\n%s", s.log.String())
	return nil
}

// API calls a Prometheus HTTP API path with query parameters and decodes
// the data member of a success response; an error response (bad_data for
// a PromQL syntax error) is returned as an error.
func (s *Server) API(path string, params url.Values, data any) error {
	u := s.URL + path
	if params != nil {
		u += "?" + params.Encode()
	}
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var r struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("%s: HTTP %d: %w", path, resp.StatusCode, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	if data == nil {
		return nil
	}
	return json.Unmarshal(r.Data, data)
}

// Alert is one entry of /api/v1/alerts.
type Alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"` // pending, firing
	Value  string            `json:"value"`
}

// Alerts lists the active (pending or firing) alerts.
func (s *Server) Alerts() ([]Alert, error) {
	var d struct {
		Alerts []Alert `json:"alerts"`
	}
	err := s.API("/api/v1/alerts", nil, &d)
	return d.Alerts, err
}

// Query evaluates an instant query and returns its vector's values by the
// series' label set, formatted as {k="v",...}.
func (s *Server) Query(q string) (map[string]string, error) {
	var d struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := s.API("/api/v1/query", url.Values{"query": {q}}, &d); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, r := range d.Result {
		out[fmt.Sprint(r.Metric)] = fmt.Sprint(r.Value[1])
	}
	return out, nil
}

// Exemplar is one exemplar of /api/v1/query_exemplars, with its series.
type Exemplar struct {
	Series map[string]string
	Labels map[string]string
	Value  string
	Time   float64 // Unix seconds
}

// Exemplars lists the exemplars of the series q selects between start and
// end (the server needs --enable-feature=exemplar-storage).
func (s *Server) Exemplars(q string, start, end time.Time) ([]Exemplar, error) {
	var d []struct {
		SeriesLabels map[string]string `json:"seriesLabels"`
		Exemplars    []struct {
			Labels    map[string]string `json:"labels"`
			Value     string            `json:"value"`
			Timestamp float64           `json:"timestamp"`
		} `json:"exemplars"`
	}
	params := url.Values{"query": {q}, "start": {fmt.Sprint(start.Unix())}, "end": {fmt.Sprint(end.Unix())}}
	if err := s.API("/api/v1/query_exemplars", params, &d); err != nil {
		return nil, err
	}
	var out []Exemplar
	for _, ser := range d {
		for _, e := range ser.Exemplars {
			out = append(out, Exemplar{Series: ser.SeriesLabels, Labels: e.Labels, Value: e.Value, Time: e.Timestamp})
		}
	}
	return out, nil
}
