package checks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/probes"
)

const cufileMaps = "7f0000002000-7f0000003000 r-xp 00000000 fd:01 1234 /usr/local/cuda/lib64/libcufile.so.1.9.0\n"
const libcMaps = "7f0000000000-7f0000001000 r-xp 00000000 fd:01 99 /usr/lib/libc.so.6\n"

func procWithMaps(t *testing.T, byPID map[string]string) string {
	proc := t.TempDir()
	for pid, maps := range byPID {
		sysfstest.Write(t, filepath.Join(proc, pid, "maps"), maps)
	}
	return proc
}

func TestGDSCheck(t *testing.T) {
	withModule := t.TempDir()
	sysfstest.Mkdir(t, filepath.Join(withModule, "module", "nvidia_fs"))
	noModule := t.TempDir()
	sysfstest.Mkdir(t, filepath.Join(noModule, "module", "nvidia"))
	for _, tc := range []struct {
		name      string
		proc, sys string
		status    Status
		detail    string
	}{
		{"GDS in use", procWithMaps(t, map[string]string{"10": libcMaps, "42": libcMaps + cufileMaps}), withModule,
			Pass, "nvidia_fs module loaded; libcufile mapped by pid 42: the direct storage→GPU path is available"},
		{"compatibility mode", procWithMaps(t, map[string]string{"10": libcMaps, "42": libcMaps + cufileMaps}), noModule,
			Warn, "nvidia_fs module not loaded; libcufile mapped by pid 42: cuFile runs in compatibility mode"},
		{"neither", procWithMaps(t, map[string]string{"10": libcMaps}), noModule,
			Info, "nvidia_fs module not loaded; no process maps libcufile (1 processes read): GDS not in use"},
		{"no module directory", procWithMaps(t, map[string]string{"10": libcMaps}), t.TempDir(),
			Skip, "cannot tell whether nvidia_fs is loaded"},
		{"no readable maps", t.TempDir(), withModule,
			Skip, "nvidia_fs module loaded, but no process's maps were readable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := GDSCheck(tc.proc, tc.sys, probes.MappedFiles)
			if c.Status != tc.status || !strings.HasPrefix(c.Detail, tc.detail) || c.Name != CheckGDS {
				t.Fatalf("got %s %q, want %s %q", c.Status, c.Detail, tc.status, tc.detail)
			}
		})
	}
}

// TestGDSCheckRealHost: on this host, what the check says of nvidia_fs
// must match sysfs, and its status whether a process maps libcufile, read
// here from /proc/PID/maps text (the check reads map_files).
func TestGDSCheckRealHost(t *testing.T) {
	c := GDSCheck("/proc", "/sys", probes.MappedFiles)
	t.Logf("%s: %s", c.Status, c.Detail)
	_, err := os.Stat("/sys/module/nvidia_fs")
	loaded := err == nil
	want, status := "nvidia_fs module not loaded", Info
	if loaded {
		want = "nvidia_fs module loaded"
	}
	maps, err := filepath.Glob("/proc/[0-9]*/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range maps {
		if b, err := os.ReadFile(m); err == nil && strings.Contains(string(b), "/libcufile") {
			status = map[bool]Status{true: Pass, false: Warn}[loaded]
			break
		}
	}
	if c.Status != status || !strings.HasPrefix(c.Detail, want+";") {
		t.Fatalf("got %s %q, want %s starting %q", c.Status, c.Detail, status, want)
	}
}

// TestStorageCheck: an NVMe drive under the GPU's switch, a virtio disk
// on a root port of node 1, and loop0 (not on PCI).
func TestStorageCheck(t *testing.T) {
	br := func(bdf, parent, hb, node string) sysfstest.Func {
		return sysfstest.Func{BDF: bdf, Parent: parent, HB: hb, Class: "0x060400", Vendor: "0x1000", Device: "0xc030", NUMA: node}
	}
	sys := sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0-3", Distance: "10 21"}, {CPUs: "4-7", Distance: "21 10"}},
		Funcs: []sysfstest.Func{
			br("0000:15:01.0", "", "pci0000:15", "0"), br("0000:16:00.0", "0000:15:01.0", "", "0"),
			br("0000:17:00.0", "0000:16:00.0", "", "0"), br("0000:17:01.0", "0000:16:00.0", "", "0"),
			{BDF: "0000:19:00.0", Parent: "0000:17:00.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0"},
			{BDF: "0000:1a:00.0", Parent: "0000:17:01.0", Class: "0x010802", Vendor: "0x144d", Device: "0xa80a", NUMA: "0"},
			br("0000:a0:01.0", "", "pci0000:a0", "1"),
			{BDF: "0000:a1:00.0", Parent: "0000:a0:01.0", Class: "0x018000", Vendor: "0x1af4", Device: "0x1042", NUMA: "-1"},
		},
	})
	block := func(dir, name string) {
		sysfstest.Mkdir(t, dir)
		sysfstest.SymlinkRel(t, dir, filepath.Join(sys, "class", "block", name))
	}
	dev := func(bdf string) string {
		d, err := filepath.EvalSymlinks(filepath.Join(sys, "bus", "pci", "devices", bdf))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	block(filepath.Join(dev("0000:1a:00.0"), "nvme", "nvme0", "nvme0n1"), "nvme0n1")
	block(filepath.Join(dev("0000:a1:00.0"), "virtio1", "block", "vda"), "vda")
	block(filepath.Join(sys, "devices", "virtual", "block", "loop0"), "loop0")
	h, err := ReadHost(t.TempDir(), sys, "/nonexistent")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(100, 0)
	prev := collectors.DiskSample{Time: t0, Disks: []collectors.DiskStat{
		{Name: "nvme0n1"}, {Name: "vda"}, {Name: "loop0"}, {Name: "zram0", SectorsRead: 9}, {Name: "sdb"}}}
	cur := collectors.DiskSample{Time: t0.Add(time.Second), Disks: []collectors.DiskStat{
		{Name: "nvme0n1", ReadsCompleted: 1000, SectorsRead: 4 << 20, IOMs: 900},
		{Name: "vda", WritesCompleted: 10, SectorsWritten: 2000},
		{Name: "loop0", ReadsCompleted: 1, SectorsRead: 8},
		{Name: "zram0", SectorsRead: 3}}}
	c := h.StorageCheck(collectors.DiskRates(prev, cur))
	want := "4 block devices, 0 idle; " +
		"loop0 read 0.0 MB/s write 0.0 MB/s busy 0% (placement unknown: not on PCI (/devices/virtual/block/loop0)); " +
		"nvme0n1 read 2147.5 MB/s write 0.0 MB/s busy 90% (0000:1a:00.0, node 0, switch 0000:16:00.0 shared with GPU 0000:19:00.0); " +
		"vda read 0.0 MB/s write 1.0 MB/s busy 0% (0000:a1:00.0, node unknown, no switch); " +
		"counters went back (no rate): zram0"
	if c.Status != Info || c.Detail != want {
		t.Fatalf("got %s\n%q\nwant\n%q", c.Status, c.Detail, want)
	}
}
