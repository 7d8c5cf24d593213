package event

import (
	"strings"
	"testing"
)

func TestOpNames(t *testing.T) {
	seen := map[string]Op{}
	for op := OpCopy; op <= OpFabricObject; op++ {
		name := op.String()
		if name == "unknown" || seen[name] != 0 {
			t.Errorf("op %d: name %q (also op %d)", op, name, seen[name])
		}
		seen[name] = op
	}
	for _, op := range []Op{0, OpFabricObject + 1, 255} {
		if op.String() != "unknown" {
			t.Errorf("op %d named %q", op, op.String())
		}
	}
	if !OpCopyBatch.IsCopy() || OpHostAlloc.IsCopy() || !OpStreamWaitEvent.IsCUDA() || OpLinkerUpdate.IsCUDA() ||
		!OpCtxSetCurrent.IsCUDA() || !OpDeviceBusID.IsContext() || OpPollCQ.IsCUDA() || OpInit.IsContext() ||
		!OpMemMap.IsCUDA() || !OpManagedAlloc.IsMemory() || OpDeviceBusID.IsMemory() || OpManagedAlloc.IsContext() ||
		!OpLaunch.IsCUDA() || !OpKernelFunction.IsKernel() || OpLaunch.IsMemory() || OpLaunch.IsCopy() || OpDmabufExport.IsKernel() || !OpCtxSync.IsCUDA() || OpCtxSync.IsKernel() ||
		OpQPModify.IsCUDA() || OpQPModify.IsGraph() || !OpGraphLaunch.IsCUDA() || !OpCaptureEnd.IsGraph() || OpGraphLaunch.IsKernel() ||
		OpGraphLaunch.IsCopy() || OpKernelCopy.IsCopy() || OpKernelCopy.IsCUDA() || OpKernelCopy.IsKernel() ||
		!OpXferPut.IsXfer() || !OpXferSend.IsXfer() || OpXferDone.IsXfer() || OpKernelCopy.IsXfer() || OpXferPut.IsCUDA() || OpXferPut.IsCopy() {
		t.Error("IsCopy/IsCUDA boundaries moved")
	}
}

// The names records carry (a transfer's "op", a truth line's): each reads
// back as its op; anything else is an error, never an op by default.
func TestParseOp(t *testing.T) {
	cases := []struct {
		in   string
		want Op
		err  bool
	}{
		{"copy", OpCopy, false},
		{"copy_batch", OpCopyBatch, false},
		{"post_send", OpPostSend, false},
		{"post_recv", OpPostRecv, false},
		{"kernel_copy", OpKernelCopy, false},
		{"device_pci_bus_id", OpDeviceBusID, false},
		{"capture_end", OpCaptureEnd, false},
		{"unknown", 0, true}, // String's name for no op: never read back as one
		{"", 0, true},
		{"Copy", 0, true},
		{"copy ", 0, true},
		{"post_send\x00", 0, true},
		{"completion", 0, true}, // the reference path's word for poll_cq
	}
	for _, c := range cases {
		got, err := ParseOp(c.in)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("ParseOp(%q) = %v, %v; want %v, error %v", c.in, got, err, c.want, c.err)
		}
	}
	for op := OpCopy; op <= OpFabricObject; op++ {
		b, _ := op.MarshalText()
		var back Op
		if err := back.UnmarshalText(b); err != nil || back != op {
			t.Errorf("op %d: %q read back as %v, %v", op, b, back, err)
		}
	}
	var o Op = OpCopy
	if err := o.UnmarshalText([]byte("nope")); err == nil || o != OpCopy || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("bad name: op %v, err %v", o, err)
	}
}

func FuzzParseOp(f *testing.F) {
	for _, s := range []string{"copy", "post_send", "kernel_copy", "unknown", "", "copy\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		op, err := ParseOp(name)
		switch {
		case err != nil && op != 0:
			t.Fatalf("%q: error %v with op %d", name, err, op)
		case err == nil && (op == 0 || op.String() != name):
			t.Fatalf("%q: read as op %d named %q", name, op, op.String())
		}
	})
}

func TestDrops(t *testing.T) {
	before := Drops{RingFull: 1, BatchTrunc: 2}
	now := Drops{RingFull: 4, NoEntry: 1, BatchTrunc: 2, ReadFault: 3, WRTrunc: 5}
	d := now.Sub(before)
	if d != (Drops{RingFull: 3, NoEntry: 1, ReadFault: 3, WRTrunc: 5}) || d.Total() != 12 || !d.Lossy() {
		t.Errorf("since: %+v total %d", d, d.Total())
	}
	if (Drops{BatchTrunc: 9, ReadFault: 1, WRTrunc: 1}).Lossy() {
		t.Error("truncation and read faults lose no whole event")
	}
	var sum uint64
	for _, r := range now.Reasons() {
		sum += r.Count
	}
	if sum != now.Total() || len(now.Reasons()) != 5 {
		t.Errorf("reasons %+v do not add up to %d", now.Reasons(), now.Total())
	}
}
