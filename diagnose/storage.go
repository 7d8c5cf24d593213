package diagnose

import (
	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/judge"
)

// storageLegChecks are checklist items 6 and 7 over the window (item 8 is
// checks.GDSCheck, run without a window too).
func (w *window) storageLegChecks(cfg Config, host *checks.Host) []checks.Check {
	var out []checks.Check
	switch {
	case !cfg.TraceStorageReads:
		out = append(out, checks.Skipped(checks.HostScope, checks.CheckStorageDirect,
			"storage reads are traced with --trace-storage-reads (off by default: its program runs at every system call's exit on the host)"))
	case w.storageErr != nil:
		out = append(out, checks.Skipped(checks.HostScope, checks.CheckStorageDirect, "storage tracer: %v", w.storageErr))
	case len(w.storage) == 0:
		out = append(out, checks.Skipped(checks.HostScope, checks.CheckStorageDirect,
			"no traced process read from a block device in the window (io_uring and GPUDirect Storage reads are not seen)"))
	default:
		h2d := func(pid uint32) uint64 { return w.transfers.LaneBytes(pid, checks.Inbound) }
		out = append(out, judge.StorageDirectChecks(w.storage, h2d, host.NodeSide)...)
	}
	if w.disksErr != nil {
		return append(out, checks.Skipped(checks.HostScope, checks.CheckStorageUplink, "diskstats: %v", w.disksErr))
	}
	rates, _ := collectors.DiskRates(w.disks[0], w.disks[1])
	gpu := checks.GPURates{}
	for k, b := range w.transfers.LinkBytes(host.Place) {
		if gpu[k[0]] == nil {
			gpu[k[0]] = map[string]float64{}
		}
		gpu[k[0]][k[1]] = float64(b) / w.length.Seconds()
	}
	return append(out, host.StorageUplinkCheck(rates, gpu))
}
