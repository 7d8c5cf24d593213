package judge

import (
	"fmt"
	"sync"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
)

// The storage leg: checklist item 6, storage reads into the pool against
// the GPU's socket (storage-far-pool), and item 7, storage and the GPU's
// copies sharing a switch uplink (storage-shared-uplink). Item 8 (GDS) is a
// host check, judged without a window.

var (
	_ = register(storageDirectRule{})
	_ = register(storageUplinkRule{})
)

type storageDirectRule struct{}

func (storageDirectRule) Check() string    { return checks.CheckStorageDirect }
func (storageDirectRule) Raises() []string { return []string{"storage-far-pool"} }
func (storageDirectRule) Unsampled() string {
	return "storage reads are traced over a live window (--sample --trace-storage-reads)"
}

// Judge judges each process with storage reads in the window against its
// host→device bytes in the same window; a SKIP when Env says why the reads
// are not judged.
func (storageDirectRule) Judge(w *Window, env *Env) (j Judgement) {
	if env.StorageUnjudged != "" {
		j.Checks = []checks.Check{checks.Skipped(checks.HostScope, checks.CheckStorageDirect, "%s", env.StorageUnjudged)}
		return j
	}
	var sides correlate.NodeSides
	if env.NUMA != nil {
		sides = env.NUMA.NodeSide
	}
	flows := env.StorageReads
	for i := 0; i < len(flows); {
		k := i
		for k < len(flows) && flows[k].PID == flows[i].PID {
			k++
		}
		pid := flows[i].PID
		j.Checks = append(j.Checks, checks.StorageDirectCheck(env.scope(pid), flows[i:k], w.LaneBytes(pid, checks.Inbound), sides))
		i = k
	}
	return j
}

type storageUplinkRule struct{}

func (storageUplinkRule) Check() string    { return checks.CheckStorageUplink }
func (storageUplinkRule) Raises() []string { return []string{"storage-shared-uplink"} }
func (storageUplinkRule) Unsampled() string {
	return "storage and GPU rates are measured over a live window (--sample)"
}

// Judge compares the block devices' rates with the GPUs' traffic on each
// lane (the counters' where read, else the probes'); no check without disk
// rates.
func (storageUplinkRule) Judge(w *Window, env *Env) (j Judgement) {
	if env.DiskRates == nil {
		return j
	}
	rates, err := env.DiskRates()
	if err != nil {
		j.Checks = []checks.Check{checks.Skipped(checks.HostScope, checks.CheckStorageUplink, "block device rates: %v", err)}
		return j
	}
	gpu := checks.GPURates{}
	for _, l := range env.Lanes {
		if gpu[l.GPU] == nil {
			gpu[l.GPU] = map[string]float64{}
		}
		b := l.Demand
		if l.HasMeasured {
			b = l.Measured
		}
		gpu[l.GPU][l.Direction] = b
	}
	j.Checks = []checks.Check{env.Storage.UplinkCheck(rates, gpu)}
	return j
}

// StorageFlows ends a window of storage reads (agent.StorageReads.Flows).
type StorageFlows interface {
	Flows() []checks.StorageFlow
}

// DiskWindow reads /proc/diskstats at the end of each evaluation window:
// each device's rates over the window, for storage-shared-uplink.
type DiskWindow struct {
	procRoot string
	host     checks.StorageHost
	mu       sync.Mutex
	prev     collectors.DiskSample
	have     bool
}

// NewDiskWindow takes the first reading now.
func NewDiskWindow(procRoot string, host checks.StorageHost) *DiskWindow {
	d := &DiskWindow{procRoot: procRoot, host: host}
	d.Rates()
	return d
}

// Rates reads diskstats and returns the rates since the previous reading.
func (d *DiskWindow) Rates() ([]collectors.DiskRate, error) {
	s, err := collectors.ReadDiskstats(d.procRoot)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.have = false
		return nil, err
	}
	prev, have := d.prev, d.have
	d.prev, d.have = s, true
	if !have {
		return nil, fmt.Errorf("no earlier reading of diskstats")
	}
	r, _ := collectors.DiskRates(prev, s)
	return r, nil
}
