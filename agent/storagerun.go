package agent

import (
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// HostStorage is this host's storage placement from sysfs (the PCI tree
// read once), for the disk metrics and the storage checks.
func HostStorage(sysRoot string) (checks.StorageHost, error) {
	t, err := topology.Read(sysRoot)
	if err != nil {
		return checks.StorageHost{}, err
	}
	h := &checks.Host{SysRoot: sysRoot, Topo: t}
	return h.StorageHost(), nil
}

// DiskPlacer labels the disk metrics with each device's placement, looked
// up once per device name.
func DiskPlacer(h checks.StorageHost) func(name string) collectors.DiskPlace {
	var mu sync.Mutex
	cache := map[string]collectors.DiskPlace{}
	return func(name string) collectors.DiskPlace {
		mu.Lock()
		defer mu.Unlock()
		if p, ok := cache[name]; ok {
			return p
		}
		b := h.Place(name)
		p := collectors.DiskPlace{PCI: "unknown", NUMANode: "unknown", Switch: "unknown"}
		if b.BDF != "" {
			p.PCI, p.Switch = b.BDF, "none"
			if b.Switch != "" {
				p.Switch = b.Switch
			}
		}
		if b.NUMANode >= 0 {
			p.NUMANode = strconv.Itoa(b.NUMANode)
		}
		if len(cache) < 4*collectors.MaxDiskDevices {
			cache[name] = p
		}
		return p
	}
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

// storageFlows is s as the evaluator takes it: nil stays nil, not an
// interface holding a nil pointer.
func storageFlows(s *StorageReads) StorageFlows {
	if s == nil {
		return nil
	}
	return s
}
