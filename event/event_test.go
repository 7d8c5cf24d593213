package event

import "testing"

func TestOpNames(t *testing.T) {
	seen := map[string]Op{}
	for op := OpCopy; op <= OpCaptureEnd; op++ {
		name := op.String()
		if name == "unknown" || seen[name] != 0 {
			t.Errorf("op %d: name %q (also op %d)", op, name, seen[name])
		}
		seen[name] = op
	}
	for _, op := range []Op{0, OpCaptureEnd + 1, 255} {
		if op.String() != "unknown" {
			t.Errorf("op %d named %q", op, op.String())
		}
	}
	if !OpCopyBatch.IsCopy() || OpHostAlloc.IsCopy() || !OpStreamWaitEvent.IsCUDA() || OpLinkerUpdate.IsCUDA() ||
		!OpCtxSetCurrent.IsCUDA() || !OpDeviceBusID.IsContext() || OpPollCQ.IsCUDA() || OpInit.IsContext() ||
		!OpMemMap.IsCUDA() || !OpManagedAlloc.IsMemory() || OpDeviceBusID.IsMemory() || OpManagedAlloc.IsContext() ||
		!OpLaunch.IsCUDA() || !OpKernelFunction.IsKernel() || OpLaunch.IsMemory() || OpLaunch.IsCopy() || OpDmabufExport.IsKernel() || !OpCtxSync.IsCUDA() || OpCtxSync.IsKernel() ||
		OpQPModify.IsCUDA() || OpQPModify.IsGraph() || !OpGraphLaunch.IsCUDA() || !OpCaptureEnd.IsGraph() || OpGraphLaunch.IsKernel() ||
		OpGraphLaunch.IsCopy() {
		t.Error("IsCopy/IsCUDA boundaries moved")
	}
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
