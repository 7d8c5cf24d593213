package checks

import (
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

const (
	ms    = uint64(1e6)
	ovMiB = uint64(1 << 20)
	gpuA  = "0000:17:00.0"
	gpuB  = "0000:18:00.0"
)

// load adds n copies of one stream, each submitted when the previous one
// was proven done, from start, each taking each ns (end 0: never proven).
func load(w *Window, pid uint32, stream uint64, gpu, dir string, n int, bytes, start, each uint64, proven bool) uint64 {
	for i := range n {
		s := start + uint64(i)*each
		t := &correlate.Transfer{PID: pid, Stream: stream, GPU: gpu, Op: event.OpCopy, Direction: dir, Bytes: bytes,
			HostMem: event.MemPinned, SubmitNs: s}
		if proven { // each waited for right after it
			t.CompleteNs, t.CompleteNear = s+each, true
		}
		w.Transfer(t)
	}
	return start + uint64(n)*each
}

func placeAll(gpu string) func(uint32) Placement {
	return func(uint32) Placement { return Placement{GPU: gpu, InboundGBs: 4, OutboundGBs: 4} }
}

func overlapFindings(cs []Check) (subjects []string, text string) {
	var parts []string
	for _, c := range cs {
		parts = append(parts, c.Scope+": "+c.Detail)
		for _, f := range c.Findings {
			subjects = append(subjects, f.Subject)
			parts = append(parts, f.Summary+"; "+strings.Join(f.Evidence, "; "))
		}
	}
	return subjects, strings.Join(parts, " | ")
}

// The shapes of issue 11 through the window, on 4 GB/s lanes (1 MiB takes
// 0.25 ms alone, 0.5 ms while another flow shares the lane).
func TestOverlapChecksShapes(t *testing.T) {
	cases := []struct {
		name  string
		fill  func(w *Window)
		place func(uint32) Placement
		want  []string // subjects of the findings
		text  string
	}{
		{"two processes saturating one lane", func(w *Window) {
			load(w, 1, 0xa, "", correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
			load(w, 2, 0xa, "", correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
		}, placeAll(gpuA), []string{"PCIe link of GPU " + gpuA}, "pid 2 stream 0xa H2D: 64 MiB"},
		{"two streams of one process", func(w *Window) {
			load(w, 1, 0xa, "", correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
			load(w, 1, 0xb, "", correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
		}, placeAll(gpuA), []string{"PCIe link of GPU " + gpuA}, "pid 1 stream 0xb H2D"},
		// The copies name their GPU: two processes the heuristic places on
		// different GPUs load the same one, and are judged together there.
		{"copies name their GPU", func(w *Window) {
			load(w, 1, 0xa, gpuB, correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
			load(w, 2, 0xa, gpuB, correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
		}, func(pid uint32) Placement {
			return Placement{GPU: map[uint32]string{1: gpuA, 2: gpuB}[pid], InboundGBs: 4, OutboundGBs: 4}
		}, []string{"PCIe link of GPU " + gpuB}, "2 flows"},
		{"opposite directions", func(w *Window) {
			load(w, 1, 0xa, "", correlate.DirH2D, 64, ovMiB, 0, ms/4, true)
			load(w, 1, 0xb, "", correlate.DirD2H, 64, ovMiB, 0, ms/4, true)
		}, placeAll(gpuA), nil, "inbound: 1 flows"},
		{"two flows never in flight together", func(w *Window) {
			at := uint64(0)
			for phase := range 4 {
				at = load(w, 1, uint64(0xa+phase%2), "", correlate.DirH2D, 16, ovMiB, at, ms/4, true) + ms
			}
		}, placeAll(gpuA), nil, "never two at once"},
		{"a big flow and a trickle of 4 KiB copies", func(w *Window) {
			load(w, 1, 0xa, "", correlate.DirH2D, 64, ovMiB, 0, ms/4, true)
			for k := range 4 {
				load(w, 1, 0xb, "", correlate.DirH2D, 1, 4096, ms+uint64(k)*ms, ms/10, true)
			}
		}, placeAll(gpuA), nil, "never two at once"},
		{"copies without a proven completion", func(w *Window) {
			load(w, 1, 0xa, "", correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
			load(w, 1, 0xb, "", correlate.DirH2D, 64, ovMiB, 0, ms/2, false)
		}, placeAll(gpuA), nil, "64 transfers (64 MiB) without a proven completion not placed in time"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := NewWindow()
			c.fill(w)
			got, text := overlapFindings(w.OverlapChecks(c.place, nil, 0))
			if strings.Join(got, ",") != strings.Join(c.want, ",") || !strings.Contains(text, c.text) {
				t.Errorf("findings %v, want %v with %q: %s", got, c.want, c.text, text)
			}
		})
	}
}

// seed 000 L2→L1 #5: a PD receive written into the decode process's GPU
// memory lands on its inbound lane while it loads from its host pool. The
// writer is another process; the lane is the owner's.
func TestOverlapChecksRDMAIntoPeerGPU(t *testing.T) {
	const prefill, decode = 10, 20
	w := NewWindow()
	load(w, decode, 0xa, "", correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
	for i := range uint64(64) {
		w.Transfer(&correlate.Transfer{PID: prefill, PeerPID: decode, QPNum: 7, WRID: i, Op: event.OpPostSend,
			Direction: correlate.DirWriteImm, Bytes: ovMiB, Src: correlate.Side{Mem: event.MemPinned},
			Dst: correlate.Side{Mem: event.MemDevice}, Status: "success", SubmitNs: i * ms / 2, CompleteNs: (i + 1) * ms / 2})
	}
	place := func(pid uint32) Placement {
		return Placement{GPU: map[uint32]string{prefill: gpuB, decode: gpuA}[pid], InboundGBs: 4, OutboundGBs: 4}
	}
	got, text := overlapFindings(w.OverlapChecks(place, nil, 0))
	if strings.Join(got, ",") != "PCIe link of GPU "+gpuA || !strings.Contains(text, "pid 10 QP 7 WRITE_IMM: 64 MiB") ||
		!strings.Contains(text, "pid 20 stream 0xa H2D: 64 MiB") {
		t.Errorf("findings %v: %s", got, text)
	}
	// The same request from a GPU to a GPU also leaves the writer's GPU:
	// outbound there, alone.
	w = NewWindow()
	w.Transfer(&correlate.Transfer{PID: prefill, PeerPID: decode, QPNum: 7, Op: event.OpPostSend, Direction: correlate.DirWriteImm,
		Bytes: ovMiB, Src: correlate.Side{Mem: event.MemDevice}, Dst: correlate.Side{Mem: event.MemDevice}, Status: "success",
		SubmitNs: 1, CompleteNs: ms})
	links, _ := w.LinkOverlaps(place, nil, 0)
	var lanes []string
	for _, l := range links {
		lanes = append(lanes, l.GPU+" "+l.Direction)
	}
	if strings.Join(lanes, ",") != gpuA+" inbound,"+gpuB+" outbound" {
		t.Errorf("a GPU-to-GPU write crosses %v", lanes)
	}
}

// seed 000 L2→L1 #5 with the decode side pulling through UCX (NIXL's
// default: ucp_get_nbx on rc_mlx5, no verbs work request): the gets into
// its GPU memory share the inbound lane with its host-pool loads. Only the
// transfers no other record shows are placed (correlate.OnGPULinkOnlyHere):
// rc_verbs posts work requests, cuda_ipc and tcp's staging are CUDA
// copies, posix crosses no GPU link.
func TestOverlapChecksTransferLibrary(t *testing.T) {
	const decode = 20
	get := func(w *Window, transport string, dst event.MemKind, gpu string) {
		for i := range uint64(64) {
			w.Transfer(&correlate.Transfer{PID: decode, API: "ucp_get_nbx", Op: event.OpXferGet, Direction: correlate.DirRDMARead, Bytes: ovMiB,
				Src: correlate.Side{Mem: event.MemUnknown}, Dst: correlate.Side{Mem: dst}, GPU: gpu, Transport: transport, NetDevice: "mlx5_0:1",
				Endpoint: 0x5555, SubmitNs: i * ms / 2, CompleteNs: (i + 1) * ms / 2, LatencyNs: ms / 2})
		}
	}
	w := NewWindow()
	load(w, decode, 0xa, "", correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
	get(w, "rc_mlx5", event.MemDevice, gpuA)
	got, text := overlapFindings(w.OverlapChecks(placeAll(gpuA), nil, 0))
	if strings.Join(got, ",") != "PCIe link of GPU "+gpuA || !strings.Contains(text, "pid 20 endpoint 0x5555 RDMA_READ: 64 MiB") {
		t.Errorf("findings %v: %s", got, text)
	}
	if b := w.LinkBytes(placeAll(gpuA)); b[[2]string{gpuA, Inbound}] != 128*ovMiB || w.LaneBytes(decode, Inbound) != 128*ovMiB {
		t.Errorf("inbound bytes %v, lane bytes %d", b, w.LaneBytes(decode, Inbound))
	}
	for _, other := range []struct {
		transport string
		dst       event.MemKind
	}{{"rc_verbs", event.MemDevice}, {"tcp", event.MemDevice}, {"cuda_ipc", event.MemDevice}, {"posix", event.MemPinned}, {"", event.MemDevice},
		{"rc_mlx5", event.MemPinned}} {
		w := NewWindow()
		load(w, decode, 0xa, "", correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
		get(w, other.transport, other.dst, gpuA)
		if got, text := overlapFindings(w.OverlapChecks(placeAll(gpuA), nil, 0)); len(got) != 0 || w.LinkBytes(placeAll(gpuA))[[2]string{gpuA, Inbound}] != 64*ovMiB {
			t.Errorf("%s into %s memory placed on the lane: %v %s", other.transport, other.dst, got, text)
		}
		if pids := w.PIDs(); len(pids) != 1 { // the loads' process, not counted as its copies
			t.Errorf("%s: pids %v", other.transport, pids)
		}
	}
	// From host memory an mlx5 transfer is on no GPU link: its in-flight
	// is still measured, with the words of a library's transfers.
	w = NewWindow()
	get(w, "rc_mlx5", event.MemPinned, "")
	r := w.InFlights(placeAll(gpuA), nil, 0)
	if len(r.Flows) != 1 || r.Flows[0].Direction != "" || !r.Flows[0].InFlight.Xfer || r.Flows[0].InFlight.Ops != 64 || r.Flows[0].Skip == "" {
		t.Errorf("flows %+v", r.Flows)
	}
}

// A process whose GPU is unknown gets a SKIP with the reason; the links
// that are known are still judged.
func TestOverlapChecksUnknownGPU(t *testing.T) {
	w := NewWindow()
	load(w, 1, 0xa, "", correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
	load(w, 1, 0xb, "", correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
	load(w, 2, 0xa, "", correlate.DirH2D, 4, ovMiB, 0, ms/2, true)
	place := func(pid uint32) Placement {
		if pid == 2 {
			return Placement{Why: "GPU of pid 2 unknown: no GPU in /fixture/sys"}
		}
		return Placement{GPU: gpuA, InboundGBs: 4, OutboundGBs: 4}
	}
	cs := w.OverlapChecks(place, nil, 0)
	if len(cs) != 2 || cs[0].Scope != "GPU "+gpuA || len(cs[0].Findings) != 1 ||
		cs[1].Scope != "pid 2" || cs[1].Status != Skip || cs[1].Detail != "GPU of pid 2 unknown: no GPU in /fixture/sys" {
		t.Errorf("checks %+v", cs)
	}
}

// A link only the copies name (no placed process is on it) takes its
// capacity from the capacity function; without one it is unknown and
// nothing fires.
func TestOverlapChecksCapacityOfANamedLink(t *testing.T) {
	w := NewWindow()
	load(w, 1, 0xa, gpuB, correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
	load(w, 1, 0xb, gpuB, correlate.DirH2D, 64, ovMiB, 0, ms/2, true)
	if got, text := overlapFindings(w.OverlapChecks(placeAll(gpuA), nil, 0)); len(got) != 0 || !strings.Contains(text, "capacity unknown") {
		t.Errorf("no capacity known: %v %s", got, text)
	}
	capacity := func(gpu string) float64 {
		if gpu == gpuB {
			return 4
		}
		return 0
	}
	if got, _ := overlapFindings(w.OverlapChecks(placeAll(gpuA), capacity, 0)); strings.Join(got, ",") != "PCIe link of GPU "+gpuB {
		t.Errorf("with the link's capacity: %v", got)
	}
}

// With GPU counter samples, the demand is what they measured while the
// flows contended: flows whose completions were proven late look far below
// the lane by the probes alone. Samples belong to the window they were
// added to.
func TestOverlapChecksCounters(t *testing.T) {
	w := NewWindow()
	// Two flows in flight together from 10 to 50 ms, proven done only at
	// 50 ms: by the probes, 2 x 32 MiB in 40 ms, 1.68 GB/s.
	load(w, 1, 0xa, "", correlate.DirH2D, 1, 32*ovMiB, 10*ms, 40*ms, true)
	load(w, 2, 0xa, "", correlate.DirH2D, 1, 32*ovMiB, 10*ms, 40*ms, true)
	if got, _ := overlapFindings(w.OverlapChecks(placeAll(gpuA), nil, time.Second)); len(got) != 0 {
		t.Fatalf("probes alone: %v", got)
	}
	for i := range uint64(10) { // 10 ms samples; the lane was full while they contended
		bps := 0.0
		if i >= 1 && i < 5 {
			bps = 3.9e9
		}
		w.AddCounterSample(gpuA, Inbound, i*10*ms, (i+1)*10*ms, bps)
		w.AddCounterSample(gpuA, Outbound, i*10*ms, (i+1)*10*ms, 0)
	}
	old := w.Rotate()
	got, text := overlapFindings(old.OverlapChecks(placeAll(gpuA), nil, time.Second))
	if strings.Join(got, ",") != "PCIe link of GPU "+gpuA || !strings.Contains(text, "3.90 GB/s against 4.00 GB/s capacity (from the GPU's PCIe counters") {
		t.Errorf("with counters: %v %s", got, text)
	}
	if got, _ := overlapFindings(w.OverlapChecks(placeAll(gpuA), nil, time.Second)); len(got) != 0 {
		t.Errorf("the next window fired on nothing: %v", got)
	}
}
