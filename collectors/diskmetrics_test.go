package collectors

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Whole devices only (loop, zram and the partition left out), each with
// its placement; the cap counts what it left out.
func TestDiskMetrics(t *testing.T) {
	proc, sys := t.TempDir(), t.TempDir()
	stats := ` 259       0 nvme0n1 100 0 2048 5 10 0 4096 7 0 1500 12 0 0 0 0 3 1
 259       1 nvme0n1p1 100 0 2048 5 10 0 4096 7 0 1500 12 0 0 0 0 3 1
   7       0 loop0 9 0 80 0 0 0 0 0 0 4 0 0 0 0 0 0 0
 252       0 zram0 9 0 80 0 0 0 0 0 0 4 0 0 0 0 0 0 0
 253       0 vda 1 0 8 0 2 0 16 0 0 250 0 0 0 0 0 0 0
`
	if err := os.WriteFile(filepath.Join(proc, "diskstats"), []byte(stats), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"nvme0n1", "nvme0n1p1", "vda"} {
		if err := os.MkdirAll(filepath.Join(sys, "class", "block", d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(sys, "class", "block", "nvme0n1p1", "partition"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	place := func(name string) DiskPlace {
		if name == "nvme0n1" {
			return DiskPlace{PCI: "0000:3d:00.0", NUMANode: "0", Switch: "0000:18:00.0"}
		}
		return DiskPlace{PCI: "unknown", NUMANode: "unknown", Switch: "unknown"}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectorFunc(NewDiskMetrics(proc, sys, place).Update))
	want := `
# HELP lanewatch_disk_devices Whole block devices found: exported, or left out over the cap of 64.
# TYPE lanewatch_disk_devices gauge
lanewatch_disk_devices{state="exported"} 2
lanewatch_disk_devices{state="over_cap"} 0
# HELP lanewatch_disk_io_time_seconds_total Time a block device had I/O in flight (/proc/diskstats io_ticks).
# TYPE lanewatch_disk_io_time_seconds_total counter
lanewatch_disk_io_time_seconds_total{device="nvme0n1",numa_node="0",pci="0000:3d:00.0",switch="0000:18:00.0"} 1.5
lanewatch_disk_io_time_seconds_total{device="vda",numa_node="unknown",pci="unknown",switch="unknown"} 0.25
# HELP lanewatch_disk_read_bytes_total Bytes read from a block device (/proc/diskstats sectors × 512).
# TYPE lanewatch_disk_read_bytes_total counter
lanewatch_disk_read_bytes_total{device="nvme0n1",numa_node="0",pci="0000:3d:00.0",switch="0000:18:00.0"} 1.048576e+06
lanewatch_disk_read_bytes_total{device="vda",numa_node="unknown",pci="unknown",switch="unknown"} 4096
# HELP lanewatch_disk_written_bytes_total Bytes written to a block device (/proc/diskstats sectors × 512).
# TYPE lanewatch_disk_written_bytes_total counter
lanewatch_disk_written_bytes_total{device="nvme0n1",numa_node="0",pci="0000:3d:00.0",switch="0000:18:00.0"} 2.097152e+06
lanewatch_disk_written_bytes_total{device="vda",numa_node="unknown",pci="unknown",switch="unknown"} 8192
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}

	// Over the cap: the first 64 in the kernel's order, the rest counted.
	var b strings.Builder
	for i := range MaxDiskDevices + 3 {
		fmt.Fprintf(&b, "259 %d nvme%dn1 1 0 8 0 0 0 0 0 0 1 0 0 0 0 0 0 0\n", i, i)
	}
	if err := os.WriteFile(filepath.Join(proc, "diskstats"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewRegistry()
	reg.MustRegister(collectorFunc(NewDiskMetrics(proc, sys, nil).Update))
	if n, err := testutil.GatherAndCount(reg, "lanewatch_disk_read_bytes_total"); n != MaxDiskDevices || err != nil {
		t.Errorf("%d devices exported (%v), want %d", n, err, MaxDiskDevices)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP lanewatch_disk_devices Whole block devices found: exported, or left out over the cap of 64.
# TYPE lanewatch_disk_devices gauge
lanewatch_disk_devices{state="exported"} 64
lanewatch_disk_devices{state="over_cap"} 3
`), "lanewatch_disk_devices"); err != nil {
		t.Error(err)
	}

	// This machine, live; and an unreadable diskstats is an error.
	if err := NewDiskMetrics("/proc", "/sys", nil).Update(make(chan prometheus.Metric, 1024)); err != nil {
		t.Errorf("live: %v", err)
	}
	if err := NewDiskMetrics(filepath.Join(proc, "absent"), sys, nil).Update(make(chan prometheus.Metric, 8)); err == nil {
		t.Error("no diskstats: want an error")
	}
}
