package checks

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// CheckCongestion is the name of the RDMA congestion check.
const CheckCongestion = "RDMA congestion"

// CongestionConfig says where Congestion reads from.
type CongestionConfig struct {
	ProcRoot, SysRoot string
	// EthtoolRead reads a RoCE network device's statistics (PFC pauses);
	// nil: ethtool's ioctl (collectors.ReadEthtoolStats).
	EthtoolRead func(ifname string) (map[string]uint64, error)
	// Clock stamps each sample; nil: the time the counters were read.
	Clock func() time.Time
}

// Congestion judges RDMA congestion per port and queue pair (seed 002
// §6.2, §5) over consecutive intervals between counter samples: each
// port's congestion counter rates (collectors.RDMACounters, and the
// ethtool statistics of RoCE ports) against the completions of the queue
// pairs that may be on it, receives excluded. A queue pair is placed on a
// port by the RDMA devices its process opened (collectors.RDMADevicesOf).
// It keeps what the rule compares with: the previous interval (rises) and
// each port's quiet baseline, learned from intervals in which its counters
// were still. `agent run` samples at every evaluation, `agent diagnose` at
// the start, middle and end of its window.
type Congestion struct {
	cfg      CongestionConfig
	ports    map[string]collectors.IBPort // "mlx5_0/1" →
	samplers []collectors.Sampler
	snaps    [][]collectors.Snapshot // not yet judged, oldest first; one per sampler
	errs     []string

	hasPrev  bool
	prevRate map[string]float64 // counter key → rate over the previous interval
	prevSlow map[qpKey]float64  // queue pair → p99 slowdown over the previous interval
	quiet    map[string]uint64  // port → lowest p99 excess (ns) seen in its quiet intervals
}

// qpKey is a queue pair, or a transfer library's endpoint (ep) whose RDMA
// transfers stand for the queue pairs the library drives itself.
type qpKey struct {
	pid, qp uint32
	ep      uint64
}

// NewCongestion finds the RDMA ports under cfg.SysRoot; nil without any.
func NewCongestion(cfg CongestionConfig) (*Congestion, error) {
	ports, err := collectors.ReadInfiniBand(cfg.SysRoot)
	if err != nil || len(ports) == 0 {
		return nil, err
	}
	c := &Congestion{cfg: cfg, ports: map[string]collectors.IBPort{}, quiet: map[string]uint64{},
		samplers: []collectors.Sampler{collectors.RDMACounters{SysRoot: cfg.SysRoot}}}
	for _, p := range ports {
		c.ports[portName(p)] = p
	}
	if devs, err := collectors.RoCENetDevs(cfg.SysRoot); err == nil && len(devs) > 0 {
		c.samplers = append(c.samplers, collectors.EthtoolCounters{SysRoot: cfg.SysRoot, NetDevs: devs, Read: cfg.EthtoolRead})
	}
	return c, nil
}

func portName(p collectors.IBPort) string { return fmt.Sprintf("%s/%d", p.Device, p.Port) }

// Sample reads every counter source once; the time between two samples is
// an interval Judge judges.
func (c *Congestion) Sample() {
	snaps := make([]collectors.Snapshot, len(c.samplers))
	for i, s := range c.samplers {
		snap, err := s.Sample()
		if err != nil {
			c.errs = append(c.errs, err.Error())
		}
		snaps[i] = snap
	}
	if c.cfg.Clock != nil {
		now := c.cfg.Clock()
		for i := range snaps {
			snaps[i].Time = now
		}
	}
	c.snaps = append(c.snaps, snaps)
}

// portOf names the port a counter key belongs to: "mlx5_0/1/hw_counters/x"
// is port mlx5_0/1; "eth2/rx_prio3_pause" is the port whose netdev is eth2.
func (c *Congestion) portOf(key string) string {
	dev, rest, _ := strings.Cut(key, "/")
	if port, _, ok := strings.Cut(rest, "/"); ok && strings.Contains(rest, "counters/") {
		return dev + "/" + port
	}
	for _, name := range slices.Sorted(maps.Keys(c.ports)) {
		if slices.Contains(c.ports[name].NetDevs, dev) {
			return name
		}
	}
	return dev
}

// interval is the counters of one interval, by port.
type interval struct {
	rates map[string]map[string]float64 // port → congestion counter key → rate per second
	data  map[string]float64            // port → its higher data rate of the two directions, bytes/s
}

// counters turns the oldest two unjudged samples into rates, and drops
// the oldest.
func (c *Congestion) counters() (interval, bool) {
	if len(c.snaps) < 2 {
		return interval{}, false
	}
	first, second := c.snaps[0], c.snaps[1]
	c.snaps = c.snaps[1:]
	iv := interval{rates: map[string]map[string]float64{}, data: map[string]float64{}}
	for i := range c.samplers {
		rates, resets := collectors.Rates(first[i], second[i])
		if len(resets) > 0 {
			c.errs = append(c.errs, "counters went backwards (reset): "+JoinLimited(resets, 2))
		}
		for key, r := range rates {
			port := c.portOf(key)
			switch {
			case correlate.IsCongestionCounter(key):
				if iv.rates[port] == nil {
					iv.rates[port] = map[string]float64{}
				}
				iv.rates[port][key] = r.PerSecond
			case strings.HasSuffix(key, "/counters/port_xmit_data_bytes"), strings.HasSuffix(key, "/counters/port_rcv_data_bytes"),
				strings.HasSuffix(key, "/counters/port_xmit_data_64_bytes"), strings.HasSuffix(key, "/counters/port_rcv_data_64_bytes"):
				iv.data[port] = max(iv.data[port], r.PerSecond)
			}
		}
	}
	return iv, true
}

// batch is work requests of one queue pair completed together: an
// unsignaled request completes with the next signaled one (seed 002 §4.3).
type batch struct {
	bytes             uint64
	submit, complete  uint64
	service, expected uint64 // ns: time the batch took once the queue pair reached it; its baseline
	wire              uint64 // ns: its bytes at the port's rate
}

// qpWork is one queue pair's completions over an interval.
type qpWork struct {
	key     qpKey
	ports   []string
	batches []batch
}

// queuePairs groups the completed work requests by queue pair, leaving
// out receives (a posted receive waits for the peer to send) and failed or
// uncompleted requests; it returns how many receives it left out.
func queuePairs(ts []correlate.Transfer) (map[qpKey][]correlate.Transfer, int) {
	out := map[qpKey][]correlate.Transfer{}
	recvs := 0
	for _, t := range ts {
		xfer := t.Op.IsXfer() && correlate.ClassOf(t.Transport) == correlate.TransportRDMA
		if t.Op != event.OpPostSend && t.Op != event.OpPostRecv && !xfer {
			continue
		}
		if t.Direction == correlate.DirRecv || t.Op == event.OpPostRecv {
			recvs++
			continue
		}
		if xfer {
			if t.Failed() || t.CompleteNs == 0 || t.CompleteNs < t.SubmitNs {
				continue
			}
			k := qpKey{pid: t.PID, ep: t.Endpoint}
			out[k] = append(out[k], t)
			continue
		}
		if t.Status != "success" || t.CompleteNs == 0 || t.CompleteNs < t.SubmitNs {
			continue
		}
		k := qpKey{pid: t.PID, qp: t.QPNum}
		out[k] = append(out[k], t)
	}
	return out, recvs
}

// portOfDevice is the port a transfer library names as "mlx5_0:1"; ""
// when it is no port of this host's.
func (c *Congestion) portOfDevice(dev string) string {
	name, port, ok := strings.Cut(dev, ":")
	if !ok {
		return ""
	}
	if p := name + "/" + port; c.ports[p].Device != "" {
		return p
	}
	return ""
}

// candidatePorts are the ports a process's queue pairs may be on: those of
// the RDMA devices it opened; every port when that is not known.
func (c *Congestion) candidatePorts(pid uint32) []string {
	all := slices.Sorted(maps.Keys(c.ports))
	devs, err := collectors.RDMADevicesOf(c.cfg.ProcRoot, c.cfg.SysRoot, int(pid))
	if err != nil || len(devs) == 0 {
		return all
	}
	var out []string
	for _, name := range all {
		if slices.Contains(devs, c.ports[name].Device) {
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return all
	}
	return out
}

// baseline is what a completion of n bytes may take on any of ports: its
// bytes at the slowest port's rate, plus the round trip (the port's quiet
// baseline, at least correlate.BaselineRTTNs).
func (c *Congestion) baseline(ports []string, n uint64) (wire, expected uint64) {
	var rate uint64
	rtt := uint64(correlate.BaselineRTTNs)
	for _, p := range ports {
		if r := c.ports[p].RateBytesPerSecond; r > 0 && (rate == 0 || r < rate) {
			rate = r
		}
		rtt = max(rtt, c.quiet[p])
	}
	if rate > 0 {
		wire = uint64(float64(n) * 1e9 / float64(rate))
	}
	return wire, wire + rtt
}

// work builds each queue pair's batches: consecutive requests completed at
// the same instant are one batch; its service time runs from when the
// queue pair reached it (its first post, or the previous batch's
// completion if later: requests complete in order) to its completion, so
// waiting behind the queue pair's own earlier requests is not counted.
func (c *Congestion) work(byQP map[qpKey][]correlate.Transfer) []qpWork {
	portsOf := map[uint32][]string{}
	var out []qpWork
	for _, k := range slices.SortedFunc(maps.Keys(byQP), func(a, b qpKey) int {
		return cmp.Or(cmp.Compare(a.pid, b.pid), cmp.Compare(a.qp, b.qp), cmp.Compare(a.ep, b.ep))
	}) {
		if portsOf[k.pid] == nil {
			portsOf[k.pid] = c.candidatePorts(k.pid)
		}
		ts := byQP[k]
		w := qpWork{key: k, ports: portsOf[k.pid]}
		if port := c.portOfDevice(ts[0].NetDevice); k.ep != 0 && port != "" {
			w.ports = []string{port} // the library named the device and port it went on
		}
		slices.SortStableFunc(ts, func(a, b correlate.Transfer) int {
			if a.CompleteNs != b.CompleteNs {
				return cmp.Compare(a.CompleteNs, b.CompleteNs)
			}
			return cmp.Compare(a.SubmitNs, b.SubmitNs)
		})
		var prevComplete uint64
		for i := 0; i < len(ts); {
			b := batch{submit: ts[i].SubmitNs, complete: ts[i].CompleteNs}
			for ; i < len(ts) && ts[i].CompleteNs == b.complete; i++ {
				b.bytes += ts[i].Bytes
				b.submit = min(b.submit, ts[i].SubmitNs)
			}
			b.service = b.complete - max(b.submit, min(prevComplete, b.complete))
			b.wire, b.expected = c.baseline(w.ports, b.bytes)
			prevComplete = b.complete
			w.batches = append(w.batches, b)
		}
		out = append(out, w)
	}
	return out
}

// slowdown is the queue pair's p99 (nearest rank) of service over
// baseline, with that batch.
func (w qpWork) slowdown() (float64, batch) {
	bs := slices.Clone(w.batches)
	ratio := func(b batch) float64 { return float64(b.service) / float64(max(b.expected, 1)) }
	slices.SortFunc(bs, func(a, b batch) int {
		ra, rb := ratio(a), ratio(b)
		switch {
		case ra < rb:
			return -1
		case ra > rb:
			return 1
		}
		return 0
	})
	i := max(0, min((99*len(bs)+99)/100-1, len(bs)-1))
	return ratio(bs[i]), bs[i]
}

// excessP99 is the p99 of the time the batches took beyond their bytes'
// time at the port's rate: the round trip of a quiet port.
func (w qpWork) excessP99() uint64 {
	ex := make([]uint64, len(w.batches))
	for i, b := range w.batches {
		ex[i] = b.service - min(b.service, b.wire)
	}
	slices.Sort(ex)
	return correlate.Percentile(ex, 99)
}

// minLearn is how many completions a quiet interval needs before a queue
// pair's round trip teaches its port's baseline.
const minLearn = 16

// Judge judges the oldest interval not judged yet (between two samples)
// with the work requests completed in it, then keeps what the next
// interval compares with. Without two samples it SKIPs.
func (c *Congestion) Judge(ts []correlate.Transfer) Check {
	iv, ok := c.counters()
	if !ok {
		return Skipped(HostScope, CheckCongestion, "one counter sample so far: no interval to judge")
	}
	byQP, recvs := queuePairs(ts)
	work := c.work(byQP)
	slow := map[qpKey]float64{}
	qps := make([]correlate.QPLatency, len(work))
	for i, w := range work {
		s, b := w.slowdown()
		slow[w.key] = s
		prev := c.prevSlow[w.key]
		qps[i] = correlate.QPLatency{PID: w.key.pid, QPNum: w.key.qp, Endpoint: w.key.ep, Placed: len(w.ports) == 1, Ports: w.ports,
			Batches: len(w.batches), Slowdown: [2]float64{prev, s}, P99Ns: b.service, BaselineNs: b.expected}
	}
	ch := Check{Scope: HostScope, Name: CheckCongestion, Status: Pass}
	var counting, quietPorts []string
	for _, port := range slices.Sorted(maps.Keys(c.ports)) {
		f := correlate.CongestionFacts{Port: port, Signals: map[string][2]float64{}, HasPrevious: c.hasPrev}
		quiet := true
		for key, r := range iv.rates[port] {
			f.Signals[key] = [2]float64{c.prevRate[key], r}
			if r > 0 {
				quiet = false
			}
		}
		if rate := c.ports[port].RateBytesPerSecond; rate > 0 && iv.data[port] >= correlate.BusyPort*float64(rate) {
			f.Busy = true
		}
		for i, w := range work {
			if slices.Contains(w.ports, port) {
				f.QPs = append(f.QPs, qps[i])
			}
		}
		if quiet {
			quietPorts = append(quietPorts, port)
		} else {
			counting = append(counting, port)
		}
		if fd := correlate.RDMACongestion(f); fd != nil {
			ch.Findings = append(ch.Findings, *fd)
		}
	}
	// Learn each quiet port's round trip from queue pairs that can only be
	// on quiet ports.
	for _, w := range work {
		if len(w.batches) < minLearn || slices.ContainsFunc(w.ports, func(p string) bool { return !slices.Contains(quietPorts, p) }) {
			continue
		}
		ex := w.excessP99()
		for _, p := range w.ports {
			if q, seen := c.quiet[p]; !seen || ex < q {
				c.quiet[p] = ex
			}
		}
	}
	c.prevRate = map[string]float64{}
	for _, rates := range iv.rates {
		maps.Copy(c.prevRate, rates)
	}
	c.prevSlow, c.hasPrev = slow, true

	ch.Detail = fmt.Sprintf("%d RDMA port(s), congestion counters counting on %s; %d queue pair(s) with completions (%d receive(s) left out: a posted receive waits for the peer)",
		len(c.ports), orNone(counting), len(work), recvs)
	if len(c.quiet) > 0 {
		var learned []string
		for _, p := range slices.Sorted(maps.Keys(c.quiet)) {
			learned = append(learned, fmt.Sprintf("%s %s", p, us(max(c.quiet[p], correlate.BaselineRTTNs))))
		}
		ch.Detail += "; baseline round trip " + JoinLimited(learned, 4)
	}
	if len(c.errs) > 0 {
		ch.Detail += "; counter read errors: " + JoinLimited(c.errs, 2)
		c.errs = nil
	}
	return ch
}

func orNone(v []string) string {
	if len(v) == 0 {
		return "none"
	}
	return JoinLimited(v, 4)
}

func us(ns uint64) string { return fmt.Sprintf("%.0fµs", float64(ns)/1e3) }
