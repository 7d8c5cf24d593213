package collectors

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/lanewatch/lanewatch/internal/sysfstest"
)

// A process's fd table as the kernel shows it: links to the verbs devices
// it opened (ibv_open_device), rdma_cm (librdmacm), a socket, a file.
func TestRDMADevicesOf(t *testing.T) {
	proc, sys := t.TempDir(), t.TempDir()
	for node, dev := range map[string]string{"uverbs0": "mlx5_0", "uverbs1": "mlx5_1", "uverbs2": "mlx4_0"} {
		sysfstest.Write(t, filepath.Join(sys, "class", "infiniband_verbs", node, "ibdev"), dev+"\n")
	}
	fds := map[int]map[string]string{
		100: {"0": "/dev/null", "3": "/dev/infiniband/rdma_cm", "4": "/dev/infiniband/uverbs1", "5": "socket:[51234]", "6": "/dev/infiniband/uverbs0",
			"7": "/dev/infiniband/uverbs1"},
		200: {"5": "/dev/infiniband/uverbs2"},
		300: {"1": "/tmp/kv pool.bin", "2": "/dev/infiniband/uverbs9"}, // a device gone from sysfs
	}
	for pid, links := range fds {
		dir := filepath.Join(proc, strconv.Itoa(pid), "fd")
		sysfstest.Mkdir(t, dir)
		for fd, target := range links {
			if err := os.Symlink(target, filepath.Join(dir, fd)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for pid, want := range map[int][]string{100: {"mlx5_0", "mlx5_1"}, 200: {"mlx4_0"}, 300: nil} {
		got, err := RDMADevicesOf(proc, sys, pid)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("pid %d: %v %v, want %v", pid, got, err, want)
		}
	}
	if _, err := RDMADevicesOf(proc, sys, 400); err == nil {
		t.Error("a process that is gone gave no error")
	}
	// This test process, as the kernel shows it: no verbs device open.
	if got, err := RDMADevicesOf("/proc", "/sys", os.Getpid()); err != nil || len(got) != 0 {
		t.Errorf("this process: %v %v", got, err)
	}
}

func TestUverbsNode(t *testing.T) {
	for target, want := range map[string]string{
		"/dev/infiniband/uverbs0": "uverbs0", "/dev/infiniband/uverbs12": "uverbs12",
		"/dev/infiniband/rdma_cm": "", "/dev/infiniband/umad0": "", "/dev/infiniband/uverbs": "", "/dev/infiniband/uverbsX": "",
		"/dev/uverbs0": "", "uverbs0": "", "/dev/infiniband/uverbs0 (deleted)": "",
	} {
		got, ok := UverbsNode(target)
		if got != want || ok != (want != "") {
			t.Errorf("%q: %q %v, want %q", target, got, ok, want)
		}
	}
}

func FuzzUverbsNode(f *testing.F) {
	for _, s := range []string{"/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm", "socket:[1]", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if node, ok := UverbsNode(s); ok && (filepath.Join("/dev/infiniband", node) != s || filepath.Base(node) != node) {
			t.Fatalf("%q gave %q", s, node)
		}
	})
}
