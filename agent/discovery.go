package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

// fileVerdict caches what an ELF file offered, so each mapped file is parsed
// once however many processes map it.
type fileVerdict struct {
	probed     bool   // exports at least one table symbol and is attached
	attachedAt uint64 // CLOCK_MONOTONIC ns when the probes went in
	// runtime holds the CUDA runtime's entry points the file exports: it is
	// a runtime library, probed for a process only when that process's
	// driver failed to initialise (runtimeLayer).
	runtime map[string]probes.Symbol
}

// symbolNames are the table's symbols, looked up in every mapped ELF file.
func symbolNames() []string {
	names := make([]string, len(probes.Table))
	for i, p := range probes.Table {
		names[i] = p.Symbol
	}
	return names
}

// fileIDOfPath stats a file the same way the kernel names it in maps.
func fileIDOfPath(path string) (probes.FileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return probes.FileID{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return probes.FileID{Dev: uint64(unix.Major(st.Dev))<<32 | uint64(unix.Minor(st.Dev)), Inode: st.Ino}, nil
}

// looksLikeCUDA says whether a file name promises CUDA symbols, so a file
// that has none (stripped) deserves a warning rather than silence.
func looksLikeCUDA(path string) bool {
	base := filepath.Base(path)
	return strings.HasPrefix(base, "libcudart.so") || strings.HasPrefix(base, "libcuda.so")
}

// inspectFile attaches the table's probes in one file if it exports any of
// the symbols. pathInNS is the path as the process sees it (for messages),
// openPath the path the agent can open (through /proc/PID/root).
func (a *Agent) inspectFile(id probes.FileID, pathInNS, openPath string) fileVerdict {
	a.filesMu.Lock()
	v, seen := a.files[id]
	a.filesMu.Unlock()
	if seen {
		return v
	}
	v = fileVerdict{}
	syms, err := probes.LookupSymbols(openPath, a.symbols)
	switch {
	case err != nil && looksLikeCUDA(pathInNS):
		a.log.Warn("cannot probe CUDA library", "path", pathInNS, "err", err)
	case err != nil:
		a.log.Debug("skip mapped file", "path", pathInNS, "err", err)
	case len(syms) == 0 && looksLikeCUDA(pathInNS):
		a.log.Warn("CUDA library exports none of the probed symbols (stripped?)", "path", pathInNS)
	case len(syms) > 0:
		v.runtime = runtimeRows(syms)
		if len(syms) == 0 {
			break // only runtime entry points: nothing to attach for every process
		}
		af, err := a.probes.AttachFile(id, openPath, syms, a.attachPID())
		if err != nil {
			a.attachErr.Add(1)
			a.log.Error("attach failed", "path", pathInNS, "err", err)
			break
		}
		v.probed, v.attachedAt = true, probes.Now()
		a.log.Info("attached", "path", pathInNS, "probes", len(af.Sites), "sites", siteSummary(af.Sites))
		for sym, site := range af.Sites {
			if site.NotResolved != "" {
				a.log.Warn("dispatch thunk probed at the thunk itself (single-stepped: slower)", "path", pathInNS, "symbol", sym, "why", site.NotResolved)
			}
		}
	}
	a.filesMu.Lock()
	a.files[id] = v
	a.filesMu.Unlock()
	return v
}

// runtimeRows moves the CUDA runtime's rows out of syms: the driver rows
// see every copy with its result (docs/design.md, "One pair per call").
func runtimeRows(syms map[string]probes.Symbol) map[string]probes.Symbol {
	var rt map[string]probes.Symbol
	for _, row := range probes.Table {
		if sym, ok := syms[row.Symbol]; ok && row.Layer == event.LayerRuntime {
			if rt == nil {
				rt = map[string]probes.Symbol{}
			}
			rt[row.Symbol] = sym
			delete(syms, row.Symbol)
		}
	}
	return rt
}

// siteSummary counts probe sites by cost, e.g. "emulated=40 single-step=1
// through-thunk=38".
func siteSummary(sites map[string]probes.Site) string {
	counts := map[string]int{}
	for _, s := range sites {
		counts[s.Cost.String()]++
		if s.Thunk != nil {
			counts["through-thunk"]++
		}
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, counts[k]))
	}
	return strings.Join(parts, " ")
}

// attachPID is the pid uprobes are limited to: one explicit target, or all (0).
func (a *Agent) attachPID() int {
	if len(a.cfg.PIDs) == 1 {
		return a.cfg.PIDs[0]
	}
	return 0
}

// scanProcess attaches every probed file the process maps. It reports
// whether the process maps any probed file, the latest time one of them was
// attached, and the process's mappings as they were after the attach (the
// observation snapshot).
func (a *Agent) scanProcess(pid int) (probed bool, lastAttach uint64, snapshot []correlate.Range, err error) {
	maps, err := probes.ReadMaps(a.cfg.ProcRoot, pid)
	if err != nil {
		return false, 0, nil, err
	}
	for _, m := range maps {
		if !m.Executable() || !m.FileBacked() {
			continue
		}
		id, err := m.FileID()
		if err != nil {
			a.log.Warn("bad maps line", "pid", pid, "err", err)
			continue
		}
		open := filepath.Join(a.cfg.ProcRoot, strconv.Itoa(pid), "root", m.Path)
		if v := a.inspectFile(id, m.Path, open); v.probed {
			probed = true
			lastAttach = max(lastAttach, v.attachedAt)
		}
	}
	if !probed {
		return false, 0, nil, nil
	}
	// Re-read after attaching: anything mapped later was mapped while probed.
	maps, err = probes.ReadMaps(a.cfg.ProcRoot, pid)
	if err != nil {
		return true, lastAttach, nil, err
	}
	snapshot = make([]correlate.Range, 0, len(maps))
	for _, m := range maps {
		snapshot = append(snapshot, correlate.Range{Start: m.Start, End: m.End})
	}
	return true, lastAttach, snapshot, nil
}

// CUDAProcesses lists the processes that map a file named like the CUDA
// runtime or driver.
func CUDAProcesses(procRoot string) []int {
	pids, _ := listPIDs(procRoot)
	var out []int
	for _, pid := range pids {
		maps, err := probes.ReadMaps(procRoot, pid)
		if err != nil {
			continue
		}
		for _, m := range maps {
			if m.FileBacked() && looksLikeCUDA(m.Path) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// listPIDs returns every numeric entry of the proc root.
func listPIDs(procRoot string) ([]int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", procRoot, err)
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// describeScanError turns a scan failure into a message an operator can act on.
func describeScanError(pid int, err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("pid %d: no such process", pid)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Sprintf("pid %d: cannot read its memory maps (permission denied: run as root)", pid)
	}
	return fmt.Sprintf("pid %d: %v", pid, err)
}

// providerReq asks for the RDMA provider behind one verbs context.
type providerReq struct {
	pid int
	ctx uint64
}

// attachProvider resolves post_send, post_recv and poll_cq from a context's
// ops table and probes them at their file offsets. Providers hide these
// functions (docs/design.md, "RDMA providers"), so this is the only way to see the data path.
// Every context of a process shares its provider's table: one resolution
// per (file) suffices, but resolving again is cheap and harmless.
func (a *Agent) attachProvider(req providerReq) {
	if a.contexts[req] {
		return // a QP or CQ of a context already resolved
	}
	if len(a.contexts) >= 4096 {
		a.contexts = map[providerReq]bool{} // bounded; resolving again is harmless
	}
	a.contexts[req] = true
	fns, err := probes.ResolveProviderOps(a.cfg.ProcRoot, req.pid, req.ctx)
	if err != nil {
		a.log.Warn("RDMA provider not probed", "err", err)
		return
	}
	byFile := map[probes.FileID]map[string]probes.Symbol{}
	paths := map[probes.FileID]probes.ProviderFunc{}
	for _, f := range fns {
		if byFile[f.File] == nil {
			byFile[f.File] = map[string]probes.Symbol{}
		}
		byFile[f.File][f.Row] = probes.Symbol{Name: f.Row, Offset: f.FileOffset}
		paths[f.File] = f
	}
	for id, syms := range byFile {
		f := paths[id]
		before := map[string]bool{} // Sites is shared with the attacher: copy the names
		for row := range a.probes.Files()[id].Sites {
			before[row] = true
		}
		af, err := a.probes.AttachFile(id, f.OpenPath, syms, a.attachPID())
		if err != nil {
			a.log.Error("attach RDMA provider", "path", f.Path, "err", err)
			continue
		}
		for row := range syms {
			if before[row] {
				continue
			}
			a.log.Info("attached RDMA provider function", "pid", req.pid, "path", f.Path, "function", row,
				"offset", fmt.Sprintf("%#x", syms[row].Offset), "site", af.Sites[row].String())
		}
	}
}

// runtimeLayerReq asks for a process's runtime calls to be probed: its
// driver failed to initialise with code.
type runtimeLayerReq struct {
	pid  int
	code uint32
}

// attachRuntime probes the CUDA runtime libraries a process maps, for that
// process only. Its driver failed to initialise, so every runtime call it
// makes fails in the runtime, before reaching the driver, and only a
// runtime probe can report it (with its cudaError_t).
func (a *Agent) attachRuntime(req runtimeLayerReq) {
	if _, done := a.pidProbes[req.pid]; done {
		return
	}
	a.pidProbes[req.pid] = nil // tried, whatever happens
	if a.cfg.OnRuntimeLayer != nil {
		defer func() {
			n := 0
			for _, pp := range a.pidProbes[req.pid] {
				n += len(pp.Sites)
			}
			a.cfg.OnRuntimeLayer(uint32(req.pid), n)
		}()
	}
	maps, err := probes.ReadMaps(a.cfg.ProcRoot, req.pid)
	if err != nil {
		a.log.Debug(describeScanError(req.pid, err))
		return
	}
	seen := map[probes.FileID]bool{}
	for _, m := range maps {
		if !m.Executable() || !m.FileBacked() {
			continue
		}
		id, err := m.FileID()
		if err != nil || seen[id] {
			continue
		}
		seen[id] = true
		open := filepath.Join(a.cfg.ProcRoot, strconv.Itoa(req.pid), "root", m.Path)
		v := a.inspectFile(id, m.Path, open)
		if len(v.runtime) == 0 {
			continue
		}
		pp, err := a.probes.AttachPID(open, v.runtime, req.pid)
		if err != nil {
			a.attachErr.Add(1)
			a.log.Error("attach the CUDA runtime for one process", "pid", req.pid, "path", m.Path, "err", err)
			continue
		}
		a.pidProbes[req.pid] = append(a.pidProbes[req.pid], pp)
		name, _ := event.DriverErrorName(uint64(req.code))
		a.log.Info("CUDA driver failed to initialise: the process's runtime calls are traced at the runtime layer, to report their errors",
			"pid", req.pid, "cuInit", name, "code", req.code, "path", m.Path, "probes", len(pp.Sites))
	}
}

// detachRuntime removes the runtime probes of a process that exited.
func (a *Agent) detachRuntime(pid int) {
	pps, ok := a.pidProbes[pid]
	if !ok {
		return
	}
	delete(a.pidProbes, pid)
	for _, pp := range pps {
		if err := pp.Close(); err != nil {
			a.log.Warn("detach the runtime probes of an exited process", "pid", pid, "err", err)
		}
	}
}
