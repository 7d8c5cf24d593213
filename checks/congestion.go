package checks

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
)

// Congestion samples the RDMA port and RoCE ethtool counters three times
// over a diagnose window, so their rates over its two halves can be set
// against the posted→completed latency of the same halves.
type Congestion struct {
	ports    []collectors.IBPort
	samplers []collectors.Sampler
	snaps    [3][]collectors.Snapshot // start, middle, end; one per sampler
	errs     []string
}

// NewCongestion finds the RDMA ports under sysRoot; nil without any.
func NewCongestion(sysRoot string) (*Congestion, error) {
	ports, err := collectors.ReadInfiniBand(sysRoot)
	if err != nil || len(ports) == 0 {
		return nil, err
	}
	c := &Congestion{ports: ports, samplers: []collectors.Sampler{collectors.RDMACounters{SysRoot: sysRoot}}}
	if devs, err := collectors.RoCENetDevs(sysRoot); err == nil && len(devs) > 0 {
		c.samplers = append(c.samplers, collectors.EthtoolCounters{SysRoot: sysRoot, NetDevs: devs})
	}
	return c, nil
}

// Sample takes snapshot i (0, 1 or 2) of every sampler.
func (c *Congestion) Sample(i int) {
	for _, s := range c.samplers {
		snap, err := s.Sample()
		if err != nil {
			c.errs = append(c.errs, err.Error())
		}
		c.snaps[i] = append(c.snaps[i], snap)
	}
}

// portOf names the port a counter key belongs to: "mlx5_0/1/hw_counters/x"
// is port mlx5_0/1; "eth2/rx_prio3_pause" is the port whose netdev is eth2.
func (c *Congestion) portOf(key string) string {
	dev, rest, _ := strings.Cut(key, "/")
	if port, _, ok := strings.Cut(rest, "/"); ok && strings.Contains(rest, "counters/") {
		return dev + "/" + port
	}
	for _, p := range c.ports {
		if slices.Contains(p.NetDevs, dev) {
			return fmt.Sprintf("%s/%d", p.Device, p.Port)
		}
	}
	return dev
}

// facts pairs each port's congestion rates over the two halves with the
// latency of the two halves.
func (c *Congestion) facts(lat [2]uint64) []correlate.CongestionFacts {
	byPort := map[string]map[string][2]float64{}
	for i := range c.samplers {
		if len(c.snaps[0]) <= i || len(c.snaps[1]) <= i || len(c.snaps[2]) <= i {
			continue
		}
		first, _ := collectors.Rates(c.snaps[0][i], c.snaps[1][i])
		second, _ := collectors.Rates(c.snaps[1][i], c.snaps[2][i])
		for key, r2 := range second {
			if !correlate.IsCongestionCounter(key) {
				continue
			}
			port := c.portOf(key)
			if byPort[port] == nil {
				byPort[port] = map[string][2]float64{}
			}
			byPort[port][key] = [2]float64{first[key].PerSecond, r2.PerSecond}
		}
	}
	var out []correlate.CongestionFacts
	for _, port := range slices.Sorted(maps.Keys(byPort)) {
		out = append(out, correlate.CongestionFacts{Port: port, Signals: byPort[port], LatencyP99: lat})
	}
	return out
}

// Check judges the window, given the posted→completed p99 of its halves.
func (c *Congestion) Check(lat [2]uint64) Check {
	ch := Check{Scope: HostScope, Name: "RDMA congestion", Status: Pass}
	facts := c.facts(lat)
	for _, f := range facts {
		if fd := correlate.RDMACongestion(f); fd != nil {
			ch.Findings = append(ch.Findings, *fd)
		}
	}
	ch.Detail = fmt.Sprintf("%d RDMA port(s), %d with congestion counters; posted→completed p99 %s then %s",
		len(c.ports), len(facts), us(lat[0]), us(lat[1]))
	if lat[0] == 0 || lat[1] == 0 {
		ch.Detail += " (no completed work requests in one half: latency trend unknown)"
	}
	if len(c.errs) > 0 {
		ch.Detail += "; counter read errors: " + joinLimited(c.errs, 2)
	}
	return ch
}

// HalfLatencies is the posted→completed p99 of the work requests completed
// in each half of the window.
func HalfLatencies(ts []correlate.Transfer, start uint64, window time.Duration) [2]uint64 {
	mid := start + uint64(window/2)
	var halves [2][]uint64
	for _, t := range ts {
		if t.QPNum == 0 || t.CompleteNs == 0 || t.CompleteNs < t.SubmitNs {
			continue
		}
		h := 0
		if t.CompleteNs >= mid {
			h = 1
		}
		halves[h] = append(halves[h], t.CompleteNs-t.SubmitNs)
	}
	var out [2]uint64
	for i := range halves {
		slices.Sort(halves[i])
		out[i] = correlate.Percentile(halves[i], 99)
	}
	return out
}

func us(ns uint64) string { return fmt.Sprintf("%.0fµs", float64(ns)/1e3) }
