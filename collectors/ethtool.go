package collectors

import (
	"fmt"
	"io"
	"strings"

	"github.com/safchain/ethtool"

	"github.com/lanewatch/lanewatch/collectors/ethtooltext"
)

// ParseEthtoolStats parses saved `ethtool -S IFACE` output (ethtooltext.Parse):
// an optional header ("NIC statistics:") and one "name: value" line per
// statistic; name is used in errors ("name:line: ...").
func ParseEthtoolStats(r io.Reader, name string) (map[string]uint64, error) {
	return ethtooltext.Parse(r, name)
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
