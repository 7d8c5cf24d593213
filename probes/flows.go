package probes

import (
	"fmt"

	"github.com/lanewatch/lanewatch/event"
)

// Copy totals counted in BPF (bpf/lanewatch.h, struct lw_flow;
// docs/design.md, "Lane byte totals"): the return program of a CUDA
// driver copy that succeeded adds it to its flow before reserving its
// event, so these totals stay exact when the ring is full. Batch copies
// (cuMemcpyBatchAsync) are not counted: their sizes are an array read per
// entry at entry, before the call's result is known.

// Flow is the totals of one process's successful copies of one row on
// one stream in one stated direction.
type Flow struct {
	PID    uint32
	Row    uint16
	Stream uint64         // the stream argument as passed (0: a row without one, or the default stream)
	Kind   event.CopyKind // the direction the call stated (CopyDefault: its pointers decide)
	Calls  uint64
	Bytes  uint64
	Shed   uint64 // of Calls, those whose event was shed (Options.NoShedding)

	key lanewatchLwFlow
}

// countRow is what the return program counts of a row: argument slot + 1
// of its bytes, height, stream and direction, 0 for none; all 0 for a row
// not counted. Only driver rows are counted: a runtime row is attached to
// a process whose driver failed, where its copies fail, and counting both
// layers would count a copy twice.
func countRow(p *Probe) lanewatchLwCountRow {
	if p.Layer != event.LayerDriver || p.Program != ProgEntryReturn && p.Program != ProgCopy2D ||
		p.Op != event.OpCopy && p.Op != event.OpCopy2D && p.Op != event.OpCopyPeer {
		return lanewatchLwCountRow{}
	}
	slot := func(i int) uint8 {
		if i < 0 {
			return 0
		}
		return uint8(i + 1)
	}
	r := lanewatchLwCountRow{Bytes: slot(p.Args.Bytes), Height: slot(p.Args.Height), Stream: slot(p.Args.Stream)}
	if p.Kind == kindFromArg || p.Kind == kindFromTypes {
		r.Kind = slot(p.Args.Kind)
	}
	return r
}

// fillCountRows tells the return program which rows it counts.
func (p *Probes) fillCountRows() error {
	if len(Table) > int(lanewatchLwCountLW_COUNT_ROWS) {
		return fmt.Errorf("probe table has %d rows, count_rows holds %d", len(Table), lanewatchLwCountLW_COUNT_ROWS)
	}
	for i := range Table {
		r := countRow(&Table[i])
		if r.Bytes == 0 {
			continue
		}
		if err := p.objs.CountRows.Update(uint32(i), &r, 0); err != nil {
			return fmt.Errorf("count_rows[%d] (%s): %w", i, Table[i].Symbol, err)
		}
	}
	return nil
}

// statedKind is the direction a call of row p stated, given the value of
// its direction argument (a row with a fixed direction ignores it).
func statedKind(p *Probe, arg uint64) event.CopyKind {
	switch p.Kind {
	case kindFromArg:
		return event.CopyKind(arg)
	case kindFromTypes:
		return kindOfTypes(uint32(arg), uint32(arg>>32))
	}
	return p.Kind
}

// Flows reads every flow's totals. The BPF side keeps adding to them
// meanwhile: each is a lower bound of its flow's totals by the time it is
// returned.
func (p *Probes) Flows() ([]Flow, error) {
	var out []Flow
	seen := map[lanewatchLwFlow]bool{} // an iteration may see a key twice
	var k lanewatchLwFlow
	var v lanewatchLwFlowTotal
	it := p.objs.Flows.Iterate()
	for it.Next(&k, &v) {
		if seen[k] || int(k.Probe) >= len(Table) {
			continue
		}
		seen[k] = true
		out = append(out, Flow{PID: k.Pid, Row: k.Probe, Stream: k.Stream, Kind: statedKind(&Table[k.Probe], k.Kind),
			Calls: v.Calls, Bytes: v.Bytes, Shed: v.Shed, key: k})
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("read flow counters: %w", err)
	}
	return out, nil
}

// ForgetFlow deletes a flow the caller has folded into totals of its own:
// its process is gone, so nothing adds to it any more.
func (p *Probes) ForgetFlow(f Flow) error {
	if err := p.objs.Flows.Delete(&f.key); err != nil {
		return fmt.Errorf("forget flow of pid %d: %w", f.PID, err)
	}
	return nil
}

// FlowsFull is how many copies were not counted because the flow table
// was full.
func (p *Probes) FlowsFull() (uint64, error) {
	var n uint64
	if err := p.objs.FlowsFull.Get(&n); err != nil {
		return 0, fmt.Errorf("read flows_full: %w", err)
	}
	return n, nil
}
