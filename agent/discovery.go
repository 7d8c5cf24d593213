package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

// fileVerdict caches what an ELF file offered, so each mapped file is parsed
// once however many processes map it.
type fileVerdict struct {
	probed     bool   // exports at least one table symbol and is attached
	attachedAt uint64 // CLOCK_MONOTONIC ns when the probes went in
	// linkerOnly: its only probes are the dynamic linker's notification,
	// which asks for a rescan: one missed before the attach is covered by
	// the scan that attached it, so attaching late loses nothing.
	linkerOnly bool
	// runtime holds the CUDA runtime's entry points the file exports: it is
	// a runtime library, probed for a process only when that process's
	// driver failed to initialise (runtimeLayer).
	runtime map[string]probes.Symbol
	// fp names the file on overlayfs (overlay): other containers' mounts
	// of the same image layer share its probes (sameFile).
	fp      probes.Fingerprint
	overlay bool
	// untraced: the file moves data past every probe (probes.Untraced),
	// and the processes mapping it are named so (untraced.go).
	untraced   probes.Untraced
	isUntraced bool
}

// symbolNames are the table's symbols, looked up in every mapped ELF file.
func symbolNames() []string {
	names := make([]string, len(probes.Table))
	for i, p := range probes.Table {
		names[i] = p.Symbol
	}
	return names
}

// looksLikeCUDA says whether a file name promises CUDA symbols, so a file
// that has none (stripped) deserves a warning rather than silence.
func looksLikeCUDA(path string) bool {
	base := filepath.Base(path)
	return strings.HasPrefix(base, "libcudart.so") || strings.HasPrefix(base, "libcuda.so")
}

// openMapping opens the file of one mapping of pid while the process lives
// (probes.OpenMapped).
func (a *Agent) openMapping(pid int, m probes.Mapping) func() (*probes.MappedFile, error) {
	return func() (*probes.MappedFile, error) { return probes.OpenMapped(a.cfg.ProcRoot, pid, m) }
}

// inspectFile attaches the table's probes in one file if it exports any of
// the symbols, and returns what the file offered. name is the path as the
// process maps it (pid, 0 for a file named on the command line); open opens
// the file itself, which the agent then reads and attaches through, so
// that a process exiting meanwhile cannot take the file away
// (docs/design.md, "Attach and discovery"). A verdict that stands is
// cached; a library to probe that has no probes is retried — at the next
// sighting when its file could not be opened (the next process mapping it),
// else from the next rescan on — and reported (Unprobed) until it has them.
func (a *Agent) inspectFile(id probes.FileID, name string, pid int, open func() (*probes.MappedFile, error)) fileVerdict {
	now := time.Now()
	a.filesMu.Lock()
	st := a.files[id]
	if st != nil {
		st.seenGen, st.lastSeen = a.scanGen, now
		if st.unprobed && pid > 0 {
			st.pid = pid
		}
		if st.final || now.Before(st.retryAt) {
			v := st.v
			a.filesMu.Unlock()
			return v
		}
	}
	a.filesMu.Unlock()

	v, final, fail := a.tryFile(id, name, pid, open)

	a.filesMu.Lock()
	defer a.filesMu.Unlock()
	st = a.files[id]
	if st == nil {
		if fail == nil && !final {
			return v // could not even look, and nothing says it is a library to probe
		}
		st = &fileState{name: name, pid: pid}
		a.files[id] = st
	}
	st.v, st.final, st.seenGen, st.lastSeen = v, final, a.scanGen, now
	st.pinned = st.pinned || pid == 0
	if fail == nil {
		if st.unprobed && v.probed {
			a.log.Info("library probed after earlier failures", "path", st.name, "failures", st.failures, "since", st.since.Format(time.RFC3339))
		} else if st.unprobed {
			a.log.Info("library read after earlier failures: nothing in it to probe for every process", "path", st.name, "failures", st.failures)
		}
		st.unprobed, st.reason = false, ""
		return v
	}
	if !st.unprobed && pid > 0 { // a file named on the command line is mapped by no one yet
		st.unprobed, st.since, st.name = true, now, name
	}
	if pid > 0 {
		st.pid = pid
	}
	st.reason = fail.reason
	if fail.counted {
		st.failures++
		a.countAttachFailure(name)
	}
	st.retryAt = time.Time{}
	if !fail.retryNow {
		st.retryAt = now.Add(a.cfg.RescanInterval / 2)
	}
	a.limited.Log(fail.level, fail.cause+"\x00"+name, fail.msg, "path", name, "pid", pid, "err", fail.reason, "failures", st.failures)
	return v
}

// attachFailure says why a library to probe has no probes.
type attachFailure struct {
	cause    string // one log line per cause and library per interval
	msg      string
	level    slog.Level
	reason   string
	counted  bool // a failed try (lanewatch_attach_failures_total)
	retryNow bool // retry at the next sighting: the file could not be opened
}

// tryFile opens, reads and attaches one file. final says the verdict
// stands; fail, when not nil, says why a library to probe has no probes.
func (a *Agent) tryFile(id probes.FileID, name string, pid int, open func() (*probes.MappedFile, error)) (v fileVerdict, final bool, fail *attachFailure) {
	mf, err := open()
	if err != nil {
		if !looksLikeCUDA(name) {
			// Its process is gone, or the path names another file: the next
			// process mapping it shows whether it is a library to probe.
			a.log.Debug("mapped file not opened", "path", name, "pid", pid, "err", err)
			return v, false, nil
		}
		return v, false, &attachFailure{cause: "open", msg: "cannot open CUDA library (retried with the next process that maps it)",
			level: slog.LevelWarn, reason: err.Error(), counted: true, retryNow: true}
	}
	defer mf.Close()
	fp, onOverlay, err := mf.Fingerprint()
	if err != nil {
		a.log.Debug("overlay fingerprint", "path", name, "err", err)
	}
	v.fp, v.overlay = fp, onOverlay
	if onOverlay {
		a.filesMu.Lock()
		same, seen := a.sameFile[fp]
		a.filesMu.Unlock()
		if seen {
			a.log.Info("probed already: the same image layer's file as another container's", "path", name, "pid", pid)
			return same, true, nil
		}
	}
	if u, ok, err := probes.UntracedObject(mf.OpenPath(), name); err != nil {
		a.limited.Log(slog.LevelWarn, "untraced\x00"+name, "cannot tell whether a mapped object moves data past the probes", "path", name, "pid", pid, "err", err)
	} else {
		v.untraced, v.isUntraced = u, ok
	}
	syms, err := probes.LookupSymbols(mf.OpenPath(), a.symbols)
	switch {
	case err != nil && looksLikeCUDA(name):
		return v, false, &attachFailure{cause: "symbols", msg: "cannot probe CUDA library: its symbols could not be read",
			level: slog.LevelWarn, reason: err.Error(), counted: true}
	case err != nil:
		a.log.Debug("skip mapped file", "path", name, "err", err)
		return v, true, nil
	case len(syms) == 0 && looksLikeCUDA(name):
		return v, true, &attachFailure{cause: "stripped", msg: "CUDA library exports none of the probed symbols (stripped?)",
			level: slog.LevelWarn, reason: "exports none of the probed symbols (stripped?)", counted: true}
	case len(syms) == 0:
		return v, true, nil
	}
	v.runtime = runtimeRows(syms)
	if len(syms) == 0 {
		return v, true, nil // only runtime entry points: nothing to attach for every process
	}
	start := time.Now()
	af, err := a.probes.AttachFileAs(id, name, mf.OpenPath(), syms, a.attachPID())
	if err != nil {
		return v, false, &attachFailure{cause: "attach", msg: "attach failed (retried at the next rescan)", level: slog.LevelError,
			reason: err.Error(), counted: true}
	}
	v.probed, v.attachedAt, v.linkerOnly = true, event.Now(), linkerOnly(syms)
	if onOverlay {
		a.filesMu.Lock()
		a.sameFile[fp] = v
		a.filesMu.Unlock()
	}
	a.log.Info("attached", "path", name, "probes", len(af.Sites), "sites", siteSummary(af.Sites), "via", mf.Via,
		"took", time.Since(start).Round(time.Millisecond).String())
	for sym, site := range af.Sites {
		if site.NotResolved != "" {
			a.log.Warn("dispatch thunk probed at the thunk itself (single-stepped: slower)", "path", name, "symbol", sym, "why", site.NotResolved)
		}
	}
	return v, true, nil
}

// linkerOnly says whether every symbol of syms is the dynamic linker's.
func linkerOnly(syms map[string]probes.Symbol) bool {
	for _, row := range probes.Table {
		if _, ok := syms[row.Symbol]; ok && row.Layer != event.LayerLinker {
			return false
		}
	}
	return true
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
	if a.afterMaps != nil {
		a.afterMaps(pid, maps)
	}
	a.unsureBeforeAttach(pid)
	inspected := map[probes.FileID]bool{} // CUDA files, and whether each has probes (or needs none)
	var untraced []probes.Untraced
	fabric := "" // the libfabric it maps
	seen := map[probes.FileID]bool{}
	for _, m := range maps {
		if !m.Executable() || !m.FileBacked() {
			continue
		}
		id, err := m.FileID()
		if err != nil {
			a.limited.Log(slog.LevelWarn, "maps line", "bad maps line", "pid", pid, "err", err)
			continue
		}
		v := a.inspectFile(id, m.Path, pid, a.openMapping(pid, m))
		if v.probed {
			probed = true
			if !v.linkerOnly {
				lastAttach = max(lastAttach, v.attachedAt)
			}
		}
		if v.isUntraced && !seen[id] {
			u := v.untraced
			u.Path = m.Path
			untraced = append(untraced, u)
		}
		seen[id] = true
		if strings.HasPrefix(filepath.Base(m.Path), "libfabric.so") {
			fabric = m.Path
		}
		if looksLikeCUDA(m.Path) {
			a.filesMu.Lock()
			st := a.files[id]
			inspected[id] = st != nil && !st.unprobed
			a.filesMu.Unlock()
		}
	}
	if fabric != "" && a.fabricBlind(pid) {
		untraced = append(untraced, probes.Untraced{Kind: probes.UntracedFabricBeforeAttach, Path: fabric,
			Sign: "running before the agent attached"})
	}
	a.noteUntraced(pid, untraced)
	// Only now, every file of the process inspected: a thread held at its
	// loader notification goes on (probes.MarkKnown), whatever came of it;
	// a file without probes is marked so, and a process going on with it
	// is not proven traced (lateAttach).
	for id, ok := range inspected {
		if err := a.probes.MarkKnown(id, ok); err != nil {
			a.limited.Log(slog.LevelWarn, "hold map", "cannot release a process held at its loader notification (it goes on at the hold's bound)", "pid", pid, "err", err)
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
	if a.cfg.OnProvider != nil {
		defer a.cfg.OnProvider(uint32(req.pid))
	}
	fns, err := probes.ResolveProviderOps(a.cfg.ProcRoot, req.pid, req.ctx)
	if err != nil {
		a.limited.Log(slog.LevelWarn, "provider\x00"+strconv.Itoa(req.pid), "RDMA provider not probed", "pid", req.pid, "err", err)
		return
	}
	byFile, paths := groupByFile(fns)
	for id, syms := range byFile {
		f := paths[id]
		before := map[string]bool{} // Sites is shared with the attacher: copy the names
		for row := range a.probes.Files()[id].Sites {
			before[row] = true
		}
		af, err := a.probes.AttachFileAs(id, f.Path, f.OpenPath, syms, a.attachPID())
		if err != nil {
			// Counted, and tried again at the next queue pair or
			// completion queue of this context.
			delete(a.contexts, req)
			a.filesMu.Lock()
			a.countAttachFailure(f.Path)
			a.filesMu.Unlock()
			a.limited.Log(slog.LevelError, "provider\x00"+f.Path, "attach RDMA provider (retried at the context's next queue pair or completion queue)",
				"pid", req.pid, "path", f.Path, "err", err)
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
	a.stubs.keep(req.pid, maps) // its launches' host stubs are named from these (kernels.go)
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
		v := a.inspectFile(id, m.Path, req.pid, a.openMapping(req.pid, m))
		if len(v.runtime) == 0 {
			continue
		}
		pp, err := a.attachRuntimeFile(req.pid, m, v.runtime)
		if err != nil {
			a.filesMu.Lock()
			a.countAttachFailure(m.Path)
			a.filesMu.Unlock()
			a.log.Error("attach the CUDA runtime for one process", "pid", req.pid, "path", m.Path, "err", err)
			continue
		}
		a.pidProbes[req.pid] = append(a.pidProbes[req.pid], pp)
		name, _ := event.DriverErrorName(uint64(req.code))
		a.log.Info("CUDA driver failed to initialise: the process's runtime calls are traced at the runtime layer, to report their errors",
			"pid", req.pid, "cuInit", name, "code", req.code, "path", m.Path, "probes", len(pp.Sites))
	}
}

// attachRuntimeFile attaches the runtime rows of one mapped file for one
// process, through the file held open.
func (a *Agent) attachRuntimeFile(pid int, m probes.Mapping, rows map[string]probes.Symbol) (*probes.PIDProbes, error) {
	mf, err := probes.OpenMapped(a.cfg.ProcRoot, pid, m)
	if err != nil {
		return nil, err
	}
	defer mf.Close()
	return a.probes.AttachPID(mf.OpenPath(), rows, pid)
}

// detachRuntime removes the runtime probes of a process that exited.
func (a *Agent) detachRuntime(pid int) {
	pps, ok := a.pidProbes[pid]
	if !ok {
		return
	}
	a.stubs.forget(pid)
	delete(a.pidProbes, pid)
	for _, pp := range pps {
		if err := pp.Close(); err != nil {
			a.log.Warn("detach the runtime probes of an exited process", "pid", pid, "err", err)
		}
	}
}

// groupByFile groups functions resolved at run time (an RDMA provider's,
// libfabric's) by the file they are in: each file's rows at their
// offsets, and one function of each file (its path, its id).
func groupByFile(fns []probes.ProviderFunc) (map[probes.FileID]map[string]probes.Symbol, map[probes.FileID]probes.ProviderFunc) {
	byFile := map[probes.FileID]map[string]probes.Symbol{}
	paths := map[probes.FileID]probes.ProviderFunc{}
	for _, f := range fns {
		if byFile[f.File] == nil {
			byFile[f.File] = map[string]probes.Symbol{}
		}
		byFile[f.File][f.Row] = probes.Symbol{Name: f.Row, Offset: f.FileOffset}
		paths[f.File] = f
	}
	return byFile, paths
}
