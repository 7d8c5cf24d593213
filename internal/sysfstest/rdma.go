package sysfstest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// RDMA samples (collectors/testdata/infiniband, copies of
// shared/samples/rdma_sysfs_counters): byteps#179's RoCE mlx5 hw_counters
// (np_cnp_sent 1333, local_ack_timeout_err 2705) and the procfs fixture's
// two-port InfiniBand mlx4.
const (
	BytepsMlx5 = "byteps-issue-179_mlx5_0_hw_counters_PARTIAL_grep.txt"
	ProcfsMlx4 = "prometheus-procfs_fixture_mlx4_0_2port_counters.txt"
)

// RDMAHost builds a host with two RDMA NICs from the samples under
// testdata (a collectors/testdata/infiniband directory): mlx5_0, a RoCE
// port whose hw_counters are byteps#179's (its netdev enp178s0f0, as in
// that issue; the sample lacks the port's attributes, so state, rate and
// link layer are written here: ACTIVE, 100 Gb/s, Ethernet), and mlx4_0,
// the procfs fixture's two InfiniBand ports at 40 Gb/s. The verbs devices
// are uverbs0 (mlx5_0) and uverbs1 (mlx4_0). It returns the sysfs root.
func RDMAHost(t testing.TB, testdata string) string {
	t.Helper()
	root := Build(t, Host{
		Nodes: []Node{{CPUs: "0-3", Distance: "10"}},
		Funcs: []Func{
			{BDF: "0000:af:00.0", HB: "pci0000:ae", Class: "0x020000", Vendor: "0x15b3", Device: "0x1017", NUMA: "0",
				Net: []string{"enp178s0f0"}, RDMA: []string{"mlx5_0"}},
			{BDF: "0000:81:00.0", HB: "pci0000:80", Class: "0x020700", Vendor: "0x15b3", Device: "0x1003", NUMA: "0",
				RDMA: []string{"mlx4_0"}},
		},
	})
	WriteFlat(t, root, filepath.Join(testdata, BytepsMlx5))
	WriteFlat(t, root, filepath.Join(testdata, ProcfsMlx4))
	port := filepath.Join(root, "class", "infiniband", "mlx5_0", "ports", "1")
	for name, v := range map[string]string{"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "100 Gb/sec (4X EDR)",
		"link_layer": "Ethernet", "gid_attrs/ndevs/0": "enp178s0f0"} {
		Write(t, filepath.Join(port, name), v+"\n")
	}
	for node, dev := range map[string]string{"uverbs0": "mlx5_0", "uverbs1": "mlx4_0"} {
		Write(t, filepath.Join(root, "class", "infiniband_verbs", node, "ibdev"), dev+"\n")
	}
	return root
}

// OpenVerbs gives process pid of the procfs tree procRoot an fd open on
// each verbs node ("uverbs0"), as ibv_open_device leaves it.
func OpenVerbs(t testing.TB, procRoot string, pid int, nodes ...string) {
	t.Helper()
	dir := filepath.Join(procRoot, strconv.Itoa(pid), "fd")
	Mkdir(t, dir)
	for i, n := range nodes {
		if err := os.Symlink("/dev/infiniband/"+n, filepath.Join(dir, strconv.Itoa(10+i))); err != nil {
			t.Fatal(err)
		}
	}
}

// AddCounter adds delta to the counter file at path (a sysfs counter: a
// decimal and a newline), as the kernel's count moves on.
func AddCounter(t testing.TB, path string, delta uint64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	Write(t, path, strconv.FormatUint(v+delta, 10)+"\n")
}
