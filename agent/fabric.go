package agent

import (
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

// libfabric's data path is found stage by stage (probes/fabric.go): each
// object a probed constructor returns names the provider functions of the
// next stage, attached at their file offsets, so every later process
// mapping that file is traced from its first call. A process that is
// running while a stage is attached is traced from then on: the objects it
// built before are unknown to the agent, and its calls through functions
// not yet probed are not seen (docs/design.md, "Transfer libraries").

// fabricReq asks for the provider functions a new libfabric object names.
type fabricReq struct {
	pid int
	row string // the constructor's row
	obj uint64
}

type fabricState struct {
	reqs    chan fabricReq
	pending atomic.Int64 // requests queued or being resolved
	mu      sync.Mutex
	rows    map[string]int                      // attached rows, by name: the files each is probed in
	seen    map[fabricReq]bool                  // resolved already: touched by the discovery goroutine only
	at      map[probes.FileID]map[string]uint64 // each file's attached rows and their offsets: the same
	built   map[int]bool                        // processes seen building an endpoint
}

func newFabricState() *fabricState {
	return &fabricState{reqs: make(chan fabricReq, 256), rows: map[string]int{}, seen: map[fabricReq]bool{},
		at: map[probes.FileID]map[string]uint64{}, built: map[int]bool{}}
}

// FabricFunctions says, for each libfabric row attached by offset, in how
// many files it is probed; FabricPending how many objects wait to be
// resolved. Together: whether the data path of a provider is probed yet.
func (a *Agent) FabricFunctions() map[string]int {
	a.fabric.mu.Lock()
	defer a.fabric.mu.Unlock()
	out := make(map[string]int, len(a.fabric.rows))
	for k, v := range a.fabric.rows {
		out[k] = v
	}
	return out
}

// FabricPending is how many libfabric objects wait for their functions to
// be resolved and attached.
func (a *Agent) FabricPending() int64 { return a.fabric.pending.Load() }

// fabricObject runs on the reading goroutine for a libfabric constructor's
// call, before the engine sees it: an endpoint's provider and domain are
// read from its fi_info now, while the process holds it, and an object
// whose ops name functions goes to discovery to have them probed.
func (a *Agent) fabricObject(c *event.Call) {
	if c.ReturnTime == 0 || int32(c.Ret) != 0 || c.Ptr == 0 {
		return // failed: no object
	}
	if c.Symbol == probes.FabricRowEndpoint {
		prov, dev, err := probes.FabricNames(a.cfg.ProcRoot, int(c.PID), c.Src)
		if err != nil {
			a.limited.Log(slog.LevelWarn, "fabric names\x00"+strconv.Itoa(int(c.PID)), "libfabric endpoint's provider not read: its records say transport unknown",
				"pid", c.PID, "err", err)
		}
		a.engineMu.Lock()
		a.engine.FabricEndpoint(c.PID, c.Ptr, prov, dev, err)
		a.engineMu.Unlock()
		a.fabric.mu.Lock()
		a.fabric.built[int(c.PID)] = true
		a.fabric.mu.Unlock()
	}
	if !probes.FabricStage(c.Symbol) {
		return
	}
	a.fabric.pending.Add(1)
	select {
	case a.fabric.reqs <- fabricReq{int(c.PID), c.Symbol, c.Ptr}:
	default:
		a.fabric.pending.Add(-1)
		a.limited.Log(slog.LevelWarn, "fabric queue full", "libfabric resolution queue full: this object's functions not probed", "pid", c.PID)
	}
}

// attachFabric resolves the functions a libfabric object's ops name and
// probes each at its file offset, once per file and row. A file holding
// several providers (libfabric.so holds them all) probes each row at the
// first provider's function only: a second provider's is logged, not
// probed (a row has one site per file).
func (a *Agent) attachFabric(req fabricReq) {
	defer a.fabric.pending.Add(-1)
	if a.fabric.seen[req] {
		return
	}
	if len(a.fabric.seen) >= 4096 {
		clear(a.fabric.seen) // bounded; resolving again is harmless
	}
	a.fabric.seen[req] = true
	fns, err := probes.ResolveFabricOps(a.cfg.ProcRoot, req.pid, req.row, req.obj)
	if err != nil {
		a.limited.Log(slog.LevelWarn, "fabric\x00"+strconv.Itoa(req.pid), "libfabric functions not probed", "pid", req.pid, "err", err)
		return
	}
	byFile, paths := groupByFile(fns)
	for id, syms := range byFile {
		f := paths[id]
		used := map[uint64]string{}
		for row, sym := range syms {
			if at, ok := a.fabric.at[id][row]; ok {
				if at != sym.Offset {
					a.limited.Log(slog.LevelInfo, "fabric row\x00"+f.Path+row, "libfabric function of a second provider not probed: the row is probed at another provider's in this file",
						"path", f.Path, "function", row, "offset", fmt.Sprintf("%#x", sym.Offset), "probed", fmt.Sprintf("%#x", at))
				}
				delete(syms, row)
				continue
			}
			if other, ok := used[sym.Offset]; ok { // two ops naming one function: probed once
				a.log.Info("libfabric function serves two rows: probed as the first", "path", f.Path, "function", row, "as", other)
				delete(syms, row)
				continue
			}
			used[sym.Offset] = row
		}
		if len(syms) == 0 {
			continue
		}
		af, err := a.probes.AttachFileAs(id, f.Path, f.OpenPath, syms, a.attachPID())
		if err != nil {
			delete(a.fabric.seen, req) // tried again at the next such object
			a.filesMu.Lock()
			a.countAttachFailure(f.Path)
			a.filesMu.Unlock()
			a.limited.Log(slog.LevelError, "fabric\x00"+f.Path, "attach libfabric functions (retried at the next such object)",
				"pid", req.pid, "path", f.Path, "err", err)
			continue
		}
		if a.fabric.at[id] == nil {
			a.fabric.at[id] = map[string]uint64{}
		}
		a.fabric.mu.Lock()
		for row := range syms {
			a.fabric.at[id][row] = syms[row].Offset
			a.fabric.rows[row]++
			a.log.Info("attached libfabric function", "pid", req.pid, "path", f.Path, "function", row,
				"offset", fmt.Sprintf("%#x", syms[row].Offset), "site", af.Sites[row].String())
		}
		a.fabric.mu.Unlock()
	}
}

// forgetFabric forgets the libfabric rows attached in a file whose probes
// were detached: the next process's objects attach them again.
func (a *Agent) forgetFabric(id probes.FileID) {
	a.fabric.mu.Lock()
	defer a.fabric.mu.Unlock()
	for row := range a.fabric.at[id] {
		if a.fabric.rows[row]--; a.fabric.rows[row] <= 0 {
			delete(a.fabric.rows, row)
		}
	}
	delete(a.fabric.at, id)
	clear(a.fabric.seen)
}

// fabricBlind says whether the agent cannot see a process's libfabric
// transfers: it was running before the agent attached and has built no
// endpoint since (probes.UntracedFabricBeforeAttach).
func (a *Agent) fabricBlind(pid int) bool {
	a.procMu.Lock()
	pre := a.preexisting[pid]
	a.procMu.Unlock()
	if !pre {
		return false
	}
	a.fabric.mu.Lock()
	defer a.fabric.mu.Unlock()
	return !a.fabric.built[pid]
}

// fabricExited forgets an exited process's endpoints.
func (a *Agent) fabricExited(pid int) {
	a.fabric.mu.Lock()
	delete(a.fabric.built, pid)
	a.fabric.mu.Unlock()
}
