package collectors

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// DiskPlace is where a block device sits, as metric labels: its PCI
// function, NUMA node and switch upstream port; "unknown" where not known,
// "none" for a device hanging straight off a root port.
type DiskPlace struct{ PCI, NUMANode, Switch string }

// MaxDiskDevices bounds the devices DiskMetrics exports (in name order);
// the rest are counted in lanewatch_disk_devices{state="over_cap"}.
const MaxDiskDevices = 64

// DiskMetrics exports each whole block device's /proc/diskstats counters
// at scrape time with its placement: bytes read and written, time busy.
// Loop, ram and zram devices and partitions are left out (no DMA of their
// own, or their disk's bytes twice).
type DiskMetrics struct {
	procRoot, sysRoot            string
	place                        func(name string) DiskPlace
	read, written, busy, devices *prometheus.Desc
}

// NewDiskMetrics describes the metrics once; place may be nil (every
// placement "unknown").
func NewDiskMetrics(procRoot, sysRoot string, place func(name string) DiskPlace) *DiskMetrics {
	labels := []string{"device", "pci", "numa_node", "switch"}
	return &DiskMetrics{
		procRoot: procRoot, sysRoot: sysRoot, place: place,
		read:    prometheus.NewDesc("lanewatch_disk_read_bytes_total", "Bytes read from a block device (/proc/diskstats sectors × 512).", labels, nil),
		written: prometheus.NewDesc("lanewatch_disk_written_bytes_total", "Bytes written to a block device (/proc/diskstats sectors × 512).", labels, nil),
		busy:    prometheus.NewDesc("lanewatch_disk_io_time_seconds_total", "Time a block device had I/O in flight (/proc/diskstats io_ticks).", labels, nil),
		devices: prometheus.NewDesc("lanewatch_disk_devices", "Whole block devices found: exported, or left out over the cap of 64.", []string{"state"}, nil),
	}
}

// Describe sends the descriptors Update uses.
func (m *DiskMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.read, m.written, m.busy, m.devices} {
		ch <- d
	}
}

// Update reads diskstats once.
func (m *DiskMetrics) Update(ch chan<- prometheus.Metric) error {
	s, err := ReadDiskstats(m.procRoot)
	if err != nil {
		return err
	}
	n, over := 0, 0
	for _, d := range s.Disks { // the kernel lists them in device order; the cap keeps the first
		if !m.wholeDisk(d.Name) {
			continue
		}
		if n == MaxDiskDevices {
			over++
			continue
		}
		n++
		p := DiskPlace{PCI: "unknown", NUMANode: "unknown", Switch: "unknown"}
		if m.place != nil {
			p = m.place(d.Name)
		}
		lv := []string{d.Name, p.PCI, p.NUMANode, p.Switch}
		ch <- prometheus.MustNewConstMetric(m.read, prometheus.CounterValue, float64(d.SectorsRead)*SectorBytes, lv...)
		ch <- prometheus.MustNewConstMetric(m.written, prometheus.CounterValue, float64(d.SectorsWritten)*SectorBytes, lv...)
		ch <- prometheus.MustNewConstMetric(m.busy, prometheus.CounterValue, float64(d.IOMs)/1000, lv...)
	}
	ch <- prometheus.MustNewConstMetric(m.devices, prometheus.GaugeValue, float64(n), "exported")
	ch <- prometheus.MustNewConstMetric(m.devices, prometheus.GaugeValue, float64(over), "over_cap")
	return nil
}

// WholeDisk reports whether a diskstats name is a whole device worth
// exporting: not loop/ram/zram, not a partition (sysfs "partition" file).
func WholeDisk(sysRoot, name string) bool {
	for _, p := range []string{"loop", "ram", "zram"} {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	_, err := os.Stat(filepath.Join(sysRoot, "class", "block", name, "partition"))
	return err != nil
}

func (m *DiskMetrics) wholeDisk(name string) bool { return WholeDisk(m.sysRoot, name) }
