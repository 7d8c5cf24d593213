package agent

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// nvidiaVendor is NVIDIA's PCI vendor id: CUDA enumerates only its GPUs.
const nvidiaVendor = 0x10de

// HostCUDAGPUs lists this host's CUDA GPUs (docs/design.md, "Placement").
// With readings from NVML or DCGM (one sample; nil without them) they are
// the GPUs the driver manages, with their UUIDs, told apart by name; else
// the NVIDIA display and 3D controllers sysfs shows under sysRoot, told
// apart by PCI vendor:device id, without UUIDs.
func HostCUDAGPUs(sysRoot string, readings []collectors.GPUReading) ([]collectors.CUDAGPU, error) {
	if len(readings) > 0 {
		out := make([]collectors.CUDAGPU, 0, len(readings))
		for _, r := range readings {
			out = append(out, collectors.CUDAGPU{BusID: collectors.PCIAddress(r.BusID), UUID: r.UUID, Model: r.Name})
		}
		return out, nil
	}
	host, err := topology.Read(sysRoot)
	if err != nil {
		return nil, err
	}
	var out []collectors.CUDAGPU
	for _, bdf := range host.BDFs(topology.KindGPU) {
		f := host.Functions[bdf]
		if f.Vendor != nvidiaVendor {
			continue
		}
		out = append(out, collectors.CUDAGPU{BusID: bdf, Model: fmt.Sprintf("%04x:%04x", f.Vendor, f.Device)})
	}
	return out, nil
}

// DeviceMap places a process's CUDA device ordinals on gpus from its
// CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER (collectors.CUDAOrdinals), read
// through env (once per process image, whatever the ordinals asked) when
// the engine first needs an ordinal (once per process and ordinal). Each
// answer is logged with what it assumed or why it is unknown: no ordinal is
// placed silently. A process that names its devices itself
// (cuDeviceGetPCIBusId, as NCCL does) is not asked about.
func DeviceMap(env *collectors.EnvCache, gpus []collectors.CUDAGPU, log *slog.Logger) correlate.DeviceMap {
	if log == nil {
		log = slog.Default()
	}
	return func(pid uint32, ordinal int) string {
		env, err := env.Get(int(pid))
		if err != nil {
			log.Info("CUDA device placed", "pid", pid, "device", ordinal, "gpu", "unknown", "why", err.Error())
			return ""
		}
		ords, notes := collectors.CUDAOrdinals(env, gpus)
		bdf, why := "", strings.Join(notes, "; ")
		switch {
		case ordinal >= len(ords):
			why = strings.TrimPrefix(why+fmt.Sprintf("; the process sees %d CUDA devices", len(ords)), "; ")
		case ords[ordinal] != "":
			bdf = ords[ordinal]
		}
		args := []any{"pid", pid, "device", ordinal, "gpu", bdf}
		if bdf == "" {
			args[5] = "unknown"
		}
		if why != "" {
			args = append(args, "why", why)
		}
		if v, ok := env["CUDA_VISIBLE_DEVICES"]; ok {
			args = append(args, "CUDA_VISIBLE_DEVICES", v)
		}
		if v, ok := env["CUDA_DEVICE_ORDER"]; ok {
			args = append(args, "CUDA_DEVICE_ORDER", v)
		}
		log.Info("CUDA device placed", args...)
		return bdf
	}
}

// HostDeviceMap is this host's DeviceMap: its CUDA GPUs from one sample of
// the GPU counters when there are some (nil: none), else from sysfs; nil
// when neither can be read (only what processes say names their GPUs).
func HostDeviceMap(env *collectors.EnvCache, sysRoot string, gpu collectors.GPUCounters, log *slog.Logger) correlate.DeviceMap {
	if log == nil {
		log = slog.Default()
	}
	var readings []collectors.GPUReading
	source := "sysfs"
	if gpu != nil {
		if snap, err := gpu.Sample(); err == nil {
			readings, source = snap.GPUs, gpu.Source()
		} else {
			log.Warn("GPU identities unread: CUDA devices are placed from sysfs, UUIDs in CUDA_VISIBLE_DEVICES stay unknown", "err", err)
		}
	}
	gpus, err := HostCUDAGPUs(sysRoot, readings)
	if err != nil {
		log.Warn("CUDA GPUs of this host unknown: devices are placed only where processes name them", "err", err)
		return nil
	}
	log.Info("CUDA GPUs", "count", len(gpus), "source", source)
	return DeviceMap(env, gpus, log)
}
