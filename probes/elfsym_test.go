package probes

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const (
	libcPath = "/lib/x86_64-linux-gnu/libc.so.6"
	ldsoPath = "/lib64/ld-linux-x86-64.so.2"
)

// testLibC exports lw_exported, keeps lw_hidden out of .dynsym (so only
// .symtab has it), exports lw_ifunc as an IFUNC and lw_data as an object.
const testLibC = `
int lw_exported(int a, int b) { return a * 31 + b; }
__attribute__((visibility("hidden"), noinline)) int lw_hidden(int a) { return a * a + 7; }
int lw_calls_hidden(int a) { return lw_hidden(a) * 3; }
static int lw_impl(void) { return 1; }
static void *lw_resolve(void) { return (void *)lw_impl; }
int lw_ifunc(void) __attribute__((ifunc("lw_resolve")));
int lw_data = 5;
`

// testStaticC is a freestanding static executable: no libc, no .dynsym.
const testStaticC = `
__attribute__((noinline)) long lw_static_fn(long a) { return a * 3 + 1; }
void _start(void) {
	long r = lw_static_fn(2);
	__asm__ volatile("mov $60, %%eax\n\tmov %0, %%rdi\n\tsyscall" :: "r"(r) : "rax", "rdi");
	for (;;) {}
}
`

// needTools skips when a build tool is missing, except under CI=true where
// every test must run.
func needTools(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is required under CI=true: %v", tool, err)
			}
			t.Skipf("%s not installed", tool)
		}
	}
}

// needFile skips when a system file is missing, except under CI=true.
func needFile(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is required under CI=true: %v", path, err)
		}
		t.Skipf("%s: %v", path, err)
	}
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// compileC builds src with gcc into dir/out and returns the path.
func compileC(t testing.TB, dir, out, src string, flags ...string) string {
	t.Helper()
	needTools(t, "gcc")
	c := filepath.Join(dir, out+".c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, out)
	run(t, "gcc", append(append([]string{}, flags...), "-o", bin, c)...)
	return bin
}

func copyFile(t testing.TB, src, dst string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// readelfSym is the oracle for a symbol's value, size and type: it parses
// `readelf -W -s --dyn-syms` and takes the default-version (or unversioned)
// entry of name.
type readelfEntry struct {
	Value, Size uint64
	Type, Bind  string
}

func readelfSym(t testing.TB, path, name string) (readelfEntry, bool) {
	t.Helper()
	needTools(t, "readelf")
	out := run(t, "readelf", "-W", "--syms", "--dyn-syms", path)
	for _, line := range strings.Split(out, "\n") {
		// "  1744: 0000000000098930   791 FUNC    GLOBAL DEFAULT   16 malloc@@GLIBC_2.2.5"
		f := strings.Fields(line)
		if len(f) < 8 || !strings.HasSuffix(f[0], ":") || f[6] == "UND" {
			continue
		}
		sym := f[7]
		if sym != name && !strings.HasPrefix(sym, name+"@@") {
			continue
		}
		v, err := strconv.ParseUint(f[1], 16, 64)
		if err != nil {
			t.Fatalf("readelf line %q: %v", line, err)
		}
		size, err := strconv.ParseUint(f[2], 0, 64)
		if err != nil {
			t.Fatalf("readelf line %q: %v", line, err)
		}
		return readelfEntry{Value: v, Size: size, Type: f[3], Bind: f[4]}, true
	}
	return readelfEntry{}, false
}

// objdumpInsn is one instruction as objdump prints it.
type objdumpInsn struct {
	Bytes    []byte
	Mnemonic string // Intel syntax, e.g. "push", "endbr64"
	Operands string // as objdump prints them ("rdi,rdi", "QWORD PTR [rdi+0x8],0x0")
}

// objdumpAt disassembles n bytes of the file's code at virtual address
// vaddr. objdump finds the bytes through the section headers, an independent
// path from the program headers LookupSymbols uses for Offset.
func objdumpAt(t testing.TB, path string, vaddr uint64, n int) []objdumpInsn {
	t.Helper()
	needTools(t, "objdump")
	out := run(t, "objdump", "-d", "-M", "intel", "-w",
		fmt.Sprintf("--start-address=%#x", vaddr), fmt.Sprintf("--stop-address=%#x", vaddr+uint64(n)), path)
	var insns []objdumpInsn
	for _, line := range strings.Split(out, "\n") {
		// "   98930:\t41 54                \tpush   r12"
		parts := strings.Split(line, "\t")
		if len(parts) < 2 || !strings.HasSuffix(strings.TrimSpace(parts[0]), ":") {
			continue
		}
		if _, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(parts[0]), ":"), 16, 64); err != nil {
			continue
		}
		b, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(parts[1]), " ", ""))
		if err != nil {
			t.Fatalf("objdump line %q: %v", line, err)
		}
		mn, operands := "", ""
		if len(parts) > 2 {
			if f := strings.Fields(parts[2]); len(f) > 0 {
				mn, operands = f[0], strings.Join(f[1:], " ")
			}
		}
		insns = append(insns, objdumpInsn{Bytes: b, Mnemonic: mn, Operands: operands})
	}
	if len(insns) == 0 {
		t.Fatalf("objdump printed no code at %#x in %s:\n%s", vaddr, path, out)
	}
	return insns
}

func objdumpBytes(t testing.TB, path string, vaddr uint64, n int) []byte {
	var b []byte
	for _, in := range objdumpAt(t, path, vaddr, n) {
		b = append(b, in.Bytes...)
	}
	if len(b) > n {
		b = b[:n]
	}
	return b
}

// checkSymbol compares a found symbol with readelf's entry and the bytes at
// its Offset with objdump's bytes at its Value.
func checkSymbol(t *testing.T, path string, got map[string]Symbol, name string) Symbol {
	t.Helper()
	s, ok := got[name]
	if !ok {
		t.Fatalf("%s: %s not found", path, name)
	}
	if s.Name != name {
		t.Errorf("%s: Name %q", name, s.Name)
	}
	want, ok := readelfSym(t, path, name)
	if !ok {
		t.Fatalf("readelf does not list %s in %s", name, path)
	}
	if s.Value != want.Value || s.Size != want.Size || want.Type != "FUNC" {
		t.Errorf("%s: got value %#x size %d, readelf says %#x size %d %s", name, s.Value, s.Size, want.Value, want.Size, want.Type)
	}
	code, err := ReadCode(path, s.Offset, 16)
	if err != nil {
		t.Fatal(err)
	}
	if wantCode := objdumpBytes(t, path, s.Value, 16); !bytes.Equal(code, wantCode) {
		t.Errorf("%s: bytes at offset %#x are % x, objdump shows % x at %#x", name, s.Offset, code, wantCode, s.Value)
	}
	return s
}

func TestLookupSymbolsLibc(t *testing.T) {
	needFile(t, libcPath)
	got, err := LookupSymbols(libcPath, []string{"malloc", "free", "memcpy", "stdout", "lw_no_such_symbol"})
	if err != nil {
		t.Fatal(err)
	}
	checkSymbol(t, libcPath, got, "malloc")
	checkSymbol(t, libcPath, got, "free")
	// memcpy@@GLIBC_2.14 is an IFUNC; the FUNC memcpy@GLIBC_2.2.5 is a
	// hidden compatibility version new callers never reach.
	if e, ok := readelfSym(t, libcPath, "memcpy"); ok && e.Type == "IFUNC" {
		if s, ok := got["memcpy"]; ok {
			t.Errorf("memcpy is an IFUNC here, yet found %+v", s)
		}
	} else {
		t.Logf("memcpy is not an IFUNC in this libc (%+v): not checked", e)
	}
	for _, name := range []string{"stdout", "lw_no_such_symbol"} {
		if s, ok := got[name]; ok {
			t.Errorf("%s is not a function, yet found %+v", name, s)
		}
	}
	if len(got) != 2 {
		t.Errorf("got %d symbols, want malloc and free: %+v", len(got), got)
	}
}

func TestLookupSymbolsLdso(t *testing.T) {
	needFile(t, ldsoPath)
	got, err := LookupSymbols(ldsoPath, []string{"_dl_debug_state"})
	if err != nil {
		t.Fatal(err)
	}
	checkSymbol(t, ldsoPath, got, "_dl_debug_state")
}

func TestLookupSymbolsSharedLib(t *testing.T) {
	dir := t.TempDir()
	lib := compileC(t, dir, "liblw.so", testLibC, "-O2", "-fPIC", "-shared")
	names := []string{"lw_exported", "lw_hidden", "lw_ifunc", "lw_data", "lw_impl", "missing"}

	got, err := LookupSymbols(lib, names)
	if err != nil {
		t.Fatal(err)
	}
	exported := checkSymbol(t, lib, got, "lw_exported")
	checkSymbol(t, lib, got, "lw_hidden") // from .symtab only
	checkSymbol(t, lib, got, "lw_impl")   // a static function, unique name
	for _, name := range []string{"lw_ifunc", "lw_data", "missing"} {
		if s, ok := got[name]; ok {
			t.Errorf("%s found: %+v", name, s)
		}
	}

	// strip --strip-all removes .symtab; exported functions stay in .dynsym.
	needTools(t, "strip")
	stripped := copyFile(t, lib, filepath.Join(dir, "liblw-stripped.so"))
	run(t, "strip", "--strip-all", stripped)
	if strings.Contains(run(t, "readelf", "-S", "-W", stripped), ".symtab") {
		t.Fatal("strip left .symtab")
	}
	got, err = LookupSymbols(stripped, names)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := got["lw_exported"]; !ok || s.Offset != exported.Offset || s.Value != exported.Value {
		t.Errorf("stripped lw_exported: got %+v, %v; unstripped %+v", s, ok, exported)
	}
	if len(got) != 1 {
		t.Errorf("stripped: got %+v, want only lw_exported", got)
	}
}

func TestLookupSymbolsStatic(t *testing.T) {
	dir := t.TempDir()
	exe := compileC(t, dir, "lwstatic", testStaticC, "-O2", "-static", "-nostdlib", "-no-pie", "-fcf-protection=none")
	got, err := LookupSymbols(exe, []string{"lw_static_fn", "_start"})
	if err != nil {
		t.Fatal(err)
	}
	// A non-PIE executable loads at 0x400000, so here Offset != Value and
	// the conversion through the program header is really exercised.
	s := checkSymbol(t, exe, got, "lw_static_fn")
	if s.Offset == s.Value {
		t.Errorf("lw_static_fn: offset equals vaddr %#x; the test needs them apart", s.Value)
	}
	checkSymbol(t, exe, got, "_start")

	// Stripped, a static executable has no symbol table at all.
	needTools(t, "strip")
	run(t, "strip", "--strip-all", exe)
	if sec := run(t, "readelf", "-S", "-W", exe); strings.Contains(sec, ".symtab") || strings.Contains(sec, ".dynsym") {
		t.Fatalf("stripped static executable still has a symbol table:\n%s", sec)
	}
	_, err = LookupSymbols(exe, []string{"lw_static_fn"})
	if !errors.Is(err, ErrNoSymbolTable) || !strings.Contains(err.Error(), exe) {
		t.Fatalf("got %v, want ErrNoSymbolTable naming %s", err, exe)
	}
}

// goChild is a Go program that reports where its Target function runs, the
// code bytes there and its own maps: the ground truth for Offset.
const goChild = `package main

import (
	"fmt"
	"os"
	"reflect"
	"unsafe"
)

//go:noinline
func Target(a int) int { return a*7 + 1 }

func main() {
	pc := reflect.ValueOf(Target).Pointer()
	fmt.Printf("%x %x\n", pc, unsafe.Slice((*byte)(unsafe.Pointer(pc)), 32))
	// Read into a buffer allocated beforehand: growing one between reads
	// maps new heap, and the later chunks of the file then show a changed
	// map (a torn view, as under a concurrent remap: CI saw an overlap).
	buf := make([]byte, 1<<20)
	f, _ := os.Open("/proc/self/maps")
	n := 0
	for n < len(buf) {
		k, err := f.Read(buf[n:])
		n += k
		if err != nil || k == 0 {
			break
		}
	}
	os.Stdout.Write(buf[:n])
}
`

// TestLookupSymbolsRunning checks Offset against a running process: a Go
// binary (non-PIE and PIE, found through .symtab) reports where Target runs;
// the file offset from the maps line that holds it must equal Offset, and
// the file bytes there must equal the code in memory.
func TestLookupSymbolsRunning(t *testing.T) {
	needTools(t, "go")
	dir := t.TempDir()
	for name, content := range map[string]string{"go.mod": "module lwchild\n\ngo 1.21\n", "main.go": goChild} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range []string{"exe", "pie"} {
		t.Run(mode, func(t *testing.T) {
			exe := filepath.Join(dir, "child-"+mode)
			build := exec.Command("go", "build", "-buildmode="+mode, "-o", exe, ".")
			build.Dir = dir
			build.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOFLAGS=-buildvcs=false", "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			out := run(t, exe)
			first, mapsText, _ := strings.Cut(out, "\n")
			var pc uint64
			var mem []byte
			if _, err := fmt.Sscanf(first, "%x %x", &pc, &mem); err != nil {
				t.Fatalf("child said %q: %v", first, err)
			}
			ms, err := ParseMaps(strings.NewReader(mapsText), "child maps")
			if err != nil {
				t.Fatal(err)
			}
			var m Mapping
			for _, mm := range ms {
				if mm.Start <= pc && pc < mm.End {
					m = mm
				}
			}
			if m.Path != exe || !m.Executable() {
				t.Fatalf("Target at %#x is in %+v, want an executable mapping of %s", pc, m, exe)
			}

			got, err := LookupSymbols(exe, []string{"main.Target"})
			if err != nil {
				t.Fatal(err)
			}
			s, ok := got["main.Target"]
			if !ok {
				t.Fatalf("main.Target not found in %s", exe)
			}
			if want := pc - m.Start + m.Offset; s.Offset != want {
				t.Fatalf("offset %#x, but Target runs at %#x in %+v: file offset %#x", s.Offset, pc, m, want)
			}
			code, err := ReadCode(exe, s.Offset, len(mem))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(code, mem) {
				t.Fatalf("file bytes % x differ from running code % x", code, mem)
			}
		})
	}
}

func TestLookupSymbolsErrors(t *testing.T) {
	dir := t.TempDir()

	text := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(text, []byte("not an ELF file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LookupSymbols(text, []string{"f"}); err == nil || !strings.Contains(err.Error(), text) || errors.Is(err, ErrNoSymbolTable) {
		t.Errorf("text file: got %v, want a not-ELF error naming %s", err, text)
	}

	missing := filepath.Join(dir, "gone.so")
	if _, err := LookupSymbols(missing, []string{"f"}); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: got %v", err)
	}

	needFile(t, libcPath)
	b, err := os.ReadFile(libcPath)
	if err != nil {
		t.Fatal(err)
	}
	// e_machine (offset 18, little endian) = 183, EM_AARCH64.
	arm := append([]byte(nil), b...)
	arm[18], arm[19] = 183, 0
	armPath := filepath.Join(dir, "libc-arm.so")
	if err := os.WriteFile(armPath, arm, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LookupSymbols(armPath, []string{"malloc"}); err == nil || !strings.Contains(err.Error(), armPath) || !strings.Contains(err.Error(), "EM_AARCH64") {
		t.Errorf("aarch64 ELF: got %v", err)
	}

	// Section headers sit at the end of the file, so a truncated copy has
	// a valid ELF header that points past the end.
	short := filepath.Join(dir, "libc-short.so")
	if err := os.WriteFile(short, b[:4096], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LookupSymbols(short, []string{"malloc"}); err == nil || !strings.Contains(err.Error(), short) {
		t.Errorf("truncated ELF: got %v", err)
	}
}

func TestReadCode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "code")
	if err := os.WriteFile(path, []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0xc3}, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		off  uint64
		n    int
		want []byte
		err  bool
	}{
		{0, 4, []byte{0xf3, 0x0f, 0x1e, 0xfa}, false},
		{4, 2, []byte{0x55, 0xc3}, false},
		{4, 16, []byte{0x55, 0xc3}, false}, // the file ends first
		{6, 16, nil, true},                 // nothing left
		{1 << 40, 16, nil, true},
		{1 << 63, 16, nil, true}, // beyond int64
		{0, 0, nil, true},
		{0, -1, nil, true},
	}
	for _, tt := range tests {
		got, err := ReadCode(path, tt.off, tt.n)
		if (err != nil) != tt.err || !bytes.Equal(got, tt.want) {
			t.Errorf("ReadCode(%#x, %d) = % x, %v; want % x, error %v", tt.off, tt.n, got, err, tt.want, tt.err)
		}
		if err != nil && !strings.Contains(err.Error(), path) {
			t.Errorf("error %q does not name the file", err)
		}
	}
	if _, err := ReadCode(path+".missing", 0, 4); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: got %v", err)
	}
}

func FuzzLookupSymbols(f *testing.F) {
	// Seeds: small real ELF files when gcc is here, and the head of libc,
	// whose ELF and program headers are valid but whose sections are cut off.
	if _, err := exec.LookPath("gcc"); err == nil {
		dir := f.TempDir()
		for _, p := range []string{
			compileC(f, dir, "liblw.so", testLibC, "-Os", "-fPIC", "-shared", "-nostdlib", "-s"),
			compileC(f, dir, "lwstatic", testStaticC, "-Os", "-static", "-nostdlib", "-no-pie"),
		} {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	if b, err := os.ReadFile(libcPath); err == nil {
		f.Add(b[:4096])
	}
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Add([]byte("not an ELF"))
	names := []string{"lw_exported", "lw_static_fn", "_start", "malloc"}
	// One file per worker process, rewritten for every input, on tmpfs when
	// there is one: on ext4, creating and truncating files per input was
	// most of the time.
	dir := f.TempDir()
	if shm, err := os.MkdirTemp("/dev/shm", "lwfuzz"); err == nil {
		dir = shm
		f.Cleanup(func() { os.RemoveAll(shm) })
	}
	path := filepath.Join(dir, "f.elf")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := LookupSymbols(path, names)
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		for name, s := range got {
			if s.Name != name || !slices.Contains(names, name) {
				t.Fatalf("unasked or misnamed symbol %q: %+v", name, s)
			}
		}
	})
}
