package collectors

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseDiskstatsForms(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       DiskStat
	}{
		{"14 fields (iostats.rst 2.6 example, before 4.18)",
			"   3    0   hda 446216 784926 9550688 4382310 424847 312726 5922052 19310380 0 3376340 23705160\n",
			DiskStat{Major: 3, Name: "hda", ReadsCompleted: 446216, ReadsMerged: 784926, SectorsRead: 9550688,
				ReadMs: 4382310, WritesCompleted: 424847, WritesMerged: 312726, SectorsWritten: 5922052,
				WriteMs: 19310380, IOMs: 3376340, WeightedIOMs: 23705160}},
		{"18 fields (4.18+, discards)",
			" 254       0 vda 1068111 78132 29172610 960691 458327 797101 106345592 878986 0 162192 1918600 1016190 48 169660328 77019\n",
			DiskStat{Major: 254, Name: "vda", ReadsCompleted: 1068111, ReadsMerged: 78132, SectorsRead: 29172610,
				ReadMs: 960691, WritesCompleted: 458327, WritesMerged: 797101, SectorsWritten: 106345592,
				WriteMs: 878986, IOMs: 162192, WeightedIOMs: 1918600, HasDiscards: true,
				DiscardsCompleted: 1016190, DiscardsMerged: 48, SectorsDiscarded: 169660328, DiscardMs: 77019}},
		{"20 fields (5.5+, flushes)",
			" 254       0 vda 1068111 78132 29172610 960691 458327 797101 106345592 878986 3 162192 1918600 1016190 48 169660328 77019 29495 1902\n",
			DiskStat{Major: 254, Name: "vda", ReadsCompleted: 1068111, ReadsMerged: 78132, SectorsRead: 29172610,
				ReadMs: 960691, WritesCompleted: 458327, WritesMerged: 797101, SectorsWritten: 106345592,
				WriteMs: 878986, InFlight: 3, IOMs: 162192, WeightedIOMs: 1918600, HasDiscards: true,
				DiscardsCompleted: 1016190, DiscardsMerged: 48, SectorsDiscarded: 169660328, DiscardMs: 77019,
				HasFlushes: true, FlushesCompleted: 29495, FlushMs: 1902}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDiskstats(strings.NewReader(tc.text), "diskstats")
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestParseDiskstatsRealFile(t *testing.T) {
	p := filepath.Join("testdata", "diskstats", "lanewatch-dev_6.18.diskstats")
	fh, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	ds, err := ParseDiskstats(fh, p)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range ds {
		names = append(names, d.Name)
		if !d.HasFlushes {
			t.Errorf("%s: 20-field line without flushes", d.Name)
		}
	}
	if got := strings.Join(names, " "); got != "loop0 loop1 loop2 loop3 loop4 loop5 loop6 loop7 vda zram0" {
		t.Fatalf("devices %q", got)
	}
	vda := ds[8]
	if vda.SectorsRead != 29190346 || vda.ReadsCompleted != 1069840 || vda.FlushesCompleted != 29495 {
		t.Fatalf("vda %+v", vda)
	}
}

func TestParseDiskstatsErrors(t *testing.T) {
	ok := " 254 0 vda 1 2 3 4 5 6 7 8 0 10 11\n"
	for _, tc := range []struct{ name, text, want string }{
		{"old partition form (7 fields)", ok + "   3    1   hda1 35486 38030 38030 38030\n", "d:2: 7 fields, want 14, 18 or 20"},
		{"15 fields", " 254 0 vda 1 2 3 4 5 6 7 8 0 10 11 12\n", "d:1: 15 fields"},
		{"negative", " 254 0 vda 1 2 -3 4 5 6 7 8 0 10 11\n", `d:1: vda: field 6 "-3" is not a number`},
		{"plus sign", " 254 0 vda 1 2 +3 4 5 6 7 8 0 10 11\n", `d:1: vda: field 6 "+3" is not a number`},
		{"overflow", " 254 0 vda 18446744073709551616 2 3 4 5 6 7 8 0 10 11\n", "d:1: vda: field 4"},
		{"bad major", " x 0 vda 1 2 3 4 5 6 7 8 0 10 11\n", `d:1: major "x"`},
		{"bad minor", " 1 4294967296 vda 1 2 3 4 5 6 7 8 0 10 11\n", `d:1: minor "4294967296"`},
		{"duplicate", ok + "\n" + ok, "d:3: device vda given twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseDiskstats(strings.NewReader(tc.text), "d")
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("err %v, want prefix %q", err, tc.want)
			}
		})
	}
}

func FuzzParseDiskstats(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("testdata", "diskstats", "lanewatch-dev_6.18.diskstats"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte("   3    0   hda 446216 784926 9550688 4382310 424847 312726 5922052 19310380 0 3376340 23705160\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ds, err := ParseDiskstats(strings.NewReader(string(data)), "fuzz.diskstats")
		if !namesFile(t, err, "fuzz.diskstats") {
			return
		}
		if lines := nonBlankLines(data); len(ds) != lines {
			t.Fatalf("%d devices from %d lines", len(ds), lines)
		}
	})
}

func TestDiskRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	vda := DiskStat{Name: "vda", ReadsCompleted: 100, SectorsRead: 1000, WritesCompleted: 10, SectorsWritten: 80, IOMs: 500}
	vda2 := vda
	vda2.ReadsCompleted, vda2.SectorsRead, vda2.WritesCompleted, vda2.SectorsWritten, vda2.IOMs = 300, 5000, 14, 2080, 1500
	nvme := DiskStat{Name: "nvme0n1", SectorsRead: 1 << 20}
	nvmeReset := DiskStat{Name: "nvme0n1", SectorsRead: 10}
	gone := DiskStat{Name: "sdb", SectorsRead: 5}
	added := DiskStat{Name: "sdc", SectorsRead: 5}

	rates, reset := DiskRates(
		DiskSample{Time: t0, Disks: []DiskStat{vda, nvme, gone}},
		DiskSample{Time: t0.Add(2 * time.Second), Disks: []DiskStat{nvmeReset, added, vda2}})
	if len(rates) != 1 || len(reset) != 1 || reset[0] != "nvme0n1" {
		t.Fatalf("rates %+v reset %v; want only vda, nvme0n1 reset", rates, reset)
	}
	want := DiskRate{Name: "vda", Interval: 2 * time.Second, ReadsPerSec: 100, WritesPerSec: 2,
		ReadBytesPerSec: 4000 * 512 / 2, WriteBytesPerSec: 2000 * 512 / 2, BusyFraction: 0.5}
	if rates[0] != want {
		t.Fatalf("got %+v\nwant %+v", rates[0], want)
	}
	if r, _ := DiskRates(DiskSample{Time: t0, Disks: []DiskStat{vda}}, DiskSample{Time: t0, Disks: []DiskStat{vda2}}); r != nil {
		t.Fatalf("zero interval gave rates %+v", r)
	}
}
