package selftest

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/selftest/refenv"
	"github.com/lanewatch/lanewatch/topology"
	"golang.org/x/sys/unix"
)

// UplinkScenario (refpath/kvpath/storage_writeback.c) reads layers from a
// file on this machine's disk while it copies others D2H on a reference
// GPU: both travel up a switch uplink the disk and the GPU share. The
// selftest places them by injection (the machine has a virtio disk on the
// root bus): under one switch whose uplink trained to Gen1 x4 (1 GB/s, the
// scale of the reference disk's ~1.3 GB/s and its 4 GB/s lanes), where
// storage-shared-uplink must fire, and apart, where it must not.
const UplinkScenario = "storage-writeback"

var uplinkRuns = []struct {
	name   string
	shared bool
}{{"uplink-shared", true}, {"uplink-apart", false}}

// uplinkFixture is the injected placement: GPU gpu below a switch whose
// uplink is Gen1 x1 (0.25 GB/s); the disk below it too when shared, else on
// a root port of its own. The scenario moves 256 MiB each way, about ten
// times what the uplink carries in the time it takes here: the shared
// placement fires by construction, unless a run slows below a tenth of its
// rates, which the row then reports as the agent's failure.
func uplinkFixture(gpu, disk string, shared bool) checks.StorageHost {
	gen1x1 := topology.Link{CurSpeedGTs: 2.5, MaxSpeedGTs: 2.5, CurWidth: 1, MaxWidth: 1, Known: true}
	f := func(bdf string, class uint32, chain ...string) *topology.Function {
		parent := ""
		if len(chain) > 1 {
			parent = chain[len(chain)-2]
		}
		return &topology.Function{BDF: bdf, Class: class, Parent: parent, Chain: chain, Link: gen1x1, NUMANode: -1}
	}
	rp, usp, d1, d2, rp2 := "0000:e0:01.0", "0000:e1:00.0", "0000:e2:00.0", "0000:e2:01.0", "0000:e8:01.0"
	nvme, apart := "0000:e3:00.0", "0000:e9:00.0"
	t := &topology.Host{Functions: map[string]*topology.Function{
		rp: f(rp, 0x060400, rp), usp: f(usp, 0x060400, rp, usp), d1: f(d1, 0x060400, rp, usp, d1), d2: f(d2, 0x060400, rp, usp, d2),
		gpu: f(gpu, 0x030200, rp, usp, d1, gpu), nvme: f(nvme, 0x010802, rp, usp, d2, nvme),
		rp2: f(rp2, 0x060400, rp2), apart: f(apart, 0x010802, rp2, apart),
	}}
	place := func(name string) topology.BlockPlacement {
		switch {
		case name != disk:
			return topology.BlockPlacement{Name: name, NUMANode: -1, Unknown: "not the scenario's disk"}
		case shared:
			return topology.BlockPlacement{Name: name, BDF: nvme, NUMANode: -1, RootPort: rp, Switch: usp}
		default:
			return topology.BlockPlacement{Name: name, BDF: apart, NUMANode: -1, RootPort: rp2}
		}
	}
	return checks.StorageHost{Topo: t, Place: place, Whole: func(n string) bool { return collectors.WholeDisk("/sys", n) }}
}

// wholeDisk names the disk of a partition (sysfs: the partition's
// directory is under its disk's), else name itself.
func wholeDisk(name string) string {
	if collectors.WholeDisk("/sys", name) {
		return name
	}
	d, err := filepath.EvalSymlinks(filepath.Join("/sys/class/block", name))
	if err != nil {
		return name
	}
	return filepath.Base(filepath.Dir(d))
}

// uplinkRun runs storage-writeback once per placement.
func uplinkRun(ctx context.Context, kvpath, tmp string, col *Collector, cfg Config, drops lossCount) []Result {
	var out []Result
	for _, run := range uplinkRuns {
		out = append(out, uplinkOnce(ctx, kvpath, tmp, col, cfg, drops, run.name, run.shared))
	}
	return out
}

func uplinkOnce(ctx context.Context, kvpath, tmp string, col *Collector, cfg Config, drops lossCount, name string, shared bool) Result {
	res := Result{Scenario: name, Runtime: "plain"}
	fail := func(format string, args ...any) Result {
		res.OtherErrs++
		res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
		return res
	}
	dir, err := storageDir(cfg.RefDir)
	if err != nil {
		return fail("%v", err)
	}
	gpu := fmt.Sprintf("selftest-uplink-%d", os.Getpid())
	defer os.Remove(refenv.LaneFile(gpu))
	truthPath := filepath.Join(tmp, name+".jsonl")
	before := drops()
	p, err := startHeld(ctx, cfg, kvpath, UplinkScenario, truthPath, []string{refenv.StorageDir(dir), refenv.SharedGPU(gpu)})
	if err != nil {
		return fail("%v", err)
	}
	res.PID = p.pid
	// The block device counters around exactly the reads and copies.
	d0, err0 := collectors.ReadDiskstats("/proc")
	line := ""
	if _, err := io.WriteString(p.stdin, "go\n"); err == nil {
		line, err = p.out.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "done" {
			res.Problems = append(res.Problems, fmt.Sprintf("%s: expected a done line, got %q: %v", UplinkScenario, line, err))
		}
	}
	d1, err1 := collectors.ReadDiskstats("/proc")
	if err := p.release(); err != nil {
		res.Problems = append(res.Problems, err.Error())
	}
	_, got := p.finish(&res, col, cfg.Timeout, drops, before)
	if err := cmpErr(err0, err1); err != nil {
		return fail("diskstats: %v", err)
	}
	checkUplink(&res, truthPath, refenv.BusID(gpu), shared, d0, d1, got)
	checkDesigned(&res, name, []scenarioProc{{pid: p.pid, gpu: refenv.BusID(gpu)}}, got, col.TakeActivities(p.pid))
	return res
}

func cmpErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// checkUplink judges the window as agent run does (checks.StorageHost's
// UplinkCheck on the diskstats rates and the GPU's lane rate from the
// agent's records) and compares: the agent's D2H bytes must be the
// truth's, its disk's read bytes at least the scenario's (other processes
// read the same disk), and where the rule fires on the scenario's own bytes
// over the same window the agent's verdict must fire too (its inputs are
// the truth's or larger, and the rule only rises with them); apart, it must
// not judge the uplink at all.
func checkUplink(res *Result, truthPath, gpu string, shared bool, d0, d1 collectors.DiskSample, got []correlate.Transfer) {
	problem := func(format string, args ...any) {
		res.OtherErrs++
		res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
	}
	var t struct {
		storageTruth
		D2H uint64 `json:"d2h_bytes"`
	}
	st, err := readStorageTruth(truthPath)
	if err != nil {
		problem("uplink: %v", err)
		return
	}
	t.storageTruth = st
	if err := readEndField(truthPath, "d2h_bytes", &t.D2H); err != nil {
		problem("uplink: %v", err)
		return
	}
	if t.Direct != 1 {
		problem("uplink: the file was read through the page cache (O_DIRECT refused): the disk read less than the scenario did")
		return
	}
	var maj, mnr uint32
	if _, err := fmt.Sscanf(t.Dev, "%d:%d", &maj, &mnr); err != nil {
		problem("uplink: storage_dev %q: %v", t.Dev, err)
		return
	}
	part, err := collectors.BlockDeviceName("/sys", unix.Mkdev(maj, mnr))
	if part == "" || err != nil {
		problem("uplink: the file's device %s is no block device: %v", t.Dev, err)
		return
	}
	disk := wholeDisk(part)
	var d2h uint64
	for _, tr := range got {
		if !tr.Failed() && tr.Direction == correlate.DirD2H && tr.GPU == gpu {
			d2h += tr.Bytes
		}
	}
	if d2h != t.D2H {
		problem("uplink: the agent's D2H on GPU %s: %d B, the scenario copied %d B", gpu, d2h, t.D2H)
	}
	rates, _ := collectors.DiskRates(d0, d1)
	interval := d1.Time.Sub(d0.Time).Seconds()
	if read, ok := diskReadBytes(d0, d1, disk); !ok || interval <= 0 {
		problem("uplink: no reading of %s over the window", disk)
		return
	} else if read < t.Bytes {
		problem("uplink: %s read %d B over the window by diskstats, the scenario alone read %d B", disk, read, t.Bytes)
	}
	h := uplinkFixture(gpu, disk, shared)
	var r checks.Report
	r.Add(h.UplinkCheck(rates, checks.GPURates{gpu: {checks.Outbound: float64(d2h) / interval}}))
	c := r.Checks[0]
	res.raise(c.Findings...)
	fired := len(c.Findings) == 1 && c.Findings[0].Rule == "storage-shared-uplink"
	note := fmt.Sprintf("finding: %s %s over %s: %s", c.Name, c.Status, time.Duration(interval*1e9).Round(time.Millisecond), c.Detail)
	if !shared {
		if fired || c.Status != checks.Skip {
			problem("uplink: disk and GPU apart: %s with %d findings, want SKIP and none (%s)", c.Status, len(c.Findings), c.Detail)
			return
		}
		res.Problems = append(res.Problems, note)
		return
	}
	if !fired || c.Status != checks.Warn {
		problem("uplink: disk and GPU under one switch, designed to fire: the agent gave %s with %d findings (%s; the scenario read %d B and copied %d B D2H over %.0f ms)",
			c.Status, len(c.Findings), c.Detail, t.Bytes, t.D2H, interval*1e3)
		return
	}
	res.Problems = append(res.Problems, note)
}

// diskReadBytes is what diskstats says name read between two readings, in
// whole sectors.
func diskReadBytes(d0, d1 collectors.DiskSample, name string) (uint64, bool) {
	var a, b *collectors.DiskStat
	for i := range d0.Disks {
		if d0.Disks[i].Name == name {
			a = &d0.Disks[i]
		}
	}
	for i := range d1.Disks {
		if d1.Disks[i].Name == name {
			b = &d1.Disks[i]
		}
	}
	if a == nil || b == nil || b.SectorsRead < a.SectorsRead {
		return 0, false
	}
	return (b.SectorsRead - a.SectorsRead) * collectors.SectorBytes, true
}
