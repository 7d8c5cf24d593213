package collectors

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// IBPort is one port of an RDMA device, /sys/class/infiniband/<dev>/ports/<n>/.
//
// Counters holds every file of counters/ (and counters_ext/, kernels before
// 4.5), HWCounters every file of hw_counters/ except lifespan, keyed by file
// name, with one change of name and unit: port_rcv_data and port_xmit_data
// (and their _64 forms) count 4-byte words in the kernel, so they are kept
// as port_rcv_data_bytes, port_xmit_data_bytes (port_*_data_64_bytes), ×4
// at the source. port_xmit_wait stays in the hardware's ticks. Everything
// else counts packets or events.
//
// A counter that reads "N/A" (a driver's "not supported here", e.g.
// "N/A (no PMA)"), or whose read fails with EINVAL, EOPNOTSUPP or ENODATA,
// is in Unavailable ("counters/port_xmit_wait") and in neither map: it is
// not a 0.
type IBPort struct {
	Device string // "mlx5_0"
	Port   int    // 1-based, the directory name

	// State and PhysState are the text after "N: " in state and phys_state
	// ("ACTIVE", "LinkUp"), StateID and PhysStateID the number. "" and 0 when
	// the file is absent.
	State       string
	StateID     int
	PhysState   string
	PhysStateID int
	// Rate is the rate file as written ("25 Gb/sec (1X EDR)");
	// RateBytesPerSecond its value in bytes/s (decimal Gb/s ÷ 8: 3.125e9).
	Rate               string
	RateBytesPerSecond uint64
	// LinkLayer is "InfiniBand" or "Ethernet" (RoCE); "" when absent.
	LinkLayer string
	// NetDevs are the network devices of the port: the distinct names in
	// gid_attrs/ndevs/* (RoCE), else the device's PCI function's net/*
	// whose dev_port is Port-1. Sorted.
	NetDevs []string

	Counters   map[string]uint64
	HWCounters map[string]uint64
	// Lifespan is hw_counters/lifespan: how long the driver caches
	// hw_counters values (ms in the file). Sampling more often than this
	// gives repeated values, not zero rates. 0 when absent.
	Lifespan    time.Duration
	Unavailable []string
}

// wordCounters are counted in 4-byte words by the kernel (IB PMA
// PortXmitData/PortRcvData; Documentation/ABI/stable/sysfs-class-infiniband).
var wordCounters = map[string]bool{
	"port_rcv_data": true, "port_xmit_data": true,
	"port_rcv_data_64": true, "port_xmit_data_64": true,
}

// InfiniBandMetrics exports every RDMA port's counters and hw_counters at
// scrape time, so Prometheus computes the rates. Labels are bounded by the
// hardware: device, port and the counter's file name.
type InfiniBandMetrics struct {
	sysRoot        string
	counter, state *prometheus.Desc
}

// NewInfiniBandMetrics describes the metrics once.
func NewInfiniBandMetrics(sysRoot string) *InfiniBandMetrics {
	return &InfiniBandMetrics{
		sysRoot: sysRoot,
		counter: prometheus.NewDesc("lanewatch_rdma_port_counter_total",
			"RDMA port counters and hw_counters (congestion: np_cnp_sent, rp_cnp_handled, np_ecn_marked_roce_packets; loss: out_of_sequence, packet_seq_err, local_ack_timeout_err, …); port_rcv_data/port_xmit_data are converted from 4-byte words to bytes and named *_bytes.",
			[]string{"device", "port", "counter"}, nil),
		state: prometheus.NewDesc("lanewatch_rdma_port_active", "1 when the port's state is ACTIVE.",
			[]string{"device", "port", "link_layer"}, nil),
	}
}

// Describe sends the descriptors Update uses.
func (m *InfiniBandMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- m.counter; ch <- m.state }

// Update sends every port's state and counters (hw_counters as "hw:NAME").
func (m *InfiniBandMetrics) Update(ch chan<- prometheus.Metric) error {
	ports, err := ReadInfiniBand(m.sysRoot)
	for _, p := range ports {
		port := strconv.Itoa(p.Port)
		active := 0.0
		if p.State == "ACTIVE" {
			active = 1
		}
		ch <- prometheus.MustNewConstMetric(m.state, prometheus.GaugeValue, active, p.Device, port, p.LinkLayer)
		for name, v := range p.Counters {
			ch <- prometheus.MustNewConstMetric(m.counter, prometheus.CounterValue, float64(v), p.Device, port, name)
		}
		for name, v := range p.HWCounters {
			ch <- prometheus.MustNewConstMetric(m.counter, prometheus.CounterValue, float64(v), p.Device, port, "hw:"+name)
		}
	}
	return err
}

// ReadInfiniBand reads every port of every device under
// <sysRoot>/class/infiniband. A sysRoot that does not exist is an error; a
// host without RDMA devices (no class/infiniband) gives none and no error.
// Ports come sorted by device then port number.
func ReadInfiniBand(sysRoot string) ([]IBPort, error) {
	if _, err := os.Stat(sysRoot); err != nil {
		return nil, fmt.Errorf("sysfs root: %w", err)
	}
	classDir := filepath.Join(sysRoot, "class", "infiniband")
	devs, err := os.ReadDir(classDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", classDir, err)
	}
	var out []IBPort
	for _, d := range devs {
		portsDir := filepath.Join(classDir, d.Name(), "ports")
		ents, err := os.ReadDir(portsDir)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", portsDir, err)
		}
		var ports []IBPort
		for _, e := range ents {
			n, err := strconv.Atoi(e.Name())
			if err != nil || n < 0 {
				return nil, fmt.Errorf("%s: port directory %q is not a number", portsDir, e.Name())
			}
			p, err := readIBPort(filepath.Join(classDir, d.Name()), d.Name(), n)
			if err != nil {
				return nil, err
			}
			ports = append(ports, p)
		}
		slices.SortFunc(ports, func(a, b IBPort) int { return a.Port - b.Port })
		out = append(out, ports...)
	}
	return out, nil
}

func readIBPort(devDir, dev string, port int) (IBPort, error) {
	p := IBPort{Device: dev, Port: port, Counters: map[string]uint64{}, HWCounters: map[string]uint64{}}
	dir := filepath.Join(devDir, "ports", strconv.Itoa(port))

	var err error
	if p.StateID, p.State, err = readIBState(filepath.Join(dir, "state")); err != nil {
		return IBPort{}, err
	}
	if p.PhysStateID, p.PhysState, err = readIBState(filepath.Join(dir, "phys_state")); err != nil {
		return IBPort{}, err
	}
	if s, ok, err := readAttr(filepath.Join(dir, "rate")); err != nil {
		return IBPort{}, err
	} else if ok {
		p.Rate = s
		if p.RateBytesPerSecond, err = parseIBRate(s); err != nil {
			return IBPort{}, fmt.Errorf("%s: %w", filepath.Join(dir, "rate"), err)
		}
	}
	if s, ok, err := readAttr(filepath.Join(dir, "link_layer")); err != nil {
		return IBPort{}, err
	} else if ok {
		p.LinkLayer = s
	}

	for _, sub := range []string{"counters", "counters_ext", "hw_counters"} {
		m := p.Counters
		if sub == "hw_counters" {
			m = p.HWCounters
		}
		if err := readCounterDir(filepath.Join(dir, sub), sub, m, &p); err != nil {
			return IBPort{}, err
		}
	}
	slices.Sort(p.Unavailable)

	if p.NetDevs, err = ibNetDevs(devDir, dir, port); err != nil {
		return IBPort{}, err
	}
	return p, nil
}

// readCounterDir reads every regular file of dir into m. A missing dir is
// not an error (hw_counters needs kernel 4.6 and a driver that has them).
func readCounterDir(dir, sub string, m map[string]uint64, p *IBPort) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if unavailableReadErr(err) {
			p.Unavailable = append(p.Unavailable, sub+"/"+e.Name())
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		v, ok, err := ParseSysfsCounter(b)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if !ok {
			p.Unavailable = append(p.Unavailable, sub+"/"+e.Name())
			continue
		}
		name := e.Name()
		switch {
		case sub == "hw_counters" && name == "lifespan":
			p.Lifespan = time.Duration(v) * time.Millisecond
			continue
		case wordCounters[name]:
			if v > math.MaxUint64/4 {
				return fmt.Errorf("%s: %d words overflow bytes", path, v)
			}
			v *= 4
			name += "_bytes"
		}
		m[name] = v
	}
	return nil
}

// unavailableReadErr tells a read error that means "this counter is not
// supported on this port" from a real failure.
func unavailableReadErr(err error) bool {
	return errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EOPNOTSUPP) ||
		errors.Is(err, syscall.ENODATA) || errors.Is(err, syscall.Errno(524)) // ENOTSUPP, kernel-internal
}

// ParseSysfsCounter parses the contents of one sysfs counter file: a
// decimal uint64 and an optional newline. A value starting with "N/A"
// ("N/A", "N/A (no PMA)") gives ok=false and no error: the driver says the
// counter is not available, which is not 0. Anything else is an error.
func ParseSysfsCounter(b []byte) (v uint64, ok bool, err error) {
	s := string(bytes.TrimRight(b, "\n"))
	if strings.HasPrefix(s, "N/A") {
		return 0, false, nil
	}
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, false, fmt.Errorf("counter %q is not a number", s)
	}
	v, err = strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("counter %q is not a uint64", s)
	}
	return v, true, nil
}

// readAttr reads a one-line attribute; ok=false when the file is absent.
func readAttr(path string) (string, bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read %s: %w", path, err)
	}
	return strings.TrimSpace(string(b)), true, nil
}

// readIBState parses "4: ACTIVE" (state) or "5: LinkUp" (phys_state).
func readIBState(path string) (int, string, error) {
	s, ok, err := readAttr(path)
	if err != nil || !ok {
		return 0, "", err
	}
	num, name, found := strings.Cut(s, ":")
	id, err := strconv.Atoi(num)
	if !found || err != nil || id < 0 || strings.TrimSpace(name) == "" {
		return 0, "", fmt.Errorf("%s: want \"N: NAME\", got %q", path, s)
	}
	return id, strings.TrimSpace(name), nil
}

// parseIBRate parses the rate attribute, "25 Gb/sec (1X EDR)",
// "2.5 Gb/sec (1X SDR)", "400 Gb/sec (4X NDR)", into bytes/s.
func parseIBRate(s string) (uint64, error) {
	num, rest, _ := strings.Cut(s, " ")
	if !strings.HasPrefix(rest, "Gb/sec") {
		return 0, fmt.Errorf("rate %q: want \"N Gb/sec ...\"", s)
	}
	g, err := strconv.ParseFloat(num, 64)
	if err != nil || g < 0 || g > 1e9 || math.IsNaN(g) {
		return 0, fmt.Errorf("rate %q: %q is not a number of Gb/sec", s, num)
	}
	return uint64(math.Round(g * 1e9 / 8)), nil
}

// ibNetDevs finds the network devices of a port: gid_attrs/ndevs/<index>
// holds the netdev of each GID table entry (RoCE); an unused entry reads
// empty or fails with EINVAL/ENODATA. Without any (InfiniBand link layer,
// kernels before 4.14), the PCI function's net/<name> whose dev_port is
// port-1 (the second port of a dual-port mlx4 function has dev_port 1).
func ibNetDevs(devDir, portDir string, port int) ([]string, error) {
	var names []string
	ndevs := filepath.Join(portDir, "gid_attrs", "ndevs")
	ents, err := os.ReadDir(ndevs)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", ndevs, err)
	}
	for _, e := range ents {
		p := filepath.Join(ndevs, e.Name())
		b, err := os.ReadFile(p)
		if unavailableReadErr(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		if n := strings.TrimSpace(string(b)); n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		netDir := filepath.Join(devDir, "device", "net")
		ents, err := os.ReadDir(netDir)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("read %s: %w", netDir, err)
		}
		for _, e := range ents {
			s, ok, err := readAttr(filepath.Join(netDir, e.Name(), "dev_port"))
			if err != nil {
				return nil, err
			}
			if ok && s != strconv.Itoa(port-1) {
				continue
			}
			if !ok && len(ents) > 1 {
				continue // cannot tell which port this netdev belongs to
			}
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}
