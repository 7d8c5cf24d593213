package ethtooltext

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseForms(t *testing.T) {
	in := "NIC statistics:\n     rx_packets: 5\n[0]: rx_ucast_packets: 7\r\n\n  tx_bytes:   9  \n"
	st, err := Parse(strings.NewReader(in), "x")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]uint64{"rx_packets": 5, "[0]: rx_ucast_packets": 7, "tx_bytes": 9}; !reflect.DeepEqual(st, want) {
		t.Errorf("%v, want %v", st, want)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"rx_packets: 5\ntx_packets 6\n", "s.txt:2: want \"name: value\""},
		{"rx_packets: -5\n", "s.txt:1: rx_packets: \"-5\" is not an unsigned number"},
		{"rx_packets: five\n", "s.txt:1: rx_packets: \"five\""},
		{"rx_packets: 18446744073709551616\n", "s.txt:1: rx_packets: \"18446744073709551616\" is not a uint64"},
		{"a: 1\nb: 2\na: 3\n", "s.txt:3: a given twice (first at line 1)"},
		{": 1\n", "s.txt:1: want \"name: value\""},
		{"NIC statistics:\nrx_packets:\n", "s.txt:2: want \"name: value\""},
		{"x: 1 2\n", "s.txt:1: x: \"1 2\" is not a uint64"},
	} {
		_, err := Parse(strings.NewReader(tt.in), "s.txt")
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want %q", tt.in, err, tt.want)
		}
	}
}

// The parser's cost is per input, not per line: the 751 statistics of a
// ConnectX-4 Lx's ethtool -S are parsed with a handful of allocations (one
// copy of the text, whose substrings are the names, and the map). It
// allocated a string per line and grew two maps, which with the fuzzer's
// minimisation of large inputs left its fuzz target (then in collectors) a
// dozen inputs in ten seconds.
func TestParseAllocations(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "testdata", "ethtool", "ethq_mlx5_core_CX4_ubuntu1804_k4.15_fw14.23_stripped.txt"))
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(10, func() {
		if _, err := Parse(bytes.NewReader(data), "x"); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 32 {
		t.Errorf("%.0f allocations for 751 statistics, want at most 32", allocs)
	}
}

// FuzzParse starts from the real samples cut into pieces of a
// few lines (every line shape of the three captures: indented and not,
// per-priority, per-channel, _phy), not from the whole files: the fuzzer
// mutates and minimises what it is given, and a 17 KB seed made every
// interesting input cost a minute of minimisation.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("..", "testdata", "ethtool", "*.txt"))
	if len(files) == 0 {
		f.Fatal("no ethtool samples in ../testdata/ethtool")
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		for _, seed := range seeds(string(b), 4, 24) {
			f.Add([]byte(seed))
		}
	}
	f.Add([]byte("NIC statistics:\n[0]: rx: 1\n"))
	f.Add([]byte("Standard stats for eth0:\n  tx_bytes:   9  \r\n\n"))
	f.Add([]byte("a: 1\nb: 2\na: 3\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := Parse(bytes.NewReader(data), "fuzz.txt")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.txt:") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		// every line that is not blank or a header is one statistic
		var n int
		for l := range strings.SplitSeq(string(data), "\n") {
			if l = strings.TrimSpace(l); l != "" && !isHeader(l) {
				n++
			}
		}
		if len(st) != n {
			t.Fatalf("%d statistics from %d lines", len(st), n)
		}
		// what was read prints back as ethtool does and reads the same
		var out strings.Builder
		out.WriteString("NIC statistics:\n")
		for k, v := range st {
			fmt.Fprintf(&out, "     %s: %d\n", k, v)
		}
		again, err := Parse(strings.NewReader(out.String()), "again")
		if err != nil || !reflect.DeepEqual(again, st) {
			t.Fatalf("printed back %q: %v, %v; want %v", out.String(), again, err, st)
		}
	})
}

// seeds cuts a sample into pieces of n lines, one every step lines.
func seeds(text string, n, step int) []string {
	lines := strings.SplitAfter(text, "\n")
	var out []string
	for i := 0; i < len(lines); i += step {
		out = append(out, strings.Join(lines[i:min(i+n, len(lines))], ""))
	}
	return out
}
