package dashboards

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/internal/promtest"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/judge"
)

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource any    `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID    string `json:"refId"`
		Expr     string `json:"expr"`
		Exemplar bool   `json:"exemplar"`
	} `json:"targets"`
}

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []struct {
			Name string `json:"name"`
			Expr string `json:"expr"`
		} `json:"list"`
	} `json:"annotations"`
}

func load(t *testing.T) dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(Grafana, &d); err != nil {
		t.Fatalf("grafana/lanewatch.json: %v", err)
	}
	return d
}

// exprs are every PromQL expression of the dashboard, by where it is.
func exprs(d dashboard) map[string]string {
	out := map[string]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out["panel "+p.Title+" "+tg.RefID] = tg.Expr
		}
	}
	for _, a := range d.Annotations.List {
		out["annotation "+a.Name] = a.Expr
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			if m := labelValues.FindStringSubmatch(q["query"].(string)); m != nil {
				out["variable "+v.Name] = m[1] // label_values(selector, label): the selector must parse
			}
		}
	}
	return out
}

var labelValues = regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`)

func TestDashboardShape(t *testing.T) {
	d := load(t)
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("uid %q title %q panels %d", d.UID, d.Title, len(d.Panels))
	}
	ids := map[int]string{}
	for _, p := range d.Panels {
		if prev, dup := ids[p.ID]; dup || p.ID == 0 {
			t.Errorf("panel %q: id %d already used by %q (or zero)", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H <= 0 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || len(p.Targets) == 0 {
			t.Errorf("panel %q: no datasource or no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
				t.Errorf("panel %q: empty query or refId", p.Title)
			}
		}
	}
	// What issue 5 asks the dashboard to show beside each other.
	all := strings.Join(func() []string {
		var v []string
		for _, e := range exprs(d) {
			v = append(v, e)
		}
		return v
	}(), "\n")
	for _, want := range []string{"sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
		"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
		`direction="inbound"`, `direction="outbound"`, "lanewatch_lane_capacity_bytes_per_second", `host_mem="pageable"`,
		`rule="remote-numa-pool"`, "lanewatch_rdma_posted_to_completed_seconds", `rule="rdma-congestion"`,
		"lanewatch_gpu_nvlink_bytes_total", "lanewatch_peer_copy_bytes_per_second",
		"lanewatch_copy_compute_overlap_ratio", "lanewatch_host_wait_seconds_total"} {
		if !strings.Contains(all, want) {
			t.Errorf("no dashboard query uses %s", want)
		}
	}
	if len(d.Annotations.List) == 0 || !strings.Contains(d.Annotations.List[0].Expr, "lanewatch_findings") {
		t.Error("findings are not shown as annotations")
	}
}

// The row issue 24 asks for: the KV share of TTFT as a histogram, the
// slowest requests' KV wait with exemplars (Grafana draws them and links
// each to its trace), and the findings beside them.
func TestKVPathRow(t *testing.T) {
	d := load(t)
	var row []panel
	in := false
	for _, p := range d.Panels {
		if p.Type == "row" {
			in = strings.HasPrefix(p.Title, "TTFT and the KV path")
			continue
		}
		if in {
			row = append(row, p)
		}
	}
	type want struct {
		what, expr string
		exemplar   bool
	}
	for _, w := range []want{
		{"the TTFT share histogram", "lanewatch_request_kv_ttft_share_bucket{", true},
		{"the slowest requests' KV wait, linked to their traces", `histogram_quantile(0.99, sum by (le) (rate(lanewatch_request_kv_seconds_bucket{instance=~"$instance",kind="all"}`, true},
		{"the requests summarised", "lanewatch_request_kv_summaries_total{", false},
		{"the findings behind them", "lanewatch_finding_windows_total{", false},
	} {
		found := false
		for _, p := range row {
			for _, tg := range p.Targets {
				if strings.Contains(tg.Expr, w.expr) && (tg.Exemplar || !w.exemplar) {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("row \"TTFT and the KV path\" (%d panels) does not show %s: no query with %s (exemplars %v)", len(row), w.what, w.expr, w.exemplar)
		}
	}
}

// exporterNames are the series names a scrape of the exporter can hold
// (histograms with their _bucket, _sum and _count).
func exporterNames(t *testing.T) map[string]bool {
	t.Helper()
	m := exporters.NewMetrics(func() exporters.Health {
		return exporters.Health{AttachedProbes: map[string]int{"/lib/libcuda.so.1": 1},
			AttachFailures: map[string]uint64{"libcuda.so.1": 1}, Unprobed: map[string]int{"libcuda.so.1": 1}}
	}, judge.Descs()...)
	for _, tr := range []correlate.Transfer{
		{Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 1, HostMem: event.MemPageable},
		{Op: event.OpPostSend, Direction: correlate.DirRDMAWrite, Bytes: 1, Status: "success", SubmitNs: 1, CompleteNs: 2},
	} {
		m.Transfer(&tr)
	}
	m.SetWindow(exporters.Window{At: time.Now(), Lanes: []exporters.Lane{{GPU: "0000:17:00.0", Direction: "inbound", Demand: 1, Capacity: 1, Measured: 1, HasMeasured: true}},
		Peers: []exporters.Peer{{Src: "0000:17:00.0", Dst: "0000:3b:00.0", Path: "nvlink", Bps: 1}}})
	var series []exporters.Sample // one series of every window rule's metric
	for _, d := range judge.Descs() {
		series = append(series, exporters.Sample{Desc: d, Value: 1, Labels: slices.Repeat([]string{"x"}, len(d.Labels))})
	}
	m.SetRuleSeries(series)
	gpu := collectors.GPUReading{BusID: "0000:17:00.0", HasPCIeBytes: true, HasNVLink: true, HasReplay: true, LinkGen: 5, LinkWidth: 16}
	scrapers := map[string]exporters.Collector{"gpu": collectors.NewGPUMetrics(oneGPU{collectors.GPUSnapshot{GPUs: []collectors.GPUReading{gpu}}}),
		"disk": collectors.NewDiskMetrics(oneDisk(t))}
	mfs, err := exporters.NewRegistry(m, scrapers, nil).Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		n := mf.GetName()
		names[n] = true
		if mf.GetType().String() == "HISTOGRAM" {
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
		}
	}
	return names
}

// oneDisk is a procfs and sysfs with one block device, vda (the
// development VM's diskstats capture): its series whatever disks this
// machine has.
func oneDisk(t *testing.T) (proc, sys string, place func(string) collectors.DiskPlace) {
	proc, sys = t.TempDir(), t.TempDir()
	b, err := os.ReadFile(filepath.Join("..", "collectors", "testdata", "diskstats", "lanewatch-dev_6.18.diskstats"))
	if err != nil {
		t.Fatal(err)
	}
	sysfstest.Write(t, filepath.Join(proc, "diskstats"), string(b)) // an empty sysfs: no partition, so vda is whole
	return proc, sys, nil
}

// oneGPU is a GPU counter source that always reads the same snapshot.
type oneGPU struct{ snap collectors.GPUSnapshot }

func (o oneGPU) Sample() (collectors.GPUSnapshot, error) { return o.snap, nil }
func (oneGPU) Source() string                            { return "fixed" }
func (oneGPU) Close() error                              { return nil }

var lanewatchName = regexp.MustCompile(`\blanewatch_[a-z_]+[a-z]`)

// Every lanewatch_* metric a dashboard panel or an alert rule queries is one
// the exporter produces: a renamed metric cannot leave a silent panel or
// an alert that never fires.
func TestQueriedMetricsExist(t *testing.T) {
	names := exporterNames(t)
	d := load(t)
	used := map[string]string{}
	for where, e := range exprs(d) {
		for _, n := range lanewatchName.FindAllString(e, -1) {
			used[n] = where
		}
	}
	for _, n := range lanewatchName.FindAllString(string(Rules), -1) {
		used[n] = "lanewatch.rules.yml"
	}
	if len(used) < 10 {
		t.Fatalf("only %d lanewatch metrics found in the queries", len(used))
	}
	var missing []string
	for n, where := range used {
		if !names[n] {
			missing = append(missing, n+" ("+where+")")
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("queried but not exported: %s", strings.Join(missing, ", "))
	}
}

// Every finding rule has an alert.
// Every rule of the registry (correlate.Rules) has an alert at each of its
// severities but INFO, and the alert test feeds every series (check.sh runs
// it): an INFO series need have no alert (remote-numa-pool's sibling node
// is nothing to page anyone for), and feeding it proves the rule's other
// alerts stay silent on it.
func TestEveryFindingRuleHasAnAlert(t *testing.T) {
	for _, r := range correlate.Rules {
		for _, s := range r.Severities {
			series := `rule="` + r.Name + `",severity="` + string(s) + `"`
			// Rules judged per window alert on the count of windows.
			if s != correlate.SevInfo && !strings.Contains(string(Rules), `lanewatch_findings{`+series+`}`) &&
				!strings.Contains(string(Rules), `lanewatch_finding_windows_total{`+series+`}`) {
				t.Errorf("no alert on lanewatch_findings{%s} or lanewatch_finding_windows_total{%[1]s}", series)
			}
			if !strings.Contains(string(RuleTests), series+`}`) {
				t.Errorf("the alert test never feeds lanewatch_findings{...%s}", series)
			}
		}
	}
}

// grafanaVars replaces the dashboard's variables with values Prometheus
// accepts, so the expression itself can be checked.
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$__interval", "15s", "$instance", ".*", "$gpu", ".*")

// Every dashboard expression parses and evaluates in a real Prometheus
// (Debian's package): promtool cannot check PromQL inside a dashboard.
func TestDashboardPromQL(t *testing.T) {
	srv := promtest.Start(t, "global:\n  scrape_interval: 1m\n")
	for where, e := range exprs(load(t)) {
		q := grafanaVars.Replace(e)
		if strings.Contains(q, "$") {
			t.Errorf("%s: unknown variable in %q", where, e)
			continue
		}
		if err := srv.API("/api/v1/query", url.Values{"query": {q}}, nil); err != nil {
			t.Errorf("%s: %q: %v", where, q, err)
		}
	}
}
