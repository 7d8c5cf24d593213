package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Real ucx_perftest client outputs (UCX 1.13, Debian's ucx-utils): a
// bandwidth test's overhead columns, a latency test's, one with a progress
// line a second before its Final line, and a client that could not connect.
func TestParsePerftest(t *testing.T) {
	for _, c := range []struct {
		file    string
		want    PerftestFinal
		wantErr string
	}{
		{file: "tcp-put-8.txt", want: PerftestFinal{Iterations: 100000, P50Us: 6.355, AverageUs: 6.684, OverallUs: 6.684,
			BandwidthMBs: 1.14, OverallMBs: 1.14, MsgRate: 149603, OverallMsgRate: 149603}},
		{file: "posix-get-1m.txt", want: PerftestFinal{Iterations: 200, P50Us: 76.004, AverageUs: 80.590, OverallUs: 80.590,
			BandwidthMBs: 12408.45, OverallMBs: 12408.45, MsgRate: 12408, OverallMsgRate: 12408}},
		{file: "posix-put-8-progress.txt", want: PerftestFinal{Iterations: 60000000, P50Us: 0.041, AverageUs: 0.048, OverallUs: 0.459,
			BandwidthMBs: 158.84, OverallMBs: 16.62, MsgRate: 20819104, OverallMsgRate: 2178640}},
		{file: "refused.txt", wantErr: "refused.txt: no Final: line in 119 bytes"},
	} {
		path := filepath.Join("testdata", "perftest", c.file)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParsePerftest(path, b)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: error %v, want one with %q", c.file, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %+v %v, want %+v", c.file, got, err, c.want)
		}
	}
	if ns := (PerftestFinal{OverallMsgRate: 149603}).NsPerMessage(); ns < 6684 || ns > 6685 {
		t.Errorf("149603 msg/s: %.1f ns per message, want 6684.4", ns)
	}
}

// Broken Final lines are errors naming the output and the line.
func TestParsePerftestErrors(t *testing.T) {
	const head = "+----+\n"
	for _, c := range []struct{ out, want string }{
		{head + "Final: 10 1 2 3 4 5 6\n", "out:2: 7 fields after Final:"},
		{head + "Final: -3 1 2 3 4 5 6 7\n", "out:2: iterations \"-3\""},
		{head + "Final: 10 1 2 NaN 4 5 6 7\n", "out:2: field 4 \"NaN\""},
		{head + "Final: 10 1 2 3 4 5 6 -7\n", "out:2: field 8 \"-7\""},
		{head + "Final: 10 1 2 3 4 5 6 0\n", "out:2: overall message rate 0"},
		{"Final: 10 1 2 3 4 5 6 7\nFinal: 10 1 2 3 4 5 6 7\n", "out:2: a second Final line"},
	} {
		if _, err := ParsePerftest("out", []byte(c.out)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one with %q", c.out, err, c.want)
		}
	}
}

func FuzzParsePerftest(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "perftest", "*.txt"))
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParsePerftest("fuzz", b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz") {
				t.Errorf("error %q does not name the output", err)
			}
			return
		}
		if got.Iterations <= 0 || !(got.OverallMsgRate > 0) || got.NsPerMessage() <= 0 {
			t.Errorf("accepted %+v", got)
		}
	})
}
