package collectors

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/probes"
)

// testdata/numa_maps holds the public samples of ../shared/samples/numa_maps
// (kernel documentation, LKML weighted interleave, systemd on one node, a
// 2011 two-node Nehalem grep across three processes) and captures from the
// development machine (Linux 6.18, one node): CPython started plainly, under
// numactl with each policy option, and with set_mempolicy(2) flags numactl
// cannot set (static, relative, balancing, weighted interleave), plus
// /proc/self/numa_maps of cat. See testdata/README.md.

func readNumaMapsFile(t *testing.T, name string) []NumaMapping {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "numa_maps", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ms, err := ParseNumaMaps(f, name)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// kernelFormat writes m back the way show_numa_map does (fs/proc/task_mmu.c,
// Linux 6.x), including its rules for which counters it omits. Reproducing
// every real line byte for byte checks the parser lost nothing and read each
// field into the right place.
func kernelFormat(m NumaMapping) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%08x %s", m.Start, m.Policy)
	switch {
	case m.File != "":
		b.WriteString(" file=" + kernelEscape(m.File))
	case m.Heap:
		b.WriteString(" heap")
	case m.Stack:
		b.WriteString(" stack")
	}
	if m.Huge {
		b.WriteString(" huge")
	}
	pages := m.Pages()
	if pages == 0 {
		return b.String()
	}
	if m.Anon != 0 {
		fmt.Fprintf(&b, " anon=%d", m.Anon)
	}
	if m.Dirty != 0 {
		fmt.Fprintf(&b, " dirty=%d", m.Dirty)
	}
	if pages != m.Anon && pages != m.Dirty {
		fmt.Fprintf(&b, " mapped=%d", pages)
	}
	if m.MapMax > 1 {
		fmt.Fprintf(&b, " mapmax=%d", m.MapMax)
	}
	if m.SwapCache != 0 {
		fmt.Fprintf(&b, " swapcache=%d", m.SwapCache)
	}
	if m.Active < pages && !m.Huge {
		fmt.Fprintf(&b, " active=%d", m.Active)
	}
	if m.Writeback != 0 {
		fmt.Fprintf(&b, " writeback=%d", m.Writeback)
	}
	for _, n := range slices.Sorted(maps.Keys(m.PagesByNode)) {
		fmt.Fprintf(&b, " N%d=%d", n, m.PagesByNode[n])
	}
	if m.PageSizeKB != 0 { // not printed before 2.6.32
		fmt.Fprintf(&b, " kernelpagesize_kB=%d", m.PageSizeKB)
	}
	return b.String()
}

// kernelEscape is mangle_path with the escape set "\n\t= ".
func kernelEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte("\n\t= ", s[i]) >= 0 {
			fmt.Fprintf(&b, `\%03o`, s[i])
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func TestParseNumaMapsRoundTripsEveryRealLine(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "numa_maps", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var nfiles int
	for _, p := range files {
		if strings.HasSuffix(p, ".maps") {
			continue
		}
		nfiles++
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		ms := readNumaMapsFile(t, filepath.Base(p))
		lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
		if len(ms) != len(lines) {
			t.Fatalf("%s: %d mappings from %d lines", p, len(ms), len(lines))
		}
		for i, m := range ms {
			if m.Other != nil {
				t.Errorf("%s:%d: unknown tokens %v in a real line", p, i+1, m.Other)
			}
			if got := kernelFormat(m); got != lines[i] {
				t.Errorf("%s:%d:\n got %s\nwant %s", p, i+1, got, lines[i])
			}
		}
	}
	if nfiles < 20 {
		t.Fatalf("only %d numa_maps fixtures", nfiles)
	}
}

func TestParseNumaMapsSamples(t *testing.T) {
	tests := []struct {
		file  string
		count int
		index int // the entry checked in full
		want  NumaMapping
	}{
		{"linux_kernel_doc_proc_rst_example_N0_N3_anon_hugepage.txt", 16, 13, NumaMapping{
			Start: 0x7f4dc1200000, Policy: "default", File: "/anon_hugepage (deleted)", Huge: true,
			Anon: 1, Dirty: 1, Mapped: 1, PagesByNode: map[int]uint64{3: 1}, PageSizeKB: 2048}},
		{"linux_kernel_doc_proc_rst_example_N0_N3_anon_hugepage.txt", 16, 6, NumaMapping{
			Start: 0x3206800000, Policy: "default", File: "/lib64/libc-2.12.so",
			Mapped: 59, MapMax: 21, Active: 55, PagesByNode: map[int]uint64{0: 41, 3: 18}, PageSizeKB: 4}},
		{"lkml_2024_weighted_interleave_v5_eatmem_weights_1t5.txt", 2, 0, NumaMapping{
			Start: 0x01f07000, Policy: "weighted interleave:0-1", Heap: true,
			Anon: 65793, Dirty: 65793, Mapped: 65793, PagesByNode: map[int]uint64{0: 10966, 1: 54827}, PageSizeKB: 4}},
		{"ompi-www_hwloc-devel_2011-02_2020_nehalem_2node_grep7ffd861da000_snapshot4.txt", 3, 1, NumaMapping{
			Start: 0x7ffd861da000, Policy: "bind:1", Anon: 1850875, Dirty: 1850873, Mapped: 1850875, SwapCache: 2, Active: 996836,
			PagesByNode: map[int]uint64{0: 256407, 1: 1594468}}},
		{"jc_fixture_pid_numa_maps_systemd_single_node.txt", 213, 5, NumaMapping{
			Start: 0x55a9e8cd4000, Policy: "default", Heap: true, Anon: 611, Dirty: 611, Mapped: 611, MapMax: 2, Active: 611,
			PagesByNode: map[int]uint64{0: 611}, PageSizeKB: 4}},
		{"jc_fixture_pid_numa_maps_systemd_single_node.txt", 213, 7, NumaMapping{Start: 0x7f53a4021000, Policy: "default"}},
		{"lanewatch-dev_python_default.numa_maps", 111, 7, NumaMapping{
			Start: 0x7fe396305000, Policy: "default", File: "/tmp/cap/kv pool=1.bin", Dirty: 8, Mapped: 8,
			PagesByNode: map[int]uint64{0: 8}, PageSizeKB: 4}},
		{"lanewatch-dev_python_default.numa_maps", 111, 110, NumaMapping{
			Start: 0x7ffd954d2000, Policy: "default", Stack: true, Anon: 15, Dirty: 15, Mapped: 15, Active: 1,
			PagesByNode: map[int]uint64{0: 15}, PageSizeKB: 4}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s#%d", tt.file, tt.index), func(t *testing.T) {
			ms := readNumaMapsFile(t, tt.file)
			if len(ms) != tt.count {
				t.Fatalf("%d mappings, want %d", len(ms), tt.count)
			}
			if !reflect.DeepEqual(ms[tt.index], tt.want) {
				t.Errorf("got  %+v\nwant %+v", ms[tt.index], tt.want)
			}
		})
	}
}

// Every line of a process started under a policy shows that policy: the task
// policy stands in for VMAs that have none.
func TestParseNumaMapsPolicies(t *testing.T) {
	tests := []struct {
		file, policy string
		want         MemPolicy
	}{
		{"lanewatch-dev_python_default.numa_maps", "default", MemPolicy{Mode: "default", Nodes: []int{}}},
		{"lanewatch-dev_numactl_membind_0.numa_maps", "bind:0", MemPolicy{Mode: "bind", Nodes: []int{0}}},
		{"lanewatch-dev_numactl_interleave_0.numa_maps", "interleave:0", MemPolicy{Mode: "interleave", Nodes: []int{0}}},
		{"lanewatch-dev_numactl_preferred_0.numa_maps", "prefer:0", MemPolicy{Mode: "prefer", Nodes: []int{0}}},
		{"lanewatch-dev_numactl_localalloc.numa_maps", "local", MemPolicy{Mode: "local", Nodes: []int{}}},
		{"lanewatch-dev_numactl_preferredmany_0.numa_maps", "prefer (many):0", MemPolicy{Mode: "prefer (many)", Nodes: []int{0}}},
		{"lanewatch-dev_set_mempolicy_weighted_interleave.numa_maps", "weighted interleave:0", MemPolicy{Mode: "weighted interleave", Nodes: []int{0}}},
		{"lanewatch-dev_set_mempolicy_bind_static.numa_maps", "bind=static:0", MemPolicy{Mode: "bind", Flags: []string{"static"}, Nodes: []int{0}}},
		{"lanewatch-dev_set_mempolicy_bind_balancing.numa_maps", "bind=balancing:0", MemPolicy{Mode: "bind", Flags: []string{"balancing"}, Nodes: []int{0}}},
		{"lanewatch-dev_set_mempolicy_interleave_relative.numa_maps", "interleave=relative:0", MemPolicy{Mode: "interleave", Flags: []string{"relative"}, Nodes: []int{0}}},
		{"lanewatch-dev_set_mempolicy_bind_static_balancing.numa_maps", "bind=static|balancing:0", MemPolicy{Mode: "bind", Flags: []string{"static", "balancing"}, Nodes: []int{0}}},
		{"lkml_2024_weighted_interleave_v5_eatmem_weights_5t1.txt", "weighted interleave:0-1", MemPolicy{Mode: "weighted interleave", Nodes: []int{0, 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			ms := readNumaMapsFile(t, tt.file)
			for i, m := range ms {
				if m.Policy != tt.policy {
					t.Fatalf("line %d: policy %q, want %q", i+1, m.Policy, tt.policy)
				}
			}
			p, err := ParseMemPolicy(tt.policy)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p, tt.want) {
				t.Errorf("ParseMemPolicy = %+v, want %+v", p, tt.want)
			}
			if got, want := p.Restricts(), tt.want.Mode != "default" && tt.want.Mode != "local"; got != want {
				t.Errorf("Restricts = %v", got)
			}
		})
	}
}

func TestParseNumaMapsLines(t *testing.T) {
	tests := []struct {
		name, line string
		want       NumaMapping
	}{
		{"prefer many with spaces", "7f0000 prefer (many):0,2 anon=3 N0=1 N2=2 kernelpagesize_kB=4",
			NumaMapping{Start: 0x7f0000, Policy: "prefer (many):0,2", Anon: 3, Mapped: 3, Active: 3, PagesByNode: map[int]uint64{0: 1, 2: 2}, PageSizeKB: 4}},
		{"weighted interleave with flag", "7f0000 weighted interleave=static:0-1 heap",
			NumaMapping{Start: 0x7f0000, Policy: "weighted interleave=static:0-1", Heap: true}},
		{"old preferred", "7f0000 preferred:1 stack:1234 anon=1 N1=1",
			NumaMapping{Start: 0x7f0000, Policy: "preferred:1", Stack: true, Anon: 1, Mapped: 1, Active: 1, PagesByNode: map[int]uint64{1: 1}, Other: map[string]string{"stack": "1234"}}},
		{"future multi-word mode", "7f0000 some new:0-3 file=/x",
			NumaMapping{Start: 0x7f0000, Policy: "some new:0-3", File: "/x"}},
		{"unknown keys kept", "7f0000 default anon=1 shiny=7 N0=1 sparkly kernelpagesize_kB=4",
			NumaMapping{Start: 0x7f0000, Policy: "default", Anon: 1, Mapped: 1, Active: 1, PagesByNode: map[int]uint64{0: 1}, PageSizeKB: 4, Other: map[string]string{"shiny": "7", "sparkly": ""}}},
		{"writeback and escapes", `7f0000 default file=/a\011b\012c\134d\08 dirty=2 writeback=2 N1=2`,
			NumaMapping{Start: 0x7f0000, Policy: "default", File: "/a\tb\nc\\d\\08", Dirty: 2, Mapped: 2, Active: 2, Writeback: 2, PagesByNode: map[int]uint64{1: 2}}},
		{"trailing blank of a grep copy", "7f0000 bind:0 anon=1 N0=1 ",
			NumaMapping{Start: 0x7f0000, Policy: "bind:0", Anon: 1, Mapped: 1, Active: 1, PagesByNode: map[int]uint64{0: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms, err := ParseNumaMaps(strings.NewReader(tt.line+"\n"), "t")
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) != 1 || !reflect.DeepEqual(ms[0], tt.want) {
				t.Errorf("got  %+v\nwant %+v", ms, tt.want)
			}
		})
	}
}

func TestParseNumaMapsErrors(t *testing.T) {
	tests := []struct{ text, want string }{
		{"7f0000 default\nzz default\n", "f.numa_maps:2: start address"},
		{"7f0000\n", "f.numa_maps:1: want"},
		{"\n\n7f0000 default anon=x\n", "f.numa_maps:3: anon=\"x\" is not a count"},
		{"7f0000 default anon=-1\n", "f.numa_maps:1: anon="},
		{"7f0000 default anon=+1\n", "f.numa_maps:1: anon="},
		{"7f0000 default N0=1 N0=2\n", "f.numa_maps:1: N0= given twice"},
		{"7f0000 default N1=1 N01=2\n", "f.numa_maps:1: N1= given twice"},
		{"7f0000 default N0=99999999999999999999\n", "f.numa_maps:1: N0="},
		{"7f0000 default file=/a =x\n", "f.numa_maps:1: token \"=x\" has no key"},
		{"7f0000 default file=/a odd odd\n", "f.numa_maps:1: odd given twice"},
		{"12345678901234567 default\n", "f.numa_maps:1: start address"},
		{"7f0000 default " + strings.Repeat("x", maxNumaMapsLine) + "\n", "f.numa_maps:1: bufio.Scanner: token too long"},
	}
	for _, tt := range tests {
		_, err := ParseNumaMaps(strings.NewReader(tt.text), "f.numa_maps")
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%.60q: error %v, want prefix %q", tt.text, err, tt.want)
		}
	}
}

func TestParseMemPolicyErrors(t *testing.T) {
	for _, s := range []string{"", ":0", "=static:0", "bind:1-0", "bind=:0", "bind=static||balancing:0", "bind:x"} {
		if p, err := ParseMemPolicy(s); err == nil {
			t.Errorf("ParseMemPolicy(%q) = %+v, want an error", s, p)
		}
	}
}

func TestPagesByNode(t *testing.T) {
	nm := []NumaMapping{
		{Start: 0x1000, PagesByNode: map[int]uint64{0: 4}, PageSizeKB: 4},                  // 0x1000-0x5000, full
		{Start: 0x10000, PagesByNode: map[int]uint64{0: 10, 1: 30}, PageSizeKB: 4},         // 0x10000-0x38000: 40 pages
		{Start: 0x200000, PagesByNode: map[int]uint64{1: 2}, PageSizeKB: 2048, Huge: true}, // 0x200000-0x600000
		{Start: 0x4000000, PagesByNode: map[int]uint64{0: 7}, PageSizeKB: 4},               // no maps entry: stale
		{Start: 0x5000000, PagesByNode: map[int]uint64{1: 9}},                              // no page size (2.6.27)
	}
	ranges := []AddrRange{{0x1000, 0x5000}, {0x10000, 0x38000}, {0x200000, 0x600000}, {0x5000000, 0x5001000}}
	tests := []struct {
		name       string
		start, end uint64
		want       RangePlacement
	}{
		{"exact mapping", 0x1000, 0x5000, RangePlacement{
			Pages: map[int]uint64{0: 4}, Bytes: map[int]uint64{0: 16384}, Mappings: 1}},
		{"quarter of a mapping is prorated", 0x10000, 0x1a000, RangePlacement{
			Pages: map[int]uint64{0: 3, 1: 8}, Bytes: map[int]uint64{0: 3 * 4096, 1: 8 * 4096}, Mappings: 1, Approximate: true}},
		{"hugetlb in bytes, a hole counted", 0x100000, 0x600000, RangePlacement{
			Pages: map[int]uint64{1: 2}, Bytes: map[int]uint64{1: 4 << 20}, Mappings: 1, Unmapped: 0x100000}},
		{"stale entry left out and counted", 0x4000000, 0x4001000, RangePlacement{
			Pages: map[int]uint64{}, Bytes: map[int]uint64{}, Stale: 1, Unmapped: 0x1000}},
		{"unknown page size", 0x5000000, 0x5001000, RangePlacement{
			Pages: map[int]uint64{1: 9}, Bytes: map[int]uint64{}, Mappings: 1, PageSizeUnknown: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PagesByNode(nm, ranges, tt.start, tt.end)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
	if _, err := PagesByNode(nm, ranges, 5, 5); err == nil {
		t.Error("empty range: no error")
	}
	if _, err := PagesByNode(nm, []AddrRange{{5, 4}}, 0, 9); err == nil {
		t.Error("inverted mapping: no error")
	}
}

// The capture pair (numa_maps and maps of one CPython) gives exact counts for
// a whole VMA: the 64 MiB shared anonymous mapping with 16 MiB touched.
func TestPagesByNodeCapture(t *testing.T) {
	nm := readNumaMapsFile(t, "lanewatch-dev_python_default.numa_maps")
	f, err := os.Open(filepath.Join("testdata", "numa_maps", "lanewatch-dev_python_default.maps"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ms, err := probes.ParseMaps(f, "maps")
	if err != nil {
		t.Fatal(err)
	}
	got, err := PagesByNode(nm, addrRanges(ms), 0x7fe392305000, 0x7fe396305000)
	if err != nil {
		t.Fatal(err)
	}
	want := RangePlacement{Pages: map[int]uint64{0: 4096}, Bytes: map[int]uint64{0: 16 << 20}, Mappings: 1}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	// Every numa_maps entry has its maps entry; [vsyscall] is in maps only.
	all, err := PagesByNode(nm, addrRanges(ms), 0, 1<<47)
	if err != nil {
		t.Fatal(err)
	}
	if all.Stale != 0 || all.Mappings != len(nm) || all.Approximate {
		t.Errorf("whole address space: %+v", all)
	}
}

// addrRanges keeps the address ranges of parsed /proc/PID/maps entries
// (sorted and disjoint, as probes.ParseMaps returns them).
func addrRanges(ms []probes.Mapping) []AddrRange {
	out := make([]AddrRange, len(ms))
	for i, m := range ms {
		out[i] = AddrRange{m.Start, m.End}
	}
	return out
}

// livePagesByNode reads numa_maps and maps of pid and returns PagesByNode
// for [start, end). The two files are read at different moments, and a
// process that maps memory in between (the Go runtime growing its heap next
// to the range makes the kernel merge VMAs) leaves entries without a
// partner; the reads are then retried a few times, and a result that still
// has Stale entries is returned as is.
func livePagesByNode(t *testing.T, pid int, start, end uint64) RangePlacement {
	t.Helper()
	var p RangePlacement
	for range 4 {
		nm, err := ReadNumaMaps("/proc", pid)
		if err != nil {
			t.Fatal(err)
		}
		ms, err := probes.ReadMaps("/proc", pid)
		if err != nil {
			t.Fatal(err)
		}
		if p, err = PagesByNode(nm, addrRanges(ms), start, end); err != nil {
			t.Fatal(err)
		}
		if p.Stale == 0 {
			break
		}
	}
	return p
}

// numaMapsFormatAll writes every field, zeros included, so that a parse of
// its output must equal the parse it came from.
func numaMapsFormatAll(m NumaMapping) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%x %s", m.Start, m.Policy)
	if m.File != "" {
		b.WriteString(" file=")
		for i := 0; i < len(m.File); i++ {
			if c := m.File[i]; c <= ' ' || c == '=' || c == '\\' || c >= 0x7f {
				fmt.Fprintf(&b, `\%03o`, c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	for _, w := range []struct {
		on   bool
		name string
	}{{m.Heap, "heap"}, {m.Stack, "stack"}, {m.Huge, "huge"}} {
		if w.on {
			b.WriteString(" " + w.name)
		}
	}
	fmt.Fprintf(&b, " anon=%d dirty=%d mapped=%d mapmax=%d swapcache=%d active=%d writeback=%d",
		m.Anon, m.Dirty, m.Mapped, m.MapMax, m.SwapCache, m.Active, m.Writeback)
	for _, n := range slices.Sorted(maps.Keys(m.PagesByNode)) {
		fmt.Fprintf(&b, " N%d=%d", n, m.PagesByNode[n])
	}
	fmt.Fprintf(&b, " kernelpagesize_kB=%d", m.PageSizeKB)
	for _, k := range slices.Sorted(maps.Keys(m.Other)) {
		switch {
		case k == "stack" && m.Stack && !strings.Contains(m.Other[k], "="):
			b.WriteString(" stack:" + m.Other[k])
		case m.Other[k] == "":
			b.WriteString(" " + k)
		default:
			b.WriteString(" " + k + "=" + m.Other[k])
		}
	}
	return b.String()
}

func FuzzParseNumaMaps(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "numa_maps", "*"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no seeds: %v", err)
	}
	for _, p := range files {
		if strings.HasSuffix(p, ".maps") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("7f0000 prefer (many):0,2 stack:12 x=1 y N01=3\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ms, err := ParseNumaMaps(bytes.NewReader(data), "fuzz.numa_maps")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.numa_maps:") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		// No silent loss: one mapping per non-blank line, and writing every
		// field back parses to the same values.
		var lines int
		for l := range bytes.SplitSeq(data, []byte("\n")) {
			if len(bytes.TrimSpace(l)) > 0 {
				lines++
			}
		}
		if len(ms) != lines {
			t.Fatalf("%d mappings from %d non-blank lines", len(ms), lines)
		}
		for i, m := range ms {
			line := numaMapsFormatAll(m)
			again, err := ParseNumaMaps(strings.NewReader(line), "again")
			if err != nil {
				t.Fatalf("entry %d %+v: reparse of %q: %v", i, m, line, err)
			}
			norm := func(m NumaMapping) NumaMapping {
				if len(m.PagesByNode) == 0 {
					m.PagesByNode = nil
				}
				return m
			}
			if len(again) != 1 || !reflect.DeepEqual(norm(again[0]), norm(m)) {
				t.Fatalf("entry %d changed on reparse of %q:\n got %+v\nwant %+v", i, line, again, m)
			}
		}
	})
}
