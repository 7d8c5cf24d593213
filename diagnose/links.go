package diagnose

import (
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/checks"
)

// linkReadEvery is how often the sample window reads the GPU counters for
// the link check: often enough for a burst of a second to be read under
// load (agent.LinkWatch needs traffic on both sides of a read).
const linkReadEvery = 250 * time.Millisecond

// watchLinks reads the GPU counters (DCGM, else NVML; none: nothing to
// read) every linkReadEvery until the returned function is called, which
// returns each GPU's best link state read under load (checks.Host.Loads):
// link-degraded judges a GPU's link only as read under load.
func watchLinks(gpu agent.GPUConfig) (stop func() map[string]checks.LinkLoad) {
	counters, err := agent.OpenGPU(gpu)
	if err != nil {
		return func() map[string]checks.LinkLoad { return nil }
	}
	w := agent.NewLinkWatch(3 * linkReadEvery)
	read := func() {
		if s, err := counters.Sample(); err == nil {
			w.Add(s)
		}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(linkReadEvery)
		defer t.Stop()
		read()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				read()
			}
		}
	}()
	return func() map[string]checks.LinkLoad {
		close(done)
		wg.Wait()
		read() // the last read under load needs one after it
		counters.Close()
		return w.Take()
	}
}
