package probes

import (
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// driverSymbols are the probe table's driver rows.
func driverSymbols() []string {
	var names []string
	for _, p := range Table {
		if p.Layer == event.LayerDriver {
			names = append(names, p.Symbol)
		}
	}
	return names
}

// nvidiaThunkFacts are measured on NVIDIA's libraries
// (objdump and readelf -r of libcuda 535 and 550; docs/design.md, "NVIDIA's real libraries"): thunk, slot, implementation.
var nvidiaThunkFacts = map[string]map[string][3]uint64{
	"BOOKWORM_CUDA": { // libcuda.so.535.261.03
		"cuMemcpyHtoD_v2":      {0x324740, 0x1b11040, 0x328610},
		"cuMemcpyHtoD_v2_ptds": {0x2d5900, 0x1b11408, 0x2dd3e0},
		"cuMemcpyHtoDAsync_v2": {0x3248e0, 0x1b11048, 0x32aca0},
		"cuMemAllocHost_v2":    {0x2d56e0, 0x1b110d0, 0x2da000},
	},
	"TRIXIE_CUDA": { // libcuda.so.550.163.01
		"cuMemcpyHtoD_v2":        {0x2e1ac0, 0x1a6d100, 0x2eac00},
		"cuMemcpyDtoH_v2_ptds":   {0x292770, 0x1a6d4d0, 0x297260},
		"cuEventRecord":          {0x2eccb0, 0x1a6cc18, 0x2f1bc0},
		"cuStreamWaitEvent_ptsz": {0x2a8d60, 0x1a6d600, 0x2ab3a0},
	},
}

// nvidiaGuard is the guard of every table thunk of libcuda 535 and 550.
var nvidiaGuard = regexp.MustCompile(`^CMP DWORD PTR \[RIP\+0x[0-9a-f]+\], 0x321cba00; JE \.\+12$`)

// Every driver entry point of the probe table that NVIDIA's libcuda
// exports is a thunk whose implementation is proven from the file alone;
// the implementations are the measured ones, distinct, and begin with an
// emulated push %rbp where the thunk begins with a single-stepped cmpl.
func TestResolveThunkNVIDIA(t *testing.T) {
	for _, key := range []string{"BOOKWORM_CUDA", "TRIXIE_CUDA"} {
		t.Run(key, func(t *testing.T) {
			lib := filepath.Join(testenv.NVIDIA(t, key), "libcuda.so.1")
			names := driverSymbols()
			syms, err := LookupSymbols(lib, names)
			if err != nil {
				t.Fatal(err)
			}
			for name := range nvidiaThunkFacts[key] {
				if _, ok := syms[name]; !ok {
					t.Fatalf("%s does not export %s", lib, name)
				}
			}
			if len(syms) < 25 {
				t.Fatalf("only %d of %d driver rows exported by %s", len(syms), len(names), lib)
			}

			start := time.Now()
			r, err := NewThunkResolver(lib)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			thunks := map[string]Thunk{}
			for _, name := range names {
				s, ok := syms[name]
				if !ok {
					continue
				}
				th, err := r.Resolve(s)
				if err != nil {
					t.Errorf("%v", err)
					continue
				}
				thunks[name] = th
			}
			t.Logf("%s: resolved %d driver thunks in %v", filepath.Base(lib), len(thunks), time.Since(start))

			impls, slots := map[uint64]string{}, map[uint64]string{}
			for name, th := range thunks {
				if !nvidiaGuard.MatchString(th.Guard) {
					t.Errorf("%s: guard %q", name, th.Guard)
				}
				if other, dup := impls[th.Impl]; dup {
					t.Errorf("%s and %s share implementation %#x", name, other, th.Impl)
				}
				if other, dup := slots[th.Slot]; dup {
					t.Errorf("%s and %s share slot %#x", name, other, th.Slot)
				}
				impls[th.Impl], slots[th.Slot] = name, name
				code, err := ReadCode(lib, th.ImplOffset, 16)
				if err != nil {
					t.Fatal(err)
				}
				site, err := ChooseSite(code)
				if err != nil || site.Offset != 0 || site.Insn != "PUSH RBP" || site.Cost != CostEmulated {
					t.Errorf("%s: implementation %#x (offset %#x, % x): site %v, %v", name, th.Impl, th.ImplOffset, code[:8], site, err)
				}
				code, _ = ReadCode(lib, syms[name].Offset, 16)
				if site, err := ChooseSite(code); err != nil || site.Cost != CostSingleStep {
					t.Errorf("%s: the thunk's own site is %v, %v: expected single-step", name, site, err)
				}
			}
			for name, f := range nvidiaThunkFacts[key] {
				th := thunks[name]
				if syms[name].Value != f[0] || th.Slot != f[1] || th.Impl != f[2] {
					t.Errorf("%s: thunk %#x slot %#x impl %#x, measured %#x %#x %#x", name, syms[name].Value, th.Slot, th.Impl, f[0], f[1], f[2])
				}
			}
			// The convenience wrapper agrees.
			one := syms["cuMemcpyHtoD_v2"]
			if th, err := ResolveThunk(lib, one); err != nil || th != thunks[one.Name] {
				t.Errorf("ResolveThunk: %+v, %v; resolver: %+v", th, err, thunks[one.Name])
			}
		})
	}
}

// The exact guard text, from the bytes in section 1 of the research notes.
func TestResolveThunkNVIDIAGuardText(t *testing.T) {
	for key, want := range map[string]string{
		"BOOKWORM_CUDA": "CMP DWORD PTR [RIP+0x18e445e], 0x321cba00; JE .+12",
		"TRIXIE_CUDA":   "CMP DWORD PTR [RIP+0x1882e06], 0x321cba00; JE .+12",
	} {
		lib := filepath.Join(testenv.NVIDIA(t, key), "libcuda.so.1")
		syms, err := LookupSymbols(lib, []string{"cuMemcpyHtoD_v2"})
		if err != nil {
			t.Fatal(err)
		}
		th, err := ResolveThunk(lib, syms["cuMemcpyHtoD_v2"])
		if err != nil || th.Guard != want {
			t.Errorf("%s: guard %q, %v; want %q", key, th.Guard, err, want)
		}
	}
}

// Time to resolve every driver row of libcuda 550 with one resolver: the
// agent does this once per library file it finds mapped.
func BenchmarkResolveThunksNVIDIA(b *testing.B) {
	lib := filepath.Join(testenv.NVIDIA(b, "TRIXIE_CUDA"), "libcuda.so.1")
	syms, err := LookupSymbols(lib, driverSymbols())
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		r, err := NewThunkResolver(lib)
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range syms {
			if _, err := r.Resolve(s); err != nil {
				b.Fatal(err)
			}
		}
		r.Close()
	}
	b.ReportMetric(float64(len(syms)), "thunks/op")
}

// libcuda's other thunk shapes: the memset thunks zero-extend their value
// argument before the jump (refused, naming the instruction), and
// cuMemGetAttribute just returns (not a thunk).
func TestResolveThunkNVIDIARefusals(t *testing.T) {
	for _, key := range []string{"BOOKWORM_CUDA", "TRIXIE_CUDA"} {
		lib := filepath.Join(testenv.NVIDIA(t, key), "libcuda.so.1")
		syms, err := LookupSymbols(lib, []string{"cuMemsetD8_v2", "cuMemsetD16_v2", "cuMemGetAttribute"})
		if err != nil || len(syms) != 3 {
			t.Fatalf("%s: %v %v", lib, syms, err)
		}
		for name, want := range map[string]string{
			"cuMemsetD8_v2":  "guard instruction MOVZX ESI, SIL at +0xc before the jump through the slot at +0x10 may write ESI",
			"cuMemsetD16_v2": "guard instruction MOVZX ESI, SI at +0xc before the jump through the slot at +0xf may write ESI",
		} {
			_, err := ResolveThunk(lib, syms[name])
			if err == nil || errors.Is(err, ErrNotThunk) || !strings.Contains(err.Error(), want) ||
				!strings.HasPrefix(err.Error(), lib+": "+name+": ") {
				t.Errorf("%s: %v; want %q", name, err, want)
			}
		}
		if _, err := ResolveThunk(lib, syms["cuMemGetAttribute"]); !errors.Is(err, ErrNotThunk) {
			t.Errorf("cuMemGetAttribute: %v, want ErrNotThunk", err)
		}
	}
}

// buildThunkFixture compiles testdata/thunk/thunks.c into a shared library.
func buildThunkFixture(t *testing.T, flags ...string) string {
	t.Helper()
	needTools(t, "gcc")
	src, err := filepath.Abs(filepath.Join("testdata", "thunk", "thunks.c"))
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(t.TempDir(), "libthunks.so")
	run(t, "gcc", append([]string{"-O2", "-fPIC", "-shared", "-o", lib, src}, flags...)...)
	return lib
}

// elfSymbols reads every .symtab entry of the fixture (slots are objects,
// implementations local functions).
func elfSymbols(t *testing.T, path string) map[string]elf.Symbol {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]elf.Symbol{}
	for _, s := range syms {
		m[s.Name] = s
	}
	return m
}

// The fixture's thunks: a good one with NVIDIA's exact bytes, ENDBR64 and
// register guards, a protected implementation bound by symbol; refused
// look-alikes (guard writes an argument register, pushes, stores, branches
// out; slot bound to an import or an interposable export, pointing inside a
// function or at data, without relocation, in .text, set by an IFUNC); and
// ordinary functions. Once with RELA relocations, once with the RELATIVE
// ones packed into .relr.dyn.
func TestResolveThunkFixture(t *testing.T) {
	for _, variant := range []struct {
		name  string
		flags []string
	}{
		{"rela", nil},
		{"relr", []string{"-Wl,-z,pack-relative-relocs"}},
	} {
		t.Run(variant.name, func(t *testing.T) {
			lib := buildThunkFixture(t, variant.flags...)
			checkThunkFixture(t, lib, variant.name == "relr")
		})
	}
}

func checkThunkFixture(t *testing.T, lib string, relr bool) {
	ef, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	hasRelr := false
	for _, s := range ef.Sections {
		hasRelr = hasRelr || s.Type == shtRELR
	}
	ef.Close()
	if hasRelr != relr {
		t.Fatalf("%s: .relr.dyn present: %v, want %v", lib, hasRelr, relr)
	}

	all := elfSymbols(t, lib)
	addr := func(name string) uint64 {
		s, ok := all[name]
		if !ok {
			t.Fatalf("%s: no symbol %s", lib, name)
		}
		return s.Value
	}
	type want struct {
		impl, slot string // a resolved thunk
		guard      string
		notThunk   bool   // ErrNotThunk
		err        string // refused, with this in the message
	}
	nvGuard := regexp.MustCompile(`^CMP DWORD PTR \[RIP\+0x[0-9a-f]+\], 0x321cba00; JE \.\+12$`)
	cases := map[string]want{
		"lw_good":       {impl: "impl_good", slot: "slot_good"},
		"lw_endbr":      {impl: "impl_endbr", slot: "slot_endbr"},
		"lw_testreg":    {impl: "impl_testreg", slot: "slot_testreg", guard: "TEST RDI, RDI; JE .+6"},
		"lw_protected":  {impl: "lw_protected_impl", slot: "slot_protected"},
		"lw_writes_arg": {err: "guard instruction MOVZX ESI, SIL at +0xc before the jump through the slot at +0x10 may write ESI"},
		"lw_push":       {err: "guard instruction PUSH RBP at +0x0 before the jump through the slot at +0x1 moves RSP and touches the stack"},
		"lw_store":      {err: "guard instruction MOV DWORD PTR [RIP+0x"},
		"lw_je_out":     {err: "outside the function (size 0x16)"},
		"lw_import":     {err: `points outside the library: R_X86_64_64 to imported symbol "memcpy"`},
		"lw_got":        {err: `points outside the library: R_X86_64_GLOB_DAT to imported symbol "memcpy"`},
		"lw_interpose":  {err: `is bound by name to exported symbol "lw_exported_impl" (R_X86_64_64): a library loaded earlier can interpose it`},
		"lw_mid":        {err: "is not the start of a function in .eh_frame_hdr"},
		"lw_data":       {err: "is not in an executable segment of the file"},
		"lw_norel":      {err: "no dynamic relocation initialises slot"},
		"lw_textslot":   {err: "is in an executable segment: code, not a data word"},
		"lw_ifunc":      {err: "is set at load time by the IFUNC resolver"},
		"lw_plain":      {notThunk: true},
		"lw_direct":     {notThunk: true},
		"lw_far":        {notThunk: true},
	}
	names := make([]string, 0, len(cases))
	for n := range cases {
		names = append(names, n)
	}
	syms, err := LookupSymbols(lib, names)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewThunkResolver(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for name, w := range cases {
		sym, ok := syms[name]
		if !ok {
			t.Errorf("%s: not found in %s", name, lib)
			continue
		}
		th, err := r.Resolve(sym)
		switch {
		case w.impl != "":
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			impl := addr(w.impl)
			off, _ := fileOffset(mustELF(t, lib), impl)
			if th.Impl != impl || th.Slot != addr(w.slot) || th.ImplOffset != off {
				t.Errorf("%s: %+v, want impl %#x (%s, offset %#x) slot %#x (%s)", name, th, impl, w.impl, off, addr(w.slot), w.slot)
			}
			code, _ := ReadCode(lib, th.ImplOffset, 8)
			if site, err := ChooseSite(code); err != nil || site.Offset != 0 || site.Cost != CostEmulated {
				t.Errorf("%s: implementation site %v, %v", name, site, err)
			}
			switch {
			case w.guard != "":
				if th.Guard != w.guard {
					t.Errorf("%s: guard %q, want %q", name, th.Guard, w.guard)
				}
			case name == "lw_endbr":
				if g, ok := strings.CutPrefix(th.Guard, "ENDBR64; "); !ok || !nvGuard.MatchString(g) {
					t.Errorf("%s: guard %q", name, th.Guard)
				}
			default:
				if !nvGuard.MatchString(th.Guard) {
					t.Errorf("%s: guard %q", name, th.Guard)
				}
			}
		case w.notThunk:
			if !errors.Is(err, ErrNotThunk) {
				t.Errorf("%s: %+v, %v; want ErrNotThunk", name, th, err)
			}
		default:
			if err == nil || errors.Is(err, ErrNotThunk) || !strings.Contains(err.Error(), w.err) {
				t.Errorf("%s: %+v, %v; want an error with %q", name, th, err, w.err)
			}
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), lib+": "+name+": ") {
				t.Errorf("error %q does not name the file and the symbol", err)
			}
			t.Logf("%v", strings.TrimPrefix(err.Error(), lib+": "))
		}
	}

	// lw_good has exactly the bytes of libcuda's thunks but the rel32s.
	code, err := ReadCode(lib, syms["lw_good"].Offset, 30)
	if err != nil {
		t.Fatal(err)
	}
	pattern := []int{0x81, 0x3d, -1, -1, -1, -1, 0x00, 0xba, 0x1c, 0x32, 0x74, 0x0c, 0xff, 0x25, -1, -1, -1, -1,
		0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0xb8, 0x04, 0x00, 0x00, 0x00, 0xc3}
	for i, b := range pattern {
		if b >= 0 && (i >= len(code) || code[i] != byte(b)) {
			t.Fatalf("lw_good is not NVIDIA's thunk: % x", code)
		}
	}
}

func mustELF(t *testing.T, path string) *elf.File {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// decodeThunk on hand-written bytes: NVIDIA's thunk at its 535 address, the
// prefixes a slot jump may carry, and every way a guard is refused.
func TestDecodeThunk(t *testing.T) {
	nv := []byte{0x81, 0x3d, 0x5e, 0x44, 0x8e, 0x01, 0x00, 0xba, 0x1c, 0x32, 0x74, 0x0c, 0xff, 0x25, 0xee, 0xc8, 0x7e, 0x01,
		0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0xb8, 0x04, 0x00, 0x00, 0x00, 0xc3}
	cat := func(bs ...[]byte) []byte {
		var out []byte
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	jmp := []byte{0xff, 0x25, 0x10, 0x00, 0x00, 0x00} // jmp *0x10(%rip)
	ret := []byte{0xc3}
	tests := []struct {
		name  string
		code  []byte
		size  uint64
		slot  uint64 // for vaddr 0x1000 (nv: 0x324740)
		guard string
		err   string // "" ok; "not" ErrNotThunk; else a refusal containing it
	}{
		{"nvidia 535 cuMemcpyHtoD_v2", nv, 30, 0x1b11040, "CMP DWORD PTR [RIP+0x18e445e], 0x321cba00; JE .+12", ""},
		{"bare jmp", cat(jmp, ret), 7, 0x1016, "", ""},
		{"size unknown", cat(jmp, ret), 0, 0x1016, "", ""},
		{"endbr64", cat([]byte(endbr64), jmp), 10, 0x101a, "ENDBR64", ""},
		{"notrack", cat([]byte{0x3e}, jmp), 7, 0x1017, "", ""},
		{"rex.w", cat([]byte{0x48}, jmp), 7, 0x1017, "", ""},
		{"nop guard", cat([]byte{0x0f, 0x1f, 0x44, 0x00, 0x00}, jmp), 11, 0x101b, "NOP [RAX+RAX]", ""},
		{"je to the jump", cat([]byte{0x85, 0xff, 0x74, 0x00}, jmp, ret), 11, 0x101a, "TEST EDI, EDI; JE .+0", ""},
		{"je skips a guard", cat([]byte{0x85, 0xff, 0x74, 0x02, 0x85, 0xf6}, jmp, ret), 13, 0x101c, "TEST EDI, EDI; JE .+2; TEST ESI, ESI", ""},
		{"cmp byte reg", cat([]byte{0x40, 0x80, 0xfe, 0x01, 0x75, 0x06}, jmp, ret), 13, 0x101c, "CMP SIL, 0x1; JNE .+6", ""},
		{"empty", nil, 0, 0, "", "not"},
		{"ret", ret, 1, 0, "", "not"},
		{"mov eax ret", []byte{0xb8, 0x21, 0x03, 0x00, 0x00, 0xc3}, 6, 0, "", "not"},
		{"direct jmp", []byte{0xe9, 0x00, 0x10, 0x00, 0x00}, 5, 0, "", "not"},
		{"jmp rax", []byte{0xff, 0xe0}, 2, 0, "", "not"},
		{"jmp fs:slot", cat([]byte{0x64}, jmp), 7, 0, "", "not"},
		{"jmp word slot", cat([]byte{0x66}, jmp), 7, 0, "", "not"},
		{"jmp [rax]", []byte{0xff, 0x20}, 2, 0, "", "not"},
		{"jmp cut by size", cat([]byte{0x85, 0xff}, jmp), 5, 0, "", "not"},
		{"undecodable", []byte{0x06, 0xff, 0x25, 0, 0, 0, 0}, 7, 0, "", "not"},
		{"truncated", []byte{0xff, 0x25, 0x10}, 0, 0, "", "not"},
		{"nine guards", cat([]byte{0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90}, jmp), 15, 0, "", "not"},
		{"lock cmp", cat([]byte{0xf0, 0x83, 0x3d, 0, 0, 0, 0, 0x01}, jmp), 14, 0, "", "has a LOCK prefix"},
		{"xor eax", cat([]byte{0x31, 0xc0}, jmp), 8, 0, "", "XOR EAX, EAX at +0x0 before the jump through the slot at +0x2 may write EAX"},
		{"mov rdi", cat([]byte{0x48, 0x89, 0xc7}, jmp), 9, 0, "", "may write RDI"},
		{"sub rsp", cat([]byte{0x48, 0x83, 0xec, 0x08}, jmp), 10, 0, "", "may write RSP"},
		{"call", cat([]byte{0xe8, 0, 0, 0, 0}, jmp), 11, 0, "", "CALL .+0 at +0x0 before the jump through the slot at +0x5 moves RSP"},
		{"pop", cat([]byte{0x5d}, jmp), 7, 0, "", "POP RBP at +0x0 before the jump through the slot at +0x1 moves RSP"},
		{"store", cat([]byte{0x89, 0x38}, jmp), 8, 0, "", "MOV DWORD PTR [RAX], EDI at +0x0 before the jump through the slot at +0x2 may write memory"},
		{"cpuid", cat([]byte{0x0f, 0xa2}, jmp), 8, 0, "", "CPUID at +0x0 before the jump through the slot at +0x2 is not a compare, test or conditional branch"},
		{"je backwards", cat([]byte{0x85, 0xff, 0x74, 0xfc}, jmp), 10, 0, "", "JE .-4 at +0x2 before the jump through the slot at +0x4 branches to +0x0, not to an instruction ahead of it nor past the jump"},
		{"je into the jump", cat([]byte{0x85, 0xff, 0x74, 0x01}, jmp, ret), 11, 0, "", "branches to +0x5, not to an instruction ahead"},
		{"je past the end", cat([]byte{0x85, 0xff, 0x74, 0x10}, jmp, ret), 11, 0, "", "branches to +0x14, outside the function (size 0xb)"},
		{"je, no size", cat([]byte{0x85, 0xff, 0x74, 0x06}, jmp, ret), 0, 0, "", "the symbol has no size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vaddr := uint64(0x1000)
			if tt.name == "nvidia 535 cuMemcpyHtoD_v2" {
				vaddr = 0x324740
			}
			tc, err := decodeThunk(tt.code, vaddr, tt.size)
			switch tt.err {
			case "":
				if err != nil {
					t.Fatal(err)
				}
				if tc.slot != tt.slot || strings.Join(tc.guard, "; ") != tt.guard {
					t.Fatalf("slot %#x guard %q, want %#x %q", tc.slot, strings.Join(tc.guard, "; "), tt.slot, tt.guard)
				}
			case "not":
				if !errors.Is(err, ErrNotThunk) {
					t.Fatalf("%+v, %v; want ErrNotThunk", tc, err)
				}
			default:
				if err == nil || errors.Is(err, ErrNotThunk) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("%+v, %v; want an error with %q", tc, err, tt.err)
				}
			}
		})
	}
}

// Missing, non-ELF, truncated and corrupted files give errors naming the
// file (and, from Resolve, the symbol), never a panic.
func TestResolveThunkErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.so")
	if _, err := ResolveThunk(missing, Symbol{Name: "f"}); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}
	text := filepath.Join(dir, "text")
	os.WriteFile(text, []byte("not an ELF file at all"), 0o644)
	if _, err := NewThunkResolver(text); err == nil || !strings.Contains(err.Error(), text) {
		t.Errorf("text file: %v", err)
	}

	lib := buildThunkFixture(t)
	names := []string{"lw_good", "lw_endbr", "lw_protected", "lw_import", "lw_mid", "lw_plain"}
	syms, err := LookupSymbols(lib, names)
	if err != nil || len(syms) != len(names) {
		t.Fatalf("%v %v", syms, err)
	}
	// A symbol that is not in the file's code.
	if _, err := ResolveThunk(lib, Symbol{Name: "ghost", Value: 1 << 40, Size: 30}); err == nil ||
		!strings.HasPrefix(err.Error(), lib+": ghost: ") {
		t.Errorf("ghost symbol: %v", err)
	}
	b, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.so")
	try := func(what string, data []byte) {
		t.Helper()
		os.WriteFile(bad, data, 0o644)
		r, err := NewThunkResolver(bad)
		if err != nil {
			if !strings.Contains(err.Error(), bad) {
				t.Errorf("%s: error %q does not name the file", what, err)
			}
			return
		}
		defer r.Close()
		for _, name := range names {
			if _, err := r.Resolve(syms[name]); err != nil && !strings.HasPrefix(err.Error(), bad+": "+name+": ") {
				t.Errorf("%s: error %q does not name the file and the symbol", what, err)
			}
		}
	}
	for _, n := range []int{0, 16, 64, 200, 0x800, 0x1200, 0x3000, len(b) - 1} {
		try("truncated", b[:min(n, len(b))])
	}
	// Corrupt every 8-byte field of the section headers in turn (the
	// relocation, .dynsym and .eh_frame_hdr entries among them).
	ef := mustELF(t, lib)
	shoff := int(ef.FileHeader.ByteOrder.Uint64(b[0x28:]))
	for off := shoff; off+8 <= len(b); off += 8 {
		c := append([]byte(nil), b...)
		for i := range 8 {
			c[off+i] ^= 0xa5
		}
		try("section header", c)
	}
}

// FuzzThunkDecode feeds arbitrary code to the instruction walk: it never
// panics, and what it accepts is a slot jump inside the code and the
// symbol, after at most maxThunkInsns guard instructions.
func FuzzThunkDecode(f *testing.F) {
	f.Add([]byte{0x81, 0x3d, 0x5e, 0x44, 0x8e, 0x01, 0x00, 0xba, 0x1c, 0x32, 0x74, 0x0c, 0xff, 0x25, 0xee, 0xc8, 0x7e, 0x01,
		0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0xb8, 0x04, 0x00, 0x00, 0x00, 0xc3}, uint16(30))
	f.Add([]byte{0x81, 0x3d, 0, 0, 0, 0, 0x00, 0xba, 0x1c, 0x32, 0x74, 0x14, 0x40, 0x0f, 0xb6, 0xf6, 0xff, 0x25, 0, 0, 0, 0}, uint16(38))
	f.Add([]byte{0xf3, 0x0f, 0x1e, 0xfa, 0x85, 0xff, 0x74, 0x06, 0xff, 0x25, 0, 0, 0, 0, 0xc3}, uint16(0))
	f.Add([]byte{0xf0, 0x83, 0x3d, 0, 0, 0, 0, 0x01, 0x3e, 0xff, 0x25, 0, 0, 0, 0}, uint16(15))
	f.Add([]byte{0x55, 0x48, 0x89, 0xe5, 0x41, 0x56}, uint16(6))
	f.Add([]byte{0x74, 0x80, 0x0f, 0x84, 0xff, 0xff, 0xff, 0x7f, 0xff, 0x25, 0xff, 0xff, 0xff, 0xff}, uint16(0xffff))
	f.Fuzz(func(t *testing.T, code []byte, size uint16) {
		tc, err := decodeThunk(code, 0xffff_ffff_ffff_f000, uint64(size))
		if err != nil {
			return
		}
		n := uint64(len(code))
		if size != 0 {
			n = min(n, uint64(size))
		}
		if tc.jmpAt+6 > n || len(tc.guard) > maxThunkInsns {
			t.Fatalf("accepted jump at +%#x (%d guard instructions) in %d bytes: % x", tc.jmpAt, len(tc.guard), n, code)
		}
		for _, g := range tc.guard {
			if !strings.HasPrefix(g, "CMP ") && !strings.HasPrefix(g, "TEST ") && !strings.HasPrefix(g, "NOP") &&
				!strings.HasPrefix(g, "J") && g != "ENDBR64" && !strings.Contains(g, " CMP ") && !strings.Contains(g, " TEST ") &&
				!strings.Contains(g, " NOP") && !regexp.MustCompile(`(^| )J[A-Z]+ \.`).MatchString(g) {
				t.Fatalf("accepted guard %q in % x", g, code)
			}
		}
	})
}
