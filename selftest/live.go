package selftest

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// liveLanes is how many lanes of each direction a live line names, the
// busiest first; the others are counted, so a line stays one line however
// many GPUs a second touched.
const liveLanes = 3

// liveLegend heads the live view: what its columns mean.
const liveLegend = `live, a line per second with records: copies the agent reported (failed calls and RDMA requests included);
GB/s of those copies per GPU link, in (to the GPU) and out, busiest first (a GPU by its reference name, pid N where the agent does not know the process's GPU);
rows the selftest finished (FAIL named) and the rules their windows raised at WARN or FAIL`

// liveView is `agent selftest --live`: instead of a line per copy, a line
// per second of what the agent reported in it, so a run fits a screen
// above its table. Its lanes are the agent's own (checks.Window.LinkBytes),
// its findings the rules the finished rows' windows raised (Result.Raised).
type liveView struct {
	out io.Writer
	// gpuName names a GPU's PCI address for the view (the reference GPU's
	// name); "" keeps the address.
	gpuName func(busID string, pid uint32) string

	mu     sync.Mutex
	win    *checks.Window // this second's records
	copies int
	failed int
	rows   []Result
	names  map[string]string // PCI address → name, as gpuName said when first seen
}

// liveSecond is what one second of the run saw, as its line shows it.
type liveSecond struct {
	At     time.Duration // since the run started, at the second's end
	Copies int           // records the agent reported
	Failed int           // of them, failed calls
	In     []laneRate    // GB/s into each GPU, busiest first
	Out    []laneRate    // out of each GPU
	Rows   int           // rows finished
	Fails  []string      // of them, the failed ones: "scenario/build"
	Rules  []string      // the rules those rows raised (each once, sorted)
	Raised int           // how many findings: rule/severity entries over the rows
}

// laneRate is one direction of one GPU link over a second.
type laneRate struct {
	GPU string
	GBs float64
}

func newLiveView(out io.Writer) *liveView {
	return &liveView{out: out, win: checks.NewWindow(), names: map[string]string{}, gpuName: refGPUName}
}

// refGPUName is the reference GPU with that PCI address, among those the
// process sees and the RDMA roles' (rdmapath names its GPU by its role,
// not in its environment); "" when none is (a process gone, an address
// not of one).
func refGPUName(busID string, pid uint32) string {
	names := refenv.GPUsOf("/proc", pid)
	for _, role := range rdmaRoles {
		names = append(names, refenv.RDMAGPU(role))
	}
	for _, n := range names {
		if refenv.BusID(n) == busID {
			return n
		}
	}
	return ""
}

// transfer counts a record the agent reported.
func (v *liveView) transfer(t *correlate.Transfer) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.copies++
	if t.Failed() {
		v.failed++
	}
	if _, ok := v.names[t.GPU]; t.GPU != "" && !ok { // once per GPU: its name does not change
		v.names[t.GPU] = v.gpuName(t.GPU, t.PID)
	}
	v.win.Transfer(t)
}

// row counts a row the selftest finished.
func (v *liveView) row(r Result) {
	v.mu.Lock()
	v.rows = append(v.rows, r)
	v.mu.Unlock()
}

// take hands over the second gathered so far, elapsed long, and starts
// the next one.
func (v *liveView) take(at, elapsed time.Duration) liveSecond {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := liveSecond{At: at, Copies: v.copies, Failed: v.failed, Rows: len(v.rows)}
	if elapsed <= 0 {
		elapsed = time.Second // a stop right on a tick: no time, and nothing in it
	}
	// A copy whose record names no GPU is on its process's: the selftest
	// gives every process its own GPU unless it names a shared one.
	place := func(pid uint32) checks.Placement { return checks.Placement{GPU: fmt.Sprintf("pid %d", pid)} }
	for k, b := range v.win.LinkBytes(place) {
		gpu := k[0]
		if n := v.names[gpu]; n != "" {
			gpu = n
		}
		r := laneRate{GPU: gpu, GBs: float64(b) / elapsed.Seconds() / 1e9}
		if k[1] == checks.Inbound {
			s.In = append(s.In, r)
		} else {
			s.Out = append(s.Out, r)
		}
	}
	for _, lanes := range [][]laneRate{s.In, s.Out} {
		slices.SortFunc(lanes, func(a, b laneRate) int { return cmp.Or(cmp.Compare(b.GBs, a.GBs), strings.Compare(a.GPU, b.GPU)) })
	}
	for _, r := range v.rows {
		if !r.OK() {
			s.Fails = append(s.Fails, r.Scenario+"/"+r.Runtime)
		}
		s.Raised += len(r.Raised)
		for _, verdict := range r.Raised {
			s.Rules = append(s.Rules, ruleOf(verdict))
		}
	}
	s.Rules = slices.Compact(slices.Sorted(slices.Values(s.Rules)))
	v.win, v.copies, v.failed, v.rows = checks.NewWindow(), 0, 0, nil
	return s
}

// line is a second as the live view prints it, "" for a second with
// nothing in it (the view stays bounded by the work, not the wall time):
//
//	3.0s    412 copies (2 failed)  in gpu-decode 3.98, pid 12786 2.01  out pid 12790 0.131  rows 3 (FAIL pageable-load/cet)  findings 1: pageable-copy
func (s liveSecond) line() string {
	if s.Copies == 0 && s.Rows == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%6.1fs %6d copies", s.At.Seconds(), s.Copies)
	if s.Failed > 0 {
		fmt.Fprintf(&b, " (%d failed)", s.Failed)
	}
	for _, d := range []struct {
		name  string
		lanes []laneRate
	}{{"in", s.In}, {"out", s.Out}} {
		if len(d.lanes) == 0 {
			continue
		}
		var named []string
		for _, l := range d.lanes[:min(len(d.lanes), liveLanes)] {
			named = append(named, l.GPU+" "+liveGBs(l.GBs))
		}
		if more := len(d.lanes) - liveLanes; more > 0 {
			named = append(named, fmt.Sprintf("+%d more", more))
		}
		fmt.Fprintf(&b, "  %s %s", d.name, strings.Join(named, ", "))
	}
	if s.Rows > 0 {
		fmt.Fprintf(&b, "  rows %d", s.Rows)
		if len(s.Fails) > 0 {
			fmt.Fprintf(&b, " (FAIL %s)", strings.Join(s.Fails, ", "))
		}
		if s.Raised > 0 {
			fmt.Fprintf(&b, "  findings %d: %s", s.Raised, strings.Join(s.Rules, ", "))
		}
	}
	return b.String()
}

// liveGBs is a rate in GB/s to three figures: a second's average of
// short bursts is often far below a lane's rate.
func liveGBs(gbs float64) string {
	if gbs < 0.001 {
		return "<0.001"
	}
	return fmt.Sprintf("%.3g", gbs)
}

// run prints the legend, then a line each second until stop is closed,
// then the last part second's; done is closed once it printed that.
func (v *liveView) run(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	fmt.Fprintln(v.out, liveLegend)
	start := time.Now()
	last := start
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		var now time.Time
		select {
		case now = <-tick.C:
		case <-stop:
			now = time.Now()
		}
		if l := v.take(now.Sub(start), now.Sub(last)).line(); l != "" {
			fmt.Fprintln(v.out, l)
		}
		last = now
		select {
		case <-stop:
			return
		default:
		}
	}
}
