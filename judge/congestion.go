package judge

import "github.com/lanewatch/lanewatch/checks"

// rdma-congestion: the window's completed work requests against the RDMA
// port counters (checks.Congestion), as the caller reads them (Env).

var _ = register(congestionRule{})

type congestionRule struct{}

func (congestionRule) Check() string    { return checks.CheckCongestion }
func (congestionRule) Raises() []string { return []string{"rdma-congestion"} }
func (congestionRule) Unsampled() string {
	return "needs a live window (--sample) to compare counter rates with latency"
}

func (congestionRule) Judge(w *Window, env *Env) (j Judgement) {
	if env.Congestion != nil {
		j.Checks = []checks.Check{env.Congestion(w.RDMAs())}
	}
	return j
}
