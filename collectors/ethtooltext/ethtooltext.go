// Package ethtooltext parses saved `ethtool -S` output. It is a leaf (the
// standard library only) so that its fuzz target runs fast: the fuzzer's
// per-input cost grows with every package the test binary instruments.
package ethtooltext

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Bounds of a saved `ethtool -S`: a NIC with hundreds of queues prints a few
// hundred kilobytes; a longer line or file is not its output.
const (
	maxLine  = 1 << 16
	maxBytes = 16 << 20
)

// Parse parses saved `ethtool -S IFACE` output: an optional
// header ("NIC statistics:") and one "name: value" line per statistic, with
// or without the indentation ethtool prints. A name may itself hold ": "
// (bnxt prints "[0]: rx_ucast_packets: 5"), so the value is what follows the
// last ": ". name is used in errors ("name:line: ..."). A line that is not a
// header and has no unsigned value, or a statistic given twice, is an error.
//
// The text is copied once and the names are substrings of the copy: the
// cost is per input, not per line (TestParseAllocations).
func Parse(r io.Reader, name string) (map[string]uint64, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(b) > maxBytes {
		return nil, fmt.Errorf("%s: longer than %d bytes: not ethtool -S output", name, maxBytes)
	}
	text := string(b)
	stats := make(map[string]uint64, strings.Count(text, "\n")+1)
	line := 0
	for rest := text; rest != ""; {
		var l string
		l, rest, _ = strings.Cut(rest, "\n")
		line++
		if len(l) > maxLine {
			return nil, fmt.Errorf("%s:%d: line longer than %d bytes", name, line, maxLine)
		}
		key, v, err := stat(l)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		case key == "": // blank or a header
			continue
		}
		if _, dup := stats[key]; dup {
			return nil, fmt.Errorf("%s:%d: %s given twice (first at line %d)", name, line, key, firstLine(text, key))
		}
		stats[key] = v
	}
	return stats, nil
}

// stat reads one line of Parse: its statistic, or no
// name for a blank line or a header.
func stat(line string) (string, uint64, error) {
	text := strings.TrimSpace(line)
	if text == "" || isHeader(text) {
		return "", 0, nil
	}
	i := strings.LastIndex(text, ": ")
	if i <= 0 {
		return "", 0, fmt.Errorf("want \"name: value\", got %q", text)
	}
	key, val := strings.TrimSpace(text[:i]), strings.TrimSpace(text[i+2:])
	if key == "" {
		return "", 0, fmt.Errorf("statistic without a name: %q", text)
	}
	if val == "" || val[0] < '0' || val[0] > '9' {
		return "", 0, fmt.Errorf("%s: %q is not an unsigned number", key, val)
	}
	v, err := strconv.ParseUint(val, 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("%s: %q is not a uint64", key, val)
	}
	return key, v, nil
}

// firstLine is the number of the first line of text that gives key.
func firstLine(text, key string) int {
	line := 0
	for rest := text; rest != ""; {
		var l string
		l, rest, _ = strings.Cut(rest, "\n")
		line++
		if k, _, _ := stat(l); k == key {
			return line
		}
	}
	return 0
}

// isHeader tells a section header ("NIC statistics:", "Standard
// stats for eth0:": words and a final colon) from a statistic without a
// value ("rx_packets:", an error).
func isHeader(s string) bool {
	return strings.HasSuffix(s, ":") && strings.Contains(s, " ") && !strings.Contains(s, ": ")
}
