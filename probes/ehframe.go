package probes

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// FunctionStarts reads the start address (virtual address, as in the ELF
// file) of every function that has unwind information: the sorted lookup
// table of .eh_frame_hdr. Stripped libraries — every rdma-core provider on
// Debian — keep it, because C++ exceptions and backtraces need it, so it
// says whether an address taken from a function pointer really begins a
// function even when no symbol names it.
func FunctionStarts(path string) (starts []uint64, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	defer func() {
		if r := recover(); r != nil { // debug/elf on a hostile file
			starts, err = nil, fmt.Errorf("%s: malformed ELF: %v", path, r)
		}
	}()
	sec := f.Section(".eh_frame_hdr")
	if sec == nil {
		return nil, fmt.Errorf("%s: no .eh_frame_hdr: cannot tell where its functions start", path)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("%s: read .eh_frame_hdr: %w", path, err)
	}
	starts, err = parseEhFrameHdr(data, sec.Addr)
	if err != nil {
		return nil, fmt.Errorf("%s: .eh_frame_hdr: %w", path, err)
	}
	return starts, nil
}

// DWARF exception-header pointer encodings used by the binary search table.
const (
	dwEhPeUdata4  = 0x03
	dwEhPeSdata4  = 0x0b
	dwEhPePcrel   = 0x10
	dwEhPeDatarel = 0x30
	dwEhPeOmit    = 0xff
)

// parseEhFrameHdr decodes the header (version 1, eh_frame_ptr, fde_count,
// then fde_count (initial_location, fde) pairs). Only the table encoding
// every toolchain emits, datarel|sdata4 (0x3b), is accepted: the table is
// then sorted and relative to the section's start.
func parseEhFrameHdr(b []byte, addr uint64) ([]uint64, error) {
	if len(b) < 4 || b[0] != 1 {
		return nil, errors.New("not a version 1 header")
	}
	ptrEnc, countEnc, tableEnc := b[1], b[2], b[3]
	if tableEnc != dwEhPeDatarel|dwEhPeSdata4 {
		return nil, fmt.Errorf("table encoding %#x not supported (want 0x3b)", tableEnc)
	}
	off := 4
	// eh_frame_ptr: skip it, whatever its 4-byte encoding.
	if ptrEnc&0x0f != dwEhPeSdata4 && ptrEnc&0x0f != dwEhPeUdata4 {
		return nil, fmt.Errorf("eh_frame_ptr encoding %#x not supported", ptrEnc)
	}
	off += 4
	if countEnc&0x0f != dwEhPeUdata4 || countEnc == dwEhPeOmit {
		return nil, fmt.Errorf("fde_count encoding %#x not supported", countEnc)
	}
	if len(b) < off+4 {
		return nil, errors.New("truncated")
	}
	count := int(binary.LittleEndian.Uint32(b[off:]))
	off += 4
	if count < 0 || (len(b)-off)/8 < count {
		return nil, fmt.Errorf("%d entries do not fit in %d bytes", count, len(b)-off)
	}
	starts := make([]uint64, count)
	for i := range starts {
		rel := int32(binary.LittleEndian.Uint32(b[off+8*i:]))
		starts[i] = uint64(int64(addr) + int64(rel))
	}
	if !sort.SliceIsSorted(starts, func(i, j int) bool { return starts[i] < starts[j] }) {
		return nil, errors.New("table is not sorted")
	}
	return starts, nil
}

// IsFunctionStart reports whether vaddr begins a function of the file.
func IsFunctionStart(starts []uint64, vaddr uint64) bool {
	i := sort.Search(len(starts), func(i int) bool { return starts[i] >= vaddr })
	return i < len(starts) && starts[i] == vaddr
}
