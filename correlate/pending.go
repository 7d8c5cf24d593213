package correlate

import "github.com/lanewatch/lanewatch/event"

// Pending transfers live in one slab of the engine and are referred to by
// (index, sequence) pairs, so queues never hold pointers that a slab growth
// would invalidate, and a reference to a transfer already emitted (whose slot
// may be reused) is recognised as stale by its sequence number.

// ref names one pending transfer.
type ref struct {
	idx int32
	seq uint64
}

// pending is a transfer waiting for its completion to be proven.
type pending struct {
	Transfer
	seq   uint64 // 0: free slot
	p     *proc
	st    *stream
	lst   *stream // the stream whose event records give Layer
	recAt uint64  // lst.records when the copy was submitted
	done  bool    // completion proven (CompleteNs set)
	open  bool    // its thread may still report the nested driver call: hold emission
}

// start fills the slot with the transfer of call c (newTransfer) and its
// pending state, each field written once: the slot is over 500 bytes, and
// writing it twice per copy showed in the agent's profile.
func (t *pending) start(c *event.Call, seq uint64, p *proc, st *stream, open, done bool) {
	newTransfer(&t.Transfer, c)
	t.seq, t.p, t.st, t.lst, t.recAt, t.open, t.done = seq, p, st, nil, 0, open, done
}

// queue is a FIFO of refs that reuses its backing array.
type queue struct {
	buf  []ref
	head int
}

func (q *queue) len() int { return len(q.buf) - q.head }

func (q *queue) push(r ref) {
	switch {
	case q.head == len(q.buf):
		q.buf, q.head = q.buf[:0], 0
	case q.head >= 256 && 2*q.head >= len(q.buf):
		n := copy(q.buf, q.buf[q.head:])
		q.buf, q.head = q.buf[:n], 0
	}
	q.buf = append(q.buf, r)
}

func (q *queue) front() ref { return q.buf[q.head] }
func (q *queue) pop()       { q.head++ }

// capture is "every transfer on st with a sequence number up to upTo".
type capture struct {
	st   *stream
	upTo uint64
}

// stream is one stream of one process.
type stream struct {
	q    queue // pending transfers in submission order
	live int
	deps []capture // what the stream waits for (StreamWaitEvent), one per stream

	// Per-layer pattern: event records on the stream, in all and at the
	// last point the stream was proven drained, and the engine sequence
	// number current at its last record.
	records, drainedAt, lastRecSeq uint64

	// gpu: the GPU of the stream's last copy whose GPU was known
	// (StreamGPUs).
	gpu string
}

// drained says a synchronisation proved the stream's work done up to upTo:
// when that covers its last event record, the next copy starts layer 0.
func (s *stream) drained(upTo uint64) {
	if upTo >= s.lastRecSeq {
		s.drainedAt = s.records
	}
}

// cudaEvent is one CUDA event handle of one process.
type cudaEvent struct {
	caps     []capture // what the last record captured, transitive waits included
	recorded uint64    // Call.Time of that record
	// recStream is the stream handle that record named (Activity.Stream).
	recStream uint64
	// inCapture: the event's last record was captured into a graph, in
	// the capture of stream capture (graphs.go).
	inCapture bool
	capture   uint64
}

// addDep records that s waits for c, keeping one capture per stream.
func (s *stream) addDep(c capture) {
	for i := range s.deps {
		if s.deps[i].st == c.st {
			s.deps[i].upTo = max(s.deps[i].upTo, c.upTo)
			return
		}
	}
	s.deps = append(s.deps, c)
}
