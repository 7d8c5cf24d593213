package collectors

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// CounterSet is one reading of many cumulative counters, keyed by a path
// that names the source: "mlx5_0/1/hw_counters/np_cnp_sent",
// "enp178s0f0/rx_prio3_pause".
type CounterSet map[string]uint64

// Snapshot is a CounterSet and the time it was read (with Go's monotonic
// clock reading, so a wall-clock step does not bend rates).
type Snapshot struct {
	Time     time.Time
	Counters CounterSet
	// Unavailable names counters that exist but read "N/A" in this reading:
	// they have no value, which is not 0.
	Unavailable []string
}

// Sampler reads one Snapshot of a counter source. Implementations keep no
// state between calls; Rates turns two snapshots into rates.
type Sampler interface {
	Sample() (Snapshot, error)
}

// Unit is what a rate counts per second, in base units.
type Unit string

const (
	UnitBytes   Unit = "bytes"
	UnitPackets Unit = "packets"
	UnitSeconds Unit = "seconds" // durations: seconds per second, the fraction of time
	UnitEvents  Unit = "events"
)

// UnitOf guesses a counter's unit from the last element of its key:
// "bytes"/"octets" → bytes, "packets"/"pkts"/"frames" → packets,
// "duration" → seconds (the drivers that have duration counters, mlx5
// *_pause_duration and bnxt *_duration_us, count microseconds), anything
// else → events (errors, CNPs, pauses, retries, port_xmit_wait ticks).
func UnitOf(key string) Unit {
	name := strings.ToLower(key[strings.LastIndexByte(key, '/')+1:])
	switch {
	case strings.Contains(name, "bytes") || strings.Contains(name, "octets"):
		return UnitBytes
	case strings.Contains(name, "packets") || strings.Contains(name, "pkts") || strings.Contains(name, "frames"):
		return UnitPackets
	case strings.Contains(name, "duration"):
		return UnitSeconds
	}
	return UnitEvents
}

// Rate is one counter's change over one interval.
type Rate struct {
	Delta     uint64        // increase of the raw counter
	Interval  time.Duration // between the two snapshots
	PerSecond float64       // in Unit per second
	Unit      Unit
}

// Rates gives the per-second rate of every counter present in both
// snapshots. A counter gets no rate, and nothing is guessed, when:
//
//   - it went backwards (cur < prev): a driver reset (module reload, port
//     reset) or a narrower counter wrapping — the two cannot be told apart
//     from values alone, and treating it as restarted from 0 would invent a
//     rate. Its key is in the second return value (sorted);
//   - it is missing from either snapshot (appeared or disappeared: a port or
//     netdev came or went) or unavailable ("N/A") in either;
//   - the interval is not positive (same snapshot twice, clock trouble):
//     then no counter has a rate.
//
// Durations (UnitSeconds) are taken as microseconds and given as seconds
// per second, the fraction of the interval spent paused.
func Rates(prev, cur Snapshot) (map[string]Rate, []string) {
	dt := cur.Time.Sub(prev.Time)
	if dt <= 0 {
		return map[string]Rate{}, nil
	}
	out := make(map[string]Rate, len(cur.Counters))
	var resets []string
	for k, c := range cur.Counters {
		p, ok := prev.Counters[k]
		if !ok {
			continue
		}
		if c < p {
			resets = append(resets, k)
			continue
		}
		d := c - p
		u := UnitOf(k)
		ps := float64(d) / dt.Seconds()
		if u == UnitSeconds {
			ps /= 1e6
		}
		out[k] = Rate{Delta: d, Interval: dt, PerSecond: ps, Unit: u}
	}
	slices.Sort(resets)
	return out, resets
}

// stamped runs read and gives its result the time halfway through the read,
// so that a slow sysfs walk does not skew the interval to one side.
func stamped(read func() (CounterSet, []string, error)) (Snapshot, error) {
	t0 := time.Now()
	cs, un, err := read()
	if err != nil {
		return Snapshot{}, err
	}
	t1 := time.Now()
	slices.Sort(un)
	return Snapshot{Time: t0.Add(t1.Sub(t0) / 2), Counters: cs, Unavailable: un}, nil
}

// RDMACounters samples counters/ and hw_counters/ of every port under
// SysRoot/class/infiniband. Keys are "<dev>/<port>/counters/<name>" and
// "<dev>/<port>/hw_counters/<name>" with IBPort's names and units
// (port_rcv_data_bytes in bytes).
type RDMACounters struct {
	SysRoot string
}

// Sample implements Sampler.
func (c RDMACounters) Sample() (Snapshot, error) {
	return stamped(func() (CounterSet, []string, error) {
		ports, err := ReadInfiniBand(c.SysRoot)
		if err != nil {
			return nil, nil, err
		}
		cs := CounterSet{}
		var un []string
		for _, p := range ports {
			pre := p.Device + "/" + strconv.Itoa(p.Port) + "/"
			for k, v := range p.Counters {
				cs[pre+"counters/"+k] = v
			}
			for k, v := range p.HWCounters {
				cs[pre+"hw_counters/"+k] = v
			}
			for _, u := range p.Unavailable {
				un = append(un, pre+u)
			}
		}
		return cs, un, nil
	})
}

// EthtoolCounters samples the ethtool statistics (PFC pauses, per-priority
// traffic, discards) of the RoCE network devices: the NetDevs of every
// Ethernet-link-layer port under SysRoot, or NetDevs when set. Keys are
// "<netdev>/<statistic>".
type EthtoolCounters struct {
	SysRoot string
	NetDevs []string
	// Read reads one device's statistics; nil means ReadEthtoolStats.
	Read func(ifname string) (map[string]uint64, error)
}

// RoCENetDevs lists the network devices of the Ethernet-link-layer (RoCE)
// ports under sysRoot, sorted, each once.
func RoCENetDevs(sysRoot string) ([]string, error) {
	ports, err := ReadInfiniBand(sysRoot)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range ports {
		if p.LinkLayer != "Ethernet" {
			continue
		}
		for _, n := range p.NetDevs {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// Sample implements Sampler.
func (c EthtoolCounters) Sample() (Snapshot, error) {
	devs := c.NetDevs
	if len(devs) == 0 {
		var err error
		if devs, err = RoCENetDevs(c.SysRoot); err != nil {
			return Snapshot{}, err
		}
	}
	read := c.Read
	if read == nil {
		read = ReadEthtoolStats
	}
	return stamped(func() (CounterSet, []string, error) {
		cs := CounterSet{}
		for _, d := range devs {
			st, err := read(d)
			if err != nil {
				return nil, nil, err
			}
			for k, v := range st {
				cs[d+"/"+k] = v
			}
		}
		return cs, nil, nil
	})
}
