// Package refenv names what the reference data path (refpath/) reads from
// its environment and where it keeps its shared state, so that only the
// selftest and the tests that drive the reference path know it; production
// code never does.
package refenv

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultLaneGBs is the reference GPU's per-direction lane rate when
// LW_REF_H2D_GBPS/LW_REF_D2H_GBPS are unset (refpath/driver/init.c).
const DefaultLaneGBs = 4.0

// SharedGPU puts a process's GPU lanes in the shared file of the named
// reference GPU, so several processes (and the NVML stand-in) see them.
func SharedGPU(name string) string { return "LW_REF_GPU=" + name }

// RDMAWire names the reference RDMA fabric a run uses (rdmapath's wire,
// /dev/shm/lw-ref-wire-<name>), so runs of other tests do not share it.
func RDMAWire(name string) string { return "LW_REF_WIRE=" + name }

// H2DGBps sets the inbound lane rate of the process's reference GPU.
func H2DGBps(gbs float64) string { return "LW_REF_H2D_GBPS=" + strconv.FormatFloat(gbs, 'g', -1, 64) }

// LaneGBs is the inbound lane rate the reference processes this process
// starts get: LW_REF_H2D_GBPS from its own environment, else the default.
func LaneGBs() float64 {
	if v, err := strconv.ParseFloat(os.Getenv("LW_REF_H2D_GBPS"), 64); err == nil && v > 0 {
		return v
	}
	return DefaultLaneGBs
}

// LaneFile is the shared-memory file of a named reference GPU's lanes.
func LaneFile(name string) string { return "/dev/shm/lw-ref-" + name }

// PairFile is the shared-memory file in which the two processes of a pair
// scenario on the named reference GPU keep in lockstep
// (refpath/kvpath/overlap.c); the last one out removes it.
func PairFile(name string) string { return "/dev/shm/lw-ref-" + name + "-pair" }

// RDMAGPU is the reference GPU rdmapath gives a role (prefill, decode).
func RDMAGPU(role string) string { return "gpu-" + role }

// NVMLName is the name the NVML stand-in gives the named reference GPU.
func NVMLName(name string) string { return "ref-" + name }

// NVMLLink sets the current link generation and width the NVML stand-in
// reports ("GENxWIDTH").
func NVMLLink(gen, width int) (key, value string) {
	return "LW_REF_NVML_LINK", fmt.Sprintf("%dx%d", gen, width)
}

// NVMLMaxLink sets the maximum link generation and width the NVML stand-in
// reports (nvmlDeviceGetMaxPcieLinkGeneration/Width), and the current ones
// unless NVMLLink says otherwise.
func NVMLMaxLink(gen, width int) (key, value string) {
	return "LW_REF_NVML_MAX_LINK", fmt.Sprintf("%dx%d", gen, width)
}

// NVMLIdleLink makes the NVML stand-in's links train down when idle, as real
// GPUs do: the current generation and width are these once neither lane of
// the GPU has carried traffic for NVMLIdleMS (1000 ms by default), and
// NVMLLink's (the max by default) as soon as one does.
func NVMLIdleLink(gen, width int) (key, value string) {
	return "LW_REF_NVML_IDLE_LINK", fmt.Sprintf("%dx%d", gen, width)
}

// NVMLIdleMS is how long a lane must have been idle before the stand-in's
// link reads its idle state.
func NVMLIdleMS(ms int) (key, value string) { return "LW_REF_NVML_IDLE_MS", strconv.Itoa(ms) }

// NVMLNoPCIeFields makes the NVML stand-in answer NOT_SUPPORTED for the
// PCIe byte counter fields, as GPUs without them do.
func NVMLNoPCIeFields() (key, value string) { return "LW_REF_NVML_NO_PCIE_FIELDS", "1" }

// NVMLNVLinkKiB makes every GPU of the NVML stand-in answer NVLink data
// totals of tx and rx KiB over all its links (fields 138/139, scopeId
// UINT_MAX); without it they are NOT_SUPPORTED, as on a GPU without NVLink.
func NVMLNVLinkKiB(tx, rx uint64) (key, value string) {
	return "LW_REF_NVML_NVLINK_KIB", fmt.Sprintf("%d,%d", tx, rx)
}

// NoDeviceEnv makes the reference driver's cuInit fail with
// CUDA_ERROR_NO_DEVICE (100), as a real driver does on a host without a GPU.
const NoDeviceEnv = "LW_REF_NO_DEVICE=1"

// OrdinaryMovers keeps the reference's movers (a stream's copy engine, the
// RDMA provider's NIC thread) ordinary threads, not SCHED_FIFO
// (refpath/driver/mover.c): a real GPU's engine takes no host CPU, while the
// reference's, woken for each small copy, holds most of a CPU ahead of
// every ordinary thread, an observer's included.
const OrdinaryMovers = "LW_REF_MOVERS=ordinary"

// SharedGPUs gives a process the named reference GPUs as its CUDA devices
// (LW_REF_GPUS), each with its shared lanes; ordinals follow the PCI order of
// their identities (BusID), as CUDA orders GPUs of one model.
func SharedGPUs(names ...string) string { return "LW_REF_GPUS=" + strings.Join(names, ",") }

// StorageDir tells the storage scenarios (storage-load, storage-writeback)
// where to write the file they read back: a directory on a block device
// that takes O_DIRECT.
func StorageDir(dir string) string { return "LW_REF_STORAGE_DIR=" + dir }

// BusID is the PCI address, in sysfs form, that the reference driver
// (cuDeviceGetPCIBusId) and the NVML stand-in give the named reference GPU:
// domain 0xF000 | bits 8..19 of FNV-1a-64(name), bus its low byte
// (refcudaGPUIdentity, refpath/include/refcuda.h).
func BusID(name string) string {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint64(name[i])) * 0x100000001b3
	}
	return fmt.Sprintf("%04x:%02x:00.0", 0xf000|(h>>8)&0xfff, h&0xff)
}

// GPUsOf names the reference GPUs process pid sees, from its environment
// under procRoot: LW_REF_GPUS, else LW_REF_GPU; none for a process on
// private lanes (its GPU has no PCI identity) or one that is gone.
func GPUsOf(procRoot string, pid uint32) []string {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "environ"))
	if err != nil {
		return nil
	}
	var one, many string
	for _, kv := range bytes.Split(b, []byte{0}) {
		k, v, _ := strings.Cut(string(kv), "=")
		switch k {
		case "LW_REF_GPUS":
			many = v
		case "LW_REF_GPU":
			one = v
		}
	}
	switch {
	case many != "":
		return strings.Split(many, ",")
	case one != "":
		return []string{one}
	}
	return nil
}
