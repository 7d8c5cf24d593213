package agent

import (
	"log/slog"
	"path/filepath"
	"strconv"

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

// stubNames is the engine's StubName over procfs: the function holding
// address addr of process pid, read from the ELF file its executable
// mapping of addr maps (through /proc/PID/root, as the process sees its
// files). The runtime layer launches host stubs, which nvcc names after
// their kernels. Asked once per process and stub by the engine; "" when the
// process is gone, the address in no file, the file stripped.
func stubNames(procRoot string, log *slog.Logger) func(pid uint32, addr uint64) string {
	return func(pid uint32, addr uint64) string {
		maps, err := probes.ReadMaps(procRoot, int(pid))
		if err != nil {
			return ""
		}
		for _, m := range maps {
			if addr < m.Start || addr >= m.End || !m.Executable() || !m.FileBacked() {
				continue
			}
			path := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "root", m.Path)
			name, err := probes.FunctionAt(path, addr-m.Start+m.Offset)
			if err != nil {
				log.Debug("host stub not named", "pid", pid, "addr", addr, "err", err)
			}
			return name
		}
		return ""
	}
}

// engineConfig is the correlation engine's configuration of an agent.
func engineConfig(cfg Config, sink correlate.Sink, kv *correlate.KernelSet) correlate.Config {
	return correlate.Config{Sink: sink, Devices: cfg.Devices, KVKernels: kv, StubName: stubNames(cfg.ProcRoot, cfg.Logger)}
}
