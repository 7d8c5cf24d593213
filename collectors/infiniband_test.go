package collectors

import (
	"bufio"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs/sysfs"

	"github.com/lanewatch/lanewatch/internal/sysfstest"
)

// flatFile is one "path: value" (flattened fixture) or "path:value" (grep
// "" FILES) line of a sample in testdata/infiniband.
type flatFile struct{ rel, value string }

// readFlat reads a flattened sysfs sample. Paths start at "sys/" or
// "/sys/"; rel is the rest (class/infiniband/...).
func readFlat(t *testing.T, sample string) []flatFile {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "infiniband", sample))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []flatFile
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			t.Fatalf("%s: %q is not path:value", sample, sc.Text())
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(path, "/"), "sys/")
		out = append(out, flatFile{rel, strings.TrimPrefix(val, " ")})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// buildIBTree writes the sample into a sysfs tree with the real layout:
// class/infiniband/<dev> is a symlink to the PCI function's
// infiniband/<dev> (sysfstest), every value with the kernel's newline.
func buildIBTree(t *testing.T, fx sysfstest.Host, samples ...string) string {
	t.Helper()
	root := sysfstest.Build(t, fx)
	for _, s := range samples {
		for _, f := range readFlat(t, s) {
			sysfstest.Write(t, filepath.Join(root, f.rel), f.value+"\n")
		}
	}
	return root
}

var (
	mlx4Host = sysfstest.Host{Funcs: []sysfstest.Func{{BDF: "0000:81:00.0", HB: "pci0000:80",
		Class: "0x020700", Vendor: "0x15b3", Device: "0x1003", RDMA: []string{"mlx4_0"}}}}
	mlx5Host = sysfstest.Host{Funcs: []sysfstest.Func{{BDF: "0000:17:00.0", HB: "pci0000:16",
		Class: "0x020700", Vendor: "0x15b3", Device: "0x1013", RDMA: []string{"mlx5_0"}}}}
)

// wantFromSample is what ReadInfiniBand must give for every counter file of
// a sample, computed independently of the reader: words ×4 under a _bytes
// name, lifespan out of the maps.
func wantFromSample(t *testing.T, sample, dev string, port int) (counters, hw map[string]uint64) {
	counters, hw = map[string]uint64{}, map[string]uint64{}
	pre := "class/infiniband/" + dev + "/ports/" + strconv.Itoa(port) + "/"
	for _, f := range readFlat(t, sample) {
		rest, ok := strings.CutPrefix(f.rel, pre)
		if !ok {
			continue
		}
		dir, name, ok := strings.Cut(rest, "/")
		if !ok || (dir != "counters" && dir != "hw_counters") || name == "lifespan" {
			continue
		}
		v, err := strconv.ParseUint(f.value, 10, 64)
		if err != nil {
			t.Fatalf("%s: %s: %v", sample, f.rel, err)
		}
		if name == "port_rcv_data" || name == "port_xmit_data" {
			v *= 4
			name += "_bytes"
		}
		if dir == "counters" {
			counters[name] = v
		} else {
			hw[name] = v
		}
	}
	return counters, hw
}

func TestReadInfiniBandSamples(t *testing.T) {
	type portWant struct {
		dev                        string
		port                       int
		state, phys, rate, linkLay string
		stateID, physID            int
		rateBps                    uint64
		lifespan                   time.Duration
		spot                       map[string]uint64 // literal values from the sample, bytes already ×4
		spotHW                     map[string]uint64
		nCounters, nHW             int
	}
	tests := []struct {
		sample string
		host   sysfstest.Host
		ports  []portWant
	}{
		{"prometheus-procfs_fixture_mlx4_0_2port_counters.txt", mlx4Host, []portWant{
			{dev: "mlx4_0", port: 1, state: "ACTIVE", stateID: 4, phys: "LinkUp", physID: 5,
				rate: "40 Gb/sec (4X QDR)", rateBps: 5_000_000_000, linkLay: "InfiniBand",
				spot: map[string]uint64{"port_rcv_data_bytes": 2221223609 * 4, "port_xmit_data_bytes": 26509113295 * 4,
					"port_rcv_packets": 87169372, "port_xmit_packets": 85734114, "port_xmit_wait": 3599,
					"symbol_error": 0, "link_downed": 0, "VL15_dropped": 0},
				nCounters: 17},
			{dev: "mlx4_0", port: 2, state: "ACTIVE", stateID: 4, phys: "LinkUp", physID: 5,
				rate: "40 Gb/sec (4X QDR)", rateBps: 5_000_000_000, linkLay: "InfiniBand",
				spot: map[string]uint64{"port_rcv_data_bytes": 2460436784 * 4, "port_xmit_data_bytes": 26540356890 * 4,
					"port_rcv_packets": 89332064, "port_xmit_packets": 88622850, "port_xmit_wait": 3846},
				nCounters: 17},
		}},
		{"prometheus-procfs_fixture_mlx5_0_IB-EDR_counters_and_hw_counters.txt", mlx5Host, []portWant{
			{dev: "mlx5_0", port: 1, state: "ACTIVE", stateID: 4, phys: "ACTIVE", physID: 4,
				rate: "25 Gb/sec (1X EDR)", rateBps: 3_125_000_000, linkLay: "InfiniBand", lifespan: 10 * time.Millisecond,
				spot: map[string]uint64{"port_rcv_data_bytes": 18126345378 * 4, "port_xmit_data_bytes": 2880761508848 * 4,
					"port_rcv_packets": 541889824, "port_xmit_packets": 10907922116, "unicast_xmit_packets": 10907922116,
					"port_xmit_wait": 0},
				spotHW: map[string]uint64{"duplicate_request": 41, "local_ack_timeout_err": 131, "out_of_sequence": 1,
					"packet_seq_err": 1, "req_cqe_error": 3481, "req_cqe_flush_error": 80, "resp_cqe_error": 8109,
					"resp_cqe_flush_error": 4708, "roce_adp_retrans": 99, "roce_adp_retrans_to": 4,
					"roce_slow_restart_cnps": 131, "rx_read_requests": 175528982, "rx_write_requests": 742114,
					"rnr_nak_retry_err": 0, "implied_nak_seq_err": 0, "out_of_buffer": 0},
				nCounters: 21, nHW: 24},
		}},
		// a RoCE host's hw_counters, grep excerpt only: no state/rate files
		{"byteps-issue-179_mlx5_0_hw_counters_PARTIAL_grep.txt", mlx5Host, []portWant{
			{dev: "mlx5_0", port: 1, lifespan: 12 * time.Millisecond,
				spotHW: map[string]uint64{"duplicate_request": 0, "implied_nak_seq_err": 0,
					"local_ack_timeout_err": 2705, "np_cnp_sent": 1333, "np_ecn_marked_roce_packets": 0},
				nHW: 5},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.sample, func(t *testing.T) {
			root := buildIBTree(t, tt.host, tt.sample)
			got, err := ReadInfiniBand(root)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.ports) {
				t.Fatalf("%d ports, want %d: %+v", len(got), len(tt.ports), got)
			}
			for i, w := range tt.ports {
				p := got[i]
				if p.Device != w.dev || p.Port != w.port || p.State != w.state || p.StateID != w.stateID ||
					p.PhysState != w.phys || p.PhysStateID != w.physID || p.Rate != w.rate ||
					p.RateBytesPerSecond != w.rateBps || p.LinkLayer != w.linkLay || p.Lifespan != w.lifespan {
					t.Errorf("port %d: got %+v", i, p)
				}
				if len(p.Counters) != w.nCounters || len(p.HWCounters) != w.nHW {
					t.Errorf("%s/%d: %d counters, %d hw_counters; want %d, %d", p.Device, p.Port,
						len(p.Counters), len(p.HWCounters), w.nCounters, w.nHW)
				}
				wc, wh := wantFromSample(t, tt.sample, w.dev, w.port)
				if !reflect.DeepEqual(p.Counters, wc) {
					t.Errorf("%s/%d counters:\n got %v\nwant %v", p.Device, p.Port, p.Counters, wc)
				}
				if !reflect.DeepEqual(p.HWCounters, wh) {
					t.Errorf("%s/%d hw_counters:\n got %v\nwant %v", p.Device, p.Port, p.HWCounters, wh)
				}
				for k, v := range w.spot {
					if g, ok := p.Counters[k]; !ok || g != v {
						t.Errorf("%s/%d counters/%s = %d, %v; want %d", p.Device, p.Port, k, g, ok, v)
					}
				}
				for k, v := range w.spotHW {
					if g, ok := p.HWCounters[k]; !ok || g != v {
						t.Errorf("%s/%d hw_counters/%s = %d, %v; want %d", p.Device, p.Port, k, g, ok, v)
					}
				}
				if _, raw := p.Counters["port_rcv_data"]; raw {
					t.Error("raw word counter port_rcv_data kept beside the bytes")
				}
				if len(p.Unavailable) != 0 || len(p.NetDevs) != 0 {
					t.Errorf("unavailable %v, netdevs %v; want none", p.Unavailable, p.NetDevs)
				}
			}
		})
	}
}

// TestReadInfiniBandAgreesWithProcfs reads the same trees with
// prometheus/procfs, which knows a fixed set of counters, and checks that
// every value it has agrees with ours (its data counters are ×4 too).
func TestReadInfiniBandAgreesWithProcfs(t *testing.T) {
	for _, tc := range []struct {
		sample string
		host   sysfstest.Host
	}{
		{"prometheus-procfs_fixture_mlx4_0_2port_counters.txt", mlx4Host},
		{"prometheus-procfs_fixture_mlx5_0_IB-EDR_counters_and_hw_counters.txt", mlx5Host},
	} {
		root := buildIBTree(t, tc.host, tc.sample)
		fs, err := sysfs.NewFS(root)
		if err != nil {
			t.Fatal(err)
		}
		class, err := fs.InfiniBandClass()
		if err != nil {
			t.Fatal(err)
		}
		ours, err := ReadInfiniBand(root)
		if err != nil {
			t.Fatal(err)
		}
		compared := 0
		for _, p := range ours {
			pp := class[p.Device].Ports[uint(p.Port)]
			if pp.State != p.State || pp.PhysState != p.PhysState || pp.LinkLayer != p.LinkLayer || pp.Rate != p.RateBytesPerSecond {
				t.Errorf("%s/%d: procfs %+v, ours %+v", p.Device, p.Port, pp, p)
			}
			for _, side := range []struct {
				theirs any
				ours   map[string]uint64
			}{{pp.Counters, p.Counters}, {pp.HwCounters, p.HWCounters}} {
				v := reflect.ValueOf(side.theirs)
				for i := range v.NumField() {
					f := v.Field(i)
					if f.IsNil() {
						continue
					}
					name := procfsFieldFile(t, v.Type().Field(i).Name)
					if name == "lifespan" || strings.HasPrefix(name, "Legacy") {
						continue
					}
					g, ok := side.ours[name]
					if !ok || g != f.Elem().Uint() {
						t.Errorf("%s/%d %s: procfs %d, ours %d (%v)", p.Device, p.Port, name, f.Elem().Uint(), g, ok)
					}
					compared++
				}
			}
		}
		if compared < 20 {
			t.Errorf("%s: only %d values compared", tc.sample, compared)
		}
	}
}

// procfsFieldFile maps a procfs field name to the sysfs file (and our name
// for the word counters).
func procfsFieldFile(t *testing.T, field string) string {
	special := map[string]string{"VL15Dropped": "VL15_dropped", "PortRcvData": "port_rcv_data_bytes",
		"PortXmitData": "port_xmit_data_bytes"}
	if s, ok := special[field]; ok {
		return s
	}
	if strings.HasPrefix(field, "Legacy") {
		return field
	}
	var b strings.Builder
	for i, r := range field {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

func TestReadInfiniBandUnavailableAndGarbage(t *testing.T) {
	const sample = "prometheus-procfs_fixture_mlx5_0_IB-EDR_counters_and_hw_counters.txt"
	port := "class/infiniband/mlx5_0/ports/1/"

	t.Run("N/A is unavailable, not 0", func(t *testing.T) {
		root := buildIBTree(t, mlx5Host, sample)
		sysfstest.Write(t, filepath.Join(root, port, "counters/port_xmit_wait"), "N/A (no PMA)\n")
		sysfstest.Write(t, filepath.Join(root, port, "hw_counters/np_cnp_sent"), "N/A\n")
		ps, err := ReadInfiniBand(root)
		if err != nil {
			t.Fatal(err)
		}
		p := ps[0]
		if _, ok := p.Counters["port_xmit_wait"]; ok {
			t.Error("N/A port_xmit_wait has a value")
		}
		if _, ok := p.HWCounters["np_cnp_sent"]; ok {
			t.Error("N/A np_cnp_sent has a value")
		}
		if want := []string{"counters/port_xmit_wait", "hw_counters/np_cnp_sent"}; !reflect.DeepEqual(p.Unavailable, want) {
			t.Errorf("unavailable %v, want %v", p.Unavailable, want)
		}
		if p.HWCounters["out_of_sequence"] != 1 {
			t.Error("other counters lost")
		}
		s, err := RDMACounters{SysRoot: root}.Sample()
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"mlx5_0/1/counters/port_xmit_wait", "mlx5_0/1/hw_counters/np_cnp_sent"}; !reflect.DeepEqual(s.Unavailable, want) {
			t.Errorf("snapshot unavailable %v, want %v", s.Unavailable, want)
		}
	})

	for _, bad := range []struct{ file, content, want string }{
		{"hw_counters/out_of_sequence", "12abc\n", "hw_counters/out_of_sequence: counter \"12abc\""},
		{"counters/port_rcv_data", "-1\n", "counters/port_rcv_data: counter \"-1\""},
		{"counters/symbol_error", "\n", "counters/symbol_error: counter \"\""},
		{"counters/port_xmit_data", "18446744073709551615\n", "words overflow bytes"},
		{"counters/link_downed", "99999999999999999999\n", "not a uint64"},
		{"state", "ACTIVE\n", "state: want \"N: NAME\""},
		{"rate", "fast\n", "rate: rate \"fast\""},
	} {
		t.Run(bad.file, func(t *testing.T) {
			root := buildIBTree(t, mlx5Host, sample)
			sysfstest.Write(t, filepath.Join(root, port, bad.file), bad.content)
			_, err := ReadInfiniBand(root)
			if err == nil || !strings.Contains(err.Error(), bad.want) || !strings.Contains(err.Error(), root) {
				t.Fatalf("error %v, want one naming the file and %q", err, bad.want)
			}
		})
	}
}

func TestReadInfiniBandNetDevs(t *testing.T) {
	t.Run("RoCE gid_attrs/ndevs", func(t *testing.T) {
		// byteps#179's host: mlx5_0 port 1 is RoCE on enp178s0f0. The
		// gid_attrs entries are built here (the issue shows none): index 0
		// and 1 on the netdev, 2 unused (empty).
		host := sysfstest.Host{Funcs: []sysfstest.Func{{BDF: "0000:b2:00.0", HB: "pci0000:b0",
			Class: "0x020000", Vendor: "0x15b3", Device: "0x1017", Net: []string{"enp178s0f0"}, RDMA: []string{"mlx5_0"}}}}
		root := buildIBTree(t, host, "byteps-issue-179_mlx5_0_hw_counters_PARTIAL_grep.txt")
		port := filepath.Join(root, "class/infiniband/mlx5_0/ports/1")
		sysfstest.Write(t, filepath.Join(port, "link_layer"), "Ethernet\n")
		sysfstest.Write(t, filepath.Join(port, "gid_attrs/ndevs/0"), "enp178s0f0\n")
		sysfstest.Write(t, filepath.Join(port, "gid_attrs/ndevs/1"), "enp178s0f0\n")
		sysfstest.Write(t, filepath.Join(port, "gid_attrs/ndevs/2"), "")
		ps, err := ReadInfiniBand(root)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ps[0].NetDevs, []string{"enp178s0f0"}) {
			t.Errorf("netdevs %v", ps[0].NetDevs)
		}
		devs, err := RoCENetDevs(root)
		if err != nil || !reflect.DeepEqual(devs, []string{"enp178s0f0"}) {
			t.Errorf("RoCENetDevs %v, %v", devs, err)
		}
	})
	t.Run("dual-port function, dev_port", func(t *testing.T) {
		host := mlx4Host
		host.Funcs = []sysfstest.Func{host.Funcs[0]}
		host.Funcs[0].Net = []string{"ib0", "ib1"}
		root := buildIBTree(t, host, "prometheus-procfs_fixture_mlx4_0_2port_counters.txt")
		pci := filepath.Join(root, "devices/pci0000:80/0000:81:00.0")
		sysfstest.Write(t, filepath.Join(pci, "net/ib0/dev_port"), "0\n")
		sysfstest.Write(t, filepath.Join(pci, "net/ib1/dev_port"), "1\n")
		ps, err := ReadInfiniBand(root)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ps[0].NetDevs, []string{"ib0"}) || !reflect.DeepEqual(ps[1].NetDevs, []string{"ib1"}) {
			t.Errorf("netdevs %v, %v", ps[0].NetDevs, ps[1].NetDevs)
		}
		// InfiniBand link layer: not RoCE, no ethtool PFC to read
		if devs, err := RoCENetDevs(root); err != nil || len(devs) != 0 {
			t.Errorf("RoCENetDevs %v, %v", devs, err)
		}
	})
}

func TestReadInfiniBandEmpty(t *testing.T) {
	root := t.TempDir()
	ps, err := ReadInfiniBand(root)
	if err != nil || len(ps) != 0 {
		t.Errorf("host without RDMA: %v, %v", ps, err)
	}
	if _, err := ReadInfiniBand(filepath.Join(root, "nope")); err == nil {
		t.Error("missing sysfs root is not an error")
	}
}

func TestParseSysfsCounter(t *testing.T) {
	for _, tt := range []struct {
		in     string
		v      uint64
		ok     bool
		hasErr bool
	}{
		{"0\n", 0, true, false},
		{"2880761508848\n", 2880761508848, true, false},
		{"18446744073709551615", 1<<64 - 1, true, false},
		{"N/A (no PMA)\n", 0, false, false},
		{"N/A\n", 0, false, false},
		{"", 0, false, true},
		{"+1\n", 0, false, true},
		{" 1\n", 0, false, true},
		{"0x10\n", 0, false, true},
		{"1 2\n", 0, false, true},
		{"18446744073709551616\n", 0, false, true},
	} {
		v, ok, err := ParseSysfsCounter([]byte(tt.in))
		if v != tt.v || ok != tt.ok || (err != nil) != tt.hasErr {
			t.Errorf("%q: %d, %v, %v", tt.in, v, ok, err)
		}
	}
}

func FuzzParseSysfsCounter(f *testing.F) {
	for _, s := range []string{"0\n", "2880761508848\n", "N/A (no PMA)\n", "N/A\n", "", "-1", "1e3\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, ok, err := ParseSysfsCounter(b)
		switch {
		case err != nil && ok:
			t.Fatal("error and a value")
		case ok:
			if w, err := strconv.ParseUint(strings.TrimRight(string(b), "\n"), 10, 64); err != nil || w != v {
				t.Fatalf("%q read as %d", b, v)
			}
		case err == nil && !strings.HasPrefix(string(b), "N/A"):
			t.Fatalf("%q: neither a value, unavailable nor an error", b)
		}
	})
}

// TestReadInfiniBandLive reads this host's /sys: no error, whatever RDMA
// devices it has (none on the development machine and CI).
func TestReadInfiniBandLive(t *testing.T) {
	ps, err := ReadInfiniBand("/sys")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Device == "" || p.Port < 1 {
			t.Errorf("port %+v", p)
		}
	}
	t.Logf("%d RDMA ports", len(ps))
}
