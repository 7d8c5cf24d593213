package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"syscall"
	"time"

	"github.com/lanewatch/lanewatch/probes"
)

// defaultReleaseAfter is how long a probed library must have been mapped
// by no process before its probes are detached (Config.ReleaseAfter): a
// library a short-lived process maps every few seconds keeps its probes.
const defaultReleaseAfter = 30 * time.Second

// maxReleasesPerScan bounds the libraries detached per full scan (each
// ≈ 85 ms here, 8 links side by side), so discovery is never held long;
// the rest go at the next scans.
const maxReleasesPerScan = 16

// releaseUnmapped detaches the probes of the libraries that the full scan
// gen did not find mapped and no scan saw mapped for ReleaseAfter
// (docs/design.md, "Attach and discovery"). Each is checked once more
// against every process's maps just before, and any doubt (a process whose
// maps could not be read) keeps it. A process mapping it afterwards gets it
// attached again, as a new library. Runs on the discovery goroutine, which
// alone attaches files (inspectFile), so no attach runs in between.
func (a *Agent) releaseUnmapped(gen uint64) {
	ids := a.releaseCandidates(gen, time.Now())
	if len(ids) == 0 {
		return
	}
	mapped, err := a.mappedFiles()
	if err != nil {
		a.limited.Log(slog.LevelWarn, "release check", "unmapped libraries kept: not every process's maps could be read", "err", err)
		return
	}
	keep := map[probes.Fingerprint]bool{} // a mapped mount keeps its layer file's probes
	a.filesMu.Lock()
	for id, st := range a.files {
		if mapped[id] && st.v.overlay {
			keep[st.v.fp] = true
		}
	}
	a.filesMu.Unlock()
	for _, id := range ids {
		a.filesMu.Lock()
		st := a.files[id]
		kept := st != nil && st.v.overlay && keep[st.v.fp]
		a.filesMu.Unlock()
		if mapped[id] || kept {
			a.filesMu.Lock()
			if st := a.files[id]; st != nil {
				st.lastSeen = time.Now()
			}
			a.filesMu.Unlock()
			continue
		}
		a.release(id)
	}
}

// releaseCandidates lists the probed libraries unseen by the full scan gen
// and by every scan for ReleaseAfter. Files named on the command line and
// the dynamic linker (its notification finds every new library) stay; a
// file on overlayfs goes only with every other mount of the same layer file
// (they share its probes).
func (a *Agent) releaseCandidates(gen uint64, now time.Time) []probes.FileID {
	stale := func(st *fileState) bool {
		return st.seenGen < gen && now.Sub(st.lastSeen) >= a.cfg.ReleaseAfter
	}
	a.filesMu.Lock()
	defer a.filesMu.Unlock()
	inUse := map[probes.Fingerprint]bool{}
	for _, st := range a.files {
		if st.v.overlay && !stale(st) {
			inUse[st.v.fp] = true
		}
	}
	var out []probes.FileID
	for id, st := range a.files {
		if !st.final || !st.v.probed || st.v.linkerOnly || st.pinned || !stale(st) || st.v.overlay && inUse[st.v.fp] {
			continue
		}
		if out = append(out, id); len(out) == maxReleasesPerScan {
			break
		}
	}
	return out
}

// mappedFiles reads every watched process's maps now: the files mapped
// executable. A process that is gone maps nothing; one whose maps the agent
// may not read is one no scan can watch either (it attached nothing for
// it); any other failure is an error (it might map them).
func (a *Agent) mappedFiles() (map[probes.FileID]bool, error) {
	pids := a.cfg.PIDs
	if len(pids) == 0 {
		var err error
		if pids, err = listPIDs(a.cfg.ProcRoot); err != nil {
			return nil, err
		}
	}
	out := map[probes.FileID]bool{}
	for _, pid := range pids {
		maps, err := probes.ReadMaps(a.cfg.ProcRoot, pid)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) || errors.Is(err, fs.ErrPermission) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pid %d: %w", pid, err)
		}
		for _, m := range maps {
			if !m.Executable() || !m.FileBacked() {
				continue
			}
			if id, err := m.FileID(); err == nil {
				out[id] = true
			}
		}
	}
	return out, nil
}

// release forgets one library and detaches its probes: seen again, it is a
// new library.
func (a *Agent) release(id probes.FileID) {
	a.filesMu.Lock()
	st := a.files[id]
	delete(a.files, id)
	group := []probes.FileID{id}
	if st != nil && st.v.overlay { // the other mounts share its probes: they go too
		delete(a.sameFile, st.v.fp)
		for other, ost := range a.files {
			if ost.v.overlay && ost.v.fp == st.v.fp {
				delete(a.files, other)
				group = append(group, other)
			}
		}
	}
	a.filesMu.Unlock()
	if st == nil {
		return
	}
	start := time.Now()
	links, errs := 0, []error{}
	for _, gid := range group { // the probes are in one of them (the first attached)
		if err := a.probes.ForgetKnown(gid); err != nil { // a process mapping it again waits for its probes
			a.log.Warn("hold map", "path", st.name, "err", err)
		}
		n, err := a.probes.DetachFile(gid)
		links, errs = links+n, append(errs, err)
		a.forgetFabric(gid)
	}
	err := errors.Join(errs...)
	if links == 0 && err == nil {
		return // nothing attached in the file itself
	}
	a.libDetaches.Add(1)
	a.limited.Log(slog.LevelInfo, "release\x00"+st.name, "library no longer mapped by any process: probes detached (attached again when a process maps it)",
		"path", st.name, "links", links, "unmapped_for", time.Since(st.lastSeen).Round(time.Second).String(),
		"took", time.Since(start).Round(time.Millisecond).String(), "err", err)
}

// LibraryDetaches counts the libraries whose probes were detached because
// no process mapped them any more (lanewatch_library_detaches_total).
func (a *Agent) LibraryDetaches() uint64 { return a.libDetaches.Load() }
