package judge

import (
	"fmt"
	"slices"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/exporters"
)

// Rule is one window rule: the check it reports under, the findings it can
// raise (correlate.Rules entries with InWindow), why it cannot be judged
// without a live window, and its judgement of a closed window. Each rule's
// file registers it (register); Judge runs every registered rule, for
// `agent run`'s evaluator and for `agent diagnose --sample` alike.
//
// A rule that gathers facts of its own from the window's transfers and
// activities also implements Gatherer; the others read the facts every
// rule shares (checks.Window: per-process copies, the flows on each lane).
type Rule interface {
	Check() string
	Raises() []string
	// Unsampled is why the rule is not judged without a live window.
	Unsampled() string
	Judge(w *Window, env *Env) Judgement
}

// Gatherer is a rule with facts of its own: NewFacts returns them empty,
// for one window.
type Gatherer interface {
	Rule
	NewFacts() Facts
}

// Facts are what one rule gathers over one window. Calls come under the
// window's lock, one at a time.
type Facts interface {
	Transfer(t *correlate.Transfer)
	Activity(a *correlate.Activity)
}

// Judgement is a rule's verdict on a window: its checks (SKIPs with their
// reason included; their findings are the rule's findings) and its metric
// series for the window.
type Judgement struct {
	Checks []checks.Check
	Series []exporters.Sample
}

// Env is what a rule may know of the window beyond its transfers.
type Env struct {
	Span time.Duration // how long the window lasted
	// Scope names a process in a check's scope ("pid N" when nil).
	Scope func(pid uint32) string
	// Targets are processes the per-process rules judge even when the
	// window saw nothing of them (diagnose's targets: each gets its SKIP).
	Targets []uint32
	// Place is each process's GPU and link capacity; Capacity the
	// per-direction capacity in GB/s of a GPU link (0 unknown).
	Place    func(pid uint32) checks.Placement
	Capacity func(gpu string) float64
	// NUMA places GPUs and nodes (nil: every node unknown).
	NUMA checks.NUMAPlace
	// NICs places the host's RDMA devices from each GPU (nil: unknown,
	// and the transfer-library lanes are listed, not judged).
	NICs NICPlace
	// Lanes are the window's lane rates (LaneRates).
	Lanes []LaneRate
	// Congestion is the RDMA port counters (nil: no check, or a SKIP
	// saying CongestionUnjudged). Without CongestionSplits they are
	// sampled when the window is judged, one interval since the last
	// sample; with them, they were sampled already at the window's start,
	// end and each split (CLOCK_MONOTONIC ns, ascending), and each interval
	// is judged on the requests completed in it.
	Congestion         *checks.Congestion
	CongestionSplits   []uint64
	CongestionUnjudged string
	// StorageReads are the traced processes' storage reads over the
	// window; StorageUnjudged, when set, says why they are not judged.
	StorageReads    []checks.StorageFlow
	StorageUnjudged string
	// DiskRates are the block devices' rates over the window, placed by
	// Storage; nil: no check.
	DiskRates func() ([]collectors.DiskRate, error)
	Storage   checks.StorageHost
	// scoped records the process of each scope the rules named (Judge),
	// so that the checks of a process that lost events are known.
	scoped map[string]uint32
}

func (env *Env) scope(pid uint32) string {
	s := fmt.Sprintf("pid %d", pid)
	if env.Scope != nil {
		s = env.Scope(pid)
	}
	if env.scoped != nil {
		env.scoped[s] = pid
	}
	return s
}

// mergePIDs is the sorted union of two lists of processes.
func mergePIDs(a, b []uint32) []uint32 {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// rules are the registered window rules, in their files' order.
var rules []Rule

// register adds a window rule; each rule's file calls it once.
func register(r Rule) bool {
	for _, name := range r.Raises() {
		if c, ok := correlate.RuleNamed(name); !ok || c.Where&correlate.InWindow == 0 {
			panic(fmt.Sprintf("judge: rule %q raises %q, not a registered window rule", r.Check(), name))
		}
	}
	if slices.ContainsFunc(rules, func(o Rule) bool { return o.Check() == r.Check() }) {
		panic(fmt.Sprintf("judge: rule %q registered twice", r.Check()))
	}
	rules = append(rules, r)
	return true
}

// Rules lists the registered window rules.
func Rules() []Rule { return slices.Clone(rules) }

// Judge runs every registered rule over a closed window: the one loop both
// the evaluator and diagnose judge a window with. The checks that rest on
// events the window lost say so (partial).
func Judge(w *Window, env *Env) Judgement {
	var out Judgement
	e := *env
	e.scoped = map[string]uint32{}
	for _, r := range rules {
		j := r.Judge(w, &e)
		out.Checks = append(out.Checks, j.Checks...)
		out.Series = append(out.Series, j.Series...)
	}
	out.Checks = partial(out.Checks, w.Losses(), e.scoped)
	return out
}

// Findings are every finding of a judgement's checks.
func (j Judgement) Findings() []correlate.Finding {
	var out []correlate.Finding
	for _, c := range j.Checks {
		out = append(out, c.Findings...)
	}
	return out
}

// Unsampled is, for a report without a live window, one SKIP per rule with
// its reason.
func Unsampled() []checks.Check {
	var out []checks.Check
	for _, r := range rules {
		out = append(out, checks.Skipped(checks.HostScope, r.Check(), "%s", r.Unsampled()))
	}
	return out
}

// Descs are the registered rules' metric series descriptors (rules with
// series implement Described).
func Descs() []exporters.Desc {
	var out []exporters.Desc
	for _, r := range rules {
		if d, ok := r.(Described); ok {
			out = append(out, d.Descs()...)
		}
	}
	return out
}

// Described is a rule with metric series.
type Described interface {
	Descs() []exporters.Desc
}
