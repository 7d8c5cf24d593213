package correlate_test

import (
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

// TestLayerFromEventRecords replays the real hicache-load recording and checks
// every copy's layer, derived from the event records on its load stream,
// against the layer the scenario wrote in its ground truth.
func TestLayerFromEventRecords(t *testing.T) {
	truth, want := recordedCopies(t)
	var got []correlate.Transfer
	e := correlate.NewEngine(correlate.Config{ExecObserved: true, Sink: correlate.SinkFunc(func(tr *correlate.Transfer) {
		if tr.PID == truth[0].PID {
			got = append(got, *tr)
		}
	})})
	var c event.Call
	for i, raw := range recording(t) {
		if err := probes.Decode(raw, &c); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		e.Handle(&c)
	}
	e.Flush()
	if len(got) != len(want) {
		t.Fatalf("%d transfers, truth has %d copies", len(got), len(want))
	}
	layers := map[int]bool{}
	for i := range got {
		if got[i].Layer != want[i].Layer {
			t.Errorf("copy %d: layer %d, truth %d", i, got[i].Layer, want[i].Layer)
		}
		layers[got[i].Layer] = true
	}
	if len(layers) < 2 {
		t.Errorf("recording shows %d distinct layers; expected a per-layer load", len(layers))
	}
}
