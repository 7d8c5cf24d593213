// Package refenv names what the reference data path (refpath/) reads from
// its environment and where it keeps its shared state, so that only the
// selftest and the tests that drive the reference path know it; production
// code never does.
package refenv

import (
	"fmt"
	"os"
	"strconv"
)

// DefaultLaneGBs is the reference GPU's per-direction lane rate when
// LW_REF_H2D_GBPS/LW_REF_D2H_GBPS are unset (refpath/driver/init.c).
const DefaultLaneGBs = 4.0

// SharedGPU puts a process's GPU lanes in the shared file of the named
// reference GPU, so several processes (and the NVML stand-in) see them.
func SharedGPU(name string) string { return "LW_REF_GPU=" + name }

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

// NoDeviceEnv makes the reference driver's cuInit fail with
// CUDA_ERROR_NO_DEVICE (100), as a real driver does on a host without a GPU.
const NoDeviceEnv = "LW_REF_NO_DEVICE=1"
