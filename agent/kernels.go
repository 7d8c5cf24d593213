package agent

import (
	"log/slog"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/probes"
)

// Kernel movers (docs/design.md, "Kernel movers"): the kernel rows — the
// launches and the calls that name a kernel handle — are attached only when
// Config.Kernels asks, because a launch probe costs every kernel launch of
// every traced process one entry+return pair (make bench, BenchmarkLaunch).

// kernelRows drops the kernel rows from the table's symbol names unless
// launches are probed.
func kernelRows(names []string, on bool) []string {
	if on {
		return names
	}
	kernel := map[string]bool{}
	for _, p := range probes.Table {
		if p.Op.IsKernel() {
			kernel[p.Symbol] = true
		}
	}
	var out []string
	for _, n := range names {
		if !kernel[n] {
			out = append(out, n)
		}
	}
	return out
}

// KVKernelSet compiles the KV-transfer kernel patterns (nil: sgl-kernel's,
// correlate.DefaultKVKernels).
func KVKernelSet(patterns []string) (*correlate.KernelSet, error) {
	if patterns == nil {
		patterns = correlate.DefaultKVKernels
	}
	return correlate.NewKernelSet(patterns)
}

// stubResolver is the engine's StubName over procfs: the function holding
// address addr of process pid, read from the ELF file its executable
// mapping of addr maps. The runtime layer launches host stubs, which nvcc
// names after their kernels. The engine asks once per process and stub, on
// the reading goroutine, when the launch's event is read: the process may
// have exited by then (its maps read empty), so the executable mappings
// read when its runtime layer was attached, while it surely lived, are kept
// until it exits (keep, forget), and the file is then opened in the agent's
// own view where it is still the mapped device and inode. "" when the
// address is in no file, the file is stripped or gone.
type stubResolver struct {
	procRoot string
	log      *slog.Logger

	mu   sync.Mutex
	maps map[uint32][]probes.Mapping // executable file mappings, by pid
}

const maxStubProcs = 1024 // processes whose mappings are kept (runtime layers are rare)

func newStubResolver(procRoot string, log *slog.Logger) *stubResolver {
	return &stubResolver{procRoot: procRoot, log: log, maps: map[uint32][]probes.Mapping{}}
}

// keep remembers the executable file mappings of a process that is alive.
func (r *stubResolver) keep(pid int, maps []probes.Mapping) {
	var exec []probes.Mapping
	for _, m := range maps {
		if m.Executable() && m.FileBacked() {
			exec = append(exec, m)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.maps[uint32(pid)]; !ok && len(r.maps) >= maxStubProcs {
		clear(r.maps)
	}
	r.maps[uint32(pid)] = exec
}

// forget drops an exited process's mappings.
func (r *stubResolver) forget(pid int) {
	r.mu.Lock()
	delete(r.maps, uint32(pid))
	r.mu.Unlock()
}

func (r *stubResolver) name(pid uint32, addr uint64) string {
	maps, err := probes.ReadMaps(r.procRoot, int(pid))
	if err != nil || len(maps) == 0 { // gone, or a zombie whose maps read empty
		r.mu.Lock()
		maps = r.maps[pid]
		r.mu.Unlock()
	}
	for _, m := range maps {
		if addr < m.Start || addr >= m.End || !m.Executable() || !m.FileBacked() {
			continue
		}
		off := addr - m.Start + m.Offset
		if mf, err := probes.OpenMapped(r.procRoot, int(pid), m); err == nil {
			defer mf.Close()
			return r.function(mf.OpenPath(), off, pid, addr)
		}
		// The process is gone: the same file in the agent's own view.
		id, err := m.FileID()
		var st unix.Stat_t
		if err != nil || unix.Stat(m.Path, &st) != nil || (probes.FileID{Dev: uint64(unix.Major(st.Dev))<<32 | uint64(unix.Minor(st.Dev)), Inode: st.Ino}) != id {
			return ""
		}
		return r.function(m.Path, off, pid, addr)
	}
	return ""
}

func (r *stubResolver) function(path string, off uint64, pid uint32, addr uint64) string {
	name, err := probes.FunctionAt(path, off)
	if err != nil {
		r.log.Debug("host stub not named", "pid", pid, "addr", addr, "err", err)
	}
	return name
}

// engineConfig is the correlation engine's configuration of an agent.
func engineConfig(cfg Config, sink correlate.Sink, kv *correlate.KernelSet, stubs *stubResolver) correlate.Config {
	return correlate.Config{Sink: sink, Devices: cfg.Devices, KVKernels: kv, StubName: stubs.name, Activity: cfg.Activity}
}
