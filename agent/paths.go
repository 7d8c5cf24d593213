package agent

import (
	"sync"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/topology"
)

// Paths places transfers on the host's topology for their spans: the GPU a
// process uses, the PCIe segments from its host bridge down to that GPU and
// the narrowest of them. The host memory's NUMA node is per page and not
// known per transfer here, so the DRAM and socket segments are left out
// rather than guessed (diagnose locates pools with move_pages).
type Paths struct {
	host  *topology.Host
	place func(pid uint32) Placement

	mu    sync.Mutex
	cache map[uint32]Placement // bounded: reset when full
}

// NewPaths reads the topology under sysRoot.
func NewPaths(procRoot, sysRoot string) (*Paths, error) {
	place, err := HostPlacement(procRoot, sysRoot)
	if err != nil {
		return nil, err
	}
	host, err := topology.Read(sysRoot)
	if err != nil {
		return nil, err
	}
	return &Paths{host: host, place: place, cache: map[uint32]Placement{}}, nil
}

func (p *Paths) placement(pid uint32) Placement {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl, ok := p.cache[pid]; ok {
		return pl
	}
	if len(p.cache) >= 4096 {
		p.cache = map[uint32]Placement{}
	}
	pl := p.place(pid)
	p.cache[pid] = pl
	return pl
}

// Path implements exporters.PathResolver for host↔device copies.
func (p *Paths) Path(t *correlate.Transfer) (exporters.Path, bool) {
	inbound := t.Direction == correlate.DirH2D
	if !inbound && t.Direction != correlate.DirD2H {
		return exporters.Path{}, false
	}
	pl := p.placement(t.PID)
	if pl.GPU == "" {
		return exporters.Path{}, false
	}
	out := exporters.Path{GPU: pl.GPU, NUMANode: -1}
	f := p.host.Functions[pl.GPU]
	if f == nil { // the reference data path: one lane per direction
		lane, gbs := "lane:"+pl.GPU+"(inbound)", pl.InboundGBs
		if !inbound {
			lane, gbs = "lane:"+pl.GPU+"(outbound)", pl.OutboundGBs
		}
		out.Segments, out.Bottleneck, out.CapacityBps = []string{lane}, lane, gbs*1e9
		return out, true
	}
	node := max(f.NUMANode, 0)
	var path topology.Path
	var err error
	if inbound {
		path, err = p.host.HostToDevice(node, pl.GPU)
	} else {
		path, err = p.host.DeviceToHost(pl.GPU, node)
	}
	if err != nil {
		return exporters.Path{}, false
	}
	narrowest := -1
	for _, s := range path.Segments {
		if s.Kind == topology.SegDRAM || s.Kind == topology.SegSocket {
			continue
		}
		out.Segments = append(out.Segments, s.Name+"("+s.Dir+")")
		if s.CapacityGBs > 0 && (narrowest < 0 || s.CapacityGBs*1e9 < out.CapacityBps) {
			narrowest, out.Bottleneck, out.CapacityBps = len(out.Segments)-1, s.Name+"("+s.Dir+")", s.CapacityGBs*1e9
		}
	}
	return out, true
}
