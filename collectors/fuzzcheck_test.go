package collectors

import (
	"strings"
	"testing"
)

// namesFile fails a fuzz run whose parse error does not start with the
// file's name (every error must say where); it says whether the parse
// succeeded.
func namesFile(t *testing.T, err error, name string) bool {
	t.Helper()
	if err == nil {
		return true
	}
	if !strings.HasPrefix(err.Error(), name+":") {
		t.Fatalf("error %q does not name the file", err)
	}
	return false
}

// nonBlankLines counts the lines of data with something on them.
func nonBlankLines(data []byte) int {
	n := 0
	for l := range strings.SplitSeq(string(data), "\n") {
		if strings.TrimSpace(l) != "" {
			n++
		}
	}
	return n
}
