package otlpbridge

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestIvTreeMatchesScan: after random inserts and removes (ties in start
// included), stab finds exactly the spans a scan finds, latest start first
// (on a tie the latest to arrive), and stops when told.
func TestIvTreeMatchesScan(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var tr ivTree
	var held []*entry
	for step := range 20_000 {
		if len(held) > 0 && r.IntN(3) == 0 {
			i := r.IntN(len(held))
			if !tr.remove(held[i]) {
				t.Fatalf("step %d: a held span was not found to remove", step)
			}
			if tr.remove(held[i]) {
				t.Fatalf("step %d: a span was removed twice", step)
			}
			held = slices.Delete(held, i, i+1)
		} else {
			start := r.Int64N(1000)
			e := &entry{start: start, end: start + r.Int64N(100), seq: uint64(step + 1)}
			tr.insert(e)
			held = append(held, e)
		}
		if tr.n != len(held) {
			t.Fatalf("step %d: %d held, tree says %d", step, len(held), tr.n)
		}
		if step%50 != 0 {
			continue
		}
		at := r.Int64N(1100)
		var want []*entry
		for _, e := range held {
			if e.start <= at && at <= e.end {
				want = append(want, e)
			}
		}
		slices.SortFunc(want, func(a, b *entry) int {
			if before(a, b) {
				return 1
			}
			return -1
		})
		var got []*entry
		var visits uint64
		tr.stab(at, &visits, func(e *entry) bool { got = append(got, e); return true })
		if !slices.Equal(got, want) {
			t.Fatalf("step %d, at %d: stab found %d spans, a scan %d (or in another order)", step, at, len(got), len(want))
		}
		if len(want) > 2 {
			got = got[:0]
			if tr.stab(at, &visits, func(e *entry) bool { got = append(got, e); return len(got) < 2 }) || len(got) != 2 {
				t.Fatalf("step %d: stab did not stop when told (%d found)", step, len(got))
			}
		}
	}
}
