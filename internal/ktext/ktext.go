// Package ktext reads kernel text (/proc, /sys): the line loop, list and hex
// tokens its parsers share.
package ktext

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"
)

// ScanLF is a bufio.SplitFunc that splits at '\n' only: unlike
// bufio.ScanLines it keeps a trailing '\r', which the kernel prints raw when
// a file name ends in one.
func ScanLF(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// Lines calls fn with every non-blank line of r and its 1-based number,
// splitting as ScanLF does; a line longer than maxLine, a read error or an
// error from fn stops it and comes back as "name:line: err", so every
// parser of kernel text names the file and line of what it could not read.
// Blank lines (empty or white space only) are skipped but counted.
func Lines(r io.Reader, name string, maxLine int, fn func(line int, text string) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	sc.Split(ScanLF)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if strings.TrimSpace(text) == "" {
			continue
		}
		if err := fn(line, text); err != nil {
			return fmt.Errorf("%s:%d: %w", name, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s:%d: %w", name, line+1, err)
	}
	return nil
}

// IsHex reports whether s is a non-empty run of hex digits, either case
// ([0-9a-fA-F]), with no prefix or sign.
func IsHex(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}
