package agent

import (
	"strconv"
	"sync"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/judge"
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

// storageFlows is s as the evaluator takes it: nil stays nil, not an
// interface holding a nil pointer.
func storageFlows(s *StorageReads) judge.StorageFlows {
	if s == nil {
		return nil
	}
	return s
}
