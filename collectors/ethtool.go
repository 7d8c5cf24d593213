package collectors

import (
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/safchain/ethtool"

	"github.com/lanewatch/lanewatch/internal/lines"
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
	err := lines.Each(r, name, 1<<16, func(line int, text string) error {
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

// PFCStats sorts a device's ethtool statistics into priority flow control
// counters per priority, port-wide pause counters and the rest, so nothing
// is dropped. Names differ by driver; they are matched by pattern:
//
//   - a priority is "prioN" (mlx5: rx_prio3_pause, tx_prio3_pause_duration,
//     rx_prio3_pause_transition, rx_prio3_bytes, rx_prio3_packets),
//     "priority_N" (ice: rx_priority_3_xoff.nic; i40e:
//     port.tx_priority_3_xon_tx) or "priN" (bnxt: rx_pfc_ena_frames_pri3,
//     pfc_pri3_rx_duration_us), N in 0..7. Prio[N] keys the counter by its
//     name with that token removed: "rx_pause", "tx_pause_duration",
//     "rx_bytes", "rx_xoff.nic", "pfc_rx_duration_us".
//   - Pause holds the other names with "pause" or "pfc" in them:
//     rx_pause_ctrl_phy, tx_pause_ctrl_phy, rx_global_pause*,
//     tx_pause_storm_warning_events, tx_pause_storm_error_events,
//     pause_ctrl_rx (older mlx5), rx_pause_frames.
//   - Other holds everything else.
//
// Units are the driver's: mlx5 *_pause_duration is in microseconds, pause
// and transition counters count frames and XON/XOFF changes.
type PFCStats struct {
	Prio  [8]map[string]uint64
	Pause map[string]uint64
	Other map[string]uint64
}

// prioToken finds the priority in a statistic name; the token must not be
// followed by another digit (prio10 is no priority).
var prioToken = regexp.MustCompile(`(?:priority_|prio|pri)([0-7])(?:[^0-9]|$)`)

// PFC sorts stats (from ParseEthtoolStats or ReadEthtoolStats) into PFCStats.
func PFC(stats map[string]uint64) PFCStats {
	s := PFCStats{Pause: map[string]uint64{}, Other: map[string]uint64{}}
	for i := range s.Prio {
		s.Prio[i] = map[string]uint64{}
	}
	for _, name := range slices.Sorted(maps.Keys(stats)) {
		v := stats[name]
		if m := prioToken.FindStringSubmatchIndex(name); m != nil {
			prio := int(name[m[2]] - '0')
			key := joinAround(name[:m[0]], name[m[3]:])
			if _, dup := s.Prio[prio][key]; !dup {
				s.Prio[prio][key] = v
				continue
			}
			// a second name collapsing to the same key (sorted order) is kept
			// under its own name below
		}
		low := strings.ToLower(name)
		if strings.Contains(low, "pause") || strings.Contains(low, "pfc") {
			s.Pause[name] = v
			continue
		}
		s.Other[name] = v
	}
	return s
}

// joinAround joins what stands before and after a removed token with one
// separator: "rx_" + "_pause" → "rx_pause", "rx_pfc_ena_frames_" + "" →
// "rx_pfc_ena_frames".
func joinAround(before, after string) string {
	b := strings.TrimRight(before, "_")
	a := strings.TrimLeft(after, "_")
	switch {
	case b == "":
		return a
	case a == "":
		return b
	case strings.HasPrefix(a, "."):
		return b + a
	}
	return b + "_" + a
}

// Lookup returns priority prio's counter kind ("rx_pause",
// "tx_pause_duration") and whether the device has it.
func (s PFCStats) Lookup(prio int, kind string) (uint64, bool) {
	if prio < 0 || prio >= len(s.Prio) {
		return 0, false
	}
	v, ok := s.Prio[prio][kind]
	return v, ok
}
