package probes

import (
	"strings"
	"testing"

	"golang.org/x/arch/x86/x86asm"
)

func TestChooseSite(t *testing.T) {
	tests := []struct {
		name string
		code []byte
		want Site
	}{
		{"endbr64 push rbp", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5},
			Site{Offset: 4, Insn: "PUSH RBP", Cost: CostEmulated, Skipped: "ENDBR64"}},
		{"endbr64 push r15", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x57, 0x41, 0x56},
			Site{Offset: 4, Insn: "PUSH R15", Cost: CostEmulated, Skipped: "ENDBR64"}},
		{"push rbp", []byte{0x55, 0x48, 0x89, 0xe5},
			Site{Offset: 0, Insn: "PUSH RBP", Cost: CostEmulated}},
		{"push r12 (glibc malloc)", []byte{0x41, 0x54, 0x55, 0x53},
			Site{Offset: 0, Insn: "PUSH R12", Cost: CostEmulated}},
		{"push rbx", []byte{0x53}, Site{Offset: 0, Insn: "PUSH RBX", Cost: CostEmulated}},
		{"nop", []byte{0x90, 0xc3}, Site{Offset: 0, Insn: "NOP", Cost: CostEmulated}},
		{"nop5", []byte{0x0f, 0x1f, 0x44, 0x00, 0x00, 0x55},
			Site{Offset: 0, Insn: "NOP [RAX+RAX]", Cost: CostTrampoline}},
		{"endbr64 nop5", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x0f, 0x1f, 0x44, 0x00, 0x00},
			Site{Offset: 4, Insn: "NOP [RAX+RAX]", Cost: CostTrampoline, Skipped: "ENDBR64"}},
		{"mov rax, rdi", []byte{0x48, 0x89, 0xf8, 0xc3},
			Site{Offset: 0, Insn: "MOV RAX, RDI", Cost: CostSingleStep}},
		{"endbr64 sub rsp", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x83, 0xec, 0x08},
			Site{Offset: 4, Insn: "SUB RSP, 0x8", Cost: CostSingleStep, Skipped: "ENDBR64"}},
		{"ret", []byte{0xc3}, Site{Offset: 0, Insn: "RET", Cost: CostSingleStep}},
		// The kernel emulates push only with REX 0x41: push rax with REX.W
		// (48 50) and the 16-bit push (66 50) are single-stepped.
		{"rex.w push rax", []byte{0x48, 0x50}, Site{Offset: 0, Insn: "PUSH RAX", Cost: CostSingleStep}},
		{"push ax", []byte{0x66, 0x50}, Site{Offset: 0, Insn: "PUSH AX", Cost: CostSingleStep}},
		{"pause is not nop", []byte{0xf3, 0x90}, Site{Offset: 0, Insn: "PAUSE", Cost: CostSingleStep}},
		{"other 5-byte nop", []byte{0x0f, 0x1f, 0x40, 0x00, 0x90}, Site{Offset: 0, Insn: "NOP [RAX]", Cost: CostSingleStep}},
		// A compare of registers writes only the flags: skipped when the
		// conditional jump after it is emulated (UCX's uct_sm_ep_put_short).
		{"test edx then je", []byte{0x85, 0xd2, 0x74, 0x1c, 0x48, 0x83, 0xec, 0x08},
			Site{Offset: 2, Insn: "JE .+28", Cost: CostEmulated, Skipped: "TEST EDX, EDX"}},
		{"endbr64 cmp rdi, 0x10 then jne rel32", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x83, 0xff, 0x10, 0x0f, 0x85, 0x10, 0x00, 0x00, 0x00},
			Site{Offset: 8, Insn: "JNE .+16", Cost: CostEmulated, Skipped: "ENDBR64, CMP RDI, 0x10"}},
		// A compare with memory stays the site; so does one not followed by a jump.
		{"test memory then je", []byte{0xf6, 0x87, 0xf4, 0xfe, 0xff, 0xff, 0x01, 0x74, 0x10},
			Site{Offset: 0, Insn: "TEST [RDI-0x10c], 0x1", Cost: CostSingleStep}},
		{"test then mov", []byte{0x85, 0xd2, 0x48, 0x89, 0xf8},
			Site{Offset: 0, Insn: "TEST EDX, EDX", Cost: CostSingleStep}},
		{"jmp rel32", []byte{0xe9, 0x00, 0x01, 0x00, 0x00}, Site{Offset: 0, Insn: "JMP .+256", Cost: CostEmulated}},
		// A second ENDBR64 is an instruction like any other: only one is skipped.
		{"two endbr64", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0xf3, 0x0f, 0x1e, 0xfa, 0x55},
			Site{Offset: 4, Insn: "ENDBR64", Cost: CostSingleStep, Skipped: "ENDBR64"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ChooseSite(tt.code)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestChooseSiteErrors(t *testing.T) {
	tests := []struct {
		name string
		code []byte
	}{
		{"empty", nil},
		{"only endbr64", []byte{0xf3, 0x0f, 0x1e, 0xfa}},
		{"truncated mov", []byte{0x48, 0x89}},
		{"truncated after endbr64", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x48}},
		{"invalid opcode", []byte{0x06}}, // push es: invalid in 64-bit mode
		{"prefixes only", []byte{0x66, 0x66, 0xf0}},
		{"ud2", []byte{0x0f, 0x0b, 0x55}},
		{"ud0", []byte{0x0f, 0xff, 0xff, 0xff}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if s, err := ChooseSite(tt.code); err == nil {
				t.Fatalf("no error, got %+v", s)
			}
		})
	}
}

func TestSiteStrings(t *testing.T) {
	s := Site{Offset: 4, Insn: "PUSH RBP", Cost: CostEmulated, Skipped: "ENDBR64"}
	if got, want := s.String(), "+4 PUSH RBP (emulated, after ENDBR64)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	s = Site{Insn: "LEA RAX, [RIP+0x10]", Cost: CostSingleStep}
	if got, want := s.String(), "+0 LEA RAX, [RIP+0x10] (single-step)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	for c, want := range map[SiteCost]string{CostSingleStep: "single-step", CostEmulated: "emulated", CostTrampoline: "trampoline", 0: "SiteCost(0)"} {
		if c.String() != want {
			t.Errorf("SiteCost(%d).String() = %q, want %q", c, c.String(), want)
		}
	}
}

// testSiteC has a function whose prologue is push rbp at -O2 because of
// -fno-omit-frame-pointer, and that makes a call so it needs the frame.
const testSiteC = `
extern int lw_sink(int);
int lw_site(int a, int b) { return lw_sink(a) + lw_sink(b) * 3; }
`

func TestChooseSiteCompiled(t *testing.T) {
	tests := []struct {
		flag string
		want Site
	}{
		{"-fcf-protection=full", Site{Offset: 4, Insn: "PUSH RBP", Cost: CostEmulated, Skipped: "ENDBR64"}},
		{"-fcf-protection=none", Site{Offset: 0, Insn: "PUSH RBP", Cost: CostEmulated}},
	}
	for _, tt := range tests {
		t.Run(tt.flag, func(t *testing.T) {
			lib := compileC(t, t.TempDir(), "libsite.so", testSiteC, "-O2", "-fPIC", "-shared", "-fno-omit-frame-pointer", tt.flag)
			syms, err := LookupSymbols(lib, []string{"lw_site"})
			if err != nil {
				t.Fatal(err)
			}
			sym, ok := syms["lw_site"]
			if !ok {
				t.Fatalf("lw_site not found in %s", lib)
			}
			code, err := ReadCode(lib, sym.Offset, 16)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ChooseSite(code)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v (code % x)", got, tt.want, code)
			}
			checkAgainstObjdump(t, lib, sym, got)
		})
	}
}

// TestChooseSiteSystem classifies real library entry points and checks the
// decision against objdump's disassembly of the same bytes.
func TestChooseSiteSystem(t *testing.T) {
	for _, tt := range []struct{ path, name string }{
		{libcPath, "malloc"},
		{libcPath, "free"},
		{libcPath, "pthread_create"},
		{ldsoPath, "_dl_debug_state"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			needFile(t, tt.path)
			syms, err := LookupSymbols(tt.path, []string{tt.name})
			if err != nil {
				t.Fatal(err)
			}
			sym, ok := syms[tt.name]
			if !ok {
				t.Fatalf("%s not found in %s", tt.name, tt.path)
			}
			code, err := ReadCode(tt.path, sym.Offset, 16)
			if err != nil {
				t.Fatal(err)
			}
			site, err := ChooseSite(code)
			if err != nil {
				t.Fatalf("% x: %v", code, err)
			}
			t.Logf("%s: % x -> %v", tt.name, code[:8], site)
			checkAgainstObjdump(t, tt.path, sym, site)
		})
	}
}

// checkAgainstObjdump derives the expected site from objdump's listing:
// skip one endbr64, and a test or cmp without a memory operand before a
// conditional jump, then the cost from the mnemonic and its bytes.
func checkAgainstObjdump(t *testing.T, path string, sym Symbol, got Site) {
	t.Helper()
	insns := objdumpAt(t, path, sym.Value, 24)
	wantOff, skipped := uint64(0), ""
	if insns[0].Mnemonic == "endbr64" {
		wantOff, skipped = uint64(len(insns[0].Bytes)), "ENDBR64"
		insns = insns[1:]
	}
	cost := func(in objdumpInsn) SiteCost {
		switch {
		case in.Mnemonic == "push" && (len(in.Bytes) == 1 || len(in.Bytes) == 2 && in.Bytes[0] == 0x41) && in.Bytes[len(in.Bytes)-1]&0xf8 == 0x50:
			return CostEmulated
		case in.Mnemonic == "nop" && len(in.Bytes) == 1:
			return CostEmulated
		case in.Mnemonic == "nop" && string(in.Bytes) == "\x0f\x1f\x44\x00\x00":
			return CostTrampoline
		case strings.HasPrefix(in.Mnemonic, "j") && in.Bytes[0] != 0x66 && in.Bytes[0] != 0xff && in.Bytes[0] != 0x41: // relative jumps, not jmp *reg
			return CostEmulated
		case in.Mnemonic == "call" && in.Bytes[0] == 0xe8:
			return CostEmulated
		}
		return CostSingleStep
	}
	in := insns[0]
	if (in.Mnemonic == "test" || in.Mnemonic == "cmp") && !strings.Contains(in.Operands, "[") && len(insns) > 1 &&
		strings.HasPrefix(insns[1].Mnemonic, "j") && insns[1].Mnemonic != "jmp" && cost(insns[1]) == CostEmulated {
		wantOff += uint64(len(in.Bytes))
		skipped = strings.TrimPrefix(skipped+", "+strings.ToUpper(in.Mnemonic), ", ")
		in = insns[1]
	}
	wantCost := cost(in)
	if got.Offset != wantOff || !strings.HasPrefix(got.Skipped, skipped) || got.Cost != wantCost {
		t.Errorf("%s: got %v; objdump shows %q (% x) at +%d, so want cost %v", sym.Name, got, in.Mnemonic, in.Bytes, wantOff, wantCost)
	}
	if op, _, _ := strings.Cut(got.Insn, " "); !strings.EqualFold(op, in.Mnemonic) {
		t.Errorf("%s: x86asm says %q, objdump says %q", sym.Name, got.Insn, in.Mnemonic)
	}
}

func FuzzChooseSite(f *testing.F) {
	for _, seed := range [][]byte{
		{0xf3, 0x0f, 0x1e, 0xfa, 0x55},
		{0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x57},
		{0x55},
		{0x0f, 0x1f, 0x44, 0x00, 0x00},
		{0x48, 0x89, 0xf8},
		{0xc3},
		{0xf3, 0x0f, 0x1e, 0xfa},
		{},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, code []byte) {
		s, err := ChooseSite(code)
		if err != nil {
			return
		}
		endbr := len(code) >= 4 && string(code[:4]) == "\xf3\x0f\x1e\xfa"
		if s.Offset != 0 && s.Offset != 4 || (s.Offset == 4) != endbr {
			t.Fatalf("% x: offset %d", code, s.Offset)
		}
		if s.SPDelta != 0 {
			t.Fatalf("% x: SPDelta %d", code, s.SPDelta)
		}
		if s.Cost < CostSingleStep || s.Cost > CostTrampoline || s.Insn == "" {
			t.Fatalf("% x: %+v", code, s)
		}
		// The site is an instruction boundary: x86asm decodes the same
		// instruction there on its own.
		if s.Insn == "ENDBR64" {
			if string(code[s.Offset:s.Offset+4]) != "\xf3\x0f\x1e\xfa" {
				t.Fatalf("% x: site %+v is not an ENDBR64", code, s)
			}
			return
		}
		in, err := x86asm.Decode(code[s.Offset:], 64)
		if err != nil || in.String() != s.Insn {
			t.Fatalf("% x: site %+v, but decoding there gives %v, %v", code, s, in, err)
		}
	})
}
