package otlpbridge

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Clock converts CLOCK_MONOTONIC ns (the probes' timestamps) to Unix ns (the
// spans' timestamps) with an offset measured by Refresh. The zero value is
// not usable: call NewClock.
type Clock struct {
	offset atomic.Int64 // wall - monotonic, ns
}

// NewClock measures the offset once.
func NewClock() *Clock {
	c := &Clock{}
	c.Refresh()
	return c
}

// Refresh measures the offset again: the smallest of a few bracketed reads,
// so a preemption between the two clock reads does not skew it.
func (c *Clock) Refresh() {
	best, bestGap := int64(0), int64(-1)
	for range 5 {
		m1 := monotonic()
		w := time.Now().UnixNano()
		m2 := monotonic()
		if gap := m2 - m1; bestGap < 0 || gap < bestGap {
			best, bestGap = w-(m1+gap/2), gap
		}
	}
	c.offset.Store(best)
}

// Offset is wall minus monotonic, ns.
func (c *Clock) Offset() int64 { return c.offset.Load() }

// Wall converts a CLOCK_MONOTONIC ns timestamp to Unix ns.
func (c *Clock) Wall(mono uint64) int64 { return int64(mono) + c.offset.Load() }

func monotonic() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for this clock
	return ts.Nano()
}
