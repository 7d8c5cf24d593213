package collectors

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/lanewatch/lanewatch/internal/ktext"
)

// Meminfo is the part of /proc/meminfo the host checks read. Sizes are in
// bytes (the file's kB × 1024, node_exporter's base-unit rule); the huge page
// counts are pages of HugepagesizeBytes.
type Meminfo struct {
	MemTotalBytes, MemAvailableBytes, MlockedBytes uint64
	HugePagesTotal, HugePagesFree                  uint64
	HugepagesizeBytes                              uint64
	// Fields holds every line, kB values already in bytes. A key missing here
	// was not in the file (MemAvailable before 3.14, Mlocked without
	// CONFIG_MMU, hugepage lines without CONFIG_HUGETLB_PAGE): do not read
	// the struct field's 0 as a measurement then.
	Fields map[string]uint64
}

// ParseMeminfo parses the text of /proc/meminfo. name is used in errors
// ("name:line: ..."). Every line must be "Key: N" or "Key: N kB".
func ParseMeminfo(r io.Reader, name string) (Meminfo, error) {
	mi := Meminfo{Fields: map[string]uint64{}}
	err := ktext.Lines(r, name, 1<<16, func(_ int, text string) error {
		key, val, err := parseMeminfoLine(text)
		if err != nil {
			return err
		}
		if _, dup := mi.Fields[key]; dup {
			return fmt.Errorf("%s given twice", key)
		}
		mi.Fields[key] = val
		switch key {
		case "MemTotal":
			mi.MemTotalBytes = val
		case "MemAvailable":
			mi.MemAvailableBytes = val
		case "Mlocked":
			mi.MlockedBytes = val
		case "HugePages_Total":
			mi.HugePagesTotal = val
		case "HugePages_Free":
			mi.HugePagesFree = val
		case "Hugepagesize":
			mi.HugepagesizeBytes = val
		}
		return nil
	})
	if err != nil {
		return Meminfo{}, err
	}
	return mi, nil
}

func parseMeminfoLine(s string) (string, uint64, error) {
	key, rest, ok := strings.Cut(s, ":")
	if !ok || key == "" || strings.ContainsAny(key, " \t") {
		return "", 0, fmt.Errorf("want \"Key: value [kB]\", got %q", s)
	}
	f := strings.Fields(rest)
	if len(f) == 0 || len(f) > 2 {
		return "", 0, fmt.Errorf("%s: want a number and an optional kB, got %q", key, rest)
	}
	v, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil || f[0][0] == '+' {
		return "", 0, fmt.Errorf("%s: %q is not a number", key, f[0])
	}
	if len(f) == 2 {
		if f[1] != "kB" {
			return "", 0, fmt.Errorf("%s: unit %q, want kB", key, f[1])
		}
		if v > (1<<64-1)/1024 {
			return "", 0, fmt.Errorf("%s: %d kB overflows bytes", key, v)
		}
		v *= 1024
	}
	return key, v, nil
}

// ReadMeminfo reads and parses <procRoot>/meminfo.
func ReadMeminfo(procRoot string) (Meminfo, error) {
	path := filepath.Join(procRoot, "meminfo")
	f, err := os.Open(path)
	if err != nil {
		return Meminfo{}, fmt.Errorf("read meminfo: %w", err)
	}
	defer f.Close()
	return ParseMeminfo(f, path)
}
