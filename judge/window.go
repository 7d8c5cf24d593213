package judge

import (
	"sync"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
)

// Window collects one interval's transfers and activities for the rules:
// the facts they share (checks.Window) and each gathering rule's own. It
// is a correlate.Sink and a correlate.ActivitySink.
type Window struct {
	*checks.Window
	kernels bool // kernel launches are probed: compute overlap can be known
	// mu orders the shared facts and the gatherers' as one: a transfer is
	// in both of a window or in neither.
	mu    sync.Mutex
	facts []Facts // each Gatherer's, in gatherers' order
	lost  Losses  // events lost while the window was open (losses.go)
}

// gatherers are the registered rules with facts of their own, in the
// order of Window.facts.
func gatherers() []Gatherer {
	var out []Gatherer
	for _, r := range rules {
		if g, ok := r.(Gatherer); ok {
			out = append(out, g)
		}
	}
	return out
}

// NewWindow returns an empty window; kernels says whether kernel launches
// are probed (without them compute overlap is unknown).
func NewWindow(kernels bool) *Window {
	w := &Window{Window: checks.NewWindow(), kernels: kernels}
	w.facts = newFacts()
	return w
}

func newFacts() []Facts {
	var out []Facts
	for _, g := range gatherers() {
		out = append(out, g.NewFacts())
	}
	return out
}

// Transfer implements correlate.Sink.
func (w *Window) Transfer(t *correlate.Transfer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.Window.Transfer(t)
	if t.Failed() {
		return // a failed call moved nothing: no rule judges it
	}
	for _, f := range w.facts {
		f.Transfer(t)
	}
}

// Activity implements correlate.ActivitySink.
func (w *Window) Activity(a *correlate.Activity) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range w.facts {
		f.Activity(a)
	}
}

// sizer is Facts that size their buffers from the previous window's
// (the same rule's): a busy server's windows are alike, and a buffer grown
// copy by copy costs more than the copies.
type sizer interface{ sizeFrom(prev Facts) }

// Rotate hands back the window collected so far and starts a new one in w.
func (w *Window) Rotate() *Window {
	w.mu.Lock()
	defer w.mu.Unlock()
	old := &Window{Window: w.Window.Rotate(), kernels: w.kernels, facts: w.facts, lost: w.lost}
	w.lost = Losses{}
	w.facts = newFacts()
	for i, f := range w.facts {
		if s, ok := f.(sizer); ok {
			s.sizeFrom(old.facts[i])
		}
	}
	return old
}

// factsOf is a gathering rule's facts in a closed window.
func factsOf[F Facts](w *Window, r Rule) F {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, g := range gatherers() {
		if g.Check() == r.Check() {
			return w.facts[i].(F)
		}
	}
	panic("judge: facts of a rule that gathers none: " + r.Check())
}
