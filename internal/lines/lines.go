// Package lines splits kernel text files (/proc, /sys) into lines the way
// the kernel writes them.
package lines

import "bytes"

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
