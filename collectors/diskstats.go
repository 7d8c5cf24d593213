package collectors

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/internal/ktext"
)

// SectorBytes is the unit of the diskstats sector fields: always 512 bytes,
// whatever the device's logical block size (iostats.rst).
const SectorBytes = 512

// DiskStat is one /proc/diskstats line (kernel
// Documentation/admin-guide/iostats.rst). Times are milliseconds as the
// kernel counts them. The line has 14 fields before 4.18, 18 from 4.18
// (discards) and 20 from 5.5 (flushes); HasDiscards/HasFlushes say which
// of the later counters were there, so a 0 is not read as a measurement.
type DiskStat struct {
	Major, Minor uint32
	Name         string

	ReadsCompleted, ReadsMerged, SectorsRead, ReadMs       uint64
	WritesCompleted, WritesMerged, SectorsWritten, WriteMs uint64
	InFlight                                               uint64 // a gauge, not a counter
	IOMs, WeightedIOMs                                     uint64

	HasDiscards                                                    bool
	DiscardsCompleted, DiscardsMerged, SectorsDiscarded, DiscardMs uint64
	HasFlushes                                                     bool
	FlushesCompleted, FlushMs                                      uint64
}

// ParseDiskstats parses the text of /proc/diskstats; name is used in errors
// ("name:line: ..."). A line with another field count than 14, 18 or 20, a
// field that is not a decimal number, or a device given twice is an error.
func ParseDiskstats(r io.Reader, name string) ([]DiskStat, error) {
	var out []DiskStat
	seen := map[string]bool{}
	err := ktext.Lines(r, name, 4096, func(_ int, text string) error {
		d, err := parseDiskstatsLine(text)
		if err != nil {
			return err
		}
		if seen[d.Name] {
			return fmt.Errorf("device %s given twice", d.Name)
		}
		seen[d.Name] = true
		out = append(out, d)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func parseDiskstatsLine(s string) (DiskStat, error) {
	f := strings.Fields(s)
	if n := len(f); n != 14 && n != 18 && n != 20 {
		return DiskStat{}, fmt.Errorf("%d fields, want 14, 18 or 20: %q", n, s)
	}
	var d DiskStat
	maj, err := strconv.ParseUint(f[0], 10, 32)
	if err != nil {
		return DiskStat{}, fmt.Errorf("major %q is not a number", f[0])
	}
	mnr, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil {
		return DiskStat{}, fmt.Errorf("minor %q is not a number", f[1])
	}
	d.Major, d.Minor, d.Name = uint32(maj), uint32(mnr), f[2]
	v := make([]uint64, len(f)-3)
	for i, t := range f[3:] {
		if v[i], err = strconv.ParseUint(t, 10, 64); err != nil || t[0] == '+' {
			return DiskStat{}, fmt.Errorf("%s: field %d %q is not a number", d.Name, i+4, t)
		}
	}
	d.ReadsCompleted, d.ReadsMerged, d.SectorsRead, d.ReadMs = v[0], v[1], v[2], v[3]
	d.WritesCompleted, d.WritesMerged, d.SectorsWritten, d.WriteMs = v[4], v[5], v[6], v[7]
	d.InFlight, d.IOMs, d.WeightedIOMs = v[8], v[9], v[10]
	if len(v) >= 15 {
		d.HasDiscards = true
		d.DiscardsCompleted, d.DiscardsMerged, d.SectorsDiscarded, d.DiscardMs = v[11], v[12], v[13], v[14]
	}
	if len(v) == 17 {
		d.HasFlushes = true
		d.FlushesCompleted, d.FlushMs = v[15], v[16]
	}
	return d, nil
}

// DiskSample is one reading of /proc/diskstats and when it was taken (with
// Go's monotonic clock reading).
type DiskSample struct {
	Time  time.Time
	Disks []DiskStat
}

// DiskRate is one device's throughput over an interval.
type DiskRate struct {
	Name                      string
	Interval                  time.Duration
	ReadsPerSec, WritesPerSec float64
	ReadBytesPerSec           float64
	WriteBytesPerSec          float64
	BusyFraction              float64 // io_ticks over the interval, 0..1 (can exceed 1 slightly: ms rounding)
}

// DiskRates gives each device's rates between two samples, sorted by name.
// A device gets no rate, and nothing is guessed, when it is missing from
// either sample (hot-plugged or removed) or when any of its counters went
// backwards (device re-created under the same name, or a 32-bit counter
// wrapping): such names come back in the second value, sorted. A
// non-positive interval gives no rates at all.
func DiskRates(prev, cur DiskSample) ([]DiskRate, []string) {
	dt := cur.Time.Sub(prev.Time)
	if dt <= 0 {
		return nil, nil
	}
	old := make(map[string]DiskStat, len(prev.Disks))
	for _, d := range prev.Disks {
		old[d.Name] = d
	}
	var rates []DiskRate
	var reset []string
	sec := dt.Seconds()
	for _, c := range cur.Disks {
		p, ok := old[c.Name]
		if !ok {
			continue
		}
		if wentBack(p, c) {
			reset = append(reset, c.Name)
			continue
		}
		rates = append(rates, DiskRate{
			Name:             c.Name,
			Interval:         dt,
			ReadsPerSec:      float64(c.ReadsCompleted-p.ReadsCompleted) / sec,
			WritesPerSec:     float64(c.WritesCompleted-p.WritesCompleted) / sec,
			ReadBytesPerSec:  float64(c.SectorsRead-p.SectorsRead) * SectorBytes / sec,
			WriteBytesPerSec: float64(c.SectorsWritten-p.SectorsWritten) * SectorBytes / sec,
			BusyFraction:     float64(c.IOMs-p.IOMs) / 1000 / sec,
		})
	}
	slices.SortFunc(rates, func(a, b DiskRate) int { return strings.Compare(a.Name, b.Name) })
	slices.Sort(reset)
	return rates, reset
}

func wentBack(p, c DiskStat) bool {
	return c.ReadsCompleted < p.ReadsCompleted || c.WritesCompleted < p.WritesCompleted ||
		c.SectorsRead < p.SectorsRead || c.SectorsWritten < p.SectorsWritten || c.IOMs < p.IOMs
}

// ReadDiskstats reads procRoot/diskstats now.
func ReadDiskstats(procRoot string) (DiskSample, error) {
	p := filepath.Join(procRoot, "diskstats")
	fh, err := os.Open(p)
	if err != nil {
		return DiskSample{}, err
	}
	defer fh.Close()
	now := time.Now()
	ds, err := ParseDiskstats(fh, p)
	return DiskSample{Time: now, Disks: ds}, err
}
