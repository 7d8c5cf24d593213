package collectors

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// testdata/status: cat's own /proc/self/status on the development machine
// (one node, 2 CPUs, root) and two public captures from a two-node host
// (a Chrome NaCl helper holding only CAP_SYS_ADMIN, and mongod without
// capabilities). See testdata/README.md.

func TestParseStatusCaptures(t *testing.T) {
	tests := []struct {
		file       string
		name       string
		tgid, pid  int
		cpus, mems []int
		capEff     uint64
		sysNice    bool
		fields     int
		peakRSS    uint64
	}{
		{"lanewatch-dev_cat_self.status", "cat", 495, 495, []int{0, 1}, []int{0}, 0x000001fffeffffff, true, 59, 1756 << 10},
		{"public_2node_nacl_helper.status", "nacl_helper", 1823, 1823, seqInts(0, 11), []int{0, 1}, 0x200000, false, 53, 4000 << 10},
		{"public_2node_mongod.status", "mongod", 10112, 10112, seqInts(0, 11), []int{0, 1}, 0, false, 53, 15545956 << 10},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", "status", tt.file)
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			st, err := ParseStatus(f, path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Name != tt.name || st.Tgid != tt.tgid || st.Pid != tt.pid || st.CapEff != tt.capEff || !st.HasCapEff {
				t.Errorf("got name %q tgid %d pid %d capeff %#x", st.Name, st.Tgid, st.Pid, st.CapEff)
			}
			if !reflect.DeepEqual(st.CpusAllowed, tt.cpus) || !reflect.DeepEqual(st.MemsAllowed, tt.mems) {
				t.Errorf("cpus %v mems %v", st.CpusAllowed, st.MemsAllowed)
			}
			if st.HasCap(CapSysNice) != tt.sysNice {
				t.Errorf("HasCap(CAP_SYS_NICE) = %v", !tt.sysNice)
			}
			if st.PeakRSSBytes != tt.peakRSS {
				t.Errorf("VmHWM %d bytes, want %d", st.PeakRSSBytes, tt.peakRSS)
			}
			if len(st.Fields) != tt.fields {
				t.Errorf("%d fields, want %d (one per line)", len(st.Fields), tt.fields)
			}
			if st.Fields["Uid"] != "1001\t1001\t1001\t1001" && tt.file != "lanewatch-dev_cat_self.status" {
				t.Errorf("Uid kept as %q", st.Fields["Uid"])
			}
		})
	}
}

func seqInts(a, b int) []int {
	var s []int
	for i := a; i <= b; i++ {
		s = append(s, i)
	}
	return s
}

// The live file of this test process must parse, and agree with getpid.
func TestReadStatusSelf(t *testing.T) {
	st, err := ReadStatus("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.Tgid != os.Getpid() || len(st.CpusAllowed) == 0 || len(st.MemsAllowed) == 0 || !st.HasCapEff {
		t.Errorf("status of self: %+v", st)
	}
	if _, err := ReadStatus("/proc", 1<<30); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing pid: %v", err)
	}
}

func TestParseStatusErrors(t *testing.T) {
	tests := []struct{ text, want string }{
		{"Name:\tx\nno colon here\n", "s:2: want"},
		{"Name:\tx\nName:\ty\n", "s:2: Name given twice"},
		{"Tgid:\tabc\n", "s:1: Tgid: \"abc\" is not a pid"},
		{"Pid:\t-1\n", "s:1: Pid:"},
		{"Cpus_allowed_list:\t3-1\n", "s:1: Cpus_allowed_list: list"},
		{"Mems_allowed_list:\t0,,1\n", "s:1: Mems_allowed_list: list"},
		{"CapEff:\t0000001ffffffffff\n", "s:1: CapEff:"},
		{"CapEff:\txyz\n", "s:1: CapEff:"},
		{"Vm Peak:\t1 kB\n", "s:1: want"},
	}
	for _, tt := range tests {
		_, err := ParseStatus(strings.NewReader(tt.text), "s")
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want prefix %q", tt.text, err, tt.want)
		}
	}
	// A name with a space and a colon is kept whole.
	st, err := ParseStatus(strings.NewReader("Name:\tpt_main: x y\n"), "s")
	if err != nil || st.Name != "pt_main: x y" {
		t.Errorf("name %q, %v", st.Name, err)
	}
}

func FuzzParseStatus(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "status", "*.status"))
	files2, _ := filepath.Glob(filepath.Join("testdata", "hosts", "*", "proc", "*", "status"))
	for _, p := range append(files, files2...) {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ParseStatus(strings.NewReader(string(data)), "fuzz.status")
		if !namesFile(t, err, "fuzz.status") {
			return
		}
		if lines := nonBlankLines(data); len(st.Fields) != lines {
			t.Fatalf("%d fields from %d lines", len(st.Fields), lines)
		}
	})
}
