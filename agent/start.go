package agent

import (
	"context"
	"fmt"
	"time"
)

// Tracing is a started tracer as diagnose and the selftest drive it: its
// counts while it runs, and a stop.
type Tracing interface {
	Stats() Stats
	// ShedByProcess is the copies each process had shed (Agent.ShedByProcess).
	ShedByProcess() (map[uint32]uint64, error)
	// Stop detaches the probes and returns what Run returned.
	Stop() error
}

// Start starts the tracer cfg describes and returns once its probes are
// attached (cfg.OnReady is still called), or why not: Run failed, ctx
// ended, or timeout passed (0: no limit).
func Start(ctx context.Context, cfg Config, timeout time.Duration) (Tracing, error) {
	ready := make(chan struct{})
	onReady := cfg.OnReady
	cfg.OnReady = func() {
		if onReady != nil {
			onReady()
		}
		close(ready)
	}
	ag, err := New(cfg)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	t := &tracing{Agent: ag, cancel: cancel, done: make(chan error, 1)}
	go func() { t.done <- ag.Run(runCtx) }()
	var expired <-chan time.Time
	if timeout > 0 {
		expired = time.After(timeout)
	}
	select {
	case <-ready:
		return t, nil
	case err := <-t.done:
		cancel()
		return nil, fmt.Errorf("probes: %w", err)
	case <-expired:
		t.Stop()
		return nil, fmt.Errorf("probes not attached within %s", timeout)
	}
}

type tracing struct {
	*Agent
	cancel context.CancelFunc
	done   chan error
}

func (t *tracing) Stop() error {
	t.cancel()
	return <-t.done
}
