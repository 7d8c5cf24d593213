package probes

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"

	"golang.org/x/arch/x86/x86asm"
)

// ErrNotThunk means a function is not a dispatch thunk: its first
// instructions do not end in a jump through a RIP-relative slot. The agent
// then probes the function itself, as it does every ordinary function. It
// is returned wrapped, with what the walk found.
var ErrNotThunk = errors.New("not a dispatch thunk")

// Thunk is an exported entry point that only dispatches to its
// implementation through a slot: a few guard instructions that write
// nothing but RFLAGS (libcuda's compare a "library torn down" flag and
// branch to an error return inside the thunk), then `jmp *slot(%rip)`. Every
// driver entry point of NVIDIA's libcuda is one. A uprobe on the
// implementation sees the same registers and stack as one on the thunk (the
// guard wrote no argument register and did not touch the stack), and its
// first instruction is `push %rbp`, which the kernel emulates, where the
// thunk's `cmpl` is single-stepped.
//
// What a probe at Impl misses: calls that take the guard's error path (they
// return at once without reaching the implementation), and every call after
// something at run time stores another value in the slot (libcuda lets
// tools swap its slots through an internal export table). The file only
// proves the slot's initial value.
type Thunk struct {
	Slot       uint64 // vaddr of the slot the indirect jmp reads
	Impl       uint64 // vaddr of the implementation: the slot's value in the file (its relocation's addend)
	ImplOffset uint64 // file offset of Impl (what a uprobe attaches at)
	Guard      string // the instructions before the jmp, e.g. "CMP DWORD PTR [RIP+0x18e445e], 0x321cba00; JE .+12"
}

// maxThunkInsns bounds the walk: the jump through the slot must be among the
// first maxThunkInsns instructions after an optional ENDBR64. libcuda's is
// the third.
const maxThunkInsns = 8

// maxThunkBytes bounds the code read per symbol (15-byte instructions).
const maxThunkBytes = 4 + maxThunkInsns*15

// thunkCode is what decodeThunk proves from the code alone.
type thunkCode struct {
	guard []string // the instructions before the slot jump, ENDBR64 included
	jmpAt uint64   // offset of the slot jump from the function's start
	slot  uint64   // vaddr the jump reads its target from
}

// decodeThunk walks the fall-through path of the code of a function at
// vaddr whose symbol size is size (0: unknown, and then only the length of
// code bounds the walk), looking for `jmp qword ptr [rip+disp32]`. It
// returns ErrNotThunk (wrapped) when none is found before an instruction
// that leaves the function, the end of the function or maxThunkInsns
// instructions; a found jump whose guard is not provably harmless is
// another error naming the instruction.
func decodeThunk(code []byte, vaddr, size uint64) (thunkCode, error) {
	if size != 0 && uint64(len(code)) > size {
		code = code[:size]
	}
	var tc thunkCode
	var off uint64
	if bytes.HasPrefix(code, []byte(endbr64)) {
		tc.guard = append(tc.guard, "ENDBR64")
		off = uint64(len(endbr64))
	}
	type guardInsn struct {
		inst x86asm.Inst
		off  uint64
	}
	var guard []guardInsn
	for n := 0; ; n++ {
		if n == maxThunkInsns {
			return thunkCode{}, fmt.Errorf("%w: no jump through a slot in the first %d instructions", ErrNotThunk, maxThunkInsns)
		}
		if off >= uint64(len(code)) {
			return thunkCode{}, fmt.Errorf("%w: the function ends at +%#x before any jump through a slot", ErrNotThunk, off)
		}
		at := code[off:]
		if bytes.HasPrefix(at, []byte(endbr64)) { // x86asm does not know it
			guard = append(guard, guardInsn{x86asm.Inst{}, off})
			off += uint64(len(endbr64))
			continue
		}
		inst, err := x86asm.Decode(at, 64)
		if err != nil || inst.Op == 0 || inst.Len <= 0 || inst.Len > len(at) {
			return thunkCode{}, fmt.Errorf("%w: cannot decode % x at +%#x", ErrNotThunk, head(at), off)
		}
		if slotDisp, ok := slotJump(inst); ok {
			end := off + uint64(inst.Len)
			tc.jmpAt = off
			tc.slot = vaddr + end + uint64(int64(slotDisp))
			// A branch in the guard may skip ahead to one of its own
			// instructions or to the jump, never into one.
			landing := map[uint64]bool{off: true}
			for _, g := range guard {
				landing[g.off] = true
			}
			for _, g := range guard {
				text := "ENDBR64"
				if g.inst.Op != 0 {
					text = insnText(g.inst)
					if err := checkGuard(g.inst, g.off, off, end, size, landing); err != nil {
						return thunkCode{}, err
					}
				}
				tc.guard = append(tc.guard, text)
			}
			return tc, nil
		}
		switch inst.Op {
		case x86asm.JMP, x86asm.LJMP, x86asm.RET, x86asm.LRET, x86asm.IRET, x86asm.IRETD, x86asm.IRETQ,
			x86asm.UD0, x86asm.UD1, x86asm.UD2, x86asm.INT, x86asm.HLT:
			return thunkCode{}, fmt.Errorf("%w: %s at +%#x leaves the function before any jump through a slot",
				ErrNotThunk, insnText(inst), off)
		}
		guard = append(guard, guardInsn{inst, off})
		off += uint64(inst.Len)
	}
}

// slotJump reports whether inst is `jmp qword ptr [rip+disp32]` (ff 25,
// with REX, notrack (3e) or bnd (f2) prefixes allowed) and returns disp.
func slotJump(inst x86asm.Inst) (int64, bool) {
	if inst.Op != x86asm.JMP || inst.MemBytes != 8 || inst.DataSize == 16 {
		return 0, false
	}
	m, ok := inst.Args[0].(x86asm.Mem)
	if !ok || m.Base != x86asm.RIP || m.Index != 0 || m.Segment != 0 {
		return 0, false
	}
	return m.Disp, true
}

// checkGuard accepts an instruction before the slot jump (at jmpAt, ending at
// jmpEnd) only if it cannot change what the implementation sees: CMP and
// TEST (they write RFLAGS only), NOP, and conditional branches either to the
// error path inside the function after the jump, or forward to a later
// guard instruction or the jump itself (landing holds their offsets).
func checkGuard(inst x86asm.Inst, off, jmpAt, jmpEnd, size uint64, landing map[uint64]bool) error {
	text := insnText(inst)
	where := fmt.Sprintf("guard instruction %s at +%#x before the jump through the slot at +%#x", text, off, jmpAt)
	for _, p := range inst.Prefix {
		if p == 0 {
			break
		}
		if p&0xff == x86asm.PrefixLOCK {
			return fmt.Errorf("%s has a LOCK prefix", where)
		}
	}
	switch inst.Op {
	case x86asm.CMP, x86asm.TEST, x86asm.NOP:
		return nil
	case x86asm.JA, x86asm.JAE, x86asm.JB, x86asm.JBE, x86asm.JE, x86asm.JNE, x86asm.JG, x86asm.JGE,
		x86asm.JL, x86asm.JLE, x86asm.JO, x86asm.JNO, x86asm.JP, x86asm.JNP, x86asm.JS, x86asm.JNS,
		x86asm.JCXZ, x86asm.JECXZ, x86asm.JRCXZ:
		rel, ok := inst.Args[0].(x86asm.Rel)
		if !ok {
			return fmt.Errorf("%s is an indirect branch", where)
		}
		target := int64(off) + int64(inst.Len) + int64(rel) // offsets are small: no overflow
		switch {
		case target > int64(off) && uint64(target) <= jmpAt && landing[uint64(target)]:
			return nil // skips guard instructions, still reaches the jump
		case target >= 0 && uint64(target) < jmpEnd:
			return fmt.Errorf("%s branches to +%#x, not to an instruction ahead of it nor past the jump", where, target)
		case size == 0:
			return fmt.Errorf("%s branches to +%#x, and the symbol has no size to tell whether that is inside the function", where, target)
		case target < 0 || uint64(target) >= size:
			return fmt.Errorf("%s branches to %+#x, outside the function (size %#x)", where, target, size)
		}
		return nil
	case x86asm.PUSH, x86asm.POP, x86asm.PUSHF, x86asm.POPF, x86asm.PUSHFQ, x86asm.POPFQ, x86asm.CALL,
		x86asm.LCALL, x86asm.ENTER, x86asm.LEAVE:
		return fmt.Errorf("%s moves RSP and touches the stack", where)
	}
	switch a := inst.Args[0].(type) {
	case x86asm.Reg:
		return fmt.Errorf("%s may write %s", where, regName(a))
	case x86asm.Mem:
		return fmt.Errorf("%s may write memory", where)
	}
	return fmt.Errorf("%s is not a compare, test or conditional branch", where)
}

// insnText is x86asm's text of inst with operand sizes on memory operands
// ("CMP DWORD PTR [RIP+0x18e445e], 0x321cba00") and the usual names of the
// low byte registers (x86asm calls sil "SIB").
func insnText(inst x86asm.Inst) string {
	s := inst.String()
	for _, a := range inst.Args {
		switch a := a.(type) {
		case x86asm.Reg:
			if n := regName(a); n != a.String() {
				s = replaceWord(s, a.String(), n)
			}
		case x86asm.Mem:
			if inst.Op == x86asm.NOP || inst.Op == x86asm.LEA {
				continue
			}
			ptr := map[int]string{1: "BYTE", 2: "WORD", 4: "DWORD", 8: "QWORD", 16: "XMMWORD"}[inst.MemBytes]
			if ptr == "" {
				continue
			}
			i := strings.IndexByte(s, '[')
			if j := strings.LastIndexByte(s[:max(i, 0)], ' '); i > 0 && j >= 0 {
				s = s[:j+1] + ptr + " PTR " + s[j+1:]
			}
		}
	}
	return s
}

// regName fixes x86asm's names of spl, bpl, sil and dil.
func regName(r x86asm.Reg) string {
	switch r {
	case x86asm.SPB:
		return "SPL"
	case x86asm.BPB:
		return "BPL"
	case x86asm.SIB:
		return "SIL"
	case x86asm.DIB:
		return "DIL"
	}
	return r.String()
}

// replaceWord replaces the operand old (a whole word between spaces,
// commas and brackets) with new.
func replaceWord(s, old, new string) string {
	var b strings.Builder
	for len(s) > 0 {
		i := strings.Index(s, old)
		if i < 0 {
			break
		}
		end := i + len(old)
		if (i == 0 || strings.IndexByte(" ,[+*", s[i-1]) >= 0) && (end == len(s) || strings.IndexByte(" ,]+*", s[end]) >= 0) {
			b.WriteString(s[:i] + new)
		} else {
			b.WriteString(s[:end])
		}
		s = s[end:]
	}
	b.WriteString(s)
	return b.String()
}

// dynReloc is one dynamic relocation, keyed by the address it writes.
type dynReloc struct {
	off      uint64
	addend   int64
	typ      elf.R_X86_64
	sym      uint32 // index into .dynsym; 0: none
	implicit bool   // from .relr.dyn: RELATIVE with the addend stored in the word itself
}

// shtRELR is SHT_RELR (packed R_X86_64_RELATIVE, ld -z pack-relative-relocs),
// which debug/elf does not name.
const shtRELR elf.SectionType = 19

// ThunkResolver resolves the thunks of one ELF file: it opens the file once
// and, on the first symbol that decodes as a thunk, indexes the file's
// dynamic relocations by address and loads its function starts, so
// resolving the 30 driver entry points of a 30 MB libcuda reads its
// relocations once. Safe for concurrent use.
type ThunkResolver struct {
	path string
	f    *os.File
	ef   *elf.File

	mu      sync.Mutex
	loaded  bool
	relocs  []dynReloc // sorted by off
	relErr  error
	starts  []uint64
	fdeErr  error
	dynsyms []elf.Symbol // loaded when a relocation names a symbol
	dynErr  error
	symLoad bool
}

// NewThunkResolver opens the ELF file at path (x86-64 only).
func NewThunkResolver(path string) (r *ThunkResolver, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err // *fs.PathError names the path
	}
	defer func() {
		if rec := recover(); rec != nil {
			r, err = nil, fmt.Errorf("%s: malformed ELF: %v", path, rec)
		}
		if err != nil {
			f.Close()
		}
	}()
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, fmt.Errorf("%s: not a readable ELF file: %w", path, err)
	}
	if ef.Class != elf.ELFCLASS64 || ef.Machine != elf.EM_X86_64 {
		return nil, fmt.Errorf("%s: ELF %v %v, want ELFCLASS64 EM_X86_64", path, ef.Class, ef.Machine)
	}
	return &ThunkResolver{path: path, f: f, ef: ef}, nil
}

// Close releases the file.
func (r *ThunkResolver) Close() error { return r.f.Close() }

// ResolveThunk decides whether the function sym of the ELF file at path is a
// dispatch thunk and, if so, where its implementation is. It returns
// ErrNotThunk (wrapped or as is) when the code is an ordinary function, and
// another error naming the reason when it looks like a thunk but cannot be
// proven safe to bypass. For more than one symbol of a file, use a
// ThunkResolver.
func ResolveThunk(path string, sym Symbol) (Thunk, error) {
	r, err := NewThunkResolver(path)
	if err != nil {
		return Thunk{}, err
	}
	defer r.Close()
	return r.Resolve(sym)
}

// Resolve is ResolveThunk for a symbol of the resolver's file. Only
// sym.Name, sym.Value and sym.Size are used; the code is read at the file
// offset of sym.Value. Every error names the file and the symbol.
func (r *ThunkResolver) Resolve(sym Symbol) (t Thunk, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer func() {
		if rec := recover(); rec != nil { // debug/elf or x86asm on a hostile file
			t, err = Thunk{}, fmt.Errorf("malformed ELF: %v", rec)
		}
		if err != nil {
			err = fmt.Errorf("%s: %s: %w", r.path, sym.Name, err)
		}
	}()
	off, ok := fileOffset(r.ef, sym.Value)
	if !ok {
		return Thunk{}, fmt.Errorf("%#x is not in an executable segment of the file", sym.Value)
	}
	n := uint64(maxThunkBytes)
	if sym.Size != 0 && sym.Size < n {
		n = sym.Size
	}
	code := make([]byte, n)
	got, err := r.f.ReadAt(code, int64(off))
	if got == 0 {
		return Thunk{}, fmt.Errorf("read code at %#x: %w", off, err)
	}
	tc, err := decodeThunk(code[:got], sym.Value, sym.Size)
	if err != nil {
		return Thunk{}, err
	}
	r.load()
	t = Thunk{Slot: tc.slot, Guard: strings.Join(tc.guard, "; ")}
	if t.Impl, err = r.slotValue(tc.slot, tc.jmpAt); err != nil {
		return Thunk{}, err
	}
	if t.Impl >= sym.Value && t.Impl-sym.Value < max(sym.Size, 1) {
		return Thunk{}, fmt.Errorf("slot %#x points back into the thunk (%#x)", tc.slot, t.Impl)
	}
	if t.ImplOffset, ok = fileOffset(r.ef, t.Impl); !ok {
		return Thunk{}, fmt.Errorf("implementation %#x (slot %#x) is not in an executable segment of the file", t.Impl, tc.slot)
	}
	if r.fdeErr != nil {
		return Thunk{}, fmt.Errorf("cannot tell whether implementation %#x starts a function: %w", t.Impl, r.fdeErr)
	}
	if !IsFunctionStart(r.starts, t.Impl) {
		return Thunk{}, fmt.Errorf("implementation %#x (slot %#x) is not the start of a function in .eh_frame_hdr", t.Impl, tc.slot)
	}
	return t, nil
}

// load indexes the dynamic relocations and reads the function starts, once.
func (r *ThunkResolver) load() {
	if r.loaded {
		return
	}
	r.loaded = true
	r.relocs, r.relErr = readDynRelocs(r.ef)
	if sec := r.ef.Section(".eh_frame_hdr"); sec == nil {
		r.fdeErr = errors.New("no .eh_frame_hdr")
	} else if data, err := sec.Data(); err != nil {
		r.fdeErr = fmt.Errorf("read .eh_frame_hdr: %w", err)
	} else if r.starts, err = parseEhFrameHdr(data, sec.Addr); err != nil {
		r.fdeErr = fmt.Errorf(".eh_frame_hdr: %w", err)
	}
}

// maxDynRelocs bounds the relocation index (32 bytes an entry): libcuda 550
// has 35 555; a crafted .relr.dyn expands 63 entries per word.
const maxDynRelocs = 1 << 22

// readDynRelocs reads every allocated SHT_RELA section (.rela.dyn and
// .rela.plt: what the dynamic linker applies) and SHT_RELR section
// (.relr.dyn), sorted by the address each relocation writes.
func readDynRelocs(ef *elf.File) (out []dynReloc, err error) {
	defer func() {
		if err == nil && len(out) > maxDynRelocs {
			out, err = nil, fmt.Errorf("more than %d dynamic relocations", maxDynRelocs)
		}
	}()
	for _, sec := range ef.Sections {
		if len(out) > maxDynRelocs {
			break
		}
		if sec.Flags&elf.SHF_ALLOC == 0 || (sec.Type != elf.SHT_RELA && sec.Type != shtRELR) {
			continue
		}
		data, err := sec.Data()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", sec.Name, err)
		}
		if sec.Type == elf.SHT_RELA {
			if len(data)%24 != 0 {
				return nil, fmt.Errorf("%s: size %d is not a multiple of 24", sec.Name, len(data))
			}
			out = slicesGrow(out, len(data)/24)
			for i := 0; i+24 <= len(data); i += 24 {
				info := binary.LittleEndian.Uint64(data[i+8:])
				out = append(out, dynReloc{
					off:    binary.LittleEndian.Uint64(data[i:]),
					typ:    elf.R_X86_64(elf.R_TYPE64(info)),
					sym:    elf.R_SYM64(info),
					addend: int64(binary.LittleEndian.Uint64(data[i+16:])),
				})
			}
			continue
		}
		// RELR: an even word is an address to relocate; an odd word is a
		// bitmap of the 63 words after the last address (bit i+1: word i).
		if len(data)%8 != 0 {
			return nil, fmt.Errorf("%s: size %d is not a multiple of 8", sec.Name, len(data))
		}
		var where uint64
		for i := 0; i+8 <= len(data) && len(out) <= maxDynRelocs; i += 8 {
			w := binary.LittleEndian.Uint64(data[i:])
			if w&1 == 0 {
				out = append(out, dynReloc{off: w, typ: elf.R_X86_64_RELATIVE, implicit: true})
				where = w + 8
				continue
			}
			for b := 0; b < 63; b++ {
				if w>>(b+1)&1 != 0 {
					out = append(out, dynReloc{off: where + uint64(b)*8, typ: elf.R_X86_64_RELATIVE, implicit: true})
				}
			}
			where += 63 * 8
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].off < out[j].off })
	return out, nil
}

func slicesGrow(s []dynReloc, n int) []dynReloc {
	if cap(s)-len(s) >= n {
		return s
	}
	return append(make([]dynReloc, 0, len(s)+n), s...)
}

// slotValue proves the slot's initial value from the file: a data word with
// exactly one relocation that gives it an address inside this library.
func (r *ThunkResolver) slotValue(slot, jmpAt uint64) (uint64, error) {
	var seg *elf.Prog
	for _, p := range r.ef.Progs {
		if p.Type == elf.PT_LOAD && slot >= p.Vaddr && slot-p.Vaddr < p.Memsz && p.Memsz-(slot-p.Vaddr) >= 8 {
			seg = p
			break
		}
	}
	if seg == nil {
		return 0, fmt.Errorf("slot %#x (jump at +%#x) is in no loaded segment of the file", slot, jmpAt)
	}
	if seg.Flags&elf.PF_X != 0 {
		return 0, fmt.Errorf("slot %#x is in an executable segment: code, not a data word", slot)
	}
	for _, s := range r.ef.Sections {
		if s.Flags&elf.SHF_ALLOC != 0 && s.Flags&elf.SHF_EXECINSTR != 0 && slot >= s.Addr && slot-s.Addr < s.Size {
			return 0, fmt.Errorf("slot %#x is in executable section %s: code, not a data word", slot, s.Name)
		}
	}
	if r.relErr != nil {
		return 0, fmt.Errorf("slot %#x: %w", slot, r.relErr)
	}
	// Every relocation writing any of the slot's 8 bytes.
	lo, hi := slot-7, slot+7
	if slot < 7 {
		lo = 0
	}
	if hi < slot {
		hi = math.MaxUint64
	}
	i := sort.Search(len(r.relocs), func(i int) bool { return r.relocs[i].off >= lo })
	var at []dynReloc
	for ; i < len(r.relocs) && r.relocs[i].off <= hi; i++ {
		rel := r.relocs[i]
		if rel.off != slot {
			return 0, fmt.Errorf("relocation %v at %#x overlaps slot %#x", rel.typ, rel.off, slot)
		}
		at = append(at, rel)
	}
	switch {
	case len(at) == 0:
		return 0, fmt.Errorf("no dynamic relocation initialises slot %#x: its run-time value is not in the file", slot)
	case len(at) > 1:
		return 0, fmt.Errorf("%d dynamic relocations write slot %#x", len(at), slot)
	}
	rel := at[0]
	switch rel.typ {
	case elf.R_X86_64_RELATIVE:
		if !rel.implicit {
			return uint64(rel.addend), nil
		}
		// RELR: the addend is the word in the file.
		if slot-seg.Vaddr >= seg.Filesz || seg.Filesz-(slot-seg.Vaddr) < 8 {
			return 0, nil
		}
		var b [8]byte
		if _, err := r.f.ReadAt(b[:], int64(seg.Off+slot-seg.Vaddr)); err != nil {
			return 0, fmt.Errorf("read slot %#x: %w", slot, err)
		}
		return binary.LittleEndian.Uint64(b[:]), nil
	case elf.R_X86_64_64, elf.R_X86_64_GLOB_DAT, elf.R_X86_64_JMP_SLOT:
		s, err := r.dynSymbol(rel.sym)
		if err != nil {
			return 0, fmt.Errorf("slot %#x: %v: %w", slot, rel.typ, err)
		}
		switch {
		case s.Section == elf.SHN_UNDEF:
			return 0, fmt.Errorf("slot %#x points outside the library: %v to imported symbol %q", slot, rel.typ, s.Name)
		case s.Section >= elf.SHN_LORESERVE || elf.ST_TYPE(s.Info) != elf.STT_FUNC:
			return 0, fmt.Errorf("slot %#x: %v to %q, a %v symbol, not a function of the library", slot, rel.typ, s.Name, elf.ST_TYPE(s.Info))
		case r.preemptible(s):
			return 0, fmt.Errorf("slot %#x is bound by name to exported symbol %q (%v): a library loaded earlier can interpose it, so its value is not provably %#x",
				slot, s.Name, rel.typ, s.Value)
		}
		if rel.typ == elf.R_X86_64_64 {
			return s.Value + uint64(rel.addend), nil
		}
		return s.Value, nil
	case elf.R_X86_64_IRELATIVE:
		return 0, fmt.Errorf("slot %#x is set at load time by the IFUNC resolver at %#x (R_X86_64_IRELATIVE)", slot, uint64(rel.addend))
	}
	return 0, fmt.Errorf("slot %#x is written by a %v relocation, which does not give a code address in the file", slot, rel.typ)
}

// dynSymbol returns .dynsym entry i (relocation symbol index).
func (r *ThunkResolver) dynSymbol(i uint32) (elf.Symbol, error) {
	if !r.symLoad {
		r.symLoad = true
		r.dynsyms, r.dynErr = r.ef.DynamicSymbols()
	}
	if r.dynErr != nil {
		return elf.Symbol{}, fmt.Errorf("read .dynsym: %w", r.dynErr)
	}
	// debug/elf leaves out entry 0, the null symbol.
	if i == 0 || uint64(i) > uint64(len(r.dynsyms)) {
		return elf.Symbol{}, fmt.Errorf("symbol index %d not in .dynsym (%d entries)", i, len(r.dynsyms)+1)
	}
	return r.dynsyms[i-1], nil
}

// preemptible reports whether the dynamic linker may bind s to another
// library's definition: a global or weak symbol of default visibility, in a
// library not linked -Bsymbolic.
func (r *ThunkResolver) preemptible(s elf.Symbol) bool {
	if elf.ST_BIND(s.Info) == elf.STB_LOCAL || elf.ST_VISIBILITY(s.Other) != elf.STV_DEFAULT {
		return false
	}
	if v, err := r.ef.DynValue(elf.DT_SYMBOLIC); err == nil && len(v) > 0 {
		return false
	}
	if v, err := r.ef.DynValue(elf.DT_FLAGS); err == nil && len(v) > 0 && v[0]&uint64(elf.DF_SYMBOLIC) != 0 {
		return false
	}
	return true
}
