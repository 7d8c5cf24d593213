package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/diagnose"
)

// Exit codes of diagnose: 0 nothing failed, 1 a check failed, 2 diagnose
// itself could not run.
const (
	exitOK        = 0
	exitFailed    = 1
	exitCannotRun = 2
)

func cmdDiagnose(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("diagnose", "warn", stderr, `Runs the prefix-cache-load checklist in the order path → direction → mover:
host topology, PCIe link training, IOMMU mode, numactl, hugepages; then per process
(--pid, or every process mapping a CUDA library) its NUMA binding and where its pinned
pools live; with --sample, a live probe window that reports pageable copies,
fragmentation, same-direction overlap, H2D vs compute overlap and host syncs, RDMA
congestion per port and queue pair, and
block device throughput with each device's NUMA node and switch, storage reads into the
pool (--trace-storage-reads) and storage beside GPU traffic on a shared switch uplink;
GPUDirect Storage (nvidia_fs loaded, libcufile mapped) always. Each item is PASS, WARN, FAIL or SKIP with the reason and what to do, or INFO for a
listing that judges nothing. Exit code: 0 when nothing fails, 1 on a FAIL, 2 when
diagnose itself could not run.`)
	var pids pidList
	var libs stringList
	fs.Var(&pids, "pid", "check only these processes (repeatable or comma-separated)")
	fs.Var(&libs, "lib", "also probe this ELF file during --sample (repeatable)")
	sample := fs.Duration("sample", 0, "watch live transfers for this long (e.g. 10s); 0 = static checks only")
	asJSON := fs.Bool("json", false, "print the checklist as JSON")
	storageReads := fs.Bool("trace-storage-reads", false, "with --sample, trace the traced processes' storage reads (which device, which buffer; checklist item 6, storage-far-pool). Off by default: its program runs at every system call's exit on the host while the window lasts")
	procRoot := fs.String("path.procfs", "/proc", "procfs mount point")
	sysRoot := fs.String("path.sysfs", "/sys", "sysfs mount point (or a captured tree)")
	var gpu agent.GPUConfig
	fs.StringVar(&gpu.Source, "gpu-counters", "auto", "GPU counters read during --sample for the link check (GPU links are judged as read under load): auto (DCGM, else NVML), dcgm, nvml or off")
	fs.StringVar(&gpu.NVMLLibrary, "nvml.library", "libnvidia-ml.so.1", "the NVML library to load at run time")
	fs.StringVar(&gpu.DCGMAddress, "dcgm.address", "", "a standalone nv-hostengine (host:port); empty starts an embedded host engine")
	kernels := fs.Bool("kernels", true, "probe kernel launches during --sample: compute overlap (H2D vs compute, item 3) needs them; each launch of a traced process costs one entry+return pair while the window lasts (false: item 3's overlap SKIPs)")
	var ib stringList
	fs.Var(&ib, "ib-devices", `the RDMA devices the server uses, in any form of SGLang's --disaggregation-ib-device: a device or comma-separated list every GPU shares ("mlx5_0,mlx5_1"), a GPU → device(s) JSON object ('{"0":"mlx5_0","1":"mlx5_1,mlx5_2"}') or a file holding one (repeatable; checked for far NICs)`)
	log, code := parse(fs, args, stderr)
	if log == nil {
		return code
	}
	flagErr := errors.Join(checkRoot("path.procfs", *procRoot), checkRoot("path.sysfs", *sysRoot), checkLibs(libs), notNegative("sample", *sample))
	if flagErr == nil {
		flagErr = checkPIDs(*procRoot, pids)
	}
	if code := usageErrors(stderr, "diagnose", flagErr); code != 0 {
		return code
	}
	if *sample > 0 && !checkPrivileges(stderr, "diagnose --sample", log) {
		return exitCannotRun
	}
	cfg := diagnose.Config{ProcRoot: *procRoot, SysRoot: *sysRoot, PIDs: pids, Sample: *sample, Libs: libs, Logger: log, GPU: gpu, Kernels: *kernels,
		TraceStorageReads: *storageReads}
	var err error
	if cfg.IBDevices, err = checks.ParseIBDevices(ib, os.ReadFile); err != nil {
		fmt.Fprintln(stderr, err)
		return exitCannotRun
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	if *sample > 0 {
		fmt.Fprintf(stderr, "sampling live transfers for %s…\n", sample.Round(time.Millisecond))
	}
	report, err := diagnose.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "diagnose:", err)
		return exitCannotRun
	}
	if *asJSON {
		err = report.WriteJSON(stdout)
	} else {
		err = report.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "diagnose:", err)
		return exitCannotRun
	}
	if report.Failed() {
		return exitFailed
	}
	return exitOK
}
