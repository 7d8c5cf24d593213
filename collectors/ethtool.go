package collectors

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/safchain/ethtool"

	"github.com/lanewatch/lanewatch/internal/ktext"
)

// ParseEthtoolStats parses saved `ethtool -S IFACE` output: an optional
// header ("NIC statistics:") and one "name: value" line per statistic, with
// or without the indentation ethtool prints. A name may itself hold ": "
// (bnxt prints "[0]: rx_ucast_packets: 5"), so the value is what follows the
// last ": ". name is used in errors ("name:line: ..."). A line that is not a
// header and has no unsigned value, or a statistic given twice, is an error.
func ParseEthtoolStats(r io.Reader, name string) (map[string]uint64, error) {
	stats := map[string]uint64{}
	first := map[string]int{}
	err := ktext.Lines(r, name, 1<<16, func(line int, text string) error {
		text = strings.TrimSpace(text)
		if isEthtoolHeader(text) {
			return nil
		}
		i := strings.LastIndex(text, ": ")
		if i <= 0 {
			return fmt.Errorf("want \"name: value\", got %q", text)
		}
		key, val := strings.TrimSpace(text[:i]), strings.TrimSpace(text[i+2:])
		if key == "" {
			return fmt.Errorf("statistic without a name: %q", text)
		}
		if val == "" || val[0] < '0' || val[0] > '9' {
			return fmt.Errorf("%s: %q is not an unsigned number", key, val)
		}
		v, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			return fmt.Errorf("%s: %q is not a uint64", key, val)
		}
		if l, dup := first[key]; dup {
			return fmt.Errorf("%s given twice (first at line %d)", key, l)
		}
		first[key] = line
		stats[key] = v
		return nil
	})
	if err != nil {
		return nil, err
	}
	return stats, nil
}

// isEthtoolHeader tells a section header ("NIC statistics:", "Standard
// stats for eth0:": words and a final colon) from a statistic without a
// value ("rx_packets:", an error).
func isEthtoolHeader(s string) bool {
	return strings.HasSuffix(s, ":") && strings.Contains(s, " ") && !strings.Contains(s, ": ")
}

// ReadEthtoolStats reads the driver statistics of a network device in the
// calling thread's network namespace, the same ETHTOOL_GSTRINGS +
// ETHTOOL_GSTATS ioctls that `ethtool -S` uses (github.com/safchain/ethtool).
// A driver that reports one name twice keeps the last value (the library
// returns a map).
func ReadEthtoolStats(ifname string) (map[string]uint64, error) {
	// The library copies the name into a 16-byte ifreq without checking:
	// a longer one would be cut to another interface's name.
	if ifname == "" || len(ifname) >= 16 || strings.ContainsAny(ifname, "/ \x00") {
		return nil, fmt.Errorf("ethtool stats: %q is not an interface name", ifname)
	}
	e, err := ethtool.NewEthtool()
	if err != nil {
		return nil, fmt.Errorf("ethtool stats %s: %w", ifname, err)
	}
	defer e.Close()
	st, err := e.Stats(ifname)
	if err != nil {
		return nil, fmt.Errorf("ethtool stats %s: %w", ifname, err)
	}
	return st, nil
}
