package checks

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// Placement is the GPU a process feeds and that GPU link's per-direction
// capacity in GB/s (0: unknown). GPU "" means the GPU is unknown; Why says
// how it was chosen, or why it is unknown, for the check's detail.
type Placement struct {
	GPU                     string // PCI address
	InboundGBs, OutboundGBs float64
	Why                     string
}

// Lanes of a GPU link: inbound is toward the GPU (H2D, RDMA into GPU
// memory), outbound away from it.
const (
	Inbound  = "inbound"
	Outbound = "outbound"
)

// Window collects the transfers of an interval and judges them per
// process: pageable copies, fragmentation, same-direction overlap. It is a
// correlate.Sink.
type Window struct {
	mu    sync.Mutex
	procs map[uint32]*procWindow
	rdmas []correlate.Transfer // completed work requests, for latency trends (bounded)
	// links are the flows on each direction of each GPU link, every
	// process's, for the overlap rule (overlap.go); linkSpans counts their
	// intervals against maxLinkSpans.
	links     map[linkFlowKey]*linkFlow
	linkSpans int
	// counters are the GPU counters' samples per lane ({gpu, dir}).
	counters map[[2]string][]correlate.CounterSample
	// sm counts the transfers moved by SMs (KV-transfer kernels' launches)
	// per GPU ("" unknown): no copy statistic, flow or rule takes them,
	// their bytes and direction being unknown (docs/design.md, "Kernel
	// movers").
	sm map[string]int
	// peers are the peer copies' bytes per {source GPU, destination GPU}:
	// which path they took is the topology's to say (PeerBytes).
	peers map[[2]string]uint64
	// inflight is every flow's operations, one by one (inflight.go).
	inflight inflightWindow
	// last is the tallies of the latest host<->device copy's flow: copies
	// come in bursts on one stream, and each then finds its tallies
	// without hashing six keys.
	last copyTallies
}

// copyTallies are where a host<->device copy of one flow (process, stream,
// direction, GPU) is counted in a window; nil where a bound kept one out.
type copyTallies struct {
	pid       uint32
	stream    uint64
	direction string
	gpu       string
	proc      *procWindow
	dir       *dirStats
	pages     *pageTally
	link      *linkFlow
	inflight  *[]correlate.Span
	flow      *busy
}

// tallies finds the tallies of copy t, an H2D or D2H one. Called with
// w.mu held.
func (w *Window) tallies(t *correlate.Transfer) *copyTallies {
	c := &w.last
	if c.proc != nil && c.pid == t.PID && c.stream == t.Stream && c.direction == t.Direction && c.gpu == t.GPU {
		return c
	}
	lane := Inbound
	if t.Direction == correlate.DirD2H {
		lane = Outbound
	}
	p := w.proc(t.PID)
	*c = copyTallies{pid: t.PID, stream: t.Stream, direction: t.Direction, gpu: t.GPU, proc: p, dir: p.dirStats(t.Direction), pages: p.pageTally(t.GPU)}
	k := linkFlowKey{gpu: t.GPU, owner: t.PID, pid: t.PID, id: t.Stream, kind: t.Direction, dir: lane}
	c.link = w.linkFlow(k)
	if w.inflight.ops < maxInflightOps { // past it, no flow is created (addInflight)
		c.inflight = w.inflightOps(k)
	}
	fk := flowKey{pid: t.PID, stream: t.Stream, kind: t.Direction, dir: lane}
	if c.flow = p.flows[fk]; c.flow == nil {
		c.flow = &busy{start: t.SubmitNs}
		p.flows[fk] = c.flow
	}
	return c
}

// maxRDMAKept bounds the work requests a window keeps for latency.
const maxRDMAKept = 1 << 16

type procWindow struct {
	transfers int
	bytes     uint64
	hostBytes uint64 // H2D and D2H: what pageable copies are a share of
	// pageable counts the pageable copies of 64 KiB or more,
	// pageableMetadata the smaller ones (correlate.PageableFacts).
	pageable, pageableMetadata           int
	pageableBytes, pageableMetadataBytes uint64
	pageableAPIs                         []string
	// pageableElements are element-sized copies (.item()) from or to
	// pageable memory: a synchronisation, judged by host-sync-in-loop, not
	// a staging cost worth a pageable-copy finding.
	pageableElements int
	unknown          int
	dirs             map[string]*dirStats // per direction: fragmentation is judged in each on its own
	first, last      uint64               // earliest submission, latest completion (ns)
	flows            map[flowKey]*busy    // flows on this process's GPU link, its own and its peers'

	pages map[string]*pageTally // H2D and D2H bytes by GPU and node of the host pages (pages.go)
}

// dirStats are one direction's copies in a window: their sizes and the
// span they took, for that direction's achieved rate.
type dirStats struct {
	sizes       correlate.SizeHistogram
	bytes       uint64
	first, last uint64
}

// add counts one copy of the direction.
func (d *dirStats) add(bytes, submit, end uint64) {
	d.sizes.Add(bytes)
	d.bytes += bytes
	if d.first == 0 || submit < d.first {
		d.first = submit
	}
	d.last = max(d.last, end)
}

// rate is the direction's achieved rate in GB/s (bytes per ns) over the
// span from its first submission to its last completion.
func (d *dirStats) rate() float64 {
	if d.last <= d.first {
		return 0
	}
	return float64(d.bytes) / float64(d.last-d.first)
}

// flowKey is one flow on one lane of a GPU's link: a CUDA stream's copies
// (one after another, so only different flows can overlap) or an RDMA queue
// pair's requests.
type flowKey struct {
	pid    uint32
	stream uint64 // CUDA stream handle, the QP number for RDMA, the endpoint for a transfer library
	rdma   bool
	xfer   bool
	kind   string // H2D, D2H, RDMA_WRITE, …
	dir    string // the GPU link's lane: Inbound or Outbound
}

// busy is the interval a flow was moving bytes.
type busy struct {
	start, end uint64
	bytes      uint64
}

// NewWindow returns an empty window.
func NewWindow() *Window { return &Window{procs: map[uint32]*procWindow{}} }

func (w *Window) proc(pid uint32) *procWindow {
	p := w.procs[pid]
	if p == nil {
		p = &procWindow{flows: map[flowKey]*busy{}, dirs: map[string]*dirStats{}}
		w.procs[pid] = p
	}
	return p
}

// Transfer implements correlate.Sink.
func (w *Window) Transfer(t *correlate.Transfer) {
	if t.Failed() {
		return // a failed call moved nothing: no rule, no lane judges it
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if t.Mover == correlate.MoverSM {
		if w.sm == nil {
			w.sm = map[string]int{}
		}
		w.sm[t.GPU]++
		return
	}
	if t.Op.IsXfer() {
		w.xfer(t) // a transfer library's: neither a CUDA copy nor a verbs work request
		return
	}
	if t.QPNum != 0 || t.Op == event.OpPostSend || t.Op == event.OpPostRecv {
		w.rdma(t)
		return
	}
	var c *copyTallies
	var p *procWindow
	if t.Direction == correlate.DirH2D || t.Direction == correlate.DirD2H {
		c = w.tallies(t)
		p = c.proc
		p.hostBytes += t.Bytes
		c.pages.add(t)
	} else {
		p = w.proc(t.PID)
	}
	p.transfers++
	p.bytes += t.Bytes
	switch t.HostMem {
	case event.MemPageable:
		if correlate.ElementSized(t.Bytes) {
			p.pageableElements++
			break
		}
		if correlate.MetadataSized(t.Bytes) {
			p.pageableMetadata++
			p.pageableMetadataBytes += t.Bytes
		} else {
			p.pageable++
			p.pageableBytes += t.Bytes
		}
		if len(p.pageableAPIs) < 16 {
			p.pageableAPIs = append(p.pageableAPIs, t.API)
		}
	case event.MemUnknown:
		p.unknown++
	}
	end := t.CompleteNs
	if end == 0 {
		end = t.SubmitNs
	}
	if p.first == 0 || t.SubmitNs < p.first {
		p.first = t.SubmitNs
	}
	p.last = max(p.last, end)
	w.linkPeer(t)
	if c == nil {
		p.dirStats(t.Direction).add(t.Bytes, t.SubmitNs, end)
		return
	}
	c.dir.add(t.Bytes, t.SubmitNs, end)
	// On its GPU's link: the GPU the copy names, else the submitting
	// process's (at judgement). A copy's latency is its own only when its
	// wait followed it closely.
	if c.inflight != nil {
		w.addInflightTo(c.inflight, t.SubmitNs, t.CompleteNs, t.Bytes, !t.CompleteNear)
	} else {
		w.inflight.dropped++
	}
	w.addLinkTo(c.link, t.SubmitNs, t.CompleteNs, t.Bytes)
	c.flow.add(t.SubmitNs, end, t.Bytes)
}

// rdma places an RDMA request on the GPU link it crosses: data written
// into a peer's GPU memory is inbound there; read into or received by this
// process's GPU memory is inbound here; written or sent from it, outbound.
func (w *Window) rdma(t *correlate.Transfer) {
	if t.CompleteNs == 0 || t.Status == "success" { // a failed request moved an unknown part of its bytes
		w.linkRDMA(t)
	}
	if t.CompleteNs == 0 || t.Status != "success" {
		return
	}
	if len(w.rdmas) < maxRDMAKept {
		w.rdmas = append(w.rdmas, *t)
	}
	k := flowKey{pid: t.PID, stream: uint64(t.QPNum), rdma: true, kind: t.Direction}
	owner := uint32(0)
	switch {
	case t.Dst.Mem == event.MemDevice && (t.Direction == correlate.DirRDMAWrite || t.Direction == correlate.DirWriteImm):
		owner, k.dir = t.PeerPID, Inbound
	case t.Dst.Mem == event.MemDevice: // READ or RECV into this process's GPU
		owner, k.dir = t.PID, Inbound
	case t.Src.Mem == event.MemDevice:
		owner, k.dir = t.PID, Outbound
	}
	if owner == 0 {
		return
	}
	w.proc(owner).addFlow(k, t.SubmitNs, t.CompleteNs, t.Bytes)
}

// xfer places a transfer library's transfer as rdma places a work
// request, where its record is the only one of the bytes
// (correlate.OnGPULinkOnlyHere): on the GPU link of its local buffer when
// that is GPU memory, one flow per endpoint and kind; from host memory on
// no GPU link, its in-flight still measured. A record without a
// completion is kept untimed.
func (w *Window) xfer(t *correlate.Transfer) {
	if !correlate.OnGPULinkOnlyHere(t) {
		return
	}
	k := linkFlowKey{owner: t.PID, pid: t.PID, id: t.Endpoint, xfer: true, kind: t.Direction}
	lanes := rdmaLanes(t) // the local buffer's lane only: a library's record names no peer process
	if len(lanes) == 0 {
		w.addInflight(k, t.SubmitNs, t.CompleteNs, t.Bytes, false)
		return
	}
	k.gpu, k.dir = t.GPU, lanes[0].dir
	w.addLink(k, t.SubmitNs, t.CompleteNs, t.Bytes, false) // its completion is its own request's
	if t.CompleteNs != 0 {
		w.proc(t.PID).addFlow(flowKey{pid: t.PID, stream: t.Endpoint, xfer: true, kind: t.Direction, dir: k.dir}, t.SubmitNs, t.CompleteNs, t.Bytes)
	}
}

func (p *procWindow) addFlow(k flowKey, start, end, bytes uint64) {
	b := p.flows[k]
	if b == nil {
		p.flows[k] = &busy{start: start, end: end, bytes: bytes}
		return
	}
	b.add(start, end, bytes)
}

func (b *busy) add(start, end, bytes uint64) {
	b.start, b.end, b.bytes = min(b.start, start), max(b.end, end), b.bytes+bytes
}

// dirStats is the direction's statistics, created empty.
func (p *procWindow) dirStats(direction string) *dirStats {
	d := p.dirs[direction]
	if d == nil {
		d = &dirStats{}
		p.dirs[direction] = d
	}
	return d
}

// PIDs lists the processes that transferred during the window.
func (w *Window) PIDs() []uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []uint32
	for pid := range w.procs {
		out = append(out, pid)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// RDMAs returns the completed work requests the window kept.
func (w *Window) RDMAs() []correlate.Transfer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]correlate.Transfer(nil), w.rdmas...)
}

// Rotate hands back the window collected so far and starts a new one in w.
func (w *Window) Rotate() *Window {
	w.mu.Lock()
	defer w.mu.Unlock()
	old := &Window{procs: w.procs, rdmas: w.rdmas, links: w.links, linkSpans: w.linkSpans, counters: w.counters, sm: w.sm, peers: w.peers}
	w.procs, w.rdmas, w.links, w.linkSpans, w.counters, w.sm, w.peers = map[uint32]*procWindow{}, nil, nil, 0, nil, nil, nil
	old.inflight, w.inflight = w.inflight, inflightWindow{}
	w.inflight.sizeFrom(&old.inflight)
	w.last = copyTallies{}
	return old
}

// SMTransfers counts the window's transfers moved by SMs per GPU (""
// unknown).
func (w *Window) SMTransfers() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.sm))
	for gpu, n := range w.sm {
		out[gpu] = n
	}
	return out
}

// LaneBytes is what moved over one lane of the process's GPU link during
// the window: its own copies and the RDMA requests placed on it.
func (w *Window) LaneBytes(pid uint32, dir string) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.procs[pid]
	if p == nil {
		return 0
	}
	var n uint64
	for k, b := range p.flows {
		if k.dir == dir {
			n += b.bytes
		}
	}
	return n
}

// LaneFacts gathers what the probes saw on one lane of one GPU during the
// window: how much of it a transfer was in flight (the union of the real
// in-flight spans of every flow on that lane, every process's, as the
// overlap rule keeps them), pageable and small copies.
func (w *Window) LaneFacts(gpu, dir string, gpuOf func(uint32) string, span time.Duration) correlate.LaneFacts {
	w.mu.Lock()
	defer w.mu.Unlock()
	f := correlate.LaneFacts{GPU: gpu, Direction: dir}
	var iv [][2]uint64
	for pid, p := range w.procs {
		if gpuOf(pid) != gpu {
			continue
		}
		f.PageableCopies += p.pageable
		if d := p.dirs[laneCopies[dir]]; d != nil { // the copies of this lane's direction only
			f.SmallCopies += d.sizes.CountBelow(64 << 10)
			f.All += d.sizes.Count()
		}
	}
	for k, lf := range w.links {
		g := k.gpu
		if g == "" {
			g = gpuOf(k.owner)
		}
		if g != gpu || k.dir != dir {
			continue
		}
		for _, sp := range lf.Spans {
			if sp.End > sp.Start {
				iv = append(iv, [2]uint64{sp.Start, sp.End})
			}
		}
	}
	sort.Slice(iv, func(i, j int) bool { return iv[i][0] < iv[j][0] })
	var total, curS, curE uint64
	for i, x := range iv {
		switch {
		case i == 0:
			curS, curE = x[0], x[1]
		case x[0] > curE:
			total += curE - curS
			curS, curE = x[0], x[1]
		default:
			curE = max(curE, x[1])
		}
	}
	if len(iv) > 0 {
		total += curE - curS
	}
	f.BusyFraction = min(1, float64(total)/float64(span.Nanoseconds()))
	return f
}

// laneCopies is the copy direction that crosses each lane of a GPU link.
var laneCopies = map[string]string{Inbound: correlate.DirH2D, Outbound: correlate.DirD2H}

// Check names of the window judgement.
const (
	CheckPageable      = "pageable copies"
	CheckFragmentation = "fragmentation"
	CheckOverlap       = "same-direction overlap"
)

// PageableCheck judges one process's window for pageable copies.
func (w *Window) PageableCheck(scope string, pid uint32) Check {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.procs[pid]
	if p == nil {
		return Skipped(scope, CheckPageable, "no transfer seen in the sample window")
	}
	c := Check{Scope: scope, Name: CheckPageable, Status: Pass,
		Detail: fmt.Sprintf("%d transfers, none from pageable memory", p.transfers)}
	if f := correlate.PageableCopies(correlate.PageableFacts{PID: pid, Bulk: p.pageable, Metadata: p.pageableMetadata,
		BulkBytes: p.pageableBytes, MetadataBytes: p.pageableMetadataBytes, HostBytes: p.hostBytes, APIs: p.pageableAPIs}); f != nil {
		c.Detail = fmt.Sprintf("%d of %d transfers used pageable host memory (%d metadata-sized, under 64 KiB)",
			p.pageable+p.pageableMetadata, p.transfers, p.pageableMetadata)
		c.Findings = []correlate.Finding{*f}
		c.Status = map[correlate.Severity]Status{correlate.SevFail: Fail, correlate.SevWarn: Warn, correlate.SevInfo: Info}[f.Severity]
	} else if p.unknown > 0 {
		c.Detail += fmt.Sprintf(" (%d from memory registered before lanewatch attached: unknown)", p.unknown)
	}
	if p.pageableElements > 0 {
		c.Detail += fmt.Sprintf("; %d element-sized copies (.item()-style) with pageable memory not counted: a synchronisation, see %q", p.pageableElements, CheckComputeOverlap)
	}
	return c
}

// FragmentationCheck judges one process's window for fragmented copies.
// Same-direction overlap is judged per GPU link, over every process's
// flows (OverlapChecks).
func (w *Window) FragmentationCheck(scope string, pid uint32) Check {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.procs[pid]
	if p == nil {
		return Skipped(scope, CheckFragmentation, "no transfer seen in the sample window")
	}
	return p.fragmentationCheck(scope, pid)
}

// fragmentationCheck judges each direction's copies on its own (seed 000
// L2→L1 #4): small D2H reads next to large H2D loads are not an H2D
// problem. Directions that do not cross the GPU link are listed, not judged.
func (p *procWindow) fragmentationCheck(scope string, pid uint32) Check {
	c := Check{Scope: scope, Name: CheckFragmentation, Status: Pass}
	var parts []string
	for _, dir := range slices.Sorted(maps.Keys(p.dirs)) {
		d := p.dirs[dir]
		text := fmt.Sprintf("%s: %d copies, %.2f GB/s achieved; sizes %s", dir, d.sizes.Count(), d.rate(), d.sizes.String())
		if !slices.Contains(correlate.FragmentDirections, dir) {
			text += " (not on the GPU link: not judged)"
		}
		parts = append(parts, text)
		if f := correlate.Fragmentation(pid, dir, d.sizes, d.rate()); f != nil {
			c.Findings = append(c.Findings, *f)
		}
	}
	c.Detail = strings.Join(parts, "; ")
	return c
}
