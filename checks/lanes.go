package checks

import (
	"cmp"
	"slices"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// LinkBytes is what moved over each direction of each GPU link during the
// window, keyed by {GPU, Inbound|Outbound}: every flow on the link of the
// GPU its transfers name (Transfer.GPU, docs/design.md "Which GPU"), else
// of the owner's placement; a flow whose GPU is unknown either way is left
// out, never put on a GPU. Timed and untimed transfers both count.
func (w *Window) LinkBytes(place func(uint32) Placement) map[[2]string]uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[[2]string]uint64{}
	placed := map[uint32]string{}
	for k, f := range w.links {
		gpu := k.gpu
		if gpu == "" {
			g, ok := placed[k.owner]
			if !ok {
				g = place(k.owner).GPU
				placed[k.owner] = g
			}
			gpu = g
		}
		if gpu == "" {
			continue
		}
		n := f.UntimedBytes
		for _, s := range f.Spans {
			n += s.Bytes
		}
		out[[2]string{gpu, k.dir}] += n
	}
	return out
}

// Paths a peer copy between two GPUs takes (PeerFlow.Path).
const (
	PathNVLink  = topology.PeerNVLink // over NVLink: on neither GPU's PCIe link
	PathPCIe    = topology.PeerPCIe   // out of the source's PCIe link, into the destination's
	PathUnknown = "unknown"           // the topology does not say: on no lane, never guessed
)

// PeerFlow is what the window's peer copies (D2D between two GPUs) moved
// from Src to Dst, and the path the topology says they took.
type PeerFlow struct {
	Src, Dst string // PCI addresses
	Path     string // PathNVLink, PathPCIe or PathUnknown
	Bytes    uint64
}

// linkPeer counts a peer copy between two known GPUs. Called with w.mu held.
func (w *Window) linkPeer(t *correlate.Transfer) {
	if t.Direction != correlate.DirD2D || t.SrcGPU == "" || t.GPU == "" || t.SrcGPU == t.GPU {
		return
	}
	if w.peers == nil {
		w.peers = map[[2]string]uint64{}
	}
	w.peers[[2]string{t.SrcGPU, t.GPU}] += t.Bytes
}

// PeerBytes is the window's peer copies per pair of GPUs, sorted, each with
// its path: path(src, dst) answers PathNVLink or PathPCIe, ok false when
// the topology does not know the pair (nil: nothing known).
func (w *Window) PeerBytes(path func(src, dst string) (string, bool)) []PeerFlow {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]PeerFlow, 0, len(w.peers))
	for k, b := range w.peers {
		f := PeerFlow{Src: k[0], Dst: k[1], Path: PathUnknown, Bytes: b}
		if path != nil {
			if p, ok := path(k[0], k[1]); ok && (p == PathNVLink || p == PathPCIe) {
				f.Path = p
			}
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b PeerFlow) int {
		return cmp.Or(cmp.Compare(a.Src, b.Src), cmp.Compare(a.Dst, b.Dst))
	})
	return out
}
