package probes

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// The fixtures in testdata/maps are real captures from the development
// machine (Linux 6.18): cat and bash (glibc), CPython with extension modules,
// a static Go binary, a binary run from a directory with spaces and deleted
// while running, and a process holding a memfd mapping.
// (/proc/1/maps was not readable there, even as root.)

// fieldsOracle parses a maps line another way: strings.Fields, with the path
// rebuilt from the remaining fields. It is right for every line whose path
// has no runs of spaces, which holds for all the captures.
func fieldsOracle(t *testing.T, line string) Mapping {
	t.Helper()
	f := strings.Fields(line)
	if len(f) < 5 {
		t.Fatalf("fixture line %q has %d fields", line, len(f))
	}
	lo, hi, _ := strings.Cut(f[0], "-")
	hex := func(s string) uint64 {
		v, err := strconv.ParseUint(s, 16, 64)
		if err != nil {
			t.Fatalf("fixture line %q: %v", line, err)
		}
		return v
	}
	ino, err := strconv.ParseUint(f[4], 10, 64)
	if err != nil {
		t.Fatalf("fixture line %q: %v", line, err)
	}
	return Mapping{Start: hex(lo), End: hex(hi), Perms: f[1], Offset: hex(f[2]), Dev: f[3], Inode: ino, Path: strings.Join(f[5:], " ")}
}

func TestParseMapsCaptures(t *testing.T) {
	tests := []struct {
		file string
		// a mapping the capture must hold, checked field by field
		want Mapping
		// executable file-backed mappings, counted with grep -c "r-xp.* /"
		execFiles int
	}{
		{"self.maps", Mapping{Start: 0x557fc3f02000, End: 0x557fc3f07000, Perms: "r-xp", Offset: 0x2000, Dev: "fe:00", Inode: 247026, Path: "/usr/bin/cat"}, 3},
		{"bash.maps", Mapping{Start: 0x55f48a60b000, End: 0x55f48a6cc000, Perms: "r-xp", Offset: 0x2f000, Dev: "fe:00", Inode: 246999, Path: "/usr/bin/bash"}, 4},
		{"gostatic.maps", Mapping{Start: 0x400000, End: 0x496000, Perms: "r-xp", Offset: 0, Dev: "fe:00", Inode: 9978243, Path: "/tmp/lwgo/gomaps"}, 1},
		{"deleted_spaces.maps", Mapping{Start: 0x5594dceb1000, End: 0x5594dceb6000, Perms: "r-xp", Offset: 0x2000, Dev: "fe:00", Inode: 9978220, Path: "/tmp/lw test dir/sleep (copy) (deleted)"}, 3},
		{"memfd.maps", Mapping{Start: 0x7f3153de8000, End: 0x7f3153dea000, Perms: "rw-s", Offset: 0, Dev: "00:01", Inode: 1025, Path: "/memfd:lw ring buf (deleted)"}, 21},
		{"python.maps", Mapping{Start: 0x7f5757244000, End: 0x7f575739a000, Perms: "r-xp", Offset: 0x26000, Dev: "fe:00", Inode: 326269, Path: "/usr/lib/x86_64-linux-gnu/libc.so.6"}, 27},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", "maps", tt.file)
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			ms, err := ParseMaps(bytes.NewReader(raw), path)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
			if len(ms) != len(lines) {
				t.Fatalf("got %d mappings from %d lines", len(ms), len(lines))
			}
			for i, line := range lines {
				if want := fieldsOracle(t, line); ms[i] != want {
					t.Errorf("line %d: got %+v, want %+v", i+1, ms[i], want)
				}
			}
			if !hasMapping(ms, tt.want) {
				t.Errorf("missing %+v", tt.want)
			}
			// Cross-check the counts with the raw text rather than by hand
			// where the capture is long.
			wantExec := 0
			for _, line := range lines {
				f := strings.Fields(line)
				if f[1][2] == 'x' && f[4] != "0" && len(f) > 5 && strings.HasPrefix(f[5], "/") {
					wantExec++
				}
			}
			gotExec := 0
			for _, m := range ms {
				if m.Executable() && m.FileBacked() {
					gotExec++
				}
			}
			if gotExec != wantExec {
				t.Errorf("executable file-backed: got %d, want %d", gotExec, wantExec)
			}
			if gotExec != tt.execFiles {
				t.Errorf("executable file-backed: got %d, counted %d with grep", gotExec, tt.execFiles)
			}
		})
	}
}

func hasMapping(ms []Mapping, want Mapping) bool {
	for _, m := range ms {
		if m == want {
			return true
		}
	}
	return false
}

func TestParseMapsLines(t *testing.T) {
	tests := []struct {
		name string
		line string
		want Mapping
	}{
		{"file", "7f73d66b1000-7f73d6807000 r-xp 00026000 fe:00 326269                     /usr/lib/x86_64-linux-gnu/libc.so.6",
			Mapping{0x7f73d66b1000, 0x7f73d6807000, 0x26000, "r-xp", "fe:00", 326269, "/usr/lib/x86_64-linux-gnu/libc.so.6"}},
		{"anon with trailing space", "7f73d6607000-7f73d6629000 rw-p 00000000 00:00 0 ",
			Mapping{0x7f73d6607000, 0x7f73d6629000, 0, "rw-p", "00:00", 0, ""}},
		{"anon without trailing space", "7f73d6607000-7f73d6629000 rw-p 00000000 00:00 0",
			Mapping{0x7f73d6607000, 0x7f73d6629000, 0, "rw-p", "00:00", 0, ""}},
		{"vsyscall", "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]",
			Mapping{0xffffffffff600000, 0xffffffffff601000, 0, "--xp", "00:00", 0, "[vsyscall]"}},
		{"heap", "55ad04f66000-55ad04f87000 rw-p 00000000 00:00 0                          [heap]",
			Mapping{0x55ad04f66000, 0x55ad04f87000, 0, "rw-p", "00:00", 0, "[heap]"}},
		{"named anon", "7f0000000000-7f0000004000 rw-p 00000000 00:00 0                          [anon:lw pinned pool]",
			Mapping{0x7f0000000000, 0x7f0000004000, 0, "rw-p", "00:00", 0, "[anon:lw pinned pool]"}},
		{"spaces and deleted", "7f0000000000-7f0000001000 r-xp 00001000 103:02 42                         /opt/my lib/libfoo  bar.so (deleted)",
			Mapping{0x7f0000000000, 0x7f0000001000, 0x1000, "r-xp", "103:02", 42, "/opt/my lib/libfoo  bar.so (deleted)"}},
		{"escaped newline kept raw", "7f0000000000-7f0000001000 r--p 00000000 fe:00 7 /tmp/a\\012b",
			Mapping{0x7f0000000000, 0x7f0000001000, 0, "r--p", "fe:00", 7, "/tmp/a\\012b"}},
		{"trailing CR is part of the name", "7f0000000000-7f0000001000 r--p 00000000 fe:00 7 /tmp/a\r",
			Mapping{0x7f0000000000, 0x7f0000001000, 0, "r--p", "fe:00", 7, "/tmp/a\r"}},
		{"64-bit offset", "7f0000000000-7f0000001000 r--s 1000000000000000 00:05 9 /dev/mem",
			Mapping{0x7f0000000000, 0x7f0000001000, 0x1000000000000000, "r--s", "00:05", 9, "/dev/mem"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms, err := ParseMaps(strings.NewReader(tt.line+"\n"), "t.maps")
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) != 1 || ms[0] != tt.want {
				t.Fatalf("got %+v, want %+v", ms, tt.want)
			}
		})
	}
}

func TestParseMapsErrors(t *testing.T) {
	const good = "00400000-00496000 r-xp 00000000 fe:00 9978243                            /tmp/lwgo/gomaps\n"
	tests := []struct {
		name  string
		input string
		want  string // prefix "file:line: " and a distinctive part
	}{
		{"bad start hex", good + "0040g000-00496000 r-xp 00000000 fe:00 1 /x\n", "t.maps:2: start address"},
		{"bad end hex", "00400000-0049600z r-xp 00000000 fe:00 1 /x\n", "t.maps:1: end address"},
		{"no dash", "00400000 r-xp 00000000 fe:00 1 /x\n", "t.maps:1: address range"},
		{"reversed", "00500000-00400000 r-xp 00000000 fe:00 1 /x\n", "t.maps:1: empty or reversed"},
		{"empty range", "00400000-00400000 r-xp 00000000 fe:00 1 /x\n", "t.maps:1: empty or reversed"},
		{"start overflows", "10000000000000000-10000000000000001 r-xp 00000000 fe:00 1 /x\n", "t.maps:1: start address"},
		{"bad perms", "00400000-00496000 r-xq 00000000 fe:00 1 /x\n", "t.maps:1: permissions"},
		{"short perms", "00400000-00496000 r-x 00000000 fe:00 1 /x\n", "t.maps:1: permissions"},
		{"bad offset", "00400000-00496000 r-xp 0000x000 fe:00 1 /x\n", "t.maps:1: offset"},
		{"bad device", "00400000-00496000 r-xp 00000000 fe00 1 /x\n", "t.maps:1: device"},
		{"device not hex", "00400000-00496000 r-xp 00000000 fe:zz 1 /x\n", "t.maps:1: device"},
		{"bad inode", "00400000-00496000 r-xp 00000000 fe:00 1a /x\n", "t.maps:1: inode"},
		{"missing inode", "00400000-00496000 r-xp 00000000 fe:00\n", "t.maps:1: missing inode"},
		{"missing device", "00400000-00496000 r-xp 00000000\n", "t.maps:1: missing device"},
		{"only range", "00400000-00496000\n", "t.maps:1: missing permissions"},
		{"double space inside fields", "00400000-00496000  r-xp 00000000 fe:00 1 /x\n", "t.maps:1: missing permissions"},
		{"blank lines still count", good + "\n \n0040g000-00496000 r-xp 00000000 fe:00 1 /x\n", "t.maps:4: start address"},
		{"unsorted", "7f0000001000-7f0000002000 r--p 00000000 00:00 0\n7f0000000000-7f0000001000 r--p 00000000 00:00 0\n", "t.maps:2: mapping 7f0000000000-7f0000001000 overlaps"},
		{"overlap", "7f0000000000-7f0000002000 r--p 00000000 00:00 0\n7f0000001000-7f0000003000 r--p 00000000 00:00 0\n", "t.maps:2: mapping"},
		{"line too long", good + "7f0000000000-7f0000001000 r--p 00000000 fe:00 7 /" + strings.Repeat("a", maxMapsLine) + "\n", "t.maps:2: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms, err := ParseMaps(strings.NewReader(tt.input), "t.maps")
			if err == nil {
				t.Fatalf("no error, got %+v", ms)
			}
			if !strings.HasPrefix(err.Error(), tt.want) && !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to contain %q", err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "t.maps:") {
				t.Fatalf("error %q does not name the file and line", err)
			}
			if ms != nil {
				t.Fatalf("partial result %+v alongside the error", ms)
			}
		})
	}
}

func TestParseMapsEmpty(t *testing.T) {
	// A kernel thread's maps file is empty: no mappings, no error.
	ms, err := ParseMaps(strings.NewReader(""), "empty.maps")
	if err != nil || len(ms) != 0 {
		t.Fatalf("got %+v, %v", ms, err)
	}
}

// The kernel never writes a blank line; one in a saved file is skipped, as
// by every parser of kernel text (internal/ktext.Lines).
func TestParseMapsBlankLines(t *testing.T) {
	in := "\n7f0000000000-7f0000001000 r--p 00000000 00:00 0\n\n \t\r\n7f0000001000-7f0000002000 r-xp 00000000 fe:00 3 /lib/x.so\n\n"
	ms, err := ParseMaps(strings.NewReader(in), "t.maps")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Start != 0x7f0000000000 || ms[1].Path != "/lib/x.so" {
		t.Fatalf("got %+v", ms)
	}
}

func TestParseMapsNoFinalNewline(t *testing.T) {
	in := "7f0000000000-7f0000001000 r--p 00000000 00:00 0\n7f0000001000-7f0000002000 r-xp 00000000 fe:00 3 /lib/x.so"
	ms, err := ParseMaps(strings.NewReader(in), "t.maps")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[1].Path != "/lib/x.so" {
		t.Fatalf("got %+v", ms)
	}
}

func TestMapsMappingPredicates(t *testing.T) {
	tests := []struct {
		line             string
		exec, fileBacked bool
	}{
		{"7f0-7f1 r-xp 00026000 fe:00 326269 /usr/lib/x86_64-linux-gnu/libc.so.6", true, true},
		{"7f0-7f1 r--p 00000000 fe:00 326269 /usr/lib/x86_64-linux-gnu/libc.so.6", false, true},
		{"7f0-7f1 r-xp 0000a000 00:01 1024 /memfd:sealed-91173221a7ea (deleted)", true, true},
		{"7f0-7f1 r-xp 00000000 00:00 0                          [vdso]", true, false},
		{"7f0-7f1 rw-p 00000000 00:00 0                          [heap]", false, false},
		{"7f0-7f1 rw-p 00000000 00:00 0 ", false, false},
		{"ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]", true, false},
		{"7f0-7f1 rw-s 00000000 00:05 12 /SYSV00000000 (deleted)", false, true},
	}
	for _, tt := range tests {
		ms, err := ParseMaps(strings.NewReader(tt.line), "t.maps")
		if err != nil {
			t.Fatal(err)
		}
		if got := ms[0].Executable(); got != tt.exec {
			t.Errorf("%q: Executable() = %v", tt.line, got)
		}
		if got := ms[0].FileBacked(); got != tt.fileBacked {
			t.Errorf("%q: FileBacked() = %v", tt.line, got)
		}
	}
	if (Mapping{}).Executable() || (Mapping{}).FileBacked() {
		t.Error("zero Mapping claims to be executable or file-backed")
	}
}

func TestReadMapsSelf(t *testing.T) {
	ms, err := ReadMaps("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Our own code lies in an executable mapping of the test binary.
	pc := uint64(reflect.ValueOf(TestReadMapsSelf).Pointer())
	var code *Mapping
	for i := range ms {
		if ms[i].Start <= pc && pc < ms[i].End {
			code = &ms[i]
		}
		if ms[i].Start == 0 {
			t.Fatalf("address 0 is mapped: %+v", ms[i])
		}
	}
	if code == nil {
		t.Fatalf("code address %#x not in any mapping", pc)
	}
	if !code.Executable() || !code.FileBacked() || code.Path != exe {
		t.Fatalf("code address %#x in %+v, want an executable mapping of %s", pc, *code, exe)
	}
}

func TestReadMapsErrors(t *testing.T) {
	root := t.TempDir()
	_, err := ReadMaps(root, 12345)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing pid: got %v, want fs.ErrNotExist", err)
	}
	if !strings.Contains(err.Error(), filepath.Join(root, "12345", "maps")) {
		t.Fatalf("error %q does not name the file", err)
	}

	// A bad file is reported with its path and line.
	dir := filepath.Join(root, "7")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "maps")
	if err := os.WriteFile(bad, []byte("7f0-7f1 r-xp 0 fe:00 1 /a\n7f1-zz r-xp 0 fe:00 1 /a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMaps(root, 7); err == nil || !strings.HasPrefix(err.Error(), bad+":2: ") {
		t.Fatalf("got %v, want an error starting %q", err, bad+":2: ")
	}

	if os.Geteuid() == 0 {
		t.Log("running as root: file permissions do not apply, fs.ErrPermission not checked")
		return
	}
	if err := os.Chmod(bad, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMaps(root, 7); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("unreadable: got %v, want fs.ErrPermission", err)
	}
}

// formatMapping writes m the way the kernel does, for the round-trip check.
func formatMapping(m Mapping) string {
	return fmt.Sprintf("%08x-%08x %s %08x %s %d %s\n", m.Start, m.End, m.Perms, m.Offset, m.Dev, m.Inode, m.Path)
}

func FuzzParseMaps(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "maps", "*.maps"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no seed captures: %v", err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]\n"))
	f.Add([]byte("7f0-7f1 r-xp 00001000 103:02 42   /opt/my lib/libfoo.so (deleted)"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ms, err := ParseMaps(bytes.NewReader(data), "fuzz.maps")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.maps:") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		// No silent loss: every line that is not blank became a mapping.
		lines := 0
		for l := range bytes.SplitSeq(data, []byte("\n")) {
			if len(bytes.TrimSpace(l)) > 0 {
				lines++
			}
		}
		if len(ms) != lines {
			t.Fatalf("%d mappings from %d lines", len(ms), lines)
		}
		var out strings.Builder
		for i, m := range ms {
			if m.Start >= m.End || (i > 0 && m.Start < ms[i-1].End) || len(m.Perms) != 4 {
				t.Fatalf("mapping %d is not valid, sorted and disjoint: %+v", i, m)
			}
			out.WriteString(formatMapping(m))
		}
		again, err := ParseMaps(strings.NewReader(out.String()), "again.maps")
		if err != nil {
			t.Fatalf("reparse: %v", err)
		}
		if !reflect.DeepEqual(ms, again) {
			t.Fatalf("round trip: %+v became %+v", ms, again)
		}
	})
}
