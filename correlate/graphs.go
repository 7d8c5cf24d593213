package correlate

import "github.com/lanewatch/lanewatch/event"

// CUDA graphs (docs/design.md, "CUDA graphs"). Work issued on a stream
// while it is captured (cudaStreamBeginCapture .. cudaStreamEndCapture) is
// recorded into a graph and does not run: a copy there moves no byte at
// its call, so it is no transfer; a kernel launch, an event record or a
// stream wait there orders nothing yet, so it is no activity. What the
// graph holds runs at each cudaGraphLaunch with no call of its own: the
// launch is reported as compute on its stream (an Activity with op
// graph_launch), the copies inside it are not seen.
//
// A stream joins a capture as CUDA's does: by waiting on an event recorded
// in it (the fork of a multi-stream capture); every stream of the capture
// leaves it when its origin's capture ends.

// GraphStats counts what the engine saw of CUDA graphs.
type GraphStats struct {
	Launches       uint64 // successful graph launches: activities on their streams
	Captures       uint64 // stream captures begun
	CapturedCopies uint64 // copy calls (a batch: each entry) recorded into a graph: no transfer
	CapturedBytes  uint64 // ... their bytes, moved at each launch of the graph (unseen)
	CapturedOther  uint64 // kernel launches, graph launches, event records and stream waits recorded into a graph: no activity
	CapHits        uint64 // captures not tracked past maxCaptures: their work is taken as run
}

// maxCaptures bounds the streams a process may have capturing at once (a
// capture per stream; PyTorch captures on one side stream at a time).
const maxCaptures = 64

// graphLaunch reports a successful graph launch: compute on its stream.
func (e *Engine) graphLaunch(p *proc, c *event.Call) {
	e.gstats.Launches++
	e.note(p, c, Activity{Stream: c.Stream})
}

// beginCapture starts the capture of the stream key.
func (e *Engine) beginCapture(p *proc, key uint64) {
	if _, ok := p.capture[key]; !ok && len(p.capture) >= maxCaptures {
		e.gstats.CapHits++
		return
	}
	if p.capture == nil {
		p.capture = map[uint64]uint64{}
	}
	p.capture[key] = key
	e.gstats.Captures++
}

// endCapture ends the capture begun on key, for every stream that joined it.
func (e *Engine) endCapture(p *proc, key uint64) {
	for k, origin := range p.capture {
		if origin == key {
			delete(p.capture, k)
		}
	}
}

// captured reports whether c was recorded into a graph by a capture of its
// stream, and counts it: the caller makes no record and no activity of it.
// A failed call is never captured (it is reported as any failed call).
func (e *Engine) captured(p *proc, c *event.Call, key uint64) bool {
	origin, ok := p.capture[key]
	if !ok || c.Failed() {
		return false
	}
	switch {
	case c.Op.IsCopy():
		e.gstats.CapturedCopies++
		e.gstats.CapturedBytes += c.Bytes
	case c.Op == event.OpEventRecord:
		// What it records happens at the graph's launches; a stream that
		// waits on it joins the capture.
		ev := e.cudaEvent(p, c.Event)
		ev.capture, ev.inCapture = origin, true
		e.gstats.CapturedOther++
	case c.Op == event.OpLaunch, c.Op == event.OpGraphLaunch, c.Op == event.OpStreamWaitEvent:
		e.gstats.CapturedOther++
	default:
		return false
	}
	return true
}

// joinCapture makes the stream key part of a capture when it waits on an
// event recorded in one that is still open: reports whether it joined.
func (e *Engine) joinCapture(p *proc, ev *cudaEvent, key uint64) bool {
	if ev == nil || !ev.inCapture {
		return false
	}
	if o, ok := p.capture[ev.capture]; !ok || o != ev.capture {
		return false // that capture ended
	}
	if _, ok := p.capture[key]; !ok && len(p.capture) >= maxCaptures {
		e.gstats.CapHits++
		return false
	}
	p.capture[key] = ev.capture
	e.gstats.CapturedOther++
	return true
}
