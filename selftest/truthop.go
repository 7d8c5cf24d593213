package selftest

import "github.com/lanewatch/lanewatch/event"

// TruthOp is what a truth line's call did, as the reference path names it:
// an op the agent names too (below 256: its event.Op, same name and
// number), or one of the reference path's own.
type TruthOp uint16

// The agent's ops the comparisons name.
const (
	TruthCopy        = TruthOp(event.OpCopy)
	TruthInit        = TruthOp(event.OpInit)
	TruthLaunch      = TruthOp(event.OpLaunch)
	TruthGraphLaunch = TruthOp(event.OpGraphLaunch)
	TruthStreamSync  = TruthOp(event.OpStreamSync)
	TruthEventRecord = TruthOp(event.OpEventRecord)
	TruthEventSync   = TruthOp(event.OpEventSync)
	TruthCtxSync     = TruthOp(event.OpCtxSync)
	TruthPostSend    = TruthOp(event.OpPostSend)
	TruthPostRecv    = TruthOp(event.OpPostRecv)
	TruthKernelCopy  = TruthOp(event.OpKernelCopy)
)

// The reference path's own ops: calls the agent names otherwise, does not
// probe, or sees only when their graph runs.
const (
	TruthCompletion     TruthOp = 256 + iota // a completion ibv_poll_cq returned (the agent: poll_cq)
	TruthConnect                             // ibv_modify_qp (qp_modify)
	TruthRegMR                               // ibv_reg_mr* (mr_register)
	TruthDeregMR                             // ibv_dereg_mr (mr_deregister)
	TruthMemset                              // not probed
	TruthEventQuery                          // not probed
	TruthSetDevice                           // not probed
	TruthCapturedCopy                        // a copy recorded into a graph, not run by its call
	TruthCapturedLaunch                      // a launch recorded into a graph
)

var truthOwn = [...]string{
	TruthCompletion - 256: "completion", TruthConnect - 256: "connect", TruthRegMR - 256: "reg_mr",
	TruthDeregMR - 256: "dereg_mr", TruthMemset - 256: "memset", TruthEventQuery - 256: "event_query",
	TruthSetDevice - 256: "set_device", TruthCapturedCopy - 256: "captured_copy",
	TruthCapturedLaunch - 256: "captured_launch",
}

// Agent is the agent's op of the same call, 0 for the reference path's own.
func (o TruthOp) Agent() event.Op {
	if o < 256 {
		return event.Op(o)
	}
	return 0
}

// String is the op's name as the truth writes it.
func (o TruthOp) String() string {
	if o < 256 {
		return event.Op(o).String()
	}
	if i := int(o - 256); i < len(truthOwn) {
		return truthOwn[i]
	}
	return "unknown"
}

// ParseTruthOp reads a truth line's op; a name neither the reference path
// nor the agent uses is an error.
func ParseTruthOp(name string) (TruthOp, error) {
	for i, n := range truthOwn {
		if n == name {
			return TruthOp(256 + i), nil
		}
	}
	op, err := event.ParseOp(name)
	return TruthOp(op), err
}

// MarshalText writes the op's name.
func (o TruthOp) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText reads the op's name (ParseTruthOp).
func (o *TruthOp) UnmarshalText(b []byte) error {
	op, err := ParseTruthOp(string(b))
	if err != nil {
		return err
	}
	*o = op
	return nil
}
