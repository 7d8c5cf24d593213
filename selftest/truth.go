package selftest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
)

// TruthCall is one line of the reference data path's ground truth: a CUDA
// call the scenario made and what an observer must report for it.
type TruthCall struct {
	Seq           int     `json:"seq"`
	Scenario      string  `json:"scenario"`
	PID           uint32  `json:"pid"`
	TID           uint32  `json:"tid"`
	API           string  `json:"api"`
	Op            TruthOp `json:"op"`
	Dst           uint64  `json:"dst"`
	Src           uint64  `json:"src"`
	Bytes         uint64  `json:"bytes"`
	Direction     string  `json:"direction"`
	Stream        uint64  `json:"stream"`
	HostMem       string  `json:"host_mem"`
	ExpectHostMem string  `json:"expect_host_mem"`
	ExpectSrcMem  string  `json:"expect_src_mem"` // what an observer must report of each side
	ExpectDstMem  string  `json:"expect_dst_mem"`
	BatchIndex    *int    `json:"batch_index"`
	Layer         int     `json:"layer"`         // the scenario's layer of a per-layer load, -1 none
	Result        int     `json:"result"`        // what the call returned: 0, or its error code
	TCallNs       uint64  `json:"t_call_ns"`     // CLOCK_MONOTONIC ns before the call
	TReturnNs     uint64  `json:"t_return_ns"`   // ... and after it returned
	EngineEndNs   uint64  `json:"engine_end_ns"` // when the copy engine finished the copy
	// EngineStartNs is when the engine began the copy or the kernel.
	EngineStartNs uint64 `json:"engine_start_ns"`
	// GPU is the PCI address of the GPU whose link a copy crossed, where the
	// scenario states it (tp-workers): the agent must report exactly it.
	GPU string `json:"gpu"`
	// Kernel is a kernel_copy's kernel (mangled), Mover who moves its bytes.
	Kernel string `json:"kernel"`
	Mover  string `json:"mover"`

	// RDMA (refpath/rdma): work requests and the completions the app polled.
	Role      string `json:"role"`
	Opcode    string `json:"opcode"`     // post_send: RDMA_WRITE, RDMA_WRITE_WITH_IMM, SEND, RDMA_READ, …
	WRID      uint64 `json:"wr_id"`      // post_send, post_recv, completion
	QPNum     uint32 `json:"qp_num"`     // post_send, post_recv, completion
	LocalMem  string `json:"local_mem"`  // device, host, none
	RemoteMem string `json:"remote_mem"` // post_send: device, host, unknown (rkey not ours), recv_buffer (a send)
	Signaled  bool   `json:"signaled"`
	Status    uint32 `json:"status"`          // completion: enum ibv_wc_status
	ByteLen   uint64 `json:"byte_len"`        // completion
	CQ        string `json:"cq"`              // completion: send or recv
	TPostNs   uint64 `json:"t_post_ns"`       // just before the post call
	TPostEnd  uint64 `json:"t_post_end_ns"`   // just after it returned
	TPollBeg  uint64 `json:"t_poll_start_ns"` // just before the poll_cq call that returned the completion
	TPollNs   uint64 `json:"t_poll_ns"`       // just after it
	// Ordering (selftest/ordering.go): where a QP connects (connect), the
	// first SGE of a post and the region of a reg_mr or dereg_mr.
	DestQPNum uint32 `json:"dest_qp_num"`
	DGID      string `json:"dgid"`
	LKey      uint32 `json:"lkey"`
	NumSGE    int    `json:"num_sge"`
	Addr      uint64 `json:"addr"`
	Length    uint64 `json:"length"`

	End     bool   `json:"end"`
	Calls   int    `json:"calls"`
	PeerPID uint32 `json:"peer_pid"` // end line of an RDMA role
}

// IsCopy reports whether the line is a transfer.
func (t TruthCall) IsCopy() bool { return t.Op.Agent().IsCopy() }

// ReadTruth parses a truth file. It fails, naming the line, on bad JSON and
// when the closing {"end":true} line is missing (a scenario that died).
func ReadTruth(r io.Reader, name string) ([]TruthCall, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	var calls []TruthCall
	line := 0
	ended := false
	for sc.Scan() {
		line++
		if len(sc.Bytes()) == 0 {
			continue
		}
		if ended {
			return nil, fmt.Errorf("%s:%d: data after the end line", name, line)
		}
		// The end line has its own fields (counts, rates): read it apart.
		var end struct {
			End   bool `json:"end"`
			Calls int  `json:"calls"`
		}
		if err := json.Unmarshal(sc.Bytes(), &end); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		if end.End {
			if end.Calls != len(calls) {
				return nil, fmt.Errorf("%s:%d: end line says %d calls, file has %d", name, line, end.Calls, len(calls))
			}
			ended = true
			continue
		}
		var t TruthCall
		if err := json.Unmarshal(sc.Bytes(), &t); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		if t.API == "" || t.Op == 0 {
			return nil, fmt.Errorf("%s:%d: call without api or op", name, line)
		}
		calls = append(calls, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", name, line+1, err)
	}
	if !ended {
		return nil, fmt.Errorf("%s: no end line after %d lines (scenario did not finish)", name, line)
	}
	return calls, nil
}
