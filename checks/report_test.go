package checks

import (
	"bytes"
	"strings"
	"testing"
)

// A live window's checks come after the processes' own (diagnose adds them
// last), and name a process without its command: each scope is still
// printed once, under the annotated name, under one heading, with its
// checks in the order they were added, names in one aligned column.
func TestWriteTextGroupsScopes(t *testing.T) {
	var r Report
	for _, c := range []Check{
		{Scope: HostScope, Name: "numactl", Status: Pass, Detail: "a"},
		{Scope: "pid 7", Name: "same-direction overlap", Status: Pass, Detail: "b"},
		{Scope: HostScope, Name: "storage devices", Status: Info, Detail: "c"},
		{Scope: "pid 7 (python3)", Name: CheckComputeOverlap, Status: Skip, Detail: "d"},
	} {
		r.Add(c)
	}
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	want := "\n== host\n" +
		"[PASS] numactl                          a\n" +
		"[INFO] storage devices                  c\n" +
		"\n== pid 7 (python3)\n" +
		"[PASS] same-direction overlap           b\n" +
		"[SKIP] H2D vs compute overlap and syncs d\n" +
		"\n2 pass, 1 info, 0 warn, 0 fail, 1 skip\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	if strings.Count(b.String(), "== host") != 1 {
		t.Error("the host heading is printed more than once")
	}
}
