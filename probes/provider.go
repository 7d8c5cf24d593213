package probes

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// Offsets from the start of struct ibv_context (verbs.h: a device pointer,
// then struct ibv_context_ops) to the data-path function pointers. A test
// compiles offsetof() against the system header to keep them honest.
const (
	ctxOpsPollCQ   = 8 + 11*8
	ctxOpsPostSend = 8 + 25*8
	ctxOpsPostRecv = 8 + 26*8
)

// ProviderFunc is one provider function resolved from a process's ops
// table, ready to attach by file offset.
type ProviderFunc struct {
	Row        string // table row: "provider:post_send"
	Addr       uint64 // address in the process
	Path       string // the mapped file, as the process sees it
	OpenPath   string // the same file through /proc/PID/root
	FileOffset uint64
	File       FileID
}

// ResolveProviderOps reads post_send, post_recv and poll_cq out of the
// struct ibv_context at ctx in process pid and locates each in a mapped
// file. Providers do not export these functions, and the kernel does not
// validate a raw attach offset (a wrong one attaches silently, corrupting
// the process's code path if it lands mid-instruction), so each address
// must be executable, file-backed and the start of a function according to
// the file's unwind table; anything else is an error naming the pointer.
func ResolveProviderOps(procRoot string, pid int, ctx uint64) ([]ProviderFunc, error) {
	mem, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "mem"))
	if err != nil {
		return nil, fmt.Errorf("pid %d: %w", pid, err)
	}
	defer mem.Close()
	maps, err := ReadMaps(procRoot, pid)
	if err != nil {
		return nil, err
	}
	var out []ProviderFunc
	for _, op := range []struct {
		row string
		off uint64
	}{{"post_send", ctxOpsPostSend}, {"post_recv", ctxOpsPostRecv}, {"poll_cq", ctxOpsPollCQ}} {
		var b [8]byte
		if _, err := mem.ReadAt(b[:], int64(ctx+op.off)); err != nil {
			return nil, fmt.Errorf("pid %d: read ops.%s of context %#x: %w", pid, op.row, ctx, err)
		}
		addr := binary.LittleEndian.Uint64(b[:])
		f, err := locateFunction(procRoot, pid, maps, addr)
		if err != nil {
			return nil, fmt.Errorf("pid %d: context %#x ops.%s = %#x: %w; not attached", pid, ctx, op.row, addr, err)
		}
		f.Row = ProviderPrefix + op.row
		out = append(out, f)
	}
	return out, nil
}

// locateFunction finds the mapped file and offset of a code address and
// checks that a function starts there.
func locateFunction(procRoot string, pid int, maps []Mapping, addr uint64) (ProviderFunc, error) {
	var m *Mapping
	for i := range maps {
		if addr >= maps[i].Start && addr < maps[i].End {
			m = &maps[i]
			break
		}
	}
	switch {
	case m == nil:
		return ProviderFunc{}, fmt.Errorf("not in any mapping")
	case !m.Executable():
		return ProviderFunc{}, fmt.Errorf("in a non-executable mapping (%s %s)", m.Perms, m.Path)
	case !m.FileBacked():
		return ProviderFunc{}, fmt.Errorf("in anonymous executable memory (JIT?), not a library")
	}
	fileOff := addr - m.Start + m.Offset
	open := filepath.Join(procRoot, strconv.Itoa(pid), "root", m.Path)
	vaddr, err := fileOffsetToVaddr(open, fileOff)
	if err != nil {
		return ProviderFunc{}, err
	}
	starts, err := FunctionStarts(open)
	if err != nil {
		return ProviderFunc{}, err
	}
	if !IsFunctionStart(starts, vaddr) {
		return ProviderFunc{}, fmt.Errorf("not the start of a function in %s (file offset %#x)", m.Path, fileOff)
	}
	id, err := m.FileID()
	if err != nil {
		return ProviderFunc{}, err
	}
	return ProviderFunc{Addr: addr, Path: m.Path, OpenPath: open, FileOffset: fileOff, File: id}, nil
}

// fileOffsetToVaddr maps a file offset to the ELF virtual address of the
// executable segment holding it.
func fileOffsetToVaddr(path string, off uint64) (uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && off >= p.Off && off < p.Off+p.Filesz {
			return off - p.Off + p.Vaddr, nil
		}
	}
	return 0, fmt.Errorf("%s: offset %#x is in no executable segment", path, off)
}
