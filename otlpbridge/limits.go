package otlpbridge

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Limits bound what the receivers take in, so that no sender (a hostile
// local user included) can make the agent exceed its memory or file
// descriptors. Zero fields take the defaults below.
type Limits struct {
	// MaxBody is the largest request, in bytes, as received and after
	// decompression: HTTP answers 413 beyond it, gRPC ResourceExhausted.
	MaxBody int64
	// MaxConcurrent is how many requests are read and decoded at once;
	// one more is refused (HTTP 429 with Retry-After, gRPC
	// ResourceExhausted with RetryInfo), as OTLP asks of an overloaded
	// receiver.
	MaxConcurrent int
	// DecodeBudget is the memory, in bytes, the requests being read and
	// decoded may hold together, charged as they are read (CostPerByte per
	// byte after decompression, BodyCost per byte received); a request
	// that would pass it is refused as overloaded.
	DecodeBudget int64
	// MaxConnections caps each listener's open connections; past it new
	// ones wait in the kernel's backlog, holding no descriptor of ours.
	MaxConnections int
	// ReadTimeout bounds reading a request, headers and body (gRPC: the
	// whole call, besides forwarding); idle keep-alive connections are
	// closed after it too.
	ReadTimeout time.Duration
}

// The defaults, and the decode cost measured on the OTLP fixtures' shape
// (otlpbridge tests, TestDecodeCost): a protobuf request allocates 6.7×
// its size decoded, an OTLP/JSON one 4.9×; with the decoded bytes
// themselves that is under CostPerByte. A received body costs BodyCost
// (its buffer's growth).
const (
	DefaultMaxBody        = 8 << 20
	DefaultMaxConcurrent  = 8
	DefaultMaxConnections = 256
	DefaultReadTimeout    = 30 * time.Second
	CostPerByte           = 8
	BodyCost              = 2
)

// BudgetShare is the share of the agent's memory limit the receivers may
// decode with: a quarter.
const BudgetShare = 4

// DecodeBudgetFor sizes the decode budget from the agent's memory limit
// (0 or none: room for MaxConcurrent requests of MaxBody).
func DecodeBudgetFor(memoryLimit int64, l Limits) int64 {
	l = l.withDefaults()
	if memoryLimit <= 0 || memoryLimit/BudgetShare > int64(l.MaxConcurrent)*RequestCost(l.MaxBody) {
		return int64(l.MaxConcurrent) * RequestCost(l.MaxBody)
	}
	return memoryLimit / BudgetShare
}

// RequestCost is what the largest request of maxBody bytes may cost: a
// compressed body and its decompressed bytes, decoded.
func RequestCost(maxBody int64) int64 { return maxBody * (BodyCost + CostPerByte) }

func (l Limits) withDefaults() Limits {
	if l.MaxBody <= 0 {
		l.MaxBody = DefaultMaxBody
	}
	if l.MaxConcurrent <= 0 {
		l.MaxConcurrent = DefaultMaxConcurrent
	}
	if l.MaxConnections <= 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = DefaultReadTimeout
	}
	if l.DecodeBudget <= 0 {
		l.DecodeBudget = int64(l.MaxConcurrent) * RequestCost(l.MaxBody)
	}
	return l
}

// Check says what is wrong with explicit limits: a request of MaxBody
// bytes must fit the decode budget, or it would be refused for ever.
func (l Limits) Check() error {
	var errs []error
	if l.MaxBody < 0 || l.MaxConcurrent < 0 || l.MaxConnections < 0 || l.ReadTimeout < 0 {
		errs = append(errs, fmt.Errorf("OTLP limits must not be negative"))
	}
	if l.DecodeBudget > 0 && RequestCost(l.MaxBody) > l.DecodeBudget {
		errs = append(errs, fmt.Errorf("--otlp.max-body %d: a request that size may take %d bytes to decode, more than the receivers' budget of %d (a quarter of --memory-limit); lower it to %d or raise --memory-limit",
			l.MaxBody, RequestCost(l.MaxBody), l.DecodeBudget, l.DecodeBudget/(BodyCost+CostPerByte)))
	}
	return errors.Join(errs...)
}

// Why a request was refused: the reason label of
// lanewatch_otlp_rejected_requests_total.
const (
	ReasonTooLarge    = "too_large"   // past MaxBody (HTTP 413, gRPC ResourceExhausted)
	ReasonBadPayload  = "bad_payload" // undecodable (HTTP 400, gRPC InvalidArgument)
	ReasonUnsupported = "unsupported" // Content-Type or Content-Encoding not OTLP's (HTTP 415)
	ReasonOverloaded  = "overloaded"  // MaxConcurrent or DecodeBudget reached (HTTP 429, gRPC ResourceExhausted)
	ReasonReadError   = "read_error"  // the body could not be read: timeout, sender gone
)

// Reasons lists every reason, in the order metrics show them.
var Reasons = []string{ReasonTooLarge, ReasonBadPayload, ReasonUnsupported, ReasonOverloaded, ReasonReadError}

var (
	errTooLarge   = errors.New("request larger than the receiver's limit")
	errOverloaded = errors.New("receiver at its limit of requests being decoded")
)

// budget is the memory the requests being decoded may hold together.
type budget struct {
	mu         sync.Mutex
	used, max  int64
	inFlight   int
	concurrent int
}

// enter admits one more request unless MaxConcurrent are in.
func (b *budget) enter() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inFlight >= b.concurrent {
		return false
	}
	b.inFlight++
	return true
}

func (b *budget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.max {
		return false
	}
	b.used += n
	return true
}

func (b *budget) state() (used, max int64, inFlight int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.max, b.inFlight
}

// claim is one admitted request's share of the budget.
type claim struct {
	b     *budget
	taken int64
	once  sync.Once
}

// admit lets one request in, or says it is overloaded.
func (b *budget) admit() (*claim, error) {
	if !b.enter() {
		return nil, errOverloaded
	}
	return &claim{b: b}, nil
}

// charge takes n bytes more for this request.
func (c *claim) charge(n int64) error {
	if !c.b.take(n) {
		return errOverloaded
	}
	c.taken += n
	return nil
}

// release gives back everything the request took; only once.
func (c *claim) release() {
	c.once.Do(func() {
		c.b.mu.Lock()
		c.b.used -= c.taken
		c.b.inFlight--
		c.b.mu.Unlock()
	})
}

// readAll reads r up to limit bytes (errTooLarge past it), charging cost
// per byte as they arrive; sizeHint (-1: unknown) sizes the buffer at once.
func (c *claim) readAll(r io.Reader, limit, sizeHint, cost int64) ([]byte, error) {
	if sizeHint < 0 || sizeHint > limit {
		sizeHint = 0
	}
	// The hinted size is paid for at once: a sender may lie about it.
	if err := c.charge(sizeHint * cost); err != nil {
		return nil, err
	}
	paid := sizeHint
	buf := make([]byte, 0, max(sizeHint+1, 4096))
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return nil, errTooLarge
		}
		if more := int64(len(buf)) - paid; more > 0 {
			if cerr := c.charge(more * cost); cerr != nil {
				return nil, cerr
			}
			paid += more
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// connSet holds the receivers' open connections, so that Close can cut
// them all (gRPC's own Stop waits for those still in their handshake).
type connSet struct {
	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

func (s *connSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.Conn.Close()
	}
}

// trackedListener adds every connection it accepts to a connSet.
type trackedListener struct {
	net.Listener
	set *connSet
}

func (l trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, set: l.set}
	l.set.mu.Lock()
	if l.set.conns == nil {
		l.set.conns = map[*trackedConn]struct{}{}
	}
	l.set.conns[tc] = struct{}{}
	l.set.mu.Unlock()
	return tc, nil
}

// trackedConn leaves its set when closed.
type trackedConn struct {
	net.Conn
	set *connSet
}

func (c *trackedConn) Close() error {
	c.set.mu.Lock()
	delete(c.set.conns, c)
	c.set.mu.Unlock()
	return c.Conn.Close()
}
