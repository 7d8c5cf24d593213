package correlate

import (
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

const (
	coLoad    = 0x10 // the load stream
	coCompute = 0x20 // the compute stream
	coGPU     = "0000:3b:00.0"
	coLayers  = 8
	us        = uint64(1000)
)

// hicacheWindow is HiCache's layer-wise load as the engine reports it
// (times in µs): every layer's H2D and its event record on the load
// stream up front, then per layer the compute stream waits for the event
// (cudaStreamWaitEvent) and launches the layer's kernel; one final
// synchronisation of the compute stream proves everything done at 1000.
// shape changes the loop: "sync" synchronizes the load stream before each
// layer's compute (the first wait lasts until the loads are done), "item"
// reads 4 bytes back with a blocking cudaMemcpy after each layer.
func hicacheWindow(shape string) ComputeInput {
	in := ComputeInput{PID: 7, KernelsProbed: true, End: 1000 * us}
	act := func(op event.Op, api string, stream, call, ret uint64) {
		in.Acts = append(in.Acts, Activity{PID: 7, TID: 7, Op: op, API: api, Stream: stream, GPU: coGPU, CallNs: call * us, ReturnNs: ret * us})
	}
	loadsDone := uint64(1000)
	if shape == "sync" {
		loadsDone = 500
	}
	for i := uint64(0); i < coLayers; i++ {
		in.Copies = append(in.Copies, CopySpan{TID: 7, Stream: coLoad, GPU: coGPU, API: "cudaMemcpyAsync", Direction: DirH2D,
			Bytes: 1 << 20, SubmitNs: (10 + i) * us, Complete: loadsDone * us, CallNs: us / 2})
		act(event.OpEventRecord, "cudaEventRecord", coLoad, 10+i, 10+i)
	}
	at := uint64(100)
	for i := uint64(0); i < coLayers; i++ {
		if shape == "sync" {
			ret := at + 1
			if i == 0 {
				ret = loadsDone
			}
			act(event.OpStreamSync, "cudaStreamSynchronize", coLoad, at, ret)
			at = ret + 1
		}
		in.Acts = append(in.Acts, Activity{PID: 7, TID: 7, Op: event.OpStreamWaitEvent, API: "cudaStreamWaitEvent", Stream: coCompute, GPU: coGPU,
			CallNs: at * us, ReturnNs: at * us, RecordNs: (10 + i) * us, RecordStream: coLoad})
		act(event.OpLaunch, "cudaLaunchKernel", coCompute, at, at+1)
		at += 10
		if shape == "item" {
			in.Copies = append(in.Copies, CopySpan{TID: 7, Stream: 0, GPU: coGPU, API: "cudaMemcpy", Direction: DirD2H,
				Bytes: 4, SubmitNs: at * us, Complete: (at + 2) * us, CallNs: 2 * us})
			at += 5
		}
	}
	act(event.OpStreamSync, "cudaStreamSynchronize", coCompute, at, 1000)
	return in
}

func rules(r ComputeReport) string {
	var names []string
	for _, f := range r.Findings {
		names = append(names, f.Rule)
	}
	return strings.Join(names, ",")
}

// The three reference shapes (refpath/kvpath/computeoverlap.c) judged from
// the engine's view: only the host wait on the load stream serializes, only
// the per-layer element read syncs in the loop.
func TestComputeOverlapShapes(t *testing.T) {
	for _, c := range []struct {
		shape, want string
		ratioMin    float64
		ratioMax    float64
	}{
		{"overlapped", "", 0.9, 0.92},
		{"sync", "serialized-load", 0, 0},
		{"item", "host-sync-in-loop", 0.9, 0.92},
	} {
		r := ComputeOverlap(hicacheWindow(c.shape))
		if got := rules(r); got != c.want {
			t.Errorf("%s: findings %q, want %q: %+v", c.shape, got, c.want, r.Findings)
		}
		if r.Unknown != "" || r.Launches != coLayers || len(r.Streams) != 1 {
			t.Fatalf("%s: report %+v", c.shape, r)
		}
		s := r.Streams[0]
		if s.Layers != coLayers || s.Copies != coLayers || s.Ratio() < c.ratioMin || s.Ratio() > c.ratioMax {
			t.Errorf("%s: load stream %+v ratio %.3f, want [%.2f, %.2f]", c.shape, s, s.Ratio(), c.ratioMin, c.ratioMax)
		}
		for _, f := range r.Findings {
			t.Logf("%s: %s: %s; %s", c.shape, f.Rule, f.Summary, strings.Join(f.Evidence, "; "))
		}
	}
	r := ComputeOverlap(hicacheWindow("sync"))
	// the first wait (100-500 µs) fell while the loads were in flight (to 500)
	if len(r.Waits) != 1 || r.Waits[0].Count != 9 || r.Waits[0].LoadingNs != 400*us {
		t.Errorf("sync: waits %+v", r.Waits)
	}
	ev := strings.Join(r.Findings[0].Evidence, "; ")
	for _, want := range []string{"8 layers", "cudaStreamSynchronize x8", "host wait time 0.407 ms"} {
		if !strings.Contains(ev, want) {
			t.Errorf("serialized-load evidence %q lacks %q", ev, want)
		}
	}
	r = ComputeOverlap(hicacheWindow("item"))
	ev = strings.Join(r.Findings[0].Evidence, "; ")
	for _, want := range []string{"9 blocking calls while one load of 8 layers on stream 0x10 was under way", "cudaMemcpy x8", "32 bytes"} {
		if !strings.Contains(ev, want) {
			t.Errorf("host-sync-in-loop evidence %q lacks %q", ev, want)
		}
	}
}

// Without launches compute overlap is unknown: serialized-load is never
// judged (not "no overlap"); host-sync-in-loop needs no launch.
func TestComputeOverlapUnknownWithoutLaunches(t *testing.T) {
	for _, shape := range []string{"sync", "item"} {
		in := hicacheWindow(shape)
		in.KernelsProbed = false
		r := ComputeOverlap(in)
		if !strings.Contains(r.Unknown, "not probed") {
			t.Errorf("%s: unknown %q", shape, r.Unknown)
		}
		if strings.Contains(rules(r), "serialized-load") {
			t.Errorf("%s: serialized-load judged without launches", shape)
		}
	}
	if got := rules(ComputeOverlap(func() ComputeInput { in := hicacheWindow("item"); in.KernelsProbed = false; return in }())); got != "host-sync-in-loop" {
		t.Errorf("item without launches: %q", got)
	}
	for _, shape := range []string{"sync", "item"} {
		in := hicacheWindow(shape)
		in.Dropped = 3
		if r := ComputeOverlap(in); !strings.Contains(r.Unknown, "3 copies, launches or waits past the window's cap") || len(r.Findings) != 0 {
			t.Errorf("%s with drops: %q %q", shape, r.Unknown, rules(r))
		}
	}
	in := hicacheWindow("sync")
	var acts []Activity
	for _, a := range in.Acts {
		if a.Op != event.OpLaunch {
			acts = append(acts, a)
		}
	}
	in.Acts = acts
	if r := ComputeOverlap(in); !strings.Contains(r.Unknown, "no compute kernel") || strings.Contains(rules(r), "serialized-load") {
		t.Errorf("no launch seen: %q %q", r.Unknown, rules(r))
	}
}

// A kernel's end is the earliest wait that proves its stream done after
// it was queued: a later stream synchronisation, an event recorded after
// it, the context; a wait that began before the launch returned proves
// nothing of it.
func TestKernelSpans(t *testing.T) {
	l := &Activity{Op: event.OpLaunch, Stream: 1, GPU: "g", CallNs: 100, ReturnNs: 110}
	for _, c := range []struct {
		name string
		wait Activity
		want uint64
	}{
		{"stream sync after", Activity{Op: event.OpStreamSync, Stream: 1, GPU: "g", CallNs: 120, ReturnNs: 300}, 300},
		{"stream sync before return", Activity{Op: event.OpStreamSync, Stream: 1, GPU: "g", CallNs: 105, ReturnNs: 200}, 900},
		{"other stream", Activity{Op: event.OpStreamSync, Stream: 2, GPU: "g", CallNs: 120, ReturnNs: 300}, 900},
		{"event recorded after", Activity{Op: event.OpEventSync, Stream: 1, GPU: "g", RecordNs: 115, CallNs: 400, ReturnNs: 450}, 450},
		{"event recorded before", Activity{Op: event.OpEventSync, Stream: 1, GPU: "g", RecordNs: 90, CallNs: 400, ReturnNs: 450}, 900},
		{"context", Activity{Op: event.OpCtxSync, GPU: "g", CallNs: 200, ReturnNs: 250}, 250},
		{"other GPU's context", Activity{Op: event.OpCtxSync, GPU: "h", CallNs: 200, ReturnNs: 250}, 900},
	} {
		spans := kernelSpans([]*Activity{l}, []*Activity{&c.wait}, 900)
		if got := spans[kernelKey{"g", 1}]; len(got) != 1 || got[0] != (Interval{100, c.want}) {
			t.Errorf("%s: %v, want [100 %d]", c.name, got, c.want)
		}
	}
}

func TestSpanAlgebra(t *testing.T) {
	u := union([]Interval{{5, 10}, {0, 3}, {2, 4}, {9, 12}, {20, 20}})
	if len(u) != 2 || u[0] != (Interval{0, 4}) || u[1] != (Interval{5, 12}) || measure(u) != 11 {
		t.Fatalf("union %v", u)
	}
	x := intersect(u, []Interval{{3, 6}, {11, 30}})
	if measure(x) != 3 {
		t.Fatalf("intersect %v", x)
	}
}

type activities []Activity

func (a *activities) Activity(x *Activity) { *a = append(*a, *x) }

// The engine reports every successful launch, host wait and event record
// with its stream (an event synchronisation: the stream and time of the
// record it waited for), and nothing of a failed call.
func TestEngineActivities(t *testing.T) {
	var got activities
	e := NewEngine(Config{Activity: &got})
	e.ObservedFromStart(testPID)
	launch := mk(t, "cuLaunchKernel", 1, 100, 110)
	launch.Stream, launch.Handle = 0x20, 0xf00
	failed := mk(t, "cuLaunchKernel", 1, 120, 130)
	failed.Stream, failed.Ret = 0x20, 1
	e.Handle(launch)
	e.Handle(failed)
	e.Handle(syncCall(t, "cuEventRecord", 1, 200, 201, 0x10, 0xe1))
	e.Handle(syncCall(t, "cuEventSynchronize", 1, 300, 400, 0, 0xe1))
	e.Handle(syncCall(t, "cuEventSynchronize", 1, 410, 420, 0, 0xe2)) // never recorded: stream unknown
	e.Handle(syncCall(t, "cuStreamSynchronize", 1, 500, 600, 0x20, 0))
	e.Handle(mk(t, "cuCtxSynchronize", 1, 700, 800))
	want := []Activity{
		{Op: event.OpLaunch, Stream: 0x20, CallNs: 100, ReturnNs: 110},
		{Op: event.OpEventRecord, Stream: 0x10, CallNs: 200, ReturnNs: 201},
		{Op: event.OpEventSync, Stream: 0x10, RecordNs: 200, CallNs: 300, ReturnNs: 400},
		{Op: event.OpEventSync, CallNs: 410, ReturnNs: 420},
		{Op: event.OpStreamSync, Stream: 0x20, CallNs: 500, ReturnNs: 600},
		{Op: event.OpCtxSync, CallNs: 700, ReturnNs: 800},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d activities, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		w.PID, w.TID, w.API = testPID, 1, g.API
		if g != w || g.API == "" {
			t.Errorf("activity %d: %+v, want %+v", i, g, w)
		}
	}
	if got[5].API != "cuCtxSynchronize" {
		t.Errorf("API %q", got[5].API)
	}
}

type discardActivities struct{}

func (discardActivities) Activity(*Activity) {}

// The engine's cost of reporting activities: launches and a stream
// synchronisation, with and without an Activity sink (`make bench`).
func BenchmarkEngineActivities(b *testing.B) {
	for _, c := range []struct {
		name string
		sink ActivitySink
	}{{"none", nil}, {"sink", discardActivities{}}} {
		b.Run(c.name, func(b *testing.B) {
			e := NewEngine(Config{Activity: c.sink})
			e.ObservedFromStart(testPID)
			launch := mk(b, "cuLaunchKernel", 1, 0, 0)
			launch.Stream, launch.Handle = 0x20, 0xf00
			sync := syncCall(b, "cuStreamSynchronize", 1, 0, 0, 0x20, 0)
			b.ReportAllocs()
			for i := range b.N {
				t := uint64(i) * 10
				launch.Time, launch.ReturnTime = t+1, t+2
				e.Handle(launch)
				if i%64 == 63 {
					sync.Time, sync.ReturnTime = t+3, t+4
					e.Handle(sync)
				}
			}
		})
	}
}

// decodeWindow is a healthy decode loop as the engine reports it (µs): 60
// steps of 1 ms, each 4 metadata H2D copies and 40 launches on the legacy
// stream and one synchronisation of it at the step's end, which proves the
// step's copies done; every 20 steps a prefix-cache hit loads 16 layers on
// the load stream, an event recorded after each, and the legacy stream
// waits for layer l's event before layer l's launches. itemPerLayer adds a
// 4-byte blocking D2H after each layer's launches in the loading steps.
func decodeWindow(itemPerLayer bool) ComputeInput {
	const steps, layers, launches = 60, 16, 40
	in := ComputeInput{PID: 7, KernelsProbed: true, End: (steps*1000 + 1000) * us}
	act := func(op event.Op, api string, stream, call, ret uint64) *Activity {
		in.Acts = append(in.Acts, Activity{PID: 7, TID: 7, Op: op, API: api, Stream: stream, GPU: coGPU, CallNs: call * us, ReturnNs: ret * us})
		return &in.Acts[len(in.Acts)-1]
	}
	for step := uint64(0); step < steps; step++ {
		t, loading := 100+step*1000, step%20 == 0
		if loading {
			for l := uint64(0); l < layers; l++ {
				in.Copies = append(in.Copies, CopySpan{TID: 7, Stream: coLoad, GPU: coGPU, API: "cudaMemcpyAsync", Direction: DirH2D,
					Bytes: 4 << 20, SubmitNs: (t + l) * us, Complete: (t + 900) * us, CallNs: us / 2})
				act(event.OpEventRecord, "cudaEventRecord", coLoad, t+l, t+l)
			}
		}
		for i := uint64(0); i < 4; i++ {
			in.Copies = append(in.Copies, CopySpan{TID: 7, Stream: 0, GPU: coGPU, API: "cudaMemcpyAsync", Direction: DirH2D,
				Bytes: 64 << i, SubmitNs: (t + 20 + i) * us, Complete: (t + 900) * us, CallNs: us / 2})
		}
		waited := uint64(layers)
		for k := uint64(0); k < launches; k++ {
			at := t + 30 + 10*k
			if l := k * layers / launches; loading && l != waited {
				if itemPerLayer && waited < layers {
					in.Copies = append(in.Copies, CopySpan{TID: 7, Stream: 0, GPU: coGPU, API: "cudaMemcpy", Direction: DirD2H,
						Bytes: 4, SubmitNs: (at - 2) * us, Complete: (at - 1) * us, CallNs: us})
				}
				a := act(event.OpStreamWaitEvent, "cudaStreamWaitEvent", 0, at-1, at-1)
				a.RecordNs, a.RecordStream = (t+l)*us, coLoad
				waited = l
			}
			act(event.OpLaunch, "cudaLaunchKernel", 0, at, at+1)
		}
		act(event.OpStreamSync, "cudaStreamSynchronize", 0, t+800, t+900)
	}
	return in
}

// host-sync-in-loop counts the waits of one load, not of the window (issue
// 20): the healthy decode loop's 60 step synchronisations over 3 loads of
// 16 layers (48 in the window) are one wait per load; an element read per
// layer while a load is under way is still a sync in the loop.
func TestHostSyncPerLoadEpisode(t *testing.T) {
	for _, c := range []struct {
		name string
		item bool
		want string
		ev   string
	}{
		{"decode loop with loads", false, "", ""},
		{"decode loop with an .item() per layer while loading", true, "host-sync-in-loop",
			"16 blocking calls while one load of 16 layers on stream 0x10 was under way (1.0 per layer): cudaMemcpy x15, cudaStreamSynchronize x1; 3 of the window's 3 layered loads"},
	} {
		in := decodeWindow(c.item)
		eps := loadEpisodes(in.Copies, func() (m []*Activity) {
			for i := range in.Acts {
				m = append(m, &in.Acts[i])
			}
			return m
		}())
		var loads int
		for _, ep := range eps {
			if ep.layers >= minLoopLayers {
				loads++
				if ep.layers != 16 {
					t.Errorf("%s: episode %+v, want 16 layers", c.name, ep)
				}
			}
		}
		if loads != 3 {
			t.Errorf("%s: %d layered loads, want 3: %+v", c.name, loads, eps)
		}
		r := ComputeOverlap(in)
		if got := rules(r); got != c.want {
			t.Errorf("%s: findings %q, want %q: %+v", c.name, got, c.want, r.Findings)
		}
		if c.ev != "" && len(r.Findings) == 1 && !strings.Contains(strings.Join(r.Findings[0].Evidence, "; "), c.ev) {
			t.Errorf("%s: evidence %q lacks %q", c.name, strings.Join(r.Findings[0].Evidence, "; "), c.ev)
		}
	}
}
