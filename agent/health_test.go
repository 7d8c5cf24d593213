package agent

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

// fakeHealth is a made-up agent state for readiness.
type fakeHealth struct {
	attached bool
	round    time.Time
	unprobed []UnprobedLibrary
	events   uint64
	drops    event.Drops
	bound    uint64
	untraced []UntracedProcess
}

func (f *fakeHealth) Attached() bool                        { return f.attached }
func (f *fakeHealth) ReaderLastRound() time.Time            { return f.round }
func (f *fakeHealth) Unprobed() []UnprobedLibrary           { return f.unprobed }
func (f *fakeHealth) EventsAndDrops() (uint64, event.Drops) { return f.events, f.drops }
func (f *fakeHealth) HoldBoundHits() uint64                 { return f.bound }
func (f *fakeHealth) Untraced() []UntracedProcess           { return f.untraced }

func TestReadiness(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ok := func() *fakeHealth { return &fakeHealth{attached: true, round: t0, events: 1000} }
	for _, tc := range []struct {
		name string
		src  func() *fakeHealth // nil: the tracer is not loaded
		at   time.Duration      // the check's time past t0
		want []string           // each reason holds its substring, in order; none: ready
	}{
		{"not loaded", nil, 0, []string{"starting: the tracer is not loaded yet"}},
		{"first scan", func() *fakeHealth { f := ok(); f.attached = false; return f }, 0, []string{"starting: the first scan"}},
		{"ready", ok, time.Second, nil},
		{"reader never ran", func() *fakeHealth { f := ok(); f.round = time.Time{}; return f }, 0, []string{"ring reader stopped: no round since the start"}},
		{"reader stale", ok, 11 * time.Second, []string{"ring reader stopped: no round since 2026-01-02T03:04:05Z"}},
		{"reader recent", ok, 9 * time.Second, nil},
		{"unprobed", func() *fakeHealth {
			f := ok()
			f.unprobed = []UnprobedLibrary{{Path: "/usr/lib/libcuda.so.1", PID: 42, Reason: "open /proc/42/map_files: permission denied", Failures: 3, Since: t0}}
			return f
		}, 0, []string{"library without probes: /usr/lib/libcuda.so.1 (pid 42, 3 failed tries since 2026-01-02T03:04:05Z): open /proc/42/map_files: permission denied"}},
		{"drops over", func() *fakeHealth { f := ok(); f.drops = event.Drops{RingFull: 20}; return f }, 0,
			[]string{"probe events dropped or damaged: 20 of 1020 since the last check (more than 1%; totals since the start: ring_full=20)"}},
		{"hold bound hit", func() *fakeHealth { f := ok(); f.bound = 2; return f }, 0,
			[]string{"processes held at their loader notification went on before their new CUDA library was probed (the hold's bound): 2 since the last check, 2 since the start"}},
		{"drops under", func() *fakeHealth { f := ok(); f.drops = event.Drops{RingFull: 5, ReadFault: 4}; return f }, 0, nil},
		{"everything", func() *fakeHealth {
			f := ok()
			f.round = time.Time{}
			f.unprobed = []UnprobedLibrary{{Path: "a"}, {Path: "b"}}
			f.drops = event.Drops{NoEntry: 1000}
			return f
		}, 0, []string{"ring reader stopped", "library without probes: a ", "library without probes: b ", "lost_return=1000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &readiness{maxDropRatio: DefaultReadyMaxDropRatio, now: func() time.Time { return t0.Add(tc.at) }}
			var got []string
			if tc.src == nil {
				got = r.notReady(nil)
			} else {
				got = r.notReady(tc.src())
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d reasons %q, want %d %q", len(got), got, len(tc.want), tc.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("reason %d %q does not hold %q", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// Drops are judged over the interval since the previous check: a burst
// makes the agent unready until a check a second or more later sees none.
func TestReadinessDropWindow(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f := &fakeHealth{attached: true, events: 1000}
	r := &readiness{maxDropRatio: 0.01, now: func() time.Time { return now }}
	check := func(events, drops uint64, wantReady bool) {
		t.Helper()
		f.round = now
		f.events, f.drops = events, event.Drops{RingFull: drops}
		why := r.notReady(f)
		if (len(why) == 0) != wantReady {
			t.Fatalf("at %s with %d events, %d drops: ready %v, want %v (%q)", now.Format(time.TimeOnly), events, drops, len(why) == 0, wantReady, why)
		}
	}
	check(1000, 0, true)
	now = now.Add(5 * time.Second)
	check(2000, 500, false) // 500 of 1500 since the last check
	now = now.Add(500 * time.Millisecond)
	check(2000, 500, false) // within a second: the last verdict stands
	now = now.Add(time.Second)
	check(3000, 505, true) // 5 of 1005
	now = now.Add(time.Second)
	check(3000, 505, true) // nothing happened
}

func TestReadyHandlers(t *testing.T) {
	w := httptest.NewRecorder()
	serveAlive(w)
	if w.Code != 200 || w.Body.String() != "ok\n" {
		t.Errorf("/healthz: %d %q", w.Code, w.Body.String())
	}
	now := time.Now()
	r := &readiness{maxDropRatio: 0.01, now: func() time.Time { return now }}
	w = httptest.NewRecorder()
	r.serveReady(w, &fakeHealth{attached: true, round: now})
	if w.Code != 200 || w.Body.String() != "ready\n" {
		t.Errorf("/readyz ready: %d %q", w.Code, w.Body.String())
	}
	w = httptest.NewRecorder()
	r.serveReady(w, &fakeHealth{attached: false})
	if want := "not ready:\n- starting: the first scan of every process is still attaching probes\n"; w.Code != 503 || w.Body.String() != want {
		t.Errorf("/readyz starting: %d %q, want 503 %q", w.Code, w.Body.String(), want)
	}
	// A process the agent cannot see into is said in every answer, ready
	// or not, and does not make the agent unready.
	ibgda := UntracedProcess{PID: 7, Objects: []probes.Untraced{
		{Kind: probes.UntracedNVSHMEM, Path: "/opt/nvshmem/lib/libnvshmem_host.so.3", Sign: "named libnvshmem_host.so.3"},
		{Kind: probes.UntracedGPUInitiated, Path: "/opt/nvshmem/lib/nvshmem_transport_ibgda.so.3", Sign: "named nvshmem_transport_ibgda.so.3"}}}
	const notTraced = "not traced (their transfers through these objects are not seen, and no check passes them; docs/design.md, \"Transfer libraries\"):\n" +
		"- pid 7: /opt/nvshmem/lib/libnvshmem_host.so.3 (named libnvshmem_host.so.3): NVSHMEM: GPU kernels move data by loads and stores to peer GPUs' memory and hand remote puts to a transport, with no copy call to probe; " +
		"/opt/nvshmem/lib/nvshmem_transport_ibgda.so.3 (named nvshmem_transport_ibgda.so.3): GPU-initiated networking: GPU kernels post the RDMA work requests themselves, with no CPU call to probe\n"
	w = httptest.NewRecorder()
	r.serveReady(w, &fakeHealth{attached: true, round: now, untraced: []UntracedProcess{ibgda}})
	if want := "ready\n" + notTraced; w.Code != 200 || w.Body.String() != want {
		t.Errorf("/readyz ready, one process not traced: %d %q, want 200 %q", w.Code, w.Body.String(), want)
	}
	w = httptest.NewRecorder()
	r.serveReady(w, &fakeHealth{attached: false, untraced: []UntracedProcess{ibgda}})
	if want := "not ready:\n- starting: the first scan of every process is still attaching probes\n" + notTraced; w.Code != 503 || w.Body.String() != want {
		t.Errorf("/readyz starting, one process not traced: %d %q, want 503 %q", w.Code, w.Body.String(), want)
	}
}
