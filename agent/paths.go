package agent

import (
	"fmt"
	"os"
	"sync"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/topology"
)

// Paths places transfers on the host's topology for their spans: the GPU a
// process uses, the PCIe segments from its host bridge down to that GPU and
// the narrowest of them. The host memory's NUMA node is per page and not
// known per transfer here, so the DRAM and socket segments are left out
// rather than guessed (diagnose locates pools with move_pages). A process
// whose GPU is unknown, or not in this host's sysfs, has no path.
type Paths struct {
	host  *topology.Host
	place func(pid uint32) checks.Placement

	mu    sync.Mutex
	cache map[uint32]checks.Placement // bounded: reset when full
}

// NewPaths reads the topology under sysRoot and places processes with
// place (HostPlacement, or the run configuration's).
func NewPaths(sysRoot string, place func(pid uint32) checks.Placement) (*Paths, error) {
	host, err := topology.Read(sysRoot)
	if err != nil {
		return nil, err
	}
	return &Paths{host: host, place: place, cache: map[uint32]checks.Placement{}}, nil
}

func (p *Paths) placement(pid uint32) checks.Placement {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl, ok := p.cache[pid]; ok {
		return pl
	}
	if len(p.cache) >= 4096 {
		p.cache = map[uint32]checks.Placement{}
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
	// The copy's own GPU (docs/design.md, "Placement"), else its process's.
	gpu := t.GPU
	if gpu == "" {
		gpu = p.placement(t.PID).GPU
	}
	f := p.host.Functions[gpu]
	if gpu == "" || f == nil {
		return exporters.Path{}, false
	}
	out := exporters.Path{GPU: gpu, NUMANode: -1}
	// The host end is the node of the pages the copy moved when they were
	// located (docs/design.md, "Pages, not registrations"); otherwise the
	// path is drawn from the GPU's own node and the node left unknown.
	node := max(f.NUMANode, 0)
	if n, ok := t.NUMANode.Get(); ok {
		node, out.NUMANode = n, n
	}
	var path topology.Path
	var err error
	if inbound {
		path, err = p.host.HostToDevice(node, gpu)
	} else {
		path, err = p.host.DeviceToHost(gpu, node)
	}
	if err != nil {
		return exporters.Path{}, false
	}
	for _, s := range path.Segments {
		if (s.Kind == topology.SegDRAM || s.Kind == topology.SegSocket) && out.NUMANode < 0 {
			continue // they depend on the pages' node, not located for this copy
		}
		out.Segments = append(out.Segments, s.Name+"("+s.Dir+")")
		if s.CapacityGBs > 0 && (out.Bottleneck == "" || s.CapacityGBs*1e9 < out.CapacityBps) {
			out.Bottleneck, out.CapacityBps = s.Name+"("+s.Dir+")", s.CapacityGBs*1e9
		}
	}
	return out, true
}

// PeerPaths reads a saved `nvidia-smi topo -m` of this host (--topo-m) and
// says how two of its GPUs exchange peer copies, NVLink or PCIe
// (topology.SMIMatrix.PeerPaths; EvaluatorConfig.GPUPath), the file's GPUs
// matched by index to sysfs's in PCI order, as nvidia-smi numbers them.
func PeerPaths(file, sysRoot string) (func(src, dst string) (string, bool), error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("--topo-m: %w", err)
	}
	defer f.Close()
	smi, err := topology.ParseNvidiaSMI(f, file)
	if err != nil {
		return nil, fmt.Errorf("--topo-m: %w", err)
	}
	host, err := topology.Read(sysRoot)
	if err != nil {
		return nil, fmt.Errorf("--topo-m: this host's GPUs: %w", err)
	}
	gpus := host.BDFs(topology.KindGPU)
	if n := len(smi.GPUs()); n != len(gpus) {
		return nil, fmt.Errorf("--topo-m %s: %d GPUs, sysfs %s has %d", file, n, sysRoot, len(gpus))
	}
	return smi.PeerPaths(gpus), nil
}
