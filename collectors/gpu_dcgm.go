package collectors

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// DCGM collector (issue #6, part 1). The DCGM-specific work — which fields,
// what a blank value is, turning DCGM's per-interval rates into totals —
// is here and needs no DCGM: gpu_dcgm_cgo.go is the thin dcgmSource over
// github.com/NVIDIA/go-dcgm, gpu_dcgm_nocgo.go the stub without cgo.

// DCGMOptions selects the host engine OpenDCGM talks to.
type DCGMOptions struct {
	// Address of a standalone nv-hostengine ("localhost:5555", or a Unix
	// socket path with UnixSocket set). Empty starts an embedded host
	// engine inside the agent (needs root and the NVIDIA driver).
	Address    string
	UnixSocket bool
	// UpdateInterval is how often DCGM samples the watched fields; the
	// profiling fields are averages over it. 0 means 1s.
	UpdateInterval time.Duration
	// KeepAge is how long DCGM keeps samples for Sample to collect: a Sample
	// later than this after the previous one misses the oldest samples (and
	// reports the gap). 0 means 5 minutes.
	KeepAge time.Duration
	// Timeout bounds the connect/start and the first field update. 0 means
	// 30s. A host engine that does not answer in time is reported as
	// unavailable (ErrNoGPUCounters), and the agent carries on.
	Timeout time.Duration
}

func (o DCGMOptions) withDefaults() DCGMOptions {
	if o.UpdateInterval <= 0 {
		o.UpdateInterval = time.Second
	}
	if o.KeepAge <= 0 {
		o.KeepAge = 5 * time.Minute
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	return o
}

// DCGM field ids (dcgm_fields.h; the cgo build checks them against go-dcgm's
// constants). They are copied so that this file compiles without cgo.
const (
	dcgmFieldName          uint16 = 50   // DCGM_FI_DEV_NAME
	dcgmFieldNVMLIndex     uint16 = 52   // DCGM_FI_DEV_NVML_INDEX
	dcgmFieldUUID          uint16 = 54   // DCGM_FI_DEV_UUID
	dcgmFieldPCIBusID      uint16 = 57   // DCGM_FI_DEV_PCI_BUSID
	dcgmFieldPCIeReplay    uint16 = 202  // DCGM_FI_DEV_PCIE_REPLAY_COUNTER
	dcgmFieldMaxLinkGen    uint16 = 235  // DCGM_FI_DEV_PCIE_MAX_LINK_GEN
	dcgmFieldMaxLinkWidth  uint16 = 236  // DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH
	dcgmFieldLinkGen       uint16 = 237  // DCGM_FI_DEV_PCIE_LINK_GEN
	dcgmFieldLinkWidth     uint16 = 238  // DCGM_FI_DEV_PCIE_LINK_WIDTH
	dcgmFieldPCIeTxBytes   uint16 = 1009 // DCGM_FI_PROF_PCIE_TX_BYTES, bytes/s device→host
	dcgmFieldPCIeRxBytes   uint16 = 1010 // DCGM_FI_PROF_PCIE_RX_BYTES, bytes/s host→device
	dcgmFieldNVLinkTxBytes uint16 = 1011 // DCGM_FI_PROF_NVLINK_TX_BYTES, bytes/s
	dcgmFieldNVLinkRxBytes uint16 = 1012 // DCGM_FI_PROF_NVLINK_RX_BYTES, bytes/s
)

// dcgmRateFields are DCGM's profiling (DCP) fields: each sample is the
// average rate in bytes/s over the interval since the previous sample, not a
// counter. They are collected as every sample since the last Sample call.
var dcgmRateFields = []uint16{dcgmFieldPCIeTxBytes, dcgmFieldPCIeRxBytes, dcgmFieldNVLinkTxBytes, dcgmFieldNVLinkRxBytes}

// dcgmLatestFields are read as their latest value at each Sample.
var dcgmLatestFields = []uint16{
	dcgmFieldName, dcgmFieldNVMLIndex, dcgmFieldUUID, dcgmFieldPCIBusID,
	dcgmFieldPCIeReplay, dcgmFieldLinkGen, dcgmFieldMaxLinkGen, dcgmFieldLinkWidth, dcgmFieldMaxLinkWidth,
}

// DCGM's "no value" markers (dcgm_structs.h DCGM_FT_*_BLANK and the
// NOT_FOUND/NOT_SUPPORTED/NOT_PERMISSIONED values just above them).
const (
	dcgmInt64Blank   = int64(0x7ffffffffffffff0)
	dcgmInt32Blank   = int64(0x7ffffff0)
	dcgmFloat64Blank = 140737488355328.0
	dcgmStrBlank     = "<<<" // "<<<NULL>>>", "<<<NOT_SUPPORTED>>>", ...
)

// dcgmValue is one field value of one GPU as DCGM returns it
// (dcgmFieldValue_v1/v2 without the 4 KiB union).
type dcgmValue struct {
	GPU    uint   // DCGM's GPU id (not necessarily the NVML index)
	Field  uint16 // DCGM_FI_*
	Ts     int64  // µs since the epoch, the host engine's clock
	Status int    // DCGM_ST_*: 0 is OK, anything else is no value
	Type   byte   // 'i' int64, 'd' double, 's' string (DCGM_FT_*)
	Int    int64
	Float  float64
	Str    string
}

// blank reports whether v carries no value: an error status, or one of
// DCGM's blank markers (field not supported on this GPU, not watched,
// profiling paused, no sample yet).
func (v dcgmValue) blank() bool {
	if v.Status != 0 {
		return true
	}
	switch v.Type {
	case 'i':
		// Int32 fields come back in int64 storage with the 32-bit markers.
		return v.Int >= dcgmInt64Blank || (v.Int >= dcgmInt32Blank && v.Int < dcgmInt32Blank+4) || v.Int < 0
	case 'd':
		return math.IsNaN(v.Float) || v.Float >= dcgmFloat64Blank || v.Float < 0
	case 's':
		return v.Str == "" || strings.HasPrefix(v.Str, dcgmStrBlank)
	}
	return true
}

// number gives v as a float64 (int64 or double fields), false when blank.
func (v dcgmValue) number() (float64, bool) {
	if v.blank() {
		return 0, false
	}
	switch v.Type {
	case 'i':
		return float64(v.Int), true
	case 'd':
		return v.Float, true
	}
	return 0, false
}

// dcgmSource is the seam over the few go-dcgm calls the collector makes;
// tests implement it with recorded samples.
type dcgmSource interface {
	// GPUs lists DCGM's ids of the GPUs present now.
	GPUs() ([]uint, error)
	// Latest gives the latest value of each field on one GPU, in order.
	Latest(gpu uint, fields []uint16) ([]dcgmValue, error)
	// Since gives every sample of dcgmRateFields, on every watched GPU,
	// recorded after sinceUs (µs; 0 = all kept), and the cursor for the
	// next call.
	Since(sinceUs int64) ([]dcgmValue, int64, error)
	Close() error
}

// dcgmIntegrator turns one rate field's samples into a byte total. Each
// sample at ts is DCGM's average rate over (previous ts, ts], so the bytes of
// that interval are rate × (ts − previous ts). The total is exact to DCGM's
// own resolution, whatever the spacing of Sample calls, as long as no sample
// is lost.
type dcgmIntegrator struct {
	started bool
	lastTs  int64 // µs
	total   uint64
	frac    float64 // bytes below 1 carried to the next sample
	// gap is set when an interval since the last reading has no
	// measurement (a blank sample, DCGM's clock going back): the total
	// then undercounts and the reading says it has none.
	gap bool
	// resync is set when samples may have been lost (DCGM keeps them
	// for KeepAge only): the next sample restarts the interval.
	resync bool
	rate   float64 // latest non-blank sample, bytes/s
	rateOK bool    // the latest sample was not blank
}

func (g *dcgmIntegrator) add(v dcgmValue) {
	if g.started && v.Ts <= g.lastTs {
		if v.Ts == g.lastTs {
			return // the same sample again
		}
		// DCGM's clock went back (host engine restarted, clock stepped):
		// start over; GPURates sees the total go back and gives no rate.
		*g = dcgmIntegrator{}
	}
	if g.started && g.resync {
		g.resync, g.gap, g.lastTs = false, true, v.Ts
		g.rate, g.rateOK = v.number()
		return
	}
	r, ok := v.number()
	g.rateOK = ok
	if !ok {
		if g.started {
			g.gap = true
			g.lastTs = v.Ts
		}
		return
	}
	g.rate = r
	if !g.started {
		// The first sample's interval began before we watched: it starts
		// the total at 0 and is not counted.
		g.started, g.lastTs, g.resync = true, v.Ts, false
		return
	}
	b := r*float64(v.Ts-g.lastTs)/1e6 + g.frac
	whole := math.Floor(b)
	g.frac = b - whole
	g.total += uint64(whole) // wraps at 2^64 like any counter; GPURates names it
	g.lastTs = v.Ts
}

// take reports the total for one reading: ok is false when there is none
// yet or the interval since the last reading has a gap.
func (g *dcgmIntegrator) take() (total uint64, ok bool) {
	ok = g.started && !g.gap
	g.gap = false
	return g.total, ok
}

type dcgmGPUState struct {
	uuid               string
	pcieTx, pcieRx     dcgmIntegrator
	nvlinkTx, nvlinkRx dcgmIntegrator
}

func (s *dcgmGPUState) integrator(f uint16) *dcgmIntegrator {
	switch f {
	case dcgmFieldPCIeTxBytes:
		return &s.pcieTx
	case dcgmFieldPCIeRxBytes:
		return &s.pcieRx
	case dcgmFieldNVLinkTxBytes:
		return &s.nvlinkTx
	case dcgmFieldNVLinkRxBytes:
		return &s.nvlinkRx
	}
	return nil
}

// dcgmCollector implements GPUCounters over a dcgmSource.
type dcgmCollector struct {
	mu       sync.Mutex // Sample is called by the evaluator and at scrape time
	src      dcgmSource
	keepAge  time.Duration
	since    int64 // cursor for src.Since
	lastTs   int64 // newest rate sample seen, µs
	lastCall time.Time
	now      func() time.Time
	gpus     map[uint]*dcgmGPUState
}

func newDCGMCollector(src dcgmSource, opts DCGMOptions) *dcgmCollector {
	opts = opts.withDefaults()
	return &dcgmCollector{src: src, keepAge: opts.KeepAge, now: time.Now, gpus: map[uint]*dcgmGPUState{}}
}

// Source implements GPUCounters.
func (c *dcgmCollector) Source() string { return "dcgm" }

// Close implements GPUCounters.
func (c *dcgmCollector) Close() error { return c.src.Close() }

// Sample implements GPUCounters. DCGM's PCIe and NVLink fields (1009–1012)
// are rates averaged over DCGM's update interval, not counters; Sample
// collects every one of their samples since the previous call and
// integrates them into totals (PCIeTxBytes/RxBytes with HasPCIeBytes,
// NVLinkTxBytes/RxBytes with HasNVLink), which count from the first sample
// after OpenDCGM. The newest rate is also given (PCIeTxBps/RxBps with
// HasPCIeRate).
//
// The snapshot's Time is DCGM's timestamp of the newest rate sample in it
// (the host engine's wall clock, no monotonic reading), so that the bytes
// and the interval GPURates divides them by come from the same clock: a
// Sample with no new DCGM sample has the previous Time, and GPURates gives
// no rate over it rather than 0. Before the first rate sample, Time is the
// local time of the call.
//
// A GPU DCGM no longer lists, or whose values cannot be read, is left out
// (GPURates names it as gone); when it comes back its totals start again
// at 0, which GPURates reports as a reset.
func (c *dcgmCollector) Sample() (GPUSnapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	called := c.now()
	ids, err := c.src.GPUs()
	if err != nil {
		return GPUSnapshot{}, fmt.Errorf("dcgm: listing GPUs: %w", err)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	present := make(map[uint]bool, len(ids))
	for _, id := range ids {
		present[id] = true
	}
	for id := range c.gpus {
		if !present[id] {
			delete(c.gpus, id)
		}
	}

	// Identity and device fields first, so that a different GPU behind a
	// DCGM id resets that id's totals before its samples are counted.
	type pending struct {
		id uint
		r  GPUReading
	}
	var readings []pending
	var firstErr error
	for _, id := range ids {
		lv, err := c.src.Latest(id, dcgmLatestFields)
		if err == nil && len(lv) != len(dcgmLatestFields) {
			err = fmt.Errorf("%d values for %d fields", len(lv), len(dcgmLatestFields))
		}
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("dcgm: GPU %d: %w", id, err)
			}
			delete(c.gpus, id)
			continue
		}
		r := dcgmReading(id, lv)
		st := c.gpus[id]
		if st == nil || (st.uuid != "" && r.UUID != "" && st.uuid != r.UUID) {
			// New, back, or another GPU behind the same DCGM id: its
			// totals start over.
			st = &dcgmGPUState{}
			c.gpus[id] = st
		}
		if r.UUID != "" {
			st.uuid = r.UUID
		}
		readings = append(readings, pending{id, r})
	}
	if len(readings) == 0 && firstErr != nil {
		return GPUSnapshot{}, firstErr
	}

	vals, next, err := c.src.Since(c.since)
	if err != nil {
		return GPUSnapshot{}, fmt.Errorf("dcgm: reading PCIe/NVLink samples: %w", err)
	}
	if next > c.since {
		c.since = next
	}
	if !c.lastCall.IsZero() && called.Sub(c.lastCall) >= c.keepAge {
		// DCGM dropped samples older than KeepAge before this call: the
		// interval up to the first sample we got is not measured.
		for _, st := range c.gpus {
			for _, f := range dcgmRateFields {
				st.integrator(f).resync = true
			}
		}
	}
	c.lastCall = called
	// DCGM hands samples grouped by entity; integrate each field in time
	// order.
	slices.SortStableFunc(vals, func(a, b dcgmValue) int { return cmp.Compare(a.Ts, b.Ts) })
	newest := c.lastTs
	for _, v := range vals {
		st := c.gpus[v.GPU]
		if st == nil {
			continue
		}
		g := st.integrator(v.Field)
		if g == nil {
			continue
		}
		g.add(v)
		newest = max(newest, v.Ts)
	}
	c.lastTs = newest

	snap := GPUSnapshot{Source: "dcgm", Time: called}
	if newest > 0 {
		snap.Time = time.UnixMicro(newest)
	}
	for _, p := range readings {
		st, r := c.gpus[p.id], p.r
		tx, txOK := st.pcieTx.take()
		rx, rxOK := st.pcieRx.take()
		if txOK && rxOK {
			r.PCIeTxBytes, r.PCIeRxBytes, r.HasPCIeBytes = tx, rx, true
		}
		if st.pcieTx.rateOK && st.pcieRx.rateOK {
			r.PCIeTxBps, r.PCIeRxBps, r.HasPCIeRate = st.pcieTx.rate, st.pcieRx.rate, true
		}
		ntx, ntxOK := st.nvlinkTx.take()
		nrx, nrxOK := st.nvlinkRx.take()
		if ntxOK && nrxOK {
			r.NVLinkTxBytes, r.NVLinkRxBytes, r.HasNVLink = ntx, nrx, true
		}
		snap.GPUs = append(snap.GPUs, r)
	}
	return snap, nil
}

// dcgmReading maps the latest values (in dcgmLatestFields order) onto a
// GPUReading. Blank values leave their field unset: "" or 0, Has* false.
func dcgmReading(id uint, lv []dcgmValue) GPUReading {
	r := GPUReading{Index: int(id)}
	for i, f := range dcgmLatestFields {
		v := lv[i]
		if v.blank() {
			continue
		}
		n, isNum := v.number()
		switch f {
		case dcgmFieldName:
			r.Name = v.Str
		case dcgmFieldUUID:
			r.UUID = v.Str
		case dcgmFieldPCIBusID:
			r.BusID = PCIAddress(v.Str)
		case dcgmFieldNVMLIndex:
			if isNum {
				r.Index = int(n)
			}
		case dcgmFieldPCIeReplay:
			if isNum {
				r.Replay, r.HasReplay = uint64(n), true
			}
		case dcgmFieldLinkGen:
			r.LinkGen = int(n)
		case dcgmFieldMaxLinkGen:
			r.MaxLinkGen = int(n)
		case dcgmFieldLinkWidth:
			r.LinkWidth = int(n)
		case dcgmFieldMaxLinkWidth:
			r.MaxLinkWidth = int(n)
		}
	}
	return r
}

// errDCGMUnavailable builds OpenDCGM's error when the library or the host
// engine is not there: one line, wrapping ErrNoGPUCounters.
func errDCGMUnavailable(why string, err error) error {
	if err != nil {
		why += ": " + err.Error()
	}
	return fmt.Errorf("dcgm: DCGM counters unavailable, %s (%w)", why, ErrNoGPUCounters)
}
