package checks

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
