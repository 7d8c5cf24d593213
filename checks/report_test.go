package checks

import (
	"bytes"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
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

// A check on part of its window: a PASS is a SKIP saying why and what the
// part showed, a WARN keeps its status and its finding says why (the
// caller's evidence untouched), an INFO listing says why, a SKIP stays.
func TestPartial(t *testing.T) {
	const why = "incomplete: events of pid 7 were lost in the window"
	evidence := make([]string, 1, 4) // room to append into: Partial must not
	evidence[0] = "3 pageable copies"
	warn := Check{Scope: "pid 7", Name: CheckPageable, Status: Warn, Detail: "d",
		Findings: []correlate.Finding{{Rule: "pageable-copy", Severity: correlate.SevWarn, Evidence: evidence}}}
	for _, tc := range []struct {
		in, want Check
	}{
		{Check{Name: "a", Status: Pass, Detail: "12 copies"}, Check{Name: "a", Status: Skip, Detail: why + "; on the events seen: 12 copies", Incomplete: why}},
		{Check{Name: "b", Status: Info, Detail: "lanes"}, Check{Name: "b", Status: Info, Detail: "lanes; " + why, Incomplete: why}},
		{Check{Name: "c", Status: Skip, Detail: "GPU unknown"}, Check{Name: "c", Status: Skip, Detail: "GPU unknown"}},
	} {
		if got := tc.in.Partial(why); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%+v.Partial: %+v, want %+v", tc.in, got, tc.want)
		}
	}
	got := warn.Partial(why)
	if got.Status != Warn || got.Detail != "d" || got.Incomplete != why || !slices.Equal(got.Findings[0].Evidence, []string{"3 pageable copies", why}) {
		t.Errorf("WARN on part of the window: %+v", got)
	}
	if len(warn.Findings[0].Evidence) != 1 || evidence[:2][1] != "" {
		t.Errorf("Partial changed its caller's finding: %+v (%q)", warn.Findings[0], evidence[:2])
	}
}
