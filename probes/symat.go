package probes

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
)

// FunctionAt names the function whose code holds file offset off in the
// ELF file at path: a defined STT_FUNC symbol of .dynsym or .symtab whose
// [start, start+size) holds it, its file offset taken through the PT_LOAD
// segment holding it as LookupSymbols does. The runtime layer's launches
// name a kernel by its host stub this way (docs/design.md, "Kernel movers"):
// nvcc gives a kernel's host stub the kernel's own mangled name. When two
// symbols hold it (aliases), a global or weak one wins over a local one,
// then the lower start; "" with a nil error when none does (a stripped
// library).
func FunctionAt(path string, off uint64) (name string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	defer func() {
		if r := recover(); r != nil {
			name, err = "", fmt.Errorf("%s: malformed ELF: %v", path, r)
		}
	}()
	ef, err := elf.NewFile(f)
	if err != nil {
		return "", fmt.Errorf("%s: not a readable ELF file: %w", path, err)
	}
	var best elf.Symbol
	bestRank, found := -1, false
	for _, read := range []func() ([]elf.Symbol, error){ef.DynamicSymbols, ef.Symbols} {
		syms, err := read()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return "", fmt.Errorf("%s: read symbols: %w", path, err)
		}
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Section == elf.SHN_UNDEF || s.Section >= elf.SHN_LORESERVE || s.Name == "" {
				continue
			}
			start, ok := fileOffset(ef, s.Value)
			if !ok || off < start || off-start >= max(s.Size, 1) {
				continue
			}
			rank := 0
			if b := elf.ST_BIND(s.Info); b == elf.STB_GLOBAL || b == elf.STB_WEAK {
				rank = 1
			}
			if !found || rank > bestRank || rank == bestRank && s.Value < best.Value {
				best, bestRank, found = s, rank, true
			}
		}
	}
	if !found {
		return "", nil
	}
	return best.Name, nil
}
