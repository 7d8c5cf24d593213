package sysfstest

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// WriteFlat writes a flattened sysfs sample under root: one file per line,
// "path: value" (a flattened fixture) or "path:value" (`grep "" FILES`),
// paths starting at "sys/" or "/sys/", each value with the kernel's
// newline. It returns the values by path relative to root.
func WriteFlat(t testing.TB, root, sample string) map[string]string {
	t.Helper()
	f, err := os.Open(sample)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			t.Fatalf("%s: %q is not path:value", sample, sc.Text())
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(path, "/"), "sys/")
		val = strings.TrimPrefix(val, " ")
		Write(t, filepath.Join(root, rel), val+"\n")
		out[rel] = val
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
