package checks

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/lanewatch/lanewatch/collectors"
)

// MappedFiles lists the files a process maps (the paths in its
// /proc/PID/maps); diagnose reads them with the probes' maps parser.
type MappedFiles func(procRoot string, pid int) ([]string, error)

// Storage check names.
const (
	CheckGDS     = "GPUDirect Storage"
	CheckStorage = "storage devices"
)

// GDSCheck is checklist item 8, whether GPUDirect Storage can be in use:
// the nvidia_fs module loaded (sysRoot/module/nvidia_fs exists) and which
// processes map libcufile. PASS: both (the direct path is there; whether a
// read took it is cuFile's choice per file); WARN: libcufile mapped without
// nvidia_fs, so cuFile runs in compatibility mode (POSIX reads into host
// bounce buffers, then a copy to the GPU) unless the platform has the
// P2PDMA mode (CUDA 12.8+, no nvidia_fs); INFO: no process maps libcufile
// (SGLang HiCache has no GDS path: storage → host pool → GPU by design);
// SKIP when sysfs has no module directory or no process's maps could be
// read, so nothing can be known.
func GDSCheck(procRoot, sysRoot string, mapped MappedFiles) Check {
	modDir := filepath.Join(sysRoot, "module")
	if _, err := os.Stat(modDir); err != nil {
		return Skipped(HostScope, CheckGDS, "cannot tell whether nvidia_fs is loaded: %v", err)
	}
	module := "nvidia_fs module not loaded"
	if _, err := os.Stat(filepath.Join(modDir, "nvidia_fs")); err == nil {
		module = "nvidia_fs module loaded"
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Skipped(HostScope, CheckGDS, "cannot tell whether nvidia_fs is loaded: %v", err)
	}
	users, read, err := cufileUsers(procRoot, mapped)
	if err != nil || read == 0 {
		return Skipped(HostScope, CheckGDS, "%s, but no process's maps were readable under %s (%v): run as root", module, procRoot, err)
	}
	c := Check{Scope: HostScope, Name: CheckGDS, Status: Info,
		Detail: fmt.Sprintf("%s; no process maps libcufile (%d processes read): GDS not in use", module, read)}
	loaded := module == "nvidia_fs module loaded"
	switch {
	case len(users) > 0 && loaded:
		c.Status = Pass
		c.Detail = module + "; libcufile mapped by pid " + JoinLimited(users, 8) +
			": the direct storage→GPU path is available (whether a read took it is cuFile's choice per file: gdscheck -p, cufile.log)"
	case len(users) > 0:
		c.Status = Warn
		c.Detail = module + "; libcufile mapped by pid " + JoinLimited(users, 8) +
			": cuFile runs in compatibility mode (POSIX reads into host bounce buffers, then a copy to the GPU) unless the platform has P2PDMA mode (CUDA 12.8+)"
		c.Fix = "load nvidia_fs (or set up GDS P2PDMA mode); gdscheck -p says which modes libcufile supports"
	}
	return c
}

// cufileUsers lists the processes that map libcufile (libcufile.so*,
// libcufile_rdma.so*) and how many processes' maps were read.
func cufileUsers(procRoot string, mapped MappedFiles) (users []string, read int, err error) {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, 0, err
	}
	for _, e := range ents {
		pid, perr := strconv.Atoi(e.Name())
		if perr != nil || pid <= 0 {
			continue
		}
		files, merr := mapped(procRoot, pid)
		if merr != nil {
			continue // gone, kernel thread, or not ours to read
		}
		read++
		for _, f := range files {
			if strings.HasPrefix(filepath.Base(f), "libcufile") {
				users = append(users, e.Name())
				break
			}
		}
	}
	return users, read, nil
}

// StorageCheck lists each block device's throughput over the sample and
// where it sits: NUMA node, switch (upstream port) and the GPUs sharing
// it, or why that is unknown. Devices idle over the sample are counted,
// not listed. INFO: a listing; reset names devices whose counters went
// back (no rate).
func (h *Host) StorageCheck(rates []collectors.DiskRate, reset []string) Check {
	var lines []string
	idle := 0
	for _, r := range rates {
		if r.ReadsPerSec == 0 && r.WritesPerSec == 0 {
			idle++
			continue
		}
		p := h.Topo.PlaceBlock(h.SysRoot, r.Name)
		where := "placement unknown: " + p.Unknown
		if p.BDF != "" {
			node := "node unknown"
			if p.NUMANode >= 0 {
				node = fmt.Sprintf("node %d", p.NUMANode)
			}
			where = p.BDF + ", " + node
			if p.Switch != "" {
				where += ", switch " + p.Switch
				if gpus := h.Topo.SharesSwitch(p); len(gpus) > 0 {
					where += " shared with GPU " + JoinLimited(gpus, 4)
				}
			} else {
				where += ", no switch"
			}
		}
		lines = append(lines, fmt.Sprintf("%s read %.1f MB/s write %.1f MB/s busy %.0f%% (%s)",
			r.Name, r.ReadBytesPerSec/1e6, r.WriteBytesPerSec/1e6, 100*r.BusyFraction, where))
	}
	detail := fmt.Sprintf("%d block devices, %d idle", len(rates)+len(reset), idle)
	if len(lines) > 0 {
		detail += "; " + strings.Join(lines, "; ")
	}
	if len(reset) > 0 {
		detail += "; counters went back (no rate): " + strings.Join(reset, ", ")
	}
	return Check{Scope: HostScope, Name: CheckStorage, Status: Info, Detail: detail}
}
