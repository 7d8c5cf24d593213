package probes

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// The CUDA graph rows (docs/design.md, "CUDA graphs"): graph launches and
// the calls that begin and end a stream capture, each one entry+return
// pair with its stream. Every graph row is listed here.
func TestGraphRows(t *testing.T) {
	type row struct {
		op      event.Op
		layer   event.Layer
		runtime string
		nargs   int
	}
	want := map[string]row{
		"cuGraphLaunch":                    {event.OpGraphLaunch, event.LayerDriver, "cudaGraphLaunch", 2},
		"cuGraphLaunch_ptsz":               {event.OpGraphLaunch, event.LayerDriver, "cudaGraphLaunch_ptsz", 2},
		"cuStreamBeginCapture_v2":          {event.OpCaptureBegin, event.LayerDriver, "cudaStreamBeginCapture", 2},
		"cuStreamBeginCapture_v2_ptsz":     {event.OpCaptureBegin, event.LayerDriver, "cudaStreamBeginCapture_ptsz", 2},
		"cuStreamBeginCapture":             {event.OpCaptureBegin, event.LayerDriver, "", 1},
		"cuStreamBeginCapture_ptsz":        {event.OpCaptureBegin, event.LayerDriver, "", 1},
		"cuStreamBeginCaptureToGraph":      {event.OpCaptureBegin, event.LayerDriver, "cudaStreamBeginCaptureToGraph", 1},
		"cuStreamBeginCaptureToGraph_ptsz": {event.OpCaptureBegin, event.LayerDriver, "cudaStreamBeginCaptureToGraph_ptsz", 1},
		"cuStreamEndCapture":               {event.OpCaptureEnd, event.LayerDriver, "cudaStreamEndCapture", 1},
		"cuStreamEndCapture_ptsz":          {event.OpCaptureEnd, event.LayerDriver, "cudaStreamEndCapture_ptsz", 1},
		"cudaGraphLaunch":                  {event.OpGraphLaunch, event.LayerRuntime, "", 2},
		"cudaGraphLaunch_ptsz":             {event.OpGraphLaunch, event.LayerRuntime, "", 2},
	}
	seen := 0
	for _, p := range Table {
		if !p.Op.IsGraph() {
			continue
		}
		seen++
		w, ok := want[p.Symbol]
		if !ok {
			t.Errorf("graph row %s not checked here", p.Symbol)
			continue
		}
		if got := (row{p.Op, p.Layer, p.Runtime, p.NArgs}); got != w {
			t.Errorf("%s: %+v, want %+v", p.Symbol, got, w)
		}
		// One pair per call, the stream first; a launch names its graph.
		if p.Program != ProgEntryReturn || p.Args.Stream != map[bool]int{true: 1, false: 0}[p.Op == event.OpGraphLaunch] ||
			p.Op == event.OpGraphLaunch && p.Args.Handle != 0 || p.Out || p.OutHandle || p.Args.Dst != noArg || p.Args.Bytes != noArg {
			t.Errorf("%s: %+v", p.Symbol, p)
		}
		c, _ := Template(p.Symbol)
		if !c.Returns || c.PerThread != strings.HasSuffix(p.Symbol, "_ptsz") {
			t.Errorf("%s: returns %v, per-thread %v", p.Symbol, c.Returns, c.PerThread)
		}
	}
	if seen != len(want) {
		t.Errorf("%d graph rows, want %d", seen, len(want))
	}
}

// A graph launch decodes to its executable graph and stream; a capture's
// begin and end to their stream (the mode is the begin's flags).
func TestDecodeGraphCalls(t *testing.T) {
	var c event.Call
	if err := Decode(rawEvent(rowOf(t, "cuGraphLaunch"), [9]uint64{0x5555_a000, 0x5000}, 0, 0), &c); err != nil {
		t.Fatal(err)
	}
	if c.Op != event.OpGraphLaunch || c.Handle != 0x5555_a000 || c.Stream != 0x5000 || c.RuntimeAPI != "cudaGraphLaunch" ||
		c.PerThread || c.Failed() {
		t.Errorf("cuGraphLaunch: %+v", c)
	}
	if err := Decode(rawEvent(rowOf(t, "cuGraphLaunch_ptsz"), [9]uint64{0x5555_a000, 0}, 0, 900), &c); err != nil {
		t.Fatal(err)
	}
	if c.Op != event.OpGraphLaunch || c.Stream != 0 || !c.PerThread || !c.Failed() {
		t.Errorf("cuGraphLaunch_ptsz: %+v", c)
	}
	if err := Decode(rawEvent(rowOf(t, "cuStreamBeginCapture_v2"), [9]uint64{0x5000, 2}, 0, 0), &c); err != nil {
		t.Fatal(err)
	}
	if c.Op != event.OpCaptureBegin || c.Stream != 0x5000 || c.Flags != 2 || c.RuntimeAPI != "cudaStreamBeginCapture" {
		t.Errorf("cuStreamBeginCapture_v2: %+v", c)
	}
	if err := Decode(rawEvent(rowOf(t, "cuStreamEndCapture"), [9]uint64{0x5000, 0x7ffd0000}, 0, 901), &c); err != nil {
		t.Fatal(err)
	}
	if c.Op != event.OpCaptureEnd || c.Stream != 0x5000 || !c.Failed() {
		t.Errorf("cuStreamEndCapture: %+v", c)
	}
}

// On the reference driver under decode-graphs: one capture begun and
// ended on the compute stream, then one graph launch per step on it.
func TestGraphProbesOnReference(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	p, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	lib := filepath.Join(ref, "lib", "libcuda.so.1")
	want := []string{"cuGraphLaunch", "cuGraphLaunch_ptsz", "cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz",
		"cuStreamBeginCapture", "cuStreamBeginCapture_ptsz", "cuStreamEndCapture", "cuStreamEndCapture_ptsz"}
	syms, err := LookupSymbols(lib, want)
	if err != nil || len(syms) != len(want) {
		t.Fatalf("%s: %v %v", lib, syms, err)
	}
	if _, err := p.AttachFile(FileID{Inode: 1}, lib, syms, 0); err != nil {
		t.Fatal(err)
	}
	stop := collect(t, p)
	kv := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "decode-graphs", "--iterations", "16",
		"--truth", filepath.Join(t.TempDir(), "t.jsonl"))
	if out, err := kv.CombinedOutput(); err != nil {
		t.Fatalf("kvpath: %v\n%s", err, out)
	}
	got := stop()
	n := map[event.Op]int{}
	streams := map[uint64]bool{}
	for _, c := range got {
		if c.PID != uint32(kv.Process.Pid) || c.Failed() {
			continue
		}
		n[c.Op]++
		streams[c.Stream] = true
		if c.Op == event.OpGraphLaunch && (c.Handle == 0 || c.Symbol != "cuGraphLaunch" || c.RuntimeAPI != "cudaGraphLaunch") {
			t.Errorf("graph launch: %+v", c)
		}
	}
	if n[event.OpCaptureBegin] != 1 || n[event.OpCaptureEnd] != 1 || n[event.OpGraphLaunch] != 16 || len(streams) != 1 || streams[0] {
		t.Errorf("decode-graphs: %v on streams %v, want one capture and 16 graph launches on one stream", n, streams)
	}
}
