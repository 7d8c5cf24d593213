package collectors

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/ktext"
)

// dmonRow is one entity's line of `dcgmi dmon -e <fields>` output.
type dmonRow struct {
	Entity string // "GPU", "GI", "CI", "Switch", "Link", "CPU", ...
	ID     uint
	// Values by the header's column names (PCITX, PCIRX, ...); a column
	// whose text is "N/A" (DCGM's blank) is missing here and listed in
	// Blank.
	Values map[string]int64
	Blank  []string
	Line   int
}

// parseDmonText reads saved `dcgmi dmon` text: an optional prompt/command
// line, the "#Entity COL..." header, the "ID"/"Id" units line, one row per
// entity ("GPU 0 108216883 122481373"), and NVIDIA's ". . ." elisions. It
// turns published dmon captures into test series (test code only); name
// is used in errors ("name:line: ...").
func parseDmonText(r io.Reader, name string) ([]dmonRow, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<16)
	sc.Split(ktext.ScanLF)
	var cols []string
	var rows []dmonRow
	line := 0
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 0:
			continue
		case strings.HasPrefix(f[0], "#"):
			// "# Entity PCITX PCIRX" or "#Entity PCITX PCIRX"
			if f[0] == "#" {
				f = f[1:]
			} else {
				f[0] = f[0][1:]
			}
			if len(f) < 2 || !strings.EqualFold(f[0], "Entity") {
				return nil, fmt.Errorf("%s:%d: header is not \"#Entity COLUMN...\"", name, line)
			}
			if cols != nil {
				// dmon repeats the header every so many rows.
				if !slices.Equal(cols, f[1:]) {
					return nil, fmt.Errorf("%s:%d: header changes the columns", name, line)
				}
				continue
			}
			cols = append([]string(nil), f[1:]...)
			continue
		case cols == nil:
			continue // the prompt and command line before the header
		case len(f) == 1 && strings.EqualFold(f[0], "ID"):
			continue // units line under the header
		case strings.Trim(sc.Text(), ". \t") == "":
			continue // ". . ." rows elided in the publication
		}
		if len(f) != 2+len(cols) {
			return nil, fmt.Errorf("%s:%d: %d fields, want entity, id and %d values", name, line, len(f), len(cols))
		}
		id, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: entity id %q: not a number", name, line, f[1])
		}
		row := dmonRow{Entity: f[0], ID: uint(id), Values: make(map[string]int64, len(cols)), Line: line}
		for i, c := range cols {
			v := f[2+i]
			if v == "N/A" {
				row.Blank = append(row.Blank, c)
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("%s:%d: %s value %q: not a non-negative integer", name, line, c, v)
			}
			row.Values[c] = n
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", name, line+1, err)
	}
	if cols == nil {
		return nil, fmt.Errorf("%s:%d: no \"#Entity\" header", name, line)
	}
	return rows, nil
}

func TestParseDmonText(t *testing.T) {
	rows := readDmon(t, dmonSeqRead)
	if r := rows[12]; r.Values["PCITX"] != 528378278 || r.Values["PCIRX"] != 4721644934 || r.Line != 8 {
		t.Errorf("GPU 12: %+v", r)
	}
	// dcgmi's own layout: "#Entity" glued, "ID", N/A, a repeated header.
	text := "#Entity   PCITX        PCIRX\nID\nGPU 0     N/A          5\nGPU 1     1            2\n#Entity   PCITX        PCIRX\nID\nGPU 0     3            4\n"
	got, err := parseDmonText(strings.NewReader(text), "x")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || !slices.Equal(got[0].Blank, []string{"PCITX"}) || got[0].Values["PCIRX"] != 5 || got[2].Values["PCITX"] != 3 {
		t.Errorf("rows %+v", got)
	}
	for _, bad := range []string{
		"",
		"GPU 0 1 2\n",
		"#Entity PCITX\nGPU 0 1 2\n",
		"#Entity PCITX\nGPU x 1\n",
		"#Entity PCITX\nGPU 0 -1\n",
		"#Entity PCITX\nGPU 0 1.5\n",
		"#Entity PCITX\n#Entity PCIRX\n",
		"# PCITX\n",
	} {
		if _, err := parseDmonText(strings.NewReader(bad), "bad.txt"); err == nil || !strings.HasPrefix(err.Error(), "bad.txt:") {
			t.Errorf("%q: err %v", bad, err)
		}
	}
}

func FuzzParseDmonText(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "dcgm", "*dmon*"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("#Entity PCITX PCIRX\nID\nGPU 0 N/A 5\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rows, err := parseDmonText(strings.NewReader(string(data)), "fuzz.txt")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.txt:") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		for _, r := range rows {
			if len(r.Values)+len(r.Blank) == 0 {
				t.Fatalf("row without values: %+v", r)
			}
			for c, v := range r.Values {
				if v < 0 || slices.Contains(r.Blank, c) {
					t.Fatalf("row %+v", r)
				}
			}
		}
	})
}
