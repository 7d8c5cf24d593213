package checks

import (
	"fmt"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// Only a D2D copy between two known, different GPUs that succeeded is a
// peer copy; its path is what the topology says, else unknown.
func TestPeerBytes(t *testing.T) {
	const a, b, c = "0000:10:00.0", "0000:11:00.0", "0000:12:00.0"
	w := NewWindow()
	for _, tr := range []correlate.Transfer{
		{Direction: correlate.DirD2D, SrcGPU: a, GPU: b, Bytes: 100},
		{Direction: correlate.DirD2D, SrcGPU: a, GPU: b, Bytes: 50},
		{Direction: correlate.DirD2D, SrcGPU: b, GPU: c, Bytes: 7},
		{Direction: correlate.DirD2D, SrcGPU: "", GPU: b, Bytes: 1000},                                      // source unknown
		{Direction: correlate.DirD2D, SrcGPU: a, GPU: a, Bytes: 1000},                                       // within one GPU
		{Direction: correlate.DirH2D, SrcGPU: a, GPU: b, Bytes: 1000},                                       // not D2D
		{Direction: correlate.DirD2D, SrcGPU: a, GPU: c, Bytes: 1000, Error: &correlate.CallError{Code: 1}}, // failed: moved nothing
	} {
		tr.PID, tr.Op, tr.BatchIndex, tr.Layer = 1, event.OpCopyPeer, -1, -1
		w.Transfer(&tr)
	}
	path := func(src, dst string) (string, bool) {
		if src == a && dst == b {
			return PathNVLink, true
		}
		return "", false
	}
	for _, c := range []struct {
		name string
		path func(string, string) (string, bool)
		want string
	}{
		{"topology", path, "[{0000:10:00.0 0000:11:00.0 nvlink 150} {0000:11:00.0 0000:12:00.0 unknown 7}]"},
		{"none", nil, "[{0000:10:00.0 0000:11:00.0 unknown 150} {0000:11:00.0 0000:12:00.0 unknown 7}]"},
		{"odd answer", func(string, string) (string, bool) { return "pci", true }, "[{0000:10:00.0 0000:11:00.0 unknown 150} {0000:11:00.0 0000:12:00.0 unknown 7}]"},
	} {
		if got := fmt.Sprint(w.PeerBytes(c.path)); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	if got := w.Rotate().PeerBytes(nil); len(got) != 2 {
		t.Errorf("rotated window: %v", got)
	}
	if got := w.PeerBytes(nil); len(got) != 0 {
		t.Errorf("new window: %v", got)
	}
}
