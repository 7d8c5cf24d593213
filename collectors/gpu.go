package collectors

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/topology"
	"github.com/prometheus/client_golang/prometheus"
)

// GPUReading is one GPU's counters at one instant. Byte counters are from
// the GPU's view: RX is host→device (inbound), TX device→host (outbound).
// A Has* flag that is false means the source had no such value: the zero
// fields next to it are not a measurement.
type GPUReading struct {
	Index             int
	UUID, BusID, Name string

	// PCIeTxBytes and PCIeRxBytes are monotonic totals (NVML field values
	// NVML_FI_DEV_PCIE_COUNT_TX_BYTES/RX_BYTES; a DCGM source that has
	// totals). RX is host→device.
	PCIeTxBytes, PCIeRxBytes uint64
	HasPCIeBytes             bool

	// PCIeTxBps and PCIeRxBps are a rate only, in bytes/s, when the source
	// has no totals (nvmlDeviceGetPcieThroughput's KB/s × 1024, DCGM's
	// per-second profiling fields).
	PCIeTxBps, PCIeRxBps float64
	HasPCIeRate          bool

	// NVLinkTxBytes and NVLinkRxBytes are monotonic totals over all links.
	NVLinkTxBytes, NVLinkRxBytes uint64
	HasNVLink                    bool

	// Replay is the PCIe replay counter (monotonic).
	Replay    uint64
	HasReplay bool

	// Link generation and width, current and maximum; 0 is unknown.
	LinkGen, MaxLinkGen, LinkWidth, MaxLinkWidth int
}

// GPUSnapshot is every GPU's reading at one instant (with Go's monotonic
// clock reading, as Snapshot).
type GPUSnapshot struct {
	Time   time.Time
	GPUs   []GPUReading
	Source string // "dcgm" | "nvml"
}

// GPUCounters is a source of GPU counters: DCGM, or NVML as the fallback.
type GPUCounters interface {
	Sample() (GPUSnapshot, error)
	Source() string
	Close() error
}

// PCIAddress turns DCGM/NVML's "00000000:3B:00.0" into sysfs's
// "0000:3b:00.0", the form the topology is keyed by. Anything else is kept
// as given.
func PCIAddress(s string) string {
	s = strings.TrimSpace(s)
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || len(dom) < 4 || strings.Count(rest, ":") != 1 {
		return s
	}
	return strings.ToLower(dom[len(dom)-4:] + ":" + rest)
}

// ErrNoGPUCounters is wrapped by every error that means "this host has no
// GPU counter library": the agent reports it once and carries on.
var ErrNoGPUCounters = errors.New("no GPU counters")

// GPURate is one GPU's per-direction rates over an interval, in bytes/s
// (RxBps is host→device). Resets names the counters of this GPU that went
// backwards in the interval ("pcie_tx_bytes", "pcie_rx_bytes",
// "nvlink_tx_bytes", "nvlink_rx_bytes", "replay"): those have no rate (0
// here), nothing is guessed.
type GPURate struct {
	BusID, UUID              string
	TxBps, RxBps             float64
	NVLinkTxBps, NVLinkRxBps float64
	ReplayPerSec             float64
	Resets                   []string
}

// gpuKey is what pairs a GPU across snapshots: its UUID, else its bus id.
func gpuKey(g GPUReading) string {
	if g.UUID != "" {
		return "uuid:" + g.UUID
	}
	return "bus:" + g.BusID
}

// gpuName names a GPU in GPURates' second return value: UUID, else bus id.
func gpuName(g GPUReading) string {
	if g.UUID != "" {
		return g.UUID
	}
	return g.BusID
}

// GPURates pairs the GPUs of two snapshots by UUID (else bus id) and gives
// each one's rates over the interval, in cur's order. The rules are Rates':
//
//   - a GPU present only in cur has no rate (it appeared);
//   - a counter that went backwards (a driver reset, or a narrower counter
//     wrapping — indistinguishable from values alone) gives no rate and is
//     named in the GPU's Resets; a uint64 counter that wraps at 2^64 is the
//     same case and is not unwrapped either;
//   - a counter missing (Has* false) in either reading gives no rate;
//   - a rate-only reading (HasPCIeRate, no totals) passes cur's rate through;
//   - a non-positive interval gives no rates at all.
//
// The second return value names (UUID, else bus id) the GPUs of prev that
// are not in cur: they disappeared (fell off the bus, were reset, were
// hidden), in prev's order.
func GPURates(prev, cur GPUSnapshot) ([]GPURate, []string) {
	before := make(map[string]GPUReading, len(prev.GPUs))
	for _, g := range prev.GPUs {
		before[gpuKey(g)] = g
	}
	now := make(map[string]bool, len(cur.GPUs))
	for _, g := range cur.GPUs {
		now[gpuKey(g)] = true
	}
	var gone []string
	for _, g := range prev.GPUs {
		if !now[gpuKey(g)] {
			gone = append(gone, gpuName(g))
		}
	}
	dt := cur.Time.Sub(prev.Time).Seconds()
	if dt <= 0 {
		return nil, gone
	}
	var out []GPURate
	for _, c := range cur.GPUs {
		p, ok := before[gpuKey(c)]
		if !ok {
			continue
		}
		r := GPURate{BusID: c.BusID, UUID: c.UUID}
		rate := func(name string, pv, cv uint64) float64 {
			if cv < pv {
				r.Resets = append(r.Resets, name)
				return 0
			}
			return float64(cv-pv) / dt
		}
		switch {
		case p.HasPCIeBytes && c.HasPCIeBytes:
			r.TxBps = rate("pcie_tx_bytes", p.PCIeTxBytes, c.PCIeTxBytes)
			r.RxBps = rate("pcie_rx_bytes", p.PCIeRxBytes, c.PCIeRxBytes)
		case c.HasPCIeRate:
			r.TxBps, r.RxBps = c.PCIeTxBps, c.PCIeRxBps
		}
		if p.HasNVLink && c.HasNVLink {
			r.NVLinkTxBps = rate("nvlink_tx_bytes", p.NVLinkTxBytes, c.NVLinkTxBytes)
			r.NVLinkRxBps = rate("nvlink_rx_bytes", p.NVLinkRxBytes, c.NVLinkRxBytes)
		}
		if p.HasReplay && c.HasReplay {
			r.ReplayPerSec = rate("replay", p.Replay, c.Replay)
		}
		slices.Sort(r.Resets)
		out = append(out, r)
	}
	return out, gone
}

// GPUMetrics exports a GPU counter source's readings at scrape time: byte
// and replay counters as totals, link training as gauges. The gpu label is
// the PCI address (sysfs form), as on the lane metrics.
type GPUMetrics struct {
	src                           GPUCounters
	pcie, nvlink, replays, gen, w *prometheus.Desc
}

// NewGPUMetrics describes the metrics once.
func NewGPUMetrics(src GPUCounters) *GPUMetrics {
	return &GPUMetrics{
		src: src,
		pcie: prometheus.NewDesc("lanewatch_gpu_pcie_bytes_total",
			"Bytes that crossed the GPU's PCIe link per direction (inbound: host to device), as the GPU counts them (NVML, or DCGM's rates integrated).",
			[]string{"gpu", "direction"}, nil),
		nvlink: prometheus.NewDesc("lanewatch_gpu_nvlink_bytes_total",
			"Bytes over all of the GPU's NVLinks per direction, as the GPU counts them.", []string{"gpu", "direction"}, nil),
		replays: prometheus.NewDesc("lanewatch_gpu_pcie_replays_total",
			"PCIe replays of the GPU's link (retransmissions after link errors).", []string{"gpu"}, nil),
		gen: prometheus.NewDesc("lanewatch_gpu_pcie_link_generation",
			"PCIe generation of the GPU's link, current (trained now) or max.", []string{"gpu", "state"}, nil),
		w: prometheus.NewDesc("lanewatch_gpu_pcie_link_width",
			"PCIe lanes of the GPU's link, current (trained now) or max.", []string{"gpu", "state"}, nil),
	}
}

// Describe sends the descriptors Update uses.
func (m *GPUMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.pcie, m.nvlink, m.replays, m.gen, m.w} {
		ch <- d
	}
}

// Update samples the source and sends what each GPU has.
func (m *GPUMetrics) Update(ch chan<- prometheus.Metric) error {
	snap, err := m.src.Sample()
	if err != nil {
		return err
	}
	for _, g := range snap.GPUs {
		if g.HasPCIeBytes {
			ch <- prometheus.MustNewConstMetric(m.pcie, prometheus.CounterValue, float64(g.PCIeRxBytes), g.BusID, "inbound")
			ch <- prometheus.MustNewConstMetric(m.pcie, prometheus.CounterValue, float64(g.PCIeTxBytes), g.BusID, "outbound")
		}
		if g.HasNVLink {
			ch <- prometheus.MustNewConstMetric(m.nvlink, prometheus.CounterValue, float64(g.NVLinkRxBytes), g.BusID, "inbound")
			ch <- prometheus.MustNewConstMetric(m.nvlink, prometheus.CounterValue, float64(g.NVLinkTxBytes), g.BusID, "outbound")
		}
		if g.HasReplay {
			ch <- prometheus.MustNewConstMetric(m.replays, prometheus.CounterValue, float64(g.Replay), g.BusID)
		}
		for _, v := range []struct {
			d     *prometheus.Desc
			state string
			n     int
		}{{m.gen, "current", g.LinkGen}, {m.gen, "max", g.MaxLinkGen}, {m.w, "current", g.LinkWidth}, {m.w, "max", g.MaxLinkWidth}} {
			if v.n > 0 {
				ch <- prometheus.MustNewConstMetric(v.d, prometheus.GaugeValue, float64(v.n), g.BusID, v.state)
			}
		}
	}
	return nil
}

// MaxLinkBps is the reading's per-direction link capacity, bytes/s; 0
// unknown: the trained maximum, NVML's and DCGM's max generation and width
// (what the device and system support), never the current ones, which an
// idle GPU lowers (docs/design.md "Placement").
func (g GPUReading) MaxLinkBps() float64 {
	return topology.LinkGBs(topology.GenGTs(g.MaxLinkGen), g.MaxLinkWidth) * 1e9
}
