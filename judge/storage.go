package judge

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
)

// StorageFlows ends a window of storage reads (StorageReads.Flows).
type StorageFlows interface {
	Flows() []checks.StorageFlow
}

// StorageDirectChecks is checklist item 6 for each process with storage
// reads in a window, h2d its host→device bytes in the same window; sides
// says where NUMA nodes sit from each other (nil: unknown).
func StorageDirectChecks(flows []checks.StorageFlow, h2d func(pid uint32) uint64, sides correlate.NodeSides) []checks.Check {
	var out []checks.Check
	for i := 0; i < len(flows); {
		j := i
		for j < len(flows) && flows[j].PID == flows[i].PID {
			j++
		}
		pid := flows[i].PID
		out = append(out, checks.StorageDirectCheck(fmt.Sprintf("pid %d", pid), flows[i:j], h2d(pid), sides))
		i = j
	}
	return out
}

// DiskWindow reads /proc/diskstats at the end of each evaluation window:
// each device's rates over the window, for storage-shared-uplink.
type DiskWindow struct {
	procRoot string
	host     checks.StorageHost
	log      *slog.Logger
	mu       sync.Mutex
	prev     collectors.DiskSample
	have     bool
}

// NewDiskWindow takes the first reading now.
func NewDiskWindow(procRoot string, host checks.StorageHost, log *slog.Logger) *DiskWindow {
	d := &DiskWindow{procRoot: procRoot, host: host, log: log}
	d.rates()
	return d
}

// rates reads diskstats and returns the rates since the previous reading.
func (d *DiskWindow) rates() ([]collectors.DiskRate, error) {
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

// UplinkCheck is checklist item 7 over the window that ends now, the
// GPUs' traffic from its lanes (the counters' where read, else the
// probes').
func (d *DiskWindow) UplinkCheck(lanes []LaneRate) checks.Check {
	rates, err := d.rates()
	if err != nil {
		return checks.Skipped(checks.HostScope, checks.CheckStorageUplink, "block device rates: %v", err)
	}
	gpu := checks.GPURates{}
	for _, l := range lanes {
		if gpu[l.GPU] == nil {
			gpu[l.GPU] = map[string]float64{}
		}
		b := l.Demand
		if l.HasMeasured {
			b = l.Measured
		}
		gpu[l.GPU][l.Direction] = b
	}
	return d.host.UplinkCheck(rates, gpu)
}

// storageChecks adds the storage leg's checks of a window: item 6 per
// process with storage reads (--trace-storage-reads), item 7 for the host.
func (e *Evaluator) storageChecks(win *checks.Window, v *Verdict) {
	if e.cfg.Storage != nil {
		h2d := func(pid uint32) uint64 { return win.LaneBytes(pid, checks.Inbound) }
		var sides correlate.NodeSides
		if e.cfg.NUMA != nil {
			sides = e.cfg.NUMA.NodeSide
		}
		for _, c := range StorageDirectChecks(e.cfg.Storage.Flows(), h2d, sides) {
			v.Checks = append(v.Checks, c)
			v.Findings = append(v.Findings, c.Findings...)
		}
	}
	if e.cfg.Disks != nil {
		c := e.cfg.Disks.UplinkCheck(v.Lanes)
		v.Checks = append(v.Checks, c)
		v.Findings = append(v.Findings, c.Findings...)
	}
}
