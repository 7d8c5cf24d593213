package agent

import (
	"path/filepath"
	"strings"

	"github.com/lanewatch/lanewatch/probes"
)

// callerRanges decides whether a driver call's return address lies in a
// CUDA runtime library when the probe could not (docs/design.md, "One pair
// per call"): bpf_find_vma only try-locks the process's mmap lock, so a
// thread mapping or unmapping memory at that moment leaves the call
// unresolved. The agent then reads the process's maps, once per miss, and
// keeps its file-backed code ranges until the process exits. Used only on
// the reading goroutine.
type callerRanges struct {
	procRoot string
	byPID    map[uint32][]codeRange
}

type codeRange struct {
	start, end uint64
	runtime    bool // the file's name starts with libcudart, as the probe's test
}

func newCallerRanges(procRoot string) *callerRanges {
	return &callerRanges{procRoot: procRoot, byPID: map[uint32][]codeRange{}}
}

// viaRuntime reports whether addr, in process pid, is code of a CUDA
// runtime library.
func (c *callerRanges) viaRuntime(pid uint32, addr uint64) (bool, error) {
	if r, ok := findRange(c.byPID[pid], addr); ok {
		return r.runtime, nil
	}
	maps, err := probes.ReadMaps(c.procRoot, int(pid))
	if err != nil {
		return false, err
	}
	var rs []codeRange
	for _, m := range maps {
		if m.Executable() && m.FileBacked() {
			rs = append(rs, codeRange{m.Start, m.End, strings.HasPrefix(filepath.Base(m.Path), "libcudart")})
		}
	}
	c.byPID[pid] = rs
	r, ok := findRange(rs, addr)
	return ok && r.runtime, nil
}

// forget drops an exited process's ranges.
func (c *callerRanges) forget(pid uint32) { delete(c.byPID, pid) }

func findRange(rs []codeRange, addr uint64) (codeRange, bool) {
	for _, r := range rs {
		if addr >= r.start && addr < r.end {
			return r, true
		}
	}
	return codeRange{}, false
}
