package collectors

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseMeminfoCaptures(t *testing.T) {
	tests := []struct {
		file   string
		want   Meminfo // Fields not compared
		fields int
	}{
		// the development machine, Linux 6.18
		{"lanewatch-dev.meminfo", Meminfo{MemTotalBytes: 24684084 * 1024, MemAvailableBytes: 24242444 * 1024, MlockedBytes: 12996 * 1024,
			HugePagesTotal: 0, HugePagesFree: 0, HugepagesizeBytes: 2 << 20}, 54},
		// public "grep Huge /proc/meminfo" of an Oracle host with 40 GiB of 2 MiB pages
		{"public_oracle_grep_Huge.meminfo", Meminfo{HugePagesTotal: 20480, HugePagesFree: 12292, HugepagesizeBytes: 2 << 20}, 6},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", "meminfo", tt.file)
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			mi, err := ParseMeminfo(f, path)
			if err != nil {
				t.Fatal(err)
			}
			fields := mi.Fields
			mi.Fields = nil
			if !reflect.DeepEqual(mi, tt.want) {
				t.Errorf("got  %+v\nwant %+v", mi, tt.want)
			}
			if len(fields) != tt.fields {
				t.Errorf("%d fields, want %d", len(fields), tt.fields)
			}
			if _, ok := fields["HugePages_Rsvd"]; !ok {
				t.Error("HugePages_Rsvd missing from Fields")
			}
		})
	}
}

func TestReadMeminfoLive(t *testing.T) {
	mi, err := ReadMeminfo("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if mi.MemTotalBytes == 0 || mi.MemAvailableBytes > mi.MemTotalBytes || mi.Fields["MemTotal"] != mi.MemTotalBytes {
		t.Errorf("live meminfo: %+v", mi)
	}
	if _, err := ReadMeminfo(t.TempDir()); err == nil {
		t.Error("no meminfo: no error")
	}
}

func TestParseMeminfoErrors(t *testing.T) {
	tests := []struct{ text, want string }{
		{"MemTotal: 1 kB\nbogus\n", "m:2: want"},
		{"MemTotal: x kB\n", "m:1: MemTotal: \"x\" is not a number"},
		{"MemTotal: 1 MB\n", "m:1: MemTotal: unit \"MB\""},
		{"MemTotal: 1 kB extra\n", "m:1: MemTotal: want a number"},
		{"MemTotal:\n", "m:1: MemTotal: want a number"},
		{"MemTotal: 18014398509481984 kB\n", "m:1: MemTotal: 18014398509481984 kB overflows"},
		{"MemTotal: 1 kB\nMemTotal: 2 kB\n", "m:2: MemTotal given twice"},
		{"MemTotal: -1 kB\n", "m:1: MemTotal:"},
		{"Node 0 MemTotal: 1 kB\n", "m:1: want"},
	}
	for _, tt := range tests {
		_, err := ParseMeminfo(strings.NewReader(tt.text), "m")
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want prefix %q", tt.text, err, tt.want)
		}
	}
}

func FuzzParseMeminfo(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "meminfo", "*.meminfo"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		mi, err := ParseMeminfo(strings.NewReader(string(data)), "fuzz.meminfo")
		if !namesFile(t, err, "fuzz.meminfo") {
			return
		}
		if lines := nonBlankLines(data); len(mi.Fields) != lines {
			t.Fatalf("%d fields from %d lines", len(mi.Fields), lines)
		}
	})
}
