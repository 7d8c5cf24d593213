package probes

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// Every driver copy row with a result is counted, with argument slots the
// return program can read; nothing else is.
func TestCountRows(t *testing.T) {
	if len(Table) > int(lanewatchLwCountLW_COUNT_ROWS) {
		t.Fatalf("probe table has %d rows, count_rows holds %d", len(Table), lanewatchLwCountLW_COUNT_ROWS)
	}
	counted := map[string]bool{}
	for i := range Table {
		p := &Table[i]
		r := countRow(p)
		copyRow := p.Layer == event.LayerDriver && p.Op.IsCopy() && p.Op != event.OpCopyBatch
		if copyRow != (r.Bytes != 0) {
			t.Errorf("%s: counted %v, want %v", p.Symbol, r.Bytes != 0, copyRow)
		}
		for _, slot := range []uint8{r.Bytes, r.Height, r.Stream, r.Kind} {
			if int(slot) > int(lanewatchLwEventArgsLen()) {
				t.Errorf("%s: slot %d past the %d arguments an event holds", p.Symbol, slot, lanewatchLwEventArgsLen())
			}
		}
		if r.Bytes != 0 {
			counted[p.Symbol] = true
		}
	}
	for _, want := range []string{"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoH_v2_ptds", "cuMemcpyAsync_ptsz", "cuMemcpy2DAsync_v2", "cuMemcpyPeerAsync"} {
		if !counted[want] {
			t.Errorf("%s is not counted", want)
		}
	}
	// A 2D row's bytes are width * height, its direction from the memory types.
	for i := range Table {
		if Table[i].Symbol == "cuMemcpy2DAsync_v2" {
			r := countRow(&Table[i])
			if r.Height == 0 || r.Kind == 0 || r.Stream == 0 {
				t.Errorf("cuMemcpy2DAsync_v2: %+v, want height, kind and stream", r)
			}
			if k := statedKind(&Table[i], 1|2<<32); k != event.CopyHostToDevice {
				t.Errorf("cuMemcpy2DAsync_v2 host→device types: %v", k)
			}
		}
	}
}

func lanewatchLwEventArgsLen() int { return len(lanewatchLwEvent{}.Args) }

// The BPF-side counters hold every successful copy of a run whose ring
// could hold almost none of its events (no reader, a one-page ring): the
// bytes equal what the reference driver says it moved over the lane.
// Without shedding the ring drops the rest; with it (the default) the
// copies past three quarters of the ring are shed, counted in their flow,
// and the ring never fills.
func TestFlowsCountWhatTheRingDrops(t *testing.T) {
	for _, shed := range []bool{false, true} {
		t.Run(map[bool]string{false: "drops", true: "sheds"}[shed], func(t *testing.T) { flowsCountAll(t, shed) })
	}
}

func flowsCountAll(t *testing.T, shed bool) {
	// One page without shedding: ~25 events fit. With it, a ring whose
	// last quarter holds more than the events two CPUs submit between
	// their fill checks (every 64 events each), so none is dropped.
	ring := uint32(4096)
	if shed {
		ring = 256 << 10
	}
	p, ref := probedRefCopy(t, Options{RingBytes: ring, NoShedding: !shed}, "lib/libcuda.so.1", "cuMemcpyHtoDAsync_v2")
	const iterations = 3000 // far more than either ring holds
	cmd := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "callbench", "--iterations", strconv.Itoa(iterations))
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(ref, "plain")+":"+filepath.Join(ref, "lib"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	var truth struct {
		Calls       int    `json:"calls"`
		LaneInBytes uint64 `json:"lane_in_bytes"`
	}
	if err := json.Unmarshal(out, &truth); err != nil || truth.Calls != iterations || truth.LaneInBytes == 0 {
		t.Fatalf("kvpath said %q (%v)", out, err)
	}
	d, err := p.Drops()
	if err != nil {
		t.Fatal(err)
	}
	if !shed && d.RingFull == 0 {
		t.Fatalf("no event dropped: the test proves nothing (%+v)", d)
	}
	if shed && d.RingFull != 0 {
		t.Errorf("%d events dropped while shedding: the ring filled", d.RingFull)
	}
	flows, err := p.Flows()
	if err != nil {
		t.Fatal(err)
	}
	var calls, bytes, shedCalls uint64
	for _, f := range flows {
		if f.PID != uint32(cmd.Process.Pid) {
			continue
		}
		if Table[f.Row].Symbol != "cuMemcpyHtoDAsync_v2" || f.Kind != event.CopyHostToDevice || f.Stream == 0 {
			t.Errorf("flow %+v: want cuMemcpyHtoDAsync_v2, H2D, on the scenario's stream", f)
		}
		calls += f.Calls
		bytes += f.Bytes
		shedCalls += f.Shed
	}
	// Shedding starts at the first fill check past three quarters of the
	// ring unread: the copies whose events went in are those that fit
	// below it (each a record of the event and its 8-byte header) and at
	// most the 64 per CPU submitted before a check.
	fit := uint64(ring-ring/4)/uint64(EventSize+8) + 1 + 64*uint64(runtime.NumCPU())
	switch {
	case !shed && shedCalls != 0:
		t.Errorf("%d copies shed with shedding off", shedCalls)
	case shed && (shedCalls == 0 || calls-shedCalls > fit):
		t.Errorf("%d of %d copies shed: want all but the %d or fewer that fit in three quarters of the ring and before a check", shedCalls, calls, fit)
	}
	if calls != iterations+1 || bytes != truth.LaneInBytes { // and the warm-up copy
		t.Errorf("counted %d copies, %d bytes; the application made %d copies, its driver moved %d bytes in (%d events dropped)",
			calls, bytes, iterations+1, truth.LaneInBytes, d.RingFull)
	}
	t.Logf("%d copies, %d bytes counted; %d events dropped, %d shed", calls, bytes, d.RingFull, shedCalls)
	full, err := p.FlowsFull()
	if err != nil || full != 0 {
		t.Errorf("flows_full %d, err %v", full, err)
	}
	if len(flows) > 0 {
		if err := p.ForgetFlow(flows[0]); err != nil {
			t.Error(err)
		}
		if after, err := p.Flows(); err != nil || len(after) != len(flows)-1 {
			t.Errorf("after forgetting one of %d flows: %d (%v)", len(flows), len(after), err)
		}
	}
}
