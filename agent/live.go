package agent

import (
	"cmp"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
)

// LivePath is where the metrics server serves the live view (Live) that
// `agent top` reads beside /metrics.
const LivePath = "/api/v1/live"

// Bounds of the live view: the flows one second may hold (the others are
// counted, not kept), the flows and findings one answer lists at most.
const (
	maxLiveFlows    = 4096
	maxLiveDirs     = 16 // directions told apart (correlate's are 10)
	liveFlowsListed = 32
	maxLiveFindings = 32
)

// Live is the answer of GET /api/v1/live: what /metrics cannot hold
// without labels per process and stream, and the lanes' byte totals with
// the instant they were read (a scrape carries no time: a rate over two
// scrapes carries their latency, one over two answers does not).
type Live struct {
	// At is when the lanes' counters were read.
	At time.Time `json:"at"`
	// Lanes are the copy counters kept in BPF per GPU lane and direction,
	// those of lanewatch_lane_bytes_total (GPU "" unknown); nil before the
	// probes are loaded.
	Lanes []LiveLane `json:"lanes"`
	// Flows are the transfers of the last whole second (From to To) per
	// process, stream and direction, the most bytes first: at most
	// liveFlowsListed, Omitted the others; OverCap counts the transfers of
	// flows that found no room among the second's maxLiveFlows.
	From    time.Time  `json:"from"`
	To      time.Time  `json:"to"`
	Flows   []LiveFlow `json:"flows"`
	Omitted int        `json:"flows_omitted"`
	OverCap uint64     `json:"flows_over_cap"`
	// Findings are those of the latest evaluation window, judged at
	// FindingsAt (zero: none judged yet); FindingsOmitted the others.
	FindingsAt      time.Time     `json:"findings_at"`
	Findings        []LiveFinding `json:"findings"`
	FindingsOmitted int           `json:"findings_omitted"`
	Agent           LiveAgent     `json:"agent"`
}

// LiveLane is one GPU lane's counted copies since the agent started.
type LiveLane struct {
	GPU       string `json:"gpu"`
	Direction string `json:"direction"`
	Copies    uint64 `json:"copies"`
	Bytes     uint64 `json:"bytes"`
}

// LiveFlow is what one process moved on one stream in one direction over
// the live view's second. Bytes leave out transfers whose size is unknown
// (copies by SMs); Copies count them.
type LiveFlow struct {
	PID       uint32  `json:"pid"`
	Comm      string  `json:"comm"`   // "" when the process is gone
	Stream    string  `json:"stream"` // the stream handle, hex: too wide for a JSON number
	Direction string  `json:"direction"`
	GPU       string  `json:"gpu"` // the GPU of its last transfer, "" unknown
	Bytes     uint64  `json:"bytes"`
	Copies    uint64  `json:"copies"`
	Bps       float64 `json:"bytes_per_second"`
}

// LiveFinding is one finding of the latest window, without its evidence
// (the logs and spans have it).
type LiveFinding struct {
	Rule     string `json:"rule"`
	Severity string `json:"severity"`
	Subject  string `json:"subject"`
	Summary  string `json:"summary"`
}

// LiveAgent are the agent's own counters, as /metrics has them.
type LiveAgent struct {
	Events    uint64 `json:"events"`
	Drops     uint64 `json:"drops"`
	Transfers uint64 `json:"transfers"`
	Pending   int    `json:"pending"`
	// Uncounted copies found no room in the BPF flow table: in no lane.
	Uncounted uint64 `json:"uncounted_copies"`
}

// liveKey is a flow: its direction is an index into liveFlows.dirs, so
// the key hashes as plain memory.
type liveKey struct {
	stream uint64
	pid    uint32
	dir    uint8
}

type liveCount struct {
	key           liveKey
	gpu           string
	bytes, copies uint64
}

// liveFlows counts the transfers per process, stream and direction, one
// second at a time (roll): a map update per transfer at most, no
// allocation once the first seconds sized the map and slices, bounded by
// maxLiveFlows.
type liveFlows struct {
	mu      sync.Mutex
	idx     map[liveKey]int32
	cur     []liveCount
	overCap uint64
	from    time.Time
	dirs    []string // the directions seen, kept across seconds
	// recent are the last flows' indexes: streams interleaved copy by
	// copy skip the map. n of them are valid, next is replaced next.
	recent [4]struct {
		key liveKey
		i   int32
	}
	n, next int

	prev             []liveCount
	prevFrom, prevTo time.Time
	prevOverCap      uint64
	findingsAt       time.Time
	findings         []correlate.Finding
}

func newLiveFlows(now time.Time) *liveFlows {
	return &liveFlows{idx: map[liveKey]int32{}, from: now}
}

// Transfer counts one transfer. It implements correlate.Sink.
func (l *liveFlows) Transfer(t *correlate.Transfer) {
	if t.Failed() {
		return // nothing moved
	}
	l.mu.Lock()
	i := l.flow(t)
	if i < 0 {
		l.overCap++
		l.mu.Unlock()
		return
	}
	c := &l.cur[i]
	c.bytes += t.Bytes
	c.copies++
	if t.GPU != "" {
		c.gpu = t.GPU
	}
	l.mu.Unlock()
}

// flow is the index of t's flow in cur, added if new; -1 when it has no
// room. Caller holds l.mu.
func (l *liveFlows) flow(t *correlate.Transfer) int32 {
	d := slices.Index(l.dirs, t.Direction)
	if d < 0 {
		if len(l.dirs) == maxLiveDirs {
			return -1
		}
		d = len(l.dirs)
		l.dirs = append(l.dirs, t.Direction)
	}
	k := liveKey{t.Stream, t.PID, uint8(d)}
	for _, r := range l.recent[:l.n] {
		if r.key == k {
			return r.i
		}
	}
	i, ok := l.idx[k]
	if !ok {
		if len(l.cur) >= maxLiveFlows {
			return -1
		}
		i = int32(len(l.cur))
		l.cur = append(l.cur, liveCount{key: k})
		l.idx[k] = i
	}
	l.recent[l.next].key, l.recent[l.next].i = k, i
	l.next = (l.next + 1) % len(l.recent)
	l.n = min(l.n+1, len(l.recent))
	return i
}

// roll ends the second at now: it becomes the one the view shows.
func (l *liveFlows) roll(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.prev, l.cur = l.cur, l.prev[:0]
	l.prevFrom, l.prevTo, l.from = l.from, now, now
	l.prevOverCap, l.overCap = l.overCap, 0
	clear(l.idx)
	l.n, l.next = 0, 0
}

// setFindings keeps the latest window's findings (the verdict's own
// slice, never written after it is published).
func (l *liveFlows) setFindings(at time.Time, fs []correlate.Finding) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.findingsAt, l.findings = at, fs
}

// fill writes the last whole second's flows and the latest findings into
// v; the processes' names are read from procRoot.
func (l *liveFlows) fill(v *Live, procRoot string) {
	l.mu.Lock()
	flows := slices.Clone(l.prev)
	v.From, v.To, v.OverCap = l.prevFrom, l.prevTo, l.prevOverCap
	v.FindingsAt = l.findingsAt
	fs := l.findings

	dirs := slices.Clone(l.dirs)
	l.mu.Unlock()

	slices.SortFunc(flows, func(a, b liveCount) int {
		return cmp.Or(cmp.Compare(b.bytes, a.bytes), cmp.Compare(b.copies, a.copies), cmp.Compare(a.key.pid, b.key.pid),
			cmp.Compare(a.key.stream, b.key.stream), cmp.Compare(dirs[a.key.dir], dirs[b.key.dir]))
	})
	if len(flows) > liveFlowsListed {
		v.Omitted, flows = len(flows)-liveFlowsListed, flows[:liveFlowsListed]
	}
	secs := v.To.Sub(v.From).Seconds()
	v.Flows = make([]LiveFlow, 0, len(flows))
	comms := map[uint32]string{}
	for _, f := range flows {
		comm, ok := comms[f.key.pid]
		if !ok {
			comm = readComm(procRoot, f.key.pid)
			comms[f.key.pid] = comm
		}
		lf := LiveFlow{PID: f.key.pid, Comm: comm, Stream: "0x" + strconv.FormatUint(f.key.stream, 16), Direction: dirs[f.key.dir],
			GPU: f.gpu, Bytes: f.bytes, Copies: f.copies}
		if secs > 0 {
			lf.Bps = float64(f.bytes) / secs
		}
		v.Flows = append(v.Flows, lf)
	}
	v.Findings = make([]LiveFinding, 0, min(len(fs), maxLiveFindings))
	for i, f := range fs {
		if i == maxLiveFindings {
			v.FindingsOmitted = len(fs) - i
			break
		}
		v.Findings = append(v.Findings, LiveFinding{Rule: f.Rule, Severity: string(f.Severity), Subject: f.Subject, Summary: f.Summary})
	}
}

// readComm is a process's name, "" when it is gone.
func readComm(procRoot string, pid uint32) string {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

// serveLive answers GET /api/v1/live.
func (m *metrics) serveLive(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	var v Live
	if ag := m.agent.Load(); ag != nil {
		lanes, uncounted := ag.LaneCopies()
		v.At = time.Now() // right after the read: the rate's instant
		v.Lanes = make([]LiveLane, 0, len(lanes))
		for _, l := range lanes {
			v.Lanes = append(v.Lanes, LiveLane{GPU: l.GPU, Direction: l.Direction, Copies: l.Copies, Bytes: l.Bytes})
		}
		st := ag.Stats()
		v.Agent = LiveAgent{Events: st.Events, Drops: st.Drops.Total(), Transfers: st.Engine.Transfers, Pending: ag.Pending(), Uncounted: uncounted}
	} else {
		v.At = time.Now()
	}
	procRoot := cmp.Or(m.cfg.Trace.ProcRoot, "/proc")
	m.live.fill(&v, procRoot)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := json.NewEncoder(w).Encode(&v); err != nil {
		m.log.Debug("live view", "err", err)
	}
}
