package judge

import (
	"slices"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
)

// rdma-congestion: the window's completed work requests against the RDMA
// port counters (checks.Congestion), over each interval between two
// counter samples.

var _ = register(congestionRule{})

type congestionRule struct{}

func (congestionRule) Check() string    { return checks.CheckCongestion }
func (congestionRule) Raises() []string { return []string{"rdma-congestion"} }
func (congestionRule) Unsampled() string {
	return "needs a live window (--sample) to compare counter rates with latency"
}

// Judge judges each interval in turn, the later against the earlier (which
// is also the quiet baseline a port learns while its counters were still):
// a finding of any interval is the window's; the last interval's wins.
func (congestionRule) Judge(w *Window, env *Env) (j Judgement) {
	c := env.Congestion
	if c == nil {
		if env.CongestionUnjudged != "" {
			j.Checks = []checks.Check{checks.Skipped(checks.HostScope, checks.CheckCongestion, "%s", env.CongestionUnjudged)}
		}
		return j
	}
	if len(env.CongestionSplits) == 0 {
		c.Sample() // the window's end: one interval since the last sample
	}
	parts := make([][]correlate.Transfer, len(env.CongestionSplits)+1)
	for _, t := range w.RDMAs() {
		i, _ := slices.BinarySearch(env.CongestionSplits, t.CompleteNs+1)
		parts[i] = append(parts[i], t)
	}
	var earlier []correlate.Finding
	for _, p := range parts[:len(parts)-1] {
		earlier = append(earlier, c.Judge(p).Findings...)
	}
	last := c.Judge(parts[len(parts)-1])
	for _, f := range earlier {
		if !slices.ContainsFunc(last.Findings, func(g correlate.Finding) bool { return g.Subject == f.Subject }) {
			f.Evidence = append(f.Evidence, "in an earlier part of the window")
			last.Findings = append(last.Findings, f)
		}
	}
	j.Checks = []checks.Check{last}
	return j
}
