package exporters

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/otlpbridge"
)

// SpanMode says how transfers become spans.
type SpanMode string

// Span modes.
const (
	SpansOff         SpanMode = "off"
	SpansPerTransfer SpanMode = "per-transfer"
	// SpansBatched makes one span per run of consecutive transfers of the
	// same process and stream with the same direction, layer and request.
	SpansBatched SpanMode = "batched"
	// SpansSummary makes no transfer spans: one lanewatch.kv span per
	// request sums up its transfers (and findings still get their spans).
	SpansSummary SpanMode = "summary"
)

// ParseSpanMode parses a --spans value.
func ParseSpanMode(s string) (SpanMode, error) {
	switch m := SpanMode(s); m {
	case SpansOff, SpansPerTransfer, SpansBatched, SpansSummary:
		return m, nil
	}
	return "", fmt.Errorf("span mode %q: want per-transfer, batched, summary or off", s)
}

// Span attributes, all in the lanewatch.* namespace (docs/operating.md, "Traces").
const (
	AttrDirection    = attribute.Key("lanewatch.direction")
	AttrBytes        = attribute.Key("lanewatch.bytes")
	AttrCount        = attribute.Key("lanewatch.count")
	AttrAPI          = attribute.Key("lanewatch.api")
	AttrDriverAPI    = attribute.Key("lanewatch.driver_api")
	AttrOp           = attribute.Key("lanewatch.op")
	AttrSrcMemory    = attribute.Key("lanewatch.src.memory")
	AttrDstMemory    = attribute.Key("lanewatch.dst.memory")
	AttrHostMemory   = attribute.Key("lanewatch.host_memory")
	AttrPID          = attribute.Key("lanewatch.pid")
	AttrTID          = attribute.Key("lanewatch.tid")
	AttrStream       = attribute.Key("lanewatch.stream")
	AttrNUMANode     = attribute.Key("lanewatch.numa_node")
	AttrGPU          = attribute.Key("lanewatch.gpu")
	AttrNIC          = attribute.Key("lanewatch.nic")
	AttrPath         = attribute.Key("lanewatch.path.segments")
	AttrBottleneck   = attribute.Key("lanewatch.bottleneck.segment")
	AttrCapacity     = attribute.Key("lanewatch.bottleneck.capacity_bytes_per_second")
	AttrRate         = attribute.Key("lanewatch.rate_bytes_per_second")
	AttrComplete     = attribute.Key("lanewatch.completed")
	AttrRequest      = attribute.Key("lanewatch.request.id")
	AttrLayer        = attribute.Key("lanewatch.layer")
	AttrMover        = attribute.Key("lanewatch.mover")
	AttrKernel       = attribute.Key("lanewatch.kernel")
	AttrAttribution  = attribute.Key("lanewatch.attribution")
	AttrAttrScope    = attribute.Key("lanewatch.attribution.scope")
	AttrAttrReason   = attribute.Key("lanewatch.attribution.reason")
	AttrIncomplete   = attribute.Key("lanewatch.attribution.incomplete")
	AttrRoom         = attribute.Key("lanewatch.request.bootstrap_room")
	AttrBatchCount   = attribute.Key("lanewatch.batch.count")
	AttrBatchIDs     = attribute.Key("lanewatch.batch.request_ids")
	AttrFindingRule  = attribute.Key("lanewatch.finding.rule")
	AttrFindingSev   = attribute.Key("lanewatch.finding.severity")
	AttrFindingSum   = attribute.Key("lanewatch.finding.summary")
	AttrFindingFix   = attribute.Key("lanewatch.finding.remediation")
	AttrFindingCheck = attribute.Key("lanewatch.finding.checklist")
)

// Path is what the topology knows of a transfer's path.
type Path struct {
	GPU, NIC    string
	NUMANode    int // -1 unknown
	Segments    []string
	Bottleneck  string
	CapacityBps float64 // bottleneck capacity, bytes/s
}

// PathResolver places a transfer on the host's topology; false: unknown.
type PathResolver interface {
	Path(t *correlate.Transfer) (Path, bool)
}

// Attributor names the request a transfer served (otlpbridge.Index).
type Attributor interface {
	Attribute(pid, tid uint32, unixNs int64) otlpbridge.Attribution
}

// Reasons a transfer span names no request (lanewatch.attribution.reason,
// lanewatch_span_unattributed_total), besides the index's own
// (otlpbridge.Reason*).
const (
	ReasonNoAttributor = "no_attributor" // no OTLP bridge: nothing to attribute with
	ReasonOpenTimeout  = "open_timeout"  // a request that may cover it was still open after MaxHold
	ReasonMemory       = "memory"        // released while waiting, to keep held transfers under MaxPending
	ReasonOpenAtExit   = "open_at_exit"  // still waiting when the agent stopped
	ReasonStopping     = "stopping"      // not asked: the agent was stopping and its grace had passed (Stop)
)

// UnattributedReasons are every reason a transfer span names no request.
var UnattributedReasons = []string{ReasonNoAttributor, otlpbridge.ReasonNoSpans, otlpbridge.ReasonNotCovered, otlpbridge.ReasonOtherHost,
	otlpbridge.ReasonAmbiguous, ReasonOpenTimeout, ReasonMemory, ReasonOpenAtExit, ReasonStopping}

// SpansConfig configures Spans.
type SpansConfig struct {
	Tracer     trace.Tracer
	Mode       SpanMode
	Attributor Attributor // nil: no request identity
	Paths      PathResolver
	// Wall converts CLOCK_MONOTONIC ns to Unix ns (otlpbridge.Clock.Wall).
	Wall func(mono uint64) int64
	// Hold is how long a transfer waits for the server's spans (they are
	// exported only once they end, after the SDK's batch delay) before it
	// is attributed. Default 15 s.
	Hold time.Duration
	// MaxHold is how long a transfer waits at most, past Hold, while the
	// attributor says a request that may cover it is still open (its
	// spans come when it ends). Default 5 min; never less than Hold.
	MaxHold time.Duration
	// MaxPending caps held transfers (waiting for Hold or for an open
	// request); past it the oldest waiting ones, then the oldest held, are
	// released early (counted). Default 1<<18.
	MaxPending int
	// ExportUnattributed makes spans of transfers no sampled request
	// covers (the server sent no span for them: not covered, no spans,
	// another host's, still open at MaxHold). Off, they are counted
	// (SpansStats.Withheld) and not exported: at 1% sampling they would be
	// 99% of the spans. Ambiguous ones (covered by more spans than a batch
	// could be told from) are exported either way.
	ExportUnattributed bool
	// Requests receives each request's summary (the request histograms);
	// nil none.
	Requests RequestSink
	// StorageReads: storage reads are fed (StorageRead), so a summary's
	// lanewatch.kv.bytes.storage is known.
	StorageReads bool
	Logger       *slog.Logger
}

// SpansStats are the span exporter's counters.
type SpansStats struct {
	Transfers    uint64 // transfers received
	Spans        uint64 // spans made
	Attributed   uint64 // transfers attributed to one request
	Batched      uint64 // transfers attributed to a batch of requests
	EarlyRelease uint64 // transfers released before Hold because MaxPending was hit
	Late         uint64 // transfers that waited past Hold for an open request
	Incomplete   uint64 // transfers attributed while a request that may cover them was still open (MaxHold, memory, exit)
	Waiting      int    // transfers now waiting past Hold for an open request
	Held         int    // transfers now held (waiting for Hold or for an open request)
	// Unattributed counts the transfers whose span names no request, by
	// reason (UnattributedReasons).
	Unattributed map[string]uint64
	// Withheld counts, by the same reasons, those of them no span was made
	// for (SpansConfig.ExportUnattributed off).
	Withheld map[string]uint64
	// Summaries counts requests summed up (lanewatch.kv spans);
	// SummariesEarly those summed up before their end because maxRequests
	// were gathered; Gathering those being gathered now.
	Summaries, SummariesEarly uint64
	Gathering                 int
	StorageReads              uint64 // storage reads queued for the summaries
}

// Spans is a correlate.Sink that turns transfers into OTel spans, backdated
// to the transfers' kernel timestamps and placed in the request's trace.
// Transfer only queues; Release (called by the agent on its own ticker)
// makes the spans. A transfer waits Hold for the server's spans, then as
// long as the attributor says a request that may cover it is still open
// (at most MaxHold, within MaxPending): spans are exported when they end,
// a request's after its transfers (docs/design.md §7, "Spans").
// Transfer may be called from any goroutine; Release from one at a time.
type Spans struct {
	activeFindings map[string]bool // rule+subject of the findings active at the last evaluation
	cfg            SpansConfig

	mu      sync.Mutex
	pending []correlate.Transfer
	nwait   int          // len(waiting), for Stats and the budget
	stopAt  atomic.Int64 // Unix ns past which transfers are not attributed (Stop); 0 never
	stats   SpansStats

	// Release's own, one goroutine at a time.
	work    []correlate.Transfer
	waiting []held // past Hold, a request still open; in submit order
	ready   []held
	lastGen uint64
	runs    map[runKey]*run
	order   []*run
	free    []*run
	attrs   []attribute.KeyValue

	// Per-request summaries (requests.go), Release's own too.
	reqs     map[reqKey]*request
	reqOrder []reqKey // in order of their first transfer, for the bound
	noReq    []noRequest
	noReqAt  int
	ivLeft   int                 // intervals the gathered requests may still keep (maxIntervalsTotal)
	active   []correlate.Finding // the latest evaluation's findings, under mu
}

// held is a transfer with its latest attribution.
type held struct {
	t      correlate.Transfer
	a      otlpbridge.Attribution
	reason string // why it leaves open (ReasonOpenTimeout, …), "" not
}

// NewSpans returns a span exporter.
func NewSpans(cfg SpansConfig) *Spans {
	if cfg.Hold <= 0 {
		cfg.Hold = 15 * time.Second
	}
	if cfg.MaxHold <= 0 {
		cfg.MaxHold = 5 * time.Minute
	}
	cfg.MaxHold = max(cfg.MaxHold, cfg.Hold)
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 1 << 18
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Mode == "" {
		cfg.Mode = SpansBatched
	}
	return &Spans{cfg: cfg, runs: map[runKey]*run{}, activeFindings: map[string]bool{}, reqs: map[reqKey]*request{}, ivLeft: maxIntervalsTotal,
		stats: SpansStats{Unattributed: map[string]uint64{}, Withheld: map[string]uint64{}}}
}

// Transfer queues a copy of t. It never blocks on export.
func (s *Spans) Transfer(t *correlate.Transfer) {
	if s.cfg.Mode == SpansOff || t.Failed() {
		return // a failed call moved nothing: no transfer span
	}
	s.mu.Lock()
	s.stats.Transfers++
	s.pending = append(s.pending, *t)
	s.mu.Unlock()
}

// Stats returns the counters.
func (s *Spans) Stats() SpansStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Waiting, st.Held = s.nwait, s.nwait+len(s.pending)
	st.Unattributed, st.Withheld = maps.Clone(s.stats.Unattributed), maps.Clone(s.stats.Withheld)
	return st
}

// Release makes the spans of the transfers submitted before now-Hold whose
// requests are settled, of those waiting longer than MaxHold, and of every
// held transfer when now is zero (the agent stops); it returns how many
// spans.
func (s *Spans) Release(now time.Time) int {
	flush := now.IsZero()
	forced := 0 // the first ones of the due leave now whatever their requests
	s.mu.Lock()
	n := len(s.pending)
	var cut, maxCut int64
	if !flush {
		cut, maxCut = now.Add(-s.cfg.Hold).UnixNano(), now.Add(-s.cfg.MaxHold).UnixNano()
		n = 0
		for n < len(s.pending) && s.wall(s.pending[n].SubmitNs) <= cut {
			n++
		}
		// The budget covers both queues: the oldest waiting leave first,
		// then the oldest held, before their Hold if need be, none of
		// them waiting for an open request.
		if over := len(s.pending) + len(s.waiting) - s.cfg.MaxPending; over > 0 {
			k := min(over, len(s.waiting))
			for i := range k {
				s.waiting[i].reason = ReasonMemory
			}
			forced = min(over-k, len(s.pending))
			if forced > n {
				s.stats.EarlyRelease += uint64(forced - n)
				n = forced
			}
		}
	}
	s.work = append(s.work[:0], s.pending[:n]...)
	s.pending = append(s.pending[:0], s.pending[n:]...)
	s.mu.Unlock()

	// Waiting transfers: asked again when spans arrived since.
	gen, genOK := s.generation()
	recheck := !genOK || gen != s.lastGen
	s.lastGen = gen
	ready, keep := s.ready[:0], s.waiting[:0]
	ob, _ := s.cfg.Attributor.(interface{ OpenBefore(int64) bool })
	for _, w := range s.waiting {
		// Still open while a request that started before it is: the
		// answer would say so again, so it is not asked.
		if recheck && w.reason == "" && (ob == nil || !ob.OpenBefore(s.wall(w.t.SubmitNs))) {
			w.a = s.attribute(&w.t)
		}
		switch {
		case w.reason != "":
		case flush && w.a.Open:
			w.reason = ReasonOpenAtExit
		case !w.a.Open:
		case s.wall(w.t.SubmitNs) <= maxCut:
			w.reason = ReasonOpenTimeout
		default:
			keep = append(keep, w)
			continue
		}
		ready = append(ready, w)
	}
	late := 0
	for i := range s.work {
		h := held{t: s.work[i], a: s.attribute(&s.work[i])}
		switch {
		case !h.a.Open:
		case flush:
			h.reason = ReasonOpenAtExit
		case i < forced:
			h.reason = ReasonMemory
		case s.wall(h.t.SubmitNs) <= maxCut:
			h.reason = ReasonOpenTimeout
		default:
			keep = append(keep, h)
			late++
			continue
		}
		ready = append(ready, h)
	}
	if len(keep) < len(s.waiting) {
		clear(s.waiting[len(keep):]) // drop string references
	}
	s.waiting, s.ready = keep, ready
	s.mu.Lock()
	s.nwait = len(s.waiting)
	s.stats.Late += uint64(late)
	s.mu.Unlock()
	clear(s.work) // drop string references
	spans := 0
	if len(ready) > 0 {
		// Late transfers rejoin in submit order, so runs stay runs.
		slices.SortStableFunc(ready, func(a, b held) int { return cmp.Compare(a.t.SubmitNs, b.t.SubmitNs) })
		var ex exported
		spans, ex = s.export(ready)
		clear(s.ready)
		s.mu.Lock()
		s.stats.Spans += uint64(spans)
		s.stats.Attributed += ex.attributed
		s.stats.Batched += ex.batched
		s.stats.Incomplete += ex.incomplete
		for r, c := range ex.none {
			s.stats.Unattributed[r] += c
		}
		for r, c := range ex.withheld {
			s.stats.Withheld[r] += c
		}
		s.mu.Unlock()
	}
	made, early := s.summarize(cut, maxCut, flush)
	s.mu.Lock()
	s.stats.Spans += uint64(made)
	s.stats.Summaries += uint64(made)
	s.stats.SummariesEarly += uint64(early)
	s.stats.Gathering = len(s.reqs)
	s.mu.Unlock()
	return spans + made
}

// generation is the attributor's, when it has one: nothing to ask again
// while it has not changed.
func (s *Spans) generation() (uint64, bool) {
	g, ok := s.cfg.Attributor.(interface{ Generation() uint64 })
	if !ok {
		return 0, false
	}
	return g.Generation(), true
}

// Stop bounds the work left when the agent stops: once grace has passed,
// Release (one in progress included) asks the attributor nothing more and
// makes the rest of its transfers' spans unattributed (ReasonStopping), so
// the agent exits in time whatever the index holds. Any goroutine.
func (s *Spans) Stop(grace time.Duration) {
	s.stopAt.Store(time.Now().Add(grace).UnixNano())
}

func (s *Spans) attribute(t *correlate.Transfer) otlpbridge.Attribution {
	if s.cfg.Attributor == nil {
		return otlpbridge.Attribution{Reason: ReasonNoAttributor}
	}
	if at := s.stopAt.Load(); at != 0 && time.Now().UnixNano() >= at {
		return otlpbridge.Attribution{Reason: ReasonStopping}
	}
	return s.cfg.Attributor.Attribute(t.PID, t.TID, s.wall(t.SubmitNs))
}

func (s *Spans) wall(mono uint64) int64 {
	if s.cfg.Wall == nil {
		return int64(mono)
	}
	return s.cfg.Wall(mono)
}

// runKey groups transfers into runs: one open run per process and stream.
type runKey struct {
	pid    uint32
	stream uint64
}

// run is consecutive transfers that become one span.
type run struct {
	first      correlate.Transfer
	attr       otlpbridge.Attribution
	reason     string // held's: why it left while a request was open
	count      int
	bytes      uint64
	start, end uint64 // monotonic ns
	completed  bool
	small      correlate.SizeHistogram
	hostBytes  uint64 // H2D and D2H
	// pageable: copies of 64 KiB or more, pageSmall metadata-sized ones
	// (correlate.PageableFacts)
	pageable, pageSmall   int
	pageBytes, smallBytes uint64
}

func sameAttribution(a, b *otlpbridge.Attribution) bool {
	if a.Request != b.Request || a.Parent != b.Parent || a.Batch != b.Batch || a.Scope != b.Scope || a.Room != b.Room ||
		a.Reason != b.Reason || len(a.Links) != len(b.Links) {
		return false
	}
	for i := range a.Links {
		if a.Links[i] != b.Links[i] {
			return false
		}
	}
	return true
}

// exported counts what export did with the transfers it was given.
type exported struct {
	attributed, batched, incomplete uint64
	none, withheld                  map[string]uint64 // by reason
}

func (s *Spans) export(hs []held) (spans int, ex exported) {
	ex.none, ex.withheld = map[string]uint64{}, map[string]uint64{}
	for i := range hs {
		t, a := &hs[i].t, hs[i].a
		from := s.wall(t.SubmitNs)
		to := from
		if t.CompleteNs != 0 {
			to = s.wall(t.CompleteNs)
		}
		one := a.Request != "" || a.Parent.Valid()
		if t.Direction == DirStorageRead { // a summary's only
			if one && a.Batch <= 1 {
				s.gather(a.Parent, a.Request).read(t, from)
			}
			continue
		}
		switch {
		case a.Batch > 1:
			ex.batched++
			for j, l := range a.Links {
				s.gather(l, a.Requests[j]).share(t, from, to, &s.ivLeft)
			}
		case one:
			ex.attributed++
			s.gather(a.Parent, a.Request).add(t, from, to, hs[i].reason != "", &s.ivLeft)
		default:
			r := a.Reason
			if hs[i].reason != "" {
				r = hs[i].reason
			}
			ex.none[r]++
			s.noRequest(t.PID, from)
			if !s.cfg.ExportUnattributed && r != otlpbridge.ReasonAmbiguous && r != ReasonNoAttributor {
				ex.withheld[r]++ // no sampled request covers it: counted, not exported
				continue
			}
		}
		if hs[i].reason != "" && (a.Batch > 1 || one) {
			ex.incomplete++
		}
		if s.cfg.Mode == SpansSummary {
			continue
		}
		k := runKey{t.PID, t.Stream}
		r := s.runs[k]
		if r != nil && (s.cfg.Mode == SpansPerTransfer || r.first.Direction != t.Direction || r.first.Layer != t.Layer ||
			r.first.TID != t.TID || r.first.GPU != t.GPU || r.first.Mover != t.Mover || r.first.Kernel != t.Kernel ||
			r.reason != hs[i].reason || !sameAttribution(&r.attr, &a)) {
			s.end(r)
			spans++
			delete(s.runs, k)
			r = nil
		}
		if r == nil {
			r = s.newRun()
			r.first, r.attr, r.reason, r.start, r.end = *t, a, hs[i].reason, t.SubmitNs, t.SubmitNs
			s.runs[k] = r
			s.order = append(s.order, r)
		}
		r.count++
		r.bytes += t.Bytes
		if !t.BytesUnknown {
			r.small.Add(t.Bytes)
		}
		end := t.SubmitNs
		if t.CompleteNs != 0 {
			end = t.CompleteNs
			r.completed = true
		}
		r.end = max(r.end, end)
		if t.Direction == correlate.DirH2D || t.Direction == correlate.DirD2H {
			r.hostBytes += t.Bytes
		}
		switch {
		case t.HostMem != event.MemPageable || correlate.ElementSized(t.Bytes):
		case correlate.MetadataSized(t.Bytes):
			r.pageSmall++
			r.smallBytes += t.Bytes
		default:
			r.pageable++
			r.pageBytes += t.Bytes
		}
	}
	for _, r := range s.order {
		if r.count > 0 {
			s.end(r)
			spans++
		}
	}
	clear(s.runs)
	for _, r := range s.order {
		*r = run{}
		s.free = append(s.free, r)
	}
	s.order = s.order[:0]
	return spans, ex
}

func (s *Spans) newRun() *run {
	if n := len(s.free); n > 0 {
		r := s.free[n-1]
		s.free = s.free[:n-1]
		return r
	}
	return &run{}
}

// end makes the span of r and marks it emitted.
func (s *Spans) end(r *run) {
	t := &r.first
	ctx := context.Background()
	opts := []trace.SpanStartOption{trace.WithTimestamp(time.Unix(0, s.wall(r.start))), trace.WithSpanKind(trace.SpanKindInternal)}
	a := &r.attr
	if a.Parent.Valid() && a.Batch <= 1 {
		ctx = trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: a.Parent.TraceID, SpanID: a.Parent.SpanID, TraceFlags: trace.FlagsSampled, Remote: true}))
	} else {
		opts = append(opts, trace.WithNewRoot())
		for _, l := range a.Links {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: l.TraceID, SpanID: l.SpanID, TraceFlags: trace.FlagsSampled, Remote: true})}))
		}
	}
	at := s.attrs[:0]
	at = append(at,
		AttrDirection.String(t.Direction),
		AttrCount.Int(r.count),
		AttrAPI.String(t.API),
		AttrOp.String(t.Op.String()),
		AttrSrcMemory.String(string(t.Src.Mem)),
		AttrDstMemory.String(string(t.Dst.Mem)),
		AttrPID.Int64(int64(t.PID)),
		AttrTID.Int64(int64(t.TID)),
		AttrStream.String("0x"+strconv.FormatUint(t.Stream, 16)),
		AttrComplete.Bool(r.completed),
	)
	if !t.BytesUnknown { // a kernel's launch states no bytes (docs/design.md, "Kernel movers")
		at = append(at, AttrBytes.Int64(int64(r.bytes)))
	}
	if t.Mover != "" {
		at = append(at, AttrMover.String(t.Mover))
	}
	if t.Kernel != "" {
		at = append(at, AttrKernel.String(t.Kernel))
	}
	if t.DriverAPI != "" {
		at = append(at, AttrDriverAPI.String(t.DriverAPI))
	}
	if t.HostMem != "" {
		at = append(at, AttrHostMemory.String(string(t.HostMem)))
	}
	if t.Layer >= 0 {
		at = append(at, AttrLayer.Int(t.Layer))
	}
	if r.completed && r.end > r.start && !t.BytesUnknown {
		at = append(at, AttrRate.Float64(float64(r.bytes)*1e9/float64(r.end-r.start)))
	}
	switch {
	case a.Batch > 1:
		at = append(at, AttrAttribution.String("batch"), AttrAttrScope.String(a.Scope), AttrBatchCount.Int(a.Batch), AttrBatchIDs.StringSlice(a.Requests))
	case a.Request != "" || a.Parent.Valid():
		at = append(at, AttrAttribution.String(a.Rule), AttrAttrScope.String(a.Scope))
		if a.Request != "" {
			at = append(at, AttrRequest.String(a.Request))
		}
		if a.Room != "" {
			at = append(at, AttrRoom.String(a.Room))
		}
	default:
		reason := a.Reason
		if r.reason != "" {
			reason = r.reason
		}
		at = append(at, AttrAttribution.String("none"), AttrAttrReason.String(reason))
	}
	if r.reason != "" && (a.Batch > 1 || a.Request != "" || a.Parent.Valid()) {
		// Attributed while a request that may cover it was still open.
		at = append(at, AttrIncomplete.Bool(true), AttrAttrReason.String(r.reason))
	}
	// The copy's own GPU (docs/design.md, "Placement"), else its path's.
	gpu := t.GPU
	if s.cfg.Paths != nil {
		if p, ok := s.cfg.Paths.Path(t); ok {
			if gpu == "" {
				gpu = p.GPU
			}
			if p.NIC != "" {
				at = append(at, AttrNIC.String(p.NIC))
			}
			if p.NUMANode >= 0 {
				at = append(at, AttrNUMANode.Int(p.NUMANode))
			}
			if len(p.Segments) > 0 {
				at = append(at, AttrPath.StringSlice(p.Segments))
			}
			if p.Bottleneck != "" {
				at = append(at, AttrBottleneck.String(p.Bottleneck), AttrCapacity.Float64(p.CapacityBps))
			}
		}
	}
	if gpu != "" {
		at = append(at, AttrGPU.String(gpu))
	}
	s.attrs = at
	opts = append(opts, trace.WithAttributes(at...))
	name := "transfer " + t.Direction
	if t.Mover == correlate.MoverSM {
		name = event.OpKernelCopy.String() + " " + t.Kernel
	}
	_, span := s.cfg.Tracer.Start(ctx, name, opts...)
	// Findings that a run proves by itself become events on its span.
	if f := correlate.PageableCopies(correlate.PageableFacts{PID: t.PID, Bulk: r.pageable, Metadata: r.pageSmall, BulkBytes: r.pageBytes,
		MetadataBytes: r.smallBytes, HostBytes: r.hostBytes, APIs: []string{t.API}}); f != nil && f.Severity != correlate.SevInfo {
		addFinding(span, f, s.wall(r.start)) // a span's event marks a cost; an INFO one would mark every decode step
	}
	if r.completed && r.end > r.start && !t.BytesUnknown {
		addFinding(span, correlate.Fragmentation(t.PID, t.Direction, r.small, float64(r.bytes)/float64(r.end-r.start)), s.wall(r.start))
	}
	span.End(trace.WithTimestamp(time.Unix(0, s.wall(r.end))))
	r.count = 0
}

func addFinding(span trace.Span, f *correlate.Finding, at int64) {
	if f == nil {
		return
	}
	span.AddEvent("lanewatch.finding", trace.WithTimestamp(time.Unix(0, at)), trace.WithAttributes(
		AttrFindingRule.String(f.Rule), AttrFindingSev.String(string(f.Severity)), AttrFindingSum.String(f.Summary),
		AttrFindingFix.String(f.Remediation), AttrFindingCheck.String(f.Checklist),
		attribute.String("lanewatch.finding.evidence", strings.Join(f.Evidence, "; "))))
}

// Findings makes a span for every finding that became active at this
// evaluation (one that stays active does not repeat; one that went away
// and comes back does), with its severity, evidence and remediation, so a
// trace backend shows what was wrong beside the transfers it concerns.
func (s *Spans) Findings(fs []correlate.Finding, at time.Time) int {
	if s.cfg.Mode == SpansOff {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active = slices.Clone(fs) // the summaries name the findings about their processes
	now := map[string]bool{}
	made := 0
	for _, f := range fs {
		key := f.Rule + "\x00" + f.Subject
		now[key] = true
		if s.activeFindings[key] {
			continue
		}
		_, sp := s.cfg.Tracer.Start(context.Background(), "lanewatch.finding "+f.Rule, trace.WithTimestamp(at),
			trace.WithAttributes(AttrFindingRule.String(f.Rule), AttrFindingSev.String(string(f.Severity)),
				AttrFindingSum.String(f.Summary), AttrFindingFix.String(f.Remediation), AttrFindingCheck.String(f.Checklist),
				attribute.String("lanewatch.finding.subject", f.Subject),
				attribute.StringSlice("lanewatch.finding.evidence", f.Evidence)))
		if f.Severity == correlate.SevFail {
			sp.SetStatus(codes.Error, f.Summary)
		}
		sp.End(trace.WithTimestamp(at))
		made++
	}
	s.activeFindings = now
	return made
}
