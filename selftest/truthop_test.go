package selftest

import (
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// The ops the reference path writes (refpath/kvpath, refpath/rdma): the
// agent's own names read as its ops, the reference path's own as theirs,
// anything else is an error.
func TestParseTruthOp(t *testing.T) {
	cases := []struct {
		in    string
		want  TruthOp
		agent event.Op
		err   bool
	}{
		{"copy", TruthCopy, event.OpCopy, false},
		{"copy_batch", TruthOp(event.OpCopyBatch), event.OpCopyBatch, false},
		{"post_send", TruthPostSend, event.OpPostSend, false},
		{"kernel_copy", TruthKernelCopy, event.OpKernelCopy, false},
		{"device_pci_bus_id", TruthOp(event.OpDeviceBusID), event.OpDeviceBusID, false},
		{"completion", TruthCompletion, 0, false},
		{"connect", TruthConnect, 0, false},
		{"reg_mr", TruthRegMR, 0, false},
		{"dereg_mr", TruthDeregMR, 0, false},
		{"memset", TruthMemset, 0, false},
		{"event_query", TruthEventQuery, 0, false},
		{"set_device", TruthSetDevice, 0, false},
		{"captured_copy", TruthCapturedCopy, 0, false},
		{"captured_launch", TruthCapturedLaunch, 0, false},
		{"unknown", 0, 0, true},
		{"", 0, 0, true},
		{"poll", 0, 0, true},
		{"Completion", 0, 0, true},
	}
	for _, c := range cases {
		got, err := ParseTruthOp(c.in)
		if got != c.want || got.Agent() != c.agent || (err != nil) != c.err {
			t.Errorf("ParseTruthOp(%q) = %v (agent %v), %v; want %v (agent %v), error %v", c.in, got, got.Agent(), err, c.want, c.agent, c.err)
		}
		if err == nil && got.String() != c.in {
			t.Errorf("%q reads back as %q", c.in, got)
		}
	}
	if s := (TruthCapturedLaunch + 1).String(); s != "unknown" {
		t.Errorf("an op past the reference path's own is named %q", s)
	}
}

func FuzzParseTruthOp(f *testing.F) {
	for _, s := range []string{"copy", "completion", "captured_launch", "kernel_copy", "unknown", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		op, err := ParseTruthOp(name)
		switch {
		case err != nil && op != 0:
			t.Fatalf("%q: error %v with op %d", name, err, op)
		case err == nil && (op == 0 || op.String() != name):
			t.Fatalf("%q: read as op %d named %q", name, op, op)
		}
	})
}
