package exporters

import "time"

// KVKind is what a request's KV bytes did: the lanewatch.kv.bytes.* keys
// and the kind label of lanewatch_request_kv_seconds.
type KVKind int

// KV kinds. H2D loads (prefix-cache hits, CPU-offloaded pools), D2H
// backups, RDMA into and out of this node (PD transfers), storage reads
// into the host pool (L3).
const (
	KVH2D KVKind = iota
	KVD2H
	KVRDMAIn
	KVRDMAOut
	KVStorage
	NumKVKinds
)

// KVKindNames are the kinds as attribute suffixes and label values.
var KVKindNames = [NumKVKinds]string{"h2d", "d2h", "rdma_in", "rdma_out", "storage"}

// RequestKV is one request's KV movement as its lanewatch.kv span says it:
// what moved on its behalf, how long the request waited on it, and how
// much of its time to first token that was.
type RequestKV struct {
	Request    string   // the request id ("" when the server names none: its trace is its identity)
	Trace      [16]byte // the trace of the request's span
	Span       [8]byte  // the request's span: the summary's parent
	Start, End int64    // the request span, Unix ns

	Bytes     [NumKVKinds]uint64        // by kind, of the transfers attributed to this request alone
	Wait      [NumKVKinds]time.Duration // by kind: the union of those transfers' intervals inside [Start, End]
	WaitAll   time.Duration             // the union over every kind
	Transfers int                       // transfers attributed to this request alone
	// Shared counts transfers that served a batch this request was in:
	// their bytes cannot be split between its requests and are in no
	// Bytes (SharedBytes holds them).
	Shared      int
	SharedBytes uint64
	// Incomplete: some of its transfers were attributed while a request
	// that may have covered them was still open (held past MaxHold, out of
	// memory, at exit): the figures may miss some.
	Incomplete bool

	// TTFT is the request's time to first token, TTFTSource where it comes
	// from (TTFT* constants); "" unknown. TTFTWait is the part of WaitAll
	// inside [Start, Start+TTFT].
	TTFT       time.Duration
	TTFTSource string
	TTFTWait   time.Duration

	RateBps     float64 // bytes over WaitAll; 0 when unknown
	Bottleneck  string  // the path segment its largest transfer ran against, "" unknown
	CapacityBps float64 // that segment's capacity, bytes/s
	Findings    []string
}

// Where a request's TTFT comes from (lanewatch.kv.ttft_source).
const (
	// vLLM's llm_request attribute, the engine's own measurement.
	TTFTVLLM = "gen_ai.latency.time_to_first_token"
	// SGLang: from the request span's start to the end of its first
	// prefill_forward (the forward pass that samples the first token).
	TTFTSGLangPrefill = "prefill_forward_end"
	// SGLang with no prefill on this server (a PD decode server): to the
	// end of its first decode_forward.
	TTFTSGLangDecode = "decode_forward_end"
)

// KVBytes is every kind's bytes together (lanewatch.kv.bytes).
func (r *RequestKV) KVBytes() uint64 {
	var n uint64
	for _, b := range r.Bytes {
		n += b
	}
	return n
}

// TTFTShare is the share of the time to first token the request waited on
// KV movement; false when its TTFT is unknown.
func (r *RequestKV) TTFTShare() (float64, bool) {
	if r.TTFTSource == "" || r.TTFT <= 0 {
		return 0, false
	}
	return min(float64(r.TTFTWait)/float64(r.TTFT), 1), true
}

// RequestSink receives each request's summary once, from the span
// exporter's goroutine; it must not keep r past the call.
type RequestSink interface {
	RequestKV(r *RequestKV)
}
