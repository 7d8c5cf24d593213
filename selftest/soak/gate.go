package soak

import (
	"context"
	"sync"
	"time"
)

// gate lets the soak's load run in turns and stop at quiet points: every
// loop enters before a piece of work and leaves after it, and pause waits
// until none is inside, so the agent's figures are read with no request,
// connection or process of the soak in flight.
type gate struct {
	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	active int
}

func newGate() *gate {
	g := &gate{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// enter waits while paused; false when ctx ended.
func (g *gate) enter(ctx context.Context) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.paused && ctx.Err() == nil {
		g.cond.Wait()
	}
	if ctx.Err() != nil {
		return false
	}
	g.active++
	return true
}

func (g *gate) leave() {
	g.mu.Lock()
	g.active--
	g.cond.Broadcast()
	g.mu.Unlock()
}

// pause stops new work and waits until none is in flight.
func (g *gate) pause() {
	g.mu.Lock()
	g.paused = true
	for g.active > 0 {
		g.cond.Wait()
	}
	g.mu.Unlock()
}

func (g *gate) resume() {
	g.mu.Lock()
	g.paused = false
	g.cond.Broadcast()
	g.mu.Unlock()
}

// wake lets loops waiting at a pause see that their context ended.
func (g *gate) wake() {
	g.mu.Lock()
	g.cond.Broadcast()
	g.mu.Unlock()
}

// loop runs work through the gate until ctx ends, waiting between
// rounds outside the gate (a pause need not wait for the rest).
func (g *gate) loop(ctx context.Context, between time.Duration, work func(ctx context.Context)) {
	for g.enter(ctx) {
		work(ctx)
		g.leave()
		if between > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(between):
			}
		}
	}
}
