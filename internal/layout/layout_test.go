// Package layout holds the test that keeps the package structure of
// docs/design.md true: the one-way data flow and the reference data path
// kept out of production code; and every benchmark in `make test`.
package layout

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

const module = "github.com/lanewatch/lanewatch/"

// root is the repository's top directory.
func root(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// deps lists every package pkg depends on, directly or not (go list -deps).
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", module+pkg)
	cmd.Dir = root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// Data flows one way: probes → event → correlate → exporters. The engine
// and the exporters never see a probe table or the daemon; the probes know
// nothing of what consumes their events.
func TestImportGraph(t *testing.T) {
	forbidden := map[string][]string{
		"correlate": {"probes", "agent"},
		"exporters": {"probes", "agent", "collectors"},
		"probes":    {"correlate", "exporters", "collectors", "agent"},
		"event":     {"probes", "correlate", "exporters", "agent"},
		"checks":    {"agent", "probes"},
		"judge":     {"agent", "probes"},
	}
	for pkg, bad := range forbidden {
		all := deps(t, pkg)
		if len(all) == 0 || all[len(all)-1] != module+pkg {
			t.Fatalf("go list -deps %s ends with %v, not the package itself", pkg, all)
		}
		for _, d := range all {
			for _, b := range bad {
				if d == module+b {
					t.Errorf("%s depends on %s", pkg, b)
				}
			}
		}
	}
}

// Only the selftest and the reference data path itself know the reference
// data path: its environment variables (the LW_REF prefix) and its GPU names
// (the "ref" prefix, also in its shared lane files). The pattern is built
// in pieces so that this file does not match itself.
var refKnowledge = regexp.MustCompile(`LW_` + `REF_|\bref` + `-`)

func TestNoReferencePathOutsideSelftest(t *testing.T) {
	top := root(t)
	files := 0
	err := filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(top, path)
		if d.IsDir() {
			switch rel {
			case ".git", "refpath", "selftest", "bin", ".cache":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		files++
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range bytes.Split(b, []byte("\n")) {
			if refKnowledge.Match(line) {
				t.Errorf("%s:%d knows the reference data path: %s", rel, i+1, bytes.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked only %d Go files: is the root %s right?", files, top)
	}
}

// Every benchmark runs once in `make test`'s bench step, so none that a
// commit or the docs cite can rot: each package with a Benchmark function
// is named on a -bench line of the Makefile's test recipe.
func TestEveryBenchmarkRunsInMakeTest(t *testing.T) {
	top := root(t)
	mk, err := os.ReadFile(filepath.Join(top, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	benched := map[string]bool{}
	inTest := false
	for _, line := range strings.Split(string(mk), "\n") {
		if !strings.HasPrefix(line, "\t") {
			inTest = strings.HasPrefix(line, "test:")
			continue
		}
		if inTest && strings.Contains(line, " -bench ") {
			for _, f := range strings.Fields(line) {
				if strings.HasPrefix(f, "./") {
					benched[filepath.Clean(f)] = true
				}
			}
		}
	}
	benchFunc := regexp.MustCompile(`(?m)^func Benchmark\w*\(b \*testing\.B\)`)
	found := 0
	err = filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// deploy is its own module; refpath and .cache hold no Go of this one.
			if name := d.Name(); path != top && (strings.HasPrefix(name, ".") || name == "testdata" || name == "deploy" || name == "refpath" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if benchFunc.Match(b) {
			found++
			rel, _ := filepath.Rel(top, filepath.Dir(path))
			if !benched[rel] {
				t.Errorf("%s has a benchmark, but `make test`'s bench step does not run ./%s", strings.TrimPrefix(path, top+"/"), rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 || len(benched) == 0 {
		t.Fatalf("%d benchmark files, %d benched packages: the Makefile or the tree is not where this test looks", found, len(benched))
	}
}
