package main

import (
	"flag"
	"io"
	"testing"

	"github.com/lanewatch/lanewatch/internal/docgen"
)

var updateDocs = flag.Bool("update-docs", false, "write docs/rules.md, docs/metrics.md and docs/flags.md (make docs)")

// TestGeneratedDocs renders docs/rules.md, docs/metrics.md and
// docs/flags.md from the code and fails when a committed page differs;
// with -update-docs (make docs) it writes them.
func TestGeneratedDocs(t *testing.T) {
	files, err := docgen.Files(usage, commandDocs(t))
	if err != nil {
		t.Fatal(err)
	}
	if *updateDocs {
		if err := docgen.Write("../../docs", files); err != nil {
			t.Fatal(err)
		}
		return
	}
	for _, s := range docgen.Stale("../../docs", files) {
		t.Error(s)
	}
}

// commandDocs is every command's flag set, each command run up to its
// parse (describeFlags).
func commandDocs(t *testing.T) []docgen.Command {
	var out []docgen.Command
	describeFlags = func(fs *flagSet) {
		out = append(out, docgen.Command{Name: fs.Name(), About: fs.about, Flags: fs.FlagSet})
	}
	defer func() { describeFlags = nil }()
	for _, c := range commands {
		n := len(out)
		if code := c.run(nil, io.Discard, io.Discard); code != 0 || len(out) != n+1 {
			t.Fatalf("agent %s: exit %d, %d flag sets described: it does not parse its flags first", c.name, code, len(out)-n)
		}
	}
	return out
}
