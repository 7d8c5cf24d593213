package exporters

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

var samples = []correlate.Transfer{
	{
		PID: 4242, TID: 4250, Stream: 0x5500_0000_1000, API: "cudaMemcpyAsync_ptsz", DriverAPI: "cuMemcpyHtoDAsync_v2_ptsz",
		Op: event.OpCopy, Mover: correlate.MoverCopyEngine, Direction: correlate.DirH2D, Bytes: 1 << 20,
		Src:     correlate.Side{Addr: 0x7f00_0000_0000, Mem: event.MemPinned},
		Dst:     correlate.Side{Addr: 0x7e00_0000_0000, Mem: event.MemDevice},
		HostMem: event.MemPinned, GPU: "0000:3b:00.0", SubmitNs: 123456789012345, CompleteNs: 123456789112345, BatchIndex: -1, Layer: 3,
		NUMANode: correlate.NodeOf(1), NUMAPages: correlate.PagesOn(1, 0, 1),
		Inferred: event.MemPinned, CallNs: 4100, QPNum: 77, WRID: 1 << 40, Status: "REM_ACCESS_ERR", PeerPID: 4242,
	},
	{ // every omitempty field empty, a batch entry
		PID: 1, TID: 1, API: "cudaMemcpyBatchAsync", Op: event.OpCopyBatch, Direction: correlate.DirUnknown,
		Src: correlate.Side{Mem: event.MemUnknown}, Dst: correlate.Side{Addr: ^uint64(0), Mem: event.MemUnknown},
		BatchIndex: 63,
	},
	{ // pages on node 0 (not omitted: 0 is a node), one page sampled
		PID: 2, TID: 2, API: "cuMemcpyDtoH_v2", Op: event.OpCopy, Direction: correlate.DirD2H, Bytes: 4096, BatchIndex: -1, Layer: -1,
		NUMANode: correlate.NodeOf(0), NUMAPages: correlate.PagesOn(0),
	},
	{ // a KV-transfer kernel's launch: moved by SMs, bytes unknown
		PID: 3, TID: 3, Stream: 0x5000, API: "cudaLaunchKernel", DriverAPI: "cuLaunchKernel", Op: event.OpKernelCopy,
		Mover: correlate.MoverSM, Kernel: "transfer_kernel_impl", KernelSymbol: "_Z20transfer_kernel_implIXadL_Z20get_global_offset_lfIKcEPT_S3_PKmllllEEXadL_ZS0_IcES3_S3_S5_llllEELb0EEvPKvPvS7_S8_PKlSA_lllllllS5_S5_S5_S5_",
		Direction: correlate.DirUnknown, BytesUnknown: true, Src: correlate.Side{Mem: event.MemUnknown}, Dst: correlate.Side{Mem: event.MemUnknown},
		GPU: "0000:3b:00.0", SubmitNs: 5, CompleteNs: 9, BatchIndex: -1, Layer: 2,
	},
	{ // memory the agent cannot place, and why
		PID: 4, TID: 4, API: "cudaMemcpyAsync", Op: event.OpCopy, Mover: correlate.MoverCopyEngine, Direction: correlate.DirH2D, Bytes: 64,
		Src:     correlate.Side{Addr: 0x7f00_0000_0000, Mem: event.MemUnknown, Reason: correlate.ReasonEventsLost},
		Dst:     correlate.Side{Addr: 0x7e00_0000_0000, Mem: event.MemDevice},
		HostMem: event.MemUnknown, HostMemReason: correlate.ReasonEventsLost, BatchIndex: -1, Layer: -1,
	},
	{ // a libfabric send with its provider, domain and completion
		PID: 5, TID: 5, API: "fi_send", Op: event.OpXferSend, Mover: correlate.MoverNIC, Direction: correlate.DirSend, Bytes: 65536,
		Src: correlate.Side{Addr: 0x7f00_0000_0000, Mem: event.MemPageable}, Dst: correlate.Side{Mem: event.MemUnknown},
		SubmitNs: 100, CompleteNs: 190, BatchIndex: -1, Layer: -1, Status: "success",
		Transport: "tcp;ofi_rxm", NetDevice: "lo", RemoteAddr: 0x1000, Endpoint: 0x5555_0000_2000, LatencyNs: 90,
	},
	{ // a transport the agent could not see, and why
		PID: 6, TID: 6, API: "fi_write", Op: event.OpXferPut, Direction: correlate.DirRDMAWrite, Bytes: 1,
		Src: correlate.Side{Mem: event.MemUnknown}, Dst: correlate.Side{Mem: event.MemUnknown}, BatchIndex: -1, Layer: -1,
		Transport: "unknown", TransportReason: correlate.ReasonEndpointNotSeen,
	},
	{ // strings that need escaping
		API: "a\"b\\c\n\t\x01é\xff<&>", Op: event.OpCopy, Direction: "D2H", BatchIndex: -1, Layer: -1,
	},
}

func TestJSONLRoundTrip(t *testing.T) {
	var out bytes.Buffer
	j := NewJSONL(&out)
	for i := range samples {
		j.Transfer(&samples[i])
	}
	if out.Len() != 0 {
		t.Errorf("unbuffered: %d bytes before Flush", out.Len())
	}
	if err := j.Flush(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&out)
	for i := 0; sc.Scan(); i++ {
		if i >= len(samples) {
			t.Fatalf("extra line %q", sc.Text())
		}
		var got correlate.Transfer
		if err := json.Unmarshal(sc.Bytes(), &got); err != nil {
			t.Fatalf("line %d %q: %v", i+1, sc.Text(), err)
		}
		want := samples[i]
		want.API = string([]rune(want.API)) // invalid UTF-8 decodes as U+FFFD
		if !reflect.DeepEqual(got, want) {
			t.Errorf("line %d:\n got %+v\nwant %+v", i+1, got, want)
		}
		// Same keys and values as encoding/json writes from the tags.
		ref, err := json.Marshal(samples[i])
		if err != nil {
			t.Fatal(err)
		}
		var a, b map[string]any
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(ref, &b); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("line %d differs from encoding/json:\n got %s\nwant %s", i+1, sc.Bytes(), ref)
		}
	}
}

// Records name their op as they always did: an Op writes its name.
func TestJSONLOpNames(t *testing.T) {
	for i, want := range map[int]string{0: `,"op":"copy",`, 1: `,"op":"copy_batch",`, 3: `,"op":"kernel_copy",`} {
		if b := AppendTransfer(nil, &samples[i]); !bytes.Contains(b, []byte(want)) {
			t.Errorf("sample %d: %s lacks %s", i, b, want)
		}
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestJSONLWriteError(t *testing.T) {
	j := NewJSONL(failWriter{})
	for range 2000 { // past the buffer
		j.Transfer(&samples[0])
	}
	if err := j.Flush(); err == nil || err.Error() != "disk full" {
		t.Fatalf("Flush = %v, want disk full", err)
	}
}

func TestAppendTransferAllocs(t *testing.T) {
	buf := make([]byte, 0, 1024)
	if a := testing.AllocsPerRun(100, func() { buf = AppendTransfer(buf[:0], &samples[0]) }); a != 0 {
		t.Errorf("AppendTransfer allocates %v times", a)
	}
}

func BenchmarkJSONL(b *testing.B) {
	var sink bytes.Buffer
	j := NewJSONL(&sink)
	b.ReportAllocs()
	for range b.N {
		j.Transfer(&samples[0])
		if sink.Len() > 1<<20 {
			sink.Reset()
		}
	}
}

func BenchmarkEncodingJSON(b *testing.B) {
	var sink bytes.Buffer
	enc := json.NewEncoder(bufio.NewWriter(&sink))
	b.ReportAllocs()
	for range b.N {
		if err := enc.Encode(&samples[0]); err != nil {
			b.Fatal(err)
		}
		if sink.Len() > 1<<20 {
			sink.Reset()
		}
	}
}

var _ correlate.Sink = (*JSONL)(nil)
