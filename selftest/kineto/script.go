package kineto

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"
)

// ScriptOptions shape a replay script.
type ScriptOptions struct {
	// MaxGap shortens every idle stretch of the trace (no thread calling)
	// longer than it to it, so a trace that waited seconds between bursts
	// replays in well under a minute; 0 keeps every gap.
	MaxGap time.Duration
}

// Plan is what a script makes: the copies it replays by direction/host
// memory (each has its call), and what it could not replay and why.
type Plan struct {
	Copies        map[string]Count
	NotReplayed   map[string]int // reason → calls
	Threads       int
	Streams       int
	ShortenedNs   int64 // idle time removed by MaxGap
	GraphLaunches int
	GraphCopies   int // copies captured into the graphs (no call of their own at the launch)
	// DeviceBytes is the device buffer the replay allocates, twice (the
	// source and destination of device-to-device copies).
	DeviceBytes uint64
}

// Count is copies and their bytes.
type Count struct {
	Copies int    `json:"copies"`
	Bytes  uint64 `json:"bytes"`
}

// Add counts one copy.
func (c *Count) Add(bytes uint64) { c.Copies++; c.Bytes += bytes }

// CountCopies sums copies by Key.
func CountCopies(cs []Copy) map[string]Count {
	m := map[string]Count{}
	for _, c := range cs {
		v := m[c.Key()]
		v.Add(c.Bytes)
		m[c.Key()] = v
	}
	return m
}

// Script writes the replay script of t (refpath/kvpath/replay.c reads it).
//
// What the trace does not say is inferred, and only that: a sync, wait or
// record whose stream CUPTI did not record uses the stream its thread last
// put work on (the legacy stream before any); an event record's event and
// stream come from the CUPTI sync record of a wait that named it (by the
// record's correlation id), else the thread's own event; a wait, query or
// sync whose event is unknown uses the event its thread last recorded.
func Script(w io.Writer, t *Trace, o ScriptOptions) (Plan, error) {
	p := Plan{Copies: map[string]Count{}, NotReplayed: map[string]int{}, Threads: len(t.Threads), Streams: len(t.Streams)}
	streamIdx := map[int64]int{}
	for i, s := range t.Streams {
		streamIdx[s] = i
	}
	// events: CUPTI's ids first, then one per thread for records nobody named
	eventIdx := map[int64]int{}
	type recordFact struct{ event, stream int64 }
	records := map[int64]recordFact{} // record correlation → what its waiters said
	for _, th := range t.Threads {
		for _, c := range th.Calls {
			if c.RecordCorr >= 0 && c.Event >= 0 {
				records[c.RecordCorr] = recordFact{c.Event, c.RecordStream}
			}
			if c.Event >= 0 {
				if _, ok := eventIdx[c.Event]; !ok {
					eventIdx[c.Event] = len(eventIdx)
				}
			}
		}
	}
	nEvents := len(eventIdx) + len(t.Threads)
	shift := gapShift(t, o.MaxGap)
	var maxPinned, maxPageable, maxDevice uint64 = 1, 1, 1
	fits := func(cp Copy) {
		maxDevice = max(maxDevice, cp.Bytes)
		switch cp.Host {
		case "pinned":
			maxPinned = max(maxPinned, cp.Bytes)
		case "pageable":
			maxPageable = max(maxPageable, cp.Bytes)
		}
	}
	replayable := func(cp Copy) bool {
		return (cp.Dir == "H2D" || cp.Dir == "D2H" || cp.Dir == "D2D") && cp.Host != "unknown" && cp.Bytes > 0
	}
	var graphs []string // each graph launch's graph: its line and its copies'
	var body strings.Builder
	for ti, th := range t.Threads {
		ownEvent := len(eventIdx) + ti
		lastStream, lastEvent := -1, ownEvent
		var lines []string
		line := func(c Call, format string, args ...any) {
			lines = append(lines, fmt.Sprintf("%d %s", shift(c.StartNs), fmt.Sprintf(format, args...)))
		}
		stream := func(s int64) int {
			if i, ok := streamIdx[s]; ok {
				return i
			}
			return lastStream
		}
		event := func(e int64) int {
			if i, ok := eventIdx[e]; ok {
				return i
			}
			return lastEvent
		}
		for _, c := range th.Calls {
			switch c.Op {
			case OpCopy:
				cp := c.Copy
				form := "async"
				if !strings.Contains(c.API, "Async") {
					form = "sync"
				}
				if !replayable(*cp) {
					p.NotReplayed[fmt.Sprintf("%s %s copy", cp.Dir, cp.Host)]++
					continue
				}
				s := stream(c.Stream)
				lastStream = s
				line(c, "copy %s %s %s %d %d", form, cp.Dir, cp.Host, cp.Bytes, s)
				v := p.Copies[cp.Key()]
				v.Add(cp.Bytes)
				p.Copies[cp.Key()] = v
				fits(*cp)
			case OpKernel:
				s := stream(c.Stream)
				lastStream = s
				line(c, "kernel %d %d", s, max(c.GPUNs, 0))
			case OpGraph:
				s := stream(c.Stream)
				lastStream = s
				var copies []string
				compute := c.GPUNs // the graph's span on its stream, less its copies' own time
				for _, cp := range c.GraphCopies {
					if !replayable(cp) {
						p.NotReplayed[fmt.Sprintf("%s %s copy in a graph", cp.Dir, cp.Host)]++
						continue
					}
					fits(cp)
					compute -= cp.GPUNs
					copies = append(copies, fmt.Sprintf("%s %s %d", cp.Dir, cp.Host, cp.Bytes))
				}
				line(c, "graph %d %d", s, len(graphs))
				graphs = append(graphs, strings.Join(append([]string{fmt.Sprintf("graph %d %d", max(compute, 0), len(copies))}, copies...), "\n"))
				p.GraphLaunches++
				p.GraphCopies += len(copies)
			case OpMemset:
				s := stream(c.Stream)
				lastStream = s
				maxDevice = max(maxDevice, c.MemsetBytes)
				line(c, "memset %d %d", s, c.MemsetBytes)
			case OpEventRecord:
				e, s := ownEvent, lastStream
				if f, ok := records[c.Correlation]; ok {
					e = eventIdx[f.event]
					if f.stream != NoStream {
						s = stream(f.stream)
					}
				}
				lastEvent = e
				line(c, "event_record %d %d", e, s)
			case OpEventQuery, OpEventSync:
				line(c, "%s %d", c.Op, event(c.Event))
			case OpStreamWait:
				line(c, "stream_wait %d %d", stream(c.Stream), event(c.Event))
			case OpStreamSync:
				line(c, "stream_sync %d", stream(c.Stream))
			case OpDeviceSync:
				line(c, "device_sync")
			default:
				return p, fmt.Errorf("%s: thread %s: op %q has no script form", t.Name, th.ID, c.Op)
			}
		}
		fmt.Fprintf(&body, "# thread %s\nthread %d\n%s\n", th.ID, len(lines), strings.Join(lines, "\n"))
	}
	p.ShortenedNs = shift(-1)
	p.DeviceBytes = maxDevice
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# replay of %s (selftest/kineto)\nreplay 1\nstreams %d\nevents %d\nbuffers %d %d %d\ngraphs %d\n",
		t.Name, len(t.Streams), nEvents, maxPinned, maxPageable, maxDevice, len(graphs))
	for _, g := range graphs {
		fmt.Fprintf(bw, "%s\n", g)
	}
	fmt.Fprintf(bw, "%send\n", body.String())
	return p, bw.Flush()
}

// gapShift maps a trace time to its replay time, each idle stretch longer
// than maxGap cut to maxGap; shift(-1) is the time removed in all.
func gapShift(t *Trace, maxGap time.Duration) func(int64) int64 {
	var starts []int64
	for _, th := range t.Threads {
		for _, c := range th.Calls {
			starts = append(starts, c.StartNs)
		}
	}
	slices.Sort(starts)
	starts = slices.Compact(starts)
	cut := make([]int64, len(starts)) // removed before starts[i]
	for i := 1; i < len(starts) && maxGap > 0; i++ {
		cut[i] = cut[i-1]
		if gap := starts[i] - starts[i-1]; gap > int64(maxGap) {
			cut[i] += gap - int64(maxGap)
		}
	}
	return func(at int64) int64 {
		if at < 0 {
			if len(cut) == 0 {
				return 0
			}
			return cut[len(cut)-1]
		}
		i := sort.Search(len(starts), func(i int) bool { return starts[i] > at }) - 1
		if i < 0 {
			return at
		}
		return at - cut[i]
	}
}
