package probes

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// ErrNoSymbolTable means an ELF file has neither .dynsym nor .symtab, so no
// function in it can be found by name.
var ErrNoSymbolTable = errors.New("no symbol table (stripped)")

// Symbol is a function found in an ELF file.
type Symbol struct {
	Name   string
	Value  uint64 // st_value: the virtual address in the file's own layout
	Size   uint64
	Offset uint64 // file offset of Value, through the PT_LOAD segment holding it: what a uprobe attaches at
}

// LookupSymbols finds the named functions in the ELF file at path. It
// searches .dynsym first (exported functions survive strip, so a system or
// wheel-bundled library still has them), then .symtab for names still
// missing (statically linked binaries, hidden functions). Only defined
// STT_FUNC symbols count: an STT_GNU_IFUNC symbol is a resolver that runs
// once at bind time, not the function callers reach. Names not found are
// absent from the result. A file with neither table gives ErrNoSymbolTable.
// Only the headers and symbol tables are read, never the whole file.
func LookupSymbols(path string, names []string) (syms map[string]Symbol, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err // *fs.PathError names the path
	}
	defer f.Close()
	// debug/elf trusts some header fields and has panicked on crafted files;
	// the agent reads whatever a process maps, so a panic becomes an error.
	defer func() {
		if r := recover(); r != nil {
			syms, err = nil, fmt.Errorf("%s: malformed ELF: %v", path, r)
		}
	}()
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, fmt.Errorf("%s: not a readable ELF file: %w", path, err)
	}
	if ef.Class != elf.ELFCLASS64 || ef.Machine != HostMachine() {
		return nil, fmt.Errorf("%s: ELF %v %v, want ELFCLASS64 %v", path, ef.Class, ef.Machine, HostMachine())
	}

	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	syms = make(map[string]Symbol, len(names))

	dyn, err := ef.DynamicSymbols()
	hasDyn := err == nil
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, fmt.Errorf("%s: read .dynsym: %w", path, err)
	}
	pickSymbols(ef, dyn, want, syms)
	if hasDyn && len(want) == 0 {
		return syms, nil // .symtab can be large; skip it when done
	}

	tab, err := ef.Symbols()
	hasTab := err == nil
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, fmt.Errorf("%s: read .symtab: %w", path, err)
	}
	if !hasDyn && !hasTab {
		return nil, fmt.Errorf("%s: %w", path, ErrNoSymbolTable)
	}
	pickSymbols(ef, tab, want, syms)
	return syms, nil
}

// pickSymbols moves the wanted names that one table defines from want to
// found (or drops them, see below). A name may appear more than once in a table: the default
// symbol version beats a hidden (compatibility) one and a global or weak
// binding beats a local one, because that is the symbol new callers bind to.
// If that symbol is not a plain function (libc's memcpy@@GLIBC_2.14 is an
// IFUNC; a compatibility memcpy@GLIBC_2.2.5 FUNC also exists) the name is
// absent rather than resolved to a function few callers reach. Local
// functions sharing a name at different addresses are ambiguous and left out
// rather than guessed.
func pickSymbols(ef *elf.File, table []elf.Symbol, want map[string]bool, found map[string]Symbol) {
	type candidate struct {
		sym       elf.Symbol
		rank      int
		ambiguous bool
	}
	best := map[string]*candidate{}
	for _, s := range table {
		if !want[s.Name] || s.Section == elf.SHN_UNDEF {
			continue
		}
		rank := 0
		if b := elf.ST_BIND(s.Info); b == elf.STB_GLOBAL || b == elf.STB_WEAK {
			rank += 2
		}
		if !s.HasVersion || !s.VersionIndex.IsHidden() {
			rank++
		}
		c := best[s.Name]
		switch {
		case c == nil || rank > c.rank:
			best[s.Name] = &candidate{sym: s, rank: rank}
		case rank == c.rank && (s.Value != c.sym.Value || s.Info != c.sym.Info):
			c.ambiguous = true
		}
	}
	for name, c := range best {
		delete(want, name) // decided here: a later table must not overrule it
		s := c.sym
		if c.ambiguous || elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Section >= elf.SHN_LORESERVE {
			continue
		}
		off, ok := fileOffset(ef, s.Value)
		if !ok {
			continue // not in the file's code: nothing a uprobe could attach to
		}
		found[name] = Symbol{Name: name, Value: s.Value, Size: s.Size, Offset: off}
	}
}

// fileOffset converts a virtual address to a file offset through the
// executable PT_LOAD segment whose file-backed part holds it.
func fileOffset(ef *elf.File, vaddr uint64) (uint64, bool) {
	for _, p := range ef.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 {
			continue
		}
		if vaddr >= p.Vaddr && vaddr-p.Vaddr < p.Filesz {
			return vaddr - p.Vaddr + p.Off, true
		}
	}
	return 0, false
}

// ReadCode returns n bytes of the file at path from offset off, for decoding
// a function's first instructions. It returns fewer bytes only when the file
// ends first, and an error when none are left.
func ReadCode(path string, off uint64, n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("read code %s: length %d", path, n)
	}
	if off > math.MaxInt64 {
		return nil, fmt.Errorf("read code %s: offset %#x out of range", path, off)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read code: %w", err)
	}
	defer f.Close()
	buf := make([]byte, n)
	got, err := f.ReadAt(buf, int64(off))
	if err != nil && !(errors.Is(err, io.EOF) && got > 0) {
		return nil, fmt.Errorf("read code %s at %#x: %w", path, off, err)
	}
	return buf[:got], nil
}
