package agent

import (
	"errors"
	"fmt"
	"strings"

	"github.com/lanewatch/lanewatch/collectors"
)

// GPUConfig says where GPU link counters come from.
type GPUConfig struct {
	Source      string // auto (DCGM, then NVML), dcgm, nvml or off
	NVMLLibrary string // "" is libnvidia-ml.so.1, found by the dynamic linker
	DCGMAddress string // "" starts an embedded host engine
}

// OpenGPU opens the GPU counters the configuration allows, DCGM first.
// Both absent (the common case off a GPU host) is an error wrapping
// collectors.ErrNoGPUCounters that says why each failed, once.
func OpenGPU(cfg GPUConfig) (collectors.GPUCounters, error) {
	lib := cfg.NVMLLibrary
	if lib == "" {
		lib = "libnvidia-ml.so.1"
	}
	var why []string
	try := func(name string, open func() (collectors.GPUCounters, error)) collectors.GPUCounters {
		c, err := open()
		if err != nil {
			// The collectors' errors repeat the sentinel; say it once, at the end.
			msg := strings.ReplaceAll(err.Error(), collectors.ErrNoGPUCounters.Error(), "")
			msg = strings.ReplaceAll(strings.ReplaceAll(msg, ": : ", ": "), " ()", "")
			msg = strings.TrimPrefix(strings.Trim(msg, ": "), name+": ")
			why = append(why, fmt.Sprintf("%s: %s", name, msg))
			return nil
		}
		return c
	}
	switch cfg.Source {
	case "off":
		return nil, fmt.Errorf("GPU counters off (--gpu-counters off): %w", collectors.ErrNoGPUCounters)
	case "", "auto":
		if c := try("dcgm", func() (collectors.GPUCounters, error) {
			return collectors.OpenDCGM(collectors.DCGMOptions{Address: cfg.DCGMAddress})
		}); c != nil {
			return c, nil
		}
		if c := try("nvml", func() (collectors.GPUCounters, error) { return collectors.OpenNVML(lib) }); c != nil {
			return c, nil
		}
	case "dcgm":
		if c := try("dcgm", func() (collectors.GPUCounters, error) {
			return collectors.OpenDCGM(collectors.DCGMOptions{Address: cfg.DCGMAddress})
		}); c != nil {
			return c, nil
		}
	case "nvml":
		if c := try("nvml", func() (collectors.GPUCounters, error) { return collectors.OpenNVML(lib) }); c != nil {
			return c, nil
		}
	default:
		return nil, fmt.Errorf("--gpu-counters %q: want auto, dcgm, nvml or off", cfg.Source)
	}
	tried := "neither DCGM nor NVML is available"
	if len(why) == 1 {
		tried = strings.ToUpper(cfg.Source) + " is not available (--gpu-counters " + cfg.Source + ")"
	}
	return nil, fmt.Errorf("%w: %s (%s)", collectors.ErrNoGPUCounters, tried, strings.Join(why, "; "))
}

// IsNoGPU reports whether err only says that no GPU counter library is here.
func IsNoGPU(err error) bool { return errors.Is(err, collectors.ErrNoGPUCounters) }
