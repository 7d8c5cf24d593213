package ktext

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParseList(t *testing.T) {
	seq := func(a, b int) []int {
		var s []int
		for i := a; i <= b; i++ {
			s = append(s, i)
		}
		return s
	}
	tests := []struct {
		in   string
		want []int
	}{
		{"0", []int{0}},
		{"0-1\n", []int{0, 1}}, // this machine's Cpus_allowed_list and cpu/online
		{"", []int{}},
		{"\n", []int{}}, // an empty sysfs mask such as cpu/offline
		{"0-3,8-11", []int{0, 1, 2, 3, 8, 9, 10, 11}},
		{"48-63,176-191", append(seq(48, 63), seq(176, 191)...)}, // NPS4 node3, samples/numactl_hardware
		{"0-47,96-143", append(seq(0, 47), seq(96, 143)...)},     // HGX H100 NUMA 0, samples/topo_m
		{"70-99,102-107", append(seq(70, 99), seq(102, 107)...)}, // topo -m CPU affinity (issue 3)
		{"3,8,11-14,18-19", []int{3, 8, 11, 12, 13, 14, 18, 19}}, // a container's Cpus_allowed_list (public excerpt)
		{"2-9,34-35", []int{2, 3, 4, 5, 6, 7, 8, 9, 34, 35}},     // public status excerpt
		{"5,1-3,2", []int{1, 2, 3, 5}},                           // unsorted, overlapping: sorted, unique
		{"65535", []int{65535}},
	}
	for _, tt := range tests {
		got, err := ParseList(tt.in)
		if err != nil {
			t.Errorf("ParseList(%q): %v", tt.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseList(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
	for _, bad := range []string{",", "0,", ",0", "1-", "-1", "3-1", "a", "0x1", "+1", "1--2", "65536", "0-4294967296", "1 2", "0-3:2/4"} {
		if got, err := ParseList(bad); err == nil {
			t.Errorf("ParseList(%q) = %v, want an error", bad, got)
		} else if !strings.Contains(err.Error(), "list ") {
			t.Errorf("ParseList(%q): error %q does not quote the list", bad, err)
		}
	}
}

func TestFormatList(t *testing.T) {
	for in, want := range map[string]string{"0-3,8-11": "0-3,8-11", "0,2,4": "0,2,4", "1,2": "1-2", "": "", "7": "7"} {
		ids, err := ParseList(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := FormatList(ids); got != want {
			t.Errorf("FormatList(%v) = %q, want %q", ids, got, want)
		}
	}
}

func FuzzParseList(f *testing.F) {
	for _, s := range []string{"0", "0-1\n", "", "0-3,8-11", "48-63,176-191", "5,1-3,2", "3-1", "0-65535"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := ParseList(s)
		if err != nil {
			return
		}
		if !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != len(ids) {
			t.Fatalf("%q: ids not sorted and unique: %v", s, ids)
		}
		if len(ids) > 0 && (ids[0] < 0 || ids[len(ids)-1] > maxListID) {
			t.Fatalf("%q: id out of range: %v", s, ids)
		}
		again, err := ParseList(FormatList(ids))
		if err != nil || !reflect.DeepEqual(again, ids) {
			t.Fatalf("%q: format/parse round trip: %v %v", s, again, err)
		}
	})
}
