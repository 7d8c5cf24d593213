// Package exporters writes what the correlation engine produces to the
// outside world.
package exporters

import (
	"bufio"
	"io"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/lanewatch/lanewatch/correlate"
)

// JSONL writes one JSON object per transfer and line, in the schema of
// correlate.Transfer. It is a correlate.Sink. Output is buffered: call Flush
// (it may run on another goroutine, e.g. on a timer) to push it out.
type JSONL struct {
	mu  sync.Mutex
	w   *bufio.Writer
	buf []byte
	err error
}

// NewJSONL returns a JSONL writing to w.
func NewJSONL(w io.Writer) *JSONL {
	return &JSONL{w: bufio.NewWriterSize(w, 64<<10), buf: make([]byte, 0, 512)}
}

// Transfer encodes t as one line. A write error is kept and returned by
// Flush; lines after it are dropped.
func (j *JSONL) Transfer(t *correlate.Transfer) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.err != nil {
		return
	}
	j.buf = AppendTransfer(j.buf[:0], t)
	j.buf = append(j.buf, '\n')
	if _, err := j.w.Write(j.buf); err != nil {
		j.err = err
	}
}

// Flush writes out buffered lines and returns the first write error.
func (j *JSONL) Flush() error {
	if j == nil {
		return nil // no output: nothing encoded, nothing to flush
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.err == nil {
		j.err = j.w.Flush()
	}
	return j.err
}

// AppendTransfer appends t as a JSON object, the same as encoding/json
// would produce from its tags, without reflection or allocation.
func AppendTransfer(b []byte, t *correlate.Transfer) []byte {
	b = append(b, `{"pid":`...)
	b = strconv.AppendUint(b, uint64(t.PID), 10)
	b = append(b, `,"tid":`...)
	b = strconv.AppendUint(b, uint64(t.TID), 10)
	b = append(b, `,"stream":`...)
	b = strconv.AppendUint(b, t.Stream, 10)
	b = append(b, `,"api":`...)
	b = appendString(b, t.API)
	if t.DriverAPI != "" {
		b = append(b, `,"driver_api":`...)
		b = appendString(b, t.DriverAPI)
	}
	b = append(b, `,"op":`...)
	b = appendString(b, t.Op.String())
	if t.Mover != "" {
		b = append(b, `,"mover":`...)
		b = appendString(b, t.Mover)
	}
	if t.Kernel != "" {
		b = append(b, `,"kernel":`...)
		b = appendString(b, t.Kernel)
	}
	if t.KernelSymbol != "" {
		b = append(b, `,"kernel_symbol":`...)
		b = appendString(b, t.KernelSymbol)
	}
	b = append(b, `,"direction":`...)
	b = appendString(b, t.Direction)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendUint(b, t.Bytes, 10)
	if t.BytesUnknown {
		b = append(b, `,"bytes_unknown":true`...)
	}
	b = append(b, `,"src":`...)
	b = appendSide(b, &t.Src)
	b = append(b, `,"dst":`...)
	b = appendSide(b, &t.Dst)
	if t.HostMem != "" {
		b = append(b, `,"host_mem":`...)
		b = appendString(b, string(t.HostMem))
	}
	if t.HostMemReason != "" {
		b = append(b, `,"host_mem_reason":`...)
		b = appendString(b, t.HostMemReason)
	}
	if t.GPU != "" {
		b = append(b, `,"gpu":`...)
		b = appendString(b, t.GPU)
	}
	b = append(b, `,"submit_ns":`...)
	b = strconv.AppendUint(b, t.SubmitNs, 10)
	if t.CompleteNs != 0 {
		b = append(b, `,"complete_ns":`...)
		b = strconv.AppendUint(b, t.CompleteNs, 10)
	}
	b = append(b, `,"batch_index":`...)
	b = strconv.AppendInt(b, int64(t.BatchIndex), 10)
	if n, ok := t.NUMANode.Get(); ok { // omitzero: absent when unknown
		b = append(b, `,"numa_node":`...)
		b = strconv.AppendInt(b, int64(n), 10)
	}
	if !t.NUMAPages.IsZero() {
		b = append(b, `,"numa_pages":`...)
		b = t.NUMAPages.AppendJSON(b)
	}
	b = append(b, `,"layer":`...)
	b = strconv.AppendInt(b, int64(t.Layer), 10)
	if t.Inferred != "" {
		b = append(b, `,"inferred":`...)
		b = appendString(b, string(t.Inferred))
	}
	if t.CallNs != 0 {
		b = append(b, `,"call_ns":`...)
		b = strconv.AppendUint(b, t.CallNs, 10)
	}
	if t.QPNum != 0 {
		b = append(b, `,"qp_num":`...)
		b = strconv.AppendUint(b, uint64(t.QPNum), 10)
	}
	if t.WRID != 0 {
		b = append(b, `,"wr_id":`...)
		b = strconv.AppendUint(b, t.WRID, 10)
	}
	if t.Status != "" {
		b = append(b, `,"status":`...)
		b = appendString(b, t.Status)
	}
	if t.PeerPID != 0 {
		b = append(b, `,"peer_pid":`...)
		b = strconv.AppendUint(b, uint64(t.PeerPID), 10)
	}
	if t.Transport != "" {
		b = append(b, `,"transport":`...)
		b = appendString(b, t.Transport)
	}
	if t.TransportReason != "" {
		b = append(b, `,"transport_reason":`...)
		b = appendString(b, t.TransportReason)
	}
	if t.NetDevice != "" {
		b = append(b, `,"device":`...)
		b = appendString(b, t.NetDevice)
	}
	if t.RemoteAddr != 0 {
		b = append(b, `,"remote_addr":`...)
		b = strconv.AppendUint(b, t.RemoteAddr, 10)
	}
	if t.Endpoint != 0 {
		b = append(b, `,"endpoint":`...)
		b = strconv.AppendUint(b, t.Endpoint, 10)
	}
	if t.LatencyNs != 0 {
		b = append(b, `,"latency_ns":`...)
		b = strconv.AppendUint(b, t.LatencyNs, 10)
	}
	if t.Error != nil {
		b = append(b, `,"error":{"code":`...)
		b = strconv.AppendUint(b, uint64(t.Error.Code), 10)
		b = append(b, `,"name":`...)
		b = appendString(b, t.Error.Name)
		b = append(b, '}')
	}
	return append(b, '}')
}

func appendSide(b []byte, s *correlate.Side) []byte {
	b = append(b, `{"addr":`...)
	b = strconv.AppendUint(b, s.Addr, 10)
	b = append(b, `,"memory":`...)
	b = appendString(b, string(s.Mem))
	if s.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendString(b, s.Reason)
	}
	return append(b, '}')
}

const hex = "0123456789abcdef"

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD,
// as encoding/json does.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
