package docgen

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/judge"
)

// metric is one series family as docs/metrics.md shows it.
type metric struct {
	name, help string
	labels     []string
}

// source is a group of metrics: who sends them and when.
type source struct {
	title, about string
	describe     func(ch chan<- *prometheus.Desc)
}

// scrapers are the collectors `agent run` reads at scrape time, by the name
// their lanewatch_collector_* series carry (agent/run.go). Only their
// Describe is called: their sources are this host's.
func scrapers() []struct {
	name string
	c    exporters.Collector
} {
	return []struct {
		name string
		c    exporters.Collector
	}{
		{"rdma_ports", collectors.NewInfiniBandMetrics("")},
		{"host", collectors.NewHostMetrics("", "")},
		{"disk", collectors.NewDiskMetrics("", "", nil)},
		{"gpu", collectors.NewGPUMetrics(nil)},
		{"spans", exporters.SpansCollector{}},
		{"span_export", exporters.SpanExportCollector{}},
		{"otlp", exporters.OTLPCollector{}},
	}
}

// Metrics writes docs/metrics.md from the descriptors exporters.Metrics
// and every scrape-time collector describe. A descriptor carries no type:
// it is read from a scrape of a registry holding them (the scrape-time
// collectors' health series included), fed a copy and a completed work
// request so the histograms are sent; a series that scrape does not send
// is a counter when named _total, else a gauge (the naming rule every
// series sent obeys: TestNamingRuleHolds).
func Metrics(w io.Writer) error {
	types, health, err := scrapedTypes()
	if err != nil {
		return err
	}
	m := exporters.NewMetrics(nil, judge.Descs()...)
	sources := []source{{title: "Counted by the agent", about: "`exporters.Metrics`: from the transfers, the evaluator's windows (the window rules' own series: judge.Descs) and the agent's health.", describe: m.Describe}}
	for _, s := range scrapers() {
		sources = append(sources, source{title: "Read at scrape time: `" + s.name + "`", about: fmt.Sprintf("`%T`, read at every scrape.", s.c), describe: s.c.Describe})
	}
	sources = append(sources, source{title: "Every scrape-time collector", about: "How each collector above went at this scrape, by its name.",
		describe: func(ch chan<- *prometheus.Desc) {
			for _, h := range health {
				ch <- h
			}
		}})

	var b strings.Builder
	b.WriteString("# Metrics\n\n" + generated + "\n")
	b.WriteString("`agent run` serves these on `--web.listen-address` at `--web.telemetry-path` (docs/flags.md),\n" +
		"besides the Go client's `go_*` and `process_*` series. Findings are\n" +
		"`lanewatch_findings{rule,severity}` and `lanewatch_finding_windows_total{rule,severity}`, one\n" +
		"series per rule and severity of docs/rules.md.\n")
	seen := map[string]bool{}
	for _, s := range sources {
		ms, err := describe(s.describe)
		if err != nil {
			return fmt.Errorf("%s: %w", s.title, err)
		}
		fmt.Fprintf(&b, "\n## %s\n\n%s\n\n| metric | type | labels | help |\n|---|---|---|---|\n", s.title, s.about)
		for _, d := range ms {
			if seen[d.name] {
				return fmt.Errorf("%s is described twice", d.name)
			}
			seen[d.name] = true
			typ := types[d.name]
			if typ == "" {
				typ = typeByName(d.name)
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", d.name, typ, orNone(strings.Join(d.labels, ", ")), cell(d.help))
		}
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// typeByName is the type the naming rule gives a series.
func typeByName(name string) string {
	if strings.HasSuffix(name, "_total") {
		return "counter"
	}
	return "gauge"
}

// scrapedTypes scrapes a registry like `agent run`'s: exporters.Metrics fed
// one copy, one completed work request and one UCX put, and a scrape-time collector
// whose source fails (sending its health series). It returns each
// lanewatch series' type and the health series' descriptors.
func scrapedTypes() (map[string]string, []*prometheus.Desc, error) {
	m := exporters.NewMetrics(func() exporters.Health { return exporters.Health{} })
	for _, t := range []correlate.Transfer{
		{Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 1},
		{Op: event.OpPostSend, Direction: correlate.DirRDMAWrite, Bytes: 1, Status: "success", SubmitNs: 1, CompleteNs: 2},
		{Op: event.OpXferPut, API: "ucp_put_nbx", Direction: correlate.DirRDMAWrite, Bytes: 1, Transport: "tcp", NetDevice: "lo", SubmitNs: 1, CompleteNs: 2, LatencyNs: 1},
	} {
		m.Transfer(&t)
	}
	mfs, err := exporters.NewRegistry(m, map[string]exporters.Collector{"failing": failing{}}, nil).Gather()
	if err != nil {
		return nil, nil, err
	}
	types := map[string]string{}
	var health []*prometheus.Desc
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "lanewatch_") {
			continue
		}
		types[name] = strings.ToLower(mf.GetType().String())
		if strings.HasPrefix(name, "lanewatch_collector_") {
			health = append(health, prometheus.NewDesc(name, mf.GetHelp(), labelNames(mf), nil))
		}
	}
	if len(health) == 0 {
		return nil, nil, errors.New("a registry with a scrape-time collector sent no lanewatch_collector_* series")
	}
	return types, health, nil
}

func labelNames(mf *dto.MetricFamily) []string {
	var names []string
	if len(mf.GetMetric()) > 0 {
		for _, l := range mf.GetMetric()[0].GetLabel() {
			names = append(names, l.GetName())
		}
	}
	return names
}

// failing is a scrape-time collector whose source is never there.
type failing struct{}

func (failing) Update(chan<- prometheus.Metric) error { return errors.New("no source") }
func (failing) Describe(chan<- *prometheus.Desc)      {}

// describe reads the descriptors a Describe sends, in its order.
func describe(f func(ch chan<- *prometheus.Desc)) ([]metric, error) {
	ch := make(chan *prometheus.Desc)
	go func() { f(ch); close(ch) }()
	var out []metric
	var err error
	for d := range ch {
		m, e := parseDesc(d.String())
		if e != nil && err == nil {
			err = e
		}
		out = append(out, m)
	}
	if err == nil && len(out) == 0 {
		err = errors.New("no descriptor")
	}
	return out, err
}

// parseDesc reads a descriptor's name, help and variable labels from its
// String form, the only way prometheus.Desc shows them:
// Desc{fqName: "…", help: "…", constLabels: {…}, variableLabels: {a,b}}.
func parseDesc(s string) (metric, error) {
	bad := func(what string) (metric, error) {
		return metric{}, fmt.Errorf("descriptor %s: cannot read its %s", s, what)
	}
	var m metric
	rest, ok := strings.CutPrefix(s, "Desc{fqName: ")
	if !ok {
		return bad("name")
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return bad("name")
	}
	m.name, _ = strconv.Unquote(q)
	if rest, ok = strings.CutPrefix(rest[len(q):], ", help: "); !ok {
		return bad("help")
	}
	if q, err = strconv.QuotedPrefix(rest); err != nil {
		return bad("help")
	}
	m.help, _ = strconv.Unquote(q)
	if rest, ok = strings.CutPrefix(rest[len(q):], ", constLabels: {}, variableLabels: {"); !ok {
		return bad("labels (or it has constant labels)")
	}
	labels, ok := strings.CutSuffix(rest, "}}")
	if !ok {
		return bad("labels")
	}
	if labels != "" {
		m.labels = strings.Split(labels, ",")
	}
	if m.name == "" {
		return bad("name")
	}
	return m, nil
}
