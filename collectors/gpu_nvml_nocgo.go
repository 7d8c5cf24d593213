//go:build !cgo

package collectors

import "fmt"

// DefaultNVMLLibrary is the name the NVML collector loads when given no path.
const DefaultNVMLLibrary = "libnvidia-ml.so.1"

// OpenNVML needs cgo (NVML is a C library loaded at run time); a binary
// built with CGO_ENABLED=0 has no NVML collector.
func OpenNVML(libPath string) (GPUCounters, error) {
	return nil, fmt.Errorf("nvml: NVML counters unavailable, built without cgo, which NVML needs (%w)", ErrNoGPUCounters)
}
