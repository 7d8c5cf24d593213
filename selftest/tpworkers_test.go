package selftest

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// A copy's GPU is compared where the truth names it, and only there.
func TestCompareGPU(t *testing.T) {
	truth := []TruthCall{{Seq: 1, Op: TruthCopy, API: "cudaMemcpyAsync", Bytes: 64, Direction: "H2D", ExpectHostMem: "pinned",
		Layer: -1, GPU: "f322:78:00.0"}}
	good := correlate.Transfer{API: "cudaMemcpyAsync", Bytes: 64, Direction: "H2D", HostMem: event.MemPinned, Layer: -1, GPU: "f322:78:00.0"}
	var r Result
	if Compare(&r, truth, []correlate.Transfer{good}); !r.OK() {
		t.Fatalf("exact record judged wrong: %+v", r)
	}
	for _, gpu := range []string{"", "f325:de:00.0"} {
		g := good
		g.GPU = gpu
		var r Result
		if Compare(&r, truth, []correlate.Transfer{g}); r.OK() || !strings.Contains(strings.Join(r.Problems, "\n"), "gpu want f322:78:00.0") {
			t.Errorf("gpu %q judged %+v", gpu, r)
		}
	}
	truth[0].GPU = "" // unstated: whatever the agent says
	if Compare(&r, truth, []correlate.Transfer{good}); !r.OK() {
		t.Errorf("unstated GPU compared: %+v", r)
	}
}

// The reference identities: the same name, the same address; a sysfs-form
// address in the reference domain range.
func TestRefBusID(t *testing.T) {
	a, b := refenv.BusID("st1-plain-tp0"), refenv.BusID("st1-plain-tp1")
	if a == b || a != refenv.BusID("st1-plain-tp0") || !strings.HasPrefix(a, "f") || len(a) != 12 || !strings.HasSuffix(a, ":00.0") {
		t.Errorf("BusID: %q, %q", a, b)
	}
}

// tp-workers alone, on both runtime builds (docs/design.md, "Placement"):
// worker processes that each see every reference GPU and choose their device
// per thread; every copy's GPU is the one its truth names — rank 0's ordinals
// from its own cudaDeviceGetPCIBusId answers, the others' from the DeviceMap.
func TestTPWorkers(t *testing.T) {
	testenv.RequireRoot(t)
	var out bytes.Buffer
	results, stats, err := Run(context.Background(), Config{RefDir: testenv.RefDir(t), Out: &out, Scenarios: []string{},
		RDMA: []string{}, TPWorkers: true})
	if err != nil {
		t.Fatal(err)
	}
	ok := PrintResults(&out, results, stats)
	t.Log("\n" + out.String())
	n := 0
	for _, r := range results {
		if r.Scenario != "tp-workers" {
			continue
		}
		n++
		if r.WantRecords < 7 || r.Got != r.WantRecords {
			t.Errorf("%s: %d records of %d", r.Runtime, r.Got, r.WantRecords)
		}
	}
	if n != 3*len(Runtimes) {
		t.Errorf("%d tp-workers results, want 3 ranks on %d builds", n, len(Runtimes))
	}
	if !ok {
		t.Fatal("selftest failed")
	}
}
