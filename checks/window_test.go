package checks

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

// replay feeds a real recording (`agent run --record` of a reference
// scenario) through the engine into a diagnose sample, and returns the pid
// that made the transfers.
func replay(t *testing.T, path string) (*Window, uint32) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := NewWindow()
	e := correlate.NewEngine(correlate.Config{ExecObserved: true, Sink: s})
	var c event.Call
	for off := 0; off+probes.EventSize <= len(b); off += probes.EventSize {
		if err := probes.Decode(b[off:off+probes.EventSize], &c); err != nil {
			t.Fatalf("%s record %d: %v", path, off/probes.EventSize, err)
		}
		e.Handle(&c)
	}
	e.Flush()
	pids := s.PIDs()
	if len(pids) != 1 {
		t.Fatalf("%s: transfers from pids %v, want one scenario process", path, pids)
	}
	return s, pids[0]
}

func checkByName(t *testing.T, cs []Check, name string) Check {
	t.Helper()
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, cs)
	return Check{}
}

func TestSampleChecksOnRecordings(t *testing.T) {
	cases := []struct {
		file                         string
		pageable, fragments, overlap Status
	}{
		{"../correlate/testdata/hicache-load.events", Pass, Pass, Pass},
		{"testdata/events/pageable-load.events", Fail, Pass, Pass},
		{"testdata/events/fragmented-load.events", Pass, Warn, Pass},
		{"testdata/events/h2d-overlap.events", Pass, Pass, Warn},
		{"testdata/events/writeback-duplex.events", Pass, Pass, Pass}, // H2D with D2H: opposite directions
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			s, pid := replay(t, c.file)
			var r Report
			for _, ch := range windowChecks(s, "pid", pid) {
				r.Add(ch)
			}
			place := func(uint32) Placement { return Placement{GPU: "0000:17:00.0", InboundGBs: 4, OutboundGBs: 4} }
			for _, ch := range s.OverlapChecks(place, nil, 0) { // one per GPU link: the recording's one GPU
				r.Add(ch)
			}
			for name, want := range map[string]Status{"pageable copies": c.pageable, "fragmentation": c.fragments, "same-direction overlap": c.overlap} {
				if got := checkByName(t, r.Checks, name); got.Status != want {
					t.Errorf("%s: %s, want %s (%s)", name, got.Status, want, got.Detail)
				}
			}
			var text strings.Builder
			r.WriteText(&text)
			if c.pageable == Fail && !strings.Contains(text.String(), "pageable-copy (fail)") {
				t.Errorf("report does not name the pageable copies:\n%s", text.String())
			}
		})
	}
}

// A lane the counters saw nearly idle while a probed flow was in flight all
// window is reported, with the staging copy as the likelier bottleneck.
func TestLaneFactsUnderused(t *testing.T) {
	s := NewWindow()
	const sec = uint64(1e9)
	for i := uint64(0); i < 10; i++ { // ten pageable 1 MiB H2D copies back to back over 1 s
		s.Transfer(&correlate.Transfer{PID: 7, Direction: correlate.DirH2D, HostMem: event.MemPageable, Bytes: 1 << 20,
			SubmitNs: i * sec / 10, CompleteNs: (i + 1) * sec / 10})
	}
	f := s.LaneFacts("0000:17:00.0", Inbound, func(uint32) string { return "0000:17:00.0" }, time.Second)
	if f.BusyFraction < 0.99 || f.PageableCopies != 10 || f.All != 10 {
		t.Fatalf("facts %+v", f)
	}
	f.MeasuredBps, f.CapacityBps = 10.5e6, 4e9
	if fd := correlate.LinkUnderused(f); fd == nil || !strings.Contains(strings.Join(fd.Evidence, " "), "CPU staging copy") {
		t.Errorf("finding %+v", fd)
	}
	if g := s.LaneFacts("0000:18:00.0", Inbound, func(uint32) string { return "0000:17:00.0" }, time.Second); g.BusyFraction != 0 || g.All != 0 {
		t.Errorf("another GPU's lane: %+v", g)
	}
}

// Two short bursts at the start and the end of a window: the lane was busy
// a fifth of it, not all of it from the first copy to the last, so
// link-underused does not blame the host for an idle lane.
func TestLaneFactsBusyIsTimeInFlight(t *testing.T) {
	s := NewWindow()
	const sec = uint64(1e9)
	for _, at := range []uint64{0, 9 * sec / 10} {
		s.Transfer(&correlate.Transfer{PID: 7, Stream: 0x10, Direction: correlate.DirH2D, HostMem: event.MemPinned, Bytes: 1 << 20,
			SubmitNs: at, CompleteNs: at + sec/10})
	}
	f := s.LaneFacts("0000:17:00.0", Inbound, func(uint32) string { return "0000:17:00.0" }, time.Second)
	if f.BusyFraction < 0.19 || f.BusyFraction > 0.21 {
		t.Fatalf("busy %.2f of the window, want 0.20: %+v", f.BusyFraction, f)
	}
	f.MeasuredBps, f.CapacityBps = 20e6, 4e9
	if fd := correlate.LinkUnderused(f); fd != nil {
		t.Errorf("fired on a lane idle 80%% of the window: %+v", fd)
	}
}

// Transfers moved by SMs (KV-transfer kernels' launches, bytes and
// direction unknown) are counted per GPU and enter no copy statistic: 300
// of them with no bytes do not make a process's copies "fragmented", nor a
// process of their own.
func TestWindowSMTransfers(t *testing.T) {
	w := NewWindow()
	for i := range 300 {
		w.Transfer(&correlate.Transfer{PID: 9, Op: event.OpKernelCopy, Mover: correlate.MoverSM, Kernel: "transfer_kernel_impl",
			Direction: correlate.DirUnknown, BytesUnknown: true, GPU: "0000:3b:00.0", SubmitNs: uint64(i), BatchIndex: -1})
	}
	w.Transfer(&correlate.Transfer{PID: 9, Op: event.OpKernelCopy, Mover: correlate.MoverSM, Direction: correlate.DirUnknown, BytesUnknown: true})
	w.Transfer(&correlate.Transfer{PID: 9, Op: event.OpKernelCopy, Mover: correlate.MoverSM, Direction: correlate.DirUnknown,
		BytesUnknown: true, GPU: "0000:3b:00.0", Error: &correlate.CallError{Code: 100}}) // failed: moved nothing
	if got := w.SMTransfers(); len(got) != 2 || got["0000:3b:00.0"] != 300 || got[""] != 1 {
		t.Errorf("SMTransfers = %v", got)
	}
	if pids := w.PIDs(); len(pids) != 0 {
		t.Errorf("kernel launches made copy statistics for %v", pids)
	}
	for _, c := range windowChecks(w, "pid 9", 9) {
		if c.Status == Warn || c.Status == Fail {
			t.Errorf("%s: %s on kernel launches", c.Name, c.Status)
		}
	}
}

// Rotate hands the SM transfers to the closed window and starts from none.
func TestWindowRotateSMTransfers(t *testing.T) {
	w := NewWindow()
	w.Transfer(&correlate.Transfer{Op: event.OpKernelCopy, Mover: correlate.MoverSM, GPU: "0000:3b:00.0", BytesUnknown: true})
	old := w.Rotate()
	if got := old.SMTransfers(); got["0000:3b:00.0"] != 1 {
		t.Errorf("closed window: %v", got)
	}
	if got := w.SMTransfers(); len(got) != 0 {
		t.Errorf("new window: %v", got)
	}
}

// An `.item()` reads one element into pageable memory: a synchronisation
// (host-sync-in-loop judges it), not a staging cost. Element-sized copies
// never make a pageable-copy finding; one real pageable copy beside them
// still does.
func TestPageableLeavesElementReadsOut(t *testing.T) {
	item := func(w *Window, n int) {
		for i := range n {
			w.Transfer(&correlate.Transfer{PID: 7, API: "cudaMemcpy", Direction: correlate.DirD2H, HostMem: event.MemPageable,
				Bytes: 4, SubmitNs: uint64(i+1) * 1000, CompleteNs: uint64(i+1)*1000 + 500})
		}
	}
	pageable := func(w *Window) Check {
		for _, c := range windowChecks(w, "pid 7", 7) {
			if c.Name == CheckPageable {
				return c
			}
		}
		t.Fatal("no pageable check")
		return Check{}
	}

	w := NewWindow()
	item(w, 8)
	if c := pageable(w); len(c.Findings) != 0 || !strings.Contains(c.Detail, "8 element-sized copies") {
		t.Errorf("8 element reads: %s %q %v", c.Status, c.Detail, c.Findings)
	}

	w = NewWindow()
	item(w, 8)
	w.Transfer(&correlate.Transfer{PID: 7, API: "cudaMemcpy", Direction: correlate.DirH2D, HostMem: event.MemPageable,
		Bytes: 16 << 20, SubmitNs: 20000, CompleteNs: 90000})
	if c := pageable(w); len(c.Findings) != 1 || !strings.Contains(c.Findings[0].Summary, "1 copies (16 MiB, 100% of the host↔GPU bytes)") {
		t.Errorf("a 16 MiB pageable copy beside 8 element reads: %s %q %+v", c.Status, c.Detail, c.Findings)
	}
}

// A decode loop's per-step inputs (4 pageable H2D copies of 64-512 B) beside
// pinned layered loads are INFO with their count, never FAIL or WARN; the
// same loads from pageable memory FAIL (issue 20).
func TestPageableByBytes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pool   event.MemKind
		status Status
		sev    correlate.Severity
	}{
		{"metadata beside pinned loads", event.MemPinned, Info, correlate.SevInfo},
		{"metadata beside pageable loads", event.MemPageable, Fail, correlate.SevFail},
	} {
		w := NewWindow()
		at := uint64(1000)
		for step := range 60 {
			for _, b := range []uint64{64, 192, 384, 512} {
				w.Transfer(&correlate.Transfer{PID: 7, API: "cudaMemcpyAsync", Direction: correlate.DirH2D, HostMem: event.MemPageable,
					Bytes: b, SubmitNs: at, CompleteNs: at + 1000})
				at += 10
			}
			if step%20 == 0 {
				for range 16 {
					w.Transfer(&correlate.Transfer{PID: 7, API: "cudaMemcpyAsync", Direction: correlate.DirH2D, HostMem: tc.pool,
						Bytes: 4 << 20, SubmitNs: at, CompleteNs: at + 1000})
				}
			}
			at += 1000
		}
		var c *Check
		for _, x := range windowChecks(w, "pid 7", 7) {
			if x.Name == CheckPageable {
				c = &x
			}
		}
		if c == nil || c.Status != tc.status || len(c.Findings) != 1 || c.Findings[0].Severity != tc.sev ||
			!strings.Contains(c.Detail, "240 metadata-sized") {
			t.Errorf("%s: %+v", tc.name, c)
		}
	}
}

// windowChecks is one process's pageable and fragmentation checks.
func windowChecks(w *Window, scope string, pid uint32) []Check {
	return []Check{w.PageableCheck(scope, pid), w.FragmentationCheck(scope, pid)}
}
